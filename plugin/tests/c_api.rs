//! The PJRT C API table exercised like jaxlib uses it, on the host backend.
#![allow(unsafe_code)]

mod common;

use std::ffi::c_void;
use std::mem::zeroed;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use xla_vmm_plugin::pjrt::*;

fn host_client() -> (*mut PJRT_Client, *mut PJRT_Device) {
    let client = create_client("host").expect("host client");
    let devs = devices(client);
    assert_eq!(devs.len(), 1);
    (client, devs[0])
}

#[test]
fn table_is_complete_and_versioned() {
    let api = api();
    assert_eq!(api.struct_size, std::mem::size_of::<PJRT_Api>());
    assert_eq!(api.struct_size, 1144);
    assert_eq!(api.pjrt_api_version.major_version, 0);
    assert_eq!(api.pjrt_api_version.minor_version, 114);
    // Every slot holds a function: view the table as words after the header.
    let words = (api.struct_size - 40) / 8;
    let slots = unsafe {
        std::slice::from_raw_parts(
            (api as *const PJRT_Api as *const u8)
                .add(40)
                .cast::<usize>(),
            words,
        )
    };
    assert!(slots.iter().all(|&p| p != 0), "a null slot in the table");
    assert_eq!(xla_vmm_plugin::ENTRIES.len(), words);
}

#[test]
fn unimplemented_entries_say_so_by_name() {
    let (err, _) = call!(PJRT_Client_DmaMap, PJRT_Client_DmaMap_Args, |a| {});
    let (code, msg) = err.expect("an error");
    assert_eq!(code, PJRT_Error_Code_UNIMPLEMENTED);
    assert!(msg.contains("PJRT_Client_DmaMap"), "{msg}");
}

#[test]
fn bad_args_are_errors_not_crashes() {
    // Null args.
    let err = unsafe { (api().PJRT_Client_Devices.unwrap())(null_mut()) };
    let (code, msg) = take_error(err).unwrap();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(msg.contains("args is null"), "{msg}");
    // struct_size too small (an older header).
    let (err, _) = call!(PJRT_Client_Devices, PJRT_Client_Devices_Args, |a| {
        a.struct_size = 8;
    });
    let (code, msg) = err.unwrap();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(
        msg.contains("struct_size is 8, expected at least 16"),
        "{msg}"
    );
    // Null and bogus handles.
    let (err, _) = call!(PJRT_Client_Devices, PJRT_Client_Devices_Args, |a| {
        a.client = null_client();
    });
    assert!(err.unwrap().1.contains("PJRT_Client is null"));
    let mut bogus = [0u64; 8];
    let (err, _) = call!(PJRT_Buffer_ElementType, PJRT_Buffer_ElementType_Args, |a| {
        a.buffer = bogus.as_mut_ptr().cast();
    });
    let (code, msg) = err.unwrap();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(msg.contains("not a live object"), "{msg}");
    // A mistyped option.
    let mut opt: PJRT_NamedValue = unsafe { zeroed() };
    let name = "strcit";
    opt.struct_size = PJRT_NamedValue_STRUCT_SIZE as usize;
    opt.name = name.as_ptr().cast();
    opt.name_size = name.len();
    opt.type_ = PJRT_NamedValue_kBool;
    opt.__bindgen_anon_1.bool_value = true;
    opt.value_size = 1;
    let (err, _) = call!(PJRT_Client_Create, PJRT_Client_Create_Args, |a| {
        a.create_options = &opt;
        a.num_options = 1;
    });
    assert!(err.unwrap().1.contains("strcit"));
    assert!(create_client("tpu").unwrap_err().1.contains("tpu"));
    // The HIP client is a build feature; without it (and without a HIP
    // device) creating one is an error that says why, never a crash.
    let (code, msg) = create_client("hip").unwrap_err();
    if cfg!(feature = "hip") {
        assert!(msg.contains("HIP"), "{msg}");
    } else {
        assert_eq!(code, PJRT_Error_Code_UNIMPLEMENTED, "{msg}");
        assert!(msg.contains("feature `hip`"), "{msg}");
    }
}

#[test]
fn client_devices_and_memories() {
    let (client, device) = host_client();
    let a = call_ok!(
        PJRT_Client_PlatformName,
        PJRT_Client_PlatformName_Args,
        |a| {
            a.client = client;
        }
    );
    let name =
        unsafe { std::slice::from_raw_parts(a.platform_name.cast::<u8>(), a.platform_name_size) };
    assert_eq!(name, b"cuda");
    let a = call_ok!(
        PJRT_Client_AddressableDevices,
        PJRT_Client_AddressableDevices_Args,
        |a| {
            a.client = client;
        }
    );
    assert_eq!(a.num_addressable_devices, 1);
    let d = call_ok!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args,
        |a| {
            a.device = device;
        }
    );
    let id = call_ok!(
        PJRT_DeviceDescription_Id,
        PJRT_DeviceDescription_Id_Args,
        |a| {
            a.device_description = d.device_description;
        }
    );
    assert_eq!(id.id, 0);
    let attrs = call_ok!(
        PJRT_DeviceDescription_Attributes,
        PJRT_DeviceDescription_Attributes_Args,
        |a| {
            a.device_description = d.device_description;
        }
    );
    let attrs = unsafe { std::slice::from_raw_parts(attrs.attributes, attrs.num_attributes) };
    let names: Vec<String> = attrs
        .iter()
        .map(|v| unsafe {
            String::from_utf8_lossy(std::slice::from_raw_parts(v.name.cast::<u8>(), v.name_size))
                .into_owned()
        })
        .collect();
    assert!(
        names.contains(&"compute_capability".to_string()),
        "{names:?}"
    );
    let m = call_ok!(
        PJRT_Device_DefaultMemory,
        PJRT_Device_DefaultMemory_Args,
        |a| {
            a.device = device;
        }
    );
    // jaxlib reads `PJRT_Memory::vtable`: it must be readable (null here).
    assert!(unsafe { (*m.memory).vtable }.is_null());
    let k = call_ok!(PJRT_Memory_Kind, PJRT_Memory_Kind_Args, |a| {
        a.memory = m.memory;
    });
    assert_eq!(
        unsafe { std::slice::from_raw_parts(k.kind.cast::<u8>(), k.kind_size) },
        b"device"
    );
    let by = call_ok!(
        PJRT_Memory_AddressableByDevices,
        PJRT_Memory_AddressableByDevices_Args,
        |a| {
            a.memory = m.memory;
        }
    );
    assert_eq!(
        unsafe { std::slice::from_raw_parts(by.devices, by.num_devices) },
        &[device]
    );
    let cm = call_ok!(
        PJRT_Client_AddressableMemories,
        PJRT_Client_AddressableMemories_Args,
        |a| {
            a.client = client;
        }
    );
    // The device's memory, then its pinned host memory.
    let mems =
        unsafe { std::slice::from_raw_parts(cm.addressable_memories, cm.num_addressable_memories) };
    assert_eq!(mems.len(), 2);
    assert_eq!(mems[0], m.memory);
    let l = call_ok!(
        PJRT_Client_LookupDevice,
        PJRT_Client_LookupDevice_Args,
        |a| {
            a.client = client;
            a.id = 0;
        }
    );
    assert_eq!(l.device, device);
    let (err, _) = call!(
        PJRT_Client_LookupDevice,
        PJRT_Client_LookupDevice_Args,
        |a| {
            a.client = client;
            a.id = 7;
        }
    );
    assert!(err.unwrap().1.contains("no device with id 7"));
    destroy_client(client);
    // The client's devices are gone with it.
    let (err, _) = call!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args,
        |a| {
            a.device = device;
        }
    );
    assert!(err.unwrap().1.contains("not a live object"));
}

/// Deterministic pseudo-random bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn round_trip_every_dtype() {
    let (client, device) = host_client();
    let types: &[(PJRT_Buffer_Type, usize)] = &[
        (PJRT_Buffer_Type_PRED, 1),
        (PJRT_Buffer_Type_S8, 1),
        (PJRT_Buffer_Type_S16, 2),
        (PJRT_Buffer_Type_S32, 4),
        (PJRT_Buffer_Type_S64, 8),
        (PJRT_Buffer_Type_U8, 1),
        (PJRT_Buffer_Type_U16, 2),
        (PJRT_Buffer_Type_U32, 4),
        (PJRT_Buffer_Type_U64, 8),
        (PJRT_Buffer_Type_F16, 2),
        (PJRT_Buffer_Type_BF16, 2),
        (PJRT_Buffer_Type_F32, 4),
        (PJRT_Buffer_Type_F64, 8),
        (PJRT_Buffer_Type_C64, 8),
        (PJRT_Buffer_Type_C128, 16),
        (PJRT_Buffer_Type_F8E4M3FN, 1),
        (PJRT_Buffer_Type_F8E5M2, 1),
    ];
    for (i, &(ty, size)) in types.iter().enumerate() {
        for dims in [&[][..], &[0][..], &[5][..], &[3, 4, 5][..], &[300, 301][..]] {
            let n: i64 = dims.iter().product();
            let mut data = bytes(n as usize * size, i as u64 + 1);
            if ty == PJRT_Buffer_Type_PRED {
                data.iter_mut().for_each(|b| *b &= 1);
            }
            let buf = from_host(client, device, ty, dims, &data, None).unwrap();
            let t = call_ok!(PJRT_Buffer_ElementType, PJRT_Buffer_ElementType_Args, |a| {
                a.buffer = buf;
            });
            assert_eq!(t.type_, ty);
            let d = call_ok!(PJRT_Buffer_Dimensions, PJRT_Buffer_Dimensions_Args, |a| {
                a.buffer = buf;
            });
            assert_eq!(
                unsafe { std::slice::from_raw_parts(d.dims, d.num_dims) },
                dims
            );
            let s = call_ok!(
                PJRT_Buffer_OnDeviceSizeInBytes,
                PJRT_Buffer_OnDeviceSizeInBytes_Args,
                |a| {
                    a.buffer = buf;
                }
            );
            assert_eq!(s.on_device_size_in_bytes, data.len());
            assert_eq!(to_host(buf).unwrap(), data, "type {ty} dims {dims:?}");
            destroy_buffer(buf);
        }
    }
    destroy_client(client);
}

#[test]
fn strided_and_permuted_host_layouts() {
    let (client, device) = host_client();
    // A 2x3 u16 array whose host bytes are column-major.
    let col_major: Vec<u16> = vec![1, 4, 2, 5, 3, 6]; // logical [[1,2,3],[4,5,6]]
    let raw: Vec<u8> = col_major.iter().flat_map(|v| v.to_le_bytes()).collect();
    let buf = from_host(
        client,
        device,
        PJRT_Buffer_Type_U16,
        &[2, 3],
        &raw,
        Some(&[2, 4]),
    )
    .unwrap();
    let dense: Vec<u16> = to_host(buf)
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(dense, vec![1, 2, 3, 4, 5, 6]);
    // Back to host in column-major (minor_to_major = [0, 1]).
    let m2m = [0i64, 1];
    let mut layout: PJRT_Buffer_MemoryLayout = unsafe { zeroed() };
    layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE as usize;
    layout.type_ = PJRT_Buffer_MemoryLayout_Type_Tiled;
    layout.__bindgen_anon_1.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE as usize;
    layout.__bindgen_anon_1.tiled.minor_to_major = m2m.as_ptr();
    layout.__bindgen_anon_1.tiled.minor_to_major_size = 2;
    let mut out = vec![0u8; 12];
    let a = call_ok!(
        PJRT_Buffer_ToHostBuffer,
        PJRT_Buffer_ToHostBuffer_Args,
        |a| {
            a.src = buf;
            a.host_layout = &mut layout;
            a.dst = out.as_mut_ptr().cast::<c_void>();
            a.dst_size = out.len();
        }
    );
    destroy_event(a.event);
    assert_eq!(out, raw);
    // Negative strides: a reversed vector (data points at its last element).
    let fwd: Vec<u8> = vec![10, 20, 30, 40];
    let rev = unsafe { std::slice::from_raw_parts(fwd.as_ptr().add(3), 1) };
    // The dims and strides outlive the call (a temporary's address, or a
    // local of the closure, would dangle when the call reads it).
    let (dims, strides) = ([4i64], [-1i64]);
    let b = call_ok!(
        PJRT_Client_BufferFromHostBuffer,
        PJRT_Client_BufferFromHostBuffer_Args,
        |a| {
            a.client = client;
            a.data = rev.as_ptr().cast();
            a.type_ = PJRT_Buffer_Type_U8;
            a.dims = dims.as_ptr();
            a.num_dims = 1;
            a.byte_strides = strides.as_ptr();
            a.num_byte_strides = 1;
            a.device = device;
        }
    );
    destroy_event(b.done_with_host_buffer);
    assert_eq!(to_host(b.buffer).unwrap(), vec![40, 30, 20, 10]);
    // Layout query: dense major-to-minor.
    let l = call_ok!(
        PJRT_Buffer_GetMemoryLayout,
        PJRT_Buffer_GetMemoryLayout_Args,
        |a| {
            a.buffer = buf;
        }
    );
    let t = unsafe { l.layout.__bindgen_anon_1.tiled };
    assert_eq!(
        unsafe { std::slice::from_raw_parts(t.minor_to_major, t.minor_to_major_size) },
        &[1, 0]
    );
    destroy_buffer(b.buffer);
    destroy_buffer(buf);
    destroy_client(client);
}

#[test]
fn deleted_buffers_and_bad_shapes_are_clear_errors() {
    let (client, device) = host_client();
    let data = vec![1u8; 16];
    let buf = from_host(client, device, PJRT_Buffer_Type_F32, &[4], &data, None).unwrap();
    let c = call_ok!(
        PJRT_Buffer_CopyToDevice,
        PJRT_Buffer_CopyToDevice_Args,
        |a| {
            a.buffer = buf;
            a.dst_device = device;
        }
    );
    assert_eq!(to_host(c.dst_buffer).unwrap(), data);
    call_ok!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args, |a| {
        a.buffer = buf;
    });
    let d = call_ok!(PJRT_Buffer_IsDeleted, PJRT_Buffer_IsDeleted_Args, |a| {
        a.buffer = buf;
    });
    assert!(d.is_deleted);
    let (code, msg) = to_host(buf).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_FAILED_PRECONDITION);
    assert!(msg.contains("deleted"), "{msg}");
    // The copy is independent of the deleted original.
    assert_eq!(to_host(c.dst_buffer).unwrap(), data);
    destroy_buffer(buf);
    destroy_buffer(c.dst_buffer);
    // Destroyed: the handle is no longer valid.
    assert!(to_host(buf).unwrap_err().1.contains("not a live object"));
    // Unsupported type, negative dimension, short data pointer.
    let (code, msg) =
        from_host(client, device, PJRT_Buffer_Type_INVALID, &[2], &[0], None).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_UNIMPLEMENTED, "{msg}");
    let (code, _) = from_host(client, device, PJRT_Buffer_Type_F32, &[-1], &[], None).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    let dims = [4i64];
    let (err, _) = call!(
        PJRT_Client_BufferFromHostBuffer,
        PJRT_Client_BufferFromHostBuffer_Args,
        |a| {
            a.client = client;
            a.type_ = PJRT_Buffer_Type_F32;
            a.dims = dims.as_ptr();
            a.num_dims = 1;
            a.device = device;
        }
    );
    assert!(err.unwrap().1.contains("data is null"));
    destroy_client(client);
}

static CALLS: AtomicUsize = AtomicUsize::new(0);
static ERROR_CODES: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn on_ready(err: *mut PJRT_Error, user: *mut c_void) {
    CALLS.fetch_add(user as usize, Ordering::SeqCst);
    if let Some((code, _)) = take_error(err) {
        ERROR_CODES.fetch_add(code as usize, Ordering::SeqCst);
    }
}

#[test]
fn events_complete_and_call_back() {
    let (client, device) = host_client();
    let buf = from_host(client, device, PJRT_Buffer_Type_S32, &[2], &[0; 8], None).unwrap();
    let e = call_ok!(PJRT_Buffer_ReadyEvent, PJRT_Buffer_ReadyEvent_Args, |a| {
        a.buffer = buf;
    });
    // The upload is asynchronous (staged, then copied on the stream): ready
    // once awaited, and then a callback runs at once.
    assert_eq!(await_event(e.event), None);
    let r = call_ok!(PJRT_Event_IsReady, PJRT_Event_IsReady_Args, |a| {
        a.event = e.event;
    });
    assert!(r.is_ready);
    call_ok!(PJRT_Event_OnReady, PJRT_Event_OnReady_Args, |a| {
        a.event = e.event;
        a.callback = Some(on_ready);
        a.user_arg = std::ptr::without_provenance_mut(1);
    });
    assert_eq!(CALLS.load(Ordering::SeqCst) & 0xff, 1);
    destroy_event(e.event);
    // A user event, completed later with an error: the callback sees it.
    let c = call_ok!(PJRT_Event_Create, PJRT_Event_Create_Args, |a| {});
    call_ok!(PJRT_Event_OnReady, PJRT_Event_OnReady_Args, |a| {
        a.event = c.event;
        a.callback = Some(on_ready);
        a.user_arg = std::ptr::without_provenance_mut(0x100);
    });
    assert_eq!(
        CALLS.load(Ordering::SeqCst) & 0xff00,
        0,
        "called before completion"
    );
    let msg = "boom";
    call_ok!(PJRT_Event_Set, PJRT_Event_Set_Args, |a| {
        a.event = c.event;
        a.error_code = PJRT_Error_Code_ABORTED;
        a.error_message = msg.as_ptr().cast();
        a.error_message_size = msg.len();
    });
    assert_eq!(CALLS.load(Ordering::SeqCst) & 0xff00, 0x100);
    assert_eq!(
        ERROR_CODES.load(Ordering::SeqCst),
        PJRT_Error_Code_ABORTED as usize
    );
    let (code, m) = await_event(c.event).unwrap();
    assert_eq!((code, m.contains("boom")), (PJRT_Error_Code_ABORTED, true));
    destroy_event(c.event);
    destroy_buffer(buf);
    destroy_client(client);
}

#[test]
fn plugin_attributes_name_the_version() {
    let a = call_ok!(PJRT_Plugin_Attributes, PJRT_Plugin_Attributes_Args, |a| {});
    let attrs = unsafe { std::slice::from_raw_parts(a.attributes, a.num_attributes) };
    let found = attrs.iter().find(|v| unsafe {
        std::slice::from_raw_parts(v.name.cast::<u8>(), v.name_size) == b"xla_vmm_version"
    });
    let v = found.expect("xla_vmm_version attribute");
    assert_eq!(v.type_, PJRT_NamedValue_kString);
    let s = unsafe {
        std::slice::from_raw_parts(v.__bindgen_anon_1.string_value.cast::<u8>(), v.value_size)
    };
    assert_eq!(s, env!("CARGO_PKG_VERSION").as_bytes());
}

/// jaxlib calls PJRT_Device_GetAttributes at client creation (the slot is
/// set, API >= 0.92) and aborts on error, then always calls the deleter.
#[test]
fn device_attributes_work_as_jaxlib_calls_them() {
    let (client, device) = host_client();
    let a = call_ok!(
        PJRT_Device_GetAttributes,
        PJRT_Device_GetAttributes_Args,
        |a| {
            a.device = device;
        }
    );
    assert!(a.num_attributes >= 3);
    let deleter = a.attributes_deleter.expect("a deleter");
    unsafe { deleter(a.device_attributes) };
    destroy_client(client);
}

/// A caller built against an older header passes a shorter struct: the
/// plugin fills only the fields the caller has (jaxlib 0.10 passes 185 bytes
/// for PJRT_Device_MemoryStats_Args, the 0.114 header has 201).
#[test]
fn older_callers_with_shorter_structs_are_served_within_their_size() {
    let (client, device) = host_client();
    #[repr(C)]
    struct Padded {
        args: PJRT_Device_MemoryStats_Args,
        guard: [u8; 64],
    }
    let mut p: Padded = unsafe { std::mem::zeroed() };
    let short = 185;
    p.args.struct_size = short;
    p.args.device = device;
    // Sentinel bytes past the caller's struct size must stay untouched.
    let base = &mut p as *mut Padded as *mut u8;
    let total = std::mem::size_of::<Padded>();
    unsafe { std::ptr::write_bytes(base.add(short), 0xAB, total - short) };
    let err = unsafe { (api().PJRT_Device_MemoryStats.unwrap())(&mut p.args) };
    assert_eq!(take_error(err), None);
    let bytes = unsafe { std::slice::from_raw_parts(base, total) };
    assert!(
        bytes[short..].iter().all(|&b| b == 0xAB),
        "wrote past the caller's struct"
    );
    assert!(p.args.bytes_in_use >= 0);
    assert!(p.args.num_allocs_is_set);
    destroy_client(client);
}

//! What JAX's own tests ask of a PJRT plugin, on the host backend: a program
//! without outputs (jaxlib passes a null output list), a buffer donated and
//! passed again in the same call, tokens, the client's topology (JAX's
//! compilation-cache key), and host callbacks' typed-FFI custom calls
//! reading the execute context.
#![allow(unsafe_code)]

mod common;

use std::ptr::null_mut;

use common::plans::*;
use common::*;
use xla_vmm::*;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;

/// A program of `params` f32[4] parameters (the first donated when
/// `donate`) that increments parameter 0 in place and returns `result`.
fn program(params: usize, donate: bool, result: Shape, outputs: Vec<usize>) -> Plan {
    let allocs = (0..params)
        .map(|i| {
            alloc(
                i,
                16,
                AllocationRole::Parameter {
                    number: i as u64,
                    shape_index: vec![],
                    aliased_with_output: donate && i == 0,
                },
            )
        })
        .collect();
    let mut p = plan(allocs, 0, vec![inc(sl(0, 16), 4)]);
    p.program_shape.parameters = vec![f32s(4); params];
    p.program_shape.result = result;
    p.outputs = outputs
        .into_iter()
        .map(|a| OutputInfo {
            shape_index: vec![],
            allocation: a,
            passthrough: false,
            alias: None,
        })
        .collect();
    p
}

fn load(client: *mut PJRT_Client, p: Plan) -> *mut PJRT_LoadedExecutable {
    xla_vmm_plugin::objects::executable::load_plan(client, p, vec![]).unwrap()
}

#[test]
fn a_program_without_outputs_takes_a_null_output_list() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let no_outputs = Shape {
        element_type: ElementType::TUPLE,
        tuple_shapes: vec![],
        ..Default::default()
    };
    let exe = load(client, program(1, false, no_outputs, vec![]));
    let x = put_f32(client, device, &[1.0; 4]);
    let args = [x];
    let done = RawExecute::new(&args).run(exe, null_mut()).unwrap();
    assert_eq!(await_event(done), None);
    destroy_event(done);
    // A program with outputs still refuses a null list.
    let exe2 = load(client, add_one());
    let (code, msg) = RawExecute::new(&args)
        .run(exe2, null_mut())
        .expect_err("a null output list for a program with an output");
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(msg.contains("output list 0 is null"), "{msg}");
    destroy_buffer(x);
    destroy_exe(exe);
    destroy_exe(exe2);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn a_donated_buffer_may_not_be_another_argument_of_the_same_call() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let exe = load(client, program(2, true, f32s(4), vec![0]));
    let x = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let y = put_f32(client, device, &[0.0; 4]);
    let (code, msg) = execute(exe, &[x, x], &[]).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(
        msg.contains("argument 0 is donated") && msg.contains("also argument 1"),
        "{msg}"
    );
    // Nothing ran and nothing was consumed: x is intact.
    assert_eq!(f32_values(&to_host(x).unwrap()), vec![1.0, 2.0, 3.0, 4.0]);
    // Not donated (non_donatable), the same buffer twice is fine.
    let out = execute(exe, &[x, x], &[0]).unwrap();
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0, 3.0, 4.0, 5.0]);
    // Distinct buffers: donation as usual.
    let out2 = execute(exe, &[x, y], &[]).unwrap();
    assert_eq!(
        f32_values(&to_host(out2).unwrap()),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    for b in [x, y, out, out2] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn a_token_output_is_a_buffer_of_no_bytes() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let token = Shape {
        element_type: ElementType::TOKEN,
        ..Default::default()
    };
    let mut p = program(1, false, token, vec![1]);
    p.allocations
        .push(alloc(1, 0, AllocationRole::Output { outputs: vec![] }));
    let exe = load(client, p);
    let view = executable_of(exe);
    let types = call_ok!(
        PJRT_Executable_OutputElementTypes,
        PJRT_Executable_OutputElementTypes_Args,
        |a| {
            a.executable = view;
        }
    );
    assert_eq!(types.num_output_types, 1);
    assert_eq!(unsafe { *types.output_types }, PJRT_Buffer_Type_TOKEN);
    call_ok!(PJRT_Executable_Destroy, PJRT_Executable_Destroy_Args, |a| {
        a.executable = view;
    });
    let x = put_f32(client, device, &[1.0; 4]);
    let tok = execute(exe, &[x], &[]).unwrap();
    let t = call_ok!(PJRT_Buffer_ElementType, PJRT_Buffer_ElementType_Args, |a| {
        a.buffer = tok;
    });
    assert_eq!(t.type_, PJRT_Buffer_Type_TOKEN);
    assert_eq!(to_host(tok).unwrap(), Vec::<u8>::new());
    // A token passed back in, as JAX does with effect tokens.
    let size = call_ok!(
        PJRT_Buffer_OnDeviceSizeInBytes,
        PJRT_Buffer_OnDeviceSizeInBytes_Args,
        |a| {
            a.buffer = tok;
        }
    );
    assert_eq!(size.on_device_size_in_bytes, 0);
    for b in [x, tok] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

fn topology(client: *mut PJRT_Client) -> *mut PJRT_TopologyDescription {
    let a = call_ok!(
        PJRT_Client_TopologyDescription,
        PJRT_Client_TopologyDescription_Args,
        |a| {
            a.client = client;
        }
    );
    assert!(!a.topology.is_null());
    a.topology
}

fn fingerprint(t: *mut PJRT_TopologyDescription) -> u64 {
    let f = call_ok!(
        PJRT_TopologyDescription_Fingerprint,
        PJRT_TopologyDescription_Fingerprint_Args,
        |a| {
            a.topology = t;
        }
    );
    f.fingerprint
}

#[test]
fn the_client_has_a_topology_with_a_stable_fingerprint() {
    let mut opts = host_options();
    opts.host_devices = 2;
    let c1 = client::into_c(Client::new(opts.clone(), None).unwrap());
    let t = topology(c1);
    assert_eq!(topology(c1), t, "one topology per client");
    let name = call_ok!(
        PJRT_TopologyDescription_PlatformName,
        PJRT_TopologyDescription_PlatformName_Args,
        |a| {
            a.topology = t;
        }
    );
    let name = unsafe {
        std::slice::from_raw_parts(name.platform_name.cast::<u8>(), name.platform_name_size)
    };
    assert_eq!(name, b"cuda");
    let d = call_ok!(
        PJRT_TopologyDescription_GetDeviceDescriptions,
        PJRT_TopologyDescription_GetDeviceDescriptions_Args,
        |a| {
            a.topology = t;
        }
    );
    assert_eq!(d.num_descriptions, 2);
    // The descriptions are the devices' own.
    let first = unsafe { *d.descriptions };
    let desc = call_ok!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args,
        |a| {
            a.device = devices(c1)[0];
        }
    );
    assert_eq!(desc.device_description, first);
    let attrs = call_ok!(
        PJRT_TopologyDescription_Attributes,
        PJRT_TopologyDescription_Attributes_Args,
        |a| {
            a.topology = t;
        }
    );
    assert_eq!(attrs.num_attributes, 2);
    // Same job, same fingerprint (it keys an on-disk cache); another
    // device count, another one.
    let f1 = fingerprint(t);
    let c2 = client::into_c(Client::new(opts.clone(), None).unwrap());
    assert_eq!(fingerprint(topology(c2)), f1);
    opts.host_devices = 3;
    let c3 = client::into_c(Client::new(opts, None).unwrap());
    assert_ne!(fingerprint(topology(c3)), f1);
    for c in [c1, c2, c3] {
        destroy_client(c);
    }
    // Gone with its client.
    let (err, _) = call!(
        PJRT_TopologyDescription_Fingerprint,
        PJRT_TopologyDescription_Fingerprint_Args,
        |a| {
            a.topology = t;
        }
    );
    assert!(err.is_some(), "a destroyed client's topology answered");
}

static DELETED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
unsafe extern "C" fn count_delete(_: *mut std::ffi::c_void) {
    DELETED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}
unsafe extern "C" fn some_handler() {}

/// The FFI extension of our table (jaxlib walks `extension_start`).
fn ffi_extension() -> &'static PJRT_FFI_Extension {
    let mut ext = api().extension_start;
    while !ext.is_null() {
        let base = unsafe { &*ext };
        if base.type_ == PJRT_Extension_Type_FFI {
            return unsafe { &*ext.cast::<PJRT_FFI_Extension>() };
        }
        ext = base.next;
    }
    panic!("no FFI extension in the plugin's table");
}

#[test]
fn execute_contexts_keep_ffi_user_data_until_destroyed() {
    let ext = ffi_extension();
    assert_eq!(ext.base.struct_size, PJRT_FFI_Extension_STRUCT_SIZE);
    let c = call_ok!(
        PJRT_ExecuteContext_Create,
        PJRT_ExecuteContext_Create_Args,
        |a| {}
    );
    let value = Box::into_raw(Box::new(42u32));
    let add = |type_id: i64| {
        let mut a: PJRT_FFI_UserData_Add_Args = unsafe { std::mem::zeroed() };
        a.struct_size = PJRT_FFI_UserData_Add_Args_STRUCT_SIZE;
        a.context = c.context;
        a.user_data = PJRT_FFI_UserData {
            type_id,
            data: value.cast(),
            deleter: Some(count_delete),
        };
        take_error(unsafe { ext.user_data_add.unwrap()(&mut a) })
    };
    let before = DELETED.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(add(7), None);
    assert_eq!(add(8), None);
    let (code, msg) = add(7).expect("the same type id twice");
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(msg.contains("type id 7"), "{msg}");
    call_ok!(
        PJRT_ExecuteContext_Destroy,
        PJRT_ExecuteContext_Destroy_Args,
        |a| {
            a.context = c.context;
        }
    );
    // Both deleters ran (the refused entry's did not).
    assert_eq!(
        DELETED.load(std::sync::atomic::Ordering::SeqCst) - before,
        2
    );
    // A destroyed context is refused, not dereferenced.
    assert!(add(9).is_some());
    drop(unsafe { Box::from_raw(value) });
    // A handler registration without a vendor plugin is kept for it.
    let mut r: PJRT_FFI_Register_Handler_Args = unsafe { std::mem::zeroed() };
    r.struct_size = PJRT_FFI_Register_Handler_Args_STRUCT_SIZE;
    r.target_name = c"my_target".as_ptr();
    r.target_name_size = 9;
    r.platform_name = c"CUDA".as_ptr();
    r.platform_name_size = 4;
    r.api_version = 1;
    r.handler = some_handler as *mut std::ffi::c_void;
    assert_eq!(
        take_error(unsafe { ext.register_handler.unwrap()(&mut r) }),
        None
    );
    r.handler = null_mut();
    assert!(take_error(unsafe { ext.register_handler.unwrap()(&mut r) }).is_some());
}

#[test]
fn sub_byte_arrays_are_packed_on_the_device_and_one_byte_per_element_on_the_host() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    // ml_dtypes int4 [1, -1, 7] as numpy holds it: a byte per element.
    let b = from_host(
        client,
        device,
        PJRT_Buffer_Type_S4,
        &[3],
        &[1, 0xFF, 7],
        None,
    )
    .unwrap();
    let size = call_ok!(
        PJRT_Buffer_OnDeviceSizeInBytes,
        PJRT_Buffer_OnDeviceSizeInBytes_Args,
        |a| {
            a.buffer = b;
        }
    );
    assert_eq!(size.on_device_size_in_bytes, 2);
    assert_eq!(to_host(b).unwrap(), vec![1, 0x0F, 7]);
    // Strided host input (every other byte), u2.
    let src = [1u8, 9, 2, 9, 3, 9];
    let u2 = from_host(client, device, PJRT_Buffer_Type_U2, &[3], &src, Some(&[2])).unwrap();
    assert_eq!(to_host(u2).unwrap(), vec![1, 2, 3]);
    for x in [b, u2] {
        destroy_buffer(x);
    }
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

fn memory_kind(m: *mut PJRT_Memory) -> String {
    let k = call_ok!(PJRT_Memory_Kind, PJRT_Memory_Kind_Args, |a| {
        a.memory = m;
    });
    let b = unsafe { std::slice::from_raw_parts(k.kind.cast::<u8>(), k.kind_size) };
    String::from_utf8(b.to_vec()).unwrap()
}

fn buffer_memory(b: *mut PJRT_Buffer) -> *mut PJRT_Memory {
    let m = call_ok!(PJRT_Buffer_Memory, PJRT_Buffer_Memory_Args, |a| {
        a.buffer = b;
    });
    m.memory
}

fn copy_to_memory(b: *mut PJRT_Buffer, m: *mut PJRT_Memory) -> *mut PJRT_Buffer {
    let c = call_ok!(
        PJRT_Buffer_CopyToMemory,
        PJRT_Buffer_CopyToMemory_Args,
        |a| {
            a.buffer = b;
            a.dst_memory = m;
        }
    );
    assert_eq!(await_event(ready_event(c.dst_buffer)), None);
    c.dst_buffer
}

/// A device's addressable memories (device memory, then pinned host).
fn memories(device: *mut PJRT_Device) -> Vec<*mut PJRT_Memory> {
    let ms = call_ok!(
        PJRT_Device_AddressableMemories,
        PJRT_Device_AddressableMemories_Args,
        |a| {
            a.device = device;
        }
    );
    unsafe { std::slice::from_raw_parts(ms.memories, ms.num_memories) }.to_vec()
}

#[test]
fn pinned_host_memory_holds_buffers_and_copies_both_ways() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let ms = memories(device);
    let kinds: Vec<String> = ms.iter().map(|&m| memory_kind(m)).collect();
    assert_eq!(kinds, ["device", "pinned_host"]);
    let (dev_mem, host_mem) = (ms[0], ms[1]);
    // device_put(x, memory_kind="pinned_host"): BufferFromHostBuffer into it.
    let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let h = from_host_in_memory(client, host_mem, PJRT_Buffer_Type_F32, &[4], &data).unwrap();
    assert_eq!(buffer_memory(h), host_mem);
    assert_eq!(to_host(h).unwrap(), data);
    // Host -> device -> host memory again, the bytes intact.
    let d = copy_to_memory(h, dev_mem);
    assert_eq!(buffer_memory(d), dev_mem);
    let h2 = copy_to_memory(d, host_mem);
    assert_eq!(buffer_memory(h2), host_mem);
    assert_eq!(to_host(h2).unwrap(), data);
    for b in [h, d, h2] {
        destroy_buffer(b);
    }
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

fn is_on_cpu(b: *mut PJRT_Buffer) -> bool {
    let r = call_ok!(PJRT_Buffer_IsOnCpu, PJRT_Buffer_IsOnCpu_Args, |a| {
        a.buffer = b;
    });
    r.is_on_cpu
}

/// What jaxlib does for `np.asarray` of a CPU buffer: an external reference,
/// then the data pointer, read in place.
fn host_view(b: *mut PJRT_Buffer, n: usize) -> &'static [u8] {
    assert_eq!(external_ref(b, true), None);
    let p = call_ok!(
        PJRT_Buffer_OpaqueDeviceMemoryDataPointer,
        PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args,
        |a| {
            a.buffer = b;
        }
    );
    unsafe { std::slice::from_raw_parts(p.device_memory_ptr.cast::<u8>(), n) }
}

/// JAX reads a pinned host buffer in place (`IsOnCpu`, then a zero-copy
/// numpy view held by an external reference) and does not cache a copy of
/// it: the view outlives a delete of the buffer, and the buffer cannot be
/// donated while it is held.
#[test]
fn a_pinned_host_buffer_is_read_in_place_and_kept_while_referenced() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let host_mem = memories(device)[1];
    let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let h = from_host_in_memory(client, host_mem, PJRT_Buffer_Type_F32, &[4], &data).unwrap();
    let d = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    assert!(is_on_cpu(h));
    assert!(!is_on_cpu(d));
    let view = host_view(h, data.len());
    assert_eq!(view, &data[..]);
    // Held: not donated (nothing runs, the buffer stays live) ...
    let exe = load(client, program(1, true, f32s(4), vec![0]));
    let (code, msg) = execute(exe, &[h], &[]).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(
        msg.contains("argument 0") && msg.contains("external reference"),
        "{msg}"
    );
    assert_eq!(to_host(h).unwrap(), data);
    // ... and deleted, its memory is kept until the reference goes.
    call_ok!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args, |a| {
        a.buffer = h;
    });
    assert!(to_host(h).is_err());
    let before = be.outstanding().total();
    assert_eq!(view, &data[..]);
    assert_eq!(external_ref(h, false), None);
    assert!(be.outstanding().total() < before, "{:?}", be.outstanding());
    for b in [h, d] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn a_host_offloaded_output_is_in_pinned_host_memory() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let mut on_host = f32s(4);
    on_host.memory_space = HOST_MEMORY_SPACE;
    let mut p = program(1, false, on_host, vec![1]);
    p.allocations
        .push(alloc(1, 16, AllocationRole::Output { outputs: vec![] }));
    let exe = load(client, p);
    let view = executable_of(exe);
    let k = call_ok!(
        PJRT_Executable_OutputMemoryKinds,
        PJRT_Executable_OutputMemoryKinds_Args,
        |a| {
            a.executable = view;
        }
    );
    assert_eq!(k.num_outputs, 1);
    let kind =
        unsafe { std::slice::from_raw_parts((*k.memory_kinds).cast::<u8>(), *k.memory_kind_sizes) };
    assert_eq!(kind, b"pinned_host");
    call_ok!(PJRT_Executable_Destroy, PJRT_Executable_Destroy_Args, |a| {
        a.executable = view;
    });
    let x = put_f32(client, device, &[1.0; 4]);
    let out = execute(exe, &[x], &[]).unwrap();
    assert_eq!(memory_kind(buffer_memory(out)), "pinned_host");
    for b in [x, out] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

/// Host offload inside a program, as XLA compiles `device_put` to and from
/// `pinned_host` in a jit: a pinned_host parameter comes to the device (a
/// host-to-device copy), is incremented, and goes back to a pinned_host
/// result (a device-to-host copy). It runs on our runtime (the client is
/// strict), step after step in VA-stable mode, with fresh host buffers.
#[test]
fn host_space_copies_run_on_our_runtime_with_pinned_host_arguments() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let host_mem = memories(device)[1];
    let mut on_host = f32s(4);
    on_host.memory_space = HOST_MEMORY_SPACE;
    let param = AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: false,
    };
    let mut out = alloc(1, 16, AllocationRole::Output { outputs: vec![] });
    out.color = HOST_MEMORY_SPACE;
    let mut p = plan(
        vec![alloc(0, 16, param), out, alloc(2, 16, AllocationRole::Temp)],
        1,
        vec![
            thunk(
                "copy-start",
                ThunkKind::HostToDeviceCopy(copy_of(sl(0, 16), sl(2, 16))),
            ),
            inc(sl(2, 16), 4),
            thunk(
                "copy-start.1",
                ThunkKind::DeviceToHostCopy(copy_of(sl(2, 16), sl(1, 16))),
            ),
        ],
    );
    p.program_shape.parameters = vec![on_host.clone()];
    p.program_shape.result = on_host;
    let exe = load(client, p);
    for step in 0..4 {
        let v = [step as f32, 1.5, -2.0, 8.0];
        let x = from_host_in_memory(client, host_mem, PJRT_Buffer_Type_F32, &[4], &f32_bytes(&v))
            .unwrap();
        let y = execute(exe, &[x], &[]).unwrap();
        assert_eq!(memory_kind(buffer_memory(y)), "pinned_host");
        let want: Vec<f32> = v.iter().map(|x| x + 1.0).collect();
        assert_eq!(f32_values(&to_host(y).unwrap()), want, "step {step}");
        for b in [x, y] {
            destroy_buffer(b);
        }
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

/// A token parameter takes JAX's stand-in for a token at a program's
/// boundary (a `bool[0]` array) or a token buffer; anything with bytes is
/// refused as before.
#[test]
fn a_token_parameter_takes_a_bool0_stand_in() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let mut p = program(2, false, f32s(4), vec![0]);
    p.program_shape.parameters[1] = Shape {
        element_type: ElementType::TOKEN,
        ..Default::default()
    };
    p.allocations[1] = alloc(
        1,
        0,
        AllocationRole::Parameter {
            number: 1,
            shape_index: vec![],
            aliased_with_output: false,
        },
    );
    let exe = load(client, p);
    let x = put_f32(client, device, &[1.0; 4]);
    let stand_in = from_host(client, device, PJRT_Buffer_Type_PRED, &[0], &[], None).unwrap();
    let out = execute(exe, &[x, stand_in], &[]).unwrap();
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0; 4]);
    let wrong = put_f32(client, device, &[0.0; 4]);
    let (code, msg) = execute(exe, &[x, wrong], &[]).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(msg.contains("argument 1") && msg.contains("token"), "{msg}");
    for b in [x, stand_in, out, wrong] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

/// What [`user_data_handler`] saw: the user data's address (0: none yet).
static SEEN_USER_DATA: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A typed-FFI handler as jaxlib's host callbacks are: it reads its
/// Python callables from the execute context (`XLA_FFI_InvokeContext_Get`,
/// type id 42 here) and fails the call when they are not there.
unsafe extern "C" fn user_data_handler(
    frame: *mut xla_vmm_ffi::xla_ffi::XLA_FFI_CallFrame,
) -> *mut xla_vmm_ffi::xla_ffi::XLA_FFI_Error {
    use xla_vmm_ffi::xla_ffi::*;
    let f = unsafe { &*frame };
    if !f.extension_start.is_null() {
        return null_mut(); // the metadata call: traits 0
    }
    let api = unsafe { &*f.api };
    let mut id = XLA_FFI_TypeId { type_id: 42 };
    let mut a = XLA_FFI_InvokeContext_Get_Args {
        struct_size: XLA_FFI_InvokeContext_Get_Args_STRUCT_SIZE,
        extension_start: null_mut(),
        ctx: f.ctx,
        type_id: &mut id,
        data: null_mut(),
    };
    let e = unsafe {
        api.XLA_FFI_InvokeContext_Get.unwrap()(
            (&mut a as *mut XLA_FFI_InvokeContext_Get_Args).cast(),
        )
    };
    if e.is_null() {
        SEEN_USER_DATA.store(a.data as usize, std::sync::atomic::Ordering::SeqCst);
    }
    e
}

/// A program with a host callback (a typed-FFI custom call) runs on our
/// runtime through the PJRT API: its handler gets the user data of the
/// `Execute`'s context; without the context the handler's error is the
/// step's error, and the client goes on.
#[test]
fn a_typed_ffi_custom_call_reads_the_execute_context_s_user_data() {
    use xla_vmm_plugin::xla_ffi::api::{register_handler, Handler};
    register_handler(
        "xla_vmm_test_user_data",
        Handler {
            execute: user_data_handler,
            instantiate: None,
            traits: 0,
        },
    );
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let mut p = program(1, true, f32s(4), vec![0]);
    p.thunks.push(thunk(
        "custom-call.3",
        ThunkKind::CustomCall(CustomCallThunk {
            target_name: "xla_vmm_test_user_data".into(),
            operands: vec![Some(ShapedSlice {
                slice: sl(0, 16),
                shape: Some(f32s(4)),
            })],
            results: vec![],
            opaque: Blob::default(),
            api_version: 4,
            attributes: vec![("index".into(), FfiAttr::Scalar(FfiScalar::U64(0)))],
            called_computation: None,
            use_pdl: false,
        }),
    ));
    let exe = load(client, p);
    let ctx = call_ok!(
        PJRT_ExecuteContext_Create,
        PJRT_ExecuteContext_Create_Args,
        |a| {}
    );
    let mut add: PJRT_FFI_UserData_Add_Args = unsafe { std::mem::zeroed() };
    add.struct_size = PJRT_FFI_UserData_Add_Args_STRUCT_SIZE;
    add.context = ctx.context;
    add.user_data = PJRT_FFI_UserData {
        type_id: 42,
        data: 0x77usize as *mut std::ffi::c_void,
        deleter: None,
    };
    assert_eq!(
        take_error(unsafe { ffi_extension().user_data_add.unwrap()(&mut add) }),
        None
    );
    let x = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let mut out = [null_mut()];
    let raw = RawExecute {
        context: ctx.context,
        ..RawExecute::new(std::slice::from_ref(&x))
    };
    let done = raw.run(exe, out.as_mut_ptr()).unwrap();
    assert_eq!(await_event(done), None);
    destroy_event(done);
    assert_eq!(
        SEEN_USER_DATA.load(std::sync::atomic::Ordering::SeqCst),
        0x77
    );
    assert_eq!(
        f32_values(&to_host(out[0]).unwrap()),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    // Without a context: the handler's error, naming the call.
    let y = put_f32(client, device, &[0.0; 4]);
    let (_, msg) = execute(exe, &[y], &[]).unwrap_err();
    assert!(
        msg.contains("xla_vmm_test_user_data") && msg.contains("no user data of FFI type id 42"),
        "{msg}"
    );
    // The executable goes on: with the context again, the next run works.
    let z = put_f32(client, device, &[0.0; 4]);
    let raw = RawExecute {
        context: ctx.context,
        ..RawExecute::new(std::slice::from_ref(&z))
    };
    let mut out2 = [null_mut()];
    let done = raw.run(exe, out2.as_mut_ptr()).unwrap();
    assert_eq!(await_event(done), None);
    destroy_event(done);
    assert_eq!(f32_values(&to_host(out2[0]).unwrap()), vec![1.0; 4]);
    call_ok!(
        PJRT_ExecuteContext_Destroy,
        PJRT_ExecuteContext_Destroy_Args,
        |a| {
            a.context = ctx.context;
        }
    );
    for b in [x, out[0], y, z, out2[0]] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

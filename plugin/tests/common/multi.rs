//! Helpers of the multi-device tests: client options, device queries,
//! `Execute` with one argument list per device or on one device, a
//! collective plan for the host backend, and an in-memory key-value store
//! behind the PJRT callbacks (two "processes" in one).
#![allow(dead_code, unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::mem::zeroed;
use std::ptr::null_mut;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::plans::*;
use super::*;
use xla_vmm::*;

// ---- client options ---------------------------------------------------------

pub enum Opt {
    Str(&'static str),
    Int(i64),
}

/// Named values for `PJRT_Client_Create` (the strings are 'static).
pub fn named(opts: &[(&'static str, Opt)]) -> Vec<PJRT_NamedValue> {
    opts.iter()
        .map(|(name, v)| {
            let mut o: PJRT_NamedValue = unsafe { zeroed() };
            o.struct_size = PJRT_NamedValue_STRUCT_SIZE as usize;
            o.name = name.as_ptr().cast();
            o.name_size = name.len();
            match v {
                Opt::Str(s) => {
                    o.type_ = PJRT_NamedValue_kString;
                    o.__bindgen_anon_1.string_value = s.as_ptr().cast();
                    o.value_size = s.len();
                }
                Opt::Int(i) => {
                    o.type_ = PJRT_NamedValue_kInt64;
                    o.__bindgen_anon_1.int64_value = *i;
                    o.value_size = 1;
                }
            }
            o
        })
        .collect()
}

pub fn create(
    opts: &[(&'static str, Opt)],
    kv: Option<&'static Kv>,
) -> Result<*mut PJRT_Client, (u32, String)> {
    let opts = named(opts);
    let (err, a) = call!(PJRT_Client_Create, PJRT_Client_Create_Args, |a| {
        a.create_options = opts.as_ptr();
        a.num_options = opts.len();
        if let Some(kv) = kv {
            let user = kv as *const Kv as *mut c_void;
            a.kv_get_callback = Some(kv_get);
            a.kv_get_user_arg = user;
            a.kv_put_callback = Some(kv_put);
            a.kv_put_user_arg = user;
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(a.client),
    }
}

pub fn addressable(client: *mut PJRT_Client) -> Vec<*mut PJRT_Device> {
    let a = call_ok!(
        PJRT_Client_AddressableDevices,
        PJRT_Client_AddressableDevices_Args,
        |a| {
            a.client = client;
        }
    );
    unsafe { std::slice::from_raw_parts(a.addressable_devices, a.num_addressable_devices).to_vec() }
}

pub fn device_id(d: *mut PJRT_Device) -> i32 {
    let g = call_ok!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args,
        |a| {
            a.device = d;
        }
    );
    let i = call_ok!(
        PJRT_DeviceDescription_Id,
        PJRT_DeviceDescription_Id_Args,
        |a| {
            a.device_description = g.device_description;
        }
    );
    i.id
}

pub fn process_of(d: *mut PJRT_Device) -> i32 {
    let (_, g) = call!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args,
        |a| {
            a.device = d;
        }
    );
    let p = call_ok!(
        PJRT_DeviceDescription_ProcessIndex,
        PJRT_DeviceDescription_ProcessIndex_Args,
        |a| {
            a.device_description = g.device_description;
        }
    );
    p.process_index
}

pub fn is_addressable(d: *mut PJRT_Device) -> bool {
    let a = call_ok!(
        PJRT_Device_IsAddressable,
        PJRT_Device_IsAddressable_Args,
        |a| {
            a.device = d;
        }
    );
    a.is_addressable
}

pub fn buffer_device(b: *mut PJRT_Buffer) -> *mut PJRT_Device {
    let a = call_ok!(PJRT_Buffer_Device, PJRT_Buffer_Device_Args, |a| {
        a.buffer = b;
    });
    a.device
}

// ---- execute on several devices --------------------------------------------

/// Execute with one argument list per device; (outputs, events) per device.
pub fn execute_n(
    exe: *mut PJRT_LoadedExecutable,
    lists: &[Vec<*mut PJRT_Buffer>],
    num_devices: usize,
) -> Result<Vec<(*mut PJRT_Buffer, *mut PJRT_Event)>, (u32, String)> {
    let mut opts: PJRT_ExecuteOptions = unsafe { zeroed() };
    opts.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE as usize;
    let arg_lists: Vec<*const *mut PJRT_Buffer> = lists.iter().map(|l| l.as_ptr()).collect();
    let mut outs = vec![[null_mut::<PJRT_Buffer>(); 1]; lists.len()];
    let out_lists: Vec<*mut *mut PJRT_Buffer> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
    let mut events = vec![null_mut::<PJRT_Event>(); lists.len()];
    let (err, _) = call!(
        PJRT_LoadedExecutable_Execute,
        PJRT_LoadedExecutable_Execute_Args,
        |a| {
            a.executable = exe;
            a.options = &mut opts;
            a.argument_lists = arg_lists.as_ptr();
            a.num_devices = num_devices;
            a.num_args = lists.first().map_or(0, |l| l.len());
            a.output_lists = out_lists.as_ptr();
            a.device_complete_events = events.as_mut_ptr();
        }
    );
    match err {
        Some(e) => Err(e),
        None => Ok(outs.iter().zip(events).map(|(o, e)| (o[0], e)).collect()),
    }
}

pub fn slice(allocation: usize, start: u64, len: u64) -> Slice {
    Slice {
        allocation,
        offset: start * 4,
        size: len * 4,
    }
}

/// out (f32[8]) = [all-reduce sum of the f32[4] argument over both
/// partitions, the partition id (u32 bits), 0, 0, 0].
pub fn all_reduce_and_partition_id() -> Plan {
    let param = AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: false,
    };
    let all_reduce = CollectiveThunk {
        op: CollectiveOp::AllReduce,
        replica_groups: vec![vec![0, 1]],
        group_mode: GroupMode::FlattenedId,
        operand_element_types: vec![ElementType::F32],
        use_symmetric_buffer: false,
        reduction: Some(ReductionKind::Sum),
        buffers: vec![CollectiveBuffer {
            element_count: 4,
            element_type: Some(ElementType::F32),
            source: ShapedSlice {
                slice: slice(0, 0, 4),
                shape: None,
            },
            destination: ShapedSlice {
                slice: slice(1, 0, 4),
                shape: None,
            },
            source_memory_space: 0,
            destination_memory_space: 0,
        }],
        source_target_pairs: vec![],
        has_split_dimension: false,
        has_dynamic_root: false,
        collectives_mode: 0,
        from_collective_kernel: false,
    };
    let mut p = plan(
        vec![
            alloc(0, 16, param),
            alloc(1, 32, AllocationRole::Output { outputs: vec![] }),
        ],
        1,
        vec![
            thunk(
                "memset",
                ThunkKind::Memset32 {
                    dest: slice(1, 0, 8),
                    value: 0,
                },
            ),
            thunk("all-reduce.1", ThunkKind::Collective(Box::new(all_reduce))),
            thunk(
                "partition-id",
                ThunkKind::PartitionId {
                    dest: slice(1, 4, 1),
                },
            ),
        ],
    );
    p.program_shape.result = f32s(8);
    p
}

/// An in-memory key-value store behind the PJRT callbacks.
#[derive(Default)]
pub struct Kv {
    pub map: Mutex<HashMap<String, String>>,
    changed: Condvar,
}

pub unsafe fn text(p: *const c_char, n: usize) -> String {
    String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), n)).into_owned()
}

pub unsafe extern "C" fn kv_put(a: *mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error {
    let a = &mut *a;
    let kv = &*(a.user_arg as *const Kv);
    kv.map
        .lock()
        .unwrap()
        .insert(text(a.key, a.key_size), text(a.value, a.value_size));
    kv.changed.notify_all();
    null_mut()
}

pub unsafe extern "C" fn kv_get(a: *mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error {
    let a = &mut *a;
    let kv = &*(a.user_arg as *const Kv);
    let key = text(a.key, a.key_size);
    let deadline = Instant::now() + Duration::from_millis(a.timeout_in_ms.max(0) as u64);
    let mut map = kv.map.lock().unwrap();
    loop {
        if let Some(v) = map.get(&key) {
            // [len: usize][bytes]; the value pointer is past the length.
            let mut buf = vec![0u8; 8 + v.len()].into_boxed_slice();
            buf[..8].copy_from_slice(&v.len().to_ne_bytes());
            buf[8..].copy_from_slice(v.as_bytes());
            let p = Box::into_raw(buf).cast::<u8>();
            a.value = p.add(8).cast();
            a.value_size = v.len();
            a.value_deleter_callback = Some(free_whole);
            return null_mut();
        }
        let now = Instant::now();
        if now >= deadline {
            let msg = format!("key {key} not found before the timeout");
            let f = (*a.callback_error).unwrap();
            return f(
                PJRT_Error_Code_DEADLINE_EXCEEDED,
                msg.as_ptr().cast(),
                msg.len(),
            );
        }
        map = kv.changed.wait_timeout(map, deadline - now).unwrap().0;
    }
}

/// Frees a value from `kv_get` (the allocation starts 8 bytes before it).
pub unsafe extern "C" fn free_whole(v: *mut c_char) {
    let start = v.cast::<u8>().sub(8);
    let len = *(start.cast::<usize>());
    drop(Box::<[u8]>::from_raw(std::ptr::slice_from_raw_parts_mut(
        start,
        8 + len,
    )));
}

/// Execute on one device (`execute_device`); (output, event).
pub fn execute_on(
    exe: *mut PJRT_LoadedExecutable,
    device: *mut PJRT_Device,
    args: &[*mut PJRT_Buffer],
) -> Result<*mut PJRT_Buffer, (u32, String)> {
    let mut out = [null_mut::<PJRT_Buffer>(); 1];
    let ev = super::RawExecute {
        device,
        ..super::RawExecute::new(args)
    }
    .run(exe, out.as_mut_ptr())?;
    assert_eq!(await_event(ev), None);
    destroy_event(ev);
    Ok(out[0])
}

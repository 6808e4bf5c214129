//! Several devices through the C API on the host backend: devices and
//! memories listed, buffers on each device, a program executed on two
//! devices at once (one argument list per device), the errors of a wrong
//! `num_devices` or an argument on the wrong device (without leaks), and a
//! two-process job emulated in one process (two clients, node_id 0 / 1,
//! over an in-memory key-value store with C callbacks written here).
#![allow(unsafe_code)]

mod common;

use std::time::Instant;

use common::multi::*;
use common::plans::*;
use common::*;
use xla_vmm_plugin::cabi::assignment::{AssignmentProto, DeviceAssignment};
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;
use xla_vmm_plugin::runtime::context::VmmDevice;

fn two_device_client() -> *mut PJRT_Client {
    client::into_c(Client::with_backends(host_options(), vec![backend(), backend()], None).unwrap())
}

#[test]
fn a_client_with_two_host_devices_lists_both() {
    let client = create(
        &[("backend", Opt::Str("host")), ("host_devices", Opt::Int(2))],
        None,
    )
    .unwrap();
    let all = devices(client);
    assert_eq!(all.len(), 2);
    assert_eq!(addressable(client), all);
    assert_eq!(
        all.iter().map(|&d| device_id(d)).collect::<Vec<_>>(),
        vec![0, 1]
    );
    let mut memories = Vec::new();
    for (i, &d) in all.iter().enumerate() {
        assert!(is_addressable(d));
        let h = call_ok!(
            PJRT_Device_LocalHardwareId,
            PJRT_Device_LocalHardwareId_Args,
            |a| {
                a.device = d;
            }
        );
        assert_eq!(h.local_hardware_id, i as i32);
        let m = call_ok!(
            PJRT_Device_DefaultMemory,
            PJRT_Device_DefaultMemory_Args,
            |a| {
                a.device = d;
            }
        );
        memories.push(m.memory);
        let l = call_ok!(
            PJRT_Client_LookupDevice,
            PJRT_Client_LookupDevice_Args,
            |a| {
                a.client = client;
                a.id = i as i32;
            }
        );
        assert_eq!(l.device, d);
        let l = call_ok!(
            PJRT_Client_LookupAddressableDevice,
            PJRT_Client_LookupAddressableDevice_Args,
            |a| {
                a.client = client;
                a.local_hardware_id = i as i32;
            }
        );
        assert_eq!(l.addressable_device, d);
    }
    assert_ne!(memories[0], memories[1]);
    let (err, m) = call!(
        PJRT_Client_AddressableMemories,
        PJRT_Client_AddressableMemories_Args,
        |a| {
            a.client = client;
        }
    );
    // Device memory and pinned host memory of each device.
    assert_eq!((err, m.num_addressable_memories), (None, 4));
    let (err, l) = call!(
        PJRT_Client_LookupDevice,
        PJRT_Client_LookupDevice_Args,
        |a| {
            a.client = client;
            a.id = 2;
        }
    );
    assert!(err.unwrap().1.contains("no device with id 2"));
    let _ = l;

    // Buffers live on their device; copies cross devices.
    let b1 = put_f32(client, all[1], &[1.0, 2.0]);
    assert_eq!(buffer_device(b1), all[1]);
    let c = call_ok!(
        PJRT_Buffer_CopyToDevice,
        PJRT_Buffer_CopyToDevice_Args,
        |a| {
            a.buffer = b1;
            a.dst_device = all[0];
        }
    );
    assert_eq!(buffer_device(c.dst_buffer), all[0]);
    assert_eq!(f32_values(&to_host(c.dst_buffer).unwrap()), vec![1.0, 2.0]);
    destroy_buffer(c.dst_buffer);
    destroy_buffer(b1);
    destroy_client(client);
}

#[test]
fn a_program_runs_on_two_devices_at_once() {
    let backends = vec![backend(), backend()];
    let client =
        client::into_c(Client::with_backends(host_options(), backends.clone(), None).unwrap());
    let devs = devices(client);
    let assignment = DeviceAssignment {
        replicas: 1,
        partitions: 2,
        ids: vec![0, 1],
    };
    let exe = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        add_one(),
        b"two".to_vec(),
        Some(assignment.clone()),
    )
    .unwrap();

    // Queries: two partitions, both devices, the assignment's proto.
    let g = call_ok!(
        PJRT_LoadedExecutable_GetExecutable,
        PJRT_LoadedExecutable_GetExecutable_Args,
        |a| {
            a.loaded_executable = exe;
        }
    );
    let np = call_ok!(
        PJRT_Executable_NumPartitions,
        PJRT_Executable_NumPartitions_Args,
        |a| {
            a.executable = g.executable;
        }
    );
    assert_eq!(np.num_partitions, 2);
    let nr = call_ok!(
        PJRT_Executable_NumReplicas,
        PJRT_Executable_NumReplicas_Args,
        |a| {
            a.executable = g.executable;
        }
    );
    assert_eq!(nr.num_replicas, 1);
    call_ok!(PJRT_Executable_Destroy, PJRT_Executable_Destroy_Args, |a| {
        a.executable = g.executable;
    });
    let ad = call_ok!(
        PJRT_LoadedExecutable_AddressableDevices,
        PJRT_LoadedExecutable_AddressableDevices_Args,
        |a| {
            a.executable = exe;
        }
    );
    let ad =
        unsafe { std::slice::from_raw_parts(ad.addressable_devices, ad.num_addressable_devices) };
    assert_eq!(ad, &devs[..]);
    let da = call_ok!(
        PJRT_LoadedExecutable_GetDeviceAssignment,
        PJRT_LoadedExecutable_GetDeviceAssignment_Args,
        |a| {
            a.executable = exe;
        }
    );
    let bytes = unsafe {
        std::slice::from_raw_parts(da.serialized_bytes.cast::<u8>(), da.serialized_bytes_size)
    };
    assert_eq!(DeviceAssignment::from_proto(bytes).unwrap(), assignment);
    let li = call_ok!(
        PJRT_LoadedExecutable_AddressableDeviceLogicalIds,
        PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args,
        |a| {
            a.executable = exe;
        }
    );
    let li = unsafe {
        std::slice::from_raw_parts(
            li.addressable_device_logical_ids,
            li.num_addressable_device_logical_ids,
        )
    };
    let li: Vec<(i32, i32)> = li.iter().map(|l| (l.replica, l.partition)).collect();
    assert_eq!(li, vec![(0, 0), (0, 1)]);

    // Each device gets its own argument and its own result.
    let a0 = put_f32(client, devs[0], &[1.0, 2.0, 3.0, 4.0]);
    let a1 = put_f32(client, devs[1], &[10.0, 20.0, 30.0, 40.0]);
    let res = execute_n(exe, &[vec![a0], vec![a1]], 2).unwrap();
    assert_eq!(res.len(), 2);
    for (d, &(out, ev)) in res.iter().enumerate() {
        assert_eq!(await_event(ev), None);
        destroy_event(ev);
        assert_eq!(buffer_device(out), devs[d]);
    }
    assert_eq!(
        f32_values(&to_host(res[0].0).unwrap()),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(
        f32_values(&to_host(res[1].0).unwrap()),
        vec![11.0, 21.0, 31.0, 41.0]
    );
    for &(out, _) in &res {
        destroy_buffer(out);
    }

    // Errors name what is wrong and leave nothing behind.
    let e = execute_n(exe, &[vec![a0]], 1).unwrap_err();
    assert_eq!(e.0, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(
        e.1.contains("2 addressable devices") && e.1.contains("num_devices"),
        "{}",
        e.1
    );
    let e = execute_n(exe, &[vec![a1], vec![a0]], 2).unwrap_err();
    assert!(e.1.contains("argument 0 is on device 1"), "{}", e.1);
    // A deleted argument on one device: nothing runs anywhere.
    let gone = put_f32(client, devs[1], &[0.0; 4]);
    call_ok!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args, |a| {
        a.buffer = gone;
    });
    let e = execute_n(exe, &[vec![a0], vec![gone]], 2).unwrap_err();
    assert!(
        e.1.contains("argument list 1") && e.1.contains("deleted"),
        "{}",
        e.1
    );
    destroy_buffer(gone);
    let e = execute_n(exe, &[vec![a0, a0], vec![a1, a1]], 2).unwrap_err();
    assert!(e.1.contains("takes 1 arguments, 2 given"), "{}", e.1);

    // Host cost of a two-device step (threads per step): reported.
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let res = execute_n(exe, &[vec![a0], vec![a1]], 2).unwrap();
        times.push(t.elapsed());
        for (out, ev) in res {
            assert_eq!(await_event(ev), None);
            destroy_event(ev);
            destroy_buffer(out);
        }
    }
    times.sort();
    let two = times[times.len() / 2];
    // The same program on one device, for comparison.
    let one_exe = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        add_one(),
        b"one".to_vec(),
        Some(DeviceAssignment::single(0)),
    )
    .unwrap();
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let res = execute_n(one_exe, &[vec![a0]], 1).unwrap();
        times.push(t.elapsed());
        for (out, ev) in res {
            assert_eq!(await_event(ev), None);
            destroy_event(ev);
            destroy_buffer(out);
        }
    }
    times.sort();
    eprintln!(
        "Execute (host backend, this build): two devices median {two:?}, one device median {:?}",
        times[times.len() / 2]
    );
    destroy_exe(one_exe);

    destroy_buffer(a0);
    destroy_buffer(a1);
    destroy_exe(exe);
    destroy_client(client);
    // Nothing leaked (a live buffer or event would keep its device's
    // memory): both devices' memory, streams and events are released.
    for (d, b) in backends.iter().enumerate() {
        let out = b.outstanding();
        assert_eq!(out.total(), 0, "device {d} still holds {out:?}");
    }
}

#[test]
fn an_all_reduce_runs_across_two_devices() {
    let client = two_device_client();
    let devs = devices(client);
    let exe = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        all_reduce_and_partition_id(),
        b"all-reduce".to_vec(),
        Some(DeviceAssignment {
            replicas: 1,
            partitions: 2,
            ids: vec![0, 1],
        }),
    )
    .unwrap();
    let a0 = put_f32(client, devs[0], &[1.0, 2.0, 3.0, 4.0]);
    let a1 = put_f32(client, devs[1], &[10.0, 20.0, 30.0, 40.0]);
    // Several steps: the communicators are made at the first.
    for _ in 0..3 {
        let res = execute_n(exe, &[vec![a0], vec![a1]], 2).unwrap();
        for (d, (out, ev)) in res.into_iter().enumerate() {
            assert_eq!(await_event(ev), None);
            destroy_event(ev);
            let bytes = to_host(out).unwrap();
            assert_eq!(
                f32_values(&bytes[..16]),
                vec![11.0, 22.0, 33.0, 44.0],
                "device {d}"
            );
            let id = u32::from_le_bytes(bytes[16..20].try_into().unwrap());
            assert_eq!(id, d as u32, "partition id on device {d}");
            assert_eq!(&bytes[20..], &[0u8; 12][..]);
            destroy_buffer(out);
        }
    }
    destroy_buffer(a0);
    destroy_buffer(a1);
    destroy_exe(exe);
    destroy_client(client);
}

#[test]
fn synchronous_mode_runs_both_devices_too() {
    let mems = vec![
        VmmDevice::new(backend()).unwrap().with_sync(true),
        VmmDevice::new(backend()).unwrap().with_sync(true),
    ];
    let client = client::into_c(Client::with_memories(host_options(), mems, None).unwrap());
    let devs = devices(client);
    let exe = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        all_reduce_and_partition_id(),
        b"sync".to_vec(),
        Some(DeviceAssignment {
            replicas: 1,
            partitions: 2,
            ids: vec![0, 1],
        }),
    )
    .unwrap();
    let a0 = put_f32(client, devs[0], &[1.0; 4]);
    let a1 = put_f32(client, devs[1], &[2.0; 4]);
    for (d, (out, ev)) in execute_n(exe, &[vec![a0], vec![a1]], 2)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        assert_eq!(await_event(ev), None);
        destroy_event(ev);
        let bytes = to_host(out).unwrap();
        assert_eq!(f32_values(&bytes[..16]), vec![3.0; 4], "device {d}");
        destroy_buffer(out);
    }
    for b in [a0, a1] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
}

#[test]
fn a_single_device_program_runs_on_the_device_of_its_assignment() {
    let client = two_device_client();
    let devs = devices(client);
    let exe = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        add_one(),
        b"one".to_vec(),
        Some(DeviceAssignment::single(1)),
    )
    .unwrap();
    let a1 = put_f32(client, devs[1], &[1.0, 1.0, 1.0, 1.0]);
    let out = execute(exe, &[a1], &[]).unwrap();
    assert_eq!(buffer_device(out), devs[1]);
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0; 4]);
    let a0 = put_f32(client, devs[0], &[1.0; 4]);
    let e = execute(exe, &[a0], &[]).unwrap_err();
    assert!(e.1.contains("argument 0 is on device 0"), "{}", e.1);
    for b in [a0, a1, out] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
}

// ---- two processes in one ---------------------------------------------------

#[test]
fn two_processes_see_each_others_devices() {
    let kv: &'static Kv = Box::leak(Box::default());
    let make = move |node: i64| {
        std::thread::spawn(move || {
            create(
                &[
                    ("backend", Opt::Str("host")),
                    ("node_id", Opt::Int(node)),
                    ("num_nodes", Opt::Int(2)),
                ],
                Some(kv),
            )
            .map(|c| c as usize)
        })
    };
    let (t0, t1) = (make(0), make(1));
    let clients = [t0.join().unwrap().unwrap(), t1.join().unwrap().unwrap()];
    for (node, &c) in clients.iter().enumerate() {
        let c = c as *mut PJRT_Client;
        let all = devices(c);
        assert_eq!(all.len(), 2, "process {node}");
        let local = addressable(c);
        assert_eq!(local.len(), 1);
        assert_eq!(device_id(local[0]), node as i32);
        assert_eq!(process_of(local[0]), node as i32);
        let p = call_ok!(
            PJRT_Client_ProcessIndex,
            PJRT_Client_ProcessIndex_Args,
            |a| {
                a.client = c;
            }
        );
        assert_eq!(p.process_index, node as i32);
        let other = all[1 - node];
        assert!(!is_addressable(other));
        assert_eq!(process_of(other), 1 - node as i32);
        let e = from_host(c, other, PJRT_Buffer_Type_F32, &[1], &[0; 4], None).unwrap_err();
        assert!(e.1.contains("not addressable"), "{}", e.1);
        let b = put_f32(c, local[0], &[5.0]);
        assert_eq!(f32_values(&to_host(b).unwrap()), vec![5.0]);
        destroy_buffer(b);
    }
    // An all-reduce across the two "processes": one device each, the
    // clique id goes through the store.
    let runs: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(node, &c)| {
            std::thread::spawn(move || {
                let c = c as *mut PJRT_Client;
                let exe = xla_vmm_plugin::objects::executable::load_plan_on(
                    c,
                    all_reduce_and_partition_id(),
                    b"all-reduce".to_vec(),
                    Some(DeviceAssignment {
                        replicas: 1,
                        partitions: 2,
                        ids: vec![0, 1],
                    }),
                )
                .unwrap();
                let local = addressable(c);
                let x = (node as f32 + 1.0) * 10.0;
                let arg = put_f32(c, local[0], &[x, x, x, x]);
                let res = execute_n(exe, &[vec![arg]], 1).unwrap();
                let (out, ev) = res[0];
                assert_eq!(await_event(ev), None);
                destroy_event(ev);
                let bytes = to_host(out).unwrap();
                destroy_buffer(out);
                destroy_buffer(arg);
                destroy_exe(exe);
                bytes
            })
        })
        .collect();
    for (node, r) in runs.into_iter().enumerate() {
        let bytes = r.join().unwrap();
        assert_eq!(f32_values(&bytes[..16]), vec![30.0; 4], "process {node}");
        assert_eq!(
            u32::from_le_bytes(bytes[16..20].try_into().unwrap()),
            node as u32
        );
    }
    // The topology and the clique id went through the store under the
    // plugin's prefix.
    let keys: Vec<String> = kv.map.lock().unwrap().keys().cloned().collect();
    assert!(keys.iter().all(|k| k.starts_with("xla_vmm/")), "{keys:?}");
    assert_eq!(keys.iter().filter(|k| k.contains("/topology/")).count(), 2);
    assert_eq!(
        keys.iter().filter(|k| k.contains("clique")).count(),
        1,
        "{keys:?}"
    );
    for c in clients {
        destroy_client(c as *mut PJRT_Client);
    }
}

#[test]
fn a_bad_topology_entry_is_a_clear_error() {
    // (3 processes: the plugin counts clients per node id and node count,
    // so this test does not shift the 2-process test's keys.)
    let kv: &'static Kv = Box::leak(Box::default());
    kv.map
        .lock()
        .unwrap()
        .insert("xla_vmm/0/topology/0".into(), "many".into());
    kv.map
        .lock()
        .unwrap()
        .insert("xla_vmm/0/topology/2".into(), "1".into());
    let e = create(
        &[
            ("backend", Opt::Str("host")),
            ("node_id", Opt::Int(1)),
            ("num_nodes", Opt::Int(3)),
        ],
        Some(kv),
    )
    .unwrap_err();
    assert!(
        e.1.contains("process 0 published \"many\" as its device count"),
        "{}",
        e.1
    );
    // What this process published is there for the others.
    assert_eq!(
        kv.map
            .lock()
            .unwrap()
            .get("xla_vmm/0/topology/1")
            .map(String::as_str),
        Some("1")
    );
}

#[test]
fn several_processes_without_a_store_is_a_clear_error() {
    let e = create(
        &[
            ("backend", Opt::Str("host")),
            ("node_id", Opt::Int(0)),
            ("num_nodes", Opt::Int(2)),
        ],
        None,
    )
    .unwrap_err();
    assert!(e.1.contains("key-value store"), "{}", e.1);
}

#[test]
fn a_portable_program_runs_on_the_device_it_is_asked_to() {
    let client = two_device_client();
    let devs = devices(client);
    // No assignment: loaded on the first device, loaded on others on demand.
    let exe =
        xla_vmm_plugin::objects::executable::load_plan_on(client, add_one(), b"p".to_vec(), None)
            .unwrap();
    let a1 = put_f32(client, devs[1], &[3.0; 4]);
    for _ in 0..2 {
        let out = execute_on(exe, devs[1], &[a1]).unwrap();
        assert_eq!(buffer_device(out), devs[1]);
        assert_eq!(f32_values(&to_host(out).unwrap()), vec![4.0; 4]);
        destroy_buffer(out);
    }
    let e = execute_on(exe, devs[0], &[a1]).unwrap_err();
    assert!(e.1.contains("argument 0 is on device 1"), "{}", e.1);
    // A program with an assignment runs only there.
    let fixed = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        add_one(),
        b"f".to_vec(),
        Some(DeviceAssignment::single(0)),
    )
    .unwrap();
    let e = execute_on(fixed, devs[1], &[a1]).unwrap_err();
    assert!(
        e.1.contains("execute_device 1 is not one of the devices [0]"),
        "{}",
        e.1
    );
    destroy_buffer(a1);
    destroy_exe(fixed);
    destroy_exe(exe);
    destroy_client(client);
}

#[test]
fn binding_stats_name_their_device() {
    // VA-stable graph mode (the only mode with binding stats), without the
    // guard (whose trial starts with graph-recapture).
    let mut opts = host_options();
    opts.run.guard = false;
    let client =
        client::into_c(Client::with_backends(opts, vec![backend(), backend()], None).unwrap());
    let devs = devices(client);
    let mut p = add_one();
    p.module_name = "jit_stats_per_device".into();
    let exe = xla_vmm_plugin::objects::executable::load_plan_on(
        client,
        p,
        b"stats".to_vec(),
        Some(DeviceAssignment {
            replicas: 1,
            partitions: 2,
            ids: vec![0, 1],
        }),
    )
    .unwrap();
    let a0 = put_f32(client, devs[0], &[1.0; 4]);
    let a1 = put_f32(client, devs[1], &[2.0; 4]);
    for _ in 0..3 {
        for (d, (out, ev)) in execute_n(exe, &[vec![a0], vec![a1]], 2)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            assert_eq!(await_event(ev), None);
            destroy_event(ev);
            assert_eq!(f32_values(&to_host(out).unwrap()), vec![d as f32 + 2.0; 4]);
            destroy_buffer(out);
        }
    }
    let json = xla_vmm_plugin::cabi::stats::stats_json();
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&json).unwrap();
    let mut seen = Vec::new();
    for (key, entry) in &map {
        if key.starts_with("jit_stats_per_device#") {
            assert_eq!(entry["steps"], 3, "{key}: {entry}");
            seen.push(entry["device"].as_i64().expect("entry without a device"));
        }
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1], "{json}");
    for b in [a0, a1] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
}

/// jax.distributed reports every process's state through
/// `PJRT_Client_UpdateGlobalProcessInfo` (and aborts the process if the call
/// fails): accepted, including an error state; a null list with a count is
/// an error naming the argument.
#[test]
fn global_process_info_updates_are_accepted() {
    let client = create_client("host").unwrap();
    let msg = "peer went away";
    let mut infos: Vec<PJRT_ProcessInfo> = (0..2)
        .map(|i| {
            let mut p: PJRT_ProcessInfo = unsafe { std::mem::zeroed() };
            p.struct_size = PJRT_ProcessInfo_STRUCT_SIZE as usize;
            p.task_id = i;
            p.incarnation_id = 7 + i as u64;
            p.state = if i == 0 {
                PJRT_ProcessState_kConnected
            } else {
                PJRT_ProcessState_kError
            };
            if i == 1 {
                p.error_code = 14;
                p.error_message = msg.as_ptr().cast();
                p.error_message_size = msg.len();
            }
            p
        })
        .collect();
    call_ok!(
        PJRT_Client_UpdateGlobalProcessInfo,
        PJRT_Client_UpdateGlobalProcessInfo_Args,
        |a| {
            a.client = client;
            a.process_infos = infos.as_mut_ptr();
            a.num_process_infos = infos.len();
        }
    );
    let (err, _) = call!(
        PJRT_Client_UpdateGlobalProcessInfo,
        PJRT_Client_UpdateGlobalProcessInfo_Args,
        |a| {
            a.client = client;
            a.process_infos = std::ptr::null_mut();
            a.num_process_infos = 2;
        }
    );
    let (_, message) = err.expect("a null list with a count must fail");
    assert!(message.contains("process_infos"), "{message}");
    destroy_client(client);
}

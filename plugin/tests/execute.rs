//! Execution through the C API on the host backend, with synthetic plans
//! (host kernels): outputs, donation, `non_donatable_input_indices`,
//! argument checks, executable queries, and no leaks.
#![allow(unsafe_code)]

mod common;

use common::plans::*;
use common::*;
use xla_vmm::*;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;

/// The result is the parameter itself, not donated (XLA's passthrough).
fn passthrough() -> Plan {
    let param = AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: false,
    };
    let mut p = plan(vec![alloc(0, 16, param)], 0, vec![]);
    p.outputs[0].passthrough = true;
    p
}

fn is_deleted(b: *mut PJRT_Buffer) -> bool {
    let a = call_ok!(PJRT_Buffer_IsDeleted, PJRT_Buffer_IsDeleted_Args, |a| {
        a.buffer = b;
    });
    a.is_deleted
}

#[test]
fn execute_outputs_donation_and_errors() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let put = |v: &[f32]| put_f32(client, device, v);

    // ---- out = a + 1; the argument stays live.
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"bytes-1".to_vec())
            .unwrap();
    let a = put(&[1.0, 2.0, 3.0, 4.0]);
    let out = execute(exe, &[a], &[]).unwrap();
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0, 3.0, 4.0, 5.0]);
    assert!(!is_deleted(a));
    assert_eq!(f32_values(&to_host(a).unwrap()), vec![1.0, 2.0, 3.0, 4.0]);
    // Twice: the output is a fresh buffer each time.
    let out2 = execute(exe, &[out], &[]).unwrap();
    assert_eq!(
        f32_values(&to_host(out2).unwrap()),
        vec![3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0, 3.0, 4.0, 5.0]);

    // ---- queries
    let g = call_ok!(
        PJRT_LoadedExecutable_GetExecutable,
        PJRT_LoadedExecutable_GetExecutable_Args,
        |x| {
            x.loaded_executable = exe;
        }
    );
    let n = call_ok!(
        PJRT_Executable_NumOutputs,
        PJRT_Executable_NumOutputs_Args,
        |x| {
            x.executable = g.executable;
        }
    );
    assert_eq!(n.num_outputs, 1);
    let t = call_ok!(
        PJRT_Executable_OutputElementTypes,
        PJRT_Executable_OutputElementTypes_Args,
        |x| {
            x.executable = g.executable;
        }
    );
    assert_eq!(
        unsafe { std::slice::from_raw_parts(t.output_types, t.num_output_types) },
        &[PJRT_Buffer_Type_F32]
    );
    let d = call_ok!(
        PJRT_Executable_OutputDimensions,
        PJRT_Executable_OutputDimensions_Args,
        |x| {
            x.executable = g.executable;
        }
    );
    assert_eq!(
        unsafe { std::slice::from_raw_parts(d.dim_sizes, d.num_outputs) },
        &[1]
    );
    assert_eq!(unsafe { std::slice::from_raw_parts(d.dims, 1) }, &[4]);
    let nm = call_ok!(PJRT_Executable_Name, PJRT_Executable_Name_Args, |x| {
        x.executable = g.executable;
    });
    assert_eq!(
        unsafe {
            std::slice::from_raw_parts(nm.executable_name.cast::<u8>(), nm.executable_name_size)
        },
        b"jit_test"
    );
    let s = call_ok!(
        PJRT_Executable_Serialize,
        PJRT_Executable_Serialize_Args,
        |x| {
            x.executable = g.executable;
        }
    );
    assert_eq!(
        unsafe {
            std::slice::from_raw_parts(s.serialized_bytes.cast::<u8>(), s.serialized_bytes_size)
        },
        b"bytes-1"
    );
    unsafe { (s.serialized_executable_deleter.unwrap())(s.serialized_executable) };
    let da = call_ok!(
        PJRT_LoadedExecutable_GetDeviceAssignment,
        PJRT_LoadedExecutable_GetDeviceAssignment_Args,
        |x| {
            x.executable = exe;
        }
    );
    let da_bytes = unsafe {
        std::slice::from_raw_parts(da.serialized_bytes.cast::<u8>(), da.serialized_bytes_size)
    };
    // DeviceAssignmentProto: 1 replica, 1 computation, on device 0.
    assert_eq!(
        da_bytes,
        &[0x08, 0x01, 0x10, 0x01, 0x1A, 0x03, 0x0A, 0x01, 0x00]
    );
    unsafe { (da.serialized_device_assignment_deleter.unwrap())(da.serialized_device_assignment) };
    call_ok!(PJRT_Executable_Destroy, PJRT_Executable_Destroy_Args, |x| {
        x.executable = g.executable;
    });

    // ---- bad arguments: shape, count, deleted buffer
    let wrong = put(&[1.0, 2.0, 3.0, 4.0, 5.0]);
    let (code, msg) = execute(exe, &[wrong], &[]).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(
        msg.contains("argument 0") && msg.contains("f32[5]"),
        "{msg}"
    );
    let (_, msg) = execute(exe, &[], &[]).unwrap_err();
    assert!(msg.contains("takes 1 arguments, 0 given"), "{msg}");
    call_ok!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args, |x| {
        x.buffer = a;
    });
    let (code, msg) = execute(exe, &[a], &[]).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_FAILED_PRECONDITION);
    assert!(msg.contains("deleted"), "{msg}");

    // ---- donation: the argument's memory becomes the output.
    let dexe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one_donated(), vec![]).unwrap();
    let x = put(&[1.0, 5.0, 0.0, 0.0]);
    let y = execute(dexe, &[x], &[]).unwrap();
    assert_eq!(f32_values(&to_host(y).unwrap()), vec![2.0, 6.0, 1.0, 1.0]);
    assert!(is_deleted(x));
    let (code, msg) = to_host(x).unwrap_err();
    assert_eq!(code, PJRT_Error_Code_FAILED_PRECONDITION);
    assert!(msg.contains("donated"), "{msg}");
    let (_, msg) = execute(dexe, &[x], &[]).unwrap_err();
    assert!(msg.contains("donated"), "donated-then-reused: {msg}");
    // Not donatable: the program updates a copy, the argument is untouched.
    let z = execute(dexe, &[y], &[0]).unwrap();
    assert!(!is_deleted(y));
    assert_eq!(f32_values(&to_host(y).unwrap()), vec![2.0, 6.0, 1.0, 1.0]);
    assert_eq!(f32_values(&to_host(z).unwrap()), vec![3.0, 7.0, 2.0, 2.0]);

    // ---- passthrough: the output is a new buffer, the argument stays live.
    let pexe =
        xla_vmm_plugin::objects::executable::load_plan(client, passthrough(), vec![]).unwrap();
    let p_out = execute(pexe, &[z], &[]).unwrap();
    assert!(!is_deleted(z));
    assert_ne!(p_out, z);
    assert_eq!(
        f32_values(&to_host(p_out).unwrap()),
        vec![3.0, 7.0, 2.0, 2.0]
    );

    // ---- teardown: nothing left behind
    for b in [a, out, out2, wrong, x, y, z, p_out] {
        destroy_buffer(b);
    }
    for e in [exe, dexe, pexe] {
        destroy_exe(e);
    }
    let st = call_ok!(PJRT_Device_MemoryStats, PJRT_Device_MemoryStats_Args, |x| {
        x.device = device;
    });
    assert_eq!(st.num_allocs, 0);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

/// A buffer donated to another program is new content, though the output
/// keeps the argument's allocation: a program that read the buffer before
/// (its 16-byte parameter served by a shadow copy in VA-stable graph mode,
/// the copy left out while the same buffer is bound again) reads what the
/// other program wrote, step after step, at every copy threshold.
/// Three results out of the program's memory: a + 1, a + 2 and a
/// passthrough of a (not donated).
fn three_results() -> Plan {
    let param = AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: false,
    };
    let out = || AllocationRole::Output { outputs: vec![] };
    let copy = |d: usize| {
        thunk(
            "copy",
            ThunkKind::DeviceToDeviceCopy(copy_of(sl(0, 16), sl(d, 16))),
        )
    };
    let mut p = plan(
        vec![
            alloc(0, 16, param),
            alloc(1, 16, out()),
            alloc(2, 16, out()),
        ],
        1,
        vec![
            copy(1),
            inc(sl(1, 16), 4),
            copy(2),
            inc(sl(2, 16), 4),
            inc(sl(2, 16), 4),
        ],
    );
    p.program_shape.result = Shape {
        element_type: ElementType::TUPLE,
        tuple_shapes: vec![f32s(4), f32s(4), f32s(4)],
        ..Default::default()
    };
    p.outputs = [(1, false), (2, false), (0, true)]
        .into_iter()
        .enumerate()
        .map(|(i, (allocation, passthrough))| OutputInfo {
            shape_index: vec![i as i64],
            allocation,
            passthrough,
            alias: None,
        })
        .collect();
    p
}

/// A program's fresh outputs leave its memory in one batched copy, not one
/// copy each, with the right bytes in each.
#[test]
fn fresh_outputs_are_copied_out_in_one_batch() {
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, three_results(), vec![]).unwrap();
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let args = [a];
    for step in 0..2 {
        let (batches, singles) = (be.call_count("copy_d2d_batch"), be.call_count("copy_d2d"));
        let mut outs = [std::ptr::null_mut(); 3];
        let done = RawExecute::new(&args).run(exe, outs.as_mut_ptr()).unwrap();
        assert_eq!(await_event(done), None);
        destroy_event(done);
        // One batch for the three outputs; single copies only the program's
        // own two copy thunks (when they run eager).
        let (b, c) = (
            be.call_count("copy_d2d_batch") - batches,
            be.call_count("copy_d2d") - singles,
        );
        assert!(b == 1 && c <= 2, "step {step}: {b} batches, {c} copies");
        let want = [
            vec![2.0, 3.0, 4.0, 5.0],
            vec![3.0, 4.0, 5.0, 6.0],
            vec![1.0, 2.0, 3.0, 4.0],
        ];
        for (o, w) in outs.iter().zip(&want) {
            assert_eq!(&f32_values(&to_host(*o).unwrap()), w, "step {step}");
            destroy_buffer(*o);
        }
    }
    assert_eq!(f32_values(&to_host(a).unwrap()), vec![1.0, 2.0, 3.0, 4.0]);
    destroy_buffer(a);
    destroy_exe(exe);
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn a_buffer_donated_to_another_program_is_new_content() {
    for threshold in ["1", "4096"] {
        let be = backend();
        let mut opts = host_options();
        opts.run.guard = false;
        opts.run
            .set("xla_vmm_tmp_copy_threshold", threshold)
            .unwrap();
        let client = client::into_c(Client::with_backend(opts, be.clone()).unwrap());
        let device = devices(client)[0];
        let reader =
            xla_vmm_plugin::objects::executable::load_plan(client, add_one(), vec![]).unwrap();
        let writer =
            xla_vmm_plugin::objects::executable::load_plan(client, add_one_donated(), vec![])
                .unwrap();
        let mut x = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
        for step in 0..10u32 {
            let base = 1.0 + step as f32;
            let want: Vec<f32> = (0..4).map(|i| base + i as f32 + 1.0).collect();
            let r = execute(reader, &[x], &[]).unwrap();
            assert_eq!(
                f32_values(&to_host(r).unwrap()),
                want,
                "threshold {threshold}, step {step}: the reader read stale content"
            );
            destroy_buffer(r);
            let y = execute(writer, &[x], &[]).unwrap();
            assert_eq!(f32_values(&to_host(y).unwrap()), want);
            destroy_buffer(x);
            x = y;
        }
        destroy_buffer(x);
        for e in [reader, writer] {
            destroy_exe(e);
        }
        destroy_client(client);
        assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
    }
}

/// Parameter 0, not aliased with an output.
fn param0() -> AllocationRole {
    AllocationRole::Parameter {
        number: 0,
        shape_index: vec![],
        aliased_with_output: false,
    }
}

/// t = a; t += 1 three times; out = t: a parameter read once, a temporary
/// every thunk reads and writes; (the plan, its argument, the result).
fn read_once_then_temporary(n: u64) -> (Plan, Vec<f32>, Vec<f32>) {
    let v = 4 * n;
    let mut p = plan(
        vec![
            alloc(0, v, param0()),
            alloc(1, v, AllocationRole::Temp),
            alloc(2, v, AllocationRole::Output { outputs: vec![] }),
        ],
        2,
        vec![
            thunk(
                "copy",
                ThunkKind::DeviceToDeviceCopy(copy_of(sl(0, v), sl(1, v))),
            ),
            inc(sl(1, v), n),
            inc(sl(1, v), n),
            inc(sl(1, v), n),
            thunk(
                "copy",
                ThunkKind::DeviceToDeviceCopy(copy_of(sl(1, v), sl(2, v))),
            ),
        ],
    );
    p.program_shape.parameters = vec![f32s(n as usize)];
    p.program_shape.result = f32s(n as usize);
    let a: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let want: Vec<f32> = a.iter().map(|x| x + 3.0).collect();
    (p, a, want)
}

/// A host-backed client with the device memory budget `v` bytes (no
/// staging reserve), one stream per device or not.
fn budget_client(
    v: u64,
    one_stream: bool,
) -> (
    std::sync::Arc<xla_vmm_device::HostBackend>,
    *mut PJRT_Client,
) {
    limited_client(Some(v), 0, one_stream)
}

/// Under a device budget its parameter fills, a program's first run moves
/// the parameter (read once) to host memory under its address, and the
/// room it leaves holds the temporary every thunk reads and writes (read
/// over the link before): the results are right, the budget counts the
/// move, and the moved buffer reads back right afterwards; a move that
/// fails changes nothing but the speed.
#[test]
fn a_program_moves_its_arguments_where_its_plan_wants_them_at_its_first_run() {
    use xla_vmm_device::Backend;
    let n: u64 = 512 << 10;
    let v = 4 * n;
    let (p, a, want) = read_once_then_temporary(n);
    // As JAX gets it (one stream per device: temporaries on shared memory)
    // and not; with the move failing (the driver refuses its memory), and
    // with an external reference (a DLPack export) reading the argument:
    // the argument stays, the results are the same.
    for (one_stream, fail, external) in [
        (true, false, false),
        (false, false, false),
        (true, true, false),
        (true, false, true),
    ] {
        let (be, client) = budget_client(v, one_stream);
        let device = devices(client)[0];
        let x = put_f32(client, device, &a);
        if external {
            assert!(external_ref(x, true).is_none());
        }
        let exe =
            xla_vmm_plugin::objects::executable::load_plan(client, p.clone(), vec![]).unwrap();
        if fail {
            be.inject_failure("mem_create", 1);
        }
        for step in 0..4 {
            let r = execute(exe, &[x], &[]).unwrap();
            assert!(
                f32_values(&to_host(r).unwrap()) == want,
                "one_stream {one_stream}, step {step}"
            );
            destroy_buffer(r);
        }
        assert_eq!(be.injections_armed(), 0, "the failure was met");
        let usage = be.budget().usage();
        let moved = u64::from(!fail && !external);
        assert_eq!(usage.relocated, moved, "the argument out: {usage:?}");
        assert!(usage.device_bytes <= v, "{usage:?}");
        assert!(f32_values(&to_host(x).unwrap()) == a, "the moved argument");
        if external {
            assert!(external_ref(x, false).is_none());
        }
        destroy_buffer(x);
        destroy_exe(exe);
        destroy_client(client);
        assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
    }
}

/// An argument another program ran with is held by that program's binding
/// (a move would hold both the old memory and the new until it ran again).
/// The heaviest program's first run has the idle program give back what it
/// holds (its mappings and its own memory, one more move), and the argument
/// moves, as it does once that program is gone. The other program runs
/// right afterwards.
#[test]
fn an_argument_an_idle_program_holds_moves_once_it_gives_it_back() {
    use xla_vmm_device::Backend;
    let n: u64 = 512 << 10;
    let v = 4 * n;
    let (p, a, want) = read_once_then_temporary(n);
    for other_dropped in [false, true] {
        let (be, client) = budget_client(v, true);
        let device = devices(client)[0];
        let x = put_f32(client, device, &a);
        // The other program runs with the argument where no budget applies
        // yet (its plan moves nothing).
        let limits = be.budget().limits();
        be.budget()
            .set_limits(xla_vmm_device::MemoryLimits::default());
        // It reads the argument's first element: its own memory is small.
        let mut first = plan(
            vec![
                alloc(0, v, param0()),
                alloc(1, 4, AllocationRole::Output { outputs: vec![] }),
            ],
            1,
            vec![thunk(
                "copy",
                ThunkKind::DeviceToDeviceCopy(copy_of(sl(0, 4), sl(1, 4))),
            )],
        );
        first.program_shape.parameters = vec![f32s(n as usize)];
        first.program_shape.result = f32s(1);
        let other = xla_vmm_plugin::objects::executable::load_plan(client, first, vec![]).unwrap();
        let r = execute(other, &[x], &[]).unwrap();
        destroy_buffer(r);
        be.budget().set_limits(limits);
        if other_dropped {
            destroy_exe(other);
        }
        let exe =
            xla_vmm_plugin::objects::executable::load_plan(client, p.clone(), vec![]).unwrap();
        for step in 0..3 {
            let r = execute(exe, &[x], &[]).unwrap();
            assert!(f32_values(&to_host(r).unwrap()) == want, "step {step}");
            destroy_buffer(r);
        }
        let usage = be.budget().usage();
        assert_eq!(
            usage.relocated,
            1 + u64::from(!other_dropped),
            "other program dropped: {other_dropped}: {usage:?}"
        );
        assert!(f32_values(&to_host(x).unwrap()) == a);
        if !other_dropped {
            let r = execute(other, &[x], &[]).unwrap();
            assert_eq!(f32_values(&to_host(r).unwrap()), vec![a[0]]);
            destroy_buffer(r);
            destroy_exe(other);
        }
        destroy_buffer(x);
        destroy_exe(exe);
        destroy_client(client);
        assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
    }
}

/// Under a device budget, one thread runs a light program over and over
/// while another loads a heavier one, whose first run has the device's idle
/// programs give back what they hold (the light one when it is not running:
/// its lock is tried, never waited for). Nothing deadlocks, every result is
/// right, and nothing is left behind.
#[test]
fn a_heavier_programs_first_run_beside_a_busy_thread_takes_back_only_what_is_idle() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use xla_vmm_device::Backend;
    let n: u64 = 512 << 10;
    let v = 4 * n;
    let (heavy_plan, a, want) = read_once_then_temporary(n);
    let (light_plan, b, light_want) = read_once_then_temporary(n / 4);
    for round in 0..3 {
        let (be, client) = budget_client(2 * v, true);
        let device = devices(client)[0];
        let light =
            xla_vmm_plugin::objects::executable::load_plan(client, light_plan.clone(), vec![])
                .unwrap();
        let y = put_f32(client, device, &b);
        let stop = Arc::new(AtomicBool::new(false));
        let (s, light_p, y_p, lw) = (stop.clone(), light as usize, y as usize, light_want.clone());
        let busy = std::thread::spawn(move || {
            let mut runs = 0;
            while !s.load(Ordering::SeqCst) || runs < 20 {
                let r = execute(light_p as *mut _, &[y_p as *mut _], &[]).unwrap();
                let got = f32_values(&to_host(r).unwrap());
                destroy_buffer(r);
                assert!(got == lw, "light run {runs}");
                runs += 1;
            }
            runs
        });
        let x = put_f32(client, device, &a);
        let heavy =
            xla_vmm_plugin::objects::executable::load_plan(client, heavy_plan.clone(), vec![])
                .unwrap();
        for step in 0..4 {
            let r = execute(heavy, &[x], &[]).unwrap();
            assert!(
                f32_values(&to_host(r).unwrap()) == want,
                "round {round}, step {step}"
            );
            destroy_buffer(r);
        }
        stop.store(true, Ordering::SeqCst);
        let runs = busy.join().expect("the light program's thread");
        assert!(runs >= 20, "{runs}");
        assert!(be.budget().usage().device_bytes <= 2 * v);
        destroy_buffer(x);
        destroy_buffer(y);
        destroy_exe(heavy);
        destroy_exe(light);
        destroy_client(client);
        assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
    }
}

//! Executor tests on the host backend with synthetic plans: copies, memset,
//! kernels with packing specs, while with trip count, dynamic-slice windows
//! in a loop, sequential, async start/done, donation, graph mode, and
//! load-time rejection.

mod common;

use std::sync::Arc;

use common::*;
use xla_vmm::*;
use xla_vmm_device::host::arg_ptr;
use xla_vmm_device::{Backend, DevicePtr, HostBackend};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode, RuntimeError};

fn karg(slice: Slice, written: bool) -> KernelArg {
    KernelArg {
        slice,
        shape: None,
        written,
        tma: None,
    }
}

/// A custom kernel thunk running host kernel `kernel` (its "cubin" is the
/// host module image: the kernel name).
fn kernel(
    name: &str,
    kernel: &str,
    args: Vec<KernelArg>,
    packing: Option<Vec<KernelParam>>,
    grid: u64,
) -> Thunk {
    thunk(
        name,
        ThunkKind::CustomKernel(CustomKernelThunk {
            name: kernel.into(),
            spec: KernelSpec {
                code: KernelCode::Cubin {
                    data: Blob(format!("{kernel}\n").into_bytes()),
                },
                kernel_name: kernel.into(),
                arity: args.len() as u32,
                packing,
            },
            args,
            launch: LaunchDims {
                blocks: Dim3 {
                    x: grid,
                    y: 1,
                    z: 1,
                },
                threads: Dim3 { x: 1, y: 1, z: 1 },
                cluster: None,
                shared_memory_bytes: 0,
            },
            use_pdl: false,
            zeroed_output_buffer_indices: vec![],
        }),
    )
}

/// Load, bind `inputs`, run in `mode`, return every output's f32 values.
fn run(
    b: &Arc<HostBackend>,
    p: Plan,
    inputs: &[Vec<f32>],
    mode: Mode,
) -> Result<Vec<Vec<f32>>, RuntimeError> {
    let stream = b.stream_create()?;
    let mut exe = Executable::load(b.clone(), p, None, &stream)?;
    let mut bufs = Vec::new();
    for (i, v) in inputs.iter().enumerate() {
        let buf = DeviceBuffer::alloc(b, (v.len() * 4) as u64)?;
        b.write_sync(buf.ptr(), &bytes(v), &stream)?;
        exe.bind_parameter(i, buf.ptr(), (v.len() * 4) as u64)?;
        bufs.push(buf);
    }
    let outs = exe.run(&stream, mode)?;
    b.stream_synchronize(&stream)?;
    let mut result = Vec::new();
    for o in &outs {
        let mut d = vec![0u8; o.bytes as usize];
        b.read_sync(&mut d, o.ptr, &stream)?;
        result.push(
            d.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    drop(exe);
    for buf in bufs {
        buf.free()?;
    }
    b.stream_destroy(stream)?;
    Ok(result)
}

/// `scale2` over 4 f32 from `src` into `dst`, with packed parameters (the
/// two addresses, then the count as bytes).
fn scale2_4(name: &str, src: Slice, dst: Slice) -> Thunk {
    kernel(
        name,
        "scale2",
        vec![karg(src, false), karg(dst, true)],
        Some(vec![
            KernelParam::ArgAddress { arg_index: 0 },
            KernelParam::ArgAddress { arg_index: 1 },
            KernelParam::Bytes {
                data: Blob(4u32.to_le_bytes().to_vec()),
            },
        ]),
        1,
    )
}

fn copy_memset_kernel_plan() -> Plan {
    let allocs = vec![
        alloc(0, 16, param(0, false)),
        alloc(1, 16, AllocationRole::Output { outputs: vec![] }),
        alloc(2, 64, AllocationRole::Temp),
        alloc(3, 16, AllocationRole::Output { outputs: vec![] }),
    ];
    let thunks = vec![thunk(
        "seq",
        ThunkKind::Sequential {
            thunks: vec![
                thunk(
                    "memset",
                    ThunkKind::Memset32 {
                        dest: sl(3, 0, 16),
                        value: 1.5f32.to_bits(),
                    },
                ),
                thunk(
                    "memzero",
                    ThunkKind::Memzero {
                        dest: ShapedSlice {
                            slice: sl(3, 4, 4),
                            shape: None,
                        },
                    },
                ),
                copy("copy", sl(0, 0, 16), sl(2, 16, 16)),
                scale2_4("fusion.1", sl(2, 16, 16), sl(1, 0, 16)),
            ],
        },
    )];
    plan(
        allocs,
        vec![f32s(4)],
        vec![(1, f32s(4)), (3, f32s(4))],
        thunks,
    )
}

#[test]
fn copies_memset_memzero_and_packed_kernel_args() {
    let b = backend();
    let out = run(
        &b,
        copy_memset_kernel_plan(),
        &[vec![1.0, 2.0, 3.0, -4.0]],
        Mode::Eager,
    )
    .unwrap();
    assert_eq!(out[0], vec![2.0, 4.0, 6.0, -8.0]);
    assert_eq!(out[1], vec![1.5, 0.0, 1.5, 1.5]);
}

/// while (trip count 3) { inc(acc); dsf: memset32 window[iter] of marks }.
fn loop_plan(trip_count: Option<i64>) -> Plan {
    let allocs = vec![
        alloc(0, 8, param(0, false)),
        alloc(1, 8, AllocationRole::Output { outputs: vec![] }),
        alloc(2, 16, AllocationRole::Output { outputs: vec![] }),
        alloc(3, 4, AllocationRole::Temp),
    ];
    let dsf = DynamicSliceFusionThunk {
        parameters: vec![],
        results: vec![DsfResult {
            parameter_number: None,
            result_number: 0,
            result_shape: None,
            update_shape: None,
            update_config: Some(DynamicSliceConfig {
                loop_index: Some(0),
                byte_offset: 0,
                byte_stride: 4,
            }),
            update_offsets: vec![],
        }],
        parameter_buffers: vec![],
        result_buffers: vec![sl(2, 0, 16)],
        embedded_allocations: vec![alloc(0, 4, AllocationRole::Temp)],
        embedded: vec![thunk(
            "mark",
            ThunkKind::Memset32 {
                dest: sl(0, 0, 4),
                value: 7.0f32.to_bits(),
            },
        )],
        verify_offsets: false,
    };
    let body = vec![
        kernel("inc", "inc", vec![karg(sl(1, 0, 8), true)], None, 2),
        thunk("dsf", ThunkKind::DynamicSliceFusion(dsf)),
    ];
    let w = WhileThunk {
        condition_result: sl(3, 0, 1),
        condition: vec![],
        body,
        trip_count,
    };
    let thunks = vec![
        copy("init", sl(0, 0, 8), sl(1, 0, 8)),
        thunk(
            "memzero",
            ThunkKind::Memzero {
                dest: ShapedSlice {
                    slice: sl(2, 0, 16),
                    shape: None,
                },
            },
        ),
        thunk("while", ThunkKind::While(w)),
    ];
    plan(
        allocs,
        vec![f32s(2)],
        vec![(1, f32s(2)), (2, f32s(4))],
        thunks,
    )
}

#[test]
fn while_with_trip_count_and_loop_dependent_windows_eager_and_graph() {
    let b = backend();
    for mode in [Mode::Eager, Mode::GraphRecapture] {
        let out = run(&b, loop_plan(Some(3)), &[vec![10.0, 20.0]], mode).unwrap();
        assert_eq!(out[0], vec![13.0, 23.0], "{mode:?}");
        assert_eq!(out[1], vec![7.0, 7.0, 7.0, 0.0], "{mode:?}");
    }
}

/// Two runs of `p` in `mode` on a backend with a 2 MiB device limit (one
/// granule), half of it kept for staging (the program's own buffer, its
/// small allocations packed in one granule, and the input are
/// host-located and staged): the second run's outputs, and whether the
/// program was staged.
fn run_staged(b: &Arc<HostBackend>, p: Plan, input: &[f32], mode: Mode) -> (Vec<Vec<f32>>, bool) {
    b.budget().set_limits(xla_vmm_device::MemoryLimits {
        device: Some(2 << 20),
        host: None,
        staging_reserve: Some(50),
    });
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), p, None, &stream).unwrap();
    let bytes_in = (input.len() * 4) as u64;
    let buf = DeviceBuffer::alloc(b, bytes_in).unwrap();
    b.write_sync(buf.ptr(), &bytes(input), &stream).unwrap();
    exe.bind_parameter(0, buf.ptr(), bytes_in).unwrap();
    let mut outs = Vec::new();
    for _ in 0..2 {
        outs = exe.run(&stream, mode).unwrap();
    }
    b.stream_synchronize(&stream).unwrap();
    let got = outs
        .iter()
        .map(|o| {
            let mut d = vec![0u8; o.bytes as usize];
            b.read_sync(&mut d, o.ptr, &stream).unwrap();
            d.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
        .collect();
    let staged = exe
        .program()
        .staging_summary()
        .is_some_and(|s| s.staged > 0);
    drop(exe);
    buf.free().unwrap();
    b.stream_destroy(stream).unwrap();
    (got, staged)
}

#[test]
fn loops_whose_own_buffers_are_in_host_memory_are_staged_with_the_same_results() {
    for mode in [Mode::Eager, Mode::GraphRecapture, Mode::Graph] {
        // A loop with a trip count and windows that move with it: one unit.
        let (out, staged) = run_staged(&backend(), loop_plan(Some(3)), &[10.0, 20.0], mode);
        assert!(staged, "{mode:?}");
        assert_eq!(out[0], vec![13.0, 23.0], "{mode:?}");
        assert_eq!(out[1], vec![7.0, 7.0, 7.0, 0.0], "{mode:?}");
        // A loop whose condition is read on the host (eager) or is a WHILE
        // node (graphs), its predicate in the staging area.
        let b = backend();
        register_less_than_5(&b);
        for window in [false, true] {
            let (out, staged) = run_staged(&b, counting_loop_plan(window), &[1.5, 10.0], mode);
            assert!(staged, "{mode:?}");
            assert_eq!(out[0], vec![5.5, 14.0], "{mode:?} window {window}");
        }
    }
}

#[test]
fn async_start_done_runs_on_a_second_stream_and_joins() {
    let b = backend();
    let allocs = vec![
        alloc(0, 16, param(0, false)),
        alloc(1, 16, AllocationRole::Output { outputs: vec![] }),
        alloc(2, 16, AllocationRole::Temp),
    ];
    let thunks = vec![
        thunk(
            "start",
            ThunkKind::AsyncStart(AsyncStartThunk {
                async_execution_id: 7,
                stream: ExecutionStream::Computation(0),
                thunks: vec![kernel(
                    "scale",
                    "scale2",
                    vec![karg(sl(0, 0, 16), false), karg(sl(2, 0, 16), true)],
                    Some(vec![
                        KernelParam::ArgAddress { arg_index: 0 },
                        KernelParam::ArgAddress { arg_index: 1 },
                        KernelParam::Bytes {
                            data: Blob(4u32.to_le_bytes().to_vec()),
                        },
                    ]),
                    1,
                )],
            }),
        ),
        thunk(
            "done",
            ThunkKind::AsyncDone {
                async_execution_id: 7,
            },
        ),
        copy("out", sl(2, 0, 16), sl(1, 0, 16)),
    ];
    let p = plan(allocs, vec![f32s(4)], vec![(1, f32s(4))], thunks);
    for mode in [Mode::Eager, Mode::GraphRecapture] {
        let out = run(&b, p.clone(), &[vec![1.0, 2.0, 3.0, 4.0]], mode).unwrap();
        assert_eq!(out[0], vec![2.0, 4.0, 6.0, 8.0], "{mode:?}");
    }
}

#[test]
fn donated_parameter_is_updated_in_place_and_returned() {
    let b = backend();
    let allocs = vec![alloc(0, 8, param(0, true))];
    let thunks = vec![kernel("inc", "inc", vec![karg(sl(0, 0, 8), true)], None, 2)];
    let p = plan(allocs, vec![f32s(2)], vec![(0, f32s(2))], thunks);
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), p, None, &stream).unwrap();
    let buf = DeviceBuffer::alloc(&b, 8).unwrap();
    b.write_sync(buf.ptr(), &bytes(&[1.0, 5.0]), &stream)
        .unwrap();
    exe.bind_parameter(0, buf.ptr(), 8).unwrap();
    for _ in 0..2 {
        let outs = exe.run(&stream, Mode::Eager).unwrap();
        assert_eq!(outs[0].ptr, buf.ptr());
        assert_eq!(outs[0].parameter, Some(0));
    }
    let mut d = vec![0u8; 8];
    b.read_sync(&mut d, buf.ptr(), &stream).unwrap();
    assert_eq!(d, bytes(&[3.0, 7.0]));
    drop(exe);
    buf.free().unwrap();
}

#[test]
fn unbound_or_short_parameters_are_rejected() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), copy_memset_kernel_plan(), None, &stream).unwrap();
    assert!(matches!(
        exe.run(&stream, Mode::Eager),
        Err(RuntimeError::InvalidArgument(_))
    ));
    assert!(exe.bind_parameter(0, DevicePtr(0x1000), 8).is_err());
    assert!(exe.bind_parameter(3, DevicePtr(0x1000), 16).is_err());
}

#[test]
fn unsupported_thunks_are_rejected_at_load_naming_kind_and_annotation() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let mut p = copy_memset_kernel_plan();
    p.thunks.push(thunk(
        "all-reduce.3",
        ThunkKind::Unsupported {
            kind_name: "all_reduce".into(),
            field_number: 39,
        },
    ));
    let e = Executable::load(b.clone(), p, None, &stream)
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        e.contains("all_reduce") && e.contains("all-reduce.3"),
        "{e}"
    );

    let mut p = copy_memset_kernel_plan();
    p.thunks.push(thunk(
        "custom-call.1",
        ThunkKind::CustomCall(CustomCallThunk {
            target_name: "my_target".into(),
            operands: vec![],
            results: vec![],
            opaque: Blob::default(),
            api_version: 4,
            attributes: vec![],
            called_computation: None,
            use_pdl: false,
        }),
    ));
    let e = Executable::load(b.clone(), p, None, &stream)
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        e.contains("custom_call") && e.contains("custom-call.1") && e.contains("my_target"),
        "{e}"
    );
}

/// while (acc[0] < 5) { acc += 1 }: the condition is a host kernel writing
/// the predicate; no trip count.
/// The counting loop's condition kernel: pred = x[0] < 5.
fn register_less_than_5(b: &HostBackend) {
    b.register_kernel(
        "less_than_5",
        Arc::new(|ctx, args, _cfg| {
            let (x, pred) = (arg_ptr(args, 0)?, arg_ptr(args, 1)?);
            let v = ctx.read_f32(x, 1)?[0];
            ctx.write(pred, &[u8::from(v < 5.0)])
        }),
    );
}

fn counting_loop_plan(with_window: bool) -> Plan {
    let allocs = vec![
        alloc(0, 8, param(0, false)),
        alloc(1, 8, AllocationRole::Output { outputs: vec![] }),
        alloc(2, 4, AllocationRole::Temp),
        alloc(3, 16, AllocationRole::Temp),
    ];
    let mut body = vec![kernel("inc", "inc", vec![karg(sl(1, 0, 8), true)], None, 2)];
    if with_window {
        let mut dsf = match &loop_plan(Some(1)).thunks[2].kind {
            ThunkKind::While(w) => w.body[1].clone(),
            _ => unreachable!(),
        };
        if let ThunkKind::DynamicSliceFusion(d) = &mut dsf.kind {
            d.result_buffers = vec![sl(3, 0, 16)];
        }
        body.push(dsf);
    }
    let w = WhileThunk {
        condition_result: sl(2, 0, 1),
        condition: vec![kernel(
            "cond",
            "less_than_5",
            vec![karg(sl(1, 0, 4), false), karg(sl(2, 0, 1), true)],
            None,
            1,
        )],
        body,
        trip_count: None,
    };
    let thunks = vec![
        copy("init", sl(0, 0, 8), sl(1, 0, 8)),
        thunk("while", ThunkKind::While(w)),
    ];
    plan(allocs, vec![f32s(2)], vec![(1, f32s(2))], thunks)
}

#[test]
fn while_without_trip_count_reads_the_condition_eagerly_and_is_a_while_node_in_graphs() {
    let b = backend();
    register_less_than_5(&b);
    for mode in [Mode::Eager, Mode::GraphRecapture] {
        let out = run(&b, counting_loop_plan(false), &[vec![1.5, 10.0]], mode).unwrap();
        // 1.5 -> 2.5 -> 3.5 -> 4.5 -> 5.5: four iterations.
        assert_eq!(out[0], vec![5.5, 14.0], "{mode:?}");
    }
    // A window that moves with the iteration cannot be captured: graph
    // modes run that executable eager, with the same result.
    for mode in [Mode::Eager, Mode::GraphRecapture, Mode::Graph] {
        let out = run(&b, counting_loop_plan(true), &[vec![1.5, 10.0]], mode).unwrap();
        assert_eq!(out[0], vec![5.5, 14.0], "{mode:?}");
    }
}

/// conditional(index) { branch 0: memset 1.0; branch 1: memset 2.0 }, index
/// from a parameter (S32; out of range selects the last branch), or with a
/// PRED index (true selects branch 0).
fn conditional_plan(pred: bool) -> Plan {
    let allocs = vec![
        alloc(0, 4, param(0, false)),
        alloc(1, 8, AllocationRole::Output { outputs: vec![] }),
    ];
    let branch = |v: f32| {
        vec![thunk(
            "set",
            ThunkKind::Memset32 {
                dest: sl(1, 0, 8),
                value: v.to_bits(),
            },
        )]
    };
    let c = ConditionalThunk {
        branch_index: ShapedSlice {
            slice: sl(0, 0, if pred { 1 } else { 4 }),
            shape: Some(Shape {
                element_type: if pred {
                    ElementType::PRED
                } else {
                    ElementType::S32
                },
                ..Default::default()
            }),
        },
        branches: vec![branch(1.0), branch(2.0)],
    };
    plan(
        allocs,
        vec![f32s(1)],
        vec![(1, f32s(2))],
        vec![thunk("cond", ThunkKind::Conditional(c))],
    )
}

#[test]
fn conditional_runs_the_indexed_branch_eager() {
    let b = backend();
    let p = conditional_plan(false);
    for (index, want) in [(0i32, 1.0f32), (1, 2.0), (7, 2.0), (-1, 2.0)] {
        let idx = f32::from_bits(index as u32);
        let out = run(&b, p.clone(), &[vec![idx]], Mode::Eager).unwrap();
        assert_eq!(out[0], vec![want, want], "index {index}");
    }
}

/// In graph modes a conditional is captured (a node per branch) and the
/// branch is picked on the device at every replay: one executable, the index
/// rewritten between steps, every step right, no host read of the index.
#[test]
fn graph_modes_pick_a_conditionals_branch_on_the_device_at_every_step() {
    let b = backend();
    for pred in [false, true] {
        for mode in [Mode::Graph, Mode::GraphRecapture, Mode::Eager] {
            let stream = b.stream_create().unwrap();
            let mut exe =
                Executable::load(b.clone(), conditional_plan(pred), None, &stream).unwrap();
            assert_eq!(exe.program().capture_blocker(), None);
            let idx = DeviceBuffer::alloc(&b, 4).unwrap();
            exe.bind_parameter(0, idx.ptr(), 4).unwrap();
            let steps: &[(i32, f32)] = if pred {
                &[(1, 1.0), (0, 2.0), (1, 1.0), (0, 2.0)]
            } else {
                &[(0, 1.0), (1, 2.0), (7, 2.0), (-1, 2.0), (0, 1.0)]
            };
            let reads = b.call_count("read_sync");
            for &(index, want) in steps {
                b.write_sync(idx.ptr(), &index.to_le_bytes(), &stream)
                    .unwrap();
                let outs = exe.run(&stream, mode).unwrap();
                b.stream_synchronize(&stream).unwrap();
                let mut d = [0u8; 8];
                b.read_sync(&mut d, outs[0].ptr, &stream).unwrap();
                let got = f32::from_le_bytes(d[..4].try_into().unwrap());
                assert_eq!(got, want, "{mode:?} pred {pred} index {index}");
            }
            let host_reads = b.call_count("read_sync") - reads - steps.len() as u64;
            let eager = mode == Mode::Eager;
            assert_eq!(
                host_reads,
                if eager { steps.len() as u64 } else { 0 },
                "{mode:?}: host reads of the index"
            );
            drop(exe);
            idx.free().unwrap();
            b.stream_destroy(stream).unwrap();
        }
    }
}

// ---- constant allocations without a content or a global (XLA inlined the
// literal into its kernels): zeros when no thunk reads them, an error naming
// the allocation when one does.

fn with_constant_and(thunks: Vec<Thunk>) -> Plan {
    let allocations = vec![
        alloc(
            0,
            4,
            AllocationRole::Constant {
                bytes: Default::default(),
                symbol_name: String::new(),
            },
        ),
        alloc(1, 4, AllocationRole::Output { outputs: vec![] }),
    ];
    plan(allocations, vec![], vec![(1, f32s(1))], thunks)
}

#[test]
fn an_unread_constant_without_content_is_zeros() {
    let p = with_constant_and(vec![thunk(
        "fill",
        ThunkKind::Memset32 {
            dest: sl(1, 0, 4),
            value: 7,
        },
    )]);
    assert_eq!(
        xla_vmm_runtime::ops::constant_bytes(&p, 0).unwrap(),
        vec![0; 4]
    );
}

#[test]
fn a_read_constant_without_content_is_refused() {
    let p = with_constant_and(vec![copy("copy", sl(0, 0, 4), sl(1, 0, 4))]);
    let err = xla_vmm_runtime::ops::constant_bytes(&p, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("constant allocation 0"), "{err}");
}

/// Both graph modes capture under the capture gate: while foreign work (a
/// vendor call) holds its shared side, a run that has to capture waits, and
/// it goes on as soon as the foreign work is done (capture_gate.rs).
#[test]
fn graph_captures_wait_for_foreign_work_in_flight() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    use xla_vmm_device::capture_gate;
    for mode in [Mode::GraphRecapture, Mode::Graph] {
        let b = backend();
        let released = Arc::new(AtomicBool::new(false));
        let held = capture_gate::foreign();
        let (r, bb) = (released.clone(), b.clone());
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            let out = run(
                &bb,
                copy_memset_kernel_plan(),
                &[vec![1.0, 2.0, 3.0, -4.0]],
                mode,
            );
            (out, r.load(Ordering::SeqCst), t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        released.store(true, Ordering::SeqCst);
        drop(held);
        let (out, after_release, took) = t.join().unwrap();
        let out = out.unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(out[0], vec![2.0, 4.0, 6.0, -8.0], "{mode:?}");
        assert!(
            after_release,
            "{mode:?}: the run ended while foreign work held the gate"
        );
        assert!(took >= Duration::from_millis(80), "{mode:?}: {took:?}");
    }
}

/// Host offload as XLA compiles it: the parameter goes to XLA's host memory
/// space (a device-to-host copy into a host-space temp), comes back (a
/// host-to-device copy) and is scaled; the host-space temp is placed in
/// device memory by this runtime.
#[test]
fn host_space_copies_run_as_copies_in_every_mode() {
    let mut host_temp = alloc(2, 16, AllocationRole::Temp);
    host_temp.color = HOST_MEMORY_SPACE;
    let allocs = vec![
        alloc(0, 16, param(0, false)),
        alloc(1, 16, AllocationRole::Output { outputs: vec![] }),
        host_temp,
        alloc(3, 16, AllocationRole::Temp),
    ];
    let thunks = vec![
        thunk(
            "copy-start",
            ThunkKind::DeviceToHostCopy(copy_of(sl(0, 0, 16), sl(2, 0, 16))),
        ),
        thunk(
            "copy-start.1",
            ThunkKind::HostToDeviceCopy(copy_of(sl(2, 0, 16), sl(3, 0, 16))),
        ),
        scale2_4("fusion", sl(3, 0, 16), sl(1, 0, 16)),
    ];
    let p = plan(allocs, vec![f32s(4)], vec![(1, f32s(4))], thunks);
    xla_vmm_runtime::ops::check_support(&p).expect("host-space copies are supported");
    let b = backend();
    for mode in [Mode::Eager, Mode::Graph, Mode::GraphRecapture] {
        let out = run(&b, p.clone(), &[vec![1.0, -2.0, 3.5, 0.25]], mode).unwrap();
        assert_eq!(out[0], vec![2.0, -4.0, 7.0, 0.5], "{mode:?}");
    }
}

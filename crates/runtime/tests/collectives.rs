//! Collectives over 2 host devices (the host backend's in-process
//! communicator emulation), one thread per device as a real multi-GPU
//! caller does: all-reduce (also on a communication stream), all-gather,
//! reduce-scatter, collective permute (swap and one-way: a device without a
//! source gets zeros), all-to-all, partition / replica id, a single-device
//! group (a local copy); eager, graph and VA-stable modes; bytes checked
//! against values computed here. Also: a plan with trivial collectives runs
//! without `set_collectives`, unsupported reduction types fail at load time,
//! and a device outside the assignment is refused.

#[allow(dead_code)] // shared helpers; this file uses a few
mod common;

use std::sync::Arc;

use common::*;
use xla_vmm::*;
use xla_vmm_device::{Backend, HostBackend};
use xla_vmm_runtime::{
    ops::check_support, Cliques, CollectiveEnv, DeviceAssignment, DeviceBuffer, Executable,
    LocalExchange, Mode, RuntimeError,
};

const N: usize = 8;
/// f32 slots of the output buffer.
const OUT: usize = 72;

fn shaped(slice: Slice) -> ShapedSlice {
    ShapedSlice { slice, shape: None }
}

fn coll(
    op: CollectiveOp,
    mode: GroupMode,
    groups: Vec<Vec<i64>>,
    reduction: Option<ReductionKind>,
    src: Slice,
    dst: Slice,
    count: u64,
) -> CollectiveThunk {
    CollectiveThunk {
        op,
        replica_groups: groups,
        group_mode: mode,
        operand_element_types: vec![ElementType::F32],
        use_symmetric_buffer: false,
        reduction,
        buffers: vec![CollectiveBuffer {
            element_count: count,
            element_type: Some(ElementType::F32),
            source: shaped(src),
            destination: shaped(dst),
            source_memory_space: 0,
            destination_memory_space: 0,
        }],
        source_target_pairs: vec![],
        has_split_dimension: false,
        has_dynamic_root: false,
        collectives_mode: 0,
        from_collective_kernel: false,
    }
}

fn c(name: &str, t: CollectiveThunk) -> Thunk {
    thunk(name, ThunkKind::Collective(Box::new(t)))
}

/// Output slot range in f32 units.
fn o(start: usize, len: usize) -> Slice {
    sl(1, (start * 4) as u64, (len * 4) as u64)
}

fn multi_plan() -> Plan {
    let input = sl(0, 0, (N * 4) as u64);
    let sum = Some(ReductionKind::Sum);
    let flat = || vec![vec![0, 1]];
    use CollectiveOp::*;
    use GroupMode::*;
    let mut permute = coll(
        CollectivePermute,
        CrossPartition,
        vec![],
        None,
        input,
        o(28, N),
        8,
    );
    permute.source_target_pairs = vec![(0, 1), (1, 0)];
    let mut one_way = coll(
        CollectivePermute,
        CrossPartition,
        vec![],
        None,
        input,
        o(48, N),
        8,
    );
    one_way.source_target_pairs = vec![(0, 1)];
    let mut a2a = coll(AllToAll, CrossPartition, vec![], None, input, o(36, N), 8);
    a2a.has_split_dimension = true;
    // The product all-reduce is kernel-decoded: it runs like any all-reduce.
    let mut prod = coll(
        AllReduce,
        FlattenedId,
        flat(),
        Some(ReductionKind::Product),
        input,
        o(64, N),
        8,
    );
    prod.from_collective_kernel = true;
    let thunks = vec![
        thunk(
            "memset",
            ThunkKind::Memset32 {
                dest: o(0, OUT),
                value: 0x4141_4141,
            },
        ),
        thunk(
            "all-reduce-start",
            ThunkKind::AsyncStart(AsyncStartThunk {
                async_execution_id: 7,
                stream: ExecutionStream::Communication(0),
                thunks: vec![c(
                    "all-reduce.1",
                    coll(AllReduce, FlattenedId, flat(), sum, input, o(0, N), 8),
                )],
            }),
        ),
        c(
            "all-gather.1",
            coll(AllGather, FlattenedId, flat(), None, input, o(8, 2 * N), 8),
        ),
        thunk(
            "all-reduce-done",
            ThunkKind::AsyncDone {
                async_execution_id: 7,
            },
        ),
        c(
            "reduce-scatter.1",
            coll(
                ReduceScatter,
                CrossPartition,
                vec![],
                sum,
                input,
                o(24, N / 2),
                8,
            ),
        ),
        c("permute.1", permute),
        c("all-to-all.1", a2a),
        thunk("partition-id", ThunkKind::PartitionId { dest: o(44, 1) }),
        thunk("replica-id", ThunkKind::ReplicaId { dest: o(45, 1) }),
        c("permute.2", one_way),
        // One replica: a cross-replica group of one, a local copy.
        c(
            "all-reduce.2",
            coll(AllReduce, CrossReplica, vec![], sum, input, o(56, N), 8),
        ),
        c("all-reduce.3", prod),
    ];
    plan(
        vec![
            alloc(0, (N * 4) as u64, param(0, false)),
            alloc(
                1,
                (OUT * 4) as u64,
                AllocationRole::Output { outputs: vec![] },
            ),
        ],
        vec![f32s(N)],
        vec![(1, f32s(OUT))],
        thunks,
    )
}

fn input(d: usize) -> Vec<f32> {
    (0..N).map(|i| ((d + 1) * 10 + i) as f32).collect()
}

fn expected(d: usize) -> Vec<u32> {
    let x = [input(0), input(1)];
    let fill = f32::from_bits(0x4141_4141);
    let mut out = vec![fill; OUT];
    for i in 0..N {
        out[i] = x[0][i] + x[1][i];
        out[8 + i] = x[0][i];
        out[16 + i] = x[1][i];
        out[28 + i] = x[1 - d][i];
        out[48 + i] = if d == 1 { x[0][i] } else { 0.0 };
        out[56 + i] = x[d][i];
        out[64 + i] = x[0][i] * x[1][i];
    }
    for i in 0..N / 2 {
        out[24 + i] = x[0][4 * d + i] + x[1][4 * d + i];
        // All-to-all: chunk j of my output = chunk d of rank j's input.
        out[36 + i] = x[0][4 * d + i];
        out[40 + i] = x[1][4 * d + i];
    }
    let mut bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
    bits[44] = d as u32; // partition id
    bits[45] = 0; // replica id
    bits
}

/// Run `p` on `n` host devices, each in its own thread, `steps` times in
/// `mode`; the output bits per device.
fn run_devices(
    p: &Plan,
    n: usize,
    mode: Mode,
    steps: usize,
    exchange: Arc<LocalExchange>,
) -> Vec<Result<Vec<u32>, String>> {
    let cliques = Cliques::<HostBackend>::new(exchange);
    let assignment = DeviceAssignment {
        replicas: 1,
        partitions: n,
        ids: (0..n as i64).collect(),
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|d| {
                let (p, cliques, assignment) = (p.clone(), cliques.clone(), assignment.clone());
                s.spawn(move || -> Result<Vec<u32>, String> {
                    let b = backend();
                    let run = || -> Result<Vec<u32>, RuntimeError> {
                        let stream = b.stream_create()?;
                        let mut exe = Executable::load(b.clone(), p, None, &stream)?;
                        exe.set_collectives(CollectiveEnv {
                            assignment,
                            device_id: d as i64,
                            cliques,
                        })?;
                        let buf = DeviceBuffer::alloc(&b, (N * 4) as u64)?;
                        b.write_sync(buf.ptr(), &bytes(&input(d)), &stream)?;
                        exe.bind_parameter(0, buf.ptr(), (N * 4) as u64)?;
                        let mut out = vec![0u8; OUT * 4];
                        for _ in 0..steps {
                            let outs = exe.run(&stream, mode)?;
                            b.stream_synchronize(&stream)?;
                            b.read_sync(&mut out, outs[0].ptr, &stream)?;
                        }
                        drop(exe);
                        buf.free()?;
                        Ok(out
                            .chunks(4)
                            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect())
                    };
                    run().map_err(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    })
}

fn check_two_devices(mode: Mode, steps: usize) {
    use xla_vmm_runtime::IdExchange;
    let p = multi_plan();
    check_support(&p).unwrap();
    let exchange = LocalExchange::new();
    let got = run_devices(&p, 2, mode, steps, exchange.clone());
    for (d, r) in got.into_iter().enumerate() {
        let bits = r.unwrap_or_else(|e| panic!("{mode:?} device {d}: {e}"));
        let want = expected(d);
        for (i, (g, w)) in bits.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                w,
                "{mode:?} device {d} slot {i}: {} vs {}",
                f32::from_bits(*g),
                f32::from_bits(*w)
            );
        }
    }
    // The all-reduce on communication stream 0 has its own clique.
    let t = std::time::Duration::from_millis(1);
    assert!(exchange.get("xla_vmm/clique/0,1", t).is_ok());
    assert!(exchange.get("xla_vmm/clique/0,1/stream1", t).is_ok());
}

#[test]
fn two_devices_eager() {
    check_two_devices(Mode::Eager, 2);
}

#[test]
fn two_devices_graph_replayed() {
    check_two_devices(Mode::GraphRecapture, 3);
}

#[test]
fn two_devices_va_stable() {
    check_two_devices(Mode::Graph, 2);
}

/// Without `set_collectives` the executable is the only device: every
/// group has one member and the collectives are local copies.
#[test]
fn one_device_without_an_environment() {
    let input = sl(0, 0, 16);
    let p = plan(
        vec![
            alloc(0, 16, param(0, false)),
            alloc(1, 36, AllocationRole::Output { outputs: vec![] }),
        ],
        vec![f32s(4)],
        vec![(1, f32s(9))],
        vec![
            c(
                "ar",
                coll(
                    CollectiveOp::AllReduce,
                    GroupMode::CrossReplica,
                    vec![],
                    Some(ReductionKind::Sum),
                    input,
                    sl(1, 0, 16),
                    4,
                ),
            ),
            c(
                "ag",
                coll(
                    CollectiveOp::AllGather,
                    GroupMode::FlattenedId,
                    vec![vec![0]],
                    None,
                    input,
                    sl(1, 16, 16),
                    4,
                ),
            ),
            thunk("pid", ThunkKind::PartitionId { dest: sl(1, 32, 4) }),
        ],
    );
    let b = backend();
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), p, None, &stream).unwrap();
    let buf = DeviceBuffer::alloc(&b, 16).unwrap();
    b.write_sync(buf.ptr(), &bytes(&[1.0, 2.0, 3.0, 4.0]), &stream)
        .unwrap();
    exe.bind_parameter(0, buf.ptr(), 16).unwrap();
    for mode in [Mode::Eager, Mode::GraphRecapture] {
        let outs = exe.run(&stream, mode).unwrap();
        b.stream_synchronize(&stream).unwrap();
        let mut out = vec![0u8; 36];
        b.read_sync(&mut out, outs[0].ptr, &stream).unwrap();
        let mut want = bytes(&[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
        want.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(out, want, "{mode:?}");
    }
    drop(exe);
    buf.free().unwrap();
}

#[test]
fn unsupported_reduction_types_fail_at_load() {
    let input = sl(0, 0, 16);
    let mut t = coll(
        CollectiveOp::AllReduce,
        GroupMode::CrossReplica,
        vec![],
        Some(ReductionKind::Max),
        input,
        sl(1, 0, 16),
        2,
    );
    // C64 max has no meaning; S16 has no library type.
    for (ty, what) in [(ElementType(15), "C64"), (ElementType(3), "S16")] {
        t.buffers[0].element_type = Some(ty);
        t.operand_element_types = vec![ty];
        let p = plan(
            vec![
                alloc(0, 16, param(0, false)),
                alloc(1, 16, AllocationRole::Output { outputs: vec![] }),
            ],
            vec![f32s(4)],
            vec![(1, f32s(4))],
            vec![c("bad-all-reduce", t.clone())],
        );
        let e = check_support(&p).unwrap_err();
        assert!(matches!(e, RuntimeError::Unsupported(_)), "{e}");
        assert!(
            e.to_string().contains(what) && e.to_string().contains("bad-all-reduce"),
            "{e}"
        );
        let b = backend();
        let stream = b.stream_create().unwrap();
        let e = Executable::load(b.clone(), p, None, &stream)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(what) && e.contains("bad-all-reduce"), "{e}");
    }
}

#[test]
fn a_device_outside_the_assignment_is_refused() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), multi_plan(), None, &stream).unwrap();
    let e = exe
        .set_collectives(CollectiveEnv {
            assignment: DeviceAssignment {
                replicas: 1,
                partitions: 2,
                ids: vec![4, 5],
            },
            device_id: 0,
            cliques: Cliques::new(LocalExchange::new()),
        })
        .unwrap_err();
    assert!(e.to_string().contains("device 0"), "{e}");
}

/// The same clique is made once per (participants, rank) and shared.
#[test]
fn cliques_are_made_once_per_participants_and_rank() {
    let cliques = Cliques::<HostBackend>::new(LocalExchange::new());
    let made: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let cliques = cliques.clone();
                s.spawn(move || {
                    let b: Arc<HostBackend> = backend();
                    let a = cliques.communicator(&*b, &[3, 9], r).unwrap();
                    let again = cliques.communicator(&*b, &[3, 9], r).unwrap();
                    assert!(Arc::ptr_eq(&a, &again));
                    (a.rank(), a.size())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(made, vec![(0, 2), (1, 2)]);
}

/// Every multi-device fixture (jax 0.11.2 on 2 x H200) passes the
/// load-time support check: collectives, collective kernels, partition ids
/// and async starts on communication / computation streams.
#[test]
fn multi_device_fixtures_pass_the_support_check() {
    let dir = xla_vmm::testdata::multi_fixtures_dir().expect("integration/multi/fixtures");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "pjrt") {
            let plan = decode(&std::fs::read(&path).unwrap()).unwrap();
            check_support(&plan).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert_eq!(n, 9);
}

//! Collectives of the host backend (in-process NCCL emulation): every rank
//! is its own `HostBackend`, run on its own thread.

use std::sync::Arc;
use std::time::Duration;

use xla_vmm_device::{
    Backend, CliqueId, CommType, Communicator, DeviceError, DevicePtr, HostBackend, HostConfig,
    ReduceOp,
};

const G: u64 = 64 << 10;

struct Rank {
    b: HostBackend,
    stream: <HostBackend as Backend>::Stream,
    phys: Option<<HostBackend as Backend>::PhysMem>,
    va: Option<<HostBackend as Backend>::VaRange>,
    base: DevicePtr,
}

impl Rank {
    fn new() -> Rank {
        let b = HostBackend::new(HostConfig {
            granularity: G,
            ..Default::default()
        })
        .unwrap();
        let stream = b.stream_create().unwrap();
        let phys = b.mem_create(G).unwrap();
        let va = b.va_reserve(G, 0).unwrap();
        b.map(&va, 0, &phys, 0, G).unwrap();
        b.set_access(&va, 0, G).unwrap();
        let base = b.va_base(&va);
        Rank {
            b,
            stream,
            phys: Some(phys),
            va: Some(va),
            base,
        }
    }

    fn at(&self, off: u64) -> DevicePtr {
        DevicePtr(self.base.0 + off)
    }

    fn write(&self, off: u64, data: &[u8]) {
        self.b.write_sync(self.at(off), data, &self.stream).unwrap();
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.b
            .read_sync(&mut out, self.at(off), &self.stream)
            .unwrap();
        out
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        if let (Some(p), Some(v)) = (self.phys.take(), self.va.take()) {
            let _ = self.b.unmap(&v, 0, G);
            let _ = self.b.va_free(v);
            let _ = self.b.mem_release(p);
        }
    }
}

type Comm = Box<dyn Communicator<xla_vmm_device::host::HostStream>>;

/// Run `f(rank, comm)` for `n` ranks, one thread each; results in rank order.
fn with_ranks<R: Send + 'static>(
    n: usize,
    f: impl Fn(&Rank, &Comm) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let ranks: Vec<Rank> = (0..n).map(|_| Rank::new()).collect();
    let id = ranks[0].b.clique_id().unwrap();
    let handles: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(r, rank)| {
            let f = f.clone();
            let id = id.clone();
            std::thread::spawn(move || {
                let comm = rank.b.comm_init_rank(&id, n, r).unwrap();
                assert_eq!((comm.rank(), comm.size()), (r, n));
                let out = f(&rank, &comm);
                drop(comm);
                assert_eq!(rank.b.outstanding().modules, 0, "communicator unloaded");
                out
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn input(rank: usize, i: usize) -> f32 {
    (i * 3 + rank * 7) as f32 - 20.0
}

#[test]
fn all_reduce_f32_sum_two_and_three_ranks() {
    for n in [2, 3] {
        let outs = with_ranks(n, |r, c| {
            let x: Vec<f32> = (0..100).map(|i| input(c.rank(), i)).collect();
            r.write(0, &f32s(&x));
            c.all_reduce(
                r.at(0),
                r.at(4096),
                100,
                CommType::F32,
                ReduceOp::Sum,
                &r.stream,
            )
            .unwrap();
            to_f32s(&r.read(4096, 400))
        });
        let want: Vec<f32> = (0..100)
            .map(|i| (0..n).map(|r| input(r, i)).sum())
            .collect();
        for o in outs {
            assert_eq!(o, want);
        }
    }
}

/// bf16 -> f32 is a shift; f32 -> bf16 with round-to-nearest-even.
fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

#[test]
fn all_reduce_bf16_sum_rounds_once() {
    // Pairs chosen to hit ties (1 + 2^-8), carries and cancellation.
    let a: Vec<u16> = vec![0x3f80, 0x3f81, 0x4049, 0xc000, 0x3f80, 0x7f00, 0x0001];
    let b: Vec<u16> = vec![0x3b80, 0x3b80, 0x3e4d, 0x4000, 0x3c40, 0x7f00, 0x8000];
    let (a2, b2) = (a.clone(), b.clone());
    let outs = with_ranks(2, move |r, c| {
        let mine = if c.rank() == 0 { &a2 } else { &b2 };
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        r.write(0, &bytes);
        c.all_reduce(
            r.at(0),
            r.at(512),
            mine.len(),
            CommType::Bf16,
            ReduceOp::Sum,
            &r.stream,
        )
        .unwrap();
        r.read(512, mine.len() * 2)
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect::<Vec<u16>>()
    });
    // f32 carries 24 bits >= 2*8+2, so f32 addition then one RNE rounding
    // equals the correctly rounded bf16 sum.
    let want: Vec<u16> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| f32_to_bf16(bf16_to_f32(x) + bf16_to_f32(y)))
        .collect();
    assert_eq!(want[0], 0x3f80, "1 + 2^-8 ties to even");
    for o in outs {
        assert_eq!(o, want);
    }
}

#[test]
fn all_reduce_i32_max() {
    let outs = with_ranks(3, |r, c| {
        let x: Vec<i32> = (0..10)
            .map(|i| (i * (c.rank() as i32 + 1)) % 7 - 3)
            .collect();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        r.write(0, &bytes);
        c.all_reduce(
            r.at(0),
            r.at(0),
            10,
            CommType::I32,
            ReduceOp::Max,
            &r.stream,
        )
        .unwrap();
        r.read(0, 40)
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<i32>>()
    });
    let want: Vec<i32> = (0..10)
        .map(|i| (1..=3).map(|k| (i * k) % 7 - 3).max().unwrap())
        .collect();
    for o in outs {
        assert_eq!(o, want);
    }
}

#[test]
fn all_gather_reduce_scatter_broadcast() {
    let n = 3;
    let outs = with_ranks(n, move |r, c| {
        let me = c.rank();
        let x: Vec<f32> = (0..4 * n).map(|i| input(me, i)).collect();
        r.write(0, &f32s(&x));
        c.all_gather(r.at(0), r.at(1024), 4, CommType::F32, &r.stream)
            .unwrap();
        c.reduce_scatter(
            r.at(0),
            r.at(2048),
            4,
            CommType::F32,
            ReduceOp::Sum,
            &r.stream,
        )
        .unwrap();
        c.broadcast(r.at(0), r.at(3072), 4 * n, CommType::F32, 1, &r.stream)
            .unwrap();
        (
            to_f32s(&r.read(1024, 16 * n)),
            to_f32s(&r.read(2048, 16)),
            to_f32s(&r.read(3072, 16 * n)),
        )
    });
    let gathered: Vec<f32> = (0..n)
        .flat_map(|r| (0..4).map(move |i| input(r, i)))
        .collect();
    for (rank, (g, rs, bc)) in outs.into_iter().enumerate() {
        assert_eq!(g, gathered);
        let want_rs: Vec<f32> = (0..4)
            .map(|i| (0..n).map(|r| input(r, rank * 4 + i)).sum())
            .collect();
        assert_eq!(rs, want_rs);
        let want_bc: Vec<f32> = (0..4 * n).map(|i| input(1, i)).collect();
        assert_eq!(bc, want_bc);
    }
}

#[test]
fn send_recv_ring_in_a_group() {
    let n = 3;
    let outs = with_ranks(n, move |r, c| {
        let me = c.rank();
        r.write(0, &f32s(&[me as f32 + 0.25; 8]));
        c.group_start().unwrap();
        c.send(r.at(0), 8, CommType::F32, (me + 1) % n, &r.stream)
            .unwrap();
        c.recv(r.at(256), 8, CommType::F32, (me + n - 1) % n, &r.stream)
            .unwrap();
        c.group_end().unwrap();
        to_f32s(&r.read(256, 32))
    });
    for (me, o) in outs.into_iter().enumerate() {
        assert_eq!(o, vec![((me + n - 1) % n) as f32 + 0.25; 8]);
    }
}

#[test]
fn captured_all_reduce_replays() {
    let outs = with_ranks(2, |r, c| {
        let b = &r.b;
        b.stream_begin_capture(&r.stream).unwrap();
        c.all_reduce(
            r.at(0),
            r.at(64),
            4,
            CommType::F32,
            ReduceOp::Sum,
            &r.stream,
        )
        .unwrap();
        let g = b.stream_end_capture(&r.stream).unwrap();
        let exec = b.graph_instantiate(&g).unwrap();
        let mut seen = Vec::new();
        for round in 0..2 {
            let x = [(c.rank() + 1) as f32 * (round + 1) as f32; 4];
            r.write(0, &f32s(&x));
            b.graph_launch(&exec, &r.stream).unwrap();
            b.stream_synchronize(&r.stream).unwrap();
            seen.push(to_f32s(&r.read(64, 16)));
        }
        b.graph_exec_destroy(exec).unwrap();
        b.graph_destroy(g).unwrap();
        seen
    });
    for o in outs {
        // ranks hold 1*k and 2*k on replay k: sum 3k.
        assert_eq!(o, vec![vec![3.0; 4], vec![6.0; 4]]);
    }
}

fn is_timeout(e: &DeviceError) -> bool {
    matches!(e, DeviceError::Driver { name, .. } if name == "HOST_COLLECTIVE_ERROR")
}

#[test]
fn join_times_out_when_a_rank_never_comes() {
    let r = Rank::new();
    let id = r.b.clique_id_with_timeout(Duration::from_millis(200));
    let t = std::time::Instant::now();
    let err = r.b.comm_init_rank(&id, 2, 0).err().expect("must time out");
    assert!(is_timeout(&err), "{err}");
    assert!(err.to_string().contains("[1]"), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(200));
    // The id is still joinable after the failure (nobody holds it).
    let err =
        r.b.comm_init_rank(&id, 2, 0)
            .err()
            .expect("times out again");
    assert!(is_timeout(&err));
}

#[test]
fn op_times_out_when_a_peer_skips_it_and_bad_ids_are_refused() {
    let ranks = [Rank::new(), Rank::new()];
    let id = ranks[0]
        .b
        .clique_id_with_timeout(Duration::from_millis(300));
    assert!(matches!(
        ranks[0].b.comm_init_rank(&CliqueId([0; 128]), 2, 0),
        Err(DeviceError::InvalidArgument(_))
    ));
    let [r0, r1] = ranks;
    let id1 = id.clone();
    let h = std::thread::spawn(move || {
        let c = r1.b.comm_init_rank(&id1, 2, 1).unwrap();
        // Rank 1 never issues the all-reduce.
        drop(c);
    });
    let c = r0.b.comm_init_rank(&id, 2, 0).unwrap();
    h.join().unwrap();
    let err = c
        .all_reduce(
            r0.at(0),
            r0.at(64),
            4,
            CommType::F32,
            ReduceOp::Sum,
            &r0.stream,
        )
        .unwrap_err();
    assert!(is_timeout(&err), "{err}");
}

#[test]
fn injected_failure_and_shared_backend_are_errors() {
    let outs = with_ranks(2, |r, c| {
        r.b.inject_failure("all_reduce", 1);
        let e = c.all_reduce(
            r.at(0),
            r.at(64),
            4,
            CommType::F32,
            ReduceOp::Sum,
            &r.stream,
        );
        // Both ranks fail before any rendezvous: nothing hangs; the next
        // collective still pairs up.
        let again = c.all_reduce(
            r.at(0),
            r.at(64),
            4,
            CommType::F32,
            ReduceOp::Sum,
            &r.stream,
        );
        (e.is_err(), again.is_ok(), r.b.call_count("all_reduce"))
    });
    assert_eq!(outs, vec![(true, true, 2), (true, true, 2)]);

    let shared = Arc::new(Rank::new());
    let id = shared.b.clique_id_with_timeout(Duration::from_millis(500));
    let (s2, id2) = (shared.clone(), id.clone());
    let h = std::thread::spawn(move || s2.b.comm_init_rank(&id2, 2, 0).err());
    std::thread::sleep(Duration::from_millis(50));
    let second = shared.b.comm_init_rank(&id, 2, 1).err();
    let first = h.join().unwrap();
    // Whichever came second is refused at once; the first times out.
    let msgs: Vec<String> = [first, second]
        .into_iter()
        .map(|e| e.expect("both fail").to_string())
        .collect();
    assert!(
        msgs.iter().any(|m| m.contains("one host backend")),
        "{msgs:?}"
    );
}

#[test]
fn a_rank_that_faults_fails_the_collective_for_all_at_once() {
    let t = std::time::Instant::now();
    let outs = with_ranks(2, |r, c| {
        let src = if c.rank() == 1 { DevicePtr(8) } else { r.at(0) };
        let e = c
            .all_reduce(src, r.at(64), 4, CommType::F32, ReduceOp::Sum, &r.stream)
            .expect_err("rank 1 reads an unmapped address");
        // The failed round is consumed: the next collective pairs up.
        c.all_reduce(
            r.at(0),
            r.at(64),
            4,
            CommType::F32,
            ReduceOp::Sum,
            &r.stream,
        )
        .unwrap();
        e.to_string()
    });
    assert!(t.elapsed() < Duration::from_secs(30), "no timeout wait");
    assert!(outs[0].contains("failed on rank 1"), "{}", outs[0]);
}

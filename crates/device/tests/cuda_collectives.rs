//! NCCL collectives on real GPUs (`#[ignore]`d: they need CUDA devices and
//! NCCL). With one device the clique has one rank; with two or more, ranks
//! 0 and 1 run on devices 0 and 1, one thread each. Run on a GPU machine:
//! `XLA_VMM_NCCL_LIBRARY=/path/to/libnccl.so.2 <test binary> --ignored --test-threads=1 --nocapture`
//! (the variable is optional when NCCL is on the loader path or in the
//! active virtualenv).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use xla_vmm_device::backend::{Backend, DevicePtr};
use xla_vmm_device::cuda::CudaBackend;
use xla_vmm_device::{CommType, Communicator, ReduceOp};

type Stream = <CudaBackend as Backend>::Stream;

struct Dev {
    b: Arc<CudaBackend>,
    stream: Stream,
    phys: Option<<CudaBackend as Backend>::PhysMem>,
    va: Option<<CudaBackend as Backend>::VaRange>,
    base: DevicePtr,
    size: u64,
}

impl Dev {
    fn new(b: Arc<CudaBackend>) -> Dev {
        let size = b.info().vmm_granularity;
        let stream = b.stream_create().unwrap();
        let phys = b.mem_create(size).unwrap();
        let va = b.va_reserve(size, 0).unwrap();
        b.map(&va, 0, &phys, 0, size).unwrap();
        b.set_access(&va, 0, size).unwrap();
        let base = b.va_base(&va);
        Dev {
            b,
            stream,
            phys: Some(phys),
            va: Some(va),
            base,
            size,
        }
    }

    fn at(&self, off: u64) -> DevicePtr {
        DevicePtr(self.base.0 + off)
    }

    fn write(&self, off: u64, data: &[u8]) {
        self.b.write_sync(self.at(off), data, &self.stream).unwrap();
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        self.b.stream_synchronize(&self.stream).unwrap();
        let mut out = vec![0; len];
        self.b
            .read_sync(&mut out, self.at(off), &self.stream)
            .unwrap();
        out
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.b.stream_synchronize(&self.stream);
        if let (Some(p), Some(v)) = (self.phys.take(), self.va.take()) {
            let _ = self.b.unmap(&v, 0, self.size);
            let _ = self.b.va_free(v);
            let _ = self.b.mem_release(p);
        }
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Round-to-nearest-even f32 -> bf16 (finite inputs).
fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn input(rank: usize, i: usize) -> f32 {
    ((i * 5 + rank * 11) % 97) as f32 - 40.0
}

/// Deterministic finite bf16 values of varied magnitude (xorshift).
fn bf16_input(rank: usize, n: usize) -> Vec<u16> {
    let mut s: u32 = 0x9e37_79b9 ^ (rank as u32 + 1).wrapping_mul(0x85eb_ca6b);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let sign = (s & 1) as u16;
            let exp = 120 + (s >> 8) % 16; // 2^-7 .. 2^8
            let man = (s >> 16) as u16 & 0x7f;
            (sign << 15) | ((exp as u16) << 7) | man
        })
        .collect()
}

fn devices() -> Vec<Arc<CudaBackend>> {
    let first = Arc::new(
        CudaBackend::new(0).expect("a CUDA device (these tests are --ignored without one)"),
    );
    match CudaBackend::new(1) {
        Ok(second) => vec![first, Arc::new(second)],
        Err(e) => {
            eprintln!("one device only ({e}): one-rank clique");
            vec![first]
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and NCCL"]
fn nccl_loads_and_reports_its_version() {
    let (path, version) = xla_vmm_device::cuda::nccl::version().expect("NCCL loads");
    eprintln!("NCCL {version} from {}", path.display());
    assert!(version >= 21800, "NCCL {version} is older than 2.18");
}

const N: usize = 1024;

#[test]
#[ignore = "needs a CUDA GPU and NCCL"]
fn collectives_match_host_results_bit_for_bit() {
    if let Ok((path, version)) = xla_vmm_device::cuda::nccl::version() {
        eprintln!("NCCL {version} from {}", path.display());
    }
    let devs = devices();
    let n = devs.len();
    if n > 1 {
        devs[0].enable_peer_access(1).unwrap();
        devs[1].enable_peer_access(0).unwrap();
        // Enabling twice is not an error.
        devs[0].enable_peer_access(1).unwrap();
    }
    let id = devs[0].clique_id().unwrap();
    let handles: Vec<_> = devs
        .into_iter()
        .enumerate()
        .map(|(rank, b)| {
            let id = id.clone();
            std::thread::spawn(move || {
                let d = Dev::new(b.clone());
                let c = b.comm_init_rank(&id, n, rank).unwrap();
                assert_eq!((c.rank(), c.size()), (rank, n));
                run_rank(&d, &*c, rank, n);
                drop(c);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank thread");
    }
}

fn run_rank(d: &Dev, c: &dyn Communicator<Stream>, rank: usize, n: usize) {
    let s = &d.stream;
    let (a, b2, g, rs, p2p, cap) = (0u64, 65536u64, 131072u64, 262144u64, 327680u64, 393216u64);

    // all-reduce f32 (integer-valued: exact in any order).
    let x: Vec<f32> = (0..N).map(|i| input(rank, i)).collect();
    d.write(a, &f32s(&x));
    c.all_reduce(
        d.at(a),
        d.at(a + 4 * N as u64),
        N,
        CommType::F32,
        ReduceOp::Sum,
        s,
    )
    .unwrap();
    let want: Vec<f32> = (0..N).map(|i| (0..n).map(|r| input(r, i)).sum()).collect();
    assert_eq!(to_f32s(&d.read(a + 4 * N as u64, 4 * N)), want, "f32 sum");

    // all-reduce bf16: one rounding of the exact sum (two ranks).
    let mine = bf16_input(rank, N);
    d.write(
        b2,
        &mine
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    c.all_reduce(
        d.at(b2),
        d.at(b2 + 2 * N as u64),
        N,
        CommType::Bf16,
        ReduceOp::Sum,
        s,
    )
    .unwrap();
    let got = u16s(&d.read(b2 + 2 * N as u64, 2 * N));
    let want: Vec<u16> = if n == 1 {
        mine.clone()
    } else {
        let (p, q) = (bf16_input(0, N), bf16_input(1, N));
        p.iter()
            .zip(&q)
            .map(|(&x, &y)| f32_to_bf16(bf16_to_f32(x) + bf16_to_f32(y)))
            .collect()
    };
    assert_eq!(got, want, "bf16 sum");

    // all-gather and reduce-scatter.
    c.all_gather(d.at(a), d.at(g), N, CommType::F32, s).unwrap();
    let want: Vec<f32> = (0..n)
        .flat_map(|r| (0..N).map(move |i| input(r, i)))
        .collect();
    assert_eq!(to_f32s(&d.read(g, 4 * N * n)), want, "all-gather");
    let per = N / n;
    c.reduce_scatter(d.at(a), d.at(rs), per, CommType::F32, ReduceOp::Sum, s)
        .unwrap();
    let want: Vec<f32> = (0..per)
        .map(|i| (0..n).map(|r| input(r, rank * per + i)).sum())
        .collect();
    assert_eq!(to_f32s(&d.read(rs, 4 * per)), want, "reduce-scatter");

    // send/recv swap inside a group (with one rank: to itself).
    let peer = (rank + 1) % n;
    c.group_start().unwrap();
    c.send(d.at(a), N, CommType::F32, peer, s).unwrap();
    c.recv(d.at(p2p), N, CommType::F32, (rank + n - 1) % n, s)
        .unwrap();
    c.group_end().unwrap();
    let from = (rank + n - 1) % n;
    let want: Vec<f32> = (0..N).map(|i| input(from, i)).collect();
    assert_eq!(to_f32s(&d.read(p2p, 4 * N)), want, "send/recv");

    // An all-reduce captured into a graph, launched twice.
    d.b.stream_synchronize(s).unwrap();
    d.b.stream_begin_capture(s).unwrap();
    let captured = c.all_reduce(
        d.at(cap),
        d.at(cap + 4 * N as u64),
        N,
        CommType::F32,
        ReduceOp::Sum,
        s,
    );
    let graph = d.b.stream_end_capture(s).unwrap();
    captured.unwrap();
    let exec = d.b.graph_instantiate(&graph).unwrap();
    for k in 1..=2 {
        let x: Vec<f32> = (0..N).map(|i| input(rank, i) * k as f32).collect();
        d.write(cap, &f32s(&x));
        d.b.graph_launch(&exec, s).unwrap();
        let want: Vec<f32> = (0..N)
            .map(|i| (0..n).map(|r| input(r, i) * k as f32).sum())
            .collect();
        assert_eq!(
            to_f32s(&d.read(cap + 4 * N as u64, 4 * N)),
            want,
            "graph launch {k}"
        );
    }
    d.b.graph_exec_destroy(exec).unwrap();
    d.b.graph_destroy(graph).unwrap();
    eprintln!("rank {rank} of {n}: all collectives matched");
}

//! Cost probe: measures, on the current device, what the copy-vs-remap
//! policy needs to know (remap cost, copy bandwidth and launch overhead,
//! graph launch overhead, free memory), and the host link as the memory
//! budget's staging uses it (copies between host-located VMM memory and
//! device memory, each way and both ways at once). Generic over [`Backend`], so it runs
//! on the host backend in CI and on CUDA/HIP devices for real numbers.
//!
//! All timings are host wall-clock medians (the remap calls are host-side
//! driver calls anyway), except copy bandwidth, which uses device events
//! when the backend has them.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, DevicePtr};
use crate::budget::MemLocation;
use crate::error::{DeviceError, Result};

/// What to measure and how often.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// Remap sizes (rounded up to the VMM granularity).
    pub remap_sizes: Vec<u64>,
    /// unmap + map + set-access rounds per size.
    pub remap_iters: usize,
    /// Size of the large D2D copy (bandwidth).
    pub copy_bytes: u64,
    pub copy_reps: usize,
    /// Number of 4-byte copies for the per-copy launch overhead.
    pub tiny_copies: usize,
    /// Nodes in the graph of tiny memsets.
    pub graph_nodes: usize,
    pub graph_reps: usize,
    /// Size of each host-link copy, and copies per direction.
    pub link_bytes: u64,
    pub link_reps: usize,
}

const MIB: u64 = 1 << 20;

impl Default for ProbeConfig {
    /// Sizes and counts for a real GPU (about a second on an H200).
    fn default() -> Self {
        Self {
            remap_sizes: vec![2 * MIB, 64 * MIB, 1024 * MIB],
            remap_iters: 200,
            copy_bytes: 256 * MIB,
            copy_reps: 20,
            tiny_copies: 2000,
            graph_nodes: 200,
            graph_reps: 50,
            link_bytes: 256 * MIB,
            link_reps: 8,
        }
    }
}

impl ProbeConfig {
    /// Small sizes and counts: for the host backend and tests.
    pub fn quick() -> Self {
        Self {
            remap_sizes: vec![2 * MIB, 8 * MIB],
            remap_iters: 20,
            copy_bytes: 8 * MIB,
            copy_reps: 3,
            tiny_copies: 200,
            graph_nodes: 20,
            graph_reps: 5,
            link_bytes: 8 * MIB,
            link_reps: 2,
        }
    }
}

/// Median cost of one unmap + map + set-access round of `bytes`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RemapCost {
    pub bytes: u64,
    pub unmap_us: f64,
    pub map_us: f64,
    pub set_access_us: f64,
    /// Median of the per-round totals (not the sum of the medians).
    pub total_us: f64,
    pub samples: usize,
}

/// The host link as staging uses it: copies between host-located VMM memory
/// mapped for the device and device memory, on the device's copy path.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LinkCosts {
    /// Bytes of each copy.
    pub bytes: u64,
    /// Host memory to device memory, bytes/s.
    pub to_device_bytes_per_s: f64,
    /// Device memory to host memory, bytes/s.
    pub to_host_bytes_per_s: f64,
    /// Both at once, on two streams: the bytes of both directions per
    /// second (twice one direction's rate where the link is full duplex).
    pub both_ways_bytes_per_s: f64,
}

/// Measured device costs; the auto threshold policy reads these.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceCosts {
    pub backend: String,
    pub device: String,
    /// Remap cost of one granule (the smallest measured size), µs.
    pub remap_us: f64,
    /// Remap cost per measured size (sizes that did not fit are left out).
    pub remap: Vec<RemapCost>,
    /// Large D2D copy bandwidth (bytes copied per second).
    pub copy_bw_bytes_per_s: f64,
    /// Per-copy cost of back-to-back 4-byte D2D copies (launch bound), µs.
    pub copy_launch_us: f64,
    /// What the graph probe's nodes are: "kernel" (a one-thread store
    /// kernel, where the backend can load the built-in one: CUDA) or
    /// "memset" (4-byte memsets, any backend).
    pub graph_node_kind: String,
    /// Launch + synchronize of a graph of `graph_nodes` tiny nodes, µs;
    /// `None` when the backend has no graphs.
    pub graph_launch_us: Option<f64>,
    /// Host time to enqueue that graph launch only, µs.
    pub graph_enqueue_us: Option<f64>,
    /// The same operations launched eagerly + synchronize, µs.
    pub eager_launch_us: f64,
    /// Launch + synchronize of a graph of `graph_nodes` 4-byte memsets, µs
    /// (the same as `graph_launch_us` when the node kind is "memset").
    pub graph_memset_launch_us: Option<f64>,
    pub graph_nodes: usize,
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Peak bandwidth from device attributes (bytes/s), for comparison.
    pub peak_bandwidth_bytes_per_s: f64,
    pub vmm_granularity: u64,
    /// The host link (`None`: not measured, `link_note` says why).
    #[serde(default)]
    pub link: Option<LinkCosts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_note: Option<String>,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn us_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Device memory mapped at a fresh VA range, released on every path.
fn with_mapping<B: Backend, T>(
    b: &B,
    bytes: u64,
    f: impl FnOnce(&B::VaRange) -> Result<T>,
) -> Result<T> {
    with_mapping_at(b, bytes, MemLocation::Device, f)
}

/// [`with_mapping`] of memory at `location`.
fn with_mapping_at<B: Backend, T>(
    b: &B,
    bytes: u64,
    location: MemLocation,
    f: impl FnOnce(&B::VaRange) -> Result<T>,
) -> Result<T> {
    let mem = b.mem_create_at(bytes, location)?;
    let va = match b.va_reserve(bytes, 0) {
        Ok(va) => va,
        Err(e) => {
            let _ = b.mem_release(mem);
            return Err(e);
        }
    };
    let out = b.map(&va, 0, &mem, 0, bytes).and_then(|()| {
        let r = b.set_access(&va, 0, bytes).and_then(|()| f(&va));
        // The closure leaves the range mapped; unmap before freeing.
        let u = b.unmap(&va, 0, bytes);
        r.and_then(|t| u.map(|()| t))
    });
    let freed = b.va_free(va);
    let released = b.mem_release(mem);
    let t = out?;
    freed?;
    released?;
    Ok(t)
}

fn round_up(v: u64, g: u64) -> u64 {
    if g == 0 {
        v
    } else {
        v.div_ceil(g) * g
    }
}

fn probe_remap<B: Backend>(b: &B, bytes: u64, iters: usize) -> Result<RemapCost> {
    let mem = b.mem_create_at(bytes, MemLocation::Device)?;
    let va = match b.va_reserve(bytes, 0) {
        Ok(va) => va,
        Err(e) => {
            let _ = b.mem_release(mem);
            return Err(e);
        }
    };
    let mut mapped = false;
    let mut rounds = || -> Result<RemapCost> {
        b.map(&va, 0, &mem, 0, bytes)?;
        mapped = true;
        b.set_access(&va, 0, bytes)?;
        let (mut un, mut ma, mut sa, mut tot) = (vec![], vec![], vec![], vec![]);
        for _ in 0..iters.max(1) {
            let t0 = Instant::now();
            b.unmap(&va, 0, bytes)?;
            mapped = false;
            let t1 = Instant::now();
            b.map(&va, 0, &mem, 0, bytes)?;
            mapped = true;
            let t2 = Instant::now();
            b.set_access(&va, 0, bytes)?;
            let t3 = Instant::now();
            un.push((t1 - t0).as_secs_f64() * 1e6);
            ma.push((t2 - t1).as_secs_f64() * 1e6);
            sa.push((t3 - t2).as_secs_f64() * 1e6);
            tot.push((t3 - t0).as_secs_f64() * 1e6);
        }
        Ok(RemapCost {
            bytes,
            unmap_us: median(&mut un),
            map_us: median(&mut ma),
            set_access_us: median(&mut sa),
            total_us: median(&mut tot),
            samples: tot.len(),
        })
    };
    let cost = rounds();
    let unmapped = if mapped {
        b.unmap(&va, 0, bytes)
    } else {
        Ok(())
    };
    let freed = b.va_free(va);
    let released = b.mem_release(mem);
    let cost = cost?;
    unmapped?;
    freed?;
    released?;
    Ok(cost)
}

/// Bandwidth of a large D2D copy and per-copy cost of tiny copies.
fn probe_copies<B: Backend>(b: &B, s: &B::Stream, cfg: &ProbeConfig, g: u64) -> Result<(f64, f64)> {
    let bytes = round_up(cfg.copy_bytes.max(1), g);
    with_mapping(b, bytes, |src_va| {
        with_mapping(b, bytes, |dst_va| {
            let (src, dst) = (b.va_base(src_va), b.va_base(dst_va));
            settled(b, s, copy_rates(b, s, cfg, src, dst, bytes))
        })
    })
}

/// [`probe_copies`]' copies from `src` to `dst` (`bytes` each).
fn copy_rates<B: Backend>(
    b: &B,
    s: &B::Stream,
    cfg: &ProbeConfig,
    src: DevicePtr,
    dst: DevicePtr,
    bytes: u64,
) -> Result<(f64, f64)> {
    b.memset_d8(src, 0x5a, bytes, s)?;
    b.copy_d2d(dst, src, bytes, s)?; // warm-up
    b.stream_synchronize(s)?;
    let reps = cfg.copy_reps.max(1);
    let secs = timed_on_stream(b, s, || {
        (0..reps).try_for_each(|_| b.copy_d2d(dst, src, bytes, s))
    })?;
    let bw = (bytes as f64 * reps as f64) / secs.max(1e-12);

    let n = cfg.tiny_copies.max(1);
    for i in 0..16u64 {
        b.copy_d2d(dst.offset(4 * i), src.offset(4 * i), 4, s)?; // warm-up
    }
    b.stream_synchronize(s)?;
    let t = Instant::now();
    for i in 0..n as u64 {
        let o = 4 * (i % (bytes / 4).max(1));
        b.copy_d2d(dst.offset(o), src.offset(o), 4, s)?;
    }
    b.stream_synchronize(s)?;
    Ok((bw, us_since(t) / n as f64))
}

/// `r`, after the work on `s` when it is an error: the caller unmaps the
/// memory that work may still use.
fn settled<B: Backend, T>(b: &B, s: &B::Stream, r: Result<T>) -> Result<T> {
    if r.is_err() {
        let _ = b.stream_synchronize(s);
    }
    r
}

/// The host link: `reps` copies of `bytes` from host-located memory to
/// device memory, then back, then both at once (the copies home on a
/// second stream forked from and joined to `s`).
fn probe_link<B: Backend>(b: &B, s: &B::Stream, bytes: u64, reps: usize) -> Result<LinkCosts> {
    use MemLocation::{Device, Host};
    with_mapping_at(b, bytes, Host, |from_host| {
        with_mapping_at(b, bytes, Host, |to_host| {
            with_mapping_at(b, bytes, Device, |to_dev| {
                with_mapping_at(b, bytes, Device, |from_dev| {
                    let ptrs = [from_host, to_host, to_dev, from_dev].map(|r| b.va_base(r));
                    settled(b, s, link_rates(b, s, ptrs, bytes, reps.max(1)))
                })
            })
        })
    })
}

/// The host link alone, on a stream of its own: what staging plans with
/// (`reps` copies of `bytes`, rounded up to the granularity, each way and
/// both at once; the four ranges are released on every path). Two ranges
/// of device memory are taken while it runs: the caller checks the room.
pub fn probe_link_quick<B: Backend>(b: &B, bytes: u64, reps: usize) -> Result<LinkCosts> {
    let g = b.info().vmm_granularity.max(1);
    let s = b.stream_create()?;
    let link = probe_link(b, &s, round_up(bytes.max(1), g), reps);
    let destroyed = b.stream_destroy(s);
    let link = link?;
    destroyed?;
    Ok(link)
}

/// [`probe_link`]'s copies between its four ranges: from host memory, to
/// host memory, to device memory, from device memory.
fn link_rates<B: Backend>(
    b: &B,
    s: &B::Stream,
    [hi, ho, di, dout]: [DevicePtr; 4],
    bytes: u64,
    reps: usize,
) -> Result<LinkCosts> {
    let rate = |secs: f64, copies: usize| bytes as f64 * copies as f64 / secs.max(1e-12);
    b.memset_d8(hi, 0x5a, bytes, s)?;
    b.memset_d8(dout, 0xa5, bytes, s)?;
    // Warm-up, one copy each way.
    b.copy_d2d(di, hi, bytes, s)?;
    b.copy_d2d(ho, dout, bytes, s)?;
    b.stream_synchronize(s)?;
    let each = |dst: DevicePtr, src: DevicePtr| {
        timed_on_stream(b, s, || {
            (0..reps).try_for_each(|_| b.copy_d2d(dst, src, bytes, s))
        })
    };
    let to_device = rate(each(di, hi)?, reps);
    let to_host = rate(each(ho, dout)?, reps);
    let both = with_second_stream(b, s, |home| {
        (0..reps).try_for_each(|_| {
            b.copy_d2d(di, hi, bytes, s)?;
            b.copy_d2d(ho, dout, bytes, home)
        })
    })?;
    Ok(LinkCosts {
        bytes,
        to_device_bytes_per_s: to_device,
        to_host_bytes_per_s: to_host,
        both_ways_bytes_per_s: rate(both, 2 * reps),
    })
}

/// Seconds the work `f` enqueues on `s` and on a second stream (forked from
/// `s` before it, joined to `s` after it) takes; everything made here is
/// released on every path.
fn with_second_stream<B: Backend>(
    b: &B,
    s: &B::Stream,
    f: impl FnOnce(&B::Stream) -> Result<()>,
) -> Result<f64> {
    let second = b.stream_create()?;
    let fork = b.event_create();
    let join = b.event_create();
    let secs = match (&fork, &join) {
        (Ok(fork), Ok(join)) => timed_on_stream(b, s, || {
            b.event_record(fork, s)?;
            b.stream_wait_event(&second, fork)?;
            f(&second)?;
            b.event_record(join, &second)?;
            b.stream_wait_event(s, join)
        }),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };
    let waited = b.stream_synchronize(&second);
    let released = [fork, join]
        .into_iter()
        .flatten()
        .map(|e| b.event_destroy(e))
        .chain([b.stream_destroy(second)])
        .collect::<Result<Vec<()>>>();
    let secs = secs?;
    waited?;
    released?;
    Ok(secs)
}

/// Seconds the work `f` enqueues on `s` takes: device events if the backend
/// times them, else host wall clock around `f` + synchronize.
fn timed_on_stream<B: Backend>(
    b: &B,
    s: &B::Stream,
    f: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let events = b.event_create().and_then(|e0| match b.event_create() {
        Ok(e1) => Ok((e0, e1)),
        Err(e) => {
            let _ = b.event_destroy(e0);
            Err(e)
        }
    });
    let t = Instant::now();
    let (e0, e1) = match events {
        Ok(ev) => ev,
        Err(_) => {
            f()?;
            b.stream_synchronize(s)?;
            return Ok(t.elapsed().as_secs_f64());
        }
    };
    let run = (|| {
        b.event_record(&e0, s)?;
        f()?;
        b.event_record(&e1, s)?;
        b.event_synchronize(&e1)?;
        Ok::<_, DeviceError>(())
    })();
    let wall = t.elapsed().as_secs_f64();
    let timed = run.map(|()| match b.event_elapsed_ms(&e0, &e1) {
        Ok(ms) if ms > 0.0 => f64::from(ms) / 1e3,
        _ => wall,
    });
    let d0 = b.event_destroy(e0);
    let d1 = b.event_destroy(e1);
    let secs = timed?;
    d0?;
    d1?;
    Ok(secs)
}

struct GraphCosts {
    eager_us: f64,
    graph: Option<(f64, f64)>,
}

/// A one-thread kernel `xla_vmm_probe_store(u32* p, u32 v) { *p = v; }`,
/// for the graph-of-kernels measurement.
const STORE_KERNEL_PTX: &str = r#"
.version 8.0
.target sm_50
.address_size 64

.visible .entry xla_vmm_probe_store(
	.param .u64 p_ptr,
	.param .u32 p_value
)
{
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [p_ptr];
	ld.param.u32 	%r1, [p_value];
	cvta.to.global.u64 	%rd2, %rd1;
	st.global.u32 	[%rd2], %r1;
	ret;
}
"#;

/// The same kernel as HIP C++, compiled for the device by hiprtc
/// (`ImageKind::HipSource`; unverified on AMD hardware).
const STORE_KERNEL_HIP: &str = include_str!("probe_store.hip");

/// The node of the graph probe: word `i` of the buffer gets `salt + i`.
enum TinyOp<'a, B: Backend> {
    Memset,
    Kernel(&'a B::Function),
}

impl<B: Backend> TinyOp<'_, B> {
    fn enqueue(&self, b: &B, s: &B::Stream, p: DevicePtr, value: u32) -> Result<()> {
        match self {
            TinyOp::Memset => b.memset_d32(p, value, 1, s),
            TinyOp::Kernel(f) => {
                let cfg = crate::backend::LaunchConfig {
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    ..Default::default()
                };
                b.launch(f, &cfg, &[&p.0.to_ne_bytes(), &value.to_ne_bytes()], s)
            }
        }
    }
}

/// The built-in store kernel: PTX on CUDA, HIP source on ROCm.
fn load_store_kernel<B: Backend>(b: &B) -> Option<(B::Module, B::Function)> {
    use crate::backend::ImageKind;
    let (image, kind) = match b.info().backend {
        "cuda" => (STORE_KERNEL_PTX, ImageKind::Ptx),
        "hip" => (STORE_KERNEL_HIP, ImageKind::HipSource),
        _ => return None,
    };
    let module = b
        .module_load(image.as_bytes(), kind)
        .map_err(|e| tracing::info!(error = %e, "probe kernel not loaded: memset graph only"))
        .ok()?;
    match b.module_function(&module, "xla_vmm_probe_store") {
        Ok(f) => Some((module, f)),
        Err(e) => {
            tracing::info!(error = %e, "probe kernel not found: memset graph only");
            let _ = b.module_unload(module);
            None
        }
    }
}

/// N tiny operations: eager launch + sync vs one graph launch (+ sync).
fn probe_graph<B: Backend>(
    b: &B,
    s: &B::Stream,
    cfg: &ProbeConfig,
    g: u64,
    op: &TinyOp<'_, B>,
) -> Result<GraphCosts> {
    let n = cfg.graph_nodes.max(1);
    let bytes = round_up(4 * n as u64, g);
    with_mapping(b, bytes, |va| {
        let base = b.va_base(va);
        let enqueue = |salt: u32| -> Result<()> {
            for i in 0..n as u64 {
                op.enqueue(b, s, base.offset(4 * i), salt.wrapping_add(i as u32))?;
            }
            Ok(())
        };
        enqueue(0)?; // warm-up
        b.stream_synchronize(s)?;
        let mut eager = Vec::new();
        for _ in 0..cfg.graph_reps.max(1) {
            let t = Instant::now();
            enqueue(0)?;
            b.stream_synchronize(s)?;
            eager.push(us_since(t));
        }
        let eager_us = median(&mut eager);

        match b.stream_begin_capture(s) {
            Ok(()) => {}
            Err(DeviceError::Unsupported(why)) => {
                tracing::info!(%why, "no graphs on this backend: graph launch cost not measured");
                return Ok(GraphCosts {
                    eager_us,
                    graph: None,
                });
            }
            Err(e) => return Err(e),
        }
        let captured = enqueue(7);
        let graph = b.stream_end_capture(s);
        captured?;
        let graph = graph?;
        let measured = (|| {
            let exec = b.graph_instantiate(&graph)?;
            let run = (|| {
                b.graph_launch(&exec, s)?; // warm-up (uploads the graph)
                b.stream_synchronize(s)?;
                let (mut total, mut enq) = (Vec::new(), Vec::new());
                for _ in 0..cfg.graph_reps.max(1) {
                    let t = Instant::now();
                    b.graph_launch(&exec, s)?;
                    enq.push(us_since(t));
                    b.stream_synchronize(s)?;
                    total.push(us_since(t));
                }
                verify_stores(b, s, base, n, 7)?;
                Ok((median(&mut total), median(&mut enq)))
            })();
            let destroyed = b.graph_exec_destroy(exec);
            let r = run?;
            destroyed?;
            Ok::<_, DeviceError>(r)
        })();
        let destroyed = b.graph_destroy(graph);
        let r = measured?;
        destroyed?;
        Ok(GraphCosts {
            eager_us,
            graph: Some(r),
        })
    })
}

/// The graph really ran: word i holds `salt + i`.
fn verify_stores<B: Backend>(
    b: &B,
    s: &B::Stream,
    base: DevicePtr,
    n: usize,
    salt: u32,
) -> Result<()> {
    let mut out = vec![0u8; 4 * n];
    b.read_sync(&mut out, base, s)?;
    for (i, w) in out.chunks_exact(4).enumerate() {
        let v = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        if v != salt.wrapping_add(i as u32) {
            return Err(DeviceError::InvalidArgument(format!(
                "probe: graph memset {i} left {v}, expected {}",
                salt.wrapping_add(i as u32)
            )));
        }
    }
    Ok(())
}

/// Measure everything in `cfg` on `b`.
pub fn probe<B: Backend>(b: &B, cfg: &ProbeConfig) -> Result<DeviceCosts> {
    let info = b.info().clone();
    if !info.vmm_supported {
        return Err(DeviceError::Unsupported(format!("VMM on {}", info.name)));
    }
    let g = info.vmm_granularity.max(1);
    let (free_bytes, total_bytes) = b.mem_info()?;

    let mut remap = Vec::new();
    let mut sizes: Vec<u64> = cfg
        .remap_sizes
        .iter()
        .map(|&s| round_up(s.max(1), g))
        .collect();
    sizes.dedup();
    for bytes in sizes {
        if bytes > free_bytes / 2 {
            tracing::info!(
                bytes,
                free_bytes,
                "remap size skipped: not enough free memory"
            );
            continue;
        }
        match probe_remap(b, bytes, cfg.remap_iters) {
            Ok(c) => remap.push(c),
            Err(DeviceError::OutOfMemory { .. }) => {
                tracing::info!(bytes, "remap size skipped: out of memory");
            }
            Err(e) => return Err(e),
        }
    }
    let remap_us = remap.first().map_or(0.0, |c| c.total_us);

    let s = b.stream_create()?;
    let kernel = load_store_kernel(b);
    let rest = probe_copies(b, &s, cfg, g).and_then(|copies| {
        let memset = probe_graph(b, &s, cfg, g, &TinyOp::Memset)?;
        let kernel = match &kernel {
            Some((_, f)) => Some(probe_graph(b, &s, cfg, g, &TinyOp::Kernel(f))?),
            None => None,
        };
        Ok((copies, memset, kernel))
    });
    let unloaded = kernel.map_or(Ok(()), |(m, f)| {
        drop(f);
        b.module_unload(m)
    });
    // Two copies of the link size in device memory, two in host memory.
    let link_bytes = round_up(cfg.link_bytes.max(1), g);
    let link = match rest {
        Err(_) => Err("not measured".to_string()),
        Ok(_) if 2 * link_bytes > free_bytes / 2 => Err(format!(
            "{} of device memory free, too little for two {} copies",
            human_bytes(free_bytes),
            human_bytes(link_bytes)
        )),
        Ok(_) => probe_link(b, &s, link_bytes, cfg.link_reps)
            .map_err(|e| format!("host-located memory: {e}")),
    };
    let destroyed = b.stream_destroy(s);
    let ((copy_bw_bytes_per_s, copy_launch_us), memset, kernel) = rest?;
    unloaded?;
    destroyed?;
    let graph_memset_launch_us = memset.graph.map(|(t, _)| t);
    let (graph_node_kind, graph) = match kernel {
        Some(k) => ("kernel", k),
        None => ("memset", memset),
    };

    Ok(DeviceCosts {
        backend: info.backend.to_string(),
        device: info.name.clone(),
        remap_us,
        remap,
        copy_bw_bytes_per_s,
        copy_launch_us,
        graph_node_kind: graph_node_kind.to_string(),
        graph_launch_us: graph.graph.map(|(t, _)| t),
        graph_enqueue_us: graph.graph.map(|(_, e)| e),
        eager_launch_us: graph.eager_us,
        graph_memset_launch_us,
        graph_nodes: cfg.graph_nodes.max(1),
        free_bytes,
        total_bytes,
        peak_bandwidth_bytes_per_s: info.memory_bandwidth,
        vmm_granularity: info.vmm_granularity,
        link_note: link.as_ref().err().cloned(),
        link: link.ok(),
    })
}

/// What [`probe_quick`] measures: the inputs of the auto threshold, in a
/// few milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct QuickCosts {
    /// Median unmap + map + set-access of one granule, µs.
    pub remap_us: f64,
    /// Bandwidth of one large D2D copy (device events where the backend
    /// has them), bytes/s.
    pub copy_bw_bytes_per_s: f64,
    /// Host cost per tiny D2D copy, enqueue to completion (launch bound), µs.
    pub copy_launch_us: f64,
    /// Bytes of the large copy (smaller than asked when memory is short).
    pub copy_bytes: u64,
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub vmm_granularity: u64,
    /// Wall time the probe took, µs.
    pub elapsed_us: f64,
}

/// Remaps of one granule taken by [`probe_quick`].
pub const QUICK_REMAPS: usize = 3;
/// Tiny copies timed by [`probe_quick`].
pub const QUICK_TINY_COPIES: usize = 8;

/// A light probe for the runtime's first VA-stable step: [`QUICK_REMAPS`]
/// remaps of one granule on a scratch reservation, one D2D copy of
/// `copy_bytes` (at most an eighth of free memory, whole granules; after a
/// warm-up copy of one granule) timed with events, and [`QUICK_TINY_COPIES`]
/// 4-byte copies. Everything it creates is released on every path.
pub fn probe_quick<B: Backend>(b: &B, copy_bytes: u64) -> Result<QuickCosts> {
    let t0 = Instant::now();
    let info = b.info().clone();
    if !info.vmm_supported {
        return Err(DeviceError::Unsupported(format!("VMM on {}", info.name)));
    }
    let g = info.vmm_granularity.max(1);
    let (free_bytes, total_bytes) = b.mem_info()?;
    let remap = probe_remap(b, g, QUICK_REMAPS)?;
    let bytes = round_up(copy_bytes.min(free_bytes / 8).max(1), g);
    let s = b.stream_create()?;
    let measured = with_mapping(b, bytes, |src_va| {
        with_mapping(b, bytes, |dst_va| {
            let (src, dst) = (b.va_base(src_va), b.va_base(dst_va));
            b.copy_d2d(dst, src, g.min(bytes), &s)?; // warm-up
            b.stream_synchronize(&s)?;
            let secs = timed_on_stream(b, &s, || b.copy_d2d(dst, src, bytes, &s))?;
            let bw = bytes as f64 / secs.max(1e-12);
            let t = Instant::now();
            for i in 0..QUICK_TINY_COPIES as u64 {
                b.copy_d2d(dst.offset(4 * i), src.offset(4 * i), 4, &s)?;
            }
            b.stream_synchronize(&s)?;
            Ok((bw, us_since(t) / QUICK_TINY_COPIES as f64))
        })
    });
    let destroyed = b.stream_destroy(s);
    let (copy_bw_bytes_per_s, copy_launch_us) = measured?;
    destroyed?;
    Ok(QuickCosts {
        remap_us: remap.total_us,
        copy_bw_bytes_per_s,
        copy_launch_us,
        copy_bytes: bytes,
        free_bytes,
        total_bytes,
        vmm_granularity: info.vmm_granularity,
        elapsed_us: us_since(t0),
    })
}

impl DeviceCosts {
    /// A readable multi-line table.
    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut t = String::new();
        let _ = writeln!(t, "device            {} ({})", self.device, self.backend);
        let _ = writeln!(
            t,
            "memory            {:.2} GiB free / {:.2} GiB total, VMM granularity {} KiB",
            gib(self.free_bytes),
            gib(self.total_bytes),
            self.vmm_granularity / 1024
        );
        let _ = writeln!(t, "remap (unmap + map + set-access), median:");
        for c in &self.remap {
            let _ = writeln!(
                t,
                "  {:>10}      {:8.1} us  (unmap {:.1} + map {:.1} + set-access {:.1}; {} samples)",
                human_bytes(c.bytes),
                c.total_us,
                c.unmap_us,
                c.map_us,
                c.set_access_us,
                c.samples
            );
        }
        let _ = writeln!(
            t,
            "D2D copy          {:.1} GB/s (peak from attributes {:.1} GB/s)",
            self.copy_bw_bytes_per_s / 1e9,
            self.peak_bandwidth_bytes_per_s / 1e9
        );
        let _ = writeln!(
            t,
            "tiny copy         {:.2} us per copy (back to back)",
            self.copy_launch_us
        );
        match (&self.link, &self.link_note) {
            (Some(l), _) => {
                let _ = writeln!(
                    t,
                    "host link         to device {:.1} GB/s, to host {:.1} GB/s, both at once {:.1} GB/s in all ({} copies of host-located memory)",
                    l.to_device_bytes_per_s / 1e9,
                    l.to_host_bytes_per_s / 1e9,
                    l.both_ways_bytes_per_s / 1e9,
                    human_bytes(l.bytes)
                );
            }
            (None, note) => {
                let _ = writeln!(
                    t,
                    "host link         not measured ({})",
                    note.as_deref().unwrap_or("no reason given")
                );
            }
        }
        let _ = writeln!(
            t,
            "{} {}s  eager + sync {:.1} us",
            self.graph_nodes, self.graph_node_kind, self.eager_launch_us
        );
        match (self.graph_launch_us, self.graph_enqueue_us) {
            (Some(l), Some(e)) => {
                let _ = writeln!(
                    t,
                    "  as one graph    launch + sync {l:.1} us (enqueue {e:.1} us)"
                );
                if self.graph_node_kind != "memset" {
                    if let Some(m) = self.graph_memset_launch_us {
                        let _ = writeln!(t, "  memset graph    launch + sync {m:.1} us");
                    }
                }
            }
            _ => {
                let _ = writeln!(t, "  as one graph    not supported by this backend");
            }
        }
        t
    }
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn round_up_to_granularity() {
        assert_eq!(round_up(1, 2 * MIB), 2 * MIB);
        assert_eq!(round_up(2 * MIB, 2 * MIB), 2 * MIB);
        assert_eq!(round_up(2 * MIB + 1, 2 * MIB), 4 * MIB);
    }

    #[test]
    fn probe_on_the_host_backend() {
        let b = crate::host::HostBackend::new(crate::host::HostConfig::default()).unwrap();
        let c = probe(&b, &ProbeConfig::quick()).unwrap();
        assert_eq!(c.backend, "host");
        assert_eq!(
            c.remap.iter().map(|r| r.bytes).collect::<Vec<_>>(),
            vec![2 * MIB, 8 * MIB]
        );
        assert!(c.remap.iter().all(|r| r.samples == 20 && r.total_us > 0.0));
        assert!(c.remap_us > 0.0 && c.copy_bw_bytes_per_s > 0.0 && c.copy_launch_us > 0.0);
        assert_eq!(c.total_bytes, crate::host::HostConfig::default().capacity);
        let json = serde_json::to_string(&c).unwrap();
        let back: DeviceCosts = serde_json::from_str(&json).unwrap();
        assert_eq!((back.remap.len(), back.free_bytes), (2, c.free_bytes));
        assert!((back.copy_bw_bytes_per_s / c.copy_bw_bytes_per_s - 1.0).abs() < 1e-9);
        assert!(c.to_table().contains("remap"));
        let l = c
            .link
            .as_ref()
            .expect("the host backend has host-located memory");
        assert_eq!(l.bytes, 8 * MIB);
        assert!(l.to_device_bytes_per_s > 0.0 && l.to_host_bytes_per_s > 0.0);
        assert!(l.both_ways_bytes_per_s > 0.0);
        // JSON keeps the rates to within a rounding of the last digit.
        let bl = back.link.as_ref().unwrap();
        let near = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-9;
        assert_eq!(bl.bytes, l.bytes);
        assert!(near(bl.to_device_bytes_per_s, l.to_device_bytes_per_s));
        assert!(near(bl.to_host_bytes_per_s, l.to_host_bytes_per_s));
        assert!(near(bl.both_ways_bytes_per_s, l.both_ways_bytes_per_s));
        assert!(c.to_table().contains("host link         to device"));
        let (free, total) = b.mem_info().unwrap();
        assert_eq!(free, total, "everything released");
        assert_eq!(b.outstanding().events, 0);
    }

    #[test]
    fn a_failing_copy_in_the_link_probe_is_said_and_leaves_nothing_behind() {
        let b = crate::host::HostBackend::new(crate::host::HostConfig::default()).unwrap();
        probe(&b, &ProbeConfig::quick()).unwrap();
        let copies = b.call_count("copy_d2d");
        let before = b.outstanding();
        // Each of the link probe's last copies (both ways at once) fails in turn.
        for k in 0..4 {
            b.inject_failure("copy_d2d", copies - k);
            let c = probe(&b, &ProbeConfig::quick()).unwrap();
            assert!(c.link.is_none(), "{c:?}");
            let note = c.link_note.unwrap();
            assert!(note.contains("HOST_INJECTED_FAILURE"), "{note}");
            assert_eq!(b.outstanding(), before, "copy {k} from the end");
        }
    }

    #[test]
    fn an_earlier_probes_json_without_the_link_still_reads() {
        let b = crate::host::HostBackend::new(crate::host::HostConfig::default()).unwrap();
        let mut v = serde_json::to_value(probe(&b, &ProbeConfig::quick()).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("link");
        let back: DeviceCosts = serde_json::from_value(v).unwrap();
        assert!(back.link.is_none());
        assert!(back.to_table().contains("host link         not measured"));
    }

    #[test]
    fn the_quick_link_probe_measures_each_way_and_releases_everything_on_every_path() {
        let b = crate::host::HostBackend::new(crate::host::HostConfig::default()).unwrap();
        let before = b.outstanding();
        // Rounded up to the granularity.
        let l = probe_link_quick(&b, 3 * MIB, 2).unwrap();
        assert_eq!(l.bytes, 4 * MIB);
        assert!(l.to_device_bytes_per_s > 0.0 && l.to_host_bytes_per_s > 0.0);
        assert!(l.both_ways_bytes_per_s > 0.0);
        let (free, total) = b.mem_info().unwrap();
        assert_eq!(free, total, "everything released");
        assert_eq!(b.outstanding(), before);
        // A copy failing: an error, and nothing left behind.
        // (The third copy from now: the first timed one to the device.)
        b.inject_failure("copy_d2d", 3);
        let e = probe_link_quick(&b, 4 * MIB, 2).unwrap_err();
        assert!(e.to_string().contains("HOST_INJECTED_FAILURE"), "{e}");
        assert_eq!(b.outstanding(), before);
        let (free, total) = b.mem_info().unwrap();
        assert_eq!(free, total);
    }

    #[test]
    fn quick_probe_on_the_host_backend_releases_everything() {
        let b = crate::host::HostBackend::new(crate::host::HostConfig::default()).unwrap();
        let q = probe_quick(&b, 64 * MIB).unwrap();
        assert!(q.remap_us > 0.0 && q.copy_bw_bytes_per_s > 0.0 && q.copy_launch_us > 0.0);
        assert_eq!(q.copy_bytes, 64 * MIB);
        assert_eq!(q.vmm_granularity, 2 * MIB);
        let (free, total) = b.mem_info().unwrap();
        assert_eq!(free, total);
        // Short of memory: the copy shrinks to an eighth of free memory.
        let small = crate::host::HostBackend::new(crate::host::HostConfig {
            capacity: 32 * MIB,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(probe_quick(&small, 64 * MIB).unwrap().copy_bytes, 4 * MIB);
    }

    #[test]
    fn sizes_that_do_not_fit_are_skipped() {
        let cfg = crate::host::HostConfig {
            capacity: 16 * MIB,
            ..Default::default()
        };
        let b = crate::host::HostBackend::new(cfg).unwrap();
        let mut p = ProbeConfig::quick();
        p.remap_sizes = vec![2 * MIB, 1024 * MIB];
        p.copy_bytes = 2 * MIB;
        let c = probe(&b, &p).unwrap();
        assert_eq!(c.remap.len(), 1);
        // Four 8 MiB copies do not fit in 16 MiB: the link is not measured.
        assert!(c.link.is_none());
        assert!(
            c.link_note.as_deref().unwrap().contains("too little"),
            "{c:?}"
        );
        // Everything the probe created was released.
        let (free, total) = b.mem_info().unwrap();
        assert_eq!(free, total);
    }
}

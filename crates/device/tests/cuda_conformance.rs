//! CUDA backend on a real GPU. Every test but the first is `#[ignore]`d
//! (they need a device); run them on a GPU machine with
//! `cargo test -p xla-vmm-device --release --test cuda_conformance -- --ignored --test-threads=1`
//! (or the built test binary with `--ignored --test-threads=1`).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use xla_vmm_device::backend::{Backend, DevicePtr, ImageKind, LaunchConfig};
use xla_vmm_device::cuda::CudaBackend;
use xla_vmm_device::vmm::{VaReservation, VmmAllocator, VmmConfig};
use xla_vmm_device::{conformance, DeviceError};

fn gpu() -> Arc<CudaBackend> {
    Arc::new(CudaBackend::new(0).expect("a CUDA device (these tests are --ignored without one)"))
}

fn read(b: &CudaBackend, s: &<CudaBackend as Backend>::Stream, p: DevicePtr, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    b.read_sync(&mut out, p, s).expect("read_sync");
    out
}

/// The GPU, or `None` (saying so) when its driver has no conditional nodes.
fn gpu_with_conditional_nodes() -> Option<Arc<CudaBackend>> {
    let b = gpu();
    if !b.info().conditional_nodes {
        eprintln!("driver has no conditional nodes: skipped");
        return None;
    }
    Some(b)
}

/// One block of one thread.
fn one_thread() -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        ..Default::default()
    }
}

#[test]
fn creating_without_a_driver_is_an_error_not_a_panic() {
    match CudaBackend::new(0) {
        Ok(b) => assert_eq!(b.info().backend, "cuda"),
        Err(DeviceError::NotAvailable(why)) => assert!(!why.is_empty()),
        Err(e) => panic!("expected NotAvailable without a GPU, got {e}"),
    }
    // An absurd ordinal is never a panic either.
    assert!(CudaBackend::new(1 << 20).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_info_is_plausible() {
    conformance::assert_plausible_info(&*gpu());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conformance_suite() {
    conformance::assert_all_pass(&gpu());
}

/// 10,000 mixed operations through the allocator, then the driver's free
/// memory is back where it started and no handle is outstanding.
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_10k_mixed_ops_leave_no_driver_memory_behind() {
    let b = gpu();
    let g = b.info().vmm_granularity;
    let s = b.stream_create().unwrap();
    b.stream_synchronize(&s).unwrap();
    let (free_before, _) = b.mem_info().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let mut live = Vec::new();
    let mut x: u64 = 0x243f_6a88_85a3_08d3;
    for op in 0..10_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.len() < 4 || (!x.is_multiple_of(3) && live.len() < 96) {
            let size = match x % 5 {
                0 => 1 + (x >> 8) % 256,
                1 => 1 + (x >> 8) % (64 << 10),
                2 => 1 + (x >> 8) % (4 * g),
                3 => g,
                _ => g * (1 + (x >> 8) % 8),
            };
            let buf = a
                .alloc(size)
                .unwrap_or_else(|e| panic!("op {op}: alloc {size}: {e}"));
            let tag = (op as u64) << 32 | (x & 0xffff_ffff);
            let n = buf.size().min(8) as usize;
            b.write_sync(buf.ptr(), &tag.to_le_bytes()[..n], &s)
                .unwrap();
            live.push((buf, tag));
        } else {
            let (buf, tag) = live.swap_remove((x >> 20) as usize % live.len());
            let n = buf.size().min(8) as usize;
            assert_eq!(
                read(&b, &s, buf.ptr(), n),
                tag.to_le_bytes()[..n],
                "op {op}: {buf:?}"
            );
            if x & 1 == 0 {
                a.free(buf, &s).unwrap();
            } else {
                drop(buf);
            }
        }
    }
    a.check_consistency().unwrap();
    let st = a.stats();
    eprintln!("after 10k ops: {st:?}");
    assert!(st.allocs_reused > 0);
    live.clear();
    b.stream_synchronize(&s).unwrap();
    a.trim().unwrap();
    let st = a.stats();
    assert_eq!(
        (st.phys_handles, st.va_handles, st.buffers_live),
        (0, 0, 0),
        "{st:?}"
    );
    assert!(a.take_deferred_errors().is_empty());
    drop(a);
    b.stream_synchronize(&s).unwrap();
    let (free_after, _) = b.mem_info().unwrap();
    eprintln!("free before {free_before}, after {free_after}");
    // The driver may keep a little bookkeeping memory; all buffers are gone.
    assert!(
        free_after + (8 << 20) >= free_before,
        "driver free memory dropped by {} bytes",
        free_before - free_after
    );
    b.stream_destroy(s).unwrap();
}

/// Data written through a buffer's own VA is read through a slot VA of a
/// fixed reservation; after remapping the slot to another buffer, the same
/// graph (recorded once against the slot VA) sees the new buffer.
#[test]
#[ignore = "needs a CUDA GPU"]
fn remapped_slot_shows_new_data_to_a_recorded_graph() {
    let b = gpu();
    let g = b.info().vmm_granularity;
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let size = 2 * g;
    let x = a.alloc(size).unwrap();
    let y = a.alloc(size).unwrap();
    let out = a.alloc(size).unwrap();
    assert!(x.remappable() && y.remappable());
    let px: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    let py: Vec<u8> = (0..size).map(|i| (i * 13 % 241) as u8 ^ 0x55).collect();
    b.write_sync(x.ptr(), &px, &s).unwrap();
    b.write_sync(y.ptr(), &py, &s).unwrap();

    let mut slot = VaReservation::reserve(a.context(), 4 * g, 0).unwrap();
    slot.map_rw(g, x.phys(), x.phys_offset(), x.capacity())
        .unwrap();
    assert_eq!(read(&b, &s, slot.base().offset(g), size as usize), px);

    // Record once: copy the slot into `out`.
    b.stream_begin_capture(&s).unwrap();
    b.copy_d2d(out.ptr(), slot.base().offset(g), size, &s)
        .unwrap();
    let graph = b.stream_end_capture(&s).unwrap();
    let exec = b.graph_instantiate(&graph).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    assert_eq!(read(&b, &s, out.ptr(), size as usize), px);

    // Remap the slot (the previous launch has completed) and replay.
    slot.unmap(g).unwrap();
    slot.map_rw(g, y.phys(), y.phys_offset(), y.capacity())
        .unwrap();
    b.graph_launch(&exec, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    assert_eq!(read(&b, &s, out.ptr(), size as usize), py);
    // Writes through the slot land in y, not x.
    b.memset_d8(slot.base().offset(g + 3), 0xab, 5, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    assert_eq!(read(&b, &s, y.ptr().offset(3), 5), vec![0xab; 5]);
    assert_eq!(read(&b, &s, x.ptr(), 16), px[..16].to_vec());

    b.graph_exec_destroy(exec).unwrap();
    b.graph_destroy(graph).unwrap();
    drop(slot);
    drop((x, y, out));
    assert_eq!(a.stats().buffers_live, 0);
    b.stream_destroy(s).unwrap();
}

/// `out[i] = value + i` over the whole grid.
const FILL_PTX: &str = r#"
.version 8.0
.target sm_50
.address_size 64

.visible .entry fill(
	.param .u64 p_out,
	.param .u32 p_value
)
{
	.reg .b32 	%r<7>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [p_out];
	ld.param.u32 	%r1, [p_value];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r5, %r2, %r3, %r4;
	add.s32 	%r6, %r1, %r5;
	mul.wide.u32 	%rd3, %r5, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r6;
	ret;
}

.visible .entry step(
	.param .u64 p_counter,
	.param .u64 p_pred,
	.param .u32 p_limit
)
{
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<5>;
	.reg .b16 	%rs<2>;
	.reg .pred 	%p<2>;

	ld.param.u64 	%rd1, [p_counter];
	ld.param.u64 	%rd2, [p_pred];
	ld.param.u32 	%r1, [p_limit];
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	ld.global.u32 	%r2, [%rd3];
	add.s32 	%r3, %r2, 1;
	st.global.u32 	[%rd3], %r3;
	setp.lt.u32 	%p1, %r3, %r1;
	selp.u16 	%rs1, 1, 0, %p1;
	st.global.u8 	[%rd4], %rs1;
	ret;
}
"#;

#[test]
#[ignore = "needs a CUDA GPU"]
fn ptx_kernel_launch_with_cluster_and_pdl() {
    let b = gpu();
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let module = b.module_load(FILL_PTX.as_bytes(), ImageKind::Ptx).unwrap();
    let fill = b.module_function(&module, "fill").unwrap();
    let n = 256u32;
    let out = a.alloc(4 * n as u64).unwrap();
    let ptr = out.ptr().0.to_ne_bytes();
    for (cluster, pdl, value) in [(None, false, 100u32), (Some([2, 1, 1]), true, 7)] {
        let cfg = LaunchConfig {
            grid: [n / 64, 1, 1],
            block: [64, 1, 1],
            cluster,
            pdl,
            ..Default::default()
        };
        b.launch(&fill, &cfg, &[&ptr, &value.to_ne_bytes()], &s)
            .unwrap();
        let got = read(&b, &s, out.ptr(), 4 * n as usize);
        for (i, w) in got.chunks_exact(4).enumerate() {
            assert_eq!(u32::from_ne_bytes(w.try_into().unwrap()), value + i as u32);
        }
    }
    // Wrong argument sizes and counts are refused before the driver.
    let cfg = one_thread();
    assert!(matches!(
        b.launch(&fill, &cfg, &[&ptr, &[1u8, 2]], &s),
        Err(DeviceError::InvalidArgument(_))
    ));
    assert!(matches!(
        b.launch(&fill, &cfg, &[&ptr], &s),
        Err(DeviceError::InvalidArgument(_))
    ));
    assert!(b.module_function(&module, "no_such_kernel").is_err());
    // The function keeps the module loaded after module_unload.
    b.module_unload(module).unwrap();
    b.launch(&fill, &cfg, &[&ptr, &5u32.to_ne_bytes()], &s)
        .unwrap();
    assert_eq!(read(&b, &s, out.ptr(), 4), 5u32.to_ne_bytes());
    drop(out);
    b.stream_destroy(s).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn capture_while_repeats_body_until_predicate_clears() {
    let Some(b) = gpu_with_conditional_nodes() else {
        return;
    };
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let module = b.module_load(FILL_PTX.as_bytes(), ImageKind::Ptx).unwrap();
    let step = b.module_function(&module, "step").unwrap();
    let counter = a.alloc(4).unwrap();
    let pred = a.alloc(1).unwrap();
    let limit = 10u32;
    let one = one_thread();
    let (c, p) = (counter.ptr().0.to_ne_bytes(), pred.ptr().0.to_ne_bytes());

    b.stream_begin_capture(&s).unwrap();
    let captured = b.capture_while(&s, pred.ptr(), &mut |body| {
        b.launch(&step, &one, &[&c, &p, &limit.to_ne_bytes()], body)
    });
    // A marker after the loop: ordered after it through the capture deps.
    let after = b.memset_d8(pred.ptr(), 0x42, 1, &s);
    let graph = b.stream_end_capture(&s).unwrap();
    captured.unwrap();
    after.unwrap();
    let exec = b.graph_instantiate(&graph).unwrap();
    for start in [0u32, 5, 9] {
        b.write_sync(counter.ptr(), &start.to_ne_bytes(), &s)
            .unwrap();
        b.write_sync(pred.ptr(), &[1], &s).unwrap();
        b.graph_launch(&exec, &s).unwrap();
        b.stream_synchronize(&s).unwrap();
        assert_eq!(
            read(&b, &s, counter.ptr(), 4),
            limit.to_ne_bytes(),
            "start {start}"
        );
        assert_eq!(read(&b, &s, pred.ptr(), 1), vec![0x42]);
    }
    // Predicate already false: the body never runs.
    b.write_sync(counter.ptr(), &3u32.to_ne_bytes(), &s)
        .unwrap();
    b.write_sync(pred.ptr(), &[0], &s).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    assert_eq!(read(&b, &s, counter.ptr(), 4), 3u32.to_ne_bytes());
    b.graph_exec_destroy(exec).unwrap();
    b.graph_destroy(graph).unwrap();
    // Outside a capture it is an error, not a crash.
    assert!(b.capture_while(&s, pred.ptr(), &mut |_| Ok(())).is_err());
    b.stream_destroy(s).unwrap();
}

/// A WHILE loop inside a WHILE loop's body (nested scans), with memsets in
/// the outer body resetting the inner loop's state.
#[test]
#[ignore = "needs a CUDA GPU"]
fn nested_capture_while() {
    let Some(b) = gpu_with_conditional_nodes() else {
        return;
    };
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let module = b.module_load(FILL_PTX.as_bytes(), ImageKind::Ptx).unwrap();
    let step = b.module_function(&module, "step").unwrap();
    let words = a.alloc(64).unwrap();
    // u32 words: 0 outer counter, 1 inner counter, 2 total; bytes 16..19: predicates.
    let (co, ci, total) = (words.ptr(), words.ptr().offset(4), words.ptr().offset(8));
    let (po, pi, pt) = (
        words.ptr().offset(16),
        words.ptr().offset(17),
        words.ptr().offset(18),
    );
    let one = one_thread();
    let bytes = |p: DevicePtr| p.0.to_ne_bytes();
    let (outer_n, inner_n) = (3u32, 4u32);
    b.stream_begin_capture(&s).unwrap();
    let captured = b.capture_while(&s, po, &mut |body| {
        b.memset_d32(ci, 0, 1, body)?;
        b.memset_d8(pi, 1, 1, body)?;
        b.capture_while(body, pi, &mut |inner| {
            b.launch(
                &step,
                &one,
                &[&bytes(ci), &bytes(pi), &inner_n.to_ne_bytes()],
                inner,
            )?;
            b.launch(
                &step,
                &one,
                &[&bytes(total), &bytes(pt), &1000u32.to_ne_bytes()],
                inner,
            )
        })?;
        b.launch(
            &step,
            &one,
            &[&bytes(co), &bytes(po), &outer_n.to_ne_bytes()],
            body,
        )
    });
    let graph = b.stream_end_capture(&s).unwrap();
    captured.unwrap();
    let exec = b.graph_instantiate(&graph).unwrap();
    let mut init = vec![0u8; 64];
    init[16] = 1;
    b.write_sync(words.ptr(), &init, &s).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    let got = read(&b, &s, words.ptr(), 12);
    let w = |i: usize| u32::from_ne_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!((w(0), w(1), w(2)), (outer_n, inner_n, outer_n * inner_n));
    b.graph_exec_destroy(exec).unwrap();
    b.graph_destroy(graph).unwrap();
    b.stream_destroy(s).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn handles_of_another_backend_are_rejected() {
    let b1 = gpu();
    let b2 = gpu();
    let s1 = b1.stream_create().unwrap();
    let e2 = b2.event_create().unwrap();
    assert!(matches!(
        b1.event_record(&e2, &s1),
        Err(DeviceError::InvalidArgument(_))
    ));
    let g = b1.info().vmm_granularity;
    let m1 = b1.mem_create(g).unwrap();
    let va2 = b2.va_reserve(g, 0).unwrap();
    assert!(matches!(
        b2.map(&va2, 0, &m1, 0, g),
        Err(DeviceError::InvalidArgument(_))
    ));
    // Misaligned and out-of-range VMM calls are refused too.
    assert!(matches!(
        b2.va_reserve(g + 1, 0),
        Err(DeviceError::InvalidArgument(_))
    ));
    b1.mem_release(m1).unwrap();
    b2.va_free(va2).unwrap();
    b2.event_destroy(e2).unwrap();
    b1.stream_destroy(s1).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn probe_reports_plausible_costs() {
    let b = gpu();
    let c =
        xla_vmm_device::probe::probe(&*b, &xla_vmm_device::probe::ProbeConfig::quick()).unwrap();
    eprintln!("{}", c.to_table());
    assert!(c.remap_us > 0.0 && c.copy_bw_bytes_per_s > 1e9 && c.copy_launch_us > 0.0);
    assert!(c.graph_launch_us.is_some());
    assert_eq!(c.graph_node_kind, "kernel");
    assert!(c.graph_memset_launch_us.is_some());
}

/// A kernel node's parameters change in place through `graph_exec_update`
/// (what XLA does when addresses change); a topology change is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_exec_update_changes_kernel_parameters() {
    let b = gpu();
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let module = b.module_load(FILL_PTX.as_bytes(), ImageKind::Ptx).unwrap();
    let fill = b.module_function(&module, "fill").unwrap();
    let (x, y) = (a.alloc(256).unwrap(), a.alloc(256).unwrap());
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        ..Default::default()
    };
    let capture = |out: DevicePtr, v: u32, twice: bool| {
        b.stream_begin_capture(&s).unwrap();
        let p = out.0.to_ne_bytes();
        b.launch(&fill, &cfg, &[&p, &v.to_ne_bytes()], &s).unwrap();
        if twice {
            b.launch(&fill, &cfg, &[&p, &v.to_ne_bytes()], &s).unwrap();
        }
        b.stream_end_capture(&s).unwrap()
    };
    let g1 = capture(x.ptr(), 10, false);
    let exec = b.graph_instantiate(&g1).unwrap();
    let g2 = capture(y.ptr(), 20, false);
    assert!(b.graph_exec_update(&exec, &g2).unwrap());
    b.graph_launch(&exec, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    assert_eq!(read(&b, &s, y.ptr(), 4), 20u32.to_ne_bytes());
    let g3 = capture(x.ptr(), 30, true);
    assert!(!b.graph_exec_update(&exec, &g3).unwrap());
    for g in [g1, g2, g3] {
        b.graph_destroy(g).unwrap();
    }
    b.graph_exec_destroy(exec).unwrap();
    b.stream_destroy(s).unwrap();
}

/// Blocking copies borrow host memory for the call only: recording them
/// into a graph would read freed memory at replay, so they are refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn blocking_copies_are_refused_during_capture() {
    let b = gpu();
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let x = a.alloc(64).unwrap();
    b.stream_begin_capture(&s).unwrap();
    let w = b.write_sync(x.ptr(), &[1, 2, 3], &s);
    let mut out = [0u8; 3];
    let r = b.read_sync(&mut out, x.ptr(), &s);
    let graph = b.stream_end_capture(&s).unwrap();
    assert!(matches!(w, Err(DeviceError::InvalidArgument(_))), "{w:?}");
    assert!(matches!(r, Err(DeviceError::InvalidArgument(_))), "{r:?}");
    b.graph_destroy(graph).unwrap();
    // The stream works normally afterwards.
    b.write_sync(x.ptr(), &[1, 2, 3], &s).unwrap();
    assert_eq!(read(&b, &s, x.ptr(), 3), vec![1, 2, 3]);
    b.stream_destroy(s).unwrap();
}

/// The backend binds its context on whatever thread calls it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn usable_from_other_threads() {
    let b = gpu();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let buf = a.alloc(4096).unwrap();
    let p = buf.ptr();
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let b = &b;
            scope.spawn(move || {
                let s = b.stream_create().unwrap();
                b.memset_d8(p.offset(1024 * t as u64), t + 1, 1024, &s)
                    .unwrap();
                b.stream_synchronize(&s).unwrap();
                b.stream_destroy(s).unwrap();
            });
        }
    });
    let s = b.stream_create().unwrap();
    let got = read(&b, &s, p, 4096);
    for t in 0..4usize {
        assert!(got[1024 * t..1024 * (t + 1)]
            .iter()
            .all(|&v| v == t as u8 + 1));
    }
    b.stream_destroy(s).unwrap();
}

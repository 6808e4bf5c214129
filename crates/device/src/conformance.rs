//! Backend conformance suite: the same checks on every [`Backend`].
//!
//! [`run_all`] runs every check on one backend and returns one [`Check`] per
//! case; nothing here assumes a particular backend (sizes come from
//! `info().vmm_granularity`, no kernels are needed). CI runs it on the host
//! backend (`tests/conformance_host.rs`); the GPU backends run it from their
//! probe / ignored tests.
#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use crate::backend::{Backend, DevicePtr, EventStatus};
use crate::budget::MemLocation;
use crate::vmm::{Phys, VaReservation, VmmAllocator, VmmConfig, VmmContext};

/// Outcome of one conformance check.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    pub name: &'static str,
    /// `Err(message)` on failure.
    pub result: Result<(), String>,
    pub millis: f64,
}

type CheckFn<B> = fn(&Arc<B>) -> Result<(), String>;

/// Every check, by name.
pub fn checks<B: Backend>() -> Vec<(&'static str, CheckFn<B>)> {
    vec![
        ("vmm_map_unmap_set_access", vmm_map_unmap::<B>),
        ("vmm_map_over_mapped_fails", map_over_mapped::<B>),
        ("vmm_remap_same_phys_two_vas", remap_two_vas::<B>),
        ("vmm_host_memory_second_mapping", host_second_mapping::<B>),
        ("copy_h2d_d2d_d2h", copies::<B>),
        ("copy_d2d_batch", copy_batch::<B>),
        ("memset_d8_d32", memsets::<B>),
        ("events_cross_stream_order", events_order::<B>),
        ("graph_capture_replay_update", graph_replay::<B>),
        ("graph_conditional_case", graph_case::<B>),
        ("graph_event_records_at_replay", graph_event_records::<B>),
        ("alloc_ids_and_reuse", alloc_ids::<B>),
        ("alloc_deferred_free", alloc_deferred_free::<B>),
        ("alloc_sub_allocation", alloc_small::<B>),
        ("alloc_remap_buffer_phys", alloc_remap::<B>),
        ("alloc_relocate_under_its_address", alloc_relocate::<B>),
        ("alloc_10k_mixed_ops_no_leak", alloc_10k::<B>),
    ]
}

/// Run every check on `backend`.
pub fn run_all<B: Backend>(backend: &Arc<B>) -> Vec<Check> {
    checks::<B>()
        .into_iter()
        .map(|(name, f)| {
            let t = Instant::now();
            let result = f(backend);
            let millis = t.elapsed().as_secs_f64() * 1e3;
            match &result {
                Ok(()) => tracing::info!(name, millis, "conformance: pass"),
                Err(e) => tracing::error!(name, error = %e, "conformance: FAIL"),
            }
            Check {
                name,
                result,
                millis,
            }
        })
        .collect()
}

/// Print the device's info on stderr and assert what every GPU backend's
/// must satisfy (VMM, a power-of-two granularity, over 1 GiB of memory,
/// multiprocessors, a consistent free / total); backend-specific checks stay
/// with the caller.
pub fn assert_plausible_info<B: Backend>(backend: &B) {
    let i = backend.info();
    eprintln!("{i:#?}");
    assert!(i.vmm_supported);
    assert!(i.vmm_granularity.is_power_of_two());
    assert!(i.total_memory > 1 << 30);
    assert!(i.multiprocessor_count > 0);
    let (free, total) = backend.mem_info().unwrap();
    assert!(free <= total && total > 0);
}

/// Run every check on `backend`, print them ([`report`]) and assert that
/// there were some and that none failed: the conformance test of each GPU
/// backend.
pub fn assert_all_pass<B: Backend>(backend: &Arc<B>) {
    let results = run_all(backend);
    let failed = report(&results);
    assert!(!results.is_empty());
    assert!(failed.is_empty(), "failed checks: {failed:?}");
}

/// Print one line per check (name, time, ok or the failure) on stderr and
/// return the names of the checks that failed.
pub fn report(results: &[Check]) -> Vec<&'static str> {
    let mut failed = Vec::new();
    for c in results {
        let verdict = match &c.result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("FAIL: {e}"),
        };
        eprintln!("{:<34} {:>9.1} ms  {verdict}", c.name, c.millis);
        if c.result.is_err() {
            failed.push(c.name);
        }
    }
    failed
}

type R = Result<(), String>;

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for crate::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> R {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// Streams and events destroyed on drop, so a failing check does not leak.
struct Scope<'a, B: Backend> {
    b: &'a B,
    streams: Vec<B::Stream>,
    events: Vec<B::Event>,
}

impl<'a, B: Backend> Scope<'a, B> {
    fn new(b: &'a B) -> Self {
        Scope {
            b,
            streams: Vec::new(),
            events: Vec::new(),
        }
    }
    fn stream(&mut self) -> Result<usize, String> {
        self.streams
            .push(self.b.stream_create().ctx("stream_create")?);
        Ok(self.streams.len() - 1)
    }
    fn event(&mut self) -> Result<usize, String> {
        self.events.push(self.b.event_create().ctx("event_create")?);
        Ok(self.events.len() - 1)
    }
    fn event_untimed(&mut self) -> Result<usize, String> {
        let e = self.b.event_create_untimed().ctx("event_create_untimed")?;
        self.events.push(e);
        Ok(self.events.len() - 1)
    }
}

impl<B: Backend> Drop for Scope<'_, B> {
    fn drop(&mut self) {
        for s in &self.streams {
            let _ = self.b.stream_synchronize(s);
        }
        for e in self.events.drain(..) {
            let _ = self.b.event_destroy(e);
        }
        for s in self.streams.drain(..) {
            let _ = self.b.stream_destroy(s);
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 8) as u8)
        })
        .collect()
}

fn read<B: Backend>(b: &B, s: &B::Stream, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0; len];
    b.read_sync(&mut v, ptr, s).ctx("read_sync")?;
    Ok(v)
}

/// A mapped, accessible region of `granules` granules.
fn region<B: Backend>(ctx: &VmmContext<B>, granules: u64) -> Result<VaReservation<B>, String> {
    let g = ctx.backend().info().vmm_granularity;
    let phys = Arc::new(Phys::create(ctx, granules * g).ctx("mem_create")?);
    let mut va = VaReservation::reserve(ctx, granules * g, 0).ctx("va_reserve")?;
    va.map_rw(0, &phys, 0, granules * g)
        .ctx("map + set_access")?;
    Ok(va)
}

fn vmm_map_unmap<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let phys = b.mem_create(2 * g).ctx("mem_create")?;
    ensure(b.mem_size(&phys) == 2 * g, || "mem_size".into())?;
    let va = b.va_reserve(4 * g, 0).ctx("va_reserve")?;
    let base = b.va_base(&va);
    let mut r = (|| -> R {
        ensure(base.0 != 0 && base.0 % g == 0, || {
            format!("VA base {:#x} not aligned to {g:#x}", base.0)
        })?;
        ensure(b.va_size(&va) == 4 * g, || "va_size".into())?;
        b.map(&va, g, &phys, 0, 2 * g).ctx("map")?;
        b.set_access(&va, g, 2 * g).ctx("set_access")?;
        let data = pattern((2 * g) as usize, 7);
        b.write_sync(base.offset(g), &data, s).ctx("write_sync")?;
        ensure(read(&**b, s, base.offset(g), data.len())? == data, || {
            "data mismatch after map".into()
        })?;
        b.unmap(&va, g, 2 * g).ctx("unmap")?;
        // Map again at another offset: the physical memory kept its bytes.
        b.map(&va, 2 * g, &phys, 0, 2 * g).ctx("map again")?;
        b.set_access(&va, 2 * g, 2 * g).ctx("set_access again")?;
        ensure(
            read(&**b, s, base.offset(2 * g), data.len())? == data,
            || "data lost across unmap/map".into(),
        )?;
        b.unmap(&va, 2 * g, 2 * g).ctx("unmap again")
    })();
    if r.is_err() {
        let _ = b.unmap(&va, g, 2 * g);
        let _ = b.unmap(&va, 2 * g, 2 * g);
    }
    if let Err(e) = b.va_free(va) {
        r = r.and(Err(format!("va_free: {e}")));
    }
    if let Err(e) = b.mem_release(phys) {
        r = r.and(Err(format!("mem_release: {e}")));
    }
    r
}

fn map_over_mapped<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let ctx = VmmContext::new(b.clone());
    let p1 = Arc::new(Phys::create(&ctx, 2 * g).ctx("mem_create")?);
    let p2 = Arc::new(Phys::create(&ctx, g).ctx("mem_create")?);
    let mut va = VaReservation::reserve(&ctx, 4 * g, 0).ctx("va_reserve")?;
    va.map(0, &p1, 0, 2 * g).ctx("map")?;
    ensure(va.map(g, &p2, 0, g).is_err(), || {
        "map over a mapped range succeeded".into()
    })?;
    ensure(va.map(0, &p2, 0, g).is_err(), || {
        "map at a mapped offset succeeded".into()
    })?;
    va.map(2 * g, &p2, 0, g).ctx("map next to a mapping")?;
    va.release().ctx("release")
}

fn remap_two_vas<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let phys = Arc::new(Phys::create(&ctx, g).ctx("mem_create")?);
    let mut a = VaReservation::reserve(&ctx, g, 0).ctx("va_reserve")?;
    let mut c = VaReservation::reserve(&ctx, 2 * g, 0).ctx("va_reserve")?;
    a.map_rw(0, &phys, 0, g).ctx("map a")?;
    c.map_rw(g, &phys, 0, g).ctx("map c")?;
    ensure(a.base() != c.base(), || {
        "two reservations share a base".into()
    })?;
    let data = pattern(g as usize, 3);
    b.write_sync(a.base(), &data, s).ctx("write via a")?;
    ensure(
        read(&**b, s, c.base().offset(g), g as usize)? == data,
        || "data written via one VA differs via the other".into(),
    )?;
    // And back: write through c, read through a.
    b.memset_d8(c.base().offset(g + 100), 0xab, 10, s)
        .ctx("memset via c")?;
    b.stream_synchronize(s).ctx("sync")?;
    let back = read(&**b, s, a.base().offset(100), 10)?;
    ensure(back == vec![0xab; 10], || {
        format!("memset via c not seen via a: {back:?}")
    })?;
    a.unmap(0).ctx("unmap a")?;
    ensure(read(&**b, s, c.base().offset(g), 16)? == data[..16], || {
        "unmapping a changed c".into()
    })?;
    drop(a);
    c.release().ctx("release c")
}

/// Host-located physical memory mapped at a second address, whole and a
/// prefix of it: where the driver allows it, the bytes are the same through
/// every mapping; where it refuses, the refusal is an error (said on
/// stderr) and the first mapping is intact. The runtime maps host-located
/// memory once (shared temporaries are device memory only): this records
/// what the driver does.
fn host_second_mapping<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let phys = match Phys::create_at(&ctx, 2 * g, MemLocation::Host) {
        Err(crate::DeviceError::Unsupported(why)) => {
            tracing::info!(%why, "host_second_mapping: no host-located memory here; skipped");
            return Ok(());
        }
        r => Arc::new(r.ctx("mem_create_at host")?),
    };
    let mut a = VaReservation::reserve(&ctx, 2 * g, 0).ctx("va_reserve")?;
    a.map_rw(0, &phys, 0, 2 * g).ctx("map a")?;
    let data = pattern(2 * g as usize, 11);
    b.write_sync(a.base(), &data, s).ctx("write via a")?;
    for (what, size) in [("whole", 2 * g), ("a prefix", g)] {
        let mut c = VaReservation::reserve(&ctx, size, 0).ctx("va_reserve")?;
        match c.map_rw(0, &phys, 0, size) {
            Ok(()) => {
                ensure(
                    read(&**b, s, c.base(), size as usize)? == data[..size as usize],
                    || format!("host memory mapped a second time ({what}): other bytes"),
                )?;
                eprintln!("host memory mapped a second time ({what}): allowed");
            }
            Err(e) => eprintln!("host memory mapped a second time ({what}): refused: {e}"),
        }
        drop(c);
    }
    ensure(read(&**b, s, a.base(), data.len())? == data, || {
        "the first mapping changed".into()
    })?;
    drop(a);
    drop(phys);
    drop(sc);
    no_leaks(&ctx)
}

fn copies<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity as usize;
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let va = region(&ctx, 2)?;
    let n = g + 4096 + 12; // crosses a granule boundary
    let data = pattern(n, 11);
    let mut h_in = b.host_alloc(n).ctx("host_alloc")?;
    let h_out = b.host_alloc(n).ctx("host_alloc")?;
    let r = (|| -> R {
        b.host_bytes_mut(&mut h_in).copy_from_slice(&data);
        b.copy_h2d(va.base().offset(4), &h_in, 0, n, s)
            .ctx("copy_h2d")?;
        b.copy_d2d(
            va.base().offset(g as u64 / 2 + 8),
            va.base().offset(4),
            1000,
            s,
        )
        .ctx("copy_d2d")?;
        b.copy_d2h(&h_out, 0, va.base().offset(4), n, s)
            .ctx("copy_d2h")?;
        b.stream_synchronize(s).ctx("stream_synchronize")?;
        let mut expect = data.clone();
        let (src, dst) = (0usize, g / 2 + 4);
        let moved = data[src..src + 1000].to_vec();
        expect[dst..dst + 1000].copy_from_slice(&moved);
        ensure(b.host_bytes(&h_out) == expect, || {
            "H2D -> D2D -> D2H round trip differs".into()
        })?;
        // Partial host offsets.
        b.copy_d2h(&h_out, 10, va.base().offset(4), 20, s)
            .ctx("copy_d2h offset")?;
        b.stream_synchronize(s).ctx("sync")?;
        ensure(b.host_bytes(&h_out)[10..30] == expect[..20], || {
            "D2H at host offset".into()
        })
    })();
    let r1 = b.host_free(h_in).ctx("host_free");
    let r2 = b.host_free(h_out).ctx("host_free");
    r.and(r1).and(r2)
}

/// A batch with contiguous neighbours (merged), separate copies and an
/// empty one, ordered after a fill and before a read on the same stream.
fn copy_batch<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let va = region(&ctx, 2)?;
    let n = 64 << 10;
    let data = pattern(n, 23);
    let (src, dst) = (va.base(), va.base().offset(g));
    b.write_sync(src, &data, s).ctx("write_sync")?;
    b.memset_d8(dst, 0xAB, n as u64, s).ctx("memset_d8")?;
    // (dst offset, src offset, bytes)
    let copies = [
        (0u64, 0u64, 1000u64),
        (1000, 1000, 24), // contiguous with the first on both sides
        (4096, 8192, 300),
        (10_000, 20_000, 0),
        (40_000, 30_000, 5000),
        (2048, 60_000, 16),
    ];
    let list: Vec<_> = copies
        .iter()
        .map(|&(d, o, len)| (dst.offset(d), src.offset(o), len))
        .collect();
    b.copy_d2d_batch(&list, s).ctx("copy_d2d_batch")?;
    let got = read(&**b, s, dst, n)?;
    let mut expect = vec![0xABu8; n];
    for &(d, o, len) in &copies {
        let (d, o, len) = (d as usize, o as usize, len as usize);
        expect[d..d + len].copy_from_slice(&data[o..o + len]);
    }
    ensure(got == expect, || {
        let first = got.iter().zip(&expect).position(|(a, e)| a != e);
        format!("batched copies differ, first at byte {first:?}")
    })?;
    ensure(b.copy_d2d_batch(&[], s).is_ok(), || {
        "an empty batch is an error".into()
    })
}

fn memsets<B: Backend>(b: &Arc<B>) -> R {
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let va = region(&ctx, 1)?;
    b.write_sync(va.base(), &[0x11; 64], s).ctx("write_sync")?;
    b.memset_d8(va.base().offset(3), 0x5a, 7, s)
        .ctx("memset_d8")?;
    b.memset_d32(va.base().offset(16), 0xdead_beef, 5, s)
        .ctx("memset_d32")?;
    b.stream_synchronize(s).ctx("sync")?;
    let got = read(&**b, s, va.base(), 64)?;
    let mut expect = vec![0x11u8; 64];
    expect[3..10].fill(0x5a);
    for i in 0..5 {
        expect[16 + 4 * i..20 + 4 * i].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    }
    ensure(got == expect, || format!("memset result {got:?}"))
}

fn events_order<B: Backend>(b: &Arc<B>) -> R {
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let (s1, s2) = (sc.stream()?, sc.stream()?);
    let (e1, e0, eu) = (sc.event()?, sc.event()?, sc.event_untimed()?);
    let (s1, s2, e1, e0, eu) = (
        &sc.streams[s1],
        &sc.streams[s2],
        &sc.events[e1],
        &sc.events[e0],
        &sc.events[eu],
    );
    let g = b.info().vmm_granularity;
    let va = region(&ctx, 2)?;
    let (x, y) = (va.base(), va.base().offset(g));
    let n = g.min(1 << 16);
    b.event_record(e0, s1).ctx("event_record start")?;
    b.memset_d32(x, 0x0102_0304, n / 4, s1).ctx("memset")?;
    b.event_record(e1, s1).ctx("event_record")?;
    // The untimed event orders the streams (what completions use it for).
    b.event_record(eu, s1).ctx("event_record untimed")?;
    b.stream_wait_event(s2, eu).ctx("stream_wait_event")?;
    b.copy_d2d(y, x, n, s2).ctx("copy_d2d on s2")?;
    b.stream_synchronize(s2).ctx("sync s2")?;
    b.event_synchronize(e1).ctx("event_synchronize")?;
    ensure(
        b.event_query(e1).ctx("event_query")? == EventStatus::Complete,
        || "event not complete after sync".into(),
    )?;
    let ms = b.event_elapsed_ms(e0, e1).ctx("event_elapsed_ms")?;
    ensure(ms >= 0.0, || format!("negative elapsed time {ms}"))?;
    b.event_synchronize(eu).ctx("event_synchronize untimed")?;
    ensure(b.event_elapsed_ms(e0, eu).is_err(), || {
        "an untimed event was timed".into()
    })?;
    let got = read(&**b, s2, y, n as usize)?;
    ensure(
        got.chunks(4).all(|c| c == 0x0102_0304u32.to_le_bytes()),
        || "s2 did not see s1's memset".into(),
    )
}

fn graph_replay<B: Backend>(b: &Arc<B>) -> R {
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let va = region(&ctx, 1)?;
    let (x, y) = (va.base(), va.base().offset(1024));
    b.write_sync(va.base(), &vec![0u8; 4096], s).ctx("zero")?;
    let capture = |value: u32| -> Result<B::Graph, String> {
        b.stream_begin_capture(s).ctx("begin_capture")?;
        let r1 = b.memset_d32(x, value, 64, s).ctx("memset in capture");
        let r2 = b.copy_d2d(y, x, 256, s).ctx("copy in capture");
        let g = b.stream_end_capture(s).ctx("end_capture")?;
        r1.and(r2).map(|_| g)
    };
    let g1 = capture(7)?;
    let g2 = capture(9);
    let exec = b.graph_instantiate(&g1).ctx("graph_instantiate");
    let r = (|| -> R {
        let g2 = g2.as_ref().map_err(Clone::clone)?;
        let exec = exec.as_ref().map_err(|e| e.to_string())?;
        ensure(read(&**b, s, y, 256)? == vec![0; 256], || {
            "capture executed its work".into()
        })?;
        let sevens: Vec<u8> = (0..64).flat_map(|_| 7u32.to_le_bytes()).collect();
        b.graph_launch(exec, s).ctx("graph_launch")?;
        b.stream_synchronize(s).ctx("sync")?;
        ensure(read(&**b, s, y, 256)? == sevens, || {
            "graph launch result".into()
        })?;
        b.write_sync(y, &[0u8; 256], s).ctx("clear")?;
        b.graph_launch(exec, s).ctx("graph relaunch")?;
        b.stream_synchronize(s).ctx("sync")?;
        ensure(read(&**b, s, y, 256)? == sevens, || {
            "graph replay result".into()
        })?;
        if b.graph_exec_update(exec, g2).ctx("graph_exec_update")? {
            b.graph_launch(exec, s).ctx("graph launch after update")?;
            b.stream_synchronize(s).ctx("sync")?;
            let nines: Vec<u8> = (0..64).flat_map(|_| 9u32.to_le_bytes()).collect();
            ensure(read(&**b, s, y, 256)? == nines, || {
                "updated graph result".into()
            })?;
        }
        Ok(())
    })();
    let mut cleanup = Ok(());
    if let Ok(e) = exec {
        cleanup = cleanup.and(b.graph_exec_destroy(e).ctx("graph_exec_destroy"));
    }
    if let Ok(g) = g2 {
        cleanup = cleanup.and(b.graph_destroy(g).ctx("graph_destroy"));
    }
    cleanup = cleanup.and(b.graph_destroy(g1).ctx("graph_destroy"));
    r.and(cleanup)
}

/// Events recorded inside a capture as nodes of the graph
/// (`event_record_in_graph`, where the backend can): each replay records
/// them again, so a replay can be timed; outside a capture it is an error.
fn graph_event_records<B: Backend>(b: &Arc<B>) -> R {
    if !b.info().graph_event_records {
        return Ok(());
    }
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let (e0, e1) = (sc.event()?, sc.event()?);
    let (s, e0, e1) = (&sc.streams[s], &sc.events[e0], &sc.events[e1]);
    let va = region(&ctx, 1)?;
    let (x, y) = (va.base(), va.base().offset(4096));
    ensure(b.event_record_in_graph(e0, s).is_err(), || {
        "a record meant for a graph is refused outside a capture".into()
    })?;
    b.stream_begin_capture(s).ctx("begin_capture")?;
    let recorded = b
        .event_record_in_graph(e0, s)
        .and_then(|_| b.memset_d32(x, 5, 1024, s))
        .and_then(|_| b.copy_d2d(y, x, 4096, s))
        .and_then(|_| b.event_record_in_graph(e1, s))
        .ctx("work in capture");
    let g = b.stream_end_capture(s).ctx("end_capture")?;
    let exec = recorded.and_then(|_| b.graph_instantiate(&g).ctx("graph_instantiate"));
    let r = (|| -> R {
        let exec = exec.as_ref().map_err(Clone::clone)?;
        for replay in 0..2 {
            b.graph_launch(exec, s).ctx("graph_launch")?;
            b.stream_synchronize(s).ctx("sync")?;
            for e in [e0, e1] {
                ensure(
                    b.event_query(e).ctx("event_query")? == EventStatus::Complete,
                    || format!("replay {replay}: an event of the graph is not complete"),
                )?;
            }
            let ms = b.event_elapsed_ms(e0, e1).ctx("event_elapsed_ms")?;
            ensure(ms.is_finite() && ms >= 0.0, || {
                format!("replay {replay}: elapsed {ms} ms")
            })?;
        }
        let got = read(&**b, s, y, 4096)?;
        ensure(got.chunks(4).all(|c| c == 5u32.to_le_bytes()), || {
            "the graph's copy".into()
        })
    })();
    let mut cleanup = Ok(());
    if let Ok(e) = exec {
        cleanup = b.graph_exec_destroy(e).ctx("graph_exec_destroy");
    }
    r.and(cleanup).and(b.graph_destroy(g).ctx("graph_destroy"))
}

/// XLA's conditional in a graph (`capture_case`, where the backend has
/// conditional nodes): three branches, each writing its number, picked on
/// the device at every replay from an s32 index (out of range: the last),
/// then a predicate (true: branch 0); the index memory is overwritten by
/// branch 1 after being read, which must not change what runs.
fn graph_case<B: Backend>(b: &Arc<B>) -> R {
    if !b.info().conditional_nodes {
        return Ok(());
    }
    let ctx = VmmContext::new(b.clone());
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let va = region(&ctx, 1)?;
    let (index, out) = (va.base(), va.base().offset(256));
    let run = |is_pred: bool, branches: usize, cases: &[(i32, u32)]| -> R {
        b.stream_begin_capture(s).ctx("begin_capture")?;
        let captured = b
            .capture_case(s, index, is_pred, branches, &mut |i, body| {
                b.memset_d32(out, 100 + i as u32, 1, body)?;
                if i == 1 {
                    b.memset_d32(index, 0, 1, body)?;
                }
                Ok(())
            })
            .ctx("capture_case");
        let after = b.memset_d32(out.offset(4), 7, 1, s).ctx("memset after");
        let g = b.stream_end_capture(s).ctx("end_capture")?;
        let exec = b.graph_instantiate(&g).ctx("graph_instantiate");
        let r = (|| -> R {
            captured?;
            after?;
            let exec = exec.as_ref().map_err(|e| e.to_string())?;
            for &(v, want) in cases {
                b.write_sync(index, &v.to_le_bytes(), s).ctx("index")?;
                b.write_sync(out, &[0u8; 8], s).ctx("clear")?;
                b.graph_launch(exec, s).ctx("graph_launch")?;
                b.stream_synchronize(s).ctx("sync")?;
                let got = read(&**b, s, out, 8)?;
                let mut expect = want.to_le_bytes().to_vec();
                expect.extend(7u32.to_le_bytes());
                ensure(got == expect, || {
                    format!("pred {is_pred} index {v}: {got:?}, want branch {want}")
                })?;
            }
            Ok(())
        })();
        let mut cleanup = Ok(());
        if let Ok(e) = exec {
            cleanup = cleanup.and(b.graph_exec_destroy(e).ctx("graph_exec_destroy"));
        }
        r.and(cleanup).and(b.graph_destroy(g).ctx("graph_destroy"))
    };
    run(
        false,
        3,
        &[(0, 100), (1, 101), (2, 102), (5, 102), (-1, 102), (1, 101)],
    )?;
    run(true, 2, &[(1, 100), (0, 101), (256, 101)])
}

fn allocator<B: Backend>(b: &Arc<B>) -> Result<VmmAllocator<B>, String> {
    VmmAllocator::new(b.clone(), VmmConfig::default()).ctx("VmmAllocator::new")
}

/// After the allocator and its buffers are gone, its context owns nothing.
fn no_leaks<B: Backend>(ctx: &VmmContext<B>) -> R {
    let c = ctx.handle_counts();
    ensure(
        c.phys_handles == 0 && c.va_handles == 0 && c.mapped_bytes == 0,
        || format!("leak after teardown: {c:?}"),
    )?;
    let errs = ctx.take_deferred_errors();
    ensure(errs.is_empty(), || {
        format!("errors during teardown: {errs:?}")
    })
}

fn alloc_ids<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let a = allocator(b)?;
    let ctx = a.context().clone();
    let x = a.alloc(3 * g - 5).ctx("alloc")?;
    let y = a.alloc(3 * g).ctx("alloc")?;
    ensure(x.allocation_id() != y.allocation_id(), || {
        "two live buffers share an id".into()
    })?;
    ensure(x.remappable() && x.capacity() == 3 * g, || {
        format!("large buffer: {x:?}")
    })?;
    let (xid, xptr) = (x.allocation_id(), x.ptr());
    drop(x);
    let z = a.alloc(3 * g - 100).ctx("alloc")?;
    ensure(
        z.allocation_id() == xid && z.generation() == 1 && z.ptr() == xptr,
        || format!("freed block not reused: {z:?}"),
    )?;
    let w = a.alloc(g).ctx("alloc other class")?;
    ensure(w.allocation_id() != xid && w.generation() == 0, || {
        "new class reused a block".into()
    })?;
    let st = a.stats();
    ensure(
        st.allocs_fresh == 3 && st.allocs_reused == 1 && st.buffers_live == 3,
        || format!("stats {st:?}"),
    )?;
    drop((y, z, w));
    drop(a);
    no_leaks(&ctx)
}

fn alloc_deferred_free<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let a = allocator(b)?;
    let ctx = a.context().clone();
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let x = a.alloc(g).ctx("alloc")?;
    let id = x.allocation_id();
    b.memset_d8(x.ptr(), 1, g, s).ctx("memset")?;
    a.free(x, s).ctx("free on stream")?;
    b.stream_synchronize(s).ctx("sync")?;
    let y = a.alloc(g).ctx("alloc after sync")?;
    ensure(y.allocation_id() == id, || {
        "block not reused after its free event completed".into()
    })?;
    a.free(y, s).ctx("free")?;
    drop(a);
    drop(sc);
    no_leaks(&ctx)
}

fn alloc_small<B: Backend>(b: &Arc<B>) -> R {
    let a = allocator(b)?;
    let ctx = a.context().clone();
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let bufs: Vec<_> = (0..16)
        .map(|i| a.alloc(4 + i * 100))
        .collect::<crate::Result<_>>()
        .ctx("alloc small")?;
    let st = a.stats();
    ensure(st.phys_handles <= 4, || {
        format!(
            "16 small buffers took {} physical allocations",
            st.phys_handles
        )
    })?;
    let mut ids: Vec<_> = bufs.iter().map(|x| x.allocation_id()).collect();
    ids.sort();
    ids.dedup();
    ensure(ids.len() == 16, || "small buffers share ids".into())?;
    ensure(bufs.iter().all(|x| !x.remappable()), || {
        "small buffer marked remappable".into()
    })?;
    for (i, x) in bufs.iter().enumerate() {
        b.write_sync(x.ptr(), &pattern(x.size() as usize, i as u8), s)
            .ctx("write")?;
    }
    for (i, x) in bufs.iter().enumerate() {
        ensure(
            read(&**b, s, x.ptr(), x.size() as usize)? == pattern(x.size() as usize, i as u8),
            || format!("small buffer {i} overwritten by a neighbour"),
        )?;
    }
    let (id3, ptr3, size3) = (bufs[3].allocation_id(), bufs[3].ptr(), bufs[3].size());
    let mut bufs = bufs;
    let x3 = bufs.remove(3);
    a.free(x3, s).ctx("free small")?;
    b.stream_synchronize(s).ctx("sync")?;
    let again = a.alloc(size3 - 1).ctx("alloc same class")?;
    ensure(
        again.ptr() == ptr3 && again.allocation_id() == id3 && again.generation() == 1,
        || format!("small slot not reused: {again:?}"),
    )?;
    drop(again);
    drop(bufs);
    drop(a);
    drop(sc);
    no_leaks(&ctx)
}

fn alloc_remap<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let a = allocator(b)?;
    let ctx = a.context().clone();
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let x = a.alloc(2 * g).ctx("alloc")?;
    let data = pattern((2 * g) as usize, 42);
    b.write_sync(x.ptr(), &data, s).ctx("write via buffer VA")?;
    // The runtime's view: a slot in a larger reservation.
    let mut slot = VaReservation::reserve(&ctx, 4 * g, 0).ctx("reserve slot")?;
    slot.map_rw(g, x.phys(), x.phys_offset(), x.capacity())
        .ctx("map buffer phys into slot")?;
    ensure(
        read(&**b, s, slot.base().offset(g), data.len())? == data,
        || "slot VA reads other data than the buffer VA".into(),
    )?;
    b.memset_d8(slot.base().offset(g + 5), 0xee, 3, s)
        .ctx("write via slot")?;
    b.stream_synchronize(s).ctx("sync")?;
    ensure(
        read(&**b, s, x.ptr().offset(5), 3)? == vec![0xee; 3],
        || "slot write not seen via buffer VA".into(),
    )?;
    // Remap: replace the slot's memory with another buffer's.
    let y = a.alloc(2 * g).ctx("alloc")?;
    b.memset_d8(y.ptr(), 0x77, 2 * g, s).ctx("fill y")?;
    b.stream_synchronize(s).ctx("sync")?;
    slot.unmap(g).ctx("unmap slot")?;
    slot.map_rw(g, y.phys(), y.phys_offset(), y.capacity())
        .ctx("remap slot")?;
    ensure(
        read(&**b, s, slot.base().offset(g + 2 * g - 8), 8)? == vec![0x77; 8],
        || "slot shows old data after remap".into(),
    )?;
    let mut expect = data[..16].to_vec();
    expect[5..8].fill(0xee);
    let got = read(&**b, s, x.ptr(), 16)?;
    ensure(got == expect, || format!("x changed by remap: {got:?}"))?;
    drop(slot);
    drop((x, y));
    drop(a);
    drop(sc);
    no_leaks(&ctx)
}

/// A buffer moved to host-located memory and back under its address keeps
/// its bytes, and the device reads and writes it there (what a program's
/// first run does under a device budget).
fn alloc_relocate<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let a = allocator(b)?;
    let ctx = a.context().clone();
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let mut x = a.alloc(2 * g).ctx("alloc")?;
    let data = pattern((2 * g) as usize, 7);
    b.write_sync(x.ptr(), &data, s).ctx("write")?;
    let (ptr, id) = (x.ptr(), x.allocation_id());
    match x.relocate(MemLocation::Host, s) {
        // No host-located VMM memory on this device (or driver): nothing
        // can move, nothing to check.
        Err(crate::DeviceError::Unsupported(why)) => {
            tracing::info!(%why, "alloc_relocate: no host-located memory here; skipped");
            return Ok(());
        }
        r => r.ctx("relocate to host memory")?,
    };
    ensure(
        x.ptr() == ptr && x.location() == MemLocation::Host && x.allocation_id() != id,
        || "relocated: same address, host memory, a new id".into(),
    )?;
    ensure(read(&**b, s, x.ptr(), data.len())? == data, || {
        "bytes changed by the move to host memory".into()
    })?;
    b.memset_d8(x.ptr().offset(g), 0x5a, 4, s)
        .ctx("write in host memory")?;
    x.relocate(MemLocation::Device, s).ctx("relocate back")?;
    let mut expect = data[g as usize..g as usize + 8].to_vec();
    expect[..4].fill(0x5a);
    let got = read(&**b, s, x.ptr().offset(g), 8)?;
    ensure(got == expect, || {
        format!("bytes after the way back: {got:?}")
    })?;
    ensure(x.location() == MemLocation::Device, || {
        "not in device memory after the way back".into()
    })?;
    drop(x);
    drop(a);
    drop(sc);
    no_leaks(&ctx)
}

/// Small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn alloc_10k<B: Backend>(b: &Arc<B>) -> R {
    let g = b.info().vmm_granularity;
    let a = allocator(b)?;
    let ctx = a.context().clone();
    let mut sc = Scope::new(&**b);
    let s = sc.stream()?;
    let s = &sc.streams[s];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut live: Vec<(crate::vmm::Buffer<B>, u64)> = Vec::new();
    let mut ops = 0u64;
    while ops < 10_000 {
        ops += 1;
        let r = rng.next();
        if live.len() < 8 || (r % 100 < 50 && live.len() < 64) {
            let size = match r % 4 {
                0 => 1 + (r >> 8) % 64,
                1 => 1 + (r >> 8) % (64 << 10),
                2 => 1 + (r >> 8) % (2 * g),
                _ => g * (1 + (r >> 8) % 3),
            };
            let x = a.alloc(size).ctx("alloc")?;
            let tag = r | 1;
            let n = x.size().min(8) as usize;
            b.write_sync(x.ptr(), &tag.to_le_bytes()[..n], s)
                .ctx("write tag")?;
            live.push((x, tag));
        } else {
            let i = ((r >> 16) % live.len() as u64) as usize;
            let (x, tag) = live.swap_remove(i);
            let n = x.size().min(8) as usize;
            let got = read(&**b, s, x.ptr(), n)?;
            ensure(got == tag.to_le_bytes()[..n], || {
                format!("op {ops}: buffer {x:?} lost its data")
            })?;
            if r & (1 << 40) != 0 {
                a.free(x, s).ctx("free on stream")?;
            } else {
                drop(x);
            }
        }
    }
    a.check_consistency()?;
    let st = a.stats();
    ensure(st.allocs_reused > st.allocs_fresh, || {
        format!("little reuse in 10k ops: {st:?}")
    })?;
    live.clear();
    b.stream_synchronize(s).ctx("sync")?;
    a.trim().ctx("trim")?;
    let st = a.stats();
    ensure(
        st.phys_handles == 0 && st.va_handles == 0 && st.buffers_live == 0,
        || format!("after trim: {st:?}"),
    )?;
    drop(a);
    drop(sc);
    no_leaks(&ctx)
}

//! VMM allocator on the host backend: ids, reuse, deferred frees,
//! sub-allocation, out of memory, teardown, statistics.

use std::sync::Arc;

use xla_vmm_device::vmm::VaReservation;
use xla_vmm_device::{Backend, DeviceError, HostBackend, HostConfig, VmmAllocator, VmmConfig};

const G: u64 = 64 << 10;

fn backend(capacity_granules: u64) -> Arc<HostBackend> {
    Arc::new(
        HostBackend::new(HostConfig {
            granularity: G,
            capacity: capacity_granules * G,
            ..HostConfig::default()
        })
        .unwrap(),
    )
}

fn allocator(b: &Arc<HostBackend>) -> VmmAllocator<HostBackend> {
    VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap()
}

const VMM_CALLS: [&str; 6] = [
    "mem_create",
    "mem_release",
    "va_reserve",
    "va_free",
    "map",
    "unmap",
];

fn vmm_calls(b: &HostBackend) -> u64 {
    VMM_CALLS.iter().map(|c| b.call_count(c)).sum::<u64>() + b.call_count("set_access")
}

#[test]
fn training_loop_lands_on_the_same_blocks_with_zero_vmm_calls() {
    let b = backend(256);
    let a = allocator(&b);
    let s = b.stream_create().unwrap();
    let sizes = [3 * G, G, 4, 5000, 2 * G - 1, G, 100];
    let mut steps = Vec::new();
    let mut vmm_after_step = Vec::new();
    for _step in 0..5 {
        let bufs: Vec<_> = sizes.iter().map(|&n| a.alloc(n).unwrap()).collect();
        steps.push(
            bufs.iter()
                .map(|x| (x.allocation_id(), x.ptr()))
                .collect::<Vec<_>>(),
        );
        for x in &bufs {
            b.memset_d8(x.ptr(), 1, x.size(), &s).unwrap();
        }
        for x in bufs {
            a.free(x, &s).unwrap();
        }
        b.stream_synchronize(&s).unwrap();
        vmm_after_step.push(vmm_calls(&b));
    }
    for step in &steps[1..] {
        assert_eq!(step, &steps[0], "a later step landed on other blocks");
    }
    assert!(vmm_after_step[0] > 0);
    assert!(
        vmm_after_step.windows(2).all(|w| w[0] == w[1]),
        "VMM calls after the first step: {vmm_after_step:?}"
    );
    let st = a.stats();
    assert_eq!(st.allocs_fresh, sizes.len() as u64);
    assert_eq!(st.allocs_reused, 4 * sizes.len() as u64);
    // Large blocks keep generations counting per reuse.
    let x = a.alloc(3 * G).unwrap();
    assert_eq!((x.allocation_id(), x.generation()), (steps[0][0].0, 5));
    drop(x);
    drop(a);
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn frees_wait_for_their_stream() {
    let b = backend(64);
    let a = allocator(&b);
    let s = b.stream_create().unwrap();
    let x = a.alloc(2 * G).unwrap();
    assert!(x.remappable());
    let (id, ptr) = (x.allocation_id(), x.ptr());
    b.hold_stream(&s).unwrap();
    b.memset_d8(x.ptr(), 7, 2 * G, &s).unwrap();
    a.free(x, &s).unwrap();
    assert_eq!(a.stats().pending_frees, 1);
    let y = a.alloc(2 * G).unwrap();
    assert_ne!(
        y.allocation_id(),
        id,
        "block reused before its free event completed"
    );
    // The queued memset still writes the freed (not reused) block.
    b.release_stream(&s).unwrap();
    assert_eq!(b.peek(ptr, 4).unwrap(), vec![7; 4]);
    let z = a.alloc(2 * G).unwrap();
    assert_eq!((z.allocation_id(), z.generation()), (id, 1));
    assert_eq!(a.stats().pending_frees, 0);
    // Trim keeps pending blocks.
    b.hold_stream(&s).unwrap();
    a.free(z, &s).unwrap();
    assert_eq!(a.trim().unwrap(), 0);
    assert_eq!(a.stats().cached_blocks, 1);
    b.release_stream(&s).unwrap();
    assert_eq!(a.trim().unwrap(), 2 * G);
    drop(y);
    drop(a);
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn teardown_waits_and_drops_pending_frees() {
    let b = backend(64);
    let s = b.stream_create().unwrap();
    let a = allocator(&b);
    let ctx = a.context().clone();
    let x = a.alloc(G).unwrap();
    a.free(x, &s).unwrap();
    drop(a);
    assert!(ctx.take_deferred_errors().is_empty());
    assert_eq!(b.outstanding().events, 0);
    assert_eq!(b.outstanding().phys_handles, 0);
    // A pending free at teardown (stream held): the wait fails and is
    // recorded, the memory is still released.
    let a = allocator(&b);
    let ctx = a.context().clone();
    b.hold_stream(&s).unwrap();
    let x = a.alloc(G).unwrap();
    a.free(x, &s).unwrap();
    drop(a);
    let errs = ctx.take_deferred_errors();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(b.outstanding().phys_handles, 0);
    b.release_stream(&s).unwrap();
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn small_buffers_share_granules() {
    let b = backend(64);
    let a = allocator(&b);
    let bufs: Vec<_> = (0..1000)
        .map(|i| a.alloc(4 + (i % 3) * 4).unwrap())
        .collect();
    let st = a.stats();
    // 256-byte slots: 256 per 64 KiB granule -> 4 granules for 1000 scalars.
    assert_eq!(st.granules, 4, "{st:?}");
    assert_eq!(st.phys_handles, 4);
    assert!(bufs.iter().all(|x| !x.remappable() && x.capacity() == 256));
    let mut ptrs: Vec<_> = bufs.iter().map(|x| x.ptr().0).collect();
    ptrs.sort();
    assert!(
        ptrs.windows(2).all(|w| w[1] - w[0] >= 256),
        "overlapping slots"
    );
    let a64k = a.alloc(64 << 10).unwrap();
    assert!(!a64k.remappable(), "threshold is inclusive");
    let big = a.alloc((64 << 10) + 1).unwrap();
    assert!(big.remappable());
    assert_eq!(bufs[10].phys_offset() % 256, 0);
    drop(bufs);
    a.check_consistency().unwrap();
    assert!(a.trim().unwrap() >= 4 * G);
    assert_eq!(a.stats().granules, 1, "the 64 KiB buffer's granule stays");
    drop((a64k, big, a));
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn threshold_zero_never_sub_allocates() {
    let b = backend(64);
    let a = VmmAllocator::new(
        b.clone(),
        VmmConfig {
            small_threshold: 0,
            ..VmmConfig::default()
        },
    )
    .unwrap();
    let x = a.alloc(4).unwrap();
    assert!(x.remappable());
    assert_eq!(x.capacity(), G);
    assert_eq!(a.stats().granules, 0);
    assert!(
        VmmAllocator::new(
            b.clone(),
            VmmConfig {
                small_threshold: 2 * G,
                ..VmmConfig::default()
            }
        )
        .is_err(),
        "threshold above the granularity"
    );
}

#[test]
fn out_of_memory_trims_the_cache_then_fails_cleanly() {
    let b = backend(8);
    // No host memory to go to past the device (that is tests/budget.rs).
    b.budget().set_limits(xla_vmm_device::MemoryLimits {
        device: None,
        host: Some(0),
        staging_reserve: Some(0),
    });
    let a = allocator(&b);
    let x = a.alloc(4 * G).unwrap();
    drop(x);
    assert_eq!(a.stats().bytes_physical, 4 * G);
    // 6 granules do not fit next to the cached 4: trimmed and retried.
    let y = a.alloc(6 * G).unwrap();
    assert_eq!(a.stats().cached_blocks, 0);
    match a.alloc(4 * G) {
        Err(DeviceError::OutOfMemory { .. }) => {}
        other => panic!("expected out of memory, got {other:?}"),
    }
    a.check_consistency().unwrap();
    assert_eq!(a.stats().buffers_live, 1);
    drop(y);
    let z = a.alloc(8 * G).unwrap();
    drop((z, a));
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn remapped_physical_memory_outlives_the_allocator_cache() {
    let b = backend(64);
    let s = b.stream_create().unwrap();
    let a = allocator(&b);
    let ctx = a.context().clone();
    let x = a.alloc(2 * G).unwrap();
    b.write_sync(x.ptr().offset(G), b"through x", &s).unwrap();
    let mut slot = VaReservation::reserve(&ctx, 8 * G, 0).unwrap();
    slot.map_rw(4 * G, x.phys(), x.phys_offset(), x.capacity())
        .unwrap();
    let mut out = [0u8; 9];
    b.read_sync(&mut out, slot.base().offset(5 * G), &s)
        .unwrap();
    assert_eq!(&out, b"through x");
    // Map the same block again over a mapped range: refused.
    assert!(slot.map(4 * G, x.phys(), 0, G).is_err());
    drop(x);
    a.trim().unwrap();
    // The allocator released its block; the slot's mapping keeps the memory.
    assert_eq!(a.stats().cached_blocks, 0);
    b.read_sync(&mut out, slot.base().offset(5 * G), &s)
        .unwrap();
    assert_eq!(&out, b"through x");
    assert_eq!(ctx.handle_counts().phys_handles, 1);
    drop(slot);
    drop(a);
    assert_eq!(ctx.handle_counts(), Default::default());
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn errors_in_drop_are_recorded() {
    let b = backend(64);
    let a = allocator(&b);
    let x = a.alloc(G).unwrap();
    drop(x);
    b.inject_failure("mem_release", 1);
    let ctx = a.context().clone();
    drop(a);
    let errs = ctx.take_deferred_errors();
    assert_eq!(errs.len(), 1);
    assert!(matches!(
        errs[0],
        DeviceError::Driver {
            call: "mem_release",
            ..
        }
    ));
    assert!(ctx.take_deferred_errors().is_empty(), "taken once");
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn stats_track_use_and_peaks() {
    let b = backend(64);
    let a = allocator(&b);
    let x = a.alloc(G + 1).unwrap();
    let y = a.alloc(10).unwrap();
    let st = a.stats();
    assert_eq!(st.bytes_in_use, G + 11);
    assert_eq!(st.bytes_physical, 3 * G, "2 granules for x, 1 pooled for y");
    assert_eq!(st.bytes_mapped, 3 * G);
    assert_eq!(st.bytes_reserved, 3 * G);
    assert_eq!((st.phys_handles, st.va_handles, st.buffers_live), (2, 2, 2));
    drop(x);
    let st = a.stats();
    assert_eq!((st.bytes_in_use, st.bytes_in_use_peak), (10, G + 11));
    assert_eq!(
        (st.buffers_live, st.buffers_live_peak, st.cached_blocks),
        (1, 2, 1)
    );
    a.trim().unwrap();
    let st = a.stats();
    assert_eq!((st.bytes_physical, st.bytes_physical_peak), (G, 3 * G));
    drop(y);
}

#[test]
fn ten_thousand_mixed_ops_with_held_streams_do_not_leak() {
    let b = backend(512);
    let (s1, s2) = (b.stream_create().unwrap(), b.stream_create().unwrap());
    let a = allocator(&b);
    let mut live = Vec::new();
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut held = false;
    for op in 0..10_000u32 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let r = seed;
        if r.is_multiple_of(97) {
            if held {
                b.release_stream(&s1).unwrap();
            } else {
                b.hold_stream(&s1).unwrap();
            }
            held = !held;
        }
        if live.len() < 4 || (r.is_multiple_of(2) && live.len() < 48) {
            let size = match (r >> 3) % 3 {
                0 => 1 + (r >> 8) % 512,
                1 => 1 + (r >> 8) % (3 * G),
                _ => G * (1 + (r >> 8) % 2),
            };
            let x = a.alloc(size).unwrap();
            let tag = (op as u64) << 8 | 0x5a;
            let n = x.size().min(8) as usize;
            b.poke(x.ptr(), &tag.to_le_bytes()[..n]).unwrap();
            live.push((x, tag));
        } else {
            let i = (r >> 20) as usize % live.len();
            let (x, tag) = live.swap_remove(i);
            let n = x.size().min(8) as usize;
            assert_eq!(
                b.peek(x.ptr(), n).unwrap(),
                tag.to_le_bytes()[..n],
                "op {op}"
            );
            match (r >> 30) % 3 {
                0 => a.free(x, &s1).unwrap(),
                1 => a.free(x, &s2).unwrap(),
                _ => drop(x),
            }
        }
        if op % 1000 == 0 {
            a.check_consistency().unwrap();
        }
    }
    a.check_consistency().unwrap();
    let ids: std::collections::HashSet<_> = live.iter().map(|(x, _)| x.allocation_id()).collect();
    assert_eq!(
        ids.len(),
        live.len(),
        "two live buffers share an allocation id"
    );
    live.clear();
    if held {
        b.release_stream(&s1).unwrap();
    }
    let st = a.stats();
    assert_eq!(st.buffers_live, 0);
    assert!(st.allocs_reused > st.allocs_fresh, "{st:?}");
    a.trim().unwrap();
    assert_eq!(a.stats().phys_handles, 0);
    drop(a);
    b.stream_destroy(s1).unwrap();
    b.stream_destroy(s2).unwrap();
    assert_eq!(b.outstanding().total(), 0, "{:?}", b.outstanding());
}

#[test]
fn allocator_types_are_thread_safe() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<VmmAllocator<HostBackend>>();
    assert_send_sync::<xla_vmm_device::Buffer<HostBackend>>();
    assert_send_sync::<VaReservation<HostBackend>>();
    assert_send_sync::<HostBackend>();
    let b = backend(256);
    let a = allocator(&b);
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let a = a.clone();
            sc.spawn(move || {
                for i in 0..200 {
                    let x = a.alloc(1 + (t * 1000 + i) % (3 * G)).unwrap();
                    drop(x);
                }
            });
        }
    });
    a.check_consistency().unwrap();
    assert_eq!(a.stats().buffers_live, 0);
    drop(a);
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn free_all_orders_many_buffers_with_one_event() {
    let b = backend(64);
    let a = allocator(&b);
    let s = b.stream_create().unwrap();
    let bufs: Vec<_> = [2 * G, 2 * G, 100, 3 * G]
        .iter()
        .map(|&n| a.alloc(n).unwrap())
        .collect();
    let ids: Vec<_> = bufs.iter().map(|x| x.allocation_id()).collect();
    b.hold_stream(&s).unwrap();
    let records = b.call_count("event_record");
    a.free_all(bufs, &s).unwrap();
    assert_eq!(b.call_count("event_record"), records + 1);
    let st = a.stats();
    assert_eq!(
        (st.pending_frees, st.event_handles, st.buffers_live),
        (4, 1, 0)
    );
    let fresh = a.alloc(2 * G).unwrap();
    assert!(
        !ids.contains(&fresh.allocation_id()),
        "reused before the event"
    );
    b.release_stream(&s).unwrap();
    let again: Vec<_> = [2 * G, 2 * G, 100, 3 * G]
        .iter()
        .map(|&n| a.alloc(n).unwrap())
        .collect();
    assert_eq!(
        again.iter().map(|x| x.allocation_id()).collect::<Vec<_>>(),
        ids
    );
    // One query saw the shared event complete; the event went back to the pool.
    let st = a.stats();
    assert_eq!((st.pending_frees, st.event_handles), (0, 1));
    drop((again, fresh));
    a.trim().unwrap();
    assert_eq!(a.stats().event_handles, 0);
    drop(a);
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

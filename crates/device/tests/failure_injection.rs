//! Injected failure of every driver call the allocator makes: for each N,
//! the Nth call of a scenario fails; the error must surface (returned or
//! recorded), the allocator must stay consistent and usable, and teardown
//! must leave no handle behind.

use std::sync::Arc;

use xla_vmm_device::vmm::{Buffer, VaReservation};
use xla_vmm_device::{
    Backend, DeviceError, HostBackend, HostConfig, Result, VmmAllocator, VmmConfig,
};

const G: u64 = 64 << 10;

type Stream = <HostBackend as Backend>::Stream;

fn backend() -> Arc<HostBackend> {
    Arc::new(
        HostBackend::new(HostConfig {
            granularity: G,
            capacity: 64 * G,
            ..HostConfig::default()
        })
        .unwrap(),
    )
}

/// Exercises every allocator path: fresh large/small, stream-ordered free,
/// reuse, immediate free, trim, remap of a buffer's physical memory.
fn scenario(a: &VmmAllocator<HostBackend>, b: &HostBackend, s: &Stream) -> Result<()> {
    let x = a.alloc(3 * G - 7)?;
    b.write_sync(x.ptr(), &[1, 2, 3, 4], s)?;
    let mut small: Vec<Buffer<HostBackend>> = Vec::new();
    for i in 0..3 {
        small.push(a.alloc(4 + 100 * i)?);
    }
    let y = a.alloc(G)?;
    a.free(x, s)?;
    b.stream_synchronize(s)?;
    let x2 = a.alloc(3 * G)?;
    drop(small.remove(0));
    if let Some(last) = small.pop() {
        a.free(last, s)?;
    }
    let z = a.alloc(200)?;
    a.trim()?;
    drop(y);
    a.trim()?;
    let mut slot = VaReservation::reserve(a.context(), 4 * G, 0)?;
    slot.map_rw(G, x2.phys(), x2.phys_offset(), x2.capacity())?;
    let mut out = [0u8; 4];
    b.read_sync(&mut out, slot.base().offset(G), s)?;
    slot.unmap(G)?;
    slot.release()?;
    a.free_all([z, x2], s)?;
    Ok(())
}

fn is_injected(e: &DeviceError) -> bool {
    matches!(e, DeviceError::Driver { code: 999, .. })
}

/// Calls made by the scenario plus allocator teardown, without failures.
fn clean_call_count() -> u64 {
    let b = backend();
    let s = b.stream_create().unwrap();
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let before = b.total_calls();
    scenario(&a, &b, &s).unwrap();
    drop(a);
    let n = b.total_calls() - before;
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
    n
}

#[test]
fn every_driver_call_can_fail_without_leaks() {
    let total = clean_call_count();
    assert!(total > 30, "scenario makes only {total} calls");
    eprintln!("scenario + teardown: {total} driver calls");
    let mut seen_calls = std::collections::BTreeSet::new();
    for n in 1..=total {
        let b = backend();
        let s = b.stream_create().unwrap();
        let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
        let ctx = a.context().clone();
        let counts_before = b.call_counts();
        b.inject_failure("*", n);
        let r = scenario(&a, &b, &s);
        let fired_in_scenario = b.injections_armed() == 0;
        a.check_consistency()
            .unwrap_or_else(|e| panic!("call {n}: inconsistent after failure: {e}"));
        let mut deferred = Vec::new();
        if fired_in_scenario {
            deferred.extend(ctx.take_deferred_errors());
            let surfaced =
                r.as_ref().err().is_some_and(is_injected) || deferred.iter().any(is_injected);
            assert!(
                surfaced,
                "call {n}: injected failure was swallowed (result {r:?})"
            );
            // Still usable: allocate, write, read, free.
            let x = a.alloc(2 * G).unwrap();
            b.write_sync(x.ptr().offset(G), b"ok", &s).unwrap();
            let mut out = [0u8; 2];
            b.read_sync(&mut out, x.ptr().offset(G), &s).unwrap();
            assert_eq!(&out, b"ok");
            a.free(x, &s).unwrap();
            drop(a);
        } else {
            r.unwrap_or_else(|e| panic!("call {n}: scenario failed without an injection: {e}"));
            drop(a);
            assert_eq!(b.injections_armed(), 0, "call {n} was never made");
            deferred.extend(ctx.take_deferred_errors());
            assert!(
                deferred.iter().any(is_injected),
                "call {n}: teardown failure not recorded"
            );
        }
        let after = b.call_counts();
        for (name, c) in &after {
            if counts_before.get(name) != Some(c) {
                seen_calls.insert(*name);
            }
        }
        b.stream_synchronize(&s).unwrap();
        b.stream_destroy(s).unwrap();
        let c = ctx.handle_counts();
        assert_eq!(
            (c.phys_handles, c.va_handles, c.mapped_bytes),
            (0, 0, 0),
            "call {n}: {c:?}"
        );
        assert_eq!(
            b.outstanding().total(),
            0,
            "call {n}: leak {:?}",
            b.outstanding()
        );
    }
    for call in [
        "mem_create",
        "mem_release",
        "va_reserve",
        "va_free",
        "map",
        "unmap",
        "set_access",
        "event_create",
        "event_record",
        "event_query",
        "event_destroy",
    ] {
        assert!(seen_calls.contains(call), "{call} never exercised");
    }
}

#[test]
fn each_vmm_call_fails_individually() {
    // Targeted: the first call of each kind fails; the allocation fails
    // cleanly and the next one succeeds.
    for call in ["mem_create", "va_reserve", "map", "set_access"] {
        let b = backend();
        let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
        b.inject_failure(call, 1);
        let err = a.alloc(G).unwrap_err();
        assert!(
            matches!(err, DeviceError::Driver { call: c, .. } if c == call),
            "{call}: {err:?}"
        );
        assert_eq!(a.stats().buffers_live, 0);
        let o = b.outstanding();
        assert_eq!(
            (o.phys_handles, o.va_ranges, o.mappings),
            (0, 0, 0),
            "{call}: {o:?}"
        );
        let x = a.alloc(G).unwrap();
        assert_eq!(x.generation(), 0);
        drop(x);
        drop(a);
        assert_eq!(b.outstanding().total(), 0);
    }
}

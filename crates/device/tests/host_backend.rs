//! Host backend: emulated VMM, failure modes, queues, graphs, kernels.

use std::sync::Arc;

use xla_vmm_device::host::{arg_ptr, arg_u32, HostKernelFn};
use xla_vmm_device::MemLocation;
use xla_vmm_device::{
    Backend, DeviceError, DevicePtr, EventStatus, HostBackend, HostConfig, ImageKind, LaunchConfig,
};

const G: u64 = 64 << 10;

fn backend() -> HostBackend {
    HostBackend::new(HostConfig {
        granularity: G,
        capacity: 64 * G,
        ..HostConfig::default()
    })
    .unwrap()
}

fn is_invalid<T: std::fmt::Debug>(r: Result<T, DeviceError>) -> bool {
    matches!(r, Err(DeviceError::InvalidArgument(_)))
}

/// A mapped, accessible range of `n` granules: (phys, va, base).
fn mapped(
    b: &HostBackend,
    n: u64,
) -> (
    <HostBackend as Backend>::PhysMem,
    <HostBackend as Backend>::VaRange,
    DevicePtr,
) {
    let p = b.mem_create(n * G).unwrap();
    let v = b.va_reserve(n * G, 0).unwrap();
    b.map(&v, 0, &p, 0, n * G).unwrap();
    b.set_access(&v, 0, n * G).unwrap();
    let base = b.va_base(&v);
    (p, v, base)
}

fn teardown(
    b: &HostBackend,
    p: <HostBackend as Backend>::PhysMem,
    v: <HostBackend as Backend>::VaRange,
) {
    let n = b.va_size(&v);
    b.unmap(&v, 0, n).unwrap();
    b.va_free(v).unwrap();
    b.mem_release(p).unwrap();
}

#[test]
fn va_ranges_are_nonzero_aligned_and_not_reused() {
    let b = backend();
    let v1 = b.va_reserve(G, 0).unwrap();
    let base1 = b.va_base(&v1);
    assert!(base1.0 != 0 && base1.0.is_multiple_of(G));
    b.va_free(v1).unwrap();
    let v2 = b.va_reserve(G, 1 << 30).unwrap();
    let base2 = b.va_base(&v2);
    assert_ne!(base1, base2, "a freed range was handed out again at once");
    assert_eq!(base2.0 % (1 << 30), 0);
    assert!(
        is_invalid(b.va_reserve(G, 3 * G)),
        "non power of two alignment"
    );
    b.va_free(v2).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn vmm_misuse_is_an_error() {
    let b = backend();
    let s = b.stream_create().unwrap();
    assert!(is_invalid(b.mem_create(G + 1)), "misaligned create");
    assert!(is_invalid(b.mem_create(0)));
    let p = b.mem_create(2 * G).unwrap();
    let v = b.va_reserve(4 * G, 0).unwrap();
    let base = b.va_base(&v);
    assert!(is_invalid(b.map(&v, 1, &p, 0, G)), "misaligned offset");
    assert!(is_invalid(b.map(&v, 0, &p, 0, G / 2)), "misaligned size");
    assert!(
        is_invalid(b.map(&v, 3 * G, &p, 0, 2 * G)),
        "past the reservation"
    );
    assert!(
        is_invalid(b.map(&v, 0, &p, G, 2 * G)),
        "past the allocation"
    );
    b.map(&v, G, &p, 0, 2 * G).unwrap();
    assert!(is_invalid(b.map(&v, 2 * G, &p, 0, G)), "map over mapped");
    assert!(
        is_invalid(b.map(&v, 0, &p, 0, 2 * G)),
        "map overlapping the start"
    );
    // Access before set_access faults.
    assert!(is_invalid(b.write_sync(base.offset(G), &[1], &s)));
    b.set_access(&v, G, 2 * G).unwrap();
    b.write_sync(base.offset(G), &[1], &s).unwrap();
    // Unmapped VA, outside any reservation, crossing into unmapped space.
    assert!(is_invalid(b.write_sync(base, &[1], &s)));
    assert!(is_invalid(b.write_sync(DevicePtr(8), &[1], &s)));
    assert!(is_invalid(b.write_sync(
        base.offset(3 * G - 2),
        &[1; 4],
        &s
    )));
    assert!(is_invalid(b.memset_d8(base, 0, 4, &s)));
    // Unmap of something not (exactly) mapped.
    assert!(is_invalid(b.unmap(&v, 0, G)), "unmap unmapped");
    assert!(is_invalid(b.unmap(&v, G, G)), "unmap part of a mapping");
    assert!(is_invalid(b.unmap(&v, 0, 3 * G)), "unmap with a gap");
    let v2 = b.va_reserve(G, 0).unwrap();
    b.map(&v2, 0, &p, 0, G).unwrap();
    assert!(is_invalid(b.va_free(v2)), "va_free while mapped");
    b.unmap(&v, G, 2 * G).unwrap();
    assert!(is_invalid(b.unmap(&v, G, 2 * G)), "double unmap");
    assert!(
        is_invalid(b.read_sync(&mut [0; 1], base.offset(G), &s)),
        "access after unmap"
    );
    b.va_free(v).unwrap();
    b.mem_release(p).unwrap();
    b.stream_destroy(s).unwrap();
    // The range leaked by the failed va_free above is still mapped.
    let o = b.outstanding();
    assert_eq!(
        (o.va_ranges, o.mappings, o.phys_handles, o.phys_allocations),
        (1, 1, 0, 1)
    );
}

#[test]
fn released_memory_lives_while_mapped() {
    let b = backend();
    let s = b.stream_create().unwrap();
    let (p, v, base) = mapped(&b, 1);
    b.write_sync(base, b"hello", &s).unwrap();
    b.mem_release(p).unwrap();
    let mut out = [0u8; 5];
    b.read_sync(&mut out, base, &s).unwrap();
    assert_eq!(&out, b"hello");
    assert_eq!(b.outstanding().phys_handles, 0);
    assert_eq!(b.outstanding().phys_allocations, 1);
    b.unmap(&v, 0, G).unwrap();
    assert_eq!(b.outstanding().phys_allocations, 0);
    assert_eq!(b.mem_info().unwrap().0, 64 * G);
    b.va_free(v).unwrap();
    b.stream_destroy(s).unwrap();
}

#[test]
fn out_of_memory_is_reported_and_recoverable() {
    let b = backend();
    // The whole emulated device for ordinary allocations (no staging reserve).
    b.budget().set_limits(xla_vmm_device::MemoryLimits {
        staging_reserve: Some(0),
        ..b.budget().limits()
    });
    let big = b.mem_create(60 * G).unwrap();
    assert_eq!(b.mem_info().unwrap(), (4 * G, 64 * G));
    match b.mem_create_at(8 * G, MemLocation::Device) {
        Err(DeviceError::OutOfMemory { bytes, .. }) => assert_eq!(bytes, 8 * G),
        other => panic!("expected out of memory, got {other:?}"),
    }
    // Placed by the budget, the same allocation goes to host memory.
    let spilled = b.mem_create(8 * G).unwrap();
    assert_eq!(b.mem_location(&spilled), MemLocation::Host);
    b.mem_release(spilled).unwrap();
    b.mem_release(big).unwrap();
    let p = b.mem_create(8 * G).unwrap();
    assert_eq!(b.mem_location(&p), MemLocation::Device);
    b.mem_release(p).unwrap();
    let u = b.budget().usage();
    assert_eq!((u.device_bytes, u.host_bytes), (0, 0));
}

#[test]
fn handles_are_checked_for_backend_and_liveness() {
    let a = backend();
    let b = backend();
    let pa = a.mem_create(G).unwrap();
    let vb = b.va_reserve(G, 0).unwrap();
    assert!(is_invalid(b.map(&vb, 0, &pa, 0, G)), "foreign phys handle");
    assert!(
        is_invalid(a.mem_release(b.mem_create(G).unwrap())),
        "foreign release"
    );
    let e = a.event_create().unwrap();
    let s = b.stream_create().unwrap();
    assert!(is_invalid(b.event_record(&e, &s)));
    a.event_destroy(e).unwrap();
    a.mem_release(pa).unwrap();
    b.va_free(vb).unwrap();
    b.stream_destroy(s).unwrap();
    assert_eq!(a.outstanding().total(), 0);
    // The foreign release above was refused: that allocation is still live.
    assert_eq!(b.outstanding().phys_handles, 1);
}

#[test]
fn injected_failure_hits_the_nth_call_and_counts() {
    let b = backend();
    b.inject_failure("mem_create", 2);
    let p1 = b.mem_create(G).unwrap();
    let err = b.mem_create(G).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Driver {
                call: "mem_create",
                ..
            }
        ),
        "{err:?}"
    );
    let p3 = b.mem_create(G).unwrap();
    assert_eq!(b.call_count("mem_create"), 3);
    b.inject_failure("*", 1);
    let err = b.mem_release(p1).unwrap_err();
    assert!(matches!(
        err,
        DeviceError::Driver {
            call: "mem_release",
            ..
        }
    ));
    // A consuming call that fails still released its handle.
    assert_eq!(b.outstanding().phys_handles, 1);
    // Non-consuming failures have no effect.
    let v = b.va_reserve(G, 0).unwrap();
    b.inject_failure("map", 1);
    assert!(b.map(&v, 0, &p3, 0, G).is_err());
    assert_eq!(b.outstanding().mappings, 0);
    b.map(&v, 0, &p3, 0, G).unwrap();
    b.unmap(&v, 0, G).unwrap();
    b.va_free(v).unwrap();
    b.mem_release(p3).unwrap();
    let counts = b.call_counts();
    assert_eq!(counts["map"], 2);
    assert_eq!(counts["unmap"], 1);
    assert_eq!(b.total_calls(), counts.values().sum::<u64>());
    b.inject_failure("va_free", 5);
    b.clear_injected_failures();
    let v = b.va_reserve(G, 0).unwrap();
    b.va_free(v).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

/// An untimed event orders and completes as a timed one does; timing a
/// span with it is refused (as CUDA refuses CU_EVENT_DISABLE_TIMING events).
#[test]
fn untimed_events_complete_but_are_never_timed() {
    let b = backend();
    let s = b.stream_create().unwrap();
    let (t, u) = (b.event_create().unwrap(), b.event_create_untimed().unwrap());
    b.hold_stream(&s).unwrap();
    b.event_record(&t, &s).unwrap();
    b.event_record(&u, &s).unwrap();
    assert_eq!(b.event_query(&u).unwrap(), EventStatus::Pending);
    b.release_stream(&s).unwrap();
    b.event_synchronize(&u).unwrap();
    assert_eq!(b.event_query(&u).unwrap(), EventStatus::Complete);
    assert!(b.event_elapsed_ms(&t, &t).is_ok());
    assert!(is_invalid(b.event_elapsed_ms(&t, &u)));
    assert!(is_invalid(b.event_elapsed_ms(&u, &t)));
    b.event_destroy(t).unwrap();
    b.event_destroy(u).unwrap();
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn held_stream_queues_work_and_events_stay_pending() {
    let b = backend();
    let (s1, s2) = (b.stream_create().unwrap(), b.stream_create().unwrap());
    let e = b.event_create().unwrap();
    let (p, v, base) = mapped(&b, 1);
    b.hold_stream(&s1).unwrap();
    b.memset_d8(base, 9, 16, &s1).unwrap();
    b.event_record(&e, &s1).unwrap();
    assert_eq!(b.event_query(&e).unwrap(), EventStatus::Pending);
    assert!(b.event_synchronize(&e).is_err(), "would block forever");
    b.stream_wait_event(&s2, &e).unwrap();
    b.copy_d2d(base.offset(100), base, 16, &s2).unwrap();
    assert_eq!(
        b.peek(base.offset(100), 16).unwrap(),
        vec![0; 16],
        "s2 ran before s1's event"
    );
    assert!(b.stream_synchronize(&s2).is_err());
    b.release_stream(&s1).unwrap();
    assert_eq!(b.event_query(&e).unwrap(), EventStatus::Complete);
    b.stream_synchronize(&s2).unwrap();
    assert_eq!(b.peek(base.offset(100), 16).unwrap(), vec![9; 16]);
    // An error of queued work is reported by the next synchronize.
    b.hold_stream(&s1).unwrap();
    b.memset_d8(DevicePtr(16), 1, 1, &s1).unwrap();
    b.release_stream(&s1).unwrap();
    assert!(is_invalid(b.stream_synchronize(&s1)));
    b.stream_synchronize(&s1).unwrap();
    // Unmapping while queued work uses the range: the work faults later.
    b.hold_stream(&s1).unwrap();
    b.memset_d8(base, 1, 1, &s1).unwrap();
    b.unmap(&v, 0, G).unwrap();
    b.release_stream(&s1).unwrap();
    assert!(is_invalid(b.stream_synchronize(&s1)));
    b.va_free(v).unwrap();
    b.mem_release(p).unwrap();
    b.event_destroy(e).unwrap();
    b.stream_destroy(s1).unwrap();
    b.stream_destroy(s2).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn pinned_copies_are_ordered() {
    let b = backend();
    let s = b.stream_create().unwrap();
    let (p, v, base) = mapped(&b, 1);
    let mut h = b.host_alloc(64).unwrap();
    b.host_bytes_mut(&mut h).copy_from_slice(&[5; 64]);
    let out = b.host_alloc(64).unwrap();
    b.hold_stream(&s).unwrap();
    b.copy_h2d(base, &h, 0, 64, &s).unwrap();
    b.copy_d2h(&out, 0, base, 64, &s).unwrap();
    assert_eq!(b.host_bytes(&out), &[0; 64][..], "queued copy ran early");
    b.release_stream(&s).unwrap();
    b.stream_synchronize(&s).unwrap();
    assert_eq!(b.host_bytes(&out), &[5; 64][..]);
    assert!(
        is_invalid(b.copy_h2d(base, &h, 60, 8, &s)),
        "host range out of bounds"
    );
    b.host_free(h).unwrap();
    b.host_free(out).unwrap();
    teardown(&b, p, v);
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

/// `saxpy(n, a, x, y)`: y[i] = a * x[i] + y[i] (f32), with `a` as u32 bits.
fn saxpy() -> HostKernelFn {
    Arc::new(|ctx, args, _cfg| {
        let n = arg_u32(args, 0)? as usize;
        let a = f32::from_bits(arg_u32(args, 1)?);
        let (x, y) = (arg_ptr(args, 2)?, arg_ptr(args, 3)?);
        let xs = ctx.read_f32(x, n)?;
        let ys = ctx.read_f32(y, n)?;
        let out: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| a * x + y).collect();
        ctx.write_f32(y, &out)
    })
}

/// `dec(p)`: decrement the u8 at p (a loop counter for WHILE tests).
fn dec() -> HostKernelFn {
    Arc::new(|ctx, args, _cfg| {
        let p = arg_ptr(args, 0)?;
        let v = ctx.read_vec(p, 1)?[0];
        ctx.write(p, &[v.saturating_sub(1)])
    })
}

fn cfg() -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        ..LaunchConfig::default()
    }
}

#[test]
fn host_kernels_launch_and_replay_in_graphs() {
    let b = backend();
    b.register_kernel("saxpy", saxpy());
    b.register_kernel("dec", dec());
    assert!(is_invalid(b.module_load(b"nope\n", ImageKind::Host)));
    assert!(matches!(
        b.module_load(b"saxpy", ImageKind::Cubin),
        Err(DeviceError::Unsupported(_))
    ));
    let m = b
        .module_load(b"# test module\nsaxpy\ndec\n", ImageKind::Host)
        .unwrap();
    let f = b.module_function(&m, "saxpy").unwrap();
    assert!(is_invalid(b.module_function(&m, "other")));
    let s = b.stream_create().unwrap();
    let (p, v, base) = mapped(&b, 1);
    let (x, y) = (base, base.offset(1024));
    let xs: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    b.write_sync(x, &xs, &s).unwrap();
    b.write_sync(y, &[0; 32], &s).unwrap();
    let n = 8u32.to_le_bytes();
    let a = 2.0f32.to_bits().to_le_bytes();
    let (xa, ya) = (x.0.to_le_bytes(), y.0.to_le_bytes());
    let args: [&[u8]; 4] = [&n, &a, &xa, &ya];
    b.launch(&f, &cfg(), &args, &s).unwrap();
    let read_y = || {
        let mut out = [0u8; 32];
        b.read_sync(&mut out, y, &s).unwrap();
        out.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(read_y(), (0..8).map(|i| 2.0 * i as f32).collect::<Vec<_>>());
    // Captured launches do not run; every replay runs them again.
    b.stream_begin_capture(&s).unwrap();
    b.launch(&f, &cfg(), &args, &s).unwrap();
    assert!(b.stream_synchronize(&s).is_err(), "sync inside capture");
    let g = b.stream_end_capture(&s).unwrap();
    assert_eq!(read_y()[1], 2.0);
    let exec = b.graph_instantiate(&g).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    assert_eq!(read_y()[1], 6.0);
    // Kernel errors surface; bad geometry is refused.
    let bad = 16u64.to_le_bytes();
    assert!(is_invalid(b.launch(&f, &cfg(), &[&n, &a, &bad, &ya], &s)));
    assert!(is_invalid(b.launch(
        &f,
        &LaunchConfig::default(),
        &args,
        &s
    )));
    assert!(is_invalid(b.launch(&f, &cfg(), &[&n], &s)), "missing args");
    // A WHILE node runs its body until the predicate byte is zero.
    let d = b.module_function(&m, "dec").unwrap();
    let pred = base.offset(4096);
    let pa = pred.0.to_le_bytes();
    b.write_sync(pred, &[3], &s).unwrap();
    b.write_sync(y, &[0; 32], &s).unwrap();
    b.stream_begin_capture(&s).unwrap();
    b.capture_while(&s, pred, &mut |st| {
        b.launch(&f, &cfg(), &args, st)?;
        b.launch(&d, &cfg(), &[&pa], st)
    })
    .unwrap();
    let gw = b.stream_end_capture(&s).unwrap();
    let ew = b.graph_instantiate(&gw).unwrap();
    b.graph_launch(&ew, &s).unwrap();
    assert_eq!(read_y()[2], 3.0 * 4.0, "three iterations");
    assert!(!b.graph_exec_update(&ew, &g).unwrap(), "different topology");
    assert!(b.graph_exec_update(&exec, &g).unwrap());
    for x in [exec, ew] {
        b.graph_exec_destroy(x).unwrap();
    }
    b.graph_destroy(g).unwrap();
    b.graph_destroy(gw).unwrap();
    // Unloading the module makes its functions fail to run.
    b.module_unload(m).unwrap();
    assert!(is_invalid(b.launch(&f, &cfg(), &args, &s)));
    teardown(&b, p, v);
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

/// Kernel nodes are found in a captured graph (also inside a WHILE body) by
/// the function they launch, and updating one in an exec, or turning it off
/// or on, changes the launches that follow only: one already submitted (on
/// a held stream) runs with its old arguments and state.
#[test]
fn kernel_nodes_are_found_and_updated_for_later_launches_only() {
    let b = backend();
    b.register_kernel("saxpy", saxpy());
    b.register_kernel("dec", dec());
    let m = b.module_load(b"saxpy\ndec\n", ImageKind::Host).unwrap();
    let f = b.module_function(&m, "saxpy").unwrap();
    let d = b.module_function(&m, "dec").unwrap();
    let s = b.stream_create().unwrap();
    let (p, v, base) = mapped(&b, 1);
    let (x, y) = (base, base.offset(1024));
    let xs: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    b.write_sync(x, &xs, &s).unwrap();
    b.write_sync(y, &[0; 32], &s).unwrap();
    let n = 8u32.to_le_bytes();
    let (xa, ya) = (x.0.to_le_bytes(), y.0.to_le_bytes());
    let with_a = |a: f32| a.to_bits().to_le_bytes();
    let a1 = with_a(1.0);
    let pred = base.offset(4096);
    let pa = pred.0.to_le_bytes();
    b.stream_begin_capture(&s).unwrap();
    b.launch(&f, &cfg(), &[&n, &a1, &xa, &ya], &s).unwrap();
    b.capture_while(&s, pred, &mut |st| b.launch(&d, &cfg(), &[&pa], st))
        .unwrap();
    let g = b.stream_end_capture(&s).unwrap();
    let nodes = b.graph_kernel_nodes(&g, &f).unwrap();
    assert_eq!(nodes.len(), 1, "one saxpy node");
    assert_eq!(
        b.graph_kernel_nodes(&g, &d).unwrap().len(),
        1,
        "dec inside the WHILE body"
    );
    let exec = b.graph_instantiate(&g).unwrap();
    let y1 = |b: &HostBackend| {
        let mut out = [0u8; 8];
        b.read_sync(&mut out, y, &s).unwrap();
        f32::from_le_bytes(out[4..8].try_into().unwrap())
    };
    // Submitted while the stream is held: it keeps a = 1 although the node
    // is updated to a = 10 before it runs.
    b.hold_stream(&s).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    let a10 = with_a(10.0);
    b.graph_exec_kernel_update(&exec, &nodes[0], &f, &cfg(), &[&n, &a10, &xa, &ya])
        .unwrap();
    b.release_stream(&s).unwrap();
    assert_eq!(y1(&b), 1.0, "the launch already submitted ran with a = 1");
    b.graph_launch(&exec, &s).unwrap();
    assert_eq!(y1(&b), 11.0, "the next launch runs with a = 10");
    // Turned off, the node runs as nothing from the next launch on (one
    // already submitted runs it); updated while off it stays off; turned on
    // it runs with the arguments of its last update.
    b.hold_stream(&s).unwrap();
    b.graph_launch(&exec, &s).unwrap();
    b.graph_exec_node_set_enabled(&exec, &nodes[0], false)
        .unwrap();
    b.release_stream(&s).unwrap();
    assert_eq!(y1(&b), 21.0, "the launch submitted before ran the node");
    b.graph_launch(&exec, &s).unwrap();
    assert_eq!(y1(&b), 21.0, "off: nothing launched");
    b.graph_exec_kernel_update(&exec, &nodes[0], &f, &cfg(), &[&n, &a1, &xa, &ya])
        .unwrap();
    b.graph_launch(&exec, &s).unwrap();
    assert_eq!(y1(&b), 21.0, "updated while off, still off");
    b.graph_exec_node_set_enabled(&exec, &nodes[0], true)
        .unwrap();
    b.graph_launch(&exec, &s).unwrap();
    assert_eq!(y1(&b), 22.0, "on again, with a = 1");
    // The node must launch the function named; zero grids are refused.
    assert!(is_invalid(b.graph_exec_kernel_update(
        &exec,
        &nodes[0],
        &d,
        &cfg(),
        &[&pa]
    )));
    assert!(is_invalid(b.graph_exec_kernel_update(
        &exec,
        &nodes[0],
        &f,
        &LaunchConfig::default(),
        &[&n, &a10, &xa, &ya]
    )));
    b.graph_exec_destroy(exec).unwrap();
    b.graph_destroy(g).unwrap();
    b.module_unload(m).unwrap();
    teardown(&b, p, v);
    b.stream_destroy(s).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

#[test]
fn capture_forks_and_joins_through_events() {
    let b = backend();
    let (s1, s2) = (b.stream_create().unwrap(), b.stream_create().unwrap());
    let (fork, join) = (b.event_create().unwrap(), b.event_create().unwrap());
    let (p, v, base) = mapped(&b, 1);
    b.stream_begin_capture(&s1).unwrap();
    b.memset_d8(base, 1, 8, &s1).unwrap();
    b.event_record(&fork, &s1).unwrap();
    b.stream_wait_event(&s2, &fork).unwrap();
    b.copy_d2d(base.offset(64), base, 8, &s2).unwrap();
    b.event_record(&join, &s2).unwrap();
    b.stream_wait_event(&s1, &join).unwrap();
    let g = b.stream_end_capture(&s1).unwrap();
    assert_eq!(b.peek(base.offset(64), 8).unwrap(), vec![0; 8]);
    let e = b.graph_instantiate(&g).unwrap();
    b.graph_launch(&e, &s1).unwrap();
    b.stream_synchronize(&s1).unwrap();
    assert_eq!(b.peek(base.offset(64), 8).unwrap(), vec![1; 8]);
    // s2 left the capture: its work runs again.
    b.memset_d8(base, 2, 1, &s2).unwrap();
    assert_eq!(b.peek(base, 1).unwrap(), vec![2]);
    b.graph_exec_destroy(e).unwrap();
    b.graph_destroy(g).unwrap();
    teardown(&b, p, v);
    for ev in [fork, join] {
        b.event_destroy(ev).unwrap();
    }
    b.stream_destroy(s1).unwrap();
    b.stream_destroy(s2).unwrap();
    assert_eq!(b.outstanding().total(), 0);
}

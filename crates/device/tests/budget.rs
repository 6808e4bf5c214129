//! The device memory budget on the host backend: allocations past the
//! device budget are host-located at ordinary device addresses and keep
//! their bytes; past the host limit, out of memory with every live buffer
//! intact; the budget's counts return to zero.

use std::sync::Arc;

use xla_vmm_device::{
    Backend, DeviceError, HostBackend, HostConfig, MemLocation, MemoryLimits, VmmAllocator,
    VmmConfig,
};

const G: u64 = 64 << 10;

/// A host backend of `capacity` granules with `limits` on its budget.
fn host_backend(capacity: u64, limits: MemoryLimits) -> Arc<HostBackend> {
    let b = Arc::new(
        HostBackend::new(HostConfig {
            granularity: G,
            capacity: capacity * G,
            ..HostConfig::default()
        })
        .unwrap(),
    );
    b.budget().set_limits(limits);
    b
}

/// An allocator whose every buffer is its own physical block.
fn allocator(b: &Arc<HostBackend>) -> VmmAllocator<HostBackend> {
    VmmAllocator::new(
        b.clone(),
        VmmConfig {
            small_threshold: 0,
            ..VmmConfig::default()
        },
    )
    .unwrap()
}

fn setup(device: u64, host: u64, capacity: u64) -> (Arc<HostBackend>, VmmAllocator<HostBackend>) {
    let b = host_backend(
        capacity,
        MemoryLimits {
            device: Some(device * G),
            host: Some(host * G),
            staging_reserve: Some(0),
        },
    );
    let a = allocator(&b);
    (b, a)
}

fn fill(k: usize) -> Vec<u8> {
    (0..G as usize).map(|i| (i * 7 + k * 13) as u8).collect()
}

#[test]
fn past_the_device_budget_buffers_live_on_the_host_and_keep_their_bytes() {
    let (b, a) = setup(4, 3, 64);
    let s = b.stream_create().unwrap();
    let mut bufs = Vec::new();
    for k in 0..7 {
        let buf = a.alloc(G).unwrap();
        b.write_sync(buf.ptr(), &fill(k), &s).unwrap();
        bufs.push(buf);
    }
    let at: Vec<MemLocation> = bufs.iter().map(|x| x.phys().location()).collect();
    assert_eq!(&at[..4], &[MemLocation::Device; 4]);
    assert_eq!(&at[4..], &[MemLocation::Host; 3]);
    // Device code reaches host-located memory like any other: a copy across.
    b.copy_d2d(bufs[0].ptr(), bufs[6].ptr(), G, &s).unwrap();
    let u = b.budget().usage();
    assert_eq!((u.device_bytes, u.host_bytes, u.spilled), (4 * G, 3 * G, 3));

    // Past the host limit: out of memory, naming both limits, and nothing lost.
    let e = a.alloc(G).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("XLA_VMM_HOST_MEMORY_LIMIT") && msg.contains("host"),
        "{msg}"
    );
    for (k, buf) in bufs.iter().enumerate() {
        let mut got = vec![0u8; G as usize];
        b.read_sync(&mut got, buf.ptr(), &s).unwrap();
        assert_eq!(got, fill(if k == 0 { 6 } else { k }), "buffer {k}");
    }

    // Freed device memory is used again before any more host memory.
    let freed = bufs.remove(1);
    a.free(freed, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    let again = a.alloc(G).unwrap();
    assert_eq!(again.phys().location(), MemLocation::Device);
    bufs.push(again);
    drop(bufs);
    a.trim().unwrap();
    let u = b.budget().usage();
    assert_eq!((u.device_bytes, u.host_bytes), (0, 0), "{u:?}");
    assert_eq!((u.device_peak_bytes, u.host_peak_bytes), (4 * G, 3 * G));
    b.stream_destroy(s).unwrap();
}

#[test]
fn a_full_device_spills_without_a_limit_and_no_host_memory_means_out_of_memory() {
    // The emulated device holds 2 granules; no device limit of ours.
    let b = host_backend(
        2,
        MemoryLimits {
            device: None,
            host: Some(G),
            staging_reserve: Some(0),
        },
    );
    let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
    let x = a.alloc(2 * G).unwrap();
    let y = a.alloc(G).unwrap();
    assert_eq!(x.phys().location(), MemLocation::Device);
    assert_eq!(y.phys().location(), MemLocation::Host, "the device is full");
    drop((x, y));
    a.trim().unwrap();
    b.budget().set_limits(MemoryLimits {
        device: Some(G),
        host: Some(0),
        staging_reserve: Some(0),
    });
    let _x = a.alloc(G).unwrap();
    let e = a.alloc(G).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    // Placing at a location obeys that location's limit alone.
    assert!(b.mem_create_at(G, MemLocation::Host).is_err());
}

#[test]
fn ordinary_allocations_leave_the_staging_reserve_to_explicit_device_memory() {
    let b = host_backend(
        64,
        MemoryLimits {
            device: Some(4 * G),
            host: Some(8 * G),
            staging_reserve: Some(50),
        },
    );
    let a = allocator(&b);
    let bufs: Vec<_> = (0..3).map(|_| a.alloc(G).unwrap()).collect();
    let at: Vec<MemLocation> = bufs.iter().map(|x| x.phys().location()).collect();
    assert_eq!(
        at,
        [MemLocation::Device, MemLocation::Device, MemLocation::Host]
    );
    // The reserve is there for memory asked of the device by name.
    let area = b.mem_create_at(2 * G, MemLocation::Device).unwrap();
    assert!(
        b.mem_create_at(G, MemLocation::Device).is_err(),
        "the limit holds"
    );
    b.mem_release(area).unwrap();
}

#[test]
fn a_cached_block_in_host_memory_is_not_reused_while_the_device_has_room() {
    let (b, a) = setup(2, 4, 64);
    let s = b.stream_create().unwrap();
    let at = |x: &xla_vmm_device::Buffer<HostBackend>| x.phys().location();
    let (d0, mut d1, h) = (
        a.alloc(G).unwrap(),
        a.alloc(G).unwrap(),
        a.alloc(G).unwrap(),
    );
    assert_eq!(
        (at(&d0), at(&d1), at(&h)),
        (MemLocation::Device, MemLocation::Device, MemLocation::Host)
    );
    // Freed first, the host block heads the cache; the device block behind
    // it is taken.
    a.free(h, &s).unwrap();
    a.free(d0, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    let x = a.alloc(G).unwrap();
    assert_eq!(at(&x), MemLocation::Device);
    // A buffer moved to host memory and freed: two host blocks cached, and
    // the device has room again. The oldest goes and a device block is made.
    assert!(d1.relocate(MemLocation::Host, &s).unwrap());
    a.free(d1, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    let y = a.alloc(G).unwrap();
    assert_eq!(at(&y), MemLocation::Device);
    let u = b.budget().usage();
    assert_eq!((u.device_bytes, u.host_bytes), (2 * G, G), "{u:?}");
    // With the device full, the cached host block is used again.
    let z = a.alloc(G).unwrap();
    assert_eq!(at(&z), MemLocation::Host);
    assert_eq!(b.budget().usage().host_bytes, G);
    drop((x, y, z));
    a.trim().unwrap();
    b.stream_destroy(s).unwrap();
}

#[test]
fn a_buffer_mapped_elsewhere_says_so() {
    // A VA-stable graph's reservation maps the buffer's memory: moving it
    // would free nothing until that mapping goes.
    let (b, a) = setup(2, 2, 64);
    let buf = a.alloc(G).unwrap();
    assert!(!buf.held_elsewhere());
    let mut other = xla_vmm_device::vmm::VaReservation::reserve(a.context(), G, 0).unwrap();
    other.map_rw(0, buf.phys(), 0, G).unwrap();
    assert!(buf.held_elsewhere());
    other.release().unwrap();
    assert!(!buf.held_elsewhere());
    // A binding's handle holds it too.
    let handle = buf.phys().clone();
    assert!(buf.held_elsewhere());
    drop(handle);
    assert!(!buf.held_elsewhere());
    drop(buf);
    drop(b);
}

#[test]
fn a_buffer_moves_between_device_and_host_memory_under_its_address_with_its_bytes() {
    let (b, a) = setup(2, 2, 64);
    let s = b.stream_create().unwrap();
    let mut buf = a.alloc(G).unwrap();
    b.write_sync(buf.ptr(), &fill(3), &s).unwrap();
    let (ptr, id) = (buf.ptr(), buf.allocation_id());
    assert_eq!(buf.location(), MemLocation::Device);
    assert!(buf.relocate(MemLocation::Host, &s).unwrap());
    assert!(
        !buf.relocate(MemLocation::Host, &s).unwrap(),
        "there already"
    );
    // Same address, same bytes, new memory (a new id, generation 0).
    assert_eq!((buf.ptr(), buf.location()), (ptr, MemLocation::Host));
    assert_ne!(buf.allocation_id(), id);
    assert_eq!(buf.generation(), 0);
    let mut got = vec![0u8; G as usize];
    b.read_sync(&mut got, buf.ptr(), &s).unwrap();
    assert_eq!(got, fill(3));
    let u = b.budget().usage();
    assert_eq!(
        (u.device_bytes, u.host_bytes, u.relocated),
        (0, G, 1),
        "{u:?}"
    );
    // Back, and past the limit: out of memory, the buffer where it was.
    assert!(buf.relocate(MemLocation::Device, &s).unwrap());
    let (f0, f1) = (a.alloc(G).unwrap(), a.alloc(G).unwrap());
    assert_eq!(f1.location(), MemLocation::Host);
    drop(f0);
    let other = a.alloc(G).unwrap();
    assert_eq!(other.location(), MemLocation::Device);
    let mut h = f1;
    let e = h.relocate(MemLocation::Device, &s).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    assert_eq!(h.location(), MemLocation::Host);
    b.read_sync(&mut got, buf.ptr(), &s).unwrap();
    assert_eq!(got, fill(3));
    drop((buf, h, other));
    a.trim().unwrap();
    let u = b.budget().usage();
    assert_eq!((u.device_bytes, u.host_bytes), (0, 0), "{u:?}");
    b.stream_destroy(s).unwrap();
}

#[test]
fn a_move_that_fails_anywhere_leaves_the_buffer_where_it_was_with_its_bytes() {
    // Every driver call of a move, failing in turn: an error naming it, the
    // buffer at its address with its bytes, in device memory, and nothing
    // held (physical memory, address ranges, the budget) beyond it.
    for (call, nth) in [
        ("mem_create", 1),
        ("va_reserve", 1),
        ("map", 1),
        ("set_access", 1),
        ("copy_d2d", 1),
        ("stream_synchronize", 1),
        // The copy's scratch range, then the buffer's own mapping.
        ("unmap", 1),
        ("unmap", 2),
        ("map", 2),
        ("set_access", 2),
    ] {
        let (b, a) = setup(2, 2, 64);
        let s = b.stream_create().unwrap();
        let mut buf = a.alloc(G).unwrap();
        b.write_sync(buf.ptr(), &fill(5), &s).unwrap();
        let (ptr, id) = (buf.ptr(), buf.allocation_id());
        let held = (a.context().handle_counts(), b.budget().usage());
        b.inject_failure(call, nth);
        let e = buf.relocate(MemLocation::Host, &s);
        b.clear_injected_failures();
        assert!(e.is_err(), "{call} #{nth}: the move went through");
        assert_eq!(
            (buf.ptr(), buf.allocation_id(), buf.location()),
            (ptr, id, MemLocation::Device),
            "{call} #{nth}"
        );
        let mut got = vec![0u8; G as usize];
        b.read_sync(&mut got, buf.ptr(), &s).unwrap();
        assert_eq!(got, fill(5), "{call} #{nth}: bytes");
        let (counts, usage) = (a.context().handle_counts(), b.budget().usage());
        assert_eq!(counts, held.0, "{call} #{nth}: handles");
        assert_eq!(
            (usage.device_bytes, usage.host_bytes, usage.relocated),
            (held.1.device_bytes, held.1.host_bytes, 0),
            "{call} #{nth}: budget"
        );
        // And it still moves once the driver behaves.
        assert!(
            buf.relocate(MemLocation::Host, &s).unwrap(),
            "{call} #{nth}"
        );
        drop(buf);
        a.trim().unwrap();
        b.stream_destroy(s).unwrap();
    }
}

#[test]
fn a_block_whose_move_failed_twice_is_never_handed_out_again() {
    // The new memory cannot be mapped, and neither can the old one back:
    // the move fails with the range unmapped. Freed, the block must not go
    // back to the cache (the next buffer of its size would be unmapped).
    let (b, a) = setup(2, 2, 64);
    let s = b.stream_create().unwrap();
    let mut buf = a.alloc(G).unwrap();
    b.inject_failure("map", 2);
    b.inject_failure("map", 3);
    assert!(buf.relocate(MemLocation::Host, &s).is_err());
    b.clear_injected_failures();
    let broken = buf.ptr();
    drop(buf);
    assert_eq!(a.stats().quarantined, 1);
    let next = a.alloc(G).unwrap();
    assert_ne!(next.ptr(), broken, "the unmapped block was reused");
    b.write_sync(next.ptr(), &fill(9), &s).unwrap();
    let mut got = vec![0u8; G as usize];
    b.read_sync(&mut got, next.ptr(), &s).unwrap();
    assert_eq!(got, fill(9));
    drop(next);
    b.stream_destroy(s).unwrap();
}

//! The policy's shadow accounting is the runtime's: for a mixed slot list
//! (copy-only, sub-granule, exactly one granule, several granules, donated)
//! the shadow bytes the runtime allocates in VA-stable mode equal the
//! frozen plan's `shadow_bytes`, computed by the policy from the same slots
//! at the backend's granularity, and under auto they never exceed the cap.

mod common;

use common::*;
use std::sync::Arc;
use xla_vmm::*;
use xla_vmm_device::{Backend, HostBackend, MemoryLimits, VmmAllocator, VmmConfig};
use xla_vmm_policy::{decide, DeviceCosts, Knobs, PolicyInput, SlotInfo, Threshold};
use xla_vmm_runtime::{BindingConfig, BindingStats, Executable, Mode};

/// Parameter sizes: 16 B (sub-allocated: copy-only), 4 KiB, 64 KiB, 2 MiB
/// (one host granule), 3 MiB (two granules). Each is copied to an output
/// (read, never written). Parameter 5 is donated and aliased with output 5
/// and untouched (churn 0: skipped).
const SIZES: [u64; 5] = [16, 4 << 10, 64 << 10, 2 << 20, 3 << 20];
const DONATED: u64 = 64;

fn mixed_plan() -> Plan {
    let n = SIZES.len();
    let mut allocs = Vec::new();
    let mut params = Vec::new();
    let mut outs = Vec::new();
    let mut thunks = Vec::new();
    for (i, &s) in SIZES.iter().enumerate() {
        allocs.push(alloc(i, s, param(i as u64, false)));
        params.push(f32s(s as usize / 4));
    }
    for (i, &s) in SIZES.iter().enumerate() {
        allocs.push(alloc(n + i, s, AllocationRole::Output { outputs: vec![] }));
        thunks.push(copy("copy", sl(i, 0, s), sl(n + i, 0, s)));
        outs.push((n + i, f32s(s as usize / 4)));
    }
    allocs.push(alloc(2 * n, DONATED, param(n as u64, true)));
    params.push(f32s(DONATED as usize / 4));
    outs.push((2 * n, f32s(DONATED as usize / 4)));
    let seq = thunk("seq", ThunkKind::Sequential { thunks });
    plan(allocs, params, outs, vec![seq])
}

fn costs(free: u64, granularity: u64) -> DeviceCosts {
    DeviceCosts {
        remap_us: 46.0,
        copy_bw_bytes_per_s: 2.4e12,
        copy_launch_us: 4.0,
        free_bytes: free,
        total_bytes: 1 << 30,
        granularity_bytes: granularity,
    }
}

/// The policy's plan for the runtime's slots of [`mixed_plan`]: slot order
/// is parameter order, the 16-byte slot copy-only, one shadow per copy slot
/// (the runtime's reservations share it), whole granules.
fn policy_plan(threshold: Threshold, free: u64, gran: u64) -> xla_vmm_policy::BindingPlan {
    let mut slots: Vec<SlotInfo> = SIZES
        .iter()
        .map(|&s| SlotInfo::new(s, true, false, 1.0))
        .collect();
    slots[0] = slots[0].clone().copy_only();
    slots.push(SlotInfo::new(DONATED, true, false, 0.0));
    let knobs = Knobs {
        shadow_copies: 1,
        ..Knobs::default()
    };
    decide(&PolicyInput {
        device: costs(free, gran),
        threshold,
        slots,
        step: None,
        knobs,
    })
    .unwrap()
}

/// Runs 4 steps of [`mixed_plan`] in VA-stable mode, fresh buffers each
/// step (the donated one kept), checking every output; returns the stats.
fn run(threshold: Threshold, free: u64) -> BindingStats {
    // Granularity deliberately left unknown: the runtime supplies its
    // backend's.
    run_on(&backend(), threshold, Some(costs(free, 0)))
}

/// [`run`] on `b` with `costs` (`None`: the backend's memory and the
/// DESIGN §4 constants).
fn run_on(b: &Arc<HostBackend>, threshold: Threshold, costs: Option<DeviceCosts>) -> BindingStats {
    let b = b.clone();
    let alloc = VmmAllocator::new(
        b.clone(),
        VmmConfig {
            small_threshold: 16,
            small_min: 16,
        },
    )
    .unwrap();
    let stream = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), mixed_plan(), None, &stream).unwrap();
    exe.set_binding_config(BindingConfig {
        threshold,
        costs,
        immutable_buffers: false,
        ..Default::default()
    })
    .unwrap();
    let w = alloc.alloc(DONATED).unwrap();
    let mut prev = Vec::new();
    for step in 0..4u32 {
        let fresh: Vec<_> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let buf = alloc.alloc(s).unwrap();
                let v = (step * 10 + i as u32) as f32;
                b.write_sync(buf.ptr(), &bytes(&vec![v; s as usize / 4]), &stream)
                    .unwrap();
                exe.bind_buffer(i, &buf).unwrap();
                buf
            })
            .collect();
        exe.bind_buffer(SIZES.len(), &w).unwrap();
        let outs = exe.run(&stream, Mode::Graph).unwrap();
        b.stream_synchronize(&stream).unwrap();
        for (i, &s) in SIZES.iter().enumerate() {
            let mut d = vec![0u8; s as usize];
            b.read_sync(&mut d, outs[i].ptr, &stream).unwrap();
            let want = bytes(&vec![(step * 10 + i as u32) as f32; s as usize / 4]);
            assert!(d == want, "threshold {threshold:?} step {step} output {i}");
        }
        for x in prev.drain(..) {
            alloc.free(x, &stream).unwrap();
        }
        prev = fresh;
    }
    let st = exe.stats().unwrap().clone();
    for x in prev.drain(..) {
        alloc.free(x, &stream).unwrap();
    }
    alloc.free(w, &stream).unwrap();
    st
}

#[test]
fn runtime_shadow_bytes_equal_the_policy_plan() {
    let gran = backend().info().vmm_granularity;
    assert!(gran > 16, "the test needs sub-granule slots");
    let big = 1u64 << 30;
    // (threshold, free): auto with room for most slots, auto with a tight
    // cap, N covering everything but the 3 MiB slot, N covering all.
    for (t, free) in [
        (Threshold::Auto, big),
        (Threshold::Auto, 250 * gran),
        (Threshold::Bytes(2 << 20), big),
        (Threshold::Bytes(4 << 20), big),
    ] {
        let what = format!("threshold {t:?}, free {free}");
        let st = run(t, free);
        let plan = policy_plan(t, free, gran);
        assert_eq!(st.shadow_bytes, plan.shadow_bytes, "{what}: {st:?}");
        assert_eq!(st.copy_slots, plan.counts.copy, "{what}: {st:?}");
        assert_eq!(st.shadow_cap_bytes, plan.shadow_cap_bytes, "{what}");
        assert_eq!(st.copy_only_slots, 1, "{what}: {st:?}");
        assert_eq!(st.counters.fallbacks, 0, "{what}: {st:?}");
        // Each shadow is whole granules: the 16-byte slot's costs a granule.
        let copied: u64 = SIZES
            .iter()
            .zip(&plan.decisions)
            .filter(|(_, d)| **d == xla_vmm_policy::Decision::Copy)
            .map(|(s, _)| s.div_ceil(gran) * gran)
            .sum();
        assert_eq!(st.shadow_bytes, copied, "{what}");
        assert_eq!(
            plan.decisions[SIZES.len()],
            xla_vmm_policy::Decision::Skip,
            "{what}"
        );
        if t == Threshold::Auto {
            assert!(st.shadow_bytes <= st.shadow_cap_bytes, "{what}: {st:?}");
        }
    }
}

#[test]
fn auto_keeps_the_granule_footprint_under_the_cap() {
    let gran = backend().info().vmm_granularity;
    // Cap = 1 % of 1 GiB = 10.24 MiB. Counted at 256-byte rounding, one
    // shadow per reservation, every slot fits (2 x ~5.1 MiB); in 2 MiB
    // granules the shadows are 2 + 2 + 2 + 2 + 4 = 12 MiB, so auto must
    // leave a slot out (the largest: it is admitted smallest first).
    let st = run(Threshold::Auto, 1 << 30);
    assert_eq!(gran, 2 << 20, "host backend default granularity");
    assert!(st.shadow_bytes <= st.shadow_cap_bytes, "{st:?}");
    assert_eq!(st.copy_slots, 4, "{st:?}");
    assert_eq!(st.shadow_bytes, 4 * gran, "{st:?}");
    // Tight caps: whatever fits, the allocated shadows stay under them.
    for granules in [0u64, 1, 2, 3, 4] {
        let free = 100 * granules * gran + 100;
        let st = run(Threshold::Auto, free);
        let copy_only = gran; // the 16-byte slot: copied whatever the cap
        assert!(
            st.shadow_bytes <= st.shadow_cap_bytes.max(copy_only),
            "free {free}: {st:?}"
        );
        assert!(st.copy_slots >= 1, "free {free}: {st:?}");
    }
}

/// Under a device memory limit the program's buffers nearly fill, auto
/// plans shadows within the room the budget leaves ordinary allocations
/// (its cap a share of that room, not of the device's free memory): only
/// the copy-only slot gets one, and nothing lands in host memory, where the
/// graph's kernels would read a shadowed slot over the link every step.
/// Without the limit the same slots are copied through shadows.
#[test]
fn under_a_full_device_budget_auto_plans_no_shadow_past_its_room() {
    let gran = backend().info().vmm_granularity;
    let free = backend();
    let st = run_on(&free, Threshold::Auto, None);
    assert!(st.copy_slots > 1, "{st:?}");
    let full = backend();
    full.budget().set_limits(MemoryLimits {
        device: Some(64 << 20),
        host: None,
        staging_reserve: Some(0),
    });
    let st = run_on(&full, Threshold::Auto, None);
    assert!(st.shadow_cap_bytes < gran, "{st:?}");
    assert_eq!((st.copy_slots, st.copy_only_slots), (1, 1), "{st:?}");
    assert_eq!(st.shadow_bytes, gran, "{st:?}");
    assert_eq!(full.budget().usage().spilled, 0);
}

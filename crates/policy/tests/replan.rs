//! Auto's one re-plan after warm-up: observed churn (a slot that stopped
//! changing ends skip), the step's bound (GPU-bound: fewer copies;
//! host-bound: more), exactly once then frozen, the shadow cap across the
//! re-plan, and old JSON inputs still parsing.

mod common;

use std::collections::BTreeSet;

use common::{h200, rw};
use xla_vmm_policy::tracker::{DEFAULT_REPLAN_AFTER_STEPS, REPLAN_GRACE_STEPS};
use xla_vmm_policy::{
    Binding, Decision, DeviceCosts, SlotAction, SlotInfo, SlotTracker, StepTimes, Threshold,
    TrackerConfig,
};

const WARM: u64 = DEFAULT_REPLAN_AFTER_STEPS;

fn tracker(device: DeviceCosts, slots: Vec<SlotInfo>) -> SlotTracker {
    let mut cfg = TrackerConfig::new(device, Threshold::Auto);
    cfg.shared_shadows = true;
    cfg.replan_after_steps = Some(WARM);
    SlotTracker::new("replan", slots, cfg).unwrap()
}

/// Bindings of step `step`: slot `i` keeps allocation `1000 + i` when
/// `stable(i)`, else gets a new one every step.
fn bindings(n: usize, step: u64, stable: impl Fn(usize) -> bool) -> Vec<Binding> {
    (0..n)
        .map(|i| {
            let id = if stable(i) {
                1000 + i as u64
            } else {
                1_000_000 + step * 1000 + i as u64
            };
            Binding {
                id,
                addr: 0x1000 * (i as u64 + 1),
            }
        })
        .collect()
}

#[test]
fn replans_once_after_warm_up_with_observed_churn_then_stays_frozen() {
    // Slot 1 has the prior "changes every step" but keeps its allocation.
    let slots = vec![rw(4), rw(16), rw(1 << 20)];
    let mut t = tracker(h200(), slots);
    let stable = |i: usize| i == 1;
    for step in 0..WARM {
        t.bind_step((step % 2) as usize, &bindings(3, step, stable), None)
            .unwrap();
    }
    let first = t.plan().unwrap().clone();
    assert_eq!(
        first.decisions,
        vec![Decision::Copy; 3],
        "priors: all churn"
    );
    assert!(!t.replanned());
    // Measured: serial (the GPU was idle at every step): re-plan now.
    t.set_warmup_measurement(None);
    let a = t
        .bind_step((WARM % 2) as usize, &bindings(3, WARM, stable), None)
        .unwrap()
        .clone();
    assert!(t.replanned());
    let second = t.plan().unwrap().clone();
    assert_eq!(
        second.decisions,
        vec![Decision::Copy, Decision::Skip, Decision::Copy],
        "the slot that never changed is skip"
    );
    // Its shadow is unmapped: the allocation is mapped directly.
    assert_eq!(a.actions[1], SlotAction::Remap { unmap_old: true });
    // Frozen for good: other step times and measurements change nothing.
    t.set_warmup_measurement(Some(StepTimes {
        host_us: 1.0,
        gpu_us: 1e6,
    }));
    for step in WARM + 1..WARM + 20 {
        let gpu_bound = Some(StepTimes {
            host_us: 1.0,
            gpu_us: 1e6,
        });
        let a = t
            .bind_step((step % 2) as usize, &bindings(3, step, stable), gpu_bound)
            .unwrap();
        if step > WARM + 1 {
            assert_eq!(a.actions[1], SlotAction::Skip, "step {step}");
        }
        assert_eq!(t.plan(), Some(&second), "step {step}");
    }
}

#[test]
fn without_a_measurement_the_replan_waits_for_the_grace_steps() {
    let mut t = tracker(h200(), vec![rw(4), rw(16)]);
    let stable = |i: usize| i == 1;
    for step in 0..WARM + REPLAN_GRACE_STEPS {
        t.bind_step((step % 2) as usize, &bindings(2, step, stable), None)
            .unwrap();
        assert!(!t.replanned(), "step {step}");
    }
    let step = WARM + REPLAN_GRACE_STEPS;
    t.bind_step((step % 2) as usize, &bindings(2, step, stable), None)
        .unwrap();
    assert!(t.replanned());
    assert_eq!(t.plan().unwrap().decision(1), Some(Decision::Skip));
    assert_eq!(t.plan_step_times(), None);
}

/// Copies (with churn 1) after a re-plan with `times`.
fn copies_after_replan(times: StepTimes) -> usize {
    // 20 slots of 1 MiB, read and written, a new allocation every step:
    // remapping all is 20 · 46 µs of host time, copying all ~18 µs of GPU.
    let slots: Vec<SlotInfo> = (0..20).map(|_| rw(1 << 20)).collect();
    let mut t = tracker(h200(), slots);
    for step in 0..=WARM {
        if step == WARM {
            t.set_warmup_measurement(Some(times));
        }
        t.bind_step((step % 2) as usize, &bindings(20, step, |_| false), None)
            .unwrap();
    }
    assert!(t.replanned());
    assert_eq!(t.plan_step_times(), Some(times));
    t.plan().unwrap().counts.copy
}

#[test]
fn gpu_bound_steps_copy_less_and_host_bound_steps_copy_more() {
    // GPU-bound: the 920 µs of remaps hide under 5 ms of GPU time, every
    // copy would lengthen the step.
    let gpu = copies_after_replan(StepTimes {
        host_us: 100.0,
        gpu_us: 5000.0,
    });
    // Host-bound: every remap saved shortens the step; copies fill idle GPU.
    let host = copies_after_replan(StepTimes {
        host_us: 5000.0,
        gpu_us: 100.0,
    });
    assert_eq!(gpu, 0, "GPU-bound: remaps overlap the GPU");
    assert_eq!(host, 20, "host-bound: every slot copied");
}

#[test]
fn shadow_cap_holds_across_the_replan() {
    // Cap = 1 % of free = 3 granules of 2 MiB: three shadows at most.
    let gran = 2u64 << 20;
    let device = DeviceCosts {
        granularity_bytes: gran,
        free_bytes: 300 * gran,
        ..h200()
    };
    let cap = 3 * gran;
    let slots: Vec<SlotInfo> = (0..8).map(|i| rw(1024 * (i + 1))).collect();
    let mut t = tracker(device, slots);
    // The three smallest (copied first) stop churning; the others churn:
    // the re-plan takes the three off copying and wants others, but their
    // shadows stay held, so no new shadow fits.
    let stable = |i: usize| i < 3;
    let mut ever_shadowed = BTreeSet::new();
    for step in 0..WARM + 10 {
        if step == WARM {
            t.set_warmup_measurement(Some(StepTimes {
                host_us: 5000.0,
                gpu_us: 100.0,
            }));
        }
        let a = t
            .bind_step((step % 2) as usize, &bindings(8, step, stable), None)
            .unwrap();
        for (i, act) in a.actions.iter().enumerate() {
            if matches!(act, SlotAction::Copy { .. }) {
                ever_shadowed.insert(i);
            }
        }
        assert!(t.shadow_bytes() <= cap, "step {step}: {}", t.shadow_bytes());
        let p = t.plan().unwrap();
        assert!(p.shadow_bytes <= p.shadow_cap_bytes, "step {step}");
    }
    assert!(t.replanned());
    assert_eq!(ever_shadowed.len() as u64 * gran, cap, "{ever_shadowed:?}");
    let p = t.plan().unwrap();
    assert_eq!(&p.decisions[..3], &[Decision::Skip; 3]);
    assert_eq!(p.counts.copy, 0, "no room left for new shadows");
    assert!(
        p.counts.budget_limited > 0,
        "the cap kept churning slots out"
    );
}

#[test]
fn held_shadows_are_counted_and_reused() {
    // Same setup, but the copy slots keep churning: the re-plan keeps them
    // (their shadows need no new memory) within the cap.
    let gran = 2u64 << 20;
    let device = DeviceCosts {
        granularity_bytes: gran,
        free_bytes: 300 * gran,
        ..h200()
    };
    let slots: Vec<SlotInfo> = (0..8).map(|i| rw(1024 * (i + 1))).collect();
    let mut t = tracker(device, slots);
    for step in 0..=WARM {
        if step == WARM {
            t.set_warmup_measurement(None);
        }
        t.bind_step((step % 2) as usize, &bindings(8, step, |_| false), None)
            .unwrap();
    }
    let p = t.plan().unwrap();
    assert_eq!(&p.decisions[..3], &[Decision::Copy; 3]);
    assert_eq!(p.counts.copy, 3);
    assert_eq!(p.shadow_bytes, 3 * gran);
}

#[test]
fn old_slot_json_parses_and_has_shadow_round_trips() {
    let old: SlotInfo =
        serde_json::from_str(r#"{"size": 16, "read": true, "written": false, "churn": 1.0}"#)
            .unwrap();
    assert!(!old.has_shadow);
    let text = serde_json::to_string(&old).unwrap();
    assert!(!text.contains("has_shadow"), "{text}");
    let held = SlotInfo {
        has_shadow: true,
        ..old
    };
    let back: SlotInfo = serde_json::from_str(&serde_json::to_string(&held).unwrap()).unwrap();
    assert!(back.has_shadow);
}

#[test]
fn a_bad_measurement_keeps_the_first_plan() {
    let mut t = tracker(h200(), vec![rw(4), rw(16)]);
    for step in 0..=WARM {
        if step == WARM {
            t.set_warmup_measurement(Some(StepTimes {
                host_us: f64::NAN,
                gpu_us: 1.0,
            }));
        }
        t.bind_step((step % 2) as usize, &bindings(2, step, |_| true), None)
            .unwrap();
    }
    assert!(t.replanned(), "tried once, not again");
    assert_eq!(t.plan().unwrap().decisions, vec![Decision::Copy; 2]);
}

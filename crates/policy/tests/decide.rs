//! Decision tests: thresholds 0 / 1 / N, churn, directions, batching, bound.

mod common;

use common::{h200, input, rw};
use xla_vmm_policy::cost::transfer_us;
use xla_vmm_policy::{decide, Decision, Knobs, PolicyError, Rule, SlotInfo, StepTimes};

use Decision::{Copy, Remap, Skip};

#[test]
fn threshold_zero_remaps_every_changing_slot() {
    let slots = vec![
        rw(4),
        rw(2 << 20),
        SlotInfo::new(64, true, false, 0.0),
        SlotInfo::new(8, false, true, 0.5),
    ];
    let plan = decide(&input(0, slots)).unwrap();
    assert_eq!(plan.decisions, vec![Remap, Remap, Skip, Remap]);
    assert_eq!(plan.threshold_bytes, 0);
    assert_eq!(plan.shadow_bytes, 0);
    assert_eq!(plan.copy_us_per_step, 0.0);
    assert_eq!(plan.copy_launches_per_step, 0);
    // Churn-weighted: 1 + 1 + 0 + 0.5 remaps per step.
    assert!((plan.remap_us_per_step - 2.5 * 46.0).abs() < 1e-9);
    assert_eq!(
        (plan.counts.skip, plan.counts.remap, plan.counts.copy),
        (1, 3, 0)
    );
}

#[test]
fn threshold_n_copies_slots_at_or_below_n() {
    let slots = vec![
        rw(4),
        rw(4096),
        rw(4097),
        rw(1 << 20),
        SlotInfo::new(16, true, true, 0.0),
    ];
    let plan = decide(&input(4096, slots)).unwrap();
    assert_eq!(plan.decisions, vec![Copy, Copy, Remap, Remap, Skip]);
    assert_eq!(plan.threshold_bytes, 4096);
    assert_eq!(plan.rule, Rule::Fixed);
    let k = Knobs::default();
    assert_eq!(
        plan.shadow_bytes,
        k.shadow_bytes_for(4, 0) + k.shadow_bytes_for(4096, 0)
    );
    assert_eq!(plan.copy_in_bytes_per_step, 4100);
    assert_eq!(plan.copy_out_bytes_per_step, 4100);
    let bytes_us = 2.0 * transfer_us(4100, h200().copy_bw_bytes_per_s);
    assert!((plan.copy_us_per_step - (2.0 * 4.0 + bytes_us)).abs() < 1e-9);
    assert!((plan.remap_us_per_step - 2.0 * 46.0).abs() < 1e-9);
}

#[test]
fn threshold_n_is_bounded_by_the_shadow_cap() {
    let mut inp = input(1 << 30, (0..8).map(|_| rw(64 << 20)).collect());
    inp.device.free_bytes = 20 << 30; // cap = 1% = ~205 MiB: one 64 MiB slot x 2 shadows fits
    let plan = decide(&inp).unwrap();
    assert!(plan.shadow_bytes <= plan.shadow_cap_bytes);
    assert_eq!(plan.counts.copy, 1);
    assert_eq!(plan.counts.budget_limited, 7);
    assert_eq!(
        plan.decisions[0], Copy,
        "ties break by slot index, smallest first"
    );
}

#[test]
fn auto_copies_small_and_remaps_large_on_h200() {
    let slots = vec![
        rw(1 << 30),
        rw(4),
        rw(2 << 20),
        rw(128 << 20),
        SlotInfo::new(4, false, true, 1.0),
    ];
    let plan = decide(&input(1, slots)).unwrap();
    assert_eq!(plan.decisions, vec![Remap, Copy, Copy, Remap, Copy]);
    assert_eq!(plan.threshold_bytes, 2 << 20);
    assert_eq!(
        plan.break_even_bytes_read_write,
        (46e-6 * 2.4e12 / 2.0) as u64
    );
    assert!(plan.shadow_bytes <= plan.shadow_cap_bytes);
    assert!(plan.copy_us_per_step <= plan.copy_budget_us);
    // The reference rule is reported and never beats the result.
    let r = plan.reference.expect("auto reports the reference rule");
    assert!(plan.binding_us_per_step() <= r.copy_us_per_step + r.remap_us_per_step + 1e-9);
}

#[test]
fn churn_zero_is_skip_under_every_threshold() {
    let slots = vec![
        SlotInfo::new(4, true, true, 0.0),
        SlotInfo::new(4, false, false, 0.0),
        SlotInfo::new(1 << 30, true, false, 0.0),
        rw(4),
    ];
    for t in [0u64, 1, 2, 4096, 1 << 20, u64::MAX] {
        let plan = decide(&input(t, slots.clone())).unwrap();
        assert_eq!(&plan.decisions[..3], &[Skip, Skip, Skip], "threshold {t}");
        assert_eq!(plan.counts.skip, 3, "threshold {t}");
    }
}

#[test]
fn auto_admits_smallest_first_under_a_tight_cap() {
    // Cap = 1% of 1 GiB ≈ 10.7 MB; shadows are doubled, so 1+2+... MiB fit up
    // to a point and never a bigger slot before a smaller one.
    let sizes: Vec<u64> = vec![3 << 20, 1 << 20, 4 << 20, 2 << 20, 512 << 10];
    let mut inp = input(1, sizes.iter().map(|&s| rw(s)).collect());
    inp.device.free_bytes = 1 << 30;
    let plan = decide(&inp).unwrap();
    assert!(plan.shadow_bytes <= plan.shadow_cap_bytes);
    let copied: Vec<u64> = sizes
        .iter()
        .zip(&plan.decisions)
        .filter(|(_, &d)| d == Copy)
        .map(|(&s, _)| s)
        .collect();
    let remapped_min = sizes
        .iter()
        .zip(&plan.decisions)
        .filter(|(_, &d)| d == Remap)
        .map(|(&s, _)| s)
        .min();
    // 0.5 + 1 + 2 MiB = 3.5 MiB x 2 = 7 MiB fits; adding 3 MiB (13 MiB) does not.
    assert_eq!(copied.len(), 3);
    assert!(copied.iter().all(|&c| Some(c) < remapped_min));
    assert!(plan.counts.budget_limited >= 1);
}

#[test]
fn batching_lets_many_rarely_changing_slots_pay_for_one_launch() {
    // Each slot alone: expected remap 0.05 x 46 = 2.3 µs < 4 µs launch, so a
    // lone copy does not pay. 200 of them share two launches and do.
    let slow = SlotInfo::new(256, true, true, 0.05);
    let one = decide(&input(1, vec![slow.clone()])).unwrap();
    assert_eq!(one.decisions, vec![Remap]);
    let many = decide(&input(1, vec![slow; 200])).unwrap();
    assert_eq!(many.counts.copy, 200);
    assert_eq!(many.copy_launches_per_step, 2);
    assert!(many.binding_us_per_step() < 200.0 * 0.05 * 46.0);
    // The reference rule copies them too, but pays a launch per slot and direction.
    let r = many.reference.unwrap();
    assert!(r.copy_us_per_step_unbatched > 400.0 * 4.0 - 1e-9);
    assert!(many.copy_us_per_step < 10.0);
}

#[test]
fn directions_set_the_break_even() {
    // 80 MB: above R·B/2 (55 MB) but below R·B (110 MB).
    let size = 80_000_000;
    let mut inp = input(1, vec![SlotInfo::new(size, false, true, 1.0), rw(size)]);
    inp.knobs.copy_budget_us = Some(1000.0);
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.decisions, vec![Copy, Remap]);
    assert_eq!(plan.copy_launches_per_step, 1);
}

#[test]
fn copy_budget_caps_auto() {
    let mut inp = input(1, vec![SlotInfo::new(40_000_000, true, false, 1.0); 4]);
    // Each copy: ~16.7 µs of bytes; budget 40 µs admits two (4 + 33.3 µs).
    inp.knobs.copy_budget_us = Some(40.0);
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.counts.copy, 2);
    assert!(plan.copy_us_per_step <= 40.0);
    assert_eq!(plan.counts.budget_limited, 2);
}

#[test]
fn host_or_gpu_bound_changes_the_choice() {
    let slots: Vec<SlotInfo> = (0..10).map(|_| rw(1 << 20)).collect();
    let mut inp = input(1, slots);
    // GPU-bound with 5 ms of slack: 460 µs of remaps hide; copies would not.
    inp.step = Some(StepTimes {
        host_us: 500.0,
        gpu_us: 5500.0,
    });
    let gpu = decide(&inp).unwrap();
    assert_eq!(gpu.counts.copy, 0);
    assert_eq!(gpu.step_us, Some(5500.0));
    // Host-bound: every remap saved shortens the step.
    inp.step = Some(StepTimes {
        host_us: 5500.0,
        gpu_us: 500.0,
    });
    let host = decide(&inp).unwrap();
    assert_eq!(host.counts.copy, 10);
    assert!(host.step_us.unwrap() < 5500.0 + 1e-9);
    // Unknown bound: costs add, copies win (10 MiB both ways ≈ 17 µs < 460 µs).
    inp.step = None;
    assert_eq!(decide(&inp).unwrap().counts.copy, 10);
}

#[test]
fn a_slot_that_stopped_churning_is_not_given_a_shadow() {
    let mut stopped = rw(4096);
    stopped.history = Some([vec![true; 10], vec![false; 40]].concat());
    let plan = decide(&input(1, vec![stopped.clone(), rw(4096)])).unwrap();
    // It is a remap slot whose expected cost is ~0; only the live one copies.
    assert_eq!(plan.decisions, vec![Remap, Copy]);
    stopped.churn = 0.0;
    stopped.history = Some(vec![false; 5]);
    assert_eq!(
        decide(&input(1, vec![stopped])).unwrap().decisions,
        vec![Skip]
    );
}

#[test]
fn no_free_memory_means_no_copies() {
    let mut inp = input(1, vec![rw(4); 4]);
    inp.device.free_bytes = 0;
    assert_eq!(decide(&inp).unwrap().counts.copy, 0);
    inp.threshold = 4096.into();
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.counts.copy, 0);
    assert_eq!(plan.counts.budget_limited, 4);
}

#[test]
fn bad_input_is_an_error() {
    let mut inp = input(1, vec![rw(4)]);
    inp.slots[0].churn = 2.0;
    assert!(matches!(
        decide(&inp),
        Err(PolicyError::InvalidSlot { index: 0, .. })
    ));
    let mut inp = input(1, vec![rw(4)]);
    inp.device.copy_bw_bytes_per_s = -1.0;
    assert!(matches!(decide(&inp), Err(PolicyError::InvalidDevice(_))));
    let mut inp = input(1, vec![rw(4)]);
    inp.step = Some(StepTimes {
        host_us: f64::INFINITY,
        gpu_us: 1.0,
    });
    assert!(decide(&inp).is_err());
    let mut inp = input(1, vec![rw(4)]);
    inp.knobs.shadow_copies = 0;
    assert!(matches!(decide(&inp), Err(PolicyError::InvalidKnob(_))));
}

#[test]
fn empty_slot_list_is_fine() {
    for t in [0, 1, 4096] {
        let plan = decide(&input(t, vec![])).unwrap();
        assert!(plan.decisions.is_empty());
        assert_eq!(plan.binding_us_per_step(), 0.0);
    }
}

#[test]
fn copy_only_slots_are_copied_under_every_threshold_and_counted_first() {
    // Slot 0: copy-only, never changes (a sub-allocated donated buffer);
    // slot 1: copy-only 64 KiB; slots 2, 3: remappable.
    let slots = vec![
        SlotInfo::new(64, true, true, 0.0).copy_only(),
        rw(64 << 10).copy_only(),
        rw(4),
        rw(1 << 30),
    ];
    for t in [0u64, 1, 8, 4096] {
        let plan = decide(&input(t, slots.clone())).unwrap();
        assert_eq!(&plan.decisions[..2], &[Copy, Copy], "threshold {t}");
        assert_eq!(plan.decisions[3], Remap, "threshold {t}");
        assert_eq!(plan.counts.copy_only, 2, "threshold {t}");
        // Their bytes are in the plan's per-step copy totals and shadows.
        assert!(
            plan.copy_in_bytes_per_step >= 64 + (64 << 10),
            "threshold {t}"
        );
        assert!(
            plan.shadow_bytes >= Knobs::default().shadow_bytes_for(64 << 10, 0),
            "threshold {t}"
        );
    }
    assert_eq!(
        decide(&input(0, slots.clone())).unwrap().decisions[2],
        Remap
    );
    assert_eq!(
        decide(&input(4096, slots.clone())).unwrap().decisions[2],
        Copy
    );
    // Under auto the cutoff reported is the largest slot the rule chose,
    // not a copy-only one.
    let plan = decide(&input(1, slots)).unwrap();
    assert_eq!(plan.decisions[2], Copy);
    assert_eq!(plan.threshold_bytes, 4);
}

#[test]
fn copy_only_slots_use_up_the_copy_budget_and_the_shadow_cap_first() {
    // A fixed 20 µs budget. Copy-only slots moving 2 x 40 MB per step take
    // ~33 µs: nothing else may be admitted, though a 1 MiB slot alone
    // would pay for itself.
    let mut inp = input(
        1,
        vec![
            rw(40_000_000).copy_only(),
            rw(1 << 20),
            SlotInfo::new(4, true, false, 1.0),
        ],
    );
    inp.knobs.copy_budget_us = Some(20.0);
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.decisions, vec![Copy, Remap, Remap], "{plan:?}");
    inp.knobs.copy_budget_us = Some(1000.0);
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.decisions, vec![Copy, Copy, Copy], "{plan:?}");
    // Shadow cap: 1% of 10 GiB ~ 107 MB; the copy-only shadows (2 x 40 MB)
    // leave room for the small slots, not for another 40 MB one.
    let mut inp = input(
        1 << 30,
        vec![rw(40_000_000).copy_only(), rw(40_000_000), rw(1 << 20)],
    );
    inp.device.free_bytes = 10 << 30;
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.decisions, vec![Copy, Remap, Copy], "{plan:?}");
    assert_eq!(plan.counts.budget_limited, 1);
}

#[test]
fn remappable_defaults_to_true_in_json() {
    let text = r#"{"device": {"remap_us": 46, "copy_bw_bytes_per_s": 2.4e12,
        "copy_launch_us": 4, "free_bytes": 1000000000, "total_bytes": 2000000000},
        "threshold": 0,
        "slots": [{"size": 16, "read": true, "written": false, "churn": 1},
                  {"size": 16, "read": true, "written": false, "churn": 1, "remappable": false}]}"#;
    let inp: xla_vmm_policy::PolicyInput = serde_json::from_str(text).unwrap();
    assert!(inp.slots[0].remappable);
    assert!(!inp.slots[1].remappable);
    let plan = decide(&inp).unwrap();
    assert_eq!(plan.decisions, vec![Remap, Copy]);
    // Serialized back, the default is left out and the copy-only flag kept.
    let out = serde_json::to_string(&inp.slots).unwrap();
    assert_eq!(out.matches("remappable").count(), 1, "{out}");
}

#[test]
fn shadows_are_counted_in_whole_granules_against_the_cap() {
    let g = 2u64 << 20;
    // Six changing 4-byte slots, the first copy-only. Cap = 12 MiB = 6
    // granules; each copy slot costs one granule per reservation (2).
    let mut slots: Vec<SlotInfo> = (0..6).map(|_| rw(4)).collect();
    slots[0] = slots[0].clone().copy_only();
    let k = Knobs::default();
    for t in [1u64, 4096] {
        let mut inp = input(t, slots.clone());
        inp.device.free_bytes = 100 * 6 * g;
        // Unknown granularity: 2 x 256 B per slot, everything fits.
        let plan = decide(&inp).unwrap();
        assert_eq!(plan.counts.copy, 6, "threshold {t}");
        assert_eq!(plan.shadow_bytes, 6 * k.shadow_bytes_for(4, 0));
        // 2 MiB granules: the copy-only slot's 2 granules first, then two
        // more slots; the cap holds for what is actually allocated.
        inp.device.granularity_bytes = g;
        let plan = decide(&inp).unwrap();
        assert_eq!(plan.shadow_cap_bytes, 6 * g, "threshold {t}");
        assert_eq!(plan.decisions, vec![Copy, Copy, Copy, Remap, Remap, Remap]);
        assert_eq!(plan.counts.copy_only, 1, "threshold {t}");
        assert_eq!(plan.counts.budget_limited, 3, "threshold {t}");
        assert_eq!(plan.shadow_bytes, 3 * k.shadow_bytes_for(4, g));
        assert_eq!(plan.shadow_bytes, 6 * g);
        assert!(plan.shadow_bytes <= plan.shadow_cap_bytes);
        // Copied bytes per step are still the slots' own bytes.
        assert_eq!(plan.copy_in_bytes_per_step, 12, "threshold {t}");
    }
    // A copy-only slot's shadow is counted the same way under every
    // threshold, even past the cap (it has no other way to be served).
    for t in [0u64, 1, 4096] {
        let mut inp = input(t, vec![rw(4).copy_only(), rw(4)]);
        inp.device.granularity_bytes = g;
        inp.device.free_bytes = 100 * g; // cap: one granule
        let plan = decide(&inp).unwrap();
        assert_eq!(plan.decisions, vec![Copy, Remap], "threshold {t}");
        assert_eq!(plan.shadow_bytes, 2 * g, "threshold {t}");
    }
}

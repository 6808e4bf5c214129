//! SlotTracker tests: identity by allocation id (ABA), per-reservation
//! skips, freezing, churn-driven mode switches, fallback, and a small host
//! simulation that executes the actions and checks no data is lost.

mod common;

use std::collections::HashMap;

use common::{h200, rw, Rng};
use xla_vmm_policy::{
    Binding, Decision, FailedCall, PolicyError, SlotAction, SlotInfo, SlotTracker, StepTimes,
    Threshold, TrackerConfig,
};

fn tracker(slots: Vec<SlotInfo>, threshold: u64, reservations: usize) -> SlotTracker {
    let mut cfg = TrackerConfig::new(h200(), Threshold::from(threshold));
    cfg.reservations = reservations;
    SlotTracker::new("test", slots, cfg).unwrap()
}

fn b(id: u64, addr: u64) -> Binding {
    Binding { id, addr }
}

#[test]
fn aba_same_address_new_allocation_is_a_remap() {
    let mut t = tracker(vec![rw(64 << 20)], 0, 1);
    assert_eq!(
        t.bind_step(0, &[b(1, 0x1000)], None).unwrap().actions,
        vec![SlotAction::Remap { unmap_old: false }]
    );
    assert_eq!(
        t.bind_step(0, &[b(1, 0x1000)], None).unwrap().actions,
        vec![SlotAction::Skip]
    );
    // Allocation 1 freed, allocation 2 handed out at the same address.
    assert_eq!(
        t.bind_step(0, &[b(2, 0x1000)], None).unwrap().actions,
        vec![SlotAction::Remap { unmap_old: true }]
    );
    // Same id at a different address is inconsistent input: remap, not skip.
    assert_eq!(
        t.bind_step(0, &[b(2, 0x2000)], None).unwrap().actions,
        vec![SlotAction::Remap { unmap_old: true }]
    );
    let s = t.stats();
    assert_eq!((s.steps, s.skips, s.remaps, s.copies), (4, 1, 3, 0));
    // The ABA remap unmaps: the host must wait for the reservation.
    assert!(t
        .bind_step(0, &[b(3, 0x1000)], None)
        .unwrap()
        .needs_idle_reservation());
}

#[test]
fn aba_on_a_copy_slot_is_a_copy_not_a_skip() {
    let mut t = tracker(vec![rw(4)], 1, 1);
    for id in 1..=5 {
        let a = t.bind_step(0, &[b(id, 0x1000)], None).unwrap();
        assert!(matches!(
            a.actions[0],
            SlotAction::Copy {
                copy_in: true,
                copy_out: true,
                ..
            }
        ));
    }
}

#[test]
fn donated_loop_makes_no_driver_calls_in_steady_state() {
    // Two reservations; the big slots keep their allocation (donated).
    let slots = vec![
        rw(1 << 30),
        rw(256 << 20),
        SlotInfo::new(4, true, false, 1.0),
    ];
    let mut t = tracker(slots, 1, 2);
    for step in 0..20u64 {
        let acts = t
            .bind_step(
                (step % 2) as usize,
                &[b(10, 0xa000), b(11, 0xb000), b(100 + step, 0xc000)],
                None,
            )
            .unwrap();
        if step >= 2 {
            assert_eq!(
                &acts.actions[..2],
                &[SlotAction::Skip, SlotAction::Skip],
                "step {step}"
            );
            assert_eq!(acts.driver_maps(), 0, "step {step}");
            assert!(!acts.needs_idle_reservation(), "step {step}");
            assert!(
                matches!(
                    acts.actions[2],
                    SlotAction::Copy {
                        map_shadow: false,
                        ..
                    }
                ),
                "step {step}"
            );
        }
    }
    // First use of each reservation maps: 2 reservations x 2 big slots.
    assert_eq!(t.stats().remaps, 4);
    assert_eq!(t.stats().skips, 36);
}

#[test]
fn ping_pong_buffers_skip_with_two_reservations() {
    let mut t = tracker(vec![rw(1 << 30)], 0, 2);
    for step in 0..10u64 {
        let acts = t
            .bind_step(
                (step % 2) as usize,
                &[b(1 + step % 2, 0x1000 * (1 + step % 2))],
                None,
            )
            .unwrap();
        let want = if step < 2 {
            SlotAction::Remap { unmap_old: false }
        } else {
            SlotAction::Skip
        };
        assert_eq!(acts.actions[0], want, "step {step}");
    }
}

#[test]
fn decision_is_frozen_after_the_first_step() {
    let slots: Vec<SlotInfo> = (0..4).map(|_| rw(1 << 20)).collect();
    let mut t = tracker(slots, 1, 1);
    assert!(t.plan().is_none());
    // First step: GPU-bound with slack, so auto remaps everything.
    t.bind_step(
        0,
        &[b(1, 1), b(2, 2), b(3, 3), b(4, 4)],
        Some(StepTimes {
            host_us: 10.0,
            gpu_us: 10_000.0,
        }),
    )
    .unwrap();
    let frozen = t.plan().unwrap().clone();
    assert_eq!(frozen.counts.copy, 0);
    // Later steps report a host-bound step; the plan does not move.
    for id in 5..20 {
        t.bind_step(
            0,
            &[b(id, 1), b(id + 100, 2), b(id + 200, 3), b(id + 300, 4)],
            Some(StepTimes {
                host_us: 1e5,
                gpu_us: 1.0,
            }),
        )
        .unwrap();
        assert_eq!(t.plan().unwrap(), &frozen);
    }
}

#[test]
fn stable_copy_slot_moves_to_direct_mapping_after_one_remap_of_copies() {
    let dev = h200();
    let slot = rw(4096);
    let mut t = tracker(vec![slot.clone()], 1, 1);
    assert!(matches!(
        t.bind_step(0, &[b(7, 7)], None).unwrap().actions[0],
        SlotAction::Copy {
            map_shadow: true,
            ..
        }
    ));
    // One copy slot: it pays both launches alone.
    let per_step = 2.0 * dev.copy_launch_us
        + 2.0 * xla_vmm_policy::cost::transfer_us(slot.size, dev.copy_bw_bytes_per_s);
    let expected_stable_copies = (dev.remap_us / per_step).ceil() as usize;
    let mut copies = 0;
    loop {
        match t.bind_step(0, &[b(7, 7)], None).unwrap().actions[0] {
            SlotAction::Copy {
                map_shadow: false, ..
            } => copies += 1,
            SlotAction::Remap { unmap_old: true } => break,
            other => panic!("unexpected {other:?}"),
        }
        assert!(copies < 100, "never switched");
    }
    assert_eq!(copies + 1, expected_stable_copies);
    assert_eq!(
        t.bind_step(0, &[b(7, 7)], None).unwrap().actions[0],
        SlotAction::Skip
    );
    assert_eq!(t.stats().mode_switches, 1);
    assert!(!t.churn(0).unwrap().shadow_mode);
    // It starts changing again: back to its shadow (on a change, not before).
    let mut back = false;
    for id in 8..20 {
        if let SlotAction::Copy {
            map_shadow: true,
            unmap_old: true,
            ..
        } = t.bind_step(0, &[b(id, id)], None).unwrap().actions[0]
        {
            back = true;
            break;
        }
    }
    assert!(back, "churning slot never returned to its shadow");
    assert_eq!(t.stats().mode_switches, 2);
    // Shadow memory never grew beyond the plan.
    assert_eq!(t.shadow_bytes(), t.plan().unwrap().shadow_bytes);
}

#[test]
fn demotion_reaches_both_reservations_without_flapping() {
    // A slow churn average keeps the estimate high after the demotion: the
    // other reservation must still just map the allocation (no change there),
    // not flip the slot back to its shadow.
    let mut cfg = TrackerConfig::new(h200(), Threshold::Auto);
    cfg.knobs.churn_ewma_alpha = 0.05;
    let mut t = SlotTracker::new("t", vec![rw(4096)], cfg).unwrap();
    let mut actions = Vec::new();
    for step in 0..40 {
        actions.push(t.bind_step(step % 2, &[b(9, 9)], None).unwrap().actions[0]);
    }
    let remaps: Vec<usize> = (0..40)
        .filter(|&s| matches!(actions[s], SlotAction::Remap { .. }))
        .collect();
    // One remap per reservation (the shadow is swapped for the allocation),
    // on consecutive steps, then skips only.
    assert_eq!(remaps.len(), 2, "{actions:?}");
    assert_eq!(remaps[1], remaps[0] + 1);
    assert!(
        actions[remaps[1] + 1..]
            .iter()
            .all(|a| *a == SlotAction::Skip),
        "{actions:?}"
    );
    assert_eq!(t.stats().mode_switches, 1);
}

#[test]
fn non_adaptive_tracker_keeps_copying() {
    let mut cfg = TrackerConfig::new(h200(), Threshold::Auto);
    cfg.adaptive = false;
    let mut t = SlotTracker::new("x", vec![rw(4096)], cfg).unwrap();
    for _ in 0..50 {
        assert!(matches!(
            t.bind_step(0, &[b(1, 1)], None).unwrap().actions[0],
            SlotAction::Copy { .. }
        ));
    }
}

#[test]
fn failed_map_falls_back_to_copy() {
    let mut t = tracker(
        vec![SlotInfo::new(2 << 20, true, false, 1.0), rw(2 << 20)],
        0,
        1,
    );
    t.bind_step(0, &[b(1, 1), b(2, 2)], None).unwrap();
    let acts = t.bind_step(0, &[b(3, 3), b(4, 4)], None).unwrap();
    assert_eq!(acts.actions[0], SlotAction::Remap { unmap_old: true });
    let fb = t.fallback_to_copy(0, 0, FailedCall::Map).unwrap();
    assert_eq!(
        fb.action,
        SlotAction::Copy {
            map_shadow: true,
            unmap_old: false,
            copy_in: true,
            copy_out: false
        }
    );
    assert_eq!(fb.new_shadow_bytes, 2 << 20);
    let fb = t.fallback_to_copy(0, 1, FailedCall::Unmap).unwrap();
    assert_eq!(
        fb.action,
        SlotAction::Copy {
            map_shadow: true,
            unmap_old: true,
            copy_in: true,
            copy_out: true
        }
    );
    let s = *t.stats();
    assert_eq!(
        (s.fallbacks, s.unmap_errors, s.remaps, s.copies),
        (2, 1, 2, 2)
    );
    assert_eq!(t.shadow_bytes(), 4 << 20);
    // From now on both slots copy, even when stable (pinned).
    for _ in 0..30 {
        let acts = t.bind_step(0, &[b(3, 3), b(4, 4)], None).unwrap();
        assert!(acts.actions.iter().all(|a| matches!(
            a,
            SlotAction::Copy {
                map_shadow: false,
                ..
            }
        )));
    }
    // A fallback needs a remap to fall back from.
    assert!(matches!(
        t.fallback_to_copy(0, 0, FailedCall::Map),
        Err(PolicyError::FallbackUnavailable { .. })
    ));
}

#[test]
fn bad_calls_are_errors() {
    let mut t = tracker(vec![rw(4)], 1, 2);
    assert!(matches!(
        t.bind_step(0, &[], None),
        Err(PolicyError::BindingMismatch {
            expected: 1,
            got: 0
        })
    ));
    assert!(matches!(
        t.bind_step(2, &[b(1, 1)], None),
        Err(PolicyError::NoSuchReservation { .. })
    ));
    assert!(matches!(
        t.fallback_to_copy(0, 5, FailedCall::Map),
        Err(PolicyError::NoSuchSlot { .. })
    ));
    let bad = SlotTracker::new(
        "x",
        vec![SlotInfo::new(4, true, true, -0.5)],
        TrackerConfig::new(h200(), Threshold::Auto),
    );
    assert!(bad.is_err());
}

/// Host simulation of the runtime: executes the tracker's actions on plain
/// byte buffers and runs a "graph" `out[i] = in[i] + step` through whatever
/// is mapped at each slot, with random driver failures injected.
#[test]
fn simulated_binding_loses_no_data_at_any_threshold_with_failures() {
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Va {
        Empty,
        User(u64),
        Shadow,
    }
    for threshold in [0u64, 1, 4096, 1 << 20] {
        let mut rng = Rng(0xC0FFEE ^ threshold);
        // Slot 0: input (read), slot 1: output (written), slot 2: in/out, slot 3: big input.
        let slots = vec![
            SlotInfo::new(64, true, false, 1.0),
            SlotInfo::new(64, false, true, 1.0),
            SlotInfo::new(4096, true, true, 1.0),
            SlotInfo::new(256 << 10, true, false, 1.0),
        ];
        let sizes: Vec<usize> = slots.iter().map(|s| s.size as usize).collect();
        let nres = 2;
        let mut t = tracker(slots, threshold, nres);
        let mut user: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut va = vec![vec![Va::Empty; 4]; nres];
        let mut shadow: Vec<Vec<Vec<u8>>> = (0..nres)
            .map(|_| sizes.iter().map(|&s| vec![0; s]).collect())
            .collect();
        let mut next_id = 1u64;
        let mut held: Vec<u64> = vec![0; 4];
        for step in 0..60u64 {
            let r = (step % 2) as usize;
            // Inputs: new allocation with random contents some steps; outputs always new.
            for i in 0..4 {
                let fresh = held[i] == 0 || i == 1 || rng.bool(0.5);
                if fresh {
                    held[i] = next_id;
                    let data = (0..sizes[i]).map(|_| rng.next_u64() as u8).collect();
                    user.insert(next_id, data);
                    next_id += 1;
                } else if i != 1 {
                    // Same allocation, new contents written by someone else.
                    for byte in user.get_mut(&held[i]).unwrap().iter_mut().take(8) {
                        *byte = byte.wrapping_add(1);
                    }
                }
            }
            let binds: Vec<Binding> = held.iter().map(|&id| b(id, id * 0x10000)).collect();
            let expect_in: Vec<Vec<u8>> = held.iter().map(|id| user[id].clone()).collect();
            let acts = t.bind_step(r, &binds, None).unwrap().clone();
            for (i, &a) in acts.actions.iter().enumerate() {
                let mut a = a;
                if let SlotAction::Remap { unmap_old } = a {
                    if rng.bool(0.1) {
                        let call = match rng.next_u64() % 3 {
                            0 if unmap_old => FailedCall::Unmap,
                            1 => FailedCall::SetAccess,
                            _ => FailedCall::Map,
                        };
                        // What the failed call leaves at the slot.
                        va[r][i] = match call {
                            FailedCall::Unmap => va[r][i],
                            FailedCall::Map => Va::Empty,
                            FailedCall::SetAccess => Va::User(held[i]),
                        };
                        a = t.fallback_to_copy(r, i, call).unwrap().action;
                    }
                }
                match a {
                    SlotAction::Skip => {
                        assert_eq!(va[r][i], Va::User(held[i]), "skip with a different mapping")
                    }
                    SlotAction::Remap { unmap_old } => {
                        assert_eq!(unmap_old, va[r][i] != Va::Empty);
                        va[r][i] = Va::User(held[i]);
                    }
                    SlotAction::Copy {
                        map_shadow,
                        unmap_old,
                        copy_in,
                        ..
                    } => {
                        if map_shadow {
                            assert_eq!(unmap_old, va[r][i] != Va::Empty);
                            va[r][i] = Va::Shadow;
                        }
                        assert_eq!(va[r][i], Va::Shadow);
                        if copy_in {
                            shadow[r][i] = user[&held[i]].clone();
                        }
                    }
                }
            }
            // The graph: reads slots 0, 2, 3 and writes 1, 2 through the VA.
            let read = |i: usize,
                        va: &Vec<Vec<Va>>,
                        shadow: &Vec<Vec<Vec<u8>>>,
                        user: &HashMap<u64, Vec<u8>>| match va[r][i] {
                Va::User(id) => user[&id].clone(),
                Va::Shadow => shadow[r][i].clone(),
                Va::Empty => panic!("slot {i} unmapped at launch"),
            };
            for i in [0, 2, 3] {
                assert_eq!(
                    read(i, &va, &shadow, &user),
                    expect_in[i],
                    "threshold {threshold} step {step} slot {i}"
                );
            }
            let x = read(0, &va, &shadow, &user);
            let out1: Vec<u8> = x.iter().map(|v| v.wrapping_add(step as u8)).collect();
            let out2: Vec<u8> = read(2, &va, &shadow, &user)
                .iter()
                .map(|v| v ^ 0x5a)
                .collect();
            for (i, data) in [(1usize, out1.clone()), (2, out2.clone())] {
                match va[r][i] {
                    Va::User(id) => *user.get_mut(&id).unwrap() = data,
                    Va::Shadow => shadow[r][i] = data,
                    Va::Empty => panic!("slot {i} unmapped at launch"),
                }
            }
            // Copy-outs after the step.
            for i in [1, 2] {
                if va[r][i] == Va::Shadow {
                    *user.get_mut(&held[i]).unwrap() = shadow[r][i].clone();
                }
            }
            assert_eq!(
                user[&held[1]], out1,
                "threshold {threshold} step {step}: output lost"
            );
            assert_eq!(
                user[&held[2]], out2,
                "threshold {threshold} step {step}: in/out lost"
            );
        }
        let s = t.stats();
        assert_eq!(s.steps, 60);
        assert_eq!(s.skips + s.remaps + s.copies, 240, "threshold {threshold}");
        if threshold == 0 {
            assert!(s.fallbacks > 0, "failure injection never hit a remap");
        }
        if let Some(p) = t.plan() {
            if threshold == 1 {
                assert_eq!(
                    p.decisions[3],
                    Decision::Copy,
                    "256 KiB input is under the H200 break-even"
                );
            }
        }
    }
}

#[test]
fn copy_only_slot_is_planned_as_copy_and_never_switches() {
    // Slot 0 marked copy-only before the first step (e.g. its buffer turned
    // out sub-allocated); it keeps the same buffer forever, which would
    // move a normal copy slot to direct mapping.
    let mut t = tracker(vec![rw(64 << 20), SlotInfo::new(16, true, true, 0.0)], 0, 2);
    t.set_remappable(1, false).unwrap();
    for step in 0..50u64 {
        let r = (step % 2) as usize;
        let a = t.bind_step(r, &[b(1, 0x1000), b(2, 0x2000)], None).unwrap();
        assert!(
            matches!(
                a.actions[1],
                SlotAction::Copy {
                    copy_in: true,
                    copy_out: true,
                    ..
                }
            ),
            "step {step}: {:?}",
            a.actions[1]
        );
    }
    let plan = t.plan().unwrap();
    assert_eq!(plan.decisions, vec![Decision::Remap, Decision::Copy]);
    assert_eq!(plan.counts.copy_only, 1);
    let s = t.stats();
    assert_eq!(s.fallbacks, 0, "planned, not a fallback: {s:?}");
    assert_eq!(s.mode_switches, 0);
    assert_eq!(s.copies, 50);
    // The plan is frozen now.
    assert!(matches!(
        t.set_remappable(1, true),
        Err(PolicyError::InvalidSlot { index: 1, .. })
    ));
    assert!(matches!(
        t.set_remappable(9, false),
        Err(PolicyError::NoSuchSlot { index: 9, .. })
    ));
}

#[test]
fn shared_shadows_are_counted_once_per_slot_in_whole_granules() {
    let g = 2u64 << 20;
    let mut dev = h200();
    dev.granularity_bytes = g;
    let mut cfg = TrackerConfig::new(dev, Threshold::from(4096));
    cfg.shared_shadows = true;
    // A 4-byte slot copied (one granule), a 3 MiB slot remapped.
    let mut t = SlotTracker::new("shared", vec![rw(4), rw(3 << 20)], cfg).unwrap();
    t.bind_step(0, &[b(1, 0x1000), b(2, 0x2000)], None).unwrap();
    let plan = t.plan().unwrap();
    assert_eq!(plan.decisions, vec![Decision::Copy, Decision::Remap]);
    assert_eq!(plan.shadow_bytes, g);
    // A failed map of the remapped slot adds its shadow, also whole
    // granules, once.
    let fb = t.fallback_to_copy(0, 1, FailedCall::Map).unwrap();
    assert_eq!(fb.new_shadow_bytes, 2 * g);
    assert_eq!(t.shadow_bytes(), 3 * g);
}

//! Property-style tests over many random slot lists and devices (fixed seed):
//! the shadow cap is never exceeded, churn-0 slots are always skipped, auto
//! admits smallest first, respects its copy budget and never costs more than
//! the reference rule it generalizes.

mod common;

use common::Rng;
use xla_vmm_policy::{
    decide, Binding, Decision, DeviceCosts, Knobs, PolicyInput, SlotInfo, SlotTracker, StepTimes,
    Threshold, TrackerConfig,
};

fn random_input(rng: &mut Rng) -> PolicyInput {
    let total = rng.log_u64(1 << 30, 192 << 30);
    let device = DeviceCosts {
        remap_us: rng.range(2.0, 5000.0),
        copy_bw_bytes_per_s: rng.range(1e10, 6e12),
        copy_launch_us: rng.range(0.0, 20.0),
        free_bytes: if rng.bool(0.05) {
            0
        } else {
            rng.log_u64(1, total)
        },
        total_bytes: total,
        granularity_bytes: 0,
    };
    let n = (rng.next_u64() % 300) as usize;
    let slots = (0..n)
        .map(|_| {
            let churn = if rng.bool(0.3) {
                0.0
            } else if rng.bool(0.3) {
                1.0
            } else {
                rng.f64()
            };
            // A slot is one buffer of this device: at most its memory.
            let size = rng.log_u64(1, (4u64 << 30).min(total));
            let mut s = SlotInfo::new(size, rng.bool(0.7), rng.bool(0.5), churn);
            if rng.bool(0.1) {
                s.history = Some((0..(rng.next_u64() % 20)).map(|_| rng.bool(0.5)).collect());
            }
            s
        })
        .collect();
    let threshold = match rng.next_u64() % 4 {
        0 => Threshold::RemapAll,
        1 => Threshold::Bytes(rng.log_u64(2, 1 << 30)),
        _ => Threshold::Auto,
    };
    let step = rng.bool(0.3).then(|| StepTimes {
        host_us: rng.range(0.0, 5e4),
        gpu_us: rng.range(0.0, 5e4),
    });
    let mut knobs = Knobs::default();
    if rng.bool(0.2) {
        knobs.shadow_free_fraction = rng.range(0.0, 0.05);
    }
    PolicyInput {
        device,
        threshold,
        slots,
        step,
        knobs,
    }
}

#[test]
fn random_inputs_respect_every_invariant() {
    let mut rng = Rng(0x5EED_2026);
    let mut autos = 0;
    let mut copies_seen = 0;
    let (mut compared, mut reference_won, mut strictly_better) = (0, 0, 0);
    for case in 0..3000 {
        let inp = random_input(&mut rng);
        let plan = decide(&inp).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let k = &inp.knobs;
        let ctx = format!("case {case} threshold {:?}", inp.threshold);
        assert_eq!(plan.decisions.len(), inp.slots.len(), "{ctx}");
        // Shadow memory: exact accounting, under the cap, never over free memory.
        let shadow: u64 = inp
            .slots
            .iter()
            .zip(&plan.decisions)
            .filter(|(_, &d)| d == Decision::Copy)
            .map(|(s, _)| k.shadow_bytes_for(s.size, inp.device.granularity_bytes))
            .sum();
        assert_eq!(plan.shadow_bytes, shadow, "{ctx}");
        assert!(plan.shadow_bytes <= plan.shadow_cap_bytes, "{ctx}");
        assert!(plan.shadow_bytes <= inp.device.free_bytes, "{ctx}");
        // Churn 0 (after history) is skip, and only it.
        for (i, (s, d)) in inp.slots.iter().zip(&plan.decisions).enumerate() {
            let p = s.effective_churn(k.churn_ewma_alpha);
            assert_eq!(p == 0.0, *d == Decision::Skip, "{ctx} slot {i}");
        }
        let c = plan.counts;
        assert_eq!(c.skip + c.remap + c.copy, inp.slots.len(), "{ctx}");
        copies_seen += c.copy;
        match inp.threshold {
            Threshold::RemapAll => assert_eq!(c.copy, 0, "{ctx}"),
            Threshold::Bytes(n) => {
                for (s, d) in inp.slots.iter().zip(&plan.decisions) {
                    if *d == Decision::Copy {
                        assert!(s.size <= n, "{ctx}");
                    }
                }
            }
            Threshold::Auto => {
                autos += 1;
                assert!(plan.copy_us_per_step <= plan.copy_budget_us + 1e-9, "{ctx}");
                let r = plan.reference.expect("auto reports the reference");
                if r.feasible {
                    compared += 1;
                    reference_won += usize::from(plan.rule == xla_vmm_policy::Rule::AutoReference);
                    let ours = plan.step_us.unwrap_or(plan.binding_us_per_step());
                    let theirs = match inp.step {
                        Some(s) => {
                            (s.host_us + r.remap_us_per_step).max(s.gpu_us + r.copy_us_per_step)
                        }
                        None => r.copy_us_per_step + r.remap_us_per_step,
                    };
                    assert!(
                        ours <= theirs * (1.0 + 1e-9) + 1e-9,
                        "{ctx}: ours {ours} > reference {theirs}"
                    );
                    strictly_better += usize::from(ours < theirs * (1.0 - 1e-6));
                }
                smallest_first(&inp, &plan.decisions, &ctx);
            }
        }
    }
    eprintln!("{autos} auto cases, {compared} compared with the reference, reference set kept in {reference_won}, ours strictly cheaper in {strictly_better}");
    assert!(
        autos > 1000 && copies_seen > 1000,
        "generator too narrow: {autos} autos, {copies_seen} copies"
    );
    assert!(
        compared > 500,
        "too few feasible reference sets: {compared}"
    );
}

/// If slot j is copied, any changing slot i that is smaller, needs the same
/// directions and changes at least as often is copied too.
fn smallest_first(inp: &PolicyInput, d: &[Decision], ctx: &str) {
    let alpha = inp.knobs.churn_ewma_alpha;
    for (j, sj) in inp
        .slots
        .iter()
        .enumerate()
        .filter(|(j, _)| d[*j] == Decision::Copy)
    {
        let pj = sj.effective_churn(alpha);
        for (i, si) in inp.slots.iter().enumerate() {
            let pi = si.effective_churn(alpha);
            if si.size < sj.size
                && si.read == sj.read
                && si.written == sj.written
                && pi >= pj
                && pi > 0.0
            {
                assert_eq!(
                    d[i],
                    Decision::Copy,
                    "{ctx}: slot {j} ({} B) copied before slot {i} ({} B)",
                    sj.size,
                    si.size
                );
            }
        }
    }
}

#[test]
fn random_inputs_respect_the_cap_in_granules() {
    let mut rng = Rng(0x6A4E_2026);
    let mut copies_seen = 0;
    for case in 0..1500 {
        let mut inp = random_input(&mut rng);
        inp.device.granularity_bytes = [1u64, 4096, 2 << 20][case % 3];
        let g = inp.device.granularity_bytes;
        let plan = decide(&inp).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let k = &inp.knobs;
        // Every copied slot, copy-only ones included, counted as whole
        // granules; the total under the cap.
        let granules: u64 = inp
            .slots
            .iter()
            .zip(&plan.decisions)
            .filter(|(_, &d)| d == Decision::Copy)
            .map(|(s, _)| s.size.div_ceil(g) * g * u64::from(k.shadow_copies))
            .sum();
        assert_eq!(plan.shadow_bytes, granules, "case {case}");
        assert!(plan.shadow_bytes <= plan.shadow_cap_bytes, "case {case}");
        copies_seen += plan.counts.copy;
    }
    assert!(copies_seen > 500, "generator too narrow: {copies_seen}");
}

#[test]
fn tracker_never_grows_shadow_without_a_fallback() {
    let mut rng = Rng(0xABCD);
    for case in 0..200 {
        let inp = random_input(&mut rng);
        let mut cfg = TrackerConfig::new(inp.device.clone(), inp.threshold);
        cfg.knobs = inp.knobs.clone();
        let mut t = SlotTracker::new(format!("case{case}"), inp.slots.clone(), cfg).unwrap();
        let mut ids: Vec<u64> = (0..inp.slots.len() as u64).collect();
        let mut next = ids.len() as u64;
        for step in 0..30 {
            for (i, id) in ids.iter_mut().enumerate() {
                if rng.bool(inp.slots[i].churn) {
                    *id = next;
                    next += 1;
                }
            }
            let binds: Vec<Binding> = ids
                .iter()
                .map(|&id| Binding { id, addr: id << 21 })
                .collect();
            let acts = t.bind_step(step % 2, &binds, None).unwrap();
            assert_eq!(acts.actions.len(), inp.slots.len());
            let plan = t.plan().unwrap();
            assert!(t.shadow_bytes() <= plan.shadow_cap_bytes, "case {case}");
        }
        let s = t.stats();
        assert_eq!(
            s.skips + s.remaps + s.copies,
            30 * inp.slots.len() as u64,
            "case {case}"
        );
    }
}

//! The decision: slots + costs + threshold in, [`BindingPlan`] out. Stateless and
//! deterministic; see the crate docs for the rule and why.

use crate::cost::{self, StepCost};
use crate::error::Result;
use crate::input::{PolicyInput, Threshold};
use crate::plan::{BindingPlan, Counts, Decision, ReferenceSummary, Rule};

/// Decides skip / remap / copy for every slot of `input`.
///
/// Bad numbers (NaN, negative costs, churn outside `[0, 1]`, more free than
/// total memory, ...) are reported as [`crate::PolicyError`]; nothing panics.
pub fn decide(input: &PolicyInput) -> Result<BindingPlan> {
    input.validate()?;
    let ctx = Ctx::new(input);
    let (copy, rule, limited, reference) = match input.threshold {
        Threshold::RemapAll => (ctx.forced.clone(), Rule::RemapAll, 0, None),
        Threshold::Bytes(n) => {
            let (set, limited) = ctx.fixed_set(n);
            (set, Rule::Fixed, limited, None)
        }
        Threshold::Auto => ctx.auto_set(),
    };
    Ok(ctx.plan(copy, rule, limited, reference))
}

/// Validated input plus the derived per-slot churn, caps and sort order.
struct Ctx<'a> {
    input: &'a PolicyInput,
    /// Effective churn per slot (history-weighted when a history is given).
    churn: Vec<f64>,
    /// Shadow memory cap, bytes.
    cap: u64,
    /// Copy-time budget, µs.
    budget: f64,
    /// Copy-only slots (not remappable): copied under every threshold.
    forced: Vec<bool>,
    /// Changing remappable slots (churn > 0), smallest first, ties by index.
    order: Vec<usize>,
}

impl<'a> Ctx<'a> {
    fn new(input: &'a PolicyInput) -> Self {
        let alpha = input.knobs.churn_ewma_alpha;
        let churn: Vec<f64> = input
            .slots
            .iter()
            .map(|s| s.effective_churn(alpha))
            .collect();
        let forced: Vec<bool> = input.slots.iter().map(|s| !s.remappable).collect();
        let mut order: Vec<usize> = (0..input.slots.len())
            .filter(|&i| churn[i] > 0.0 && !forced[i])
            .collect();
        order.sort_by_key(|&i| (input.slots[i].size, i));
        let all_remap_us = StepCost::all_remap(&input.device, &churn).remap_us;
        Ctx {
            input,
            cap: input.knobs.shadow_cap_bytes(input.device.free_bytes),
            budget: input
                .knobs
                .copy_budget_us(input.step.as_ref(), all_remap_us),
            churn,
            forced,
            order,
        }
    }

    /// The cost with only the copy-only slots copied (the starting point
    /// of every rule: their copies and shadows are unavoidable).
    fn forced_cost(&self) -> StepCost {
        self.cost_of(&self.forced)
    }

    /// The cost of copying exactly the slots marked in `set`.
    fn cost_of(&self, set: &[bool]) -> StepCost {
        let dev = &self.input.device;
        let mut c =
            StepCost::all_remap_held(dev, &self.input.knobs, &self.input.slots, &self.churn);
        for (i, _) in set.iter().enumerate().filter(|(_, &c)| c) {
            c.move_to_copy(dev, &self.input.knobs, &self.input.slots[i], self.churn[i]);
        }
        c
    }

    fn objective(&self, c: &StepCost) -> (f64, f64) {
        cost::objective(
            self.input.step.as_ref(),
            c.copy_us(&self.input.device),
            c.remap_us,
        )
    }

    /// Threshold N: changing slots of at most N bytes, smallest first, while
    /// their shadows fit the cap (the copy-only slots' shadows counted
    /// first). The explicit cutoff is honoured as given (no cost test, no
    /// copy-time budget); only memory safety overrides it.
    fn fixed_set(&self, n: u64) -> (Vec<bool>, usize) {
        let knobs = &self.input.knobs;
        let mut set = self.forced.clone();
        let mut shadow = self.forced_cost().shadow_bytes;
        let (mut limited, mut full) = (0usize, false);
        for &i in self
            .order
            .iter()
            .filter(|&&i| self.input.slots[i].size <= n)
        {
            let sb = if self.input.slots[i].has_shadow {
                0
            } else {
                knobs.shadow_bytes_for(
                    self.input.slots[i].size,
                    self.input.device.granularity_bytes,
                )
            };
            if !full && shadow.saturating_add(sb) <= self.cap {
                shadow += sb;
                set[i] = true;
            } else {
                // Keep the cutoff monotone: once a slot does not fit, no
                // larger one is admitted either.
                full = true;
                limited += 1;
            }
        }
        (set, limited)
    }

    /// Threshold 1: our rule, checked against the reference rule.
    fn auto_set(&self) -> (Vec<bool>, Rule, usize, Option<ReferenceSummary>) {
        let (ours, limited) = self.greedy_set();
        let (reference, summary) = self.reference_set();
        let ours_obj = self.objective(&self.cost_of(&ours));
        let ref_obj = self.objective(&self.cost_of(&reference));
        if summary.feasible && cost::better(ref_obj, ours_obj) {
            (reference, Rule::AutoReference, limited, Some(summary))
        } else {
            (ours, Rule::Auto, limited, Some(summary))
        }
    }

    /// Admit changing slots smallest first, on top of the copy-only slots
    /// (always copied, counted first). A slot is admitted when its own
    /// bytes cost less than the remaps it saves (launch counted as already
    /// paid: batching shares it) and the shadow cap and copy budget still
    /// hold. The launch is then charged by choosing, among the prefixes of
    /// the admitted sequence, the one with the lowest expected step cost.
    fn greedy_set(&self) -> (Vec<bool>, usize) {
        let dev = &self.input.device;
        let knobs = &self.input.knobs;
        let step = self.input.step.as_ref();
        let mut acc = self.forced_cost();
        let mut admitted: Vec<usize> = Vec::new();
        let mut best = (self.objective(&acc), 0usize);
        let mut limited = 0usize;
        let candidates: Vec<usize> = self
            .order
            .iter()
            .copied()
            .filter(|&i| self.input.slots[i].size <= knobs.max_copy_slot_bytes)
            .collect();
        for (pos, &i) in candidates.iter().enumerate() {
            let slot = &self.input.slots[i];
            let mut trial = acc;
            trial.move_to_copy(dev, knobs, slot, self.churn[i]);
            // Marginal judgement: launches of both directions counted on both
            // sides, so only the slot's bytes and saved remaps differ.
            let open =
                |c: &StepCost| cost::objective(step, c.copy_us_with(dev, true, true), c.remap_us);
            if !cost::better(open(&trial), open(&acc)) {
                continue;
            }
            // Only new shadow memory is checked (a held shadow costs none).
            if trial.shadow_bytes > acc.shadow_bytes && trial.shadow_bytes > self.cap {
                // Sizes only grow from here, so no later slot without a
                // shadow fits either (one that holds a shadow still may).
                if candidates[pos + 1..]
                    .iter()
                    .any(|&j| self.input.slots[j].has_shadow)
                {
                    limited += 1;
                    continue;
                }
                limited += 1 + candidates[pos + 1..]
                    .iter()
                    .filter(|&&j| self.pays_alone(j))
                    .count();
                break;
            }
            if trial.copy_us(dev) > self.budget {
                limited += 1;
                continue;
            }
            acc = trial;
            admitted.push(i);
            let obj = self.objective(&acc);
            if cost::better(obj, best.0) {
                best = (obj, admitted.len());
            }
        }
        let mut set = self.forced.clone();
        for &i in &admitted[..best.1] {
            set[i] = true;
        }
        (set, limited)
    }

    /// The slot's bytes alone cost less than the remaps it would save.
    fn pays_alone(&self, i: usize) -> bool {
        let s = &self.input.slots[i];
        let copy = f64::from(s.directions())
            * cost::transfer_us(s.size, self.input.device.copy_bw_bytes_per_s);
        copy < self.churn[i] * self.input.device.remap_us
    }

    /// The reference rule (ROCm XLA PR #926), re-derived: per-slice cap
    /// `R·B/2` (at most 256 MiB), sizes ascending, accumulate `2·size` while
    /// under the shadow fraction of free memory; the cutoff is the last size
    /// admitted. It does not know churn, so every slot counts toward its
    /// budget; here only changing slots under the cutoff are then copied
    /// (churn-0 slots are skipped under every threshold), plus the
    /// copy-only slots.
    fn reference_set(&self) -> (Vec<bool>, ReferenceSummary) {
        let dev = &self.input.device;
        let slots = &self.input.slots;
        let per_slot = cost::reference_break_even_bytes(dev).min(256.0 * 1024.0 * 1024.0);
        let mem_cap = self.input.knobs.shadow_free_fraction * dev.free_bytes as f64;
        let mut sizes: Vec<u64> = slots.iter().map(|s| s.size).collect();
        sizes.sort_unstable();
        let (mut acc, mut cutoff) = (0.0f64, 0u64);
        for s in sizes {
            if s as f64 > per_slot || acc + 2.0 * s as f64 > mem_cap {
                break;
            }
            acc += 2.0 * s as f64;
            cutoff = s;
        }
        let set: Vec<bool> = (0..slots.len())
            .map(|i| {
                self.forced[i] || (cutoff > 0 && self.churn[i] > 0.0 && slots[i].size <= cutoff)
            })
            .collect();
        let c = self.cost_of(&set);
        let summary = ReferenceSummary {
            threshold_bytes: cutoff,
            copy_us_per_step_unbatched: c.copy_us_unbatched(dev),
            copy_us_per_step: c.copy_us(dev),
            remap_us_per_step: c.remap_us,
            shadow_bytes: c.shadow_bytes,
            feasible: c.shadow_bytes <= self.cap && c.copy_us(dev) <= self.budget,
        };
        (set, summary)
    }

    fn plan(
        &self,
        copy: Vec<bool>,
        rule: Rule,
        limited: usize,
        reference: Option<ReferenceSummary>,
    ) -> BindingPlan {
        let dev = &self.input.device;
        let c = self.cost_of(&copy);
        let decisions: Vec<Decision> = copy
            .iter()
            .zip(&self.churn)
            .map(|(&copied, &p)| match (copied, p > 0.0) {
                (true, _) => Decision::Copy,
                (false, true) => Decision::Remap,
                (false, false) => Decision::Skip,
            })
            .collect();
        let count = |d: Decision| decisions.iter().filter(|&&x| x == d).count();
        let threshold_bytes = match self.input.threshold {
            Threshold::RemapAll => 0,
            Threshold::Bytes(n) => n,
            // Copy-only slots are copied whatever the cutoff: not counted.
            Threshold::Auto => copy
                .iter()
                .zip(&self.input.slots)
                .filter(|(&c, s)| c && s.remappable)
                .map(|(_, s)| s.size)
                .max()
                .unwrap_or(0),
        };
        let copy_us = c.copy_us(dev);
        BindingPlan {
            threshold: self.input.threshold,
            threshold_bytes,
            counts: Counts {
                skip: count(Decision::Skip),
                remap: count(Decision::Remap),
                copy: count(Decision::Copy),
                budget_limited: limited,
                copy_only: self.forced.iter().filter(|&&f| f).count(),
            },
            decisions,
            shadow_bytes: c.shadow_bytes,
            shadow_cap_bytes: self.cap,
            copy_us_per_step: copy_us,
            remap_us_per_step: c.remap_us,
            copy_in_bytes_per_step: c.copy_in_bytes,
            copy_out_bytes_per_step: c.copy_out_bytes,
            copy_launches_per_step: c.copy_launches(),
            copy_budget_us: self.budget,
            break_even_bytes_read_write: cost::break_even_bytes(dev, 1.0, 2, true) as u64,
            break_even_bytes_one_way: cost::break_even_bytes(dev, 1.0, 1, true) as u64,
            step_us: self.input.step.map(|_| self.objective(&c).0),
            rule,
            reference,
        }
    }
}

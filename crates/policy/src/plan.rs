//! The decision's output: one [`Decision`] per slot plus what it costs.

use serde::{Deserialize, Serialize};

use crate::input::Threshold;

/// What happens to one slot on a step where its buffer may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The slot's allocation does not change (churn 0): it stays mapped.
    Skip,
    /// The user's allocation is mapped at the slot's address when it changes.
    Remap,
    /// The slot has its own shadow; data is copied in / out each step.
    Copy,
}

/// Which rule produced the copy set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Threshold 0: no copies.
    RemapAll,
    /// Threshold N: slots of at most N bytes copied (within the shadow cap).
    Fixed,
    /// Auto: the churn-, direction-, batch- and bound-aware rule won.
    Auto,
    /// Auto: the reference rule's set was cheaper under our cost model (it is
    /// always evaluated, so auto never does worse than it).
    AutoReference,
}

/// How many slots got each decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Slots that never change.
    pub skip: usize,
    /// Slots remapped when they change.
    pub remap: usize,
    /// Slots copied each step.
    pub copy: usize,
    /// Slots that would have been copied (size under the cutoff and paying
    /// for themselves) but the shadow cap or copy-time budget kept out.
    pub budget_limited: usize,
    /// Of the `copy` slots, those copied because they are not remappable
    /// (copy-only under every threshold).
    #[serde(default)]
    pub copy_only: usize,
}

/// What the reference (ROCm XLA) rule would have done, for comparison.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReferenceSummary {
    /// Its size cutoff.
    pub threshold_bytes: u64,
    /// Its copies executed as it does them (one operation per slot and
    /// direction), expected µs per step.
    pub copy_us_per_step_unbatched: f64,
    /// Its copies if batched like ours, µs per step.
    pub copy_us_per_step: f64,
    /// Expected remap µs per step of the slots it leaves to remap.
    pub remap_us_per_step: f64,
    /// Shadow memory it needs (our accounting).
    pub shadow_bytes: u64,
    /// False if its set breaks our shadow cap or copy budget.
    pub feasible: bool,
}

/// The binding plan of one executable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BindingPlan {
    /// The setting it was made under (raw: 0, 1 or N).
    pub threshold: Threshold,
    /// The size cutoff in force: `N`, `0` for remap-all, or under auto the
    /// largest copied slot (`0` if none). Under auto a slot at or below it can
    /// still be remapped when its churn or directions make a copy not pay.
    pub threshold_bytes: u64,
    /// One decision per slot, in slot order.
    pub decisions: Vec<Decision>,
    /// Shadow memory of all copy slots, both reservations, bytes.
    pub shadow_bytes: u64,
    /// The shadow memory cap (fraction of free memory), bytes.
    pub shadow_cap_bytes: u64,
    /// Expected GPU µs per step spent on batched copies.
    pub copy_us_per_step: f64,
    /// Expected host µs per step spent on remaps (churn-weighted).
    pub remap_us_per_step: f64,
    /// Bytes copied in per step.
    pub copy_in_bytes_per_step: u64,
    /// Bytes copied out per step.
    pub copy_out_bytes_per_step: u64,
    /// Batched copy operations per step (0, 1 or 2).
    pub copy_launches_per_step: u32,
    /// The copy-time budget in force (auto only enforces it), µs.
    pub copy_budget_us: f64,
    /// Per-slot break-even for a slot read and written every step, with the
    /// launch shared by the batch: `R · B / 2` (bytes).
    pub break_even_bytes_read_write: u64,
    /// The same for a slot copied one way only: `R · B` (bytes).
    pub break_even_bytes_one_way: u64,
    /// Expected step time with this plan, if step times were given, µs.
    pub step_us: Option<f64>,
    /// Which rule produced the copy set.
    pub rule: Rule,
    /// Decision counts.
    pub counts: Counts,
    /// The reference rule's result (auto only).
    pub reference: Option<ReferenceSummary>,
}

impl BindingPlan {
    /// The decision of slot `index`, if it exists.
    pub fn decision(&self, index: usize) -> Option<Decision> {
        self.decisions.get(index).copied()
    }

    /// Expected binding cost per step (copies + remaps), µs.
    pub fn binding_us_per_step(&self) -> f64 {
        self.copy_us_per_step + self.remap_us_per_step
    }
}

//! # xla-vmm-policy: skip, remap or copy, per slot, per step
//!
//! An executable's graph is recorded once against fixed VA reservations. Each
//! step the user's buffers for its parameters and outputs (its *slots*) must
//! appear at those fixed addresses. Per slot there are three ways:
//!
//! * **skip** — the allocation bound to the slot is the one already mapped
//!   there (compared by allocation id, never by address: an address can be
//!   reused by a new allocation). Free.
//! * **remap** — unmap the old allocation, map the new one, set access. Host
//!   time, roughly fixed per slot (`R` ≈ 46 µs on H200, CUDA 13), paid only on
//!   steps where the allocation changed.
//! * **copy** — the slot is backed by its own *shadow*; the user buffer is
//!   copied in before the launch if the graph reads the slot and copied back
//!   after if it writes it. GPU time, paid on *every* step (the shadow is not
//!   the user's memory, so even an unchanged allocation may hold new data),
//!   plus shadow memory (whole allocation granules: see the shadow cap).
//!
//! This crate decides which, from plain data, without touching a device.
//! It is safe Rust only. Start reading at [`decide`] (stateless: the rule)
//! and [`SlotTracker`] (stateful: applies it step by step, counts).
//!
//! ## The threshold (`XLA_VMM_TMP_COPY_THRESHOLD`, [`Threshold`])
//!
//! * `0` — remap every changing slot. The baseline of the A/B comparison.
//! * `N > 1` — changing slots of at most `N` bytes are copied, smallest first
//!   while their shadows fit the shadow cap (memory safety is the only thing
//!   that overrides an explicit `N`); larger ones are remapped.
//! * `1` (default) — auto, below.
//!
//! Under every threshold a slot whose churn is 0 (its allocation never
//! changes, e.g. a donated parameter aliased with its output) is **skip**:
//! it is mapped once and costs nothing either way, so giving it a shadow
//! would only add copies.
//!
//! A **copy-only** slot ([`SlotInfo::remappable`] `false`: its buffers cannot
//! be mapped, e.g. they are sub-allocated from a larger block) is **copy**
//! under every threshold, whatever its churn: there is no other way to serve
//! it. It is planned as a copy slot from the start (not a fallback), its
//! shadow and copy time are counted first, so the cap and the copy budget
//! that other slots are admitted against already include them, and it never
//! moves to direct mapping. (Its shadow can exceed the cap on its own: the
//! cap bounds what the rule chooses, not what it must do.)
//!
//! ## The reference rule (ROCm XLA, PR #926), which auto must match
//!
//! Copy a slice when `2·s/B < R`, i.e. `s < R·B/2` (a copy in and a copy out
//! of `s` bytes at bandwidth `B` against one remap); admit slices smallest
//! first while the per-slice break-even holds and `Σ 2·s` stays under ~1 % of
//! free HBM; freeze the cutoff after the first step. It assumes every slice
//! is copied both ways, pays no launch cost, changes every step, and that
//! remap time and copy time add.
//!
//! ## Our rule (threshold 1)
//!
//! (Its inputs are measured, not assumed: see "What auto measures" below.)
//!
//! Cost model ([`cost`]): a remap slot costs `p·R` µs of host time per step,
//! where `p` is its **churn** (fraction of steps its allocation changes; a
//! history, if known, is averaged with more weight on recent steps). A copy
//! slot costs `d·s/B` of GPU time per step, `d ∈ {0,1,2}` being the
//! **directions** it needs (in if read, out if written), and the step's copies
//! are **batched**: one operation per direction, so the launch cost `L` is
//! paid once per direction used, not per slot. So the marginal break-even of
//! a slot is `s < p·R·B/d` (the reference's `R·B/2` is the case `p=1, d=2`);
//! without batching it would be `s < (p·R/d − L)·B`.
//!
//! Step time: unknown bound → remap and copy time add. With measured host
//! time `H` and GPU time `G` of the step, binding step `n+1` overlaps the GPU
//! running step `n` (two reservations), so the step takes
//! `max(H + remap, G + copy)`: in a GPU-bound step remaps hide in the slack
//! and copies (on the critical path) do not pay; in a host-bound step copies
//! are nearly free and every remap saved counts.
//!
//! Selection:
//! 1. Candidates: changing slots (`p > 0`) of at most 256 MiB (safety rail),
//!    smallest first. Why smallest first: every copy slot saves about one
//!    remap per change whatever its size, while its shadow and its bytes
//!    grow with size, so small slots buy the most saved remaps per byte of
//!    the memory cap and per µs of the copy budget.
//! 2. Admit a candidate when copying it lowers the step cost counting only
//!    its bytes (its direction's launch is shared), its shadow still fits the
//!    **shadow cap** (1 % of free memory; every shadow counted as it is
//!    allocated: rounded up to whole granules of the device's allocation
//!    granularity, [`DeviceCosts::granularity_bytes`], e.g. 2 MiB for a
//!    4-byte slot on H200, or to 256 B when it is not known; one per
//!    reservation, or one per slot when the reservations share it, see
//!    [`TrackerConfig::shared_shadows`]: the cap can never cause an OOM),
//!    and the batched copy time stays under the **copy budget** (bound
//!    unknown: 100 µs or a
//!    tenth of what remapping every changing slot costs, whichever is more,
//!    so a wrong guess about the bound costs at most a tenth of the gain;
//!    bound known: 100 µs, 5 % of the GPU time, or the GPU's idle time in a
//!    host-bound step, whichever is most; see [`Knobs::copy_budget_us`]).
//! 3. Charge the launches: of the prefixes of the admitted sequence, keep the
//!    one with the lowest expected step cost (so a lone tiny copy that does
//!    not pay for its launch is dropped).
//! 4. Evaluate the reference rule's set under the same model and keep it
//!    instead if it is feasible (cap, budget) and cheaper: auto is never
//!    worse than the rule it generalizes, by construction.
//!
//! The cutoff reported (`threshold_bytes`) is the largest copied slot.
//!
//! ## What auto measures, when it freezes, and why
//!
//! Inputs, all measured in the process that runs the executable (the
//! runtime, `crates/runtime`):
//!
//! * **Costs** ([`DeviceCosts`]), at the executable's first VA-stable step,
//!   by a light probe run once per device per process and cached (three
//!   remaps of one granule on a scratch reservation, one 64 MiB device copy
//!   timed with events, eight tiny copies; a few ms on a GPU): `R`, `B` and
//!   the per-copy launch `L`. Free and total memory are read at each
//!   executable's first step. When copies run inside the step's graph (the
//!   runtime's copy kernel reading a descriptor table), a direction costs one
//!   kernel node, not a launch call, so `L` is a small constant (~2 µs) and a
//!   copy slot costs no host time. Without a probe (disabled, failed, or a
//!   backend without real costs) DESIGN §4's H200 figures are used.
//! * **Churn per slot**, observed per reservation over the warm-up (a
//!   change is an allocation id different from what that reservation had).
//! * **The step's bound**, over the warm-up: whether the previous step's
//!   completion event was still pending when the host came back to bind the
//!   next one (GPU-bound: host work, remaps included, overlaps the GPU), the
//!   host time between steps and the GPU time of a step (events around the
//!   graph launch, read only once complete, never waited for).
//!
//! When: the first step decides with the costs and the churn priors
//! (unknown bound: remap and copy time add) so that nothing waits for a
//! measurement. After a short warm-up (`tracker::DEFAULT_REPLAN_AFTER_STEPS`
//! steps) auto decides **once more** with the observed churn and the
//! measured bound, logs that decision at info level with its inputs, and
//! freezes it for good. Why once and early: every re-decision can move
//! slots between shadow and direct mapping (a remap each, and new shadow
//! memory), so deciding repeatedly on noisy step times would cost more than
//! it could save; a few steps are enough to see which slots keep their
//! buffers (donated state, ping-pong buffers: churn 0, skip: a slot that
//! stopped churning costs nothing either way) and which side bounds the
//! step. A GPU-bound step takes `max(H + remap, G + copy)`: remaps hide, so
//! fewer (large-ish) slots are copied; when the GPU was found idle the
//! runtime cannot tell a host-bound loop from a caller that waits for each
//! step, so it plans with costs added (copies are not assumed to hide).
//! Fixed thresholds (`0`, `N`) are decided at the first step only.
//!
//! Safety of the re-plan: it never changes addresses. Every slot has its
//! own region in the reservations from the first step and a shadow is a
//! separate allocation mapped at that region, so the recorded graphs stay
//! valid (never re-captured). Shadows already allocated stay allocated and
//! are counted against the cap ([`SlotInfo::has_shadow`]); new shadows are
//! admitted only within what the cap has left. A slot taken off copying maps
//! its allocation (one remap, after the reservation's event); one put on
//! copying maps its shadow at its next step on each reservation.
//!
//! Within the final plan, churn observed per slot still moves a copy slot
//! whose allocation stopped changing back to direct mapping once its copies
//! cost one remap, and a slot the plan copies that starts changing again
//! back to its shadow (see [`tracker`]); a failed driver call can add a
//! shadow ([`SlotTracker::fallback_to_copy`]).

//! ## Example
//!
//! ```
//! use xla_vmm_policy::*;
//!
//! let h200 = DeviceCosts {
//!     remap_us: 46.0,
//!     copy_bw_bytes_per_s: 2.4e12,
//!     copy_launch_us: 4.0,
//!     free_bytes: 100 << 30,
//!     total_bytes: 141 << 30,
//!     granularity_bytes: 2 << 20,
//! };
//! let slots = vec![
//!     SlotInfo::new(1 << 30, true, true, 0.0), // donated weights: never change
//!     SlotInfo::new(4, false, true, 1.0),      // the loss: a new buffer each step
//! ];
//! let input = PolicyInput {
//!     device: h200.clone(),
//!     threshold: Threshold::Auto,
//!     slots: slots.clone(),
//!     step: None,
//!     knobs: Knobs::default(),
//! };
//! let plan = decide(&input)?;
//! assert_eq!(plan.decisions, vec![Decision::Skip, Decision::Copy]);
//!
//! // Per step, in the runtime:
//! let mut tracker = SlotTracker::new("train_step", slots, TrackerConfig::new(h200, Threshold::Auto))?;
//! for step in 0..4u64 {
//!     let bindings = [Binding { id: 1, addr: 0x7f00_0000 }, Binding { id: 100 + step, addr: 0x7e00_0000 }];
//!     let actions = tracker.bind_step((step % 2) as usize, &bindings, None)?;
//!     if step >= 2 {
//!         assert_eq!(actions.actions[0], SlotAction::Skip);
//!     }
//! }
//! assert_eq!(tracker.stats().copies, 4);
//! # Ok::<(), PolicyError>(())
//! ```
//!
//! ## Who validates what
//!
//! [`PolicyInput::validate`] (called by [`decide`]) and [`SlotTracker::new`]
//! check every number; bad input is a [`PolicyError`], never a panic. The
//! runtime owns the driver calls, events and shadow allocation; this crate
//! only says what to do and counts what was done ([`Stats`]).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cost;
mod decide;
mod error;
mod input;
pub mod must_cross;
mod plan;
pub mod rebalance;
pub mod residency;
pub mod staging;
mod stats;
pub mod step;
pub mod tracker;

pub use decide::decide;
pub use error::{PolicyError, Result};
pub use input::{DeviceCosts, Knobs, PolicyInput, SlotInfo, StepTimes, Threshold};
pub use plan::{BindingPlan, Counts, Decision, ReferenceSummary, Rule};
pub use stats::Stats;
pub use tracker::{
    AllocationId, Binding, ChurnView, FailedCall, Fallback, SlotAction, SlotTracker, StepActions,
    TrackerConfig,
};

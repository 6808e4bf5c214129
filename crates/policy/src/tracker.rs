//! [`SlotTracker`]: the stateful per-executable side of the policy.
//!
//! The runtime hands it, each step, the allocation bound to every slot and
//! which of the executable's VA reservations the step uses; it answers with
//! one [`SlotAction`] per slot and keeps the counters ([`Stats`]).
//!
//! * **Identity is the allocation id**, never the address. An address can be
//!   freed and handed out again for a new allocation (ABA); the id cannot, so
//!   "same address, new id" is a remap (or a copy), never a skip.
//! * **Mapping state is per reservation.** A skip needs the id to equal the
//!   one mapped *in the reservation this step uses*; with two reservations
//!   used alternately a ping-pong of two buffers is all skips.
//! * **The decision is made at the first step, re-made once after a short
//!   warm-up under auto, then frozen.** The first `bind_step` runs
//!   [`crate::decide`] on the slots' churn priors and the costs and logs it
//!   at info level. Under [`Threshold::Auto`] with
//!   [`TrackerConfig::replan_after_steps`] set (the runtime sets it), the
//!   first `bind_step` after that many steps that is given [`StepTimes`]
//!   (or, without them, [`REPLAN_GRACE_STEPS`] steps later) runs it once more
//!   with what the warm-up measured: each slot's observed churn
//!   (changes / observations per reservation; a slot that never changed is
//!   churn 0, hence skip) and the step's host and GPU time (so the rule knows
//!   which side bounds the step). It is logged once at info level with its
//!   inputs and never re-runs. The re-plan only changes which slots are
//!   served from a shadow, never addresses: every slot has its own region in
//!   the reservations from the start, and a shadow is a separate physical
//!   allocation mapped at the slot's region, so the graphs are not
//!   re-captured. Shadows already allocated stay allocated (the runtime
//!   frees none while the executable lives) and are counted against the cap
//!   as held ([`SlotInfo::has_shadow`]); new ones are admitted only within
//!   what the cap has left, so the cap holds across the re-plan. A slot the
//!   re-plan takes off copying maps its user allocation (one remap); one it
//!   puts on copying maps its shadow instead (the change it needed anyway).
//! * **Within the frozen envelope, churn history adapts** (when
//!   [`TrackerConfig::adaptive`]; it needs the runtime to back a copy slot by
//!   its shadow mapped at the slot's own address, so switching costs one
//!   remap and no graph update). A copy slot whose allocation stays put stops
//!   paying for copies: once the copies spent while it was stable add up to
//!   one remap (ski rental: never more than twice the better choice in
//!   hindsight), its allocation is mapped directly and later steps skip. A
//!   directly mapped slot that owns a shadow and changes again goes back to
//!   copying when its churn estimate says copying is cheaper (the switch
//!   costs the remap that the change needed anyway). Only slots the plan in
//!   force chose to copy go back to copying: a slot the re-plan took off
//!   copying keeps its shadow's memory but stays directly mapped (the re-plan
//!   knew the step's bound; the per-slot rule does not).
//!
//! `bind_step` allocates nothing per step: the actions live in a buffer the
//! tracker reuses ([`SlotTracker::bind_step`]) or the caller's
//! ([`SlotTracker::bind_step_into`]).

use tracing::{info, warn};

/// Steps of warm-up after which auto re-plans once with measured inputs
/// (what the runtime uses; [`TrackerConfig::new`] leaves re-planning off).
pub const DEFAULT_REPLAN_AFTER_STEPS: u64 = 4;

/// Steps past `replan_after_steps` after which auto re-plans without step
/// times (churn history only) if the runtime could not measure them.
pub const REPLAN_GRACE_STEPS: u64 = 8;

use crate::error::{PolicyError, Result};
use crate::input::{DeviceCosts, Knobs, PolicyInput, SlotInfo, StepTimes, Threshold};
use crate::plan::{BindingPlan, Decision};
use crate::stats::Stats;
use crate::{cost, decide};

/// A physical allocation's id, unique for the process lifetime (never
/// reused, unlike addresses).
pub type AllocationId = u64;

/// The buffer bound to a slot this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Its allocation id (what identity is decided on).
    pub id: AllocationId,
    /// Its device address (only used to catch inconsistent input).
    pub addr: u64,
}

/// What the runtime must do for one slot before (and after) the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotAction {
    /// The bound allocation is already mapped at the slot: nothing to do.
    Skip,
    /// Map the bound allocation at the slot's address, unmapping what is
    /// there first when `unmap_old` (only after the reservation's event).
    Remap {
        /// Something is mapped at the slot and must be unmapped first.
        unmap_old: bool,
    },
    /// Serve the slot from its shadow: map the shadow first when
    /// `map_shadow` (unmapping what is there when `unmap_old`), copy the user
    /// buffer in before the launch when `copy_in`, back out after when
    /// `copy_out`. Copies of a step are batched per direction.
    Copy {
        /// The shadow is not mapped at the slot yet in this reservation.
        map_shadow: bool,
        /// Something else is mapped there and must be unmapped first.
        unmap_old: bool,
        /// Copy the user buffer into the shadow before the launch.
        copy_in: bool,
        /// Copy the shadow back into the user buffer after the step.
        copy_out: bool,
    },
}

/// The driver call that failed while binding a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailedCall {
    /// Unmapping the old allocation.
    Unmap,
    /// Mapping the new allocation.
    Map,
    /// Setting access on the new mapping.
    SetAccess,
}

/// What to do after a failed driver call: the new action for the slot and
/// whether a shadow must be allocated for it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fallback {
    /// Always a [`SlotAction::Copy`] with `map_shadow`.
    pub action: SlotAction,
    /// Bytes of shadow the runtime must allocate (0 when the plan already
    /// gave the slot one).
    pub new_shadow_bytes: u64,
}

/// The actions of one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepActions {
    /// One per slot, in slot order.
    pub actions: Vec<SlotAction>,
    /// Bytes to copy in before the launch (one batched operation).
    pub copy_in_bytes: u64,
    /// Bytes to copy out after the step (one batched operation).
    pub copy_out_bytes: u64,
}

impl StepActions {
    /// Number of slots with the given kind of action.
    pub fn count(&self, kind: fn(&SlotAction) -> bool) -> usize {
        self.actions.iter().filter(|a| kind(a)).count()
    }

    /// True when some slot must be unmapped this step. `cuMemUnmap` is not
    /// ordered with the stream, so only then must the host wait for the
    /// reservation's event (the GPU's previous use of it); skips, first maps
    /// and copies into an already mapped shadow need no wait.
    pub fn needs_idle_reservation(&self) -> bool {
        self.actions.iter().any(|a| match a {
            SlotAction::Skip => false,
            SlotAction::Remap { unmap_old } => *unmap_old,
            SlotAction::Copy { unmap_old, .. } => *unmap_old,
        })
    }

    /// Driver mapping operations this step (remaps and shadow mappings).
    pub fn driver_maps(&self) -> usize {
        self.count(|a| {
            matches!(
                a,
                SlotAction::Remap { .. }
                    | SlotAction::Copy {
                        map_shadow: true,
                        ..
                    }
            )
        })
    }
}

/// Fixed inputs of a tracker.
#[derive(Clone, Debug, PartialEq)]
pub struct TrackerConfig {
    /// Measured device costs (the probe).
    pub device: DeviceCosts,
    /// `0`, `1` or `N`.
    pub threshold: Threshold,
    /// Knobs of the rule; `shadow_copies` is set to `reservations` (1 with
    /// `shared_shadows`).
    pub knobs: Knobs,
    /// VA reservations used alternately (2 in the runtime).
    pub reservations: usize,
    /// One shadow per copy slot, mapped in every reservation that serves
    /// the slot from it (the runtime does this: its steps are ordered on
    /// one stream), instead of one per reservation. The shadow memory
    /// counted against the cap is then one shadow per copy slot, as
    /// allocated. Default false.
    pub shared_shadows: bool,
    /// Let churn history move slots between shadow and direct mapping within
    /// the frozen plan (see the module docs).
    pub adaptive: bool,
    /// Auto only: re-plan once after this many steps with the observed churn
    /// and the measured step times (see the module docs); `None` (the
    /// default of [`TrackerConfig::new`]) freezes the first step's plan.
    pub replan_after_steps: Option<u64>,
}

impl TrackerConfig {
    /// Defaults: two reservations, adaptive, default knobs.
    pub fn new(device: DeviceCosts, threshold: Threshold) -> Self {
        TrackerConfig {
            device,
            threshold,
            knobs: Knobs::default(),
            reservations: 2,
            shared_shadows: false,
            adaptive: true,
            replan_after_steps: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mapped {
    Nothing,
    User(Binding),
    Shadow,
}

#[derive(Clone, Debug)]
struct SlotState {
    /// Served from the shadow (true) or by mapping the user allocation.
    shadow_mode: bool,
    has_shadow: bool,
    /// The plan in force copies the slot (the adaptive rule may move it back
    /// to its shadow after a spell of direct mapping).
    planned_copy: bool,
    /// Fell back to copy after a driver failure: stays on copy.
    pinned: bool,
    /// Churn estimate (weighted average of "changed" observations).
    churn: f64,
    observations: u64,
    changes: u64,
    /// Copy cost spent while the slot's allocation was stable, µs.
    stable_copy_us: f64,
    /// Per reservation: what is mapped at the slot and the last id seen.
    mapped: Vec<Mapped>,
    last_seen: Vec<Option<AllocationId>>,
    /// The action given this step (for fallback bookkeeping).
    last_action: Option<SlotAction>,
}

/// A slot's churn as the tracker has seen it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnView {
    /// Weighted churn estimate in `[0, 1]`.
    pub churn: f64,
    /// Steps observed after the slot's first binding in a reservation.
    pub observations: u64,
    /// Of those, steps where the allocation differed from the reservation's.
    pub changes: u64,
    /// Currently served from the shadow.
    pub shadow_mode: bool,
}

/// Per-executable binding state and counters.
#[derive(Debug)]
pub struct SlotTracker {
    name: String,
    config: TrackerConfig,
    slots: Vec<SlotInfo>,
    state: Vec<SlotState>,
    plan: Option<BindingPlan>,
    stats: Stats,
    extra_shadow_bytes: u64,
    /// The one re-plan after warm-up has run (with these step times).
    replanned: bool,
    plan_step: Option<StepTimes>,
    /// The runtime's warm-up measurement, when it has one (`Some(None)`:
    /// measured, and the step is serial: costs add).
    measured: Option<Option<StepTimes>>,
    /// Reused by [`SlotTracker::bind_step`].
    scratch: StepActions,
}

impl SlotTracker {
    /// A tracker for executable `name` whose slots are `slots` (their `churn`
    /// is the prior used by the frozen decision: 1.0 when unknown, 0.0 for a
    /// slot known not to change, e.g. donated and aliased).
    pub fn new(
        name: impl Into<String>,
        slots: Vec<SlotInfo>,
        mut config: TrackerConfig,
    ) -> Result<Self> {
        config.reservations = config.reservations.max(1);
        config.knobs.shadow_copies = if config.shared_shadows {
            1
        } else {
            u32::try_from(config.reservations).unwrap_or(u32::MAX)
        };
        config.device.validate()?;
        config.knobs.validate()?;
        for (i, s) in slots.iter().enumerate() {
            s.validate(i)?;
        }
        let r = config.reservations;
        let state = slots
            .iter()
            .map(|s| SlotState {
                shadow_mode: false,
                has_shadow: false,
                planned_copy: false,
                pinned: false,
                churn: s.effective_churn(config.knobs.churn_ewma_alpha),
                observations: 0,
                changes: 0,
                stable_copy_us: 0.0,
                mapped: vec![Mapped::Nothing; r],
                last_seen: vec![None; r],
                last_action: None,
            })
            .collect();
        Ok(SlotTracker {
            name: name.into(),
            config,
            slots,
            state,
            plan: None,
            stats: Stats::default(),
            extra_shadow_bytes: 0,
            replanned: false,
            plan_step: None,
            measured: None,
            scratch: StepActions::default(),
        })
    }

    /// The frozen plan (after the first step).
    pub fn plan(&self) -> Option<&BindingPlan> {
        self.plan.as_ref()
    }

    /// The auto re-plan after warm-up has run (the plan is final).
    pub fn replanned(&self) -> bool {
        self.replanned
    }

    /// The step times the plan in force was made with (`None`: bound
    /// unknown, costs added).
    pub fn plan_step_times(&self) -> Option<StepTimes> {
        self.plan_step
    }

    /// The runtime's warm-up measurement for the re-plan: `Some(times)` when
    /// remaps and copies overlap as [`StepTimes`] describes (binding of the
    /// next step runs while the GPU runs this one), `None` when they do not
    /// (the GPU was idle whenever the host came back, e.g. the caller waits
    /// for every step: costs add). The re-plan then runs at the next
    /// `bind_step` once the warm-up steps are done, without waiting for the
    /// grace steps. Ignored after the re-plan.
    pub fn set_warmup_measurement(&mut self, times: Option<StepTimes>) {
        if !self.replanned {
            self.measured = Some(times);
        }
    }

    /// The device costs the decision uses.
    pub fn device_costs(&self) -> &DeviceCosts {
        &self.config.device
    }

    /// Replaces the device costs (e.g. with the runtime's probe) before the
    /// first step; an error after it (the plan is made) or on bad numbers.
    pub fn set_device_costs(&mut self, costs: DeviceCosts) -> Result<()> {
        if self.plan.is_some() {
            return Err(PolicyError::InvalidSlot {
                index: 0,
                reason: "device costs can only be set before the first step".into(),
            });
        }
        costs.validate()?;
        self.config.device = costs;
        Ok(())
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Shadow bytes the runtime holds: the plan's plus fallbacks'.
    pub fn shadow_bytes(&self) -> u64 {
        self.plan
            .as_ref()
            .map_or(0, |p| p.shadow_bytes)
            .saturating_add(self.extra_shadow_bytes)
    }

    /// Churn of slot `index` as seen so far.
    pub fn churn(&self, index: usize) -> Option<ChurnView> {
        self.state.get(index).map(|s| ChurnView {
            churn: s.churn,
            observations: s.observations,
            changes: s.changes,
            shadow_mode: s.shadow_mode,
        })
    }

    /// Marks slot `index` copy-only (`false`) or remappable before the first
    /// step, when the runtime learns what its buffers are (e.g. a
    /// sub-allocated buffer cannot be mapped): the frozen decision then
    /// plans it as a copy slot instead of failing a map and falling back.
    /// After the first step the plan is frozen and this is an error.
    pub fn set_remappable(&mut self, index: usize, remappable: bool) -> Result<()> {
        let len = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or(PolicyError::NoSuchSlot { index, len })?;
        if self.plan.is_some() {
            return Err(PolicyError::InvalidSlot {
                index,
                reason: "remappability can only be set before the first step".into(),
            });
        }
        slot.remappable = remappable;
        Ok(())
    }

    /// Adds one step's host binding time (measured by the runtime).
    pub fn record_binding_time(&mut self, ns: u64) {
        self.stats.host_binding_ns = self.stats.host_binding_ns.saturating_add(ns);
        self.stats.host_binding_ns_max = self.stats.host_binding_ns_max.max(ns);
    }

    /// Logs the counters at info level.
    pub fn log_stats(&self) {
        info!(target: "xla_vmm::policy", executable = %self.name, "binding stats: {}", self.stats);
    }

    /// Runs and freezes the decision (first step only).
    fn freeze(&mut self, step: Option<StepTimes>) -> Result<()> {
        let input = PolicyInput {
            device: self.config.device.clone(),
            threshold: self.config.threshold,
            slots: self.slots.clone(),
            step,
            knobs: self.config.knobs.clone(),
        };
        let plan = decide::decide(&input)?;
        for ((st, d), slot) in self.state.iter_mut().zip(&plan.decisions).zip(&self.slots) {
            st.has_shadow = *d == Decision::Copy;
            st.planned_copy = st.has_shadow;
            st.shadow_mode = st.has_shadow;
            // A copy-only slot never moves to direct mapping.
            st.pinned = !slot.remappable;
        }
        let d = &self.config.device;
        info!(
            target: "xla_vmm::policy",
            executable = %self.name,
            threshold = plan.threshold.raw(),
            threshold_bytes = plan.threshold_bytes,
            rule = ?plan.rule,
            slots = self.slots.len(),
            skip = plan.counts.skip,
            remap = plan.counts.remap,
            copy = plan.counts.copy,
            copy_only = plan.counts.copy_only,
            budget_limited = plan.counts.budget_limited,
            shadow_bytes = plan.shadow_bytes,
            shadow_cap_bytes = plan.shadow_cap_bytes,
            copy_us_per_step = plan.copy_us_per_step,
            remap_us_per_step = plan.remap_us_per_step,
            remap_us = d.remap_us,
            copy_bw_bytes_per_s = d.copy_bw_bytes_per_s,
            copy_launch_us = d.copy_launch_us,
            free_bytes = d.free_bytes,
            total_bytes = d.total_bytes,
            host_us = step.map(|s| s.host_us),
            gpu_us = step.map(|s| s.gpu_us),
            adaptive = self.config.adaptive,
            replan_after_steps = self.config.replan_after_steps,
            "slot binding decision frozen"
        );
        self.plan = Some(plan);
        self.plan_step = step;
        Ok(())
    }

    /// Auto's one re-plan after warm-up, when due (see the module docs).
    fn maybe_replan(&mut self, step: Option<StepTimes>) -> Result<()> {
        let Some(after) = self.config.replan_after_steps else {
            return Ok(());
        };
        let n = self.stats.steps;
        let step = step.or(self.measured.flatten());
        if self.replanned
            || self.config.threshold != Threshold::Auto
            || n < after
            || (step.is_none()
                && self.measured.is_none()
                && n < after.saturating_add(REPLAN_GRACE_STEPS))
        {
            return Ok(());
        }
        self.replanned = true;
        let slots: Vec<SlotInfo> = self
            .slots
            .iter()
            .zip(&self.state)
            .map(|(s, st)| {
                let mut s = s.clone();
                if st.observations > 0 {
                    s.churn = (st.changes as f64 / st.observations as f64).clamp(0.0, 1.0);
                    s.history = None;
                }
                // A fallback slot stays on copy: plan it as copy-only.
                s.remappable &= !st.pinned;
                s.has_shadow = st.has_shadow;
                s
            })
            .collect();
        let input = PolicyInput {
            device: self.config.device.clone(),
            threshold: self.config.threshold,
            slots,
            step,
            knobs: self.config.knobs.clone(),
        };
        let plan = match decide::decide(&input) {
            Ok(p) => p,
            Err(e) => {
                // The plan in force stays (it was valid): a bad measurement
                // must not stop the executable.
                warn!(target: "xla_vmm::policy", executable = %self.name, error = %e,
                      "re-plan after warm-up failed; the first plan stays");
                return Ok(());
            }
        };
        let (mut added, mut dropped) = (0usize, 0usize);
        for (st, d) in self.state.iter_mut().zip(&plan.decisions) {
            st.planned_copy = *d == Decision::Copy;
            if st.pinned {
                continue;
            }
            if st.planned_copy {
                added += usize::from(!st.has_shadow);
                st.has_shadow = true;
                if !st.shadow_mode {
                    st.shadow_mode = true;
                    self.stats.mode_switches += 1;
                }
                st.stable_copy_us = 0.0;
            } else if st.shadow_mode {
                st.shadow_mode = false;
                dropped += 1;
                self.stats.mode_switches += 1;
            }
        }
        // Fallback shadows are held shadows of the new plan now.
        self.extra_shadow_bytes = 0;
        let d = &self.config.device;
        info!(
            target: "xla_vmm::policy",
            executable = %self.name,
            after_steps = n,
            rule = ?plan.rule,
            threshold_bytes = plan.threshold_bytes,
            skip = plan.counts.skip,
            remap = plan.counts.remap,
            copy = plan.counts.copy,
            new_shadows = added,
            off_copy = dropped,
            shadow_bytes = plan.shadow_bytes,
            shadow_cap_bytes = plan.shadow_cap_bytes,
            copy_us_per_step = plan.copy_us_per_step,
            remap_us_per_step = plan.remap_us_per_step,
            step_us = plan.step_us,
            remap_us = d.remap_us,
            copy_bw_bytes_per_s = d.copy_bw_bytes_per_s,
            copy_launch_us = d.copy_launch_us,
            host_us = step.map(|s| s.host_us),
            gpu_us = step.map(|s| s.gpu_us),
            "slot binding decision re-planned after warm-up (final)"
        );
        self.plan = Some(plan);
        self.plan_step = step;
        Ok(())
    }

    /// Copy cost per step a shadow-mode slot carries: its bytes plus its
    /// share of each direction's batched launch (`extra` = 1 when the slot is
    /// not yet counted among the copy slots).
    fn copy_share_us(&self, i: usize, n_in: usize, n_out: usize, extra: usize) -> f64 {
        let s = &self.slots[i];
        let d = &self.config.device;
        let mut us = f64::from(s.directions()) * cost::transfer_us(s.size, d.copy_bw_bytes_per_s);
        if s.read {
            us += d.copy_launch_us / (n_in + extra).max(1) as f64;
        }
        if s.written {
            us += d.copy_launch_us / (n_out + extra).max(1) as f64;
        }
        us
    }

    /// Make the plan now, as the first [`SlotTracker::bind_step`] would
    /// (without step times), so that the caller can lay out and record
    /// before the first step; a no-op once there is a plan.
    pub fn make_plan(&mut self) -> Result<()> {
        if self.plan.is_none() {
            self.freeze(None)?;
        }
        Ok(())
    }

    /// Binds one step on reservation `reservation`: one action per slot.
    ///
    /// `step` (host/GPU time without binding) is used by the call that makes
    /// the plan: the first, and under auto the one re-plan after warm-up
    /// (see the module docs); other calls ignore it. The actions live in a
    /// buffer the tracker reuses (no allocation per step): valid until the
    /// next call.
    pub fn bind_step(
        &mut self,
        reservation: usize,
        bindings: &[Binding],
        step: Option<StepTimes>,
    ) -> Result<&StepActions> {
        let mut out = std::mem::take(&mut self.scratch);
        let r = self.bind_step_into(reservation, bindings, step, &mut out);
        self.scratch = out;
        r.map(|()| &self.scratch)
    }

    /// [`SlotTracker::bind_step`] into the caller's `out` (overwritten; its
    /// vector's capacity is reused).
    pub fn bind_step_into(
        &mut self,
        reservation: usize,
        bindings: &[Binding],
        step: Option<StepTimes>,
        out: &mut StepActions,
    ) -> Result<()> {
        let nres = self.config.reservations;
        if reservation >= nres {
            return Err(PolicyError::NoSuchReservation {
                index: reservation,
                len: nres,
            });
        }
        if bindings.len() != self.slots.len() {
            return Err(PolicyError::BindingMismatch {
                expected: self.slots.len(),
                got: bindings.len(),
            });
        }
        if self.plan.is_none() {
            self.freeze(step)?;
        } else {
            self.maybe_replan(step)?;
        }
        let (alpha, remap_us, adaptive) = (
            self.config.knobs.churn_ewma_alpha,
            self.config.device.remap_us,
            self.config.adaptive,
        );
        let n_in = self
            .state
            .iter()
            .zip(&self.slots)
            .filter(|(st, s)| st.shadow_mode && s.read)
            .count();
        let n_out = self
            .state
            .iter()
            .zip(&self.slots)
            .filter(|(st, s)| st.shadow_mode && s.written)
            .count();
        out.actions.clear();
        out.copy_in_bytes = 0;
        out.copy_out_bytes = 0;
        for (i, b) in bindings.iter().enumerate() {
            let share_now = self.copy_share_us(i, n_in, n_out, 0);
            let share_added = self.copy_share_us(i, n_in, n_out, 1);
            let slot = &self.slots[i];
            let st = &mut self.state[i];
            // Churn is observed per reservation: a change is an id different
            // from the one this reservation saw last, which is what costs a
            // remap here.
            let seen = st.last_seen[reservation];
            let changed = seen != Some(b.id);
            if seen.is_some() {
                st.observations += 1;
                st.changes += u64::from(changed);
                st.churn += alpha * (f64::from(u8::from(changed)) - st.churn);
            }
            st.last_seen[reservation] = Some(b.id);
            let mapped = st.mapped[reservation];
            let copy = |map_shadow: bool| SlotAction::Copy {
                map_shadow,
                unmap_old: map_shadow && mapped != Mapped::Nothing,
                copy_in: slot.read,
                copy_out: slot.written,
            };
            let action = if st.shadow_mode {
                if changed {
                    st.stable_copy_us = 0.0;
                } else {
                    st.stable_copy_us += share_now;
                }
                if adaptive && !st.pinned && !changed && st.stable_copy_us >= remap_us {
                    // Stable long enough that the copies paid one remap:
                    // map the allocation directly; later steps skip.
                    st.shadow_mode = false;
                    st.stable_copy_us = 0.0;
                    self.stats.mode_switches += 1;
                    SlotAction::Remap {
                        unmap_old: mapped != Mapped::Nothing,
                    }
                } else {
                    copy(mapped != Mapped::Shadow)
                }
            } else {
                match mapped {
                    Mapped::User(m) if m.id == b.id && m.addr == b.addr => SlotAction::Skip,
                    Mapped::User(m) if m.id == b.id => {
                        warn!(target: "xla_vmm::policy", executable = %self.name, slot = i,
                              id = b.id, old_addr = m.addr, new_addr = b.addr,
                              "allocation id seen at a new address; remapping");
                        SlotAction::Remap { unmap_old: true }
                    }
                    _ if adaptive
                        && changed
                        && st.planned_copy
                        && seen.is_some()
                        && st.churn * remap_us > share_added =>
                    {
                        // Churning again: this change needs a remap anyway, so
                        // mapping the shadow instead costs nothing extra.
                        st.shadow_mode = true;
                        self.stats.mode_switches += 1;
                        copy(true)
                    }
                    _ => SlotAction::Remap {
                        unmap_old: mapped != Mapped::Nothing,
                    },
                }
            };
            st.mapped[reservation] = match action {
                SlotAction::Skip => mapped,
                SlotAction::Remap { .. } => Mapped::User(*b),
                SlotAction::Copy { .. } => Mapped::Shadow,
            };
            st.last_action = Some(action);
            match action {
                SlotAction::Skip => self.stats.skips += 1,
                SlotAction::Remap { .. } => self.stats.remaps += 1,
                SlotAction::Copy {
                    copy_in, copy_out, ..
                } => {
                    self.stats.copies += 1;
                    if copy_in {
                        out.copy_in_bytes = out.copy_in_bytes.saturating_add(slot.size);
                    }
                    if copy_out {
                        out.copy_out_bytes = out.copy_out_bytes.saturating_add(slot.size);
                    }
                }
            }
            out.actions.push(action);
        }
        self.stats.bytes_copied = self
            .stats
            .bytes_copied
            .saturating_add(out.copy_in_bytes.saturating_add(out.copy_out_bytes));
        self.stats.steps += 1;
        Ok(())
    }

    /// A driver call failed while remapping slot `index` on `reservation`
    /// this step: serve the slot from a shadow from now on (it stays on copy).
    ///
    /// The returned action maps the shadow (unmapping first what the failed
    /// call left at the slot) and copies in/out as the slot is read/written, so
    /// no data is lost. If the slot had no shadow in the plan,
    /// `new_shadow_bytes` says how much to allocate.
    pub fn fallback_to_copy(
        &mut self,
        reservation: usize,
        index: usize,
        failed: FailedCall,
    ) -> Result<Fallback> {
        let nres = self.config.reservations;
        if reservation >= nres {
            return Err(PolicyError::NoSuchReservation {
                index: reservation,
                len: nres,
            });
        }
        let len = self.slots.len();
        let slot = self
            .slots
            .get(index)
            .ok_or(PolicyError::NoSuchSlot { index, len })?;
        let st = &mut self.state[index];
        match st.last_action {
            Some(SlotAction::Remap { .. }) => {}
            other => {
                return Err(PolicyError::FallbackUnavailable {
                    index,
                    reason: format!("this step's action was {other:?}, not a remap"),
                })
            }
        }
        if failed == FailedCall::Unmap {
            self.stats.unmap_errors += 1;
        }
        let new_shadow_bytes = if st.has_shadow {
            0
        } else {
            self.config
                .knobs
                .shadow_bytes_for(slot.size, self.config.device.granularity_bytes)
        };
        st.has_shadow = true;
        st.shadow_mode = true;
        st.pinned = true;
        st.mapped[reservation] = Mapped::Shadow;
        // What is left at the slot: a failed unmap leaves the old mapping, a
        // failed set-access the new one; a failed map leaves nothing (the
        // old one was unmapped before the map was tried).
        let action = SlotAction::Copy {
            map_shadow: true,
            unmap_old: failed != FailedCall::Map,
            copy_in: slot.read,
            copy_out: slot.written,
        };
        st.last_action = Some(action);
        self.extra_shadow_bytes = self.extra_shadow_bytes.saturating_add(new_shadow_bytes);
        self.stats.fallbacks += 1;
        self.stats.remaps = self.stats.remaps.saturating_sub(1);
        self.stats.copies += 1;
        let moved = slot.size.saturating_mul(u64::from(slot.directions()));
        self.stats.bytes_copied = self.stats.bytes_copied.saturating_add(moved);
        warn!(target: "xla_vmm::policy", executable = %self.name, slot = index, reservation,
              call = ?failed, new_shadow_bytes, "driver call failed while binding; slot falls back to copy");
        Ok(Fallback {
            action,
            new_shadow_bytes,
        })
    }
}

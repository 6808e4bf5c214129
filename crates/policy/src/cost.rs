//! The cost model: what a copy set costs per step, in expected µs.
//!
//! * A **remap** of slot *i* costs `R` µs of host time (unmap + map + set
//!   access) on each step its allocation changes, so `p_i · R` per step on
//!   average, where `p_i` is the slot's churn.
//! * A **copy** slot costs every step, whether or not its allocation changed:
//!   the shadow is a separate buffer, so the graph only sees current data if
//!   it is copied in (when the graph reads the slot) and copied back (when the
//!   graph writes it). Per direction used, `d_i ∈ {0, 1, 2}`, it moves `s_i`
//!   bytes at bandwidth `B`.
//! * Copies are **batched**: all copy-ins of a step are one operation and all
//!   copy-outs another, so the fixed launch cost `L` is paid once per
//!   direction that has at least one slot, not once per slot.
//!
//! Step time: without step times the costs add (`copy_us + remap_us`). With
//! host time `H` and GPU time `G` of the step (binding excluded), binding with
//! two alternating reservations overlaps the GPU, so the step takes
//! `max(H + remap_us, G + copy_us)`: remaps are host time, copies GPU time.

use crate::input::{DeviceCosts, Knobs, SlotInfo, StepTimes};

/// µs to move `bytes` at `bw` bytes/s.
pub fn transfer_us(bytes: u64, bw: f64) -> f64 {
    bytes as f64 / bw * 1e6
}

/// Largest slot size (bytes) for which copying beats remapping, per slot.
///
/// Copy wins when `d · (L_eff + s/B) < p · R`, i.e. `s < (p·R/d − L_eff) · B`.
/// `L_eff` is `L` when each slot pays its own launch (`batched == false`) and
/// `0` when the launch is shared by the step's batch (the marginal slot pays
/// only its bytes). With `p = 1, d = 2, L_eff = 0` this is the reference rule's
/// `R · B / 2`. A slot with `d = 0` (neither read nor written) costs nothing
/// to copy: infinite break-even.
pub fn break_even_bytes(costs: &DeviceCosts, churn: f64, directions: u32, batched: bool) -> f64 {
    if directions == 0 {
        return f64::INFINITY;
    }
    let l_eff = if batched { 0.0 } else { costs.copy_launch_us };
    let us = (churn * costs.remap_us / f64::from(directions) - l_eff).max(0.0);
    us * 1e-6 * costs.copy_bw_bytes_per_s
}

/// The reference (ROCm XLA) per-slice cap: `R · B / 2`, as if every slice were
/// copied both ways every step, with no launch cost.
pub fn reference_break_even_bytes(costs: &DeviceCosts) -> f64 {
    costs.remap_us * 1e-6 * costs.copy_bw_bytes_per_s / 2.0
}

/// Running totals of one copy/remap assignment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    /// Bytes copied in before the launch per step.
    pub copy_in_bytes: u64,
    /// Bytes copied out after the step per step.
    pub copy_out_bytes: u64,
    /// Copy slots that need a copy-in.
    pub copy_in_slots: usize,
    /// Copy slots that need a copy-out.
    pub copy_out_slots: usize,
    /// Expected remap time per step, µs (`Σ p_i · R` over remap slots).
    pub remap_us: f64,
    /// Shadow memory of the copy slots, bytes (all reservations).
    pub shadow_bytes: u64,
}

impl StepCost {
    /// The cost with every slot in `churn` remapped (no copies).
    pub fn all_remap(costs: &DeviceCosts, churn: &[f64]) -> Self {
        StepCost {
            remap_us: churn.iter().map(|p| p * costs.remap_us).sum(),
            ..Default::default()
        }
    }

    /// [`StepCost::all_remap`] plus the memory of the shadows already
    /// allocated ([`SlotInfo::has_shadow`]): held whatever is decided.
    pub fn all_remap_held(
        costs: &DeviceCosts,
        knobs: &Knobs,
        slots: &[SlotInfo],
        churn: &[f64],
    ) -> Self {
        let mut c = Self::all_remap(costs, churn);
        c.shadow_bytes = slots
            .iter()
            .filter(|s| s.has_shadow)
            .map(|s| knobs.shadow_bytes_for(s.size, costs.granularity_bytes))
            .fold(0u64, u64::saturating_add);
        c
    }

    /// Moves `slot` (churn `p`) from the remap set into the copy set.
    pub fn move_to_copy(&mut self, costs: &DeviceCosts, knobs: &Knobs, slot: &SlotInfo, p: f64) {
        self.remap_us = (self.remap_us - p * costs.remap_us).max(0.0);
        // A slot that already holds a shadow was counted by `all_remap_held`.
        if !slot.has_shadow {
            self.shadow_bytes = self
                .shadow_bytes
                .saturating_add(knobs.shadow_bytes_for(slot.size, costs.granularity_bytes));
        }
        if slot.read {
            self.copy_in_bytes = self.copy_in_bytes.saturating_add(slot.size);
            self.copy_in_slots += 1;
        }
        if slot.written {
            self.copy_out_bytes = self.copy_out_bytes.saturating_add(slot.size);
            self.copy_out_slots += 1;
        }
    }

    /// Batched copy launches per step (0, 1 or 2).
    pub fn copy_launches(&self) -> u32 {
        u32::from(self.copy_in_slots > 0) + u32::from(self.copy_out_slots > 0)
    }

    /// Expected GPU time of the step's copies, µs: per direction used, one
    /// launch plus the bytes.
    pub fn copy_us(&self, costs: &DeviceCosts) -> f64 {
        self.copy_us_with(costs, self.copy_in_slots > 0, self.copy_out_slots > 0)
    }

    /// [`StepCost::copy_us`] with the launch of each direction counted when
    /// the flag says so (used to judge a slot by its marginal bytes only).
    pub fn copy_us_with(&self, costs: &DeviceCosts, launch_in: bool, launch_out: bool) -> f64 {
        let l = costs.copy_launch_us;
        let bw = costs.copy_bw_bytes_per_s;
        let launches = f64::from(u8::from(launch_in)) + f64::from(u8::from(launch_out));
        launches * l + transfer_us(self.copy_in_bytes, bw) + transfer_us(self.copy_out_bytes, bw)
    }

    /// The same copy set executed without batching (one operation per slot
    /// per direction, as the reference change does), µs.
    pub fn copy_us_unbatched(&self, costs: &DeviceCosts) -> f64 {
        let launches = (self.copy_in_slots + self.copy_out_slots) as f64;
        launches * costs.copy_launch_us
            + transfer_us(self.copy_in_bytes, costs.copy_bw_bytes_per_s)
            + transfer_us(self.copy_out_bytes, costs.copy_bw_bytes_per_s)
    }
}

/// Expected step cost of an assignment: `(primary, tie_break)`, lower is
/// better. Primary is the step time the binding adds to (`max(H + remap,
/// G + copy)` with step times, `remap + copy` without); the tie-break is
/// always the serial sum, so among equally fast choices the one doing less
/// total work wins.
pub fn objective(step: Option<&StepTimes>, copy_us: f64, remap_us: f64) -> (f64, f64) {
    let serial = copy_us + remap_us;
    match step {
        None => (serial, serial),
        Some(s) => ((s.host_us + remap_us).max(s.gpu_us + copy_us), serial),
    }
}

/// `a` is strictly better than `b` (with a tolerance for float noise).
pub fn better(a: (f64, f64), b: (f64, f64)) -> bool {
    let eps = |x: f64, y: f64| 1e-9 * (1.0 + x.abs().max(y.abs()));
    if a.0 < b.0 - eps(a.0, b.0) {
        return true;
    }
    (a.0 - b.0).abs() <= eps(a.0, b.0) && a.1 < b.1 - eps(a.1, b.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceCosts {
        DeviceCosts {
            remap_us: 46.0,
            copy_bw_bytes_per_s: 2.4e12,
            copy_launch_us: 4.0,
            free_bytes: 100 << 30,
            total_bytes: 141 << 30,
            granularity_bytes: 0,
        }
    }

    #[test]
    fn reference_break_even_is_remap_times_bw_over_two() {
        let c = h200();
        let be = reference_break_even_bytes(&c);
        assert!((be - 46e-6 * 2.4e12 / 2.0).abs() < 1.0);
        // Ours with p = 1, d = 2 and the launch shared equals the reference.
        assert!((break_even_bytes(&c, 1.0, 2, true) - be).abs() < 1.0);
    }

    #[test]
    fn break_even_accounts_for_direction_launch_and_churn() {
        let c = h200();
        let two_way = break_even_bytes(&c, 1.0, 2, false);
        let one_way = break_even_bytes(&c, 1.0, 1, false);
        // One direction: (46 - 4) µs of bandwidth; two: (23 - 4) µs.
        assert!((one_way - 42e-6 * 2.4e12).abs() < 1.0);
        assert!((two_way - 19e-6 * 2.4e12).abs() < 1.0);
        // Half the churn halves what a copy may cost.
        let half = break_even_bytes(&c, 0.5, 1, true);
        assert!((half - 23e-6 * 2.4e12).abs() < 1.0);
        // A churn so low that even the launch is not paid for: never copy.
        assert_eq!(break_even_bytes(&c, 0.05, 1, false), 0.0);
        assert!(break_even_bytes(&c, 1.0, 0, false).is_infinite());
    }

    #[test]
    fn batching_pays_launch_once_per_direction() {
        let c = h200();
        let k = Knobs::default();
        let mut cost = StepCost::all_remap(&c, &[1.0; 10]);
        for _ in 0..10 {
            cost.move_to_copy(&c, &k, &SlotInfo::new(1024, true, true, 1.0), 1.0);
        }
        assert_eq!(cost.copy_launches(), 2);
        let bytes_us = 2.0 * transfer_us(10 * 1024, c.copy_bw_bytes_per_s);
        assert!((cost.copy_us(&c) - (2.0 * 4.0 + bytes_us)).abs() < 1e-9);
        assert!((cost.copy_us_unbatched(&c) - (20.0 * 4.0 + bytes_us)).abs() < 1e-9);
        assert!(cost.remap_us.abs() < 1e-9);
    }

    #[test]
    fn gpu_bound_step_hides_remaps() {
        let gpu_bound = StepTimes {
            host_us: 100.0,
            gpu_us: 2000.0,
        };
        // 10 remaps (460 µs host) hide under 2 ms of GPU; 5 µs of copies do not.
        let remaps = objective(Some(&gpu_bound), 0.0, 460.0);
        let copies = objective(Some(&gpu_bound), 5.0, 0.0);
        assert!(better(remaps, copies));
        // Without step times the copies win.
        assert!(better(
            objective(None, 5.0, 0.0),
            objective(None, 0.0, 460.0)
        ));
    }
}

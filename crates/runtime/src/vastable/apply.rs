//! Applying a step's plan: the driver calls it names. The caller's
//! allocations are mapped first (unmapping what is there after the
//! reservation's event), access is set once per contiguous run of new
//! mappings, then the shadows are mapped. A failing call serves its slot
//! from the shadow: in a step through the tracker's fallback (the slot stays
//! on copy, its copies join the plan), at prebind by mapping the shadow only
//! (the first step then falls back as any step would).

use xla_vmm_device::Backend;
use xla_vmm_policy::step::{StepPlan, Target};
use xla_vmm_policy::{Decision, FailedCall};

use super::*;

impl<B: Backend> VaStable<B> {
    /// Apply `plan`'s maps to its reservation. `prebind`: before the
    /// reservation is recorded (no tracker fallback, see the module docs).
    pub(super) fn apply(
        &mut self,
        be: &B,
        users: &[Option<UserBuffer<B>>],
        plan: &mut StepPlan,
        prebind: bool,
    ) -> Result<()> {
        let r = plan.reservation;
        let mut synced = prebind;
        let mut new_maps = std::mem::take(&mut self.scratch.new_maps);
        new_maps.clear();
        let mut failed = Vec::new();
        // The caller's allocations.
        for m in &plan.maps {
            if m.target != Target::Caller {
                continue;
            }
            if m.unexpected {
                tracing::warn!(
                    slot = m.slot,
                    "skip without the allocation mapped; remapping"
                );
            }
            let u = bound(users, &self.slots[m.slot])?;
            match self.map_user(be, r, m.slot, u, &mut synced) {
                Ok(()) => {
                    new_maps.push(m.slot);
                    self.out.maps[m.slot] += 1;
                }
                Err(call) => failed.push((m.slot, call)),
            }
        }
        // Access once per contiguous run; a slot where it fails is unmapped.
        for range in contiguous(&new_maps, self.planner.regions()) {
            self.grant_access(be, r, &range, &mut failed, &mut synced)?;
        }
        for (slot, call) in failed {
            if prebind {
                self.planner.to_shadow(slot, plan);
            } else {
                let fb = self
                    .tracker
                    .fallback_to_copy(r, slot, call)
                    .map_err(policy_err)?;
                let b = self.scratch.bound[slot];
                self.planner.fall_back(slot, fb.action, &b, plan);
            }
        }
        // The shadows (of the plan and of the fallbacks).
        for m in &plan.maps {
            if m.target == Target::Shadow && !matches!(self.res[r].mapped[m.slot], Mapped::Shadow) {
                self.map_shadow(be, r, m.slot, &mut synced)?;
            }
        }
        if !new_maps.is_empty() {
            self.list_remapped();
        }
        self.scratch.new_maps = new_maps;
        Ok(())
    }

    /// Set access on the contiguous new mappings `range` (one call; per
    /// slot if that fails, unmapping and listing in `failed` the slots where
    /// it fails again).
    fn grant_access(
        &mut self,
        be: &B,
        r: usize,
        range: &[usize],
        failed: &mut Vec<(usize, FailedCall)>,
        synced: &mut bool,
    ) -> Result<()> {
        let regions = self.planner.regions();
        let lo = regions[range[0]].offset;
        let hi = {
            let l = &regions[*range.last().expect("non-empty")];
            l.offset + l.region
        };
        self.out.stats.vmm_calls += 1;
        if be
            .set_access(self.res[r].va.as_ref().expect("reserved"), lo, hi - lo)
            .is_ok()
        {
            return Ok(());
        }
        for &i in range {
            let g = self.planner.regions()[i];
            self.out.stats.vmm_calls += 1;
            let va = self.res[r].va.as_ref().expect("reserved");
            if be.set_access(va, g.offset, g.region).is_err() {
                // Unmap what the failed call left; the shadow serves it.
                self.unmap_slot(be, r, i, synced)?;
                failed.push((i, FailedCall::SetAccess));
            }
        }
        Ok(())
    }

    /// Wait until reservation `r`'s previous step is done, before an unmap
    /// there (once per step; the time goes to the `wait` phase).
    fn wait_idle(&mut self, be: &B, r: usize, synced: &mut bool) -> Result<()> {
        if self.res[r].used && !*synced {
            let t = Instant::now();
            be.event_synchronize(self.res[r].done.as_ref().expect("created"))?;
            let ns = t.elapsed().as_nanos() as u64;
            self.out.stats.phases.wait += ns;
            self.pace.waited_ns += ns;
        }
        *synced = true;
        Ok(())
    }

    /// Unmap whatever is mapped at slot `i`'s region (one retry).
    fn unmap_slot(&mut self, be: &B, r: usize, i: usize, synced: &mut bool) -> Result<()> {
        if matches!(self.res[r].mapped[i], Mapped::Nothing) {
            return Ok(());
        }
        self.wait_idle(be, r, synced)?;
        let g = self.planner.regions()[i];
        let va = self.res[r].va.as_ref().expect("reserved");
        if g.region == 0 {
            return Err(RuntimeError::invalid(format!("slot {i} has no region")));
        }
        self.out.stats.vmm_calls += 1;
        if let Err(first) = be.unmap(va, g.offset, g.region) {
            self.out.unmap_failures += 1;
            tracing::warn!(slot = i, %first, "unmap failed; retrying once");
            self.out.stats.vmm_calls += 1;
            be.unmap(va, g.offset, g.region)?;
        }
        self.res[r].mapped[i] = Mapped::Nothing;
        Ok(())
    }

    /// Map the caller's allocation at slot `i` (no access yet).
    fn map_user(
        &mut self,
        be: &B,
        r: usize,
        i: usize,
        u: &UserBuffer<B>,
        synced: &mut bool,
    ) -> std::result::Result<(), FailedCall> {
        let g = self.planner.regions()[i];
        let (Some(src), Some(_)) = (u.remap.as_ref(), u.id) else {
            return Err(FailedCall::Map);
        };
        if src.capacity < g.region {
            return Err(FailedCall::Map);
        }
        if self.unmap_slot(be, r, i, synced).is_err() {
            return Err(FailedCall::Unmap);
        }
        let va = self.res[r].va.as_ref().expect("reserved");
        self.out.stats.vmm_calls += 1;
        if let Err(e) = be.map(va, g.offset, src.phys.raw(), src.offset, g.region) {
            tracing::warn!(slot = i, %e, "map failed");
            return Err(FailedCall::Map);
        }
        self.res[r].mapped[i] = Mapped::Caller {
            _phys: src.phys.clone(),
        };
        Ok(())
    }

    /// Map slot `i`'s shadow (created on first use) at its region in `r`.
    fn map_shadow(&mut self, be: &B, r: usize, i: usize, synced: &mut bool) -> Result<()> {
        self.unmap_slot(be, r, i, synced)?;
        let g = self.planner.regions()[i];
        if self.shadows[i].is_none() {
            self.shadows[i] = Some(be.mem_create(g.region)?);
            self.out.stats.shadow_bytes += g.region;
        }
        let res = &mut self.res[r];
        let va = res.va.as_ref().expect("reserved");
        let mem = self.shadows[i].as_ref().expect("created");
        self.out.stats.vmm_calls += 2;
        be.map(va, g.offset, mem, 0, g.region)?;
        res.mapped[i] = Mapped::Shadow;
        be.set_access(va, g.offset, g.region)?;
        Ok(())
    }

    /// At initialize, before reservation `r` is recorded (the driver checks
    /// a recorded copy's addresses): bind it to the first step's memory
    /// (`users`) as the binding plan says, the caller's allocation where the
    /// slot maps (skip or remap), its shadow where it copies. Nothing has
    /// run on the reservation yet.
    pub(super) fn prebind(
        &mut self,
        be: &B,
        r: usize,
        users: &[Option<UserBuffer<B>>],
    ) -> Result<()> {
        let decisions: Vec<Decision> = match self.tracker.plan() {
            Some(p) => p.decisions.clone(),
            None => return Err(RuntimeError::invalid("binding plan not made")),
        };
        self.bind_buffers(users)?;
        let mut plan = StepPlan::default();
        self.planner.prebind(r, &decisions, &mut plan);
        self.apply(be, users, &mut plan, true)?;
        for m in &plan.maps {
            let b = self.scratch.bound[m.slot];
            self.planner.mapped(r, m, &b);
        }
        Ok(())
    }
}

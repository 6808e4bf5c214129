//! Mapping a slot of a reservation: the caller's allocation (remap), its
//! shadow (copy), unmapping after the reservation's event, access once per
//! contiguous run, and the fall back to a shadow when a driver call fails.

use xla_vmm_device::Backend;

use super::*;

impl<B: Backend> VaStable<B> {
    /// Set access on the contiguous new mappings `range` (one call; per
    /// slot if that fails, falling back to the shadow where it fails again).
    pub(super) fn grant_access(
        &mut self,
        be: &B,
        r: usize,
        range: &[usize],
        actions: &mut [SlotAction],
        synced: &mut bool,
    ) -> Result<()> {
        let lo = self.slots[range[0]].offset;
        let hi = {
            let l = &self.slots[*range.last().expect("non-empty")];
            l.offset + l.region
        };
        self.stats.vmm_calls += 1;
        if be
            .set_access(self.res[r].va.as_ref().expect("reserved"), lo, hi - lo)
            .is_ok()
        {
            return Ok(());
        }
        for &i in range {
            let (off, len) = (self.slots[i].offset, self.slots[i].region);
            self.stats.vmm_calls += 1;
            let va = self.res[r].va.as_ref().expect("reserved");
            if be.set_access(va, off, len).is_err() {
                // Unmap what the failed call left, serve from a shadow.
                self.unmap_slot(be, r, i, synced)?;
                actions[i] = self.fall_back(r, i, FailedCall::SetAccess)?;
            }
        }
        Ok(())
    }

    /// Wait until reservation `r`'s previous step is done, before an unmap
    /// there (once per step; the time goes to the `wait` phase).
    pub(super) fn wait_idle(&mut self, be: &B, r: usize, synced: &mut bool) -> Result<()> {
        if self.res[r].used && !*synced {
            let t = Instant::now();
            be.event_synchronize(self.res[r].done.as_ref().expect("created"))?;
            let ns = t.elapsed().as_nanos() as u64;
            self.stats.phases.wait += ns;
            self.waited_ns += ns;
        }
        *synced = true;
        Ok(())
    }

    /// Unmap whatever is mapped at slot `i`'s region (one retry).
    pub(super) fn unmap_slot(
        &mut self,
        be: &B,
        r: usize,
        i: usize,
        synced: &mut bool,
    ) -> Result<()> {
        if matches!(self.res[r].mapped[i], Mapped::Nothing) {
            return Ok(());
        }
        self.wait_idle(be, r, synced)?;
        let s = &self.slots[i];
        let va = self.res[r].va.as_ref().expect("reserved");
        if s.region == 0 {
            return Err(RuntimeError::invalid(format!("slot {i} has no region")));
        }
        self.stats.vmm_calls += 1;
        if let Err(first) = be.unmap(va, s.offset, s.region) {
            self.unmap_failures += 1;
            tracing::warn!(slot = i, %first, "unmap failed; retrying once");
            self.stats.vmm_calls += 1;
            be.unmap(va, s.offset, s.region)?;
        }
        self.res[r].mapped[i] = Mapped::Nothing;
        Ok(())
    }

    /// Map the caller's allocation at slot `i` (no access yet).
    pub(super) fn map_user(
        &mut self,
        be: &B,
        r: usize,
        i: usize,
        u: &UserBuffer<B>,
        synced: &mut bool,
    ) -> std::result::Result<(), FailedCall> {
        let s = self.slots[i].clone();
        let (Some(src), Some(id)) = (u.remap.as_ref(), u.id) else {
            return Err(FailedCall::Map);
        };
        if src.capacity < s.region {
            return Err(FailedCall::Map);
        }
        if self.unmap_slot(be, r, i, synced).is_err() {
            return Err(FailedCall::Unmap);
        }
        let va = self.res[r].va.as_ref().expect("reserved");
        self.stats.vmm_calls += 1;
        if let Err(e) = be.map(va, s.offset, src.phys.raw(), src.offset, s.region) {
            tracing::warn!(slot = i, %e, "map failed");
            return Err(FailedCall::Map);
        }
        self.res[r].mapped[i] = Mapped::Caller {
            id,
            addr: u.ptr.0,
            _phys: src.phys.clone(),
        };
        Ok(())
    }

    /// The tracker's fallback for slot `i` (it then stays on copy).
    pub(super) fn fall_back(
        &mut self,
        r: usize,
        i: usize,
        failed: FailedCall,
    ) -> Result<SlotAction> {
        let fb = self
            .tracker
            .fallback_to_copy(r, i, failed)
            .map_err(policy_err)?;
        Ok(fb.action)
    }

    /// Map slot `i`'s shadow (created on first use) at its region in `r`.
    pub(super) fn map_shadow(
        &mut self,
        be: &B,
        r: usize,
        i: usize,
        synced: &mut bool,
    ) -> Result<()> {
        self.unmap_slot(be, r, i, synced)?;
        let (off, region) = (self.slots[i].offset, self.slots[i].region);
        if self.shadows[i].is_none() {
            self.shadows[i] = Some(be.mem_create(region)?);
            self.stats.shadow_bytes += region;
            // A new shadow holds nothing yet.
            self.shadow_holds[i] = None;
        }
        let res = &mut self.res[r];
        let va = res.va.as_ref().expect("reserved");
        let mem = self.shadows[i].as_ref().expect("created");
        self.stats.vmm_calls += 2;
        be.map(va, off, mem, 0, region)?;
        res.mapped[i] = Mapped::Shadow;
        be.set_access(va, off, region)?;
        Ok(())
    }

    /// At initialize, before reservation `r` is recorded (the driver checks
    /// a recorded copy's addresses): bind it to the first step's memory
    /// (`users`) as the plan says, the caller's allocation where the slot
    /// maps (skip or remap), its shadow where it copies. A slot whose
    /// mapping fails gets its shadow; the first step then falls back as any
    /// step would. Nothing has run on the reservation yet.
    pub(super) fn prebind(
        &mut self,
        be: &B,
        r: usize,
        users: &[Option<UserBuffer<B>>],
    ) -> Result<()> {
        let decisions = match self.tracker.plan() {
            Some(p) => p.decisions.clone(),
            None => return Err(RuntimeError::invalid("binding plan not made")),
        };
        let mut synced = true;
        let mut mapped = Vec::new();
        for (i, d) in decisions.iter().enumerate() {
            let u = bound(users, &self.slots[i])?;
            if *d != Decision::Copy && self.map_user(be, r, i, u, &mut synced).is_ok() {
                mapped.push(i);
                self.maps[i] += 1;
            } else {
                self.map_shadow(be, r, i, &mut synced)?;
            }
        }
        // Access once per contiguous run; where it fails for a slot, the
        // tracker has it on copy from now on (`grant_access`): its shadow.
        let mut actions = vec![SlotAction::Skip; decisions.len()];
        for range in contiguous(&mapped, &self.slots) {
            self.grant_access(be, r, &range, &mut actions, &mut synced)?;
        }
        for &i in &mapped {
            if matches!(actions[i], SlotAction::Copy { .. }) {
                self.map_shadow(be, r, i, &mut synced)?;
            }
        }
        if !mapped.is_empty() {
            self.list_remapped();
        }
        Ok(())
    }
}

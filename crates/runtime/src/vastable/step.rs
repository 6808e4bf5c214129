//! One VA-stable step's phases, in the order [`VaStable::run`] calls them:
//! the caller's memory bound (map, access), the copy lists (shadows), the
//! copies in, the launch, the copy-backs outside the graph. Each phase
//! hands the next what it needs; `run` times them.

use xla_vmm_device::Backend;

use super::*;

/// Where this step's copy-backs run, when they are not in the graph's
/// copy node.
#[derive(Clone, Copy, Default)]
pub(super) struct CopyBack {
    /// Overlapping copy-backs: one by one after the launch, in slot order
    /// (the node's rows run concurrently).
    pub(super) ordered: bool,
    /// They did not fit the node's table: one batch after the launch.
    pub(super) batch: bool,
}

impl<B: Backend> VaStable<B> {
    /// Map the caller's allocation where the policy maps the slot (skip or
    /// remap) and it is not there yet, falling back to the shadow where a
    /// driver call fails (`actions` updated); then access once per
    /// contiguous run of new mappings. Returns whether the reservation's
    /// last step was waited for.
    pub(super) fn bind_caller_memory(
        &mut self,
        be: &B,
        r: usize,
        users: &[Option<UserBuffer<B>>],
        actions: &mut [SlotAction],
    ) -> Result<bool> {
        let mut synced = false;
        let mut new_maps = std::mem::take(&mut self.scratch.new_maps);
        new_maps.clear();
        // Phase 1: unmap and map.
        for (i, slot_action) in actions.iter_mut().enumerate() {
            let action = *slot_action;
            // Already there (bound at initialize, or the skip the policy
            // expects): no driver call.
            let b = self.scratch.bindings[i];
            let holds = matches!(self.res[r].mapped[i],
                Mapped::Caller { id, addr, .. } if id == b.id && addr == b.addr);
            let want_user = match action {
                SlotAction::Skip | SlotAction::Remap { .. } => !holds,
                SlotAction::Copy { .. } => false,
            };
            if want_user {
                if matches!(action, SlotAction::Skip) {
                    tracing::warn!(slot = i, "skip without the allocation mapped; remapping");
                }
                let u = bound(users, &self.slots[i])?;
                match self.map_user(be, r, i, u, &mut synced) {
                    Ok(()) => {
                        new_maps.push(i);
                        self.maps[i] += 1;
                    }
                    Err(failed) => {
                        *slot_action = self.fall_back(r, i, failed)?;
                    }
                }
            }
        }
        // Phase 2: access once per contiguous range of new mappings.
        if !new_maps.is_empty() {
            for range in contiguous(&new_maps, &self.slots) {
                self.grant_access(be, r, &range, actions, &mut synced)?;
            }
        }
        if !new_maps.is_empty() {
            self.list_remapped();
        }
        self.scratch.new_maps = new_maps;
        Ok(synced)
    }

    /// Map the shadows of copy slots and make this step's copy lists
    /// (`(dst, src, bytes)` in, then out), leaving out a copy in that the
    /// shadow already holds (immutable buffers).
    pub(super) fn copy_lists(
        &mut self,
        be: &B,
        r: usize,
        users: &[Option<UserBuffer<B>>],
        actions: &[SlotAction],
        synced: &mut bool,
    ) -> Result<(Vec<CopyOp>, Vec<CopyOp>)> {
        let mut ins = std::mem::take(&mut self.scratch.ins);
        let mut outs = std::mem::take(&mut self.scratch.outs);
        ins.clear();
        outs.clear();
        for (i, &action) in actions.iter().enumerate() {
            if let SlotAction::Copy {
                copy_in, copy_out, ..
            } = action
            {
                if !matches!(self.res[r].mapped[i], Mapped::Shadow) {
                    self.map_shadow(be, r, i, synced)?;
                }
                let s = &self.slots[i];
                let u = bound(users, s)?;
                let at = self.res[r].base.offset(s.offset);
                let key = u.id.map(|id| (id, u.generation));
                let known = self.immutable && key.is_some() && self.shadow_holds[i] == key;
                if copy_in && known {
                    self.stats.copies_elided += 1;
                    self.stats.bytes_elided += s.size;
                } else if copy_in {
                    ins.push((at, u.ptr, s.size));
                }
                if copy_out {
                    outs.push((u.ptr, at, s.size));
                }
                // After this step the shadow equals the caller's buffer.
                self.shadow_holds[i] = key;
            } else if self.slots[i].written {
                // Written in place through a direct mapping: the caller's
                // buffer changed, the shadow did not.
                self.shadow_holds[i] = None;
            }
        }
        Ok((ins, outs))
    }

    /// The copies in: on the kernel path the graph's copy nodes (their
    /// tables rewritten only when the copies change; what does not fit runs
    /// as a batch), else one batch. Says where the copy-backs go.
    pub(super) fn enqueue_copies_in(
        &mut self,
        be: &B,
        r: usize,
        ins: &[CopyOp],
        outs: &[CopyOp],
        stream: &B::Stream,
        lap: &mut Lap,
    ) -> Result<CopyBack> {
        let mut back = CopyBack::default();
        if let Some(k) = self.kernel.as_ref() {
            let res = &mut self.res[r];
            // Rows run concurrently: overlapping copy-backs go in order
            // after the launch instead (checked when the copies change).
            back.ordered =
                res.node_copies[OUT] != outs && overlapping(outs, &mut self.scratch.order);
            let out_entries: &[CopyOp] = if back.ordered { &[] } else { outs };
            let (Some(nodes), Some((_, exec))) = (&res.nodes, &res.graph) else {
                return Err(RuntimeError::invalid("copy nodes missing"));
            };
            for (dir, want) in [(IN, ins), (OUT, out_entries)] {
                if res.node_copies[dir] != want {
                    let fits = self.table.fill(want);
                    k.update(be, exec, &nodes[dir], dir, &self.table)?;
                    res.node_copies[dir].clear();
                    res.node_copies[dir].extend_from_slice(want);
                    res.overflow[dir] = !fits;
                }
            }
            lap.to(&mut self.stats.phases.tables, 0);
            back.batch = res.overflow[OUT];
            if res.overflow[IN] {
                self.stats.copy_ops += copy_batch(be, ins, stream)?;
            } else {
                self.stats.copy_ops += u64::from(!ins.is_empty());
            }
            self.stats.copy_ops += u64::from(!out_entries.is_empty() && !back.batch);
        } else {
            self.stats.copy_ops += copy_batch(be, ins, stream)?;
        }
        Ok(back)
    }

    /// Launch the reservation's graph; under auto's warm-up, after the start
    /// event of a timed step. Returns the launch call's start and end.
    pub(super) fn launch(
        &mut self,
        be: &B,
        r: usize,
        warming: bool,
        (copy_in_bytes, copy_out_bytes): (u64, u64),
        stream: &B::Stream,
    ) -> Result<(Instant, Instant)> {
        let res = &mut self.res[r];
        let (_, exec) = res.graph.as_ref().expect("captured");
        // Warm-up: time the step on the GPU (read later, never waited for).
        let mut timed = false;
        if warming && res.timed.is_none() {
            if let Some(e) = res.start.as_ref() {
                be.event_record(e, stream)?;
                timed = true;
            }
        }
        let t_launch = Instant::now();
        be.graph_launch(exec, stream)?;
        let t_after = Instant::now();
        if warming {
            push_sample(
                &mut self.warm.launches,
                (t_after - t_launch).as_secs_f64() * 1e6,
            );
        }
        if !timed {
            // A pair still unread is stale once `done` is recorded again.
            res.timed = None;
        } else {
            // What of the timed span is binding copies (the model's figure):
            // both directions in the graph on the kernel path, the copy-back
            // batch otherwise.
            let d = self.tracker.device_costs();
            let bytes = copy_out_bytes
                + if self.kernel.is_some() {
                    copy_in_bytes
                } else {
                    0
                };
            let launches = u32::from(copy_out_bytes > 0)
                + u32::from(self.kernel.is_some() && copy_in_bytes > 0);
            res.timed = Some(
                bytes as f64 / d.copy_bw_bytes_per_s * 1e6 + f64::from(launches) * d.copy_launch_us,
            );
        }
        Ok((t_launch, t_after))
    }

    /// The copy-backs the graph does not make (see [`CopyBack`]).
    pub(super) fn copy_back(
        &mut self,
        be: &B,
        outs: &[CopyOp],
        how: CopyBack,
        stream: &B::Stream,
    ) -> Result<()> {
        if self.kernel.is_none() || how.batch {
            self.stats.copy_ops += copy_batch(be, outs, stream)?;
        } else if how.ordered {
            for &(d, s, n) in outs {
                be.copy_d2d(d, s, n, stream)?;
            }
            self.stats.copy_ops += outs.len() as u64;
        }
        Ok(())
    }
}

//! Submitting a step whose plan is applied: the copies in (the graph's copy
//! nodes, their tables rewritten only when the copies change, or a batch),
//! the graph launch, the copy-backs the graph does not make, the
//! reservation's event.

use xla_vmm_device::Backend;
use xla_vmm_policy::step::{PlannedCopy, StepPlan};

use super::*;
use crate::copykernel::{IN, OUT};

/// Where this step's copy-backs run, when they are not in the graph's
/// copy node.
#[derive(Clone, Copy, Default)]
struct CopyBack {
    /// Overlapping copy-backs: one by one after the launch, in slot order
    /// (the node's rows run concurrently).
    ordered: bool,
    /// They did not fit the node's table: one batch after the launch.
    batch: bool,
}

/// `list` as the copy paths take it (`out` overwritten).
fn copy_ops(list: &[PlannedCopy], out: &mut Vec<CopyOp>) {
    out.clear();
    out.extend(
        list.iter()
            .map(|c| (DevicePtr(c.dst), DevicePtr(c.src), c.bytes)),
    );
}

impl<B: Backend> VaStable<B> {
    /// Submit the step of `plan` (applied): copies in, launch (under auto's
    /// warm-up timed, with `copy_bytes` the tracker's copy figures), copies
    /// back, the reservation's `done` event. Returns the launch call's
    /// start and end.
    pub(super) fn submit(
        &mut self,
        be: &B,
        plan: &StepPlan,
        warming: bool,
        copy_bytes: (u64, u64),
        stream: &B::Stream,
        lap: &mut Lap,
    ) -> Result<(Instant, Instant)> {
        let r = plan.reservation;
        let mut ins = std::mem::take(&mut self.scratch.ins);
        let mut outs = std::mem::take(&mut self.scratch.outs);
        copy_ops(&plan.ins, &mut ins);
        copy_ops(&plan.outs, &mut outs);
        if let Some(t) = self.pace.timing.as_mut() {
            for x in t.start(be, self.pace.step, stream)? {
                tracing::debug!(executable = %self.key, step = x.step, gpu_us = x.gpu_us,
                    since_previous_us = x.since_previous_us, dropped = t.dropped(), "step timed");
            }
        }
        let back = self.enqueue_copies_in(be, r, &ins, &outs, stream, lap)?;
        lap.to(&mut self.out.stats.phases.copies, 0);
        let launched = self.launch(be, r, warming, copy_bytes, stream)?;
        lap.to(&mut self.out.stats.phases.launch, 0);
        self.copy_back(be, &outs, back, stream)?;
        if let Some(t) = self.pace.timing.as_mut() {
            t.end(be, self.pace.step, stream)?;
        }
        lap.to(&mut self.out.stats.phases.copies, 0);
        let res = &mut self.res[r];
        be.event_record(res.done.as_ref().expect("created"), stream)?;
        res.used = true;
        self.scratch.ins = ins;
        self.scratch.outs = outs;
        Ok(launched)
    }

    /// The copies in: on the kernel path the graph's copy nodes (their
    /// tables rewritten only when the copies change; what does not fit runs
    /// as a batch), else one batch. Says where the copy-backs go.
    fn enqueue_copies_in(
        &mut self,
        be: &B,
        r: usize,
        ins: &[CopyOp],
        outs: &[CopyOp],
        stream: &B::Stream,
        lap: &mut Lap,
    ) -> Result<CopyBack> {
        let mut back = CopyBack::default();
        let stats = &mut self.out.stats;
        let Some(k) = self.copies.kernel.as_ref() else {
            stats.copy_ops += copy_batch(be, ins, stream)?;
            return Ok(back);
        };
        let res = &mut self.res[r];
        let (Some(n), Some((_, exec))) = (res.nodes.as_mut(), &res.graph) else {
            return Err(RuntimeError::invalid("copy nodes missing"));
        };
        // Rows run concurrently: overlapping copy-backs go in order after
        // the launch instead (checked when the copies change).
        back.ordered = n.holds[OUT] != outs && overlapping(outs, &mut self.scratch.order);
        let out_entries: &[CopyOp] = if back.ordered { &[] } else { outs };
        for (dir, want) in [(IN, ins), (OUT, out_entries)] {
            if n.holds[dir] != want {
                let fits = self.copies.table.fill(want);
                k.update(be, exec, &n.nodes[dir], dir, &self.copies.table)?;
                n.set_on(
                    be,
                    exec,
                    dir,
                    fits && !want.is_empty(),
                    &mut self.copies.switch,
                )?;
                n.holds[dir].clear();
                n.holds[dir].extend_from_slice(want);
                n.overflow[dir] = !fits;
            }
        }
        lap.to(&mut stats.phases.tables, 0);
        back.batch = n.overflow[OUT];
        if n.overflow[IN] {
            stats.copy_ops += copy_batch(be, ins, stream)?;
        } else {
            stats.copy_ops += u64::from(!ins.is_empty());
        }
        stats.copy_ops += u64::from(!out_entries.is_empty() && !back.batch);
        Ok(back)
    }

    /// Launch the reservation's graph; under auto's warm-up, after the start
    /// event of a timed step. Returns the launch call's start and end.
    fn launch(
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
                &mut self.pace.warm.launches,
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
            let kernel = self.copies.kernel.is_some();
            let bytes = copy_out_bytes + if kernel { copy_in_bytes } else { 0 };
            let launches = u32::from(copy_out_bytes > 0) + u32::from(kernel && copy_in_bytes > 0);
            res.timed = Some(
                bytes as f64 / d.copy_bw_bytes_per_s * 1e6 + f64::from(launches) * d.copy_launch_us,
            );
        }
        Ok((t_launch, t_after))
    }

    /// The copy-backs the graph does not make (see [`CopyBack`]).
    fn copy_back(
        &mut self,
        be: &B,
        outs: &[CopyOp],
        how: CopyBack,
        stream: &B::Stream,
    ) -> Result<()> {
        if self.copies.kernel.is_none() || how.batch {
            self.out.stats.copy_ops += copy_batch(be, outs, stream)?;
        } else if how.ordered {
            for &(d, s, n) in outs {
                be.copy_d2d(d, s, n, stream)?;
            }
            self.out.stats.copy_ops += outs.len() as u64;
        }
        Ok(())
    }
}

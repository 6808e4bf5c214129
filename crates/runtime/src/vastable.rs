//! VA-stable graph mode (DESIGN §3): the graph is recorded once per VA
//! reservation and never re-captured; each step the parameter slots are made
//! to hold the caller's buffers by skip, remap or copy, as the policy's
//! [`SlotTracker`] says. Two stages, as XLA's thunks have:
//! `VaStable::initialize` once (costs, plan, lay-out, both reservations
//! bound to the first step's memory and recorded) and `VaStable::run` per
//! step: plan (the tracker's actions, made a [`StepPlan`] with addresses by
//! the policy's [`StepPlanner`]), apply (`apply.rs`: the driver calls),
//! submit (`submit.rs`: copies, launch, event).
//!
//! Layout of a reservation (the same in both): `[ parameter regions | owned
//! regions ]`
//! - one granule-aligned *region* per parameter slot, where either the
//!   caller's physical allocation is mapped (remap; skip when already there)
//!   or the slot's *shadow* (copy);
//! - *owned regions*: the executable's temps, constants and outputs, the very
//!   physical memory of the eager buffers mapped again (no extra memory; the
//!   eager addresses stay valid, so outputs are read there).
//!
//! Two reservations are used alternately: step N+1 binds reservation B while
//! the GPU may still run step N on A, and buffers that alternate between
//! steps (state that is not donated) stay mapped, one set in each. An event
//! recorded after each step on a reservation proves the GPU is done with it;
//! the host waits for it only before an unmap there (`cuMemUnmap` is not
//! stream ordered). [`BindingConfig::reservations`] = 1
//! (`XLA_VMM_RESERVATIONS=1`, for A/B) uses one: alternating buffers then
//! remap every step.
//!
//! Shadows: one physical allocation per copy slot (the region's size:
//! whole granules; the policy counts each so against its cap),
//! created when first needed and mapped at the slot's region in whichever
//! reservation serves the slot from it. Both reservations share it (steps
//! are ordered on the stream, as for temps), so the shadow's content is
//! known: after a step it equals the caller's buffer (copied in, or copied
//! out). With [`BindingConfig::immutable_buffers`] (PJRT semantics: a
//! buffer's content never changes except through donation to this
//! executable) the copy in is elided when the same buffer (allocation id and
//! generation) is bound again. The tracker runs adaptively: a copy slot
//! whose buffer stops changing is mapped directly once its copies have cost
//! one remap; a directly mapped slot that churns again goes back to its
//! shadow.
//!
//! A failing unmap is retried once; a failing map or set access unmaps what
//! it left and serves the slot from its shadow from then on (copy in before,
//! copy out after): no data is lost (counted in `fallbacks`). A buffer that
//! cannot be mapped (sub-allocated, raw memory without an allocation id, or
//! smaller than the slot's region) is copy-only: the slots bound to such
//! buffers at initialize (the first step's) are planned as copy slots from the start
//! ([`SlotTracker::set_remappable`]), so the policy counts their copies and
//! shadows in its budget; only a slot whose buffer turns unmappable later
//! goes through the fallback.
//!
//! Copies, kernel path (CUDA, HIP, and the host backend once its copy
//! kernel is registered; see [`crate::copykernel`]): each reservation's
//! graph starts and ends with a copy kernel node whose table of copies is
//! its by-value parameter; when a step's copies differ from what a node
//! holds, the host rewrites that node in the reservation's graph exec (no
//! wait: launches already enqueued keep theirs), so a step whose copies are
//! unchanged makes no call for them; a node with no copies is turned off
//! (where the backend can: CUDA, the host backend, HIP runtimes with
//! `hipGraphNodeSetEnabled`), so a step with none runs no copy kernel. Batch path (elsewhere, with
//! `XLA_VMM_COPY_PATH=batch`, or when the kernel or node updates are
//! unavailable): all copy-ins of a step
//! are one [`Backend::copy_d2d_batch`] before the launch, all copy-backs one
//! after it (contiguous ranges merged; on CUDA 13 one `cuMemcpyBatchAsync`
//! each). Either way `copy_ops` grows by at most two per step. Within a
//! direction the copies are independent (each slot has its own shadow and
//! its own buffer); copy-backs whose destinations overlap (one buffer bound
//! to two written parameters) run as ordered single copies after the
//! launch.
//!
//! Steady state (every slot skips, or copies exactly what the tables hold)
//! makes two driver calls per step: the graph launch and the event record.
//!
//! Auto (threshold 1) plans with measured inputs: at initialize the
//! costs come from the in-process probe ([`crate::binding::measured_costs`],
//! once per device per process; the copy kernel's per-direction cost when
//! copies run inside the graph), and the tracker re-plans once after
//! [`DEFAULT_REPLAN_AFTER_STEPS`] warm-up steps with each slot's observed
//! churn and what bounds the step, measured here during the warm-up only:
//! whether the previous step's `done` event was still pending when `run` was
//! called again (the GPU is behind: GPU-bound, remaps overlap it) or already
//! complete (binding is on the critical path: costs add), the host time
//! between `run` calls, and the GPU time of a step (an event recorded before
//! the graph launch, read with `event_query` once the reservation's `done`
//! event has completed: never waited for; the modelled copy time is
//! subtracted). The re-plan only moves slots between their shadow and direct
//! mapping: every slot has its own region from initialize, shadows are
//! created when first mapped, so nothing is re-captured (see the policy's
//! tracker docs for the shadow cap across the re-plan).

use std::sync::Arc;
use std::time::Instant;

use xla_vmm::AllocationRole;
use xla_vmm_device::vmm::Phys;
use xla_vmm_device::{Backend, DevicePtr};
use xla_vmm_policy::step::{Bound, SlotRegion, StepPlan, StepPlanner};
use xla_vmm_policy::tracker::DEFAULT_REPLAN_AFTER_STEPS;
use xla_vmm_policy::{Binding, SlotInfo, SlotTracker, StepActions, Threshold, TrackerConfig};

use crate::binding::{publish, register, BindingConfig, BindingStats, Lap, StatsSlot, UserBuffer};
use crate::copykernel::{CopyKernel, CopyOp, Table, IN, OUT};
use crate::error::{Result, RuntimeError, Teardown};
use crate::exec::ExecEnv;
use crate::program::Program;
use crate::slots::SlotTable;
use crate::trace::{self, StatValue};

mod apply;
mod helpers;
mod submit;
mod timing;
mod warmup;

use helpers::{bound, capture, contiguous, copy_batch, overlapping};
use warmup::{push_sample, Warmup};

/// Ids given to raw (id-less) bindings: never equal to an allocator id.
const RAW_ID_BIT: u64 = 1 << 63;

fn policy_err(e: xla_vmm_policy::PolicyError) -> RuntimeError {
    RuntimeError::arg(format!("binding policy: {e}"))
}

/// One parameter slot: its allocation and parameter (its region in the
/// reservations is the planner's).
#[derive(Clone, Debug)]
struct ParamSlot {
    allocation: usize,
    param: usize,
    size: u64,
}

/// What the driver has mapped at a slot's region (the planner's [`Held`]
/// is what the step decides on; this is what teardown unmaps and what
/// keeps a mapped caller allocation alive).
///
/// [`Held`]: xla_vmm_policy::step::Held
enum Mapped<B: Backend> {
    Nothing,
    /// The caller's allocation, kept alive while mapped.
    Caller {
        _phys: Arc<Phys<B>>,
    },
    Shadow,
}

/// Kernel path: a reservation graph's copy nodes (IN, OUT), the copies each
/// holds now, whether that direction's copies overflowed its table (then
/// they run as a batch and the node holds none), and whether each node is
/// on. A node whose table is empty is turned off where the backend can
/// ([`Backend::graph_exec_node_set_enabled`]): launched empty it still
/// costs the step a kernel on the GPU, before the first of the program's
/// and after the last.
struct CopyNodes<B: Backend> {
    nodes: [B::GraphNode; 2],
    holds: [Vec<CopyOp>; 2],
    overflow: [bool; 2],
    on: [bool; 2],
}

impl<B: Backend> CopyNodes<B> {
    /// Turn direction `dir`'s node on or off in `exec` where it is not so
    /// already. Where the backend cannot (`switch` false, or made false
    /// here) the node stays on, running its empty table.
    fn set_on(
        &mut self,
        be: &B,
        exec: &B::GraphExec,
        dir: usize,
        on: bool,
        switch: &mut bool,
    ) -> Result<()> {
        if self.on[dir] == on || !*switch {
            return Ok(());
        }
        match be.graph_exec_node_set_enabled(exec, &self.nodes[dir], on) {
            Ok(()) => {
                self.on[dir] = on;
                Ok(())
            }
            Err(xla_vmm_device::DeviceError::Unsupported(why)) => {
                tracing::debug!(reason = %why, "VA-stable copy nodes stay on when empty");
                *switch = false;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

struct Reservation<B: Backend> {
    va: Option<B::VaRange>,
    table: SlotTable,
    mapped: Vec<Mapped<B>>,
    /// Mapped ranges other than parameter regions: (offset, bytes).
    fixed_maps: Vec<(u64, u64)>,
    graph: Option<(B::Graph, B::GraphExec)>,
    nodes: Option<CopyNodes<B>>,
    done: Option<B::Event>,
    used: bool,
    /// Recorded before the graph launch during auto's warm-up.
    start: Option<B::Event>,
    /// A timed step is in flight on this reservation: its modelled copy µs.
    timed: Option<f64>,
}

/// How the copies run: the copy kernel's nodes in the graph (`kernel`), or
/// batched driver copies (`None`, `error` says why).
struct CopyPath<B: Backend> {
    kernel: Option<CopyKernel<B>>,
    /// Why the copy kernel could not be loaded (logged at lay-out).
    error: Option<String>,
    /// Scratch for the copy nodes' tables.
    table: Table,
    /// The backend turns graph nodes off (until it says it cannot).
    switch: bool,
}

/// Step counting and auto's warm-up measurement.
struct Pace<B: Backend> {
    step: u64,
    /// Auto re-plans after warm-up (measures while it has not).
    replan: bool,
    warm: Warmup,
    /// `XLA_VMM_STEP_TIMING=1`: the event pairs around each step.
    timing: Option<timing::StepTiming<B>>,
    /// Waited for reservations since the last phase lap, ns (counted in
    /// the `wait` phase, not in the phase around it).
    waited_ns: u64,
}

/// What the executable publishes.
struct Published {
    stats: BindingStats,
    /// Where `stats` is published (registered at the first step).
    slot: Option<StatsSlot>,
    /// Per slot: how often the caller's memory was mapped there.
    maps: Vec<u64>,
    unmap_failures: u64,
}

/// What a step builds and the next step reuses (no allocation per step).
struct Scratch {
    /// The tracker's actions.
    actions: StepActions,
    /// The step's binding of each slot, as the tracker and the planner see it.
    bindings: Vec<Binding>,
    bound: Vec<Bound>,
    /// The step's plan.
    plan: StepPlan,
    /// Slots mapped anew this step.
    new_maps: Vec<usize>,
    /// The plan's copies in and out, as the copy paths take them.
    ins: Vec<CopyOp>,
    outs: Vec<CopyOp>,
    /// Sort space of the overlap check of the copies out.
    order: Vec<(u64, u64)>,
}

impl Scratch {
    fn with_capacity(n: usize) -> Self {
        Scratch {
            actions: StepActions {
                actions: Vec::with_capacity(n),
                ..Default::default()
            },
            bindings: Vec::with_capacity(n),
            bound: Vec::with_capacity(n),
            plan: StepPlan::default(),
            new_maps: Vec::with_capacity(n),
            ins: Vec::with_capacity(n),
            outs: Vec::with_capacity(n),
            order: Vec::with_capacity(n),
        }
    }
}

/// Per-executable state of VA-stable mode. A step is planned (the tracker's
/// actions, then the planner's [`StepPlan`] with addresses), applied
/// (`apply.rs`: the driver calls it names) and submitted (`submit.rs`: copy
/// nodes or batches, launch, copies back, the reservation's event).
pub(crate) struct VaStable<B: Backend> {
    key: String,
    tracker: SlotTracker,
    slots: Vec<ParamSlot>,
    planner: StepPlanner,
    res: Vec<Reservation<B>>,
    /// [`VaStable::initialize`] has run to its end (laid out, both graphs).
    initialized: bool,
    /// Shadow of each slot (shared by the reservations), once needed.
    shadows: Vec<Option<B::PhysMem>>,
    copies: CopyPath<B>,
    cfg: BindingConfig,
    pace: Pace<B>,
    out: Published,
    scratch: Scratch,
}

/// The copy kernel is unavailable: said once per process at info level.
static KERNEL_FALLBACK_LOGGED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl<B: Backend> VaStable<B> {
    pub(crate) fn new(program: &Program<B>, cfg: &BindingConfig) -> Result<Self> {
        let plan = program.plan();
        let mut read = vec![false; plan.allocations.len()];
        let mut written = vec![false; plan.allocations.len()];
        plan.walk(&mut |t, _| {
            for (s, a) in t.own_uses() {
                if let (Some(r), Some(w)) =
                    (read.get_mut(s.allocation), written.get_mut(s.allocation))
                {
                    *r |= a.reads();
                    *w |= a.writes();
                }
            }
        });
        // One granule-aligned region per slot, in slot order.
        let gran = program.backend().info().vmm_granularity.max(1);
        let mut slots = Vec::new();
        let mut regions = Vec::new();
        let mut infos = Vec::new();
        let mut off = 0u64;
        for a in &plan.allocations {
            if let AllocationRole::Parameter {
                number,
                aliased_with_output,
                ..
            } = &a.role
            {
                if a.size == 0 {
                    continue;
                }
                slots.push(ParamSlot {
                    allocation: a.index,
                    param: *number as usize,
                    size: a.size,
                });
                let region = a.size.div_ceil(gran) * gran;
                regions.push(SlotRegion {
                    offset: off,
                    region,
                    size: a.size,
                    written: written[a.index],
                });
                off += region;
                // A donated parameter aliased with an output keeps its
                // buffer from step to step (churn 0); others may change.
                let churn = if *aliased_with_output { 0.0 } else { 1.0 };
                infos.push(SlotInfo::new(
                    a.size,
                    read[a.index] || !written[a.index],
                    written[a.index],
                    churn,
                ));
            }
        }
        // Placeholder costs (memory read now, no probe): the real ones are
        // set at initialize (`prepare_costs`), once the copy path is known.
        let mut costs = BindingConfig {
            costs: None,
            ..cfg.clone()
        }
        .costs_without_probe(program.backend())?;
        // Shadows are whole granules, one per copy slot shared by the
        // reservations (see `map_shadow`): the policy counts them so, and
        // its shadow bytes are what is allocated.
        costs.granularity_bytes = gran;
        let replan = cfg.threshold == Threshold::Auto;
        let mut tc = TrackerConfig::new(costs, cfg.threshold);
        tc.reservations = cfg.reservations;
        tc.shared_shadows = true;
        tc.adaptive = true;
        tc.replan_after_steps = replan.then_some(DEFAULT_REPLAN_AFTER_STEPS);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("{}#{n}", plan.module_name);
        let tracker = SlotTracker::new(key.clone(), infos, tc).map_err(policy_err)?;
        let stats = BindingStats {
            executable: key.clone(),
            threshold: cfg.threshold.raw(),
            slots: slots.len(),
            ..Default::default()
        };
        let n = slots.len();
        Ok(VaStable {
            key,
            tracker,
            slots,
            planner: StepPlanner::new(regions, cfg.immutable_buffers),
            res: Vec::new(),
            initialized: false,
            shadows: (0..n).map(|_| None).collect(),
            copies: CopyPath {
                kernel: None,
                error: None,
                table: Table::empty(1),
                switch: true,
            },
            cfg: cfg.clone(),
            pace: Pace {
                step: 0,
                replan,
                warm: Warmup::new(),
                timing: None,
                waited_ns: 0,
            },
            out: Published {
                stats,
                slot: None,
                maps: vec![0; n],
                unmap_failures: 0,
            },
            scratch: Scratch::with_capacity(n),
        })
    }

    /// The shadows' contents are unknown from now on (a run outside this
    /// mode may have written the caller's buffers).
    pub(crate) fn forget_shadow_contents(&mut self) {
        self.planner.forget_shadow_contents();
    }

    pub(crate) fn stats(&self) -> &BindingStats {
        &self.out.stats
    }

    /// Publish the never-slower guard's decision with these stats.
    pub(crate) fn note_guard(&mut self, report: crate::guard::GuardReport) {
        self.out.stats.guard = Some(report);
        self.out.publish(&self.key);
    }

    /// Reserve and map both reservations once the first plan is made (one
    /// region per parameter slot whatever the plan: a re-plan changes what
    /// is mapped there, never the layout).
    fn lay_out(&mut self, program: &Program<B>) -> Result<()> {
        let be = program.backend();
        let gran = be.info().vmm_granularity.max(1);
        if self.tracker.plan().is_none() {
            return Err(RuntimeError::invalid("binding plan not made"));
        }
        let mut off = self
            .planner
            .regions()
            .last()
            .map_or(0, |r| r.offset + r.region);
        // The program's own buffers after the parameter regions, each mapped
        // once (several small allocations share one).
        let (buffers, owned) = program.owned_storage();
        let mut at = Vec::with_capacity(buffers.len());
        for buf in buffers {
            at.push(off);
            off += buf.mapped();
        }
        let total = off.max(gran);
        for _ in 0..self.cfg.reservations {
            let va = be.va_reserve(total, 0)?;
            let base = be.va_base(&va);
            // Pushed first so that a failure below is torn down.
            self.res.push(Reservation {
                va: Some(va),
                table: SlotTable::new(program.plan().allocations.len()),
                mapped: self.slots.iter().map(|_| Mapped::Nothing).collect(),
                fixed_maps: Vec::new(),
                graph: None,
                nodes: None,
                done: None,
                used: false,
                start: None,
                timed: None,
            });
            let r_i = self.planner.add_reservation(base.0);
            let r = &mut self.res[r_i];
            r.done = Some(be.event_create()?);
            if self.pace.replan {
                r.start = Some(be.event_create()?);
            }
            let va = r.va.as_ref().expect("just reserved");
            for (buf, &o) in buffers.iter().zip(&at) {
                be.map(va, o, buf.raw_mem(), 0, buf.mapped())?;
                r.fixed_maps.push((o, buf.mapped()));
                be.set_access(va, o, buf.mapped())?;
            }
            for w in owned {
                r.table
                    .bind(w.allocation, base.offset(at[w.buffer] + w.offset), w.size)?;
            }
            for (s, g) in self.slots.iter().zip(self.planner.regions()) {
                r.table.bind(s.allocation, base.offset(g.offset), s.size)?;
            }
        }
        self.setup_copy_kernel(be);
        Ok(())
    }

    /// Say which copy path this executable takes (the kernel was loaded,
    /// or failed to, at initialize by `prepare_costs`).
    fn setup_copy_kernel(&mut self, be: &B) {
        match (&self.copies.kernel, self.copies.error.take()) {
            (Some(k), _) => {
                self.out.stats.copy_path = "kernel";
                self.copies.table = Table::empty(k.capacity());
            }
            (None, e) => {
                let e = e.unwrap_or_else(|| "not loaded".into());
                self.kernel_unavailable(be, &e);
            }
        }
    }

    /// The batch path from now on, said once per process at info level.
    fn kernel_unavailable(&mut self, be: &B, why: &str) {
        if let Some(k) = self.copies.kernel.take() {
            k.unload(be);
        }
        self.out.stats.copy_path = "batch";
        if !KERNEL_FALLBACK_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!(reason = %why, backend = be.info().backend,
                "VA-stable copies are batched driver copies (no copy kernel)");
        } else {
            tracing::debug!(reason = %why, "VA-stable copies are batched driver copies");
        }
    }

    /// Capture reservation `r`'s graph. On the kernel path its copy nodes
    /// are found in it; if that fails at the first capture, the kernel is
    /// dropped and the step captured without it (batched copies).
    fn capture_reservation(
        &mut self,
        program: &Program<B>,
        env: &ExecEnv<'_, B>,
        r: usize,
        stream: &B::Stream,
    ) -> Result<()> {
        let be = program.backend();
        let first = self.res.iter().all(|x| x.graph.is_none());
        let got = capture(
            program,
            env,
            &self.res[r].table,
            self.copies.kernel.as_ref(),
            stream,
        );
        let (graph, exec, nodes) = match got {
            Ok(c) => c,
            Err(e) if self.copies.kernel.is_some() && first => {
                self.kernel_unavailable(be, &format!("capturing the copy nodes: {e}"));
                capture(program, env, &self.res[r].table, None, stream)?
            }
            Err(e) => return Err(e),
        };
        let res = &mut self.res[r];
        let mut nodes = nodes.map(|nodes| CopyNodes {
            nodes,
            holds: [Vec::new(), Vec::new()],
            overflow: [false; 2],
            on: [true; 2],
        });
        // Both tables start empty: both nodes off until copies come.
        let off = match nodes.as_mut() {
            Some(n) => [IN, OUT]
                .into_iter()
                .try_for_each(|dir| n.set_on(be, &exec, dir, false, &mut self.copies.switch)),
            None => Ok(()),
        };
        res.graph = Some((graph, exec));
        res.nodes = nodes;
        off?;
        self.out.stats.captures += 1;
        Ok(())
    }

    /// XLA's initialize stage, once before the first step (never on the
    /// per-step path): which slots the first step's buffers (`users`) allow
    /// to map, the binding costs (probed once per device) and the copy
    /// kernel, the plan, both reservations laid out, bound to the first
    /// step's memory and recorded. On an error the caller tears this runner
    /// down.
    pub(crate) fn initialize(
        &mut self,
        program: &Program<B>,
        env: &ExecEnv<'_, B>,
        users: &[Option<UserBuffer<B>>],
        stream: &B::Stream,
    ) -> Result<()> {
        if self.initialized {
            return Ok(());
        }
        let be = program.backend();
        // Slots whose first buffer cannot be mapped are copy-only.
        let mut any_mappable = false;
        for (i, (s, g)) in self.slots.iter().zip(self.planner.regions()).enumerate() {
            let u = bound(users, s)?;
            let mappable =
                u.id.is_some() && u.remap.as_ref().is_some_and(|src| src.capacity >= g.region);
            if !mappable {
                self.tracker.set_remappable(i, false).map_err(policy_err)?;
            }
            any_mappable |= mappable;
        }
        // Copy-only slots are copied whatever is measured: no warm-up
        // (and no timing calls) when no slot could be anything else.
        self.pace.replan &= any_mappable;
        self.prepare_costs(be)?;
        self.tracker.make_plan().map_err(policy_err)?;
        self.refresh_plan_stats();
        self.lay_out(program)?;
        if self.cfg.step_timing {
            self.pace.timing = Some(timing::StepTiming::new(be)?);
        }
        // The driver checks a recorded copy's addresses: every slot holds
        // memory before its reservation is recorded.
        for r in 0..self.res.len() {
            self.prebind(be, r, users)?;
            self.capture_reservation(program, env, r, stream)?;
        }
        self.initialized = true;
        Ok(())
    }

    /// XLA's execute stage, once per step ([`VaStable::initialize`] first):
    /// plan the step (the tracker's actions, the planner's addresses), apply
    /// it (map the step's buffers `users` or the shadows), submit it (copies
    /// in, the reservation's graph, copies out).
    pub(crate) fn run(
        &mut self,
        program: &Program<B>,
        users: &[Option<UserBuffer<B>>],
        stream: &B::Stream,
    ) -> Result<()> {
        if !self.initialized {
            return Err(RuntimeError::invalid("VA-stable step before initialize"));
        }
        let t0 = Instant::now();
        let mut lap = Lap::start();
        self.pace.waited_ns = 0;
        let be = program.backend();
        let r = (self.pace.step % self.res.len() as u64) as usize;
        let warming = self.pace.replan && !self.tracker.replanned();
        if warming {
            let w = &mut self.pace.warm;
            w.observe(be, self.pace.step, &mut self.res, t0);
            self.out.stats.bound = w.bound();
            self.out.stats.step_host_us = w.host_us();
            self.out.stats.step_gpu_us = w.gpu_us();
        }
        // Plan.
        let span = trace::span("bind: plan");
        self.bind_buffers(users)?;
        if warming && self.tracker.stats().steps >= DEFAULT_REPLAN_AFTER_STEPS {
            if let Some(m) = self.pace.warm.measurement() {
                self.tracker.set_warmup_measurement(m);
            }
        }
        let mut step = std::mem::take(&mut self.scratch.actions);
        self.tracker
            .bind_step_into(r, &self.scratch.bindings, None, &mut step)
            .map_err(policy_err)?;
        if warming && self.tracker.replanned() {
            self.refresh_plan_stats();
        }
        let copy_bytes = (step.copy_in_bytes, step.copy_out_bytes);
        let mut plan = std::mem::take(&mut self.scratch.plan);
        self.planner
            .plan(r, &step.actions, &self.scratch.bound, &mut plan);
        self.scratch.actions = step;
        lap.to(&mut self.out.stats.phases.plan, 0);
        drop(span);
        // Apply.
        let mut span = trace::span("bind: apply");
        if span.recording() {
            span.stat("maps", StatValue::U64(plan.maps.len() as u64));
            span.stat("copies in", StatValue::U64(plan.ins.len() as u64));
            span.stat("copies out", StatValue::U64(plan.outs.len() as u64));
            span.stat("copies elided", StatValue::U64(plan.elided));
        }
        self.apply(be, users, &mut plan, false)?;
        drop(span);
        let waited = std::mem::take(&mut self.pace.waited_ns);
        lap.to(&mut self.out.stats.phases.vmm, waited);
        self.out.stats.copies_elided += plan.elided;
        self.out.stats.bytes_elided += plan.elided_bytes;
        // Submit.
        let span = trace::span("launch");
        let t_bind = t0.elapsed();
        let (t_launch, t_after) = self.submit(be, &plan, warming, copy_bytes, stream, &mut lap)?;
        self.scratch.plan = plan;
        drop(span);
        // Binding time: everything but the launch call.
        let ns = (t_bind + t_after.elapsed()).as_nanos() as u64;
        self.tracker.record_binding_time(ns);
        self.pace.step += 1;
        let stats = &mut self.out.stats;
        stats.counters = *self.tracker.stats();
        stats.counters.bytes_copied = stats
            .counters
            .bytes_copied
            .saturating_sub(stats.bytes_elided);
        // Every failed unmap call, including those a retry recovered.
        stats.counters.unmap_errors = self.out.unmap_failures;
        lap.to(&mut self.out.stats.phases.record, 0);
        self.out.publish(&self.key);
        let c = &self.out.stats.counters;
        tracing::debug!(executable = %self.key, step = self.pace.step - 1, reservation = r,
            remaps_total = c.remaps, copies_total = c.copies,
            copy_in_bytes = copy_bytes.0, copy_out_bytes = copy_bytes.1, host_ns = ns,
            launch_ns = (t_after - t_launch).as_nanos() as u64, "step bound");
        if warming {
            self.pace.warm.last_end = Some(Instant::now());
        }
        Ok(())
    }

    /// The step's buffers as the tracker (`bindings`) and the planner
    /// (`bound`) see them.
    fn bind_buffers(&mut self, users: &[Option<UserBuffer<B>>]) -> Result<()> {
        self.scratch.bindings.clear();
        self.scratch.bound.clear();
        for s in &self.slots {
            let u = bound(users, s)?;
            let binding = Binding {
                id: u.id.unwrap_or(RAW_ID_BIT | u.ptr.0),
                addr: u.ptr.0,
            };
            self.scratch.bindings.push(binding);
            self.scratch.bound.push(Bound {
                binding,
                generation: u.id.map(|_| u.generation),
            });
        }
        Ok(())
    }

    /// Initialize, before the plan: load the copy kernel (its path changes
    /// what a copy costs) and give the tracker the costs (given, probed or
    /// the constants).
    fn prepare_costs(&mut self, be: &B) -> Result<()> {
        let c = &mut self.copies;
        if !self.cfg.copy_path.wants_kernel() && c.error.is_none() {
            c.error = Some("copy_path=batch (XLA_VMM_COPY_PATH)".to_string());
        }
        if c.kernel.is_none() && c.error.is_none() {
            // Room for every slot as a copy (any slot may turn to copies
            // later), up to what the backend's tables hold.
            let rows = self
                .slots
                .iter()
                .map(|s| crate::copykernel::rows(s.size))
                .sum();
            match CopyKernel::load(be, rows) {
                Ok(k) => c.kernel = Some(k),
                Err(e) => c.error = Some(e.to_string()),
            }
        }
        let (mut costs, source) = self.cfg.costs_for(be, c.kernel.is_some())?;
        costs.granularity_bytes = be.info().vmm_granularity.max(1);
        let stats = &mut self.out.stats;
        stats.costs_source = source.as_str();
        stats.remap_us = costs.remap_us;
        stats.copy_gbps = costs.copy_bw_bytes_per_s / 1e9;
        stats.copy_launch_us = costs.copy_launch_us;
        self.tracker.set_device_costs(costs).map_err(policy_err)
    }

    /// `stats.remapped` from `maps` (only when a step mapped something).
    fn list_remapped(&mut self) {
        let mut list: Vec<(usize, u64, u64)> = self
            .slots
            .iter()
            .zip(&self.out.maps)
            .filter(|(_, &n)| n > 0)
            .map(|(s, &n)| (s.param, s.size, n))
            .collect();
        list.sort_by_key(|&(p, _, n)| (std::cmp::Reverse(n), p));
        list.truncate(crate::binding::REMAPPED_LISTED);
        self.out.stats.remapped = list;
    }

    /// The plan's figures in the stats (initialize, and auto's re-plan).
    fn refresh_plan_stats(&mut self) {
        let Some(plan) = self.tracker.plan() else {
            return;
        };
        use xla_vmm_policy::Decision;
        let count = |d: Decision| plan.decisions.iter().filter(|x| **x == d).count();
        let stats = &mut self.out.stats;
        stats.copy_slots = count(Decision::Copy);
        stats.plan_skip = count(Decision::Skip);
        stats.plan_remap = count(Decision::Remap);
        stats.plan_copy = stats.copy_slots;
        stats.copy_only_slots = plan.counts.copy_only;
        stats.threshold_bytes = plan.threshold_bytes;
        stats.shadow_cap_bytes = plan.shadow_cap_bytes;
        stats.replanned = self.tracker.replanned();
        if stats.bound.is_empty() {
            stats.bound = "unknown";
        }
    }

    /// Unmap everything, free ranges, shadows, graphs, events. The caller
    /// has synchronized the streams.
    pub(crate) fn teardown(mut self, be: &B) {
        let mut t = Teardown::new("VA-stable binding");
        for mut r in self.res.drain(..) {
            if let Some((g, e)) = r.graph.take() {
                t.check("graph_exec_destroy", be.graph_exec_destroy(e));
                t.check("graph_destroy", be.graph_destroy(g));
            }
            for e in [r.done.take(), r.start.take()].into_iter().flatten() {
                t.check("event_destroy", be.event_destroy(e));
            }
            if let Some(va) = r.va.take() {
                for (m, g) in r.mapped.iter().zip(self.planner.regions()) {
                    if !matches!(m, Mapped::Nothing) {
                        t.check("unmap", be.unmap(&va, g.offset, g.region));
                    }
                }
                for (o, len) in &r.fixed_maps {
                    t.check("unmap", be.unmap(&va, *o, *len));
                }
                r.mapped.clear();
                t.check("va_free", be.va_free(va));
            }
        }
        for m in self.shadows.drain(..).flatten() {
            t.check("mem_release", be.mem_release(m));
        }
        if let Some(k) = self.copies.kernel.take() {
            k.unload(be);
        }
        if let Some(mut timing) = self.pace.timing.take() {
            timing.teardown(be);
        }
        self.tracker.log_stats();
        if let Some(slot) = self.out.slot.take() {
            crate::binding::release(slot);
        }
    }
}

impl Published {
    /// Publish the stats where `stats()` reads them (registered once).
    fn publish(&mut self, key: &str) {
        let slot = self.slot.get_or_insert_with(|| register(key, &self.stats));
        publish(slot, &self.stats);
    }
}

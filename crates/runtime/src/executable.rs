//! The execution API: load a [`Plan`] (into a [`Program`]), bind
//! parameters, run it in a [`Mode`], get the outputs. The program is
//! immutable; each mode's runner keeps its own state here: eager has none,
//! graph-recapture its last graph (`recapture.rs`), the default
//! VA-stable mode its reservations ([`crate::vastable`]).
//!
//! Parameters are the caller's buffers, bound per run. A parameter aliased
//! with an output (donation) is updated in place: the output *is* the
//! parameter buffer. Outputs are returned as addresses valid until the next
//! run.

use std::sync::Arc;

use xla_vmm::{AllocationRole, Plan, Shape};
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::{Backend, DevicePtr, MemLocation};

use crate::binding::{BindingConfig, BindingStats, UserBuffer};
use crate::collective::{CollectiveEnv, Resolved};
use crate::config::RunConfig;
use crate::custom_call::{CallContext, CustomCallRegistry};
use crate::error::{Result, RuntimeError, Teardown};
use crate::exec::run_program;
use crate::guard::{Guard, GuardReport, Runner};
use crate::program::Program;
use crate::recapture::Recapture;
use crate::report::{ProgramReport, ReportSlot};
use crate::slots::SlotTable;
use crate::trace::{self, StatValue};
use crate::vastable::VaStable;

pub use crate::mode::Mode;

/// One result leaf of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// Position in the flattened result (`out_i`).
    pub index: usize,
    pub ptr: DevicePtr,
    /// Bytes of the leaf (its shape's dense size).
    pub bytes: u64,
    pub shape: Shape,
    /// The entry parameter whose buffer holds it (donation / passthrough).
    pub parameter: Option<usize>,
}

/// A loaded program and how it runs: the parameters bound for the next
/// run, the runners' state (graph-recapture's graph, the VA-stable
/// reservations) and the collectives' environment.
pub struct Executable<B: Backend> {
    program: Program<B>,
    slots: SlotTable,
    /// The caller's buffer of each entry parameter (VA-stable binding).
    users: Vec<Option<UserBuffer<B>>>,
    /// How [`Executable::step`] runs (mode, guard, binding).
    config: RunConfig,
    /// The never-slower guard of [`Mode::Graph`] (`config.guard`), from
    /// the first [`Executable::step`].
    guard: Option<Guard<B>>,
    va: Option<VaStable<B>>,
    recapture: Recapture<B>,
    warned_eager: bool,
    /// Why its graphs are given up (a graph step failed where the eager
    /// one ran): it runs eager from then on, as a blocker would have it.
    graph_failed: Option<String>,
    /// Collectives: the environment (see [`Executable::set_collectives`])
    /// and, after the first run, each op's communicator.
    coll_env: Option<CollectiveEnv<B>>,
    resolved: Vec<Resolved<B>>,
    logical: (u32, u32),
    /// The next runs' execute context (custom calls' user data).
    call_context: Option<Arc<dyn CallContext>>,
    /// This program's line of the report (`crate::report`).
    report: ReportSlot,
    /// Its staging was planned (at the first run, for the memory bound),
    /// for these parameter allocations' locations, with the budget's
    /// relocation count then (another program's moves make it plan again).
    staging_planned: bool,
    staging_params: Vec<(usize, Option<MemLocation>)>,
    staging_epoch: u64,
    /// [`Executable::placement`] was asked.
    placed: bool,
}

/// What the device's other programs gave back for a placing program
/// ([`Executable::placement`]'s `reclaim`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reclaimed {
    /// Device bytes freed.
    pub bytes: u64,
    /// Whether each parameter may move now (as `placement`'s `params`
    /// second member; `None`: as before).
    pub movable: Option<Vec<bool>>,
}

/// The binding settings an executable accepts.
fn check_binding(cfg: &BindingConfig) -> Result<()> {
    if !(1..=2).contains(&cfg.reservations) {
        return Err(RuntimeError::arg(format!(
            "{} VA reservations asked for: 1 or 2",
            cfg.reservations
        )));
    }
    Ok(())
}

fn leaf_shape(result: &Shape, index: &[i64]) -> Option<Shape> {
    let mut s = result;
    for &i in index {
        s = s.tuple_shapes.get(usize::try_from(i).ok()?)?;
    }
    Some(s.clone())
}

impl<B: Backend> Executable<B> {
    /// Load `plan` ([`Program::load`]: check every thunk, load kernels,
    /// prepare GEMMs, upload constants, allocate temps and outputs) with the
    /// default [`RunConfig`]. `stream` orders the uploads.
    pub fn load(
        backend: Arc<B>,
        plan: Plan,
        gemm: Option<Arc<dyn GemmEngine<B>>>,
        stream: &B::Stream,
    ) -> Result<Self> {
        Self::load_with(backend, plan, gemm, None, &RunConfig::default(), stream)
    }

    /// [`Executable::load`] with the handlers of the plan's typed-FFI custom
    /// calls (without, a plan with one is rejected) and how it runs
    /// (`config`: what [`Executable::step`] does).
    pub fn load_with(
        backend: Arc<B>,
        plan: Plan,
        gemm: Option<Arc<dyn GemmEngine<B>>>,
        custom_calls: Option<&dyn CustomCallRegistry>,
        config: &RunConfig,
        stream: &B::Stream,
    ) -> Result<Self> {
        check_binding(&config.binding)?;
        let name = plan.module_name.clone();
        let _span = trace::span("load").detail(|| name);
        let program = Program::load(backend, plan, gemm, custom_calls, stream, config.one_stream)?;
        let slots = program.owned_slots()?;
        let nparams = program.parameter_shapes().len();
        let report = ReportSlot::register(ProgramReport {
            program: program.plan().module_name.clone(),
            mode: config.mode.name(),
            reason: program.capture_blocker().map(str::to_string),
            ..Default::default()
        });
        let exe = Executable {
            program,
            slots,
            users: (0..nparams).map(|_| None).collect(),
            config: config.clone(),
            guard: None,
            va: None,
            recapture: Recapture::new(),
            warned_eager: false,
            graph_failed: None,
            coll_env: None,
            resolved: Vec::new(),
            logical: (0, 0),
            call_context: None,
            report,
            staging_planned: false,
            staging_params: Vec::new(),
            staging_epoch: 0,
            placed: false,
        };
        let runner = exe.runner_name();
        let memory = exe.program.own_memory();
        exe.report.update(|r| {
            r.runner = runner;
            r.memory = Some(memory);
        });
        Ok(exe)
    }

    /// The execute context the following runs hand their custom calls
    /// (`None`: none).
    pub fn set_call_context(&mut self, context: Option<Arc<dyn CallContext>>) {
        self.call_context = context;
    }

    /// The loaded program.
    pub fn program(&self) -> &Program<B> {
        &self.program
    }

    pub fn plan(&self) -> &Plan {
        self.program.plan()
    }

    /// Shapes of the entry parameters, in HLO parameter order.
    pub fn parameter_shapes(&self) -> &[Shape] {
        self.program.parameter_shapes()
    }

    /// Bind entry parameter `i` to `bytes` at `ptr` for the following runs
    /// (raw memory: served by copies in [`Mode::Graph`]).
    pub fn bind_parameter(&mut self, i: usize, ptr: DevicePtr, bytes: u64) -> Result<()> {
        self.bind_user_buffer(i, UserBuffer::raw(ptr, bytes))
    }

    /// Bind entry parameter `i` to an allocator buffer (remappable in
    /// [`Mode::Graph`] unless it is sub-allocated).
    pub fn bind_buffer(&mut self, i: usize, buf: &xla_vmm_device::vmm::Buffer<B>) -> Result<()> {
        self.bind_user_buffer(i, UserBuffer::from_vmm(buf))
    }

    /// Bind entry parameter `i` to `user` for the following runs.
    pub fn bind_user_buffer(&mut self, i: usize, user: UserBuffer<B>) -> Result<()> {
        let (ptr, bytes) = (user.ptr, user.bytes);
        let all = self.program.parameter_slots();
        let slots = all
            .get(i)
            .ok_or_else(|| RuntimeError::arg(format!("parameter {i} of {}", all.len())))?;
        for &s in slots {
            let need = self.program.plan().allocations[s].size;
            if bytes < need {
                return Err(RuntimeError::arg(format!(
                    "parameter {i}: {bytes} bytes given, allocation {s} needs {need}"
                )));
            }
            self.slots.bind(s, ptr, need)?;
        }
        self.users[i] = Some(user);
        Ok(())
    }

    /// Set how [`Mode::Graph`] binds (threshold, costs). Only before its
    /// first VA-stable run: the decision is frozen there.
    pub fn set_binding_config(&mut self, cfg: BindingConfig) -> Result<()> {
        if self.va.is_some() {
            return Err(RuntimeError::arg(
                "the binding configuration is frozen after the first VA-stable run",
            ));
        }
        check_binding(&cfg)?;
        self.config.binding = cfg;
        Ok(())
    }

    /// How [`Executable::step`] runs.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// Its line of the report ([`crate::report`]) as it stands.
    pub fn report_line(&self) -> crate::report::ProgramReport {
        self.report.get(Clone::clone)
    }

    /// What the never-slower guard decided (`None` before its decision, or
    /// when it does not run: another mode, the guard off, a program that
    /// cannot be captured).
    pub fn guard_report(&self) -> Option<&GuardReport> {
        self.guard.as_ref().and_then(|g| g.report())
    }

    /// The runner the next [`Executable::step`] uses, as users name it
    /// (`va-stable graph`, `graph-recapture`, `eager`; during the guard's
    /// trial, `guard trial`).
    pub fn runner_name(&self) -> &'static str {
        let mode = match (self.config.mode, self.blocker()) {
            (Mode::Graph | Mode::GraphRecapture, Some(_)) => Mode::Eager,
            (m, _) => m,
        };
        match (mode, &self.guard) {
            (Mode::Graph, Some(g)) => g.report().map_or("guard trial", |r| r.runner.name()),
            (Mode::Graph, None) => "va-stable graph",
            (Mode::GraphRecapture, _) => "graph-recapture",
            (Mode::Eager, _) => "eager",
        }
    }

    /// Run the collectives of this executable as device `env.device_id` of
    /// `env.assignment`, with the communicators of `env.cliques`. Only before
    /// the first run. Without it, the executable runs as the only device
    /// (assignment `[0]`), where every collective is a local copy.
    pub fn set_collectives(&mut self, env: CollectiveEnv<B>) -> Result<()> {
        if !self.resolved.is_empty() {
            return Err(RuntimeError::arg(
                "collectives are fixed at the first run; set them before",
            ));
        }
        let (r, p) = env.assignment.logical(env.device_id).ok_or_else(|| {
            RuntimeError::arg(format!(
                "device {} is not in the device assignment {:?}",
                env.device_id, env.assignment.ids
            ))
        })?;
        crate::collective::participants(
            &env.assignment,
            env.device_id,
            xla_vmm::GroupMode::CrossReplica,
            &[],
        )?;
        self.logical = (r as u32, p as u32);
        self.coll_env = Some(env);
        Ok(())
    }

    /// Make the communicators (first run; blocks until the peers of every
    /// clique join, so each device runs from its own thread).
    fn resolve_collectives(&mut self) -> Result<()> {
        if self.program.collectives().is_empty() || !self.resolved.is_empty() {
            return Ok(());
        }
        let env = match self.coll_env.take() {
            Some(e) => e,
            None => CollectiveEnv {
                assignment: crate::collective::DeviceAssignment::single(0),
                device_id: 0,
                cliques: crate::collective::Cliques::new(crate::collective::LocalExchange::new()),
            },
        };
        let r =
            crate::collective::resolve(self.program.backend(), &env, self.program.collectives());
        self.coll_env = Some(env);
        self.resolved = r?;
        Ok(())
    }

    /// Binding counters of [`Mode::Graph`] (`None` before its first run).
    pub fn stats(&self) -> Option<&BindingStats> {
        self.va.as_ref().map(|v| v.stats())
    }

    /// The VA-stable runner: initialized at its first step (a failure there
    /// releases it; the next run starts again), then one execute per step.
    fn run_va_stable(&mut self, stream: &B::Stream) -> Result<()> {
        let program = &self.program;
        if self.va.is_none() {
            let mut va = VaStable::new(program, &self.config.binding)?;
            let env = program.env(
                &self.resolved,
                self.logical,
                self.call_context.as_deref(),
                true,
            );
            if let Err(e) = va.initialize(program, &env, &self.users, stream) {
                let be = program.backend();
                Teardown::new("a VA-stable runner that failed to initialize")
                    .check("stream_synchronize", be.stream_synchronize(stream));
                va.teardown(be);
                return Err(e);
            }
            // Made after the guard's decision (graph-recapture gave way):
            // its stats carry it.
            if let Some(r) = self.guard.as_ref().and_then(|g| g.report()) {
                va.note_guard(r.clone());
            }
            self.va = Some(va);
        }
        let Some(va) = self.va.as_mut() else {
            return Err(RuntimeError::invalid("no VA-stable runner"));
        };
        va.run(program, &self.users, stream)
    }

    /// Run one step on `stream` as the configuration says: its mode, and in
    /// [`Mode::Graph`] with the guard on, the runner the never-slower guard
    /// picks (see [`crate::guard`]). Asynchronous, as [`Executable::run`].
    pub fn step(&mut self, stream: &B::Stream) -> Result<Vec<Output>> {
        let guarded =
            self.config.mode == Mode::Graph && self.config.guard && self.blocker().is_none();
        if !guarded {
            return self.run(stream, self.config.mode);
        }
        // Whether part of its memory is in host memory orders the trial
        // (the VA-stable graph first then): known once its staging is
        // planned, before the trial's first step (`run` plans it again
        // where memory moved since).
        if !self.staging_planned {
            self.check_bound()?;
            self.plan_staging(stream)?;
        }
        let be = self.program.backend_arc();
        let guard = self.guard.get_or_insert_with(Guard::new);
        let runner = guard.begin_step(
            &*be,
            stream,
            self.recapture.captures(),
            self.program.in_host_memory(),
        )?;
        let out = self.run(stream, runner.mode());
        let name = &self.program.plan().module_name;
        let captures = self.recapture.captures();
        let decided = self
            .guard
            .as_mut()
            .and_then(|g| {
                g.end_step(&*be, name, captures)
                    .then(|| g.report().cloned())
            })
            .flatten();
        if let Some(r) = decided {
            if let Some(va) = self.va.as_mut() {
                va.note_guard(r.clone());
            }
            let (keep, name) = (r.runner, self.runner_name());
            self.report.update(|x| {
                x.guard = Some(r);
                x.runner = name;
            });
            self.release_unchosen(stream, keep);
        }
        out
    }

    /// Once the guard has chosen `keep`, the other runners' graphs, VA
    /// reservations and shadows go (after the stream: this step's work may
    /// use them). A failure to wait keeps them, said once.
    fn release_unchosen(&mut self, stream: &B::Stream, keep: Runner) {
        let be = self.program.backend_arc();
        if let Err(e) = be.stream_synchronize(stream) {
            tracing::warn!(error = %e, "the guard's unchosen runners are kept: the stream could not be waited for");
            return;
        }
        if keep != Runner::Recapture {
            self.recapture.release(&*be);
        }
        if keep != Runner::VaStable {
            if let Some(va) = self.va.take() {
                va.teardown(&*be);
            }
        }
    }

    /// Each parameter allocation with its bound buffer's location.
    fn parameter_homes(&self) -> Vec<(usize, Option<MemLocation>)> {
        self.program
            .parameter_slots()
            .iter()
            .zip(&self.users)
            .flat_map(|(slots, u)| {
                let at = u.as_ref().and_then(|u| u.location);
                slots.iter().map(move |&s| (s, at))
            })
            .collect()
    }

    /// Does [`Executable::placement`] have anything to say (before the
    /// first run only)?
    pub fn placement_pending(&self) -> bool {
        !self.staging_planned && !self.placed
    }

    /// Before the first run, where the caller should move its parameters'
    /// memory so that the program's plan is the best the device budget
    /// allows ([`xla_vmm_policy::rebalance`]): `params[i]` is parameter
    /// `i`'s location (`None`: unknown, raw memory) and whether the caller
    /// can move it between device and host memory under its address (a
    /// whole allocation of its own, nothing else holding its memory).
    /// The program's own buffers that leave the device move here, first (a
    /// constant's bytes copied on `stream`), so that the device memory they
    /// free is there for the parameters the plan brings to the device.
    /// Returns (parameter, location) moves, those leaving the device first;
    /// the caller makes them in that order, and one that fails leaves its
    /// parameter where it is. Empty after the first call, when nothing is
    /// in host memory, when no move pays, or with the `rebalance` option
    /// off.
    ///
    /// With [`crate::RunConfig::one_stream`], a program that is the
    /// device's heaviest so far first calls `reclaim` (its stream waited
    /// for: no work of any program in flight): the caller makes the
    /// device's other programs give back what they hold between runs
    /// ([`Executable::yield_device_memory`]) and says what that freed
    /// ([`Reclaimed`]: the bytes, and which parameters may move now that
    /// those programs' mappings no longer hold them); the plan is then made
    /// with that room. (A JAX model's initialisation programs held a quarter
    /// of a training step's device limit in their outputs, temporaries and
    /// VA-stable shadows.)
    pub fn placement(
        &mut self,
        params: &[(Option<MemLocation>, bool)],
        stream: &B::Stream,
        reclaim: &mut dyn FnMut() -> Reclaimed,
    ) -> Vec<(usize, MemLocation)> {
        if !self.placement_pending() {
            return Vec::new();
        }
        self.placed = true;
        if !self.config.rebalance {
            return Vec::new();
        }
        let slots = self.program.parameter_slots().to_vec();
        let homes: Vec<_> = slots
            .iter()
            .zip(params)
            .flat_map(|(s, &(at, _))| s.iter().map(move |&a| (a, at)))
            .collect();
        // A parameter moves whole: one allocation.
        let single = |s: &Vec<usize>| (s.len() == 1).then(|| s[0]);
        let movable_of = |may: &mut dyn Iterator<Item = bool>| -> Vec<usize> {
            slots
                .iter()
                .zip(may)
                .filter(|(_, m)| *m)
                .filter_map(|(s, _)| single(s))
                .collect()
        };
        let movable = movable_of(&mut params.iter().map(|p| p.1));
        let be = self.program.backend_arc();
        let mut reclaim_idle = || match be.stream_synchronize(stream) {
            Ok(()) => {
                let r = reclaim();
                let now = r.movable.map(|m| movable_of(&mut m.into_iter()));
                (r.bytes, now)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the stream could not be waited for: idle programs keep their memory");
                (0, None)
            }
        };
        let moves = self.program.plan_moves(
            &homes,
            &movable,
            self.config.one_stream,
            self.config.binding.immutable_buffers,
            &mut reclaim_idle,
        );
        self.program.move_own(stream);
        moves
            .into_iter()
            .filter_map(|(a, to)| Some((slots.iter().position(|s| single(s) == Some(a))?, to)))
            .collect()
    }

    /// Between its runs, give back the device memory it holds that it can
    /// rebuild: its VA-stable runner (graphs, reservations, shadows and the
    /// mappings that keep its last arguments' memory alive), graph-recapture's
    /// graphs, and its own buffers that hold nothing between runs (moved to
    /// host memory under their addresses, not copied).
    /// Its next run plans its staging again and captures anew; results are
    /// unchanged. The caller makes sure none of its work is in flight (the
    /// stream it runs on waited for) and that the outputs of its last run
    /// were read. Returns the device bytes freed (own buffers and shadows).
    pub fn yield_device_memory(&mut self) -> u64 {
        let be = self.program.backend_arc();
        for s in self.program.aux_and_comm_streams() {
            if let Err(e) = be.stream_synchronize(s) {
                tracing::warn!(error = %e, "a program's side stream could not be waited for: it keeps its memory");
                return 0;
            }
        }
        self.recapture.release(&*be);
        let shadows = self.va.as_ref().map_or(0, |v| v.stats().shadow_bytes);
        if let Some(va) = self.va.take() {
            va.teardown(&*be);
        }
        // The last run's arguments stay bound by address; their memory is
        // no longer held here (the next run binds them again).
        for u in self.users.iter_mut().flatten() {
            u.remap = None;
        }
        let own = self.program.yield_own_memory();
        if own > 0 {
            self.staging_planned = false;
        }
        let memory = self.program.own_memory();
        self.report.update(|r| r.memory = Some(memory));
        own + shadows
    }

    /// Plan the staging at the first run for the memory bound then (the
    /// program's own buffers moved by [`Executable::placement`] already),
    /// and again when another program has moved memory since and
    /// this one's parameters are elsewhere now: after the steps in flight
    /// (they use the old staging), without the graphs that captured it.
    fn plan_staging(&mut self, stream: &B::Stream) -> Result<()> {
        let budget = self.program.backend().budget();
        if self.staging_planned && budget.relocations() == self.staging_epoch {
            return Ok(());
        }
        let params = self.parameter_homes();
        if self.staging_planned && params == self.staging_params {
            self.staging_epoch = budget.relocations();
            return Ok(());
        }
        if self.staging_planned {
            let be = self.program.backend_arc();
            be.stream_synchronize(stream)?;
            self.recapture.release(&*be);
            if let Some(va) = self.va.take() {
                va.teardown(&*be);
            }
            tracing::info!(executable = %self.program.plan().module_name,
                "memory it planned for moved: its staging planned again");
        }
        self.staging_planned = true;
        self.program.plan_staging(
            &params,
            self.config.one_stream,
            self.config.binding.immutable_buffers,
        );
        self.staging_params = params;
        self.staging_epoch = self.program.backend().budget().relocations();
        let staging = self.program.staging_summary();
        let note = self.program.staging_note().map(str::to_string);
        let memory = self.program.own_memory();
        self.report.update(|r| {
            r.staging = staging;
            r.staging_note = note;
            r.memory = Some(memory);
        });
        Ok(())
    }

    /// Run once on `stream` in `mode`, whatever the configuration says (no
    /// guard: diagnostics and side-by-side runs of the modes), asynchronously:
    /// synchronize the stream before reading outputs on the host. Every
    /// parameter must be bound.
    pub fn run(&mut self, stream: &B::Stream, mode: Mode) -> Result<Vec<Output>> {
        self.check_bound()?;
        self.resolve_collectives()?;
        self.plan_staging(stream)?;
        if mode != Mode::Graph {
            if let Some(va) = self.va.as_mut() {
                // The run may write donated buffers the shadows claim to hold.
                va.forget_shadow_contents();
            }
        }
        let mode = if mode != Mode::Eager && self.blocker().is_some() {
            if !self.warned_eager {
                self.warned_eager = true;
                tracing::warn!(executable = %self.program.plan().module_name,
                    reason = self.blocker().unwrap_or_default(),
                    "cannot be captured into a graph; it runs eager (thunk by thunk)");
            }
            Mode::Eager
        } else {
            mode
        };
        self.program
            .staging_begin(&self.users, &self.slots, stream, mode != Mode::Eager)?;
        let mut span = trace::span("step").detail(|| self.program.plan().module_name.clone());
        if span.recording() {
            let runner = match mode {
                Mode::Eager => "eager",
                Mode::GraphRecapture => "graph-recapture",
                Mode::Graph => "va-stable graph",
            };
            span.stat("runs as", StatValue::Str(runner.into()));
            span.stat("step", StatValue::U64(self.report.get(|r| r.steps)));
        }
        let ran = match mode {
            Mode::Eager => {
                let env = self.program.env(
                    &self.resolved,
                    self.logical,
                    self.call_context.as_deref(),
                    false,
                );
                run_program(&env, self.program.ops(), &self.slots, stream)
            }
            Mode::GraphRecapture => {
                let env = self.program.env(
                    &self.resolved,
                    self.logical,
                    self.call_context.as_deref(),
                    true,
                );
                self.recapture
                    .execute(&self.program, &env, &self.slots, stream)
            }
            Mode::Graph => self.run_va_stable(stream),
        };
        if let Err(e) = ran {
            drop(span);
            return self.graph_step_failed(stream, mode, e);
        }
        self.program.staging_end();
        drop(span);
        let stats_key = (mode == Mode::Graph && self.va.is_some())
            .then(|| self.va.as_ref().map(|v| v.stats().executable.as_str()))
            .flatten();
        // A staged program's step read back this run reaches the report.
        let staging = self.program.staging_reading();
        let captures = self.recapture.captures();
        self.report.update(|r| {
            r.steps += 1;
            r.graph_captures = captures;
            if r.binding_stats.is_none() {
                r.binding_stats = stats_key.map(str::to_string);
            }
            if staging.is_some() {
                r.staging = staging;
            }
        });
        self.outputs()
    }

    /// Every parameter bound?
    fn check_bound(&self) -> Result<()> {
        for (i, slots) in self.program.parameter_slots().iter().enumerate() {
            for &s in slots {
                if self.slots.base(s)? == DevicePtr::NULL
                    && self.program.plan().allocations[s].size > 0
                {
                    return Err(RuntimeError::arg(format!("parameter {i} is not bound")));
                }
            }
        }
        Ok(())
    }

    /// Why it does not run as a graph: its program's capture blocker, or
    /// its graph step that failed.
    fn blocker(&self) -> Option<&str> {
        self.program
            .capture_blocker()
            .or(self.graph_failed.as_deref())
    }

    /// A step in graph `mode` failed with `e`. A program whose library calls
    /// a capture takes (FFTs, triangular solves: captured beyond what XLA
    /// captures) runs the step again eager, nothing of the graph step having
    /// run (a failed capture leaves no graph), and where that runs, it runs
    /// eager from then on and says why. Any other failure is the step's.
    fn graph_step_failed(
        &mut self,
        stream: &B::Stream,
        mode: Mode,
        e: RuntimeError,
    ) -> Result<Vec<Output>> {
        let retry = mode != Mode::Eager
            && self.graph_failed.is_none()
            && self.program.captures_library_calls()
            && !self.program.in_host_memory();
        if !retry {
            return Err(e);
        }
        let out = self.run(stream, Mode::Eager)?;
        let why = format!("its graph step failed ({e}); it runs eager");
        self.warned_eager = true;
        tracing::warn!(executable = %self.program.plan().module_name, reason = %why,
            "a graph step failed; it runs eager (thunk by thunk)");
        self.report.update(|r| {
            r.reason = Some(why.clone());
            r.runner = "eager";
        });
        self.graph_failed = Some(why);
        self.release_unchosen(stream, Runner::Eager);
        Ok(out)
    }

    /// The result leaves (`output_info_map`), in result order.
    pub fn outputs(&self) -> Result<Vec<Output>> {
        let plan = self.program.plan();
        let result = &plan.program_shape.result;
        let mut infos: Vec<_> = plan.outputs.iter().collect();
        infos.sort_by(|a, b| a.shape_index.cmp(&b.shape_index));
        let mut out = Vec::with_capacity(infos.len());
        let mut index = 0;
        for info in infos {
            let shape = leaf_shape(result, &info.shape_index).ok_or_else(|| {
                RuntimeError::invalid(format!("output shape index {:?}", info.shape_index))
            })?;
            if shape.is_tuple() {
                // The tuple itself (its index table), not a result leaf.
                continue;
            }
            let bytes = shape.byte_size().unwrap_or(0);
            let parameter = match plan.allocations.get(info.allocation).map(|a| &a.role) {
                Some(AllocationRole::Parameter { number, .. }) => Some(*number as usize),
                _ => None,
            };
            out.push(Output {
                index,
                ptr: self.slots.base(info.allocation)?,
                bytes,
                shape,
                parameter,
            });
            index += 1;
        }
        Ok(out)
    }
}

impl<B: Backend> Drop for Executable<B> {
    /// The runners' state goes first (the VA-stable reservations map the
    /// program's buffers), then the program itself (its `Drop`).
    fn drop(&mut self) {
        let be = self.program.backend();
        self.recapture.release(be);
        if let Some(g) = self.guard.as_mut() {
            g.release(be);
        }
        let mut t = Teardown::new("executable");
        for s in self.program.aux_and_comm_streams() {
            t.check("stream_synchronize", be.stream_synchronize(s));
        }
        if let Some(va) = self.va.take() {
            va.teardown(be);
        }
        self.resolved.clear();
    }
}

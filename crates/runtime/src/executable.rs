//! The execution API: load a [`Plan`], bind parameters, run eagerly or as
//! one captured graph, get the outputs.
//!
//! Memory: temps, constants and live-out outputs that are not parameters are
//! owned by the executable (one device buffer per allocation). Parameters are
//! the caller's buffers, bound per run. A parameter aliased with an output
//! (donation) is updated in place: the output *is* the parameter buffer.
//! Outputs are returned as addresses valid until the next run.

use std::collections::HashMap;
use std::sync::Arc;

use xla_vmm::{AllocationRole, Plan, Shape};
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::{Backend, DevicePtr};

use crate::binding::{BindingConfig, BindingStats, UserBuffer};
use crate::collective::{CollOp, CollectiveEnv, Resolved};
use crate::error::{Result, RuntimeError};
use crate::exec::{run_seq, ExecEnv};
use crate::ops::{LoadCtx, Op};
use crate::slots::{DeviceBuffer, SlotTable};
use crate::vastable::VaStable;
use xla_vmm_policy::Threshold;

/// How [`Executable::run`] executes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Thunk by thunk on the stream: the reference.
    Eager,
    /// The user's `graph` (the default): VA-stable graph mode (see
    /// [`crate::vastable`]): one graph per fixed VA reservation (two, used
    /// alternately), recorded once and never re-captured; parameters bound
    /// per step by skip / remap / copy.
    Graph,
    /// The user's `graph-recapture`: the whole executable captured into a
    /// graph, replayed each run, re-captured when parameter addresses change.
    GraphRecapture,
}

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

struct GraphCache<B: Backend> {
    bases: Vec<DevicePtr>,
    graph: B::Graph,
    exec: B::GraphExec,
}

/// A loaded executable.
pub struct Executable<B: Backend> {
    backend: Arc<B>,
    plan: Plan,
    gemm: Option<Arc<dyn GemmEngine<B>>>,
    ops: Vec<Op<B>>,
    modules: Vec<B::Module>,
    owned: Vec<DeviceBuffer<B>>,
    /// Allocation index of each `owned` buffer.
    owned_index: Vec<usize>,
    slots: SlotTable,
    /// The caller's buffer of each entry parameter (VA-stable binding).
    users: Vec<Option<UserBuffer<B>>>,
    binding: BindingConfig,
    va: Option<VaStable<B>>,
    /// Entry parameter number → its allocation slots.
    param_slots: Vec<Vec<usize>>,
    param_shapes: Vec<Shape>,
    aux_streams: Vec<B::Stream>,
    events: HashMap<u64, (B::Event, B::Event)>,
    graph: Option<GraphCache<B>>,
    /// Why this executable cannot be captured (graph modes then run eager).
    capture_blocker: Option<String>,
    warned_eager: bool,
    /// Collectives: communication streams, loaded ops, the environment
    /// (see [`Executable::set_collectives`]) and, after the first run,
    /// each op's communicator.
    comm_streams: Vec<B::Stream>,
    collectives: Vec<CollOp>,
    coll_env: Option<CollectiveEnv<B>>,
    resolved: Vec<Resolved<B>>,
    logical: (u32, u32),
}

fn leaf_shape(result: &Shape, index: &[i64]) -> Option<Shape> {
    let mut s = result;
    for &i in index {
        s = s.tuple_shapes.get(usize::try_from(i).ok()?)?;
    }
    Some(s.clone())
}

impl<B: Backend> Executable<B> {
    /// Load `plan`: check every thunk, load kernels, prepare GEMMs, upload
    /// constants, allocate temps and outputs. `stream` orders the uploads.
    pub fn load(
        backend: Arc<B>,
        plan: Plan,
        gemm: Option<Arc<dyn GemmEngine<B>>>,
        stream: &B::Stream,
    ) -> Result<Self> {
        // Support check first (cheap, names the first offender).
        crate::ops::check_support(&plan)?;
        let nparams = plan.program_shape.parameters.len();
        let mut param_slots = vec![Vec::new(); nparams];
        for a in &plan.allocations {
            if let AllocationRole::Parameter {
                number,
                shape_index,
                ..
            } = &a.role
            {
                if !shape_index.is_empty() {
                    return Err(RuntimeError::unsupported(format!(
                        "tuple-shaped parameter {number} (allocation {})",
                        a.index
                    )));
                }
                param_slots
                    .get_mut(*number as usize)
                    .ok_or_else(|| {
                        RuntimeError::invalid(format!("parameter {number} of {nparams}"))
                    })?
                    .push(a.index);
            }
        }
        let mut ctx = LoadCtx {
            backend: &*backend,
            gemm: gemm.as_deref(),
            modules: Vec::new(),
            module_index: HashMap::new(),
            main_module: None,
            streams_needed: 0,
            async_ids: Vec::new(),
            comm_streams_needed: 0,
            collectives: Vec::new(),
            comm_tag: 0,
        };
        let built = ctx.build_seq(&plan, &plan.thunks);
        let (modules, streams_needed, async_ids) = (ctx.modules, ctx.streams_needed, ctx.async_ids);
        let (comm_streams_needed, collectives) = (ctx.comm_streams_needed, ctx.collectives);
        let ops = match built {
            Ok(ops) => ops,
            Err(e) => {
                for m in modules {
                    backend.module_unload(m).ok();
                }
                return Err(e);
            }
        };
        let mut exe = Executable {
            backend: backend.clone(),
            param_shapes: plan.program_shape.parameters.clone(),
            slots: SlotTable::new(plan.allocations.len()),
            plan,
            gemm,
            ops,
            modules,
            owned: Vec::new(),
            owned_index: Vec::new(),
            users: (0..nparams).map(|_| None).collect(),
            binding: BindingConfig::with_threshold(Threshold::Auto),
            va: None,
            param_slots,
            aux_streams: Vec::new(),
            events: HashMap::new(),
            graph: None,
            capture_blocker: None,
            warned_eager: false,
            comm_streams: Vec::new(),
            collectives,
            coll_env: None,
            resolved: Vec::new(),
            logical: (0, 0),
        };
        exe.capture_blocker =
            crate::exec::capture_blocker(&exe.ops, backend.info().conditional_nodes);
        // From here on `Drop` releases whatever was made.
        for _ in 0..streams_needed {
            exe.aux_streams.push(backend.stream_create()?);
        }
        for _ in 0..comm_streams_needed {
            exe.comm_streams.push(backend.stream_create()?);
        }
        for id in async_ids {
            let start = backend.event_create()?;
            let done = backend.event_create()?;
            exe.events.insert(id, (start, done));
        }
        for i in 0..exe.plan.allocations.len() {
            let a = &exe.plan.allocations[i];
            let (index, size) = (a.index, a.size);
            let constant = match &a.role {
                AllocationRole::Parameter { .. } => continue,
                AllocationRole::Constant { .. } => {
                    Some(crate::ops::constant_bytes(&exe.plan, index)?)
                }
                AllocationRole::Output { .. } | AllocationRole::Temp => None,
            };
            if size == 0 {
                continue;
            }
            let buf = DeviceBuffer::alloc(&*backend, size)?;
            exe.slots.bind(index, buf.ptr(), size)?;
            if let Some(bytes) = constant {
                backend.write_sync(buf.ptr(), &bytes, stream)?;
            }
            exe.owned.push(buf);
            exe.owned_index.push(index);
        }
        tracing::info!(
            ops = exe.ops.len(),
            modules = exe.modules.len(),
            owned_buffers = exe.owned.len(),
            aux_streams = exe.aux_streams.len(),
            "executable loaded"
        );
        Ok(exe)
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Shapes of the entry parameters, in HLO parameter order.
    pub fn parameter_shapes(&self) -> &[Shape] {
        &self.param_shapes
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
        let slots = self
            .param_slots
            .get(i)
            .ok_or_else(|| {
                RuntimeError::arg(format!("parameter {i} of {}", self.param_slots.len()))
            })?
            .clone();
        for s in slots {
            let need = self.plan.allocations[s].size;
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
        self.binding = cfg;
        Ok(())
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
        if self.collectives.is_empty() || !self.resolved.is_empty() {
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
        let r = crate::collective::resolve(&*self.backend, &env, &self.collectives);
        self.coll_env = Some(env);
        self.resolved = r?;
        Ok(())
    }

    /// Binding counters of [`Mode::Graph`] (`None` before its first run).
    pub fn stats(&self) -> Option<&BindingStats> {
        self.va.as_ref().map(|v| v.stats())
    }

    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    pub(crate) fn ops(&self) -> &[Op<B>] {
        &self.ops
    }

    /// (allocation index, buffer) of every buffer the executable owns.
    pub(crate) fn owned_buffers(&self) -> impl Iterator<Item = (usize, &DeviceBuffer<B>)> {
        self.owned_index.iter().copied().zip(self.owned.iter())
    }

    fn run_va_stable(&mut self, stream: &B::Stream) -> Result<()> {
        let mut va = match self.va.take() {
            Some(v) => v,
            None => VaStable::new(self, &self.binding)?,
        };
        let r = va.run(self, &self.users, stream);
        self.va = Some(va);
        r
    }

    /// Run once on `stream` (asynchronously: synchronize the stream before
    /// reading outputs on the host). Every parameter must be bound.
    pub fn run(&mut self, stream: &B::Stream, mode: Mode) -> Result<Vec<Output>> {
        for (i, slots) in self.param_slots.iter().enumerate() {
            for &s in slots {
                if self.slots.base(s)? == DevicePtr::NULL && self.plan.allocations[s].size > 0 {
                    return Err(RuntimeError::arg(format!("parameter {i} is not bound")));
                }
            }
        }
        self.resolve_collectives()?;
        if mode != Mode::Graph {
            if let Some(va) = self.va.as_mut() {
                // The run may write donated buffers the shadows claim to hold.
                va.forget_shadow_contents();
            }
        }
        let mode = match (mode, &self.capture_blocker) {
            (Mode::GraphRecapture | Mode::Graph, Some(why)) => {
                if !self.warned_eager {
                    self.warned_eager = true;
                    tracing::warn!(executable = %self.plan.module_name, reason = %why,
                        "cannot be captured into a graph; it runs eager (thunk by thunk)");
                }
                Mode::Eager
            }
            (m, _) => m,
        };
        match mode {
            Mode::Eager => {
                let env = self.env(false);
                run_seq(&env, &self.ops, &self.slots, stream, &mut Vec::new())?;
            }
            Mode::GraphRecapture => self.run_graph(stream)?,
            Mode::Graph => self.run_va_stable(stream)?,
        }
        self.outputs()
    }

    pub(crate) fn env(&self, capturing: bool) -> ExecEnv<'_, B> {
        ExecEnv {
            backend: &*self.backend,
            gemm: self.gemm.as_deref(),
            aux_streams: &self.aux_streams,
            comm_streams: &self.comm_streams,
            collectives: &self.resolved,
            logical: self.logical,
            events: &self.events,
            capturing,
        }
    }

    fn run_graph(&mut self, stream: &B::Stream) -> Result<()> {
        let fresh = match &self.graph {
            Some(g) => g.bases != self.slots.bases(),
            None => true,
        };
        if fresh {
            let be = &*self.backend;
            // No vendor work while the stream captures (capture_gate).
            let gate = xla_vmm_device::capture_gate::capture();
            be.stream_begin_capture(stream)?;
            let walked = {
                let env = self.env(true);
                run_seq(&env, &self.ops, &self.slots, stream, &mut Vec::new())
            };
            let captured = be.stream_end_capture(stream);
            drop(gate);
            walked?;
            let graph = captured?;
            let exec = match self.graph.take() {
                Some(old) if be.graph_exec_update(&old.exec, &graph)? => {
                    be.graph_destroy(old.graph)?;
                    old.exec
                }
                Some(old) => {
                    be.graph_exec_destroy(old.exec)?;
                    be.graph_destroy(old.graph)?;
                    be.graph_instantiate(&graph)?
                }
                None => be.graph_instantiate(&graph)?,
            };
            self.graph = Some(GraphCache {
                bases: self.slots.bases().to_vec(),
                graph,
                exec,
            });
        }
        let g = self
            .graph
            .as_ref()
            .ok_or_else(|| RuntimeError::invalid("no graph"))?;
        self.backend.graph_launch(&g.exec, stream)?;
        Ok(())
    }

    /// The result leaves (`output_info_map`), in result order.
    pub fn outputs(&self) -> Result<Vec<Output>> {
        let result = &self.plan.program_shape.result;
        let mut infos: Vec<_> = self.plan.outputs.iter().collect();
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
            let parameter = match &self.plan.allocations.get(info.allocation).map(|a| &a.role) {
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
    fn drop(&mut self) {
        let be = &*self.backend;
        if let Some(g) = self.graph.take() {
            be.graph_exec_destroy(g.exec).ok();
            be.graph_destroy(g.graph).ok();
        }
        for s in self.aux_streams.iter().chain(&self.comm_streams) {
            be.stream_synchronize(s).ok();
        }
        if let Some(va) = self.va.take() {
            // Its reservations map the owned buffers: unmapped first.
            va.teardown(be);
        }
        for buf in self.owned.drain(..) {
            if let Err(e) = buf.free(be) {
                tracing::warn!(%e, "freeing an executable buffer failed");
            }
        }
        for (_, (a, b)) in self.events.drain() {
            be.event_destroy(a).ok();
            be.event_destroy(b).ok();
        }
        for s in self
            .aux_streams
            .drain(..)
            .chain(self.comm_streams.drain(..))
        {
            be.stream_destroy(s).ok();
        }
        self.resolved.clear();
        // Functions hold their modules on some backends; unload after ops.
        self.ops.clear();
        for m in self.modules.drain(..) {
            be.module_unload(m).ok();
        }
    }
}

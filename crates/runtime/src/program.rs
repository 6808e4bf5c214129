//! The loaded program: everything [`Program::load`] builds from a [`Plan`]
//! (checked thunks as ops, kernel modules, GEMM plans, the buffers the
//! executable owns, its extra streams and events, its collective ops).
//! Immutable once loaded, whatever mode runs it: the runners (eager,
//! graph-recapture, VA-stable: [`crate::executable`], `recapture.rs`,
//! [`crate::vastable`]) read it and keep their own per-step state.
//! Dropping it waits for its streams and releases everything it made.
//!
//! Memory: temps, constants and live-out outputs that are not parameters are
//! owned here (one device buffer per allocation). Parameters are the
//! caller's buffers, bound per run by the executable.

use std::collections::HashMap;
use std::sync::Arc;

use xla_vmm::{AllocationRole, Plan, Shape};
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_device::vmm::VmmContext;
use xla_vmm_device::{Backend, DevicePtr, MemLocation};

use crate::collective::{CollOp, Resolved};
use crate::custom_call::{CallContext, CustomCallRegistry};
use crate::error::{Result, RuntimeError, Teardown};
use crate::exec::ExecEnv;
use crate::ops::{LoadCtx, Op};
use crate::slots::{DeviceBuffer, SlotTable};
use crate::staging::{Planned, Staging};
use xla_vmm_policy::residency::Home;

/// Its own allocations of at most this many bytes share one buffer.
pub const PACKED_MAX: u64 = 64 << 10;

/// Their offsets in it are aligned to this (every kernel's operand
/// alignment, as the staging area's).
pub const PACKED_ALIGN: u64 = 512;

/// One buffer of a program's own memory: its bytes, and the (allocation,
/// offset, size) of each allocation it holds; `temps`: its temporaries,
/// on memory the device's programs share (`crate::temps`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnBuffer {
    pub bytes: u64,
    pub parts: Vec<(usize, u64, u64)>,
    pub temps: bool,
}

/// How a program's own allocations (every one but the parameters) are laid
/// out in buffers, in the order they are allocated: first one buffer for
/// all the allocations of at most [`PACKED_MAX`] bytes, at [`PACKED_ALIGN`]ed
/// offsets (a granule each would hold 2 MiB for a few bytes:
/// llama_scan_bf16's 111 small allocations, 20 MiB in all, took 244 MiB),
/// then a buffer for each larger one: under a device budget, the large
/// allocations are those past it, and those that can move. With
/// `share_temps` (the device's programs run one step at a time), every
/// temporary goes in one buffer first, at aligned offsets, on memory the
/// device's programs share.
pub fn own_layout(plan: &Plan, share_temps: bool) -> Vec<OwnBuffer> {
    let own = plan
        .allocations
        .iter()
        .filter(|a| a.size > 0 && !matches!(a.role, AllocationRole::Parameter { .. }));
    let pack = |temps: bool| OwnBuffer {
        bytes: 0,
        parts: Vec::new(),
        temps,
    };
    let add = |b: &mut OwnBuffer, index: usize, size: u64| {
        b.parts.push((index, b.bytes, size));
        b.bytes = (b.bytes + size).next_multiple_of(PACKED_ALIGN);
    };
    let (mut temps, mut packed) = (pack(true), pack(false));
    let mut out = Vec::new();
    for a in own {
        if share_temps && matches!(a.role, AllocationRole::Temp) {
            add(&mut temps, a.index, a.size);
        } else if a.size <= PACKED_MAX {
            add(&mut packed, a.index, a.size);
        } else {
            out.push(OwnBuffer {
                bytes: a.size,
                parts: vec![(a.index, 0, a.size)],
                temps: false,
            });
        }
    }
    let first = [temps, packed].into_iter().filter(|b| b.bytes > 0);
    first.chain(out).collect()
}

/// Where one of a program's own allocations lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owned {
    pub(crate) allocation: usize,
    /// Index into the program's own buffers.
    pub(crate) buffer: usize,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// A loaded program on one backend.
pub struct Program<B: Backend> {
    backend: Arc<B>,
    /// The owned buffers' RAII context (their deferred teardown errors).
    vmm: VmmContext<B>,
    plan: Plan,
    gemm: Option<Arc<dyn GemmEngine<B>>>,
    ops: Vec<Op<B>>,
    /// The GEMM and convolution plans its ops use, on `gemm`.
    plans: crate::ops::LibraryPlans,
    modules: Vec<B::Module>,
    /// Its own memory ([`own_layout`]): its temporaries (on shared memory),
    /// its small allocations ([`PACKED_MAX`]), each large one.
    owned: Vec<DeviceBuffer<B>>,
    /// Where each of its own allocations lives in `owned`.
    owned_at: Vec<Owned>,
    /// Moves of its own buffers planned before its first run
    /// ([`Program::plan_moves`]), made by [`Program::move_own`].
    own_moves: Vec<(usize, MemLocation)>,
    /// Entry parameter number → its allocation slots.
    param_slots: Vec<Vec<usize>>,
    aux_streams: Vec<B::Stream>,
    comm_streams: Vec<B::Stream>,
    events: HashMap<u64, (B::Event, B::Event)>,
    collectives: Vec<CollOp>,
    /// Why this program cannot be captured (graph modes then run eager).
    capture_blocker: Option<String>,
    /// Host-offloaded compute's pinned staging memory.
    host_staging: crate::host_execute::StagingPool<B>,
    /// Staging through device memory when part of the program's memory is
    /// in host memory (planned at the first run).
    staging: Option<Staging<B>>,
    /// Why part of its memory is in host memory and not staged (its kernels
    /// read it there in place).
    staging_note: Option<String>,
    /// Scratch memory its ops use at fixed offsets (FFT work areas).
    scratch: Option<DeviceBuffer<B>>,
}

impl<B: Backend> Program<B> {
    /// Load `plan`: check every thunk, load kernels, prepare GEMMs, bind
    /// custom calls to their handlers (from `custom_calls`), upload
    /// constants, allocate temps and outputs (the temps on memory the
    /// device's programs share with `share_temps`: their steps run one
    /// after the other). `stream` orders the uploads.
    pub fn load(
        backend: Arc<B>,
        plan: Plan,
        gemm: Option<Arc<dyn GemmEngine<B>>>,
        custom_calls: Option<&dyn CustomCallRegistry>,
        stream: &B::Stream,
        share_temps: bool,
    ) -> Result<Self> {
        // Support check first (cheap, names the first offender).
        crate::ops::check_support(&plan)?;
        let param_slots = parameter_slots(&plan)?;
        let mut ctx = LoadCtx {
            backend: &*backend,
            gemm: gemm.as_deref(),
            custom_calls,
            modules: Vec::new(),
            module_index: HashMap::new(),
            main_module: None,
            streams_needed: 0,
            async_ids: Vec::new(),
            comm_streams_needed: 0,
            collectives: Vec::new(),
            comm_tag: 0,
            scratch_bytes: 0,
            plans: Default::default(),
        };
        let built = ctx.build_seq(&plan, &plan.thunks);
        let (modules, streams_needed, async_ids) = (ctx.modules, ctx.streams_needed, ctx.async_ids);
        let (comm_streams_needed, collectives) = (ctx.comm_streams_needed, ctx.collectives);
        let (scratch_bytes, mut plans) = (ctx.scratch_bytes, ctx.plans);
        let ops = match built {
            Ok(ops) => ops,
            Err(e) => {
                plans.release(gemm.as_deref());
                let mut t = Teardown::new("a program that failed to load");
                for m in modules {
                    t.check("module_unload", backend.module_unload(m));
                }
                return Err(e);
            }
        };
        let capture_blocker = crate::exec::capture_blocker(&ops, backend.info(), gemm.as_deref());
        let mut p = Program {
            vmm: VmmContext::new(backend.clone()),
            backend: backend.clone(),
            plan,
            gemm,
            ops,
            plans,
            modules,
            owned: Vec::new(),
            owned_at: Vec::new(),
            own_moves: Vec::new(),
            param_slots,
            aux_streams: Vec::new(),
            comm_streams: Vec::new(),
            events: HashMap::new(),
            collectives,
            capture_blocker,
            host_staging: Default::default(),
            staging: None,
            staging_note: None,
            scratch: None,
        };
        if scratch_bytes > 0 {
            p.scratch = Some(DeviceBuffer::alloc_in(&p.vmm, scratch_bytes)?);
        }
        // From here on `Drop` releases whatever was made.
        for _ in 0..streams_needed {
            p.aux_streams.push(backend.stream_create()?);
        }
        for _ in 0..comm_streams_needed {
            p.comm_streams.push(backend.stream_create()?);
        }
        for id in async_ids {
            let start = backend.event_create()?;
            let done = backend.event_create()?;
            p.events.insert(id, (start, done));
        }
        p.allocate_own(stream, share_temps)?;
        // XLA's host memory space (host offload): the program's own
        // allocations there are device memory here (the copies to and from
        // them are the same bytes, so results do not change; the device
        // memory offloading would save is not saved). Host-space parameters
        // and results are the caller's pinned host memory.
        let host_space: u64 = p
            .plan
            .allocations
            .iter()
            .filter(|a| {
                a.color == xla_vmm::HOST_MEMORY_SPACE
                    && !matches!(a.role, AllocationRole::Parameter { .. })
            })
            .map(|a| a.size)
            .sum();
        if host_space > 0 {
            tracing::info!(
                bytes = host_space,
                "the program's host-memory-space allocations are placed in device memory"
            );
        }
        tracing::info!(
            ops = p.ops.len(),
            modules = p.modules.len(),
            owned_allocations = p.owned_at.len(),
            owned_buffers = p.owned.len(),
            aux_streams = p.aux_streams.len(),
            "executable loaded"
        );
        Ok(p)
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The backend, shared (to use it while the executable is borrowed).
    pub fn backend_arc(&self) -> Arc<B> {
        self.backend.clone()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Shapes of the entry parameters, in HLO parameter order.
    pub fn parameter_shapes(&self) -> &[Shape] {
        &self.plan.program_shape.parameters
    }

    /// The allocation slots of entry parameter `i`.
    pub(crate) fn parameter_slots(&self) -> &[Vec<usize>] {
        &self.param_slots
    }

    pub(crate) fn ops(&self) -> &[Op<B>] {
        &self.ops
    }

    pub(crate) fn collectives(&self) -> &[CollOp] {
        &self.collectives
    }

    pub(crate) fn aux_and_comm_streams(&self) -> impl Iterator<Item = &B::Stream> {
        self.aux_streams.iter().chain(&self.comm_streams)
    }

    /// Does a capture of it take library calls (FFTs, triangular solves)
    /// that XLA keeps out of its command buffers?
    pub fn captures_library_calls(&self) -> bool {
        self.capture_blocker.is_none() && crate::exec::has_library_calls(&self.ops)
    }

    /// Why the program cannot be captured into a graph, if it cannot.
    pub fn capture_blocker(&self) -> Option<&str> {
        self.capture_blocker.as_deref()
    }

    /// (allocation index, buffer) of every buffer the program owns.
    pub(crate) fn owned_buffers(&self) -> impl Iterator<Item = (usize, &DeviceBuffer<B>)> {
        self.owned_at
            .iter()
            .map(|o| (o.allocation, &self.owned[o.buffer]))
    }

    /// Its own memory by where it lives ([`crate::report::OwnMemory`]).
    pub(crate) fn own_memory(&self) -> crate::report::OwnMemory {
        let mut m = crate::report::OwnMemory::default();
        for b in self.owned.iter().chain(&self.scratch) {
            match (b.shared(), b.location()) {
                (true, _) => m.shared_bytes += b.mapped(),
                (false, MemLocation::Device) => m.device_bytes += b.mapped(),
                (false, _) => m.host_bytes += b.mapped(),
            }
        }
        m
    }

    /// Its own memory: the buffers, and where each of its own allocations
    /// lives in them.
    pub(crate) fn owned_storage(&self) -> (&[DeviceBuffer<B>], &[Owned]) {
        (&self.owned, &self.owned_at)
    }

    /// The buffer of own allocation `a` when it holds `a` alone (a large
    /// allocation: it can move).
    fn owned_alone(&self, a: usize) -> Option<usize> {
        let o = self.owned_at.iter().find(|o| o.allocation == a)?;
        let shared = self
            .owned_at
            .iter()
            .filter(|x| x.buffer == o.buffer)
            .count();
        (shared == 1 && !self.owned[o.buffer].shared()).then_some(o.buffer)
    }

    /// Allocate its own memory ([`own_layout`]; its temporaries on the
    /// device's shared memory with `share_temps`) and write its constants.
    fn allocate_own(&mut self, stream: &B::Stream, share_temps: bool) -> Result<()> {
        let gran = self.backend.info().vmm_granularity.max(1);
        for b in own_layout(&self.plan, share_temps) {
            let buffer = self.owned.len();
            let shared = b
                .temps
                .then(|| crate::temps::memory(&self.vmm, b.bytes.div_ceil(gran) * gran))
                .flatten();
            // Sharing saves memory; a failure to map the shared memory
            // leaves the program its own (said once), not unloaded.
            let mapped = shared.map(|m| DeviceBuffer::map_shared(&self.vmm, &m, b.bytes));
            self.owned.push(match mapped {
                Some(Ok(buf)) => buf,
                Some(Err(e)) => {
                    tracing::warn!(executable = %self.plan.module_name, error = %e,
                        "the device's shared temporaries could not be mapped; this program's are its own");
                    DeviceBuffer::alloc_in(&self.vmm, b.bytes)?
                }
                None => DeviceBuffer::alloc_in(&self.vmm, b.bytes)?,
            });
            self.owned_at
                .extend(b.parts.into_iter().map(|(allocation, offset, size)| Owned {
                    allocation,
                    buffer,
                    offset,
                    size,
                }));
        }
        for o in &self.owned_at {
            if let AllocationRole::Constant { .. } = self.plan.allocations[o.allocation].role {
                let bytes = crate::ops::constant_bytes(&self.plan, o.allocation)?;
                let at = self.owned[o.buffer].ptr().offset(o.offset);
                self.backend.write_sync(at, &bytes, stream)?;
            }
        }
        Ok(())
    }

    /// A slot table with the owned buffers bound (parameters unbound).
    pub(crate) fn owned_slots(&self) -> Result<SlotTable> {
        let mut t = SlotTable::new(self.plan.allocations.len());
        for o in &self.owned_at {
            let at = self.owned[o.buffer].ptr().offset(o.offset);
            t.bind(o.allocation, at, o.size)?;
        }
        Ok(t)
    }

    /// The environment the thunks run in, with the run's communicators.
    pub(crate) fn env<'a>(
        &'a self,
        collectives: &'a [Resolved<B>],
        logical: (u32, u32),
        call_context: Option<&'a dyn CallContext>,
        capturing: bool,
    ) -> ExecEnv<'a, B> {
        ExecEnv {
            backend: &*self.backend,
            vmm: &self.vmm,
            gemm: self.gemm.as_deref(),
            aux_streams: &self.aux_streams,
            comm_streams: &self.comm_streams,
            collectives,
            logical,
            events: &self.events,
            call_context,
            capturing,
            host_staging: &self.host_staging,
            scratch: self
                .scratch
                .as_ref()
                .map_or(DevicePtr::NULL, DeviceBuffer::ptr),
            staging: self
                .staging
                .as_ref()
                .map(|s| s as &dyn crate::exec::StagedRun<B>),
        }
    }

    /// Before its first run, where its memory should live
    /// ([`xla_vmm_policy::rebalance`]): planned with each parameter
    /// allocation's location as given (`params`, as for
    /// [`Program::plan_staging`]), the parameter allocations in `movable`
    /// free to move between device and host memory, its own large buffers
    /// free to leave the device; each layout judged by the staging it
    /// would run (`keep_parameters` as for [`Program::plan_staging`]).
    /// Its own buffers' moves are kept for [`Program::move_own`]; the
    /// parameter allocations' are returned. A failure is said and moves
    /// nothing. With a `shared` staging area: the area another program made
    /// is room it stages through (the area grows into the room its moves
    /// free), and it moves memory only when no program of the area was
    /// estimated longer (the heaviest program places the device's memory:
    /// the programs that initialise a model's weights stage first, and a
    /// training step that could not move them for its plan ran at a tenth
    /// of its link bound). The heaviest first calls `reclaim` (the device's
    /// idle programs give back what they hold: the bytes freed, and the
    /// parameter allocations movable now, `None` for as before), then plans.
    pub(crate) fn plan_moves(
        &mut self,
        params: &[(usize, Option<MemLocation>)],
        movable: &[usize],
        shared: bool,
        keep_parameters: bool,
        reclaim: &mut dyn FnMut() -> (u64, Option<Vec<usize>>),
    ) -> Vec<(usize, MemLocation)> {
        let owned = self.owned_buffers().map(|(a, b)| (a, b.location()));
        let homes =
            crate::staging::homes(self.plan.allocations.len(), owned, params.iter().copied());
        if !homes.contains(&Home::Host) {
            return Vec::new();
        }
        let gran = self.backend.info().vmm_granularity.max(1);
        let may_of = |this: &Self, movable: &[usize]| -> Vec<(usize, u64)> {
            let mut may: Vec<(usize, u64)> = movable
                .iter()
                .filter_map(|&a| {
                    Some((a, this.plan.allocations.get(a)?.size.div_ceil(gran) * gran))
                })
                .collect();
            // Its large allocations in device memory (the small ones share a
            // buffer), to host memory only: device memory one of them took
            // would be this program's alone, where the room a moved weight
            // leaves becomes the device's staging area, every program's.
            may.extend(this.owned_at.iter().filter_map(|o| {
                let b = this.owned_alone(o.allocation)?;
                let buf = &this.owned[b];
                (buf.location() == MemLocation::Device).then(|| (o.allocation, buf.mapped()))
            }));
            may
        };
        let mut may = may_of(self, movable);
        // The device's shared area, when another program made it, is room
        // it stages through (it grows into what the moves free).
        let rates = crate::staging::device_rates(&*self.backend);
        let room_now = |this: &Self| {
            let area = if shared {
                crate::staging::shared_area_bytes(&this.vmm)
            } else {
                0
            };
            crate::staging::room(&*this.backend) / gran * gran + area
        };
        let name = &self.plan.module_name;
        let said = |e: RuntimeError| {
            tracing::warn!(executable = %name, error = %e,
                "its memory could not be placed for its plan; it stays where it is");
        };
        if shared {
            let before = match crate::staging::estimate_at(
                &self.plan,
                &homes,
                room_now(self),
                rates,
                keep_parameters,
            ) {
                Ok(us) => us,
                Err(e) => {
                    said(e);
                    return Vec::new();
                }
            };
            if !crate::staging::heaviest_plan(&self.vmm, before) {
                tracing::info!(executable = %name, estimated_us = before,
                    "part of it is in host memory; a program planned longer placed the device's memory, nothing moves");
                return Vec::new();
            }
            // The heaviest program takes back the device memory the
            // device's idle programs hold between their runs (and the
            // parameters their mappings held may move then).
            let (reclaimed, now_movable) = reclaim();
            let freed = now_movable.filter(|m| m.as_slice() != movable);
            if let Some(m) = &freed {
                may = may_of(self, m);
            }
            if reclaimed > 0 || freed.is_some() {
                tracing::info!(executable = %name, bytes = reclaimed,
                    movable = freed.as_ref().map_or(movable.len(), Vec::len),
                    "the device's idle programs gave back what they held for its plan");
            }
        }
        let r = match crate::staging::plan_moves(
            &self.plan,
            &homes,
            room_now(self),
            rates,
            &may,
            keep_parameters,
        ) {
            Ok(Some(r)) => r,
            Ok(None) => return Vec::new(),
            Err(e) => {
                said(e);
                return Vec::new();
            }
        };
        tracing::info!(executable = %name, moves = r.moves.len(), to_host = r.freed_bytes,
            to_device = r.taken_bytes, estimated_us = r.before_us, after_us = r.after_us,
            "part of it is in host memory: its buffers placed for its plan");
        let at = |h: Home| match h {
            Home::Device => MemLocation::Device,
            _ => MemLocation::Host,
        };
        let (own, params): (Vec<_>, Vec<_>) = r
            .moves
            .iter()
            .map(|&(a, h)| (a, at(h)))
            .partition(|(a, _)| self.owned_at.iter().any(|o| o.allocation == *a));
        self.own_moves = own;
        params
    }

    /// The moves of its own buffers [`Program::plan_moves`] kept, made
    /// before its first step (a constant's bytes copied on `stream`; its
    /// temporaries and outputs hold nothing yet). A buffer that cannot move
    /// stays (said).
    pub(crate) fn move_own(&mut self, stream: &B::Stream) {
        for (a, to) in std::mem::take(&mut self.own_moves) {
            let Some(k) = self.owned_alone(a) else {
                continue;
            };
            let constant = matches!(
                self.plan.allocations[a].role,
                AllocationRole::Constant { .. }
            );
            if let Err(e) = self.owned[k].relocate(to, constant.then_some(stream)) {
                tracing::warn!(executable = %self.plan.module_name, allocation = a, to = ?to,
                    error = %e, "its buffer could not move; it stays");
            }
        }
    }

    /// Between its runs, its own device memory that holds nothing it needs
    /// moves to host memory, its bytes not copied: every buffer of its own
    /// except those holding a constant or mapped from the device's shared
    /// temporaries (its temporaries and outputs: the caller has read the
    /// outputs of its last run). Its addresses stay, so its graphs and ops
    /// stay valid. The caller makes sure none of its work is in flight.
    /// Returns the device bytes freed; a buffer that cannot move stays (said
    /// at debug level).
    pub(crate) fn yield_own_memory(&mut self) -> u64 {
        let mut freed = 0;
        for (k, buf) in self.owned.iter_mut().enumerate() {
            let constant = self.owned_at.iter().any(|o| {
                o.buffer == k
                    && matches!(
                        self.plan.allocations[o.allocation].role,
                        AllocationRole::Constant { .. }
                    )
            });
            if constant || buf.shared() || buf.location() != MemLocation::Device {
                continue;
            }
            match buf.relocate(MemLocation::Host, None) {
                Ok(_) => freed += buf.mapped(),
                Err(e) => tracing::debug!(executable = %self.plan.module_name, error = %e,
                    "its buffer could not leave the device; it stays"),
            }
        }
        freed
    }

    /// Plan the staging for the memory bound now: the program's own buffers
    /// where they are, each parameter allocation's location as given
    /// (`None`: raw device memory), through the device's shared area when
    /// `shared` ([`crate::RunConfig::one_stream`]), keeping
    /// read-only parameters in the area from step to step when
    /// `keep_parameters` (immutable buffers). A failure is
    /// said and leaves the program reading host memory in place (correct,
    /// slower).
    pub(crate) fn plan_staging(
        &mut self,
        params: &[(usize, Option<MemLocation>)],
        shared: bool,
        keep_parameters: bool,
    ) {
        let owned = self.owned_buffers().map(|(a, b)| (a, b.location()));
        let homes =
            crate::staging::homes(self.plan.allocations.len(), owned, params.iter().copied());
        let made = Staging::plan(
            &self.vmm,
            &self.plan,
            &self.ops,
            &homes,
            shared,
            keep_parameters,
        );
        let (new, note) = match made {
            Ok(Planned::Staged(s)) => (Some(*s), None),
            Ok(Planned::AllOnDevice) => (None, None),
            Ok(Planned::InPlace(why)) => (None, Some(why.to_string())),
            Err(e) => {
                tracing::warn!(executable = %self.plan.module_name, error = %e,
                    "part of it is in host memory but it cannot be staged; read in place");
                (None, Some(format!("it cannot be staged: {e}")))
            }
        };
        self.staging_note = note;
        let old = std::mem::replace(&mut self.staging, new);
        if let Some(old) = old {
            let mut t = Teardown::new("a program's previous staging");
            old.release(&self.backend, &mut t);
        }
    }

    /// Before a step's work on `stream` in any mode (`graph`: a graph
    /// mode): its staging's kept
    /// buffers copied in where the area does not hold them
    /// ([`Staging::begin_step`]); `users`: the bound parameters, whose
    /// allocation id and generation name their content.
    pub(crate) fn staging_begin(
        &self,
        users: &[Option<crate::binding::UserBuffer<B>>],
        slots: &SlotTable,
        stream: &B::Stream,
        graph: bool,
    ) -> Result<()> {
        let Some(staging) = self.staging.as_ref() else {
            return Ok(());
        };
        let content = |a: usize| match self.plan.allocations.get(a).map(|x| &x.role) {
            Some(AllocationRole::Constant { .. }) => Some(crate::staging::Content::Constant),
            Some(AllocationRole::Parameter { number, .. }) => users
                .get(*number as usize)?
                .as_ref()
                .and_then(|u| Some((u.id?, u.generation)))
                .map(|(id, generation)| crate::staging::Content::Allocation { id, generation }),
            _ => None,
        };
        staging.begin_step(&self.backend, &content, slots, stream, graph)
    }

    /// After a step's work was enqueued whole ([`Staging::end_step`]).
    pub(crate) fn staging_end(&self) {
        if let Some(s) = self.staging.as_ref() {
            s.end_step();
        }
    }

    /// Its staging's summary when a timed step was read back since the
    /// last call (one mutex per call otherwise).
    pub(crate) fn staging_reading(&self) -> Option<crate::staging::StagingSummary> {
        let s = self.staging.as_ref()?;
        s.take_fresh().then(|| s.summary(self.backend()))
    }

    /// Why part of its memory is in host memory and not staged (`None`:
    /// staged, or nothing there).
    pub fn staging_note(&self) -> Option<&str> {
        self.staging_note.as_deref()
    }

    /// Is part of its memory in host memory (staged, or read in place)?
    pub(crate) fn in_host_memory(&self) -> bool {
        self.staging.is_some() || self.staging_note.is_some()
    }

    /// What its staging does per step (`None`: nothing is staged).
    pub fn staging_summary(&self) -> Option<crate::staging::StagingSummary> {
        let be = self.backend();
        self.staging.as_ref().map(|s| s.summary(be))
    }
}

/// Entry parameter number → its allocation slots (tuple-shaped parameters
/// are not supported).
fn parameter_slots(plan: &Plan) -> Result<Vec<Vec<usize>>> {
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
                .ok_or_else(|| RuntimeError::invalid(format!("parameter {number} of {nparams}")))?
                .push(a.index);
        }
    }
    Ok(param_slots)
}

impl<B: Backend> Drop for Program<B> {
    /// Waits for the program's streams, then releases its buffers, events,
    /// streams and modules; every failure is reported in one warning.
    fn drop(&mut self) {
        let be = &*self.backend;
        let mut t = Teardown::new("program");
        if let Some(s) = self.staging.take() {
            s.release(be, &mut t);
        }
        for s in self.aux_streams.iter().chain(&self.comm_streams) {
            t.check("stream_synchronize", be.stream_synchronize(s));
        }
        for buf in self.owned.drain(..).chain(self.scratch.take()) {
            t.check("freeing a buffer", buf.free());
        }
        for buf in self.host_staging.drain() {
            t.check("host_free", be.host_free(buf));
        }
        for e in self.vmm.take_deferred_errors() {
            t.check("freeing a buffer", Err::<(), _>(e));
        }
        for (_, (a, b)) in self.events.drain() {
            t.check("event_destroy", be.event_destroy(a));
            t.check("event_destroy", be.event_destroy(b));
        }
        for s in self
            .aux_streams
            .drain(..)
            .chain(self.comm_streams.drain(..))
        {
            t.check("stream_destroy", be.stream_destroy(s));
        }
        // Functions hold their modules on some backends; unload after ops.
        self.ops.clear();
        self.plans.release(self.gemm.as_deref());
        for m in self.modules.drain(..) {
            t.check("module_unload", be.module_unload(m));
        }
    }
}

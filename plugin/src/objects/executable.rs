//! Executables: compile (through the vendor compiler), load into our
//! runtime, answer JAX's queries, serialize / deserialize, execute.
//!
//! One [`Program`] per addressable device of the executable's device
//! assignment (the vendor compiler's; one device when it has none: such a
//! *portable* executable is loaded on other devices when `Execute` asks for
//! them); `PJRT_LoadedExecutable` and every `PJRT_Executable` view handed
//! out by `GetExecutable` share them. Multi-device programs get the
//! assignment, their device's global id and the client's cliques
//! (`collectives.rs`).
//!
//! Execution (asynchronous): everything is enqueued on the device's stream
//! and `Execute` returns; a device event recorded after the step completes
//! the outputs' ready events and the `device_complete_events` (see
//! `runtime/context.rs`; `XLA_VMM_SYNC_EXECUTE=1` waits for the step instead). With
//! several devices, argument list `i` belongs to addressable device `i`;
//! every list is checked first, then each device's step is enqueued on that
//! device's worker thread (`worker.rs`), all at once. Per device:
//! 1. arguments are checked against the entry parameter shapes (dtype and
//!    dims) and must be live (their producers need not have run: the stream
//!    orders them);
//! 2. a parameter the program aliases with an output is *donated* unless
//!    its index is in `non_donatable_input_indices`: then it is first copied
//!    and the copy is what the program updates in place;
//! 3. after the run, an aliased output takes the donated allocation (the
//!    argument buffer then reads as donated); any other output is copied out
//!    of the executable's memory into a fresh VMM buffer.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use xla_vmm::{Plan, Shape};
use xla_vmm_device::MemLocation;
use xla_vmm_ffi::pjrt::*;

use crate::cabi::assignment::{AssignmentProto, DeviceAssignment, MultiDevice};
use crate::cabi::caller::{self, CPtr, NamedValues};
use crate::cabi::dtype;
use crate::cabi::error::{Error, Result};
use crate::cabi::ffi_state::ExecuteContext;
use crate::cabi::handles::{Handle, Registry};
use crate::objects::buffer::Buffer;
use crate::objects::client::Client;
use crate::objects::device::{Device, DEVICE_MEMORY_KIND, PINNED_HOST_MEMORY_KIND};
use crate::runtime::event::Event;
use crate::runtime::program::Program;
use crate::vendor_plugin::executable::{VendorExecutable, ViewArg};

/// Dtype, dims and memory of one parameter or result leaf.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    pub dtype: PJRT_Buffer_Type,
    pub dims: Vec<i64>,
    /// In host memory (the layout's memory space is XLA's host space: host
    /// offload); JAX's memory kind `pinned_host`.
    pub on_host: bool,
}

impl LeafSpec {
    /// New memory for this leaf, in its memory space.
    fn alloc(
        &self,
        mem: &dyn crate::runtime::context::DeviceContext,
        bytes: u64,
    ) -> Result<crate::runtime::context::Allocation> {
        if self.on_host {
            mem.alloc_host(bytes)
        } else {
            mem.alloc(bytes)
        }
    }

    /// A buffer of this leaf over `alloc`, in its memory space of `device`.
    fn buffer(
        &self,
        device: &Arc<Device>,
        alloc: crate::runtime::context::Allocation,
        ready: Arc<Event>,
    ) -> Result<Arc<Buffer>> {
        let memory = device.memory(self.memory_kind())?;
        Buffer::from_allocation_in(device.clone(), memory, self.dtype, &self.dims, alloc, ready)
    }

    pub fn memory_kind(&self) -> &'static str {
        if self.on_host {
            PINNED_HOST_MEMORY_KIND
        } else {
            DEVICE_MEMORY_KIND
        }
    }
}

pub struct Executable {
    pub name: String,
    pub fingerprint: String,
    /// The vendor's `PJRT_Executable_Serialize` bytes (what we serialize).
    pub serialized: Vec<u8>,
    pub optimized: Option<(Vec<u8>, String)>,
    /// The vendor compiler's cost analysis (flops, bytes accessed, ...).
    pub(crate) cost: Option<NamedValues>,
    pub params: Vec<LeafSpec>,
    pub outputs: Vec<LeafSpec>,
    /// The arrays the C queries hand out (`exec_queries.rs`).
    pub(crate) queries: QueryArrays,
    pub(crate) code_size: i64,
    /// Per entry parameter: does the program write it in place (aliased
    /// with an output: donation)?
    pub(crate) aliased: Vec<bool>,
    /// One loaded program per addressable device of the assignment, in the
    /// order of `Execute`'s argument lists.
    pub(crate) parts: Vec<Arc<DeviceProgram>>,
    /// A program compiled without a device assignment (portable): its plan,
    /// and its programs on other devices, loaded when `Execute` first asks
    /// for one of them (`execute_device`).
    portable: Option<(Plan, Mutex<Vec<Arc<DeviceProgram>>>)>,
    pub(crate) device_ptrs: Vec<CPtr<PJRT_Device>>,
    pub(crate) assignment: DeviceAssignment,
    /// (replica, partition) of each addressable device, in `parts` order.
    pub(crate) logical_ids: Vec<PJRT_LogicalDeviceIds>,
    /// Serialized `DeviceAssignmentProto` of `assignment`.
    pub(crate) device_assignment: Vec<u8>,
}

/// The program on one device.
pub(crate) struct DeviceProgram {
    pub(crate) device: Arc<Device>,
    pub(crate) runner: Mutex<Option<Runner>>,
    /// Set once the program has binding stats (`stats.rs` tags them with
    /// the device).
    stats_key: std::sync::OnceLock<String>,
}

impl DeviceProgram {
    /// A program loaded on `device`, listed in its programs.
    fn new(device: Arc<Device>, runner: Runner) -> Arc<DeviceProgram> {
        let p = Arc::new(DeviceProgram {
            device,
            runner: Mutex::new(Some(runner)),
            stats_key: std::sync::OnceLock::new(),
        });
        let mut all = p.device.programs.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&p));
        drop(all);
        p
    }

    /// The device's other programs give back the device memory they hold
    /// between runs (`Program::yield_device_memory`): those not running
    /// now (one whose lock another thread holds keeps its memory). Called
    /// by this program's first run, the device's stream waited for.
    /// Returns the bytes freed.
    fn reclaim_from_others(&self) -> u64 {
        let others: Vec<Arc<DeviceProgram>> = {
            let all = self
                .device
                .programs
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            all.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        let mut freed = 0;
        for p in others
            .iter()
            .filter(|p| !std::ptr::eq(Arc::as_ptr(p), self))
        {
            let Ok(mut guard) = p.runner.try_lock() else {
                continue;
            };
            if let Some(Runner::Runtime(r)) = guard.as_mut() {
                freed += r.yield_device_memory();
            }
        }
        freed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Runner>> {
        self.runner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Who runs the program.
pub(crate) enum Runner {
    /// Our runtime (always, under `strict`).
    Runtime(Box<dyn Program>),
    /// The vendor runtime on views of our buffers: our runtime rejected the
    /// program (the reason was logged once, at load, and is in the report).
    Vendor(VendorExecutable, xla_vmm_runtime::report::ReportSlot),
}

pub struct LoadedExecutable(pub Arc<Executable>);
pub struct ExecutableView(pub Arc<Executable>);
/// Bytes handed out by `Serialize`, freed by the deleter it comes with.
pub struct Blob(pub Vec<u8>);

static LOADED: Registry<LoadedExecutable> = Registry::new();
static VIEWS: Registry<ExecutableView> = Registry::new();
static BLOBS: Registry<Blob> = Registry::new();

impl Handle for LoadedExecutable {
    type C = PJRT_LoadedExecutable;
    const KIND: &'static str = "PJRT_LoadedExecutable";
    fn registry() -> &'static Registry<Self> {
        &LOADED
    }
}
impl Handle for ExecutableView {
    type C = PJRT_Executable;
    const KIND: &'static str = "PJRT_Executable";
    fn registry() -> &'static Registry<Self> {
        &VIEWS
    }
}
impl Handle for Blob {
    type C = PJRT_SerializedExecutable;
    const KIND: &'static str = "PJRT_SerializedExecutable";
    fn registry() -> &'static Registry<Self> {
        &BLOBS
    }
}

fn leaves(shape: &Shape, out: &mut Vec<LeafSpec>) -> Result<()> {
    if shape.is_tuple() {
        for s in &shape.tuple_shapes {
            leaves(s, out)?;
        }
        return Ok(());
    }
    let name = shape.element_type.name().unwrap_or("?");
    let dtype = dtype::from_xla_name(name).ok_or_else(|| {
        Error::unimplemented(format!("element type {name} in the program signature"))
    })?;
    out.push(LeafSpec {
        dtype,
        dims: shape.dimensions.clone(),
        on_host: shape.memory_space == xla_vmm::HOST_MEMORY_SPACE,
    });
    Ok(())
}

impl Executable {
    /// Decode the vendor bytes and load them into our runtime on every
    /// addressable device of the program's device assignment (the vendor's,
    /// or one device: the client's first).
    ///
    /// `vendor` is the same program on the vendor client, when there is one:
    /// it gives the assignment, the optimized program (layouts) and, unless
    /// `strict`, runs a single-device program if our runtime rejects it.
    pub fn load(
        client: &Client,
        serialized: Vec<u8>,
        vendor: Option<VendorExecutable>,
        strict: bool,
    ) -> Result<Arc<Executable>> {
        let assignment = match vendor.as_ref().map(|v| v.device_assignment()) {
            Some(Ok(a)) => Some(a),
            Some(Err(e)) => {
                tracing::debug!("vendor device assignment unavailable ({e}); one device");
                None
            }
            None => None,
        };
        let cost = vendor.as_ref().and_then(|v| match v.cost_analysis() {
            Ok(items) => Some(NamedValues::new(
                items.iter().map(|(n, v)| (n.as_str(), v.clone())).collect(),
            )),
            Err(e) => {
                tracing::debug!("vendor cost analysis unavailable: {e}");
                None
            }
        });
        let optimized = vendor.as_ref().and_then(|v| match v.optimized_program() {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!("vendor optimized program unavailable: {e}");
                None
            }
        });
        let plan: Plan = xla_vmm::decode(&serialized)
            .map_err(|e| Error::invalid(format!("decoding the serialized executable: {e}")))?;
        Self::from_plan(
            client, assignment, plan, serialized, vendor, strict, cost, optimized,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn from_plan(
        client: &Client,
        assignment: Option<DeviceAssignment>,
        plan: Plan,
        serialized: Vec<u8>,
        vendor: Option<VendorExecutable>,
        strict: bool,
        cost: Option<NamedValues>,
        optimized: Option<(Vec<u8>, String)>,
    ) -> Result<Arc<Executable>> {
        let mut params = Vec::new();
        for p in &plan.program_shape.parameters {
            leaves(p, &mut params)?;
        }
        if params.len() != plan.program_shape.parameters.len() {
            return Err(Error::unimplemented("tuple-shaped entry parameters"));
        }
        let mut outputs = Vec::new();
        leaves(&plan.program_shape.result, &mut outputs)?;
        let mut h = DefaultHasher::new();
        serialized.hash(&mut h);
        let fingerprint = format!("xla-vmm-{:016x}-{}", h.finish(), serialized.len());
        let mut aliased = vec![false; params.len()];
        for a in &plan.allocations {
            if let xla_vmm::AllocationRole::Parameter {
                number,
                aliased_with_output: true,
                ..
            } = &a.role
            {
                if let Some(x) = aliased.get_mut(*number as usize) {
                    *x = true;
                }
            }
        }
        let name = plan.module_name.clone();
        let code_size = (plan.kernels.binary.len() + plan.kernels.asm_text.len()) as i64;
        let portable = assignment.is_none();
        let assignment = match assignment {
            Some(a) => a,
            None => {
                let first = client
                    .addressable
                    .first()
                    .ok_or_else(|| Error::internal("the client has no addressable device"))?;
                DeviceAssignment::single(first.id() as i64)
            }
        };
        // The devices of this process, in assignment order (replica major).
        let devices = assignment
            .ids
            .iter()
            .filter(|&&id| client.addressable.iter().any(|d| d.id() as i64 == id))
            .map(|&id| client.addressable_device(id))
            .collect::<Result<Vec<_>>>()?;
        if devices.is_empty() {
            return Err(Error::invalid(format!(
                "{name}: none of the devices {:?} of its assignment is addressable by process {}",
                assignment.ids, client.options.node_id
            )));
        }
        tracing::info!(%name, ids = ?assignment.ids, local = devices.len(), portable,
            "device assignment");
        let multi = assignment.num_devices() > 1;
        let mut parts = Vec::with_capacity(devices.len());
        let mut vendor = vendor;
        for device in devices {
            let spec = multi.then(|| MultiDevice {
                assignment: assignment.clone(),
                device_id: device.id() as i64,
            });
            let runner = match device.mem.load_program(plan.clone(), spec.as_ref()) {
                Ok(p) => Runner::Runtime(p),
                Err(e) => match vendor.take() {
                    Some(v) if !strict && !multi => {
                        tracing::warn!(
                            "xla-vmm runtime rejected {name} ({}); it runs on the vendor runtime \
                             on xla-vmm buffers (set strict to make this an error)",
                            e.message
                        );
                        let line = xla_vmm_runtime::report::ReportSlot::register(
                            xla_vmm_runtime::report::ProgramReport {
                                program: name.clone(),
                                mode: client.options.run.mode.name(),
                                runner: "vendor fallback",
                                reason: Some(e.message.clone()),
                                ..Default::default()
                            },
                        );
                        Runner::Vendor(v, line)
                    }
                    _ => {
                        return Err(e.context(&format!("loading {name} on device {}", device.id())))
                    }
                },
            };
            parts.push(DeviceProgram::new(device, runner));
        }
        let queries = QueryArrays::new(&params, &outputs);
        tracing::info!(%name, params = params.len(), outputs = outputs.len(), "executable loaded on xla-vmm");
        Ok(Arc::new(Executable {
            name,
            fingerprint,
            serialized,
            optimized,
            cost,
            queries,
            params,
            outputs,
            code_size,
            aliased,
            device_ptrs: parts.iter().map(|p| CPtr(p.device.c_ptr())).collect(),
            portable: (portable && matches!(parts[0].lock().as_ref(), Some(Runner::Runtime(_))))
                .then(|| (plan, Mutex::new(Vec::new()))),
            device_assignment: assignment.to_proto(),
            logical_ids: parts
                .iter()
                .map(|p| {
                    let i = assignment
                        .ids
                        .iter()
                        .position(|&id| id == p.device.id() as i64)
                        .unwrap_or(0);
                    PJRT_LogicalDeviceIds {
                        replica: (i / assignment.partitions) as i32,
                        partition: (i % assignment.partitions) as i32,
                    }
                })
                .collect(),
            assignment,
            parts,
        }))
    }

    /// Check one device's arguments: count, types and placement.
    pub(crate) fn check_args(
        &self,
        part: &DeviceProgram,
        args: &[Arc<Buffer>],
        non_donatable: &[i64],
    ) -> Result<()> {
        if args.len() != self.params.len() {
            return Err(Error::invalid(format!(
                "{} takes {} arguments, {} given",
                self.name,
                self.params.len(),
                args.len()
            )));
        }
        for (i, (a, p)) in args.iter().zip(&self.params).enumerate() {
            // JAX passes an effect token as a bool[0] array (its stand-in for
            // tokens at a program's boundary): any buffer of no bytes is one.
            let token = p.dtype == PJRT_Buffer_Type_TOKEN && a.bytes == 0;
            if !token && (a.dtype != p.dtype || a.dims != p.dims) {
                return Err(Error::invalid(format!(
                    "argument {i}: {}{:?} given, {} expects {}{:?}",
                    dtype::type_name(a.dtype),
                    a.dims,
                    self.name,
                    dtype::type_name(p.dtype),
                    p.dims
                )));
            }
            if !Arc::ptr_eq(&a.device.mem, &part.device.mem) {
                return Err(Error::invalid(format!(
                    "argument {i} is on device {}; {} runs this argument list on device {}",
                    a.device.id(),
                    self.name,
                    part.device.id()
                )));
            }
            // Checked here too, before any device starts: a device that
            // failed later would leave its peers waiting in a collective.
            a.with_live(|_| Ok(()))
                .map_err(|e| e.context(&format!("argument {i}")))?;
        }
        self.check_donations(args, non_donatable)
    }

    /// A donated buffer is consumed by the call: it may not also be another
    /// of its arguments, nor be held by an external reference (XLA's PJRT
    /// clients refuse both). One sort of the argument addresses (a few µs for
    /// hundreds of arguments), none for a program that donates nothing; the
    /// pairs are only looked at when some buffer is passed twice.
    fn check_donations(&self, args: &[Arc<Buffer>], non_donatable: &[i64]) -> Result<()> {
        let donated = |i: usize| self.aliased[i] && !non_donatable.contains(&(i as i64));
        let mut any = false;
        for (i, a) in args.iter().enumerate() {
            if donated(i) {
                any = true;
                a.check_donatable()
                    .map_err(|e| e.context(&format!("argument {i}")))?;
            }
        }
        if !any {
            return Ok(());
        }
        let mut by_addr: Vec<(usize, usize)> = args
            .iter()
            .enumerate()
            .map(|(i, a)| (Arc::as_ptr(a) as usize, i))
            .collect();
        by_addr.sort_unstable();
        for w in by_addr.windows(2) {
            let ((pa, i), (pb, j)) = (w[0], w[1]);
            if pa == pb && (donated(i) || donated(j)) {
                let (d, other) = if donated(i) { (i, j) } else { (j, i) };
                return Err(Error::invalid(format!(
                    "argument {d} is donated to {} and is also argument {other}: a buffer \
                     cannot be donated and used by the same call",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// Delete: unload every device's program.
    pub(crate) fn unload(&self) {
        for p in &self.parts {
            *p.lock() = None;
        }
        if let Some((_, loaded)) = &self.portable {
            loaded.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    pub(crate) fn is_unloaded(&self) -> bool {
        self.parts.iter().all(|p| p.lock().is_none())
    }

    /// The program on `device`: one of `parts`, or, for a portable
    /// executable, its program loaded on `device` (at the first use).
    pub(crate) fn part_on(&self, device: &Arc<Device>) -> Result<Arc<DeviceProgram>> {
        if let Some(p) = self.parts.iter().find(|p| Arc::ptr_eq(&p.device, device)) {
            return Ok(p.clone());
        }
        let not_ours = || {
            Error::invalid(format!(
                "execute_device {} is not one of the devices {:?} {} was loaded on",
                device.id(),
                self.parts.iter().map(|p| p.device.id()).collect::<Vec<_>>(),
                self.name
            ))
        };
        let (plan, loaded) = self.portable.as_ref().ok_or_else(not_ours)?;
        if !device.addressable {
            return Err(not_ours().context("not addressable by this process"));
        }
        let mut loaded = loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = loaded.iter().find(|p| Arc::ptr_eq(&p.device, device)) {
            return Ok(p.clone());
        }
        if self.is_unloaded() {
            return Err(Error::failed_precondition(format!(
                "executable {} was deleted",
                self.name
            )));
        }
        let program = device
            .mem
            .load_program(plan.clone(), None)
            .map_err(|e| e.context(&format!("loading {} on device {}", self.name, device.id())))?;
        tracing::info!(name = %self.name, device = device.id(), "portable executable loaded");
        let part = DeviceProgram::new(device.clone(), Runner::Runtime(program));
        loaded.push(part.clone());
        Ok(part)
    }

    /// Each argument's location and whether its memory may move for the
    /// program's plan: not while an external reference reads it, not when
    /// the program runs on a copy of it (written in place, not donatable),
    /// not when it is passed twice (its room would count twice).
    fn placement_info(
        &self,
        args: &[Arc<Buffer>],
        non_donatable: &[i64],
    ) -> Result<Vec<(Option<MemLocation>, bool)>> {
        let mut seen = Vec::with_capacity(args.len());
        let mut info = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            let (ptr, (at, movable)) = a.with_live(|al| Ok((al.ptr, al.placement())))?;
            let copied = self.aliased[i] && non_donatable.contains(&(i as i64));
            let repeated = seen.contains(&ptr);
            seen.push(ptr);
            info.push((at, movable && !copied && !repeated && !a.externally_held()));
        }
        Ok(info)
    }

    /// Enqueue one step; the outputs and the event that completes when the
    /// device has run it.
    /// (The arguments were checked with `check_args`.)
    pub(crate) fn execute(
        &self,
        part: &DeviceProgram,
        args: &[Arc<Buffer>],
        non_donatable: &[i64],
        context: Option<&Arc<ExecuteContext>>,
    ) -> Result<(Vec<Arc<Buffer>>, Arc<Event>)> {
        let t0 = std::time::Instant::now();
        let mem = &part.device.mem;
        // Bound the work in flight; no lock is held while waiting.
        mem.throttle();
        let mut guard = part.lock();
        let program = match guard.as_mut() {
            None => {
                return Err(Error::failed_precondition(format!(
                    "executable {} was deleted",
                    self.name
                )))
            }
            Some(Runner::Vendor(v, line)) => {
                line.update(|r| r.steps += 1);
                return self.execute_vendor(part, v, args, non_donatable, context);
            }
            Some(Runner::Runtime(p)) => p,
        };
        // Before its first run under a device budget, its arguments' memory
        // is moved where its plan wants it (a failure is said: the memory
        // stays, the program reads it where it is).
        if program.placement_pending() {
            let info = self.placement_info(args, non_donatable)?;
            // What the others give back frees their hold on arguments too.
            let mut reclaim = || xla_vmm_runtime::Reclaimed {
                bytes: part.reclaim_from_others(),
                movable: self
                    .placement_info(args, non_donatable)
                    .ok()
                    .map(|v| v.into_iter().map(|(_, m)| m).collect()),
            };
            for (i, to) in program.placement(&info, &mut reclaim)? {
                if let Err(e) = args[i].with_live_mut(|al| al.relocate(to)) {
                    tracing::warn!(executable = %self.name, argument = i, to = ?to, error = %e,
                        "an argument's memory could not move; it stays");
                }
            }
        }
        // A parameter the program writes in place but the caller may not
        // donate is copied first; the program updates the copy.
        let mut bound = Vec::with_capacity(args.len());
        let mut handles = Vec::with_capacity(args.len());
        let mut copies: Vec<Option<crate::runtime::context::Allocation>> =
            Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            let (ptr, bytes, handle) = a.with_live(|al| Ok((al.ptr, a.bytes, al.handle())))?;
            if self.aliased[i] && non_donatable.contains(&(i as i64)) && bytes > 0 {
                let copy = self.params[i].alloc(&**mem, bytes)?;
                mem.copy(copy.ptr, ptr, bytes)?;
                bound.push((copy.ptr, bytes));
                handles.push(copy.handle());
                copies.push(Some(copy));
            } else {
                bound.push((ptr, bytes));
                handles.push(handle);
                copies.push(None);
            }
        }
        // The outputs live in the executable's memory until its next run:
        // keep the lock until their copies out are enqueued.
        // Custom calls run while the step is enqueued: the context is theirs
        // for this run only.
        program
            .set_call_context(context.map(|c| c.clone() as Arc<dyn xla_vmm_runtime::CallContext>));
        let outs = program.run_bound(&bound, handles);
        program.set_call_context(None);
        let outs = outs?;
        if part.stats_key.get().is_none() {
            if let Some(key) = program.stats_key() {
                crate::cabi::stats::record_device(&key, part.device.id());
                let _ = part.stats_key.set(key);
            }
        }
        if outs.len() != self.outputs.len() {
            return Err(Error::internal(format!(
                "{}: {} outputs produced, {} declared",
                self.name,
                outs.len(),
                self.outputs.len()
            )));
        }
        let done = Event::pending();
        let mut results = Vec::with_capacity(outs.len());
        // The fresh outputs' copies out of the program's memory, one batch.
        let mut copies_out = Vec::new();
        for (o, spec) in outs.iter().zip(&self.outputs) {
            // An output written in place into an argument's memory is new
            // content there: its allocation is renewed (a program that read
            // the argument must not take the output for it).
            let in_place = |mut a: crate::runtime::context::Allocation| {
                a.renew();
                a
            };
            let alloc = match o.parameter {
                // Written in place into the copy of a non-donatable argument.
                Some(p) if p < args.len() && copies[p].is_some() => in_place(
                    copies[p]
                        .take()
                        .ok_or_else(|| Error::internal("copy taken twice"))?,
                ),
                // Written in place (donation): the output takes the argument's memory.
                Some(p) if p < args.len() && self.aliased[p] => {
                    in_place(args[p].take_for_donation()?)
                }
                // A passthrough of an argument that is not donated (or any
                // other output): a fresh buffer, the argument stays the caller's.
                _ => {
                    let fresh = spec.alloc(&**mem, o.bytes)?;
                    if o.bytes > 0 {
                        copies_out.push((fresh.ptr, o.ptr, o.bytes));
                    }
                    fresh
                }
            };
            results.push(spec.buffer(&part.device, alloc, done.clone())?);
        }
        mem.copy_many(&copies_out)?;
        mem.complete_after(done.clone());
        drop(guard);
        // Unused copies are freed after the step (stream ordered).
        drop(copies);
        if mem.is_sync() {
            done.wait()?;
        }
        tracing::debug!(executable = %self.name, host_ns = t0.elapsed().as_nanos() as u64, "executed");
        Ok((results, done))
    }
}

impl Executable {
    /// The fallback: run on the vendor runtime, copy outputs into our
    /// buffers; a donated argument is then deleted, as JAX expects.
    fn execute_vendor(
        &self,
        part: &DeviceProgram,
        v: &VendorExecutable,
        args: &[Arc<Buffer>],
        non_donatable: &[i64],
        context: Option<&Arc<ExecuteContext>>,
    ) -> Result<(Vec<Arc<Buffer>>, Arc<Event>)> {
        let mem = &part.device.mem;
        // An aliased pinned_host argument: the vendor cannot keep it (it
        // refuses a non-donatable pinned_host argument that an output
        // aliases), so it gets a copy of ours, which it may donate; the
        // caller's buffer is not touched (deleted below if donated).
        let mut copies: Vec<Option<crate::runtime::context::Allocation>> =
            Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            copies.push(
                if self.aliased[i] && self.params[i].on_host && a.bytes > 0 {
                    let src = a.with_live(|al| Ok(al.ptr))?;
                    let copy = self.params[i].alloc(&**mem, a.bytes)?;
                    mem.copy(copy.ptr, src, a.bytes)?;
                    Some(copy)
                } else {
                    None
                },
            );
        }
        // The vendor runs on its own stream: our queued work (the arguments'
        // producers, the copies above) must be done first.
        mem.synchronize()?;
        // Each argument's handle is held while the vendor reads it: another
        // program's first run does not move memory held elsewhere.
        let (ptrs, _held): (Vec<_>, Vec<_>) = args
            .iter()
            .zip(&copies)
            .map(|(a, c)| match c {
                Some(c) => Ok((c.ptr, None)),
                None => a.with_live(|al| Ok((al.ptr, al.handle()))),
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let view_args: Vec<ViewArg<'_>> = args
            .iter()
            .zip(&ptrs)
            .zip(&self.params)
            .zip(&copies)
            .map(|(((a, &ptr), spec), copy)| ViewArg {
                ptr,
                dtype: a.dtype,
                dims: &a.dims,
                on_host: spec.on_host,
                donatable: copy.is_some(),
            })
            .collect();
        let run = v.execute(&view_args, self.outputs.len(), context)?;
        let mut results = Vec::with_capacity(self.outputs.len());
        for (o, spec) in run.outputs.iter().zip(&self.outputs) {
            let fresh = spec.alloc(&**mem, o.bytes)?;
            mem.copy(fresh.ptr, o.ptr, o.bytes)?;
            results.push(spec.buffer(&part.device, fresh, Event::ready(Ok(())))?);
        }
        // The copies read the vendor's buffers: done before they go (and the
        // argument copies the vendor may have written into with them).
        mem.synchronize()?;
        drop(run);
        drop(copies);
        for (i, a) in args.iter().enumerate() {
            if self.aliased[i] && !non_donatable.contains(&(i as i64)) {
                drop(a.take_for_donation()?);
            }
        }
        Ok((results, Event::ready(Ok(()))))
    }
}

/// Load an already decoded plan on `client`'s device and return it as a
/// `PJRT_LoadedExecutable` (tools and tests; JAX goes through compile or
/// deserialize). `serialized` is what `PJRT_Executable_Serialize` will return.
pub fn load_plan(
    client: *mut PJRT_Client,
    plan: Plan,
    serialized: Vec<u8>,
) -> Result<*mut PJRT_LoadedExecutable> {
    load_plan_on(client, plan, serialized, None)
}

/// [`load_plan`] on the devices of `assignment` (`None`: the client's
/// first device).
pub fn load_plan_on(
    client: *mut PJRT_Client,
    plan: Plan,
    serialized: Vec<u8>,
    assignment: Option<DeviceAssignment>,
) -> Result<*mut PJRT_LoadedExecutable> {
    let client = Client::from_c(client)?;
    let exe = Executable::from_plan(
        &client, assignment, plan, serialized, None, true, None, None,
    )?;
    Ok(Arc::new(LoadedExecutable(exe)).into_c())
}

pub(crate) fn loaded(p: *mut PJRT_LoadedExecutable) -> Result<Arc<Executable>> {
    Ok(LoadedExecutable::from_c(p)?.0.clone())
}
pub(crate) fn view(p: *mut PJRT_Executable) -> Result<Arc<Executable>> {
    Ok(ExecutableView::from_c(p)?.0.clone())
}

// ---- compile / deserialize ------------------------------------------------

pub fn compile(a: &mut PJRT_Client_Compile_Args) -> Result<()> {
    let _span = xla_vmm_runtime::trace::span("compile (vendor XLA)");
    let client = Client::from_c(a.client)?;
    let program = caller::slice(a.program, 1, "program")?
        .first()
        .copied()
        .ok_or_else(|| Error::invalid("program is null"))?;
    let code = caller::slice(
        program.code.cast::<u8>().cast_const(),
        program.code_size,
        "program code",
    )?;
    let format = caller::str(program.format, program.format_size, "program format")?;
    let options = caller::slice(
        a.compile_options.cast::<u8>(),
        a.compile_options_size,
        "compile_options",
    )?;
    let vendor = client.vendor()?;
    let compiled = VendorExecutable::compile(&vendor, code, format, options)?;
    let serialized = compiled.serialize()?;
    let exe = Executable::load(&client, serialized, Some(compiled), client.options.strict)
        .map_err(|e| e.context("loading the compiled program into the xla-vmm runtime"))?;
    a.executable = Arc::new(LoadedExecutable(exe)).into_c();
    Ok(())
}

pub fn deserialize_and_load(a: &mut PJRT_Executable_DeserializeAndLoad_Args) -> Result<()> {
    let client = Client::from_c(a.client)?;
    let bytes = caller::slice(
        a.serialized_executable.cast::<u8>(),
        a.serialized_executable_size,
        "serialized_executable",
    )?
    .to_vec();
    // The vendor copy gives the optimized program (layouts) and the
    // fallback; without a vendor plugin (host backend) we load ours only.
    let overridden = if a.overridden_serialized_compile_options.is_null()
        || a.overridden_serialized_compile_options_size == 0
    {
        None
    } else {
        Some(caller::slice(
            a.overridden_serialized_compile_options.cast::<u8>(),
            a.overridden_serialized_compile_options_size,
            "overridden_serialized_compile_options",
        )?)
    };
    let vendor = match client.vendor_if_available() {
        Some(v) => Some(VendorExecutable::deserialize(&v, &bytes, overridden)?),
        None => None,
    };
    let exe = Executable::load(&client, bytes, vendor, client.options.strict)?;
    a.loaded_executable = Arc::new(LoadedExecutable(exe)).into_c();
    Ok(())
}

/// The arrays the executable queries (`exec_queries.rs`) hand out, made once at load: they live as
/// long as the executable.
pub(crate) struct QueryArrays {
    pub(crate) out_types: Vec<PJRT_Buffer_Type>,
    /// Every output's dimensions, one after the other (`out_dim_sizes` each).
    pub(crate) out_dims: Vec<i64>,
    pub(crate) out_dim_sizes: Vec<usize>,
    pub(crate) out_kinds: Vec<CPtr<std::ffi::c_char>>,
    pub(crate) out_kind_sizes: Vec<usize>,
    pub(crate) param_kinds: Vec<CPtr<std::ffi::c_char>>,
    pub(crate) param_kind_sizes: Vec<usize>,
}

impl QueryArrays {
    pub(crate) fn new(params: &[LeafSpec], outputs: &[LeafSpec]) -> Self {
        let (out_kinds, out_kind_sizes) = kinds(outputs);
        let (param_kinds, param_kind_sizes) = kinds(params);
        QueryArrays {
            out_types: outputs.iter().map(|o| o.dtype).collect(),
            out_dims: outputs
                .iter()
                .flat_map(|o| o.dims.iter().copied())
                .collect(),
            out_dim_sizes: outputs.iter().map(|o| o.dims.len()).collect(),
            out_kinds,
            out_kind_sizes,
            param_kinds,
            param_kind_sizes,
        }
    }
}

/// The C strings of a list of leaves' memory kinds (static strings).
fn kinds(leaves: &[LeafSpec]) -> (Vec<CPtr<std::ffi::c_char>>, Vec<usize>) {
    leaves
        .iter()
        .map(|l| {
            let k = l.memory_kind();
            (CPtr(k.as_ptr() as *mut std::ffi::c_char), k.len())
        })
        .unzip()
}

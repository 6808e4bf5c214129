//! Executables: compile (through the vendor compiler), load into our
//! runtime, answer JAX's queries, serialize / deserialize, execute.
//!
//! One [`Program`] per executable; `PJRT_LoadedExecutable` and every
//! `PJRT_Executable` view handed out by `GetExecutable` share it.
//!
//! Execution (single device, synchronous: the completion event is ready on
//! return):
//! 1. arguments are checked against the entry parameter shapes (dtype and
//!    dims) and must be live;
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
use xla_vmm_ffi::pjrt::*;

use crate::buffer::Buffer;
use crate::cabi::{self, CPtr, NamedValues};
use crate::client::Client;
use crate::device::{Device, DEVICE_MEMORY_KIND};
use crate::dtype;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::handles::{Handle, Registry};
use crate::program::Program;
use crate::vendor_exec::{VendorExecutable, ViewArg};

/// Dtype and dims of one result leaf.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    pub dtype: PJRT_Buffer_Type,
    pub dims: Vec<i64>,
}

pub struct ExecInner {
    pub name: String,
    pub fingerprint: String,
    /// The vendor's `PJRT_Executable_Serialize` bytes (what we serialize).
    pub serialized: Vec<u8>,
    pub optimized: Option<(Vec<u8>, String)>,
    /// The vendor compiler's cost analysis (flops, bytes accessed, ...).
    cost: Option<NamedValues>,
    pub params: Vec<LeafSpec>,
    pub outputs: Vec<LeafSpec>,
    out_types: Vec<PJRT_Buffer_Type>,
    out_dims: Vec<i64>,
    out_dim_sizes: Vec<usize>,
    out_kinds: Vec<CPtr<std::ffi::c_char>>,
    out_kind_sizes: Vec<usize>,
    param_kinds: Vec<CPtr<std::ffi::c_char>>,
    param_kind_sizes: Vec<usize>,
    code_size: i64,
    /// Per entry parameter: does the program write it in place (aliased
    /// with an output: donation)?
    aliased: Vec<bool>,
    device: Arc<Device>,
    device_ptrs: Vec<CPtr<PJRT_Device>>,
    /// Serialized `DeviceAssignmentProto`: one replica on our device.
    device_assignment: Vec<u8>,
    runner: Mutex<Option<Runner>>,
}

/// Who runs the program.
enum Runner {
    /// Our runtime (always, under `strict`).
    Ours(Box<dyn Program>),
    /// The vendor runtime on views of our buffers: our runtime rejected the
    /// program (the reason was logged once, at load).
    Vendor(VendorExecutable),
}

pub struct LoadedExecutable(pub Arc<ExecInner>);
pub struct ExecutableView(pub Arc<ExecInner>);
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
    });
    Ok(())
}

static KIND: &str = DEVICE_MEMORY_KIND;

impl ExecInner {
    /// Decode the vendor bytes and load them into our runtime on `device`.
    ///
    /// `vendor` is the same program on the vendor client, when there is one:
    /// it gives the optimized program (layouts) and, unless `strict`, runs
    /// the program if our runtime rejects it.
    pub fn load(
        device: Arc<Device>,
        serialized: Vec<u8>,
        vendor: Option<VendorExecutable>,
        strict: bool,
    ) -> Result<Arc<ExecInner>> {
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
        Self::from_plan(device, plan, serialized, vendor, strict, cost, optimized)
    }

    fn from_plan(
        device: Arc<Device>,
        plan: Plan,
        serialized: Vec<u8>,
        vendor: Option<VendorExecutable>,
        strict: bool,
        cost: Option<NamedValues>,
        optimized: Option<(Vec<u8>, String)>,
    ) -> Result<Arc<ExecInner>> {
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
        let runner = match device.mem.load_program(plan) {
            Ok(p) => Runner::Ours(p),
            Err(e) => match vendor {
                Some(v) if !strict => {
                    tracing::warn!(
                        "xla-vmm runtime rejected {name} ({}); it runs on the vendor runtime on \
                         xla-vmm buffers (set strict to make this an error)",
                        e.message
                    );
                    Runner::Vendor(v)
                }
                _ => return Err(e),
            },
        };
        let kind = CPtr(KIND.as_ptr() as *mut std::ffi::c_char);
        tracing::info!(%name, params = params.len(), outputs = outputs.len(), "executable loaded on xla-vmm");
        Ok(Arc::new(ExecInner {
            name,
            fingerprint,
            serialized,
            optimized,
            cost,
            out_types: outputs.iter().map(|o| o.dtype).collect(),
            out_dims: outputs
                .iter()
                .flat_map(|o| o.dims.iter().copied())
                .collect(),
            out_dim_sizes: outputs.iter().map(|o| o.dims.len()).collect(),
            out_kinds: vec![kind; outputs.len()],
            out_kind_sizes: vec![KIND.len(); outputs.len()],
            param_kinds: vec![kind; params.len()],
            param_kind_sizes: vec![KIND.len(); params.len()],
            params,
            outputs,
            code_size,
            aliased,
            device_ptrs: vec![CPtr(device.c_ptr())],
            device_assignment: device_assignment_proto(device.id() as i64),
            device,
            runner: Mutex::new(Some(runner)),
        }))
    }

    fn execute(&self, args: &[Arc<Buffer>], non_donatable: &[i64]) -> Result<Vec<Arc<Buffer>>> {
        if args.len() != self.params.len() {
            return Err(Error::invalid(format!(
                "{} takes {} arguments, {} given",
                self.name,
                self.params.len(),
                args.len()
            )));
        }
        for (i, (a, p)) in args.iter().zip(&self.params).enumerate() {
            if a.dtype != p.dtype || a.dims != p.dims {
                return Err(Error::invalid(format!(
                    "argument {i}: {}{:?} given, {} expects {}{:?}",
                    dtype::type_name(a.dtype),
                    a.dims,
                    self.name,
                    dtype::type_name(p.dtype),
                    p.dims
                )));
            }
            if !Arc::ptr_eq(&a.device.mem, &self.device.mem) {
                return Err(Error::invalid(format!("argument {i} is on another device")));
            }
        }
        let mem = &self.device.mem;
        let mut guard = self.runner.lock().unwrap_or_else(|p| p.into_inner());
        let program = match guard.as_mut() {
            None => {
                return Err(Error::failed_precondition(format!(
                    "executable {} was deleted",
                    self.name
                )))
            }
            Some(Runner::Vendor(v)) => return self.execute_vendor(v, args, non_donatable),
            Some(Runner::Ours(p)) => p,
        };
        // A parameter the program writes in place but the caller may not
        // donate is copied first; the program updates the copy.
        let mut bound = Vec::with_capacity(args.len());
        let mut copies: Vec<Option<crate::devmem::Allocation>> = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            let (ptr, bytes) = a.with_live(|al| Ok((al.ptr, a.bytes)))?;
            if self.aliased[i] && non_donatable.contains(&(i as i64)) && bytes > 0 {
                let copy = mem.alloc(bytes)?;
                mem.copy(copy.ptr, ptr, bytes)?;
                bound.push((copy.ptr, bytes));
                copies.push(Some(copy));
            } else {
                bound.push((ptr, bytes));
                copies.push(None);
            }
        }
        // The outputs live in the executable's memory until its next run:
        // keep the lock until they are copied out.
        let outs = program.run(&bound)?;
        if outs.len() != self.outputs.len() {
            return Err(Error::internal(format!(
                "{}: {} outputs produced, {} declared",
                self.name,
                outs.len(),
                self.outputs.len()
            )));
        }
        let mut results = Vec::with_capacity(outs.len());
        for (o, spec) in outs.iter().zip(&self.outputs) {
            let alloc = match o.parameter {
                // Written in place into the copy of a non-donatable argument.
                Some(p) if p < args.len() && copies[p].is_some() => copies[p]
                    .take()
                    .ok_or_else(|| Error::internal("copy taken twice"))?,
                // Written in place (donation): the output takes the argument's memory.
                Some(p) if p < args.len() && self.aliased[p] => args[p].take_for_donation()?,
                // A passthrough of an argument that is not donated (or any
                // other output): a fresh buffer, the argument stays the caller's.
                _ => {
                    let fresh = mem.alloc(o.bytes)?;
                    mem.copy(fresh.ptr, o.ptr, o.bytes)?;
                    fresh
                }
            };
            results.push(Buffer::from_allocation(
                self.device.clone(),
                spec.dtype,
                &spec.dims,
                alloc,
            )?);
        }
        drop(guard);
        Ok(results)
    }
}

impl ExecInner {
    /// The fallback: run on the vendor runtime, copy outputs into our
    /// buffers; a donated argument is then deleted, as JAX expects.
    fn execute_vendor(
        &self,
        v: &VendorExecutable,
        args: &[Arc<Buffer>],
        non_donatable: &[i64],
    ) -> Result<Vec<Arc<Buffer>>> {
        let mem = &self.device.mem;
        let ptrs = args
            .iter()
            .map(|a| a.with_live(|al| Ok(al.ptr)))
            .collect::<Result<Vec<_>>>()?;
        let view_args: Vec<ViewArg<'_>> = args
            .iter()
            .zip(&ptrs)
            .map(|(a, &ptr)| ViewArg {
                ptr,
                dtype: a.dtype,
                dims: &a.dims,
            })
            .collect();
        let run = v.execute(&view_args, self.outputs.len())?;
        let mut results = Vec::with_capacity(self.outputs.len());
        for (o, spec) in run.outputs.iter().zip(&self.outputs) {
            let fresh = mem.alloc(o.bytes)?;
            mem.copy(fresh.ptr, o.ptr, o.bytes)?;
            results.push(Buffer::from_allocation(
                self.device.clone(),
                spec.dtype,
                &spec.dims,
                fresh,
            )?);
        }
        drop(run);
        for (i, a) in args.iter().enumerate() {
            if self.aliased[i] && !non_donatable.contains(&(i as i64)) {
                drop(a.take_for_donation()?);
            }
        }
        Ok(results)
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
    let client = Client::from_c(client)?;
    let device = client
        .devices
        .first()
        .cloned()
        .ok_or_else(|| Error::internal("no device"))?;
    let exe = ExecInner::from_plan(device, plan, serialized, None, true, None, None)?;
    Ok(Arc::new(LoadedExecutable(exe)).into_c())
}

fn loaded(p: *mut PJRT_LoadedExecutable) -> Result<Arc<ExecInner>> {
    Ok(LoadedExecutable::from_c(p)?.0.clone())
}
fn view(p: *mut PJRT_Executable) -> Result<Arc<ExecInner>> {
    Ok(ExecutableView::from_c(p)?.0.clone())
}

// ---- compile / deserialize ------------------------------------------------

pub fn compile(a: &mut PJRT_Client_Compile_Args) -> Result<()> {
    let client = Client::from_c(a.client)?;
    let program = cabi::slice(a.program, 1, "program")?
        .first()
        .copied()
        .ok_or_else(|| Error::invalid("program is null"))?;
    let code = cabi::slice(
        program.code.cast::<u8>().cast_const(),
        program.code_size,
        "program code",
    )?;
    let format = cabi::str(program.format, program.format_size, "program format")?;
    let options = cabi::slice(
        a.compile_options.cast::<u8>(),
        a.compile_options_size,
        "compile_options",
    )?;
    let vendor = client.vendor()?;
    let compiled = vendor.compile(code, format, options)?;
    let serialized = compiled.serialize()?;
    let device = client
        .devices
        .first()
        .cloned()
        .ok_or_else(|| Error::internal("no device"))?;
    let exe = ExecInner::load(device, serialized, Some(compiled), client.options.strict)
        .map_err(|e| e.context("loading the compiled program into the xla-vmm runtime"))?;
    a.executable = Arc::new(LoadedExecutable(exe)).into_c();
    Ok(())
}

pub fn deserialize_and_load(a: &mut PJRT_Executable_DeserializeAndLoad_Args) -> Result<()> {
    let client = Client::from_c(a.client)?;
    let bytes = cabi::slice(
        a.serialized_executable.cast::<u8>(),
        a.serialized_executable_size,
        "serialized_executable",
    )?
    .to_vec();
    let device = client
        .devices
        .first()
        .cloned()
        .ok_or_else(|| Error::internal("no device"))?;
    // The vendor copy gives the optimized program (layouts) and the
    // fallback; without a vendor plugin (host backend) we load ours only.
    let vendor = match client.vendor_if_available() {
        Some(v) => Some(v.deserialize(&bytes)?),
        None => None,
    };
    let exe = ExecInner::load(device, bytes, vendor, client.options.strict)?;
    a.loaded_executable = Arc::new(LoadedExecutable(exe)).into_c();
    Ok(())
}

// ---- loaded executable ----------------------------------------------------

pub fn loaded_destroy(a: &mut PJRT_LoadedExecutable_Destroy_Args) -> Result<()> {
    LoadedExecutable::release(a.executable)?;
    Ok(())
}

pub fn loaded_get_executable(a: &mut PJRT_LoadedExecutable_GetExecutable_Args) -> Result<()> {
    let e = loaded(a.loaded_executable)?;
    a.executable = Arc::new(ExecutableView(e)).into_c();
    Ok(())
}

pub fn loaded_addressable_devices(
    a: &mut PJRT_LoadedExecutable_AddressableDevices_Args,
) -> Result<()> {
    let e = loaded(a.executable)?;
    a.addressable_devices = e.device_ptrs.as_ptr().cast();
    a.num_addressable_devices = e.device_ptrs.len();
    Ok(())
}

pub fn loaded_delete(a: &mut PJRT_LoadedExecutable_Delete_Args) -> Result<()> {
    let e = loaded(a.executable)?;
    *e.runner.lock().unwrap_or_else(|p| p.into_inner()) = None;
    Ok(())
}

pub fn loaded_is_deleted(a: &mut PJRT_LoadedExecutable_IsDeleted_Args) -> Result<()> {
    let e = loaded(a.executable)?;
    a.is_deleted = e.runner.lock().unwrap_or_else(|p| p.into_inner()).is_none();
    Ok(())
}

pub fn loaded_fingerprint(a: &mut PJRT_LoadedExecutable_Fingerprint_Args) -> Result<()> {
    let e = loaded(a.executable)?;
    a.executable_fingerprint = e.fingerprint.as_ptr().cast();
    a.executable_fingerprint_size = e.fingerprint.len();
    Ok(())
}

extern "C" fn no_device_assignment(_: *mut PJRT_DeviceAssignmentSerialized) {}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A serialized `xla.DeviceAssignmentProto` (xla/xla_data.proto) for one
/// replica and one computation on `device_id`: `replica_count` (1) = 1,
/// `computation_count` (2) = 1, `computation_devices` (3) =
/// [{ `replica_device_ids` (1, packed) = [device_id] }].
pub fn device_assignment_proto(device_id: i64) -> Vec<u8> {
    let mut ids = Vec::new();
    varint(device_id as u64, &mut ids);
    let mut computation = vec![0x0A];
    varint(ids.len() as u64, &mut computation);
    computation.extend(ids);
    let mut out = vec![0x08, 0x01, 0x10, 0x01, 0x1A];
    varint(computation.len() as u64, &mut out);
    out.extend(computation);
    out
}

pub fn loaded_device_assignment(
    a: &mut PJRT_LoadedExecutable_GetDeviceAssignment_Args,
) -> Result<()> {
    let e = loaded(a.executable)?;
    // Bytes owned by the executable; the deleter has nothing to free.
    a.serialized_bytes = e.device_assignment.as_ptr().cast();
    a.serialized_bytes_size = e.device_assignment.len();
    a.serialized_device_assignment = std::ptr::null_mut();
    a.serialized_device_assignment_deleter = Some(no_device_assignment);
    Ok(())
}

pub fn loaded_logical_ids(
    a: &mut PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args,
) -> Result<()> {
    loaded(a.executable)?;
    a.addressable_device_logical_ids = std::ptr::null_mut();
    a.num_addressable_device_logical_ids = 0;
    Ok(())
}

pub fn execute(a: &mut PJRT_LoadedExecutable_Execute_Args) -> Result<()> {
    let e = loaded(a.executable)?;
    if a.num_devices != 1 {
        return Err(Error::unimplemented(format!(
            "execution on {} devices (xla-vmm runs single-device programs)",
            a.num_devices
        )));
    }
    if !a.execute_device.is_null() && Device::from_c(a.execute_device)?.id() != e.device.id() {
        return Err(Error::invalid(
            "execute_device is not the executable's device",
        ));
    }
    let lists = cabi::slice(a.argument_lists, 1, "argument_lists")?;
    let arg_ptrs = cabi::slice(lists[0], a.num_args, "argument list")?;
    let args = arg_ptrs
        .iter()
        .enumerate()
        .map(|(i, &p)| Buffer::from_c(p).map_err(|err| err.context(&format!("argument {i}"))))
        .collect::<Result<Vec<_>>>()?;
    let non_donatable = match cabi::slice(a.options.cast_const(), 1, "options")?.first() {
        Some(o) => cabi::slice(
            o.non_donatable_input_indices,
            o.num_non_donatable_input_indices,
            "non_donatable_input_indices",
        )?
        .to_vec(),
        None => Vec::new(),
    };
    let outs = e.execute(&args, &non_donatable)?;
    let out_lists = cabi::slice(a.output_lists, 1, "output_lists")?;
    let ptrs: Vec<*mut PJRT_Buffer> = outs.into_iter().map(Handle::into_c).collect();
    cabi::write_slice(out_lists[0], &ptrs, "output list")?;
    if !a.device_complete_events.is_null() {
        let ev = [Event::ready(Ok(())).into_c()];
        cabi::write_slice(a.device_complete_events, &ev, "device_complete_events")?;
    }
    Ok(())
}

// ---- executable view ------------------------------------------------------

pub fn destroy(a: &mut PJRT_Executable_Destroy_Args) -> Result<()> {
    ExecutableView::release(a.executable)?;
    Ok(())
}

pub fn name(a: &mut PJRT_Executable_Name_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.executable_name = e.name.as_ptr().cast();
    a.executable_name_size = e.name.len();
    Ok(())
}

pub fn num_replicas(a: &mut PJRT_Executable_NumReplicas_Args) -> Result<()> {
    view(a.executable)?;
    a.num_replicas = 1;
    Ok(())
}

pub fn num_partitions(a: &mut PJRT_Executable_NumPartitions_Args) -> Result<()> {
    view(a.executable)?;
    a.num_partitions = 1;
    Ok(())
}

pub fn num_outputs(a: &mut PJRT_Executable_NumOutputs_Args) -> Result<()> {
    a.num_outputs = view(a.executable)?.outputs.len();
    Ok(())
}

pub fn code_size(a: &mut PJRT_Executable_SizeOfGeneratedCodeInBytes_Args) -> Result<()> {
    a.size_in_bytes = view(a.executable)?.code_size;
    Ok(())
}

pub fn output_element_types(a: &mut PJRT_Executable_OutputElementTypes_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.output_types = e.out_types.as_ptr().cast_mut();
    a.num_output_types = e.out_types.len();
    Ok(())
}

pub fn output_dimensions(a: &mut PJRT_Executable_OutputDimensions_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.num_outputs = e.outputs.len();
    a.dims = e.out_dims.as_ptr();
    a.dim_sizes = e.out_dim_sizes.as_ptr();
    Ok(())
}

pub fn output_memory_kinds(a: &mut PJRT_Executable_OutputMemoryKinds_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.num_outputs = e.outputs.len();
    a.memory_kinds = e.out_kinds.as_ptr().cast();
    a.memory_kind_sizes = e.out_kind_sizes.as_ptr();
    Ok(())
}

pub fn parameter_memory_kinds(a: &mut PJRT_Executable_ParameterMemoryKinds_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.num_parameters = e.params.len();
    a.memory_kinds = e.param_kinds.as_ptr().cast();
    a.memory_kind_sizes = e.param_kind_sizes.as_ptr();
    Ok(())
}

pub fn fingerprint(a: &mut PJRT_Executable_Fingerprint_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.executable_fingerprint = e.fingerprint.as_ptr().cast();
    a.executable_fingerprint_size = e.fingerprint.len();
    Ok(())
}

pub fn cost_analysis(a: &mut PJRT_Executable_GetCostAnalysis_Args) -> Result<()> {
    let e = view(a.executable)?;
    let cost = e.cost.as_ref().ok_or_else(|| {
        Error::unimplemented("cost analysis is only known for executables the vendor compiler saw")
    })?;
    a.properties = cost.as_ptr();
    a.num_properties = cost.len();
    Ok(())
}

pub fn optimized_program(a: &mut PJRT_Executable_OptimizedProgram_Args) -> Result<()> {
    let e = view(a.executable)?;
    let (code, format) = e.optimized.as_ref().ok_or_else(|| {
        Error::unimplemented(
            "the optimized program is only kept for executables compiled in this process",
        )
    })?;
    let p = cabi::program_mut(a.program)?;
    p.format = format.as_ptr().cast();
    p.format_size = format.len();
    if p.code.is_null() {
        p.code_size = code.len();
        return Ok(());
    }
    if p.code_size < code.len() {
        return Err(Error::invalid(format!(
            "program code buffer holds {} bytes, {} needed",
            p.code_size,
            code.len()
        )));
    }
    cabi::write_slice(p.code.cast::<u8>(), code, "program code")?;
    p.code_size = code.len();
    Ok(())
}

extern "C" fn free_blob(blob: *mut PJRT_SerializedExecutable) {
    let _ = std::panic::catch_unwind(|| Blob::release(blob));
}

pub fn serialize(a: &mut PJRT_Executable_Serialize_Args) -> Result<()> {
    let e = view(a.executable.cast_mut())?;
    let blob = Arc::new(Blob(e.serialized.clone()));
    a.serialized_bytes = blob.0.as_ptr().cast();
    a.serialized_bytes_size = blob.0.len();
    a.serialized_executable = blob.into_c();
    a.serialized_executable_deleter = Some(free_blob);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::device_assignment_proto;

    #[test]
    fn device_assignment_bytes_are_the_proto_encoding() {
        // replica_count 1, computation_count 1, computation_devices [{ids [0]}]
        assert_eq!(
            device_assignment_proto(0),
            vec![0x08, 0x01, 0x10, 0x01, 0x1A, 0x03, 0x0A, 0x01, 0x00]
        );
        // a two-byte varint id (300 = 0xAC 0x02)
        assert_eq!(
            device_assignment_proto(300),
            vec![0x08, 0x01, 0x10, 0x01, 0x1A, 0x04, 0x0A, 0x02, 0xAC, 0x02]
        );
    }
}

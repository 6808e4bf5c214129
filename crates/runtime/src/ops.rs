//! The loaded form of a thunk tree: every kernel resolved, every GEMM plan
//! prepared, every unsupported thunk rejected (at load time, naming the kind
//! and `profile_annotation`). Built by [`crate::Executable::load`], run by
//! [`crate::exec`].

use std::collections::HashMap;

use xla_vmm::{
    ComputeCapability, KernelArg, KernelCode, KernelParam, LaunchDims, Plan, Slice, Thunk,
    ThunkKind,
};
use xla_vmm_device::blas::{Epilogue, GemmEngine, GemmPlanId};
use xla_vmm_device::dnn::ConvPlanId;
use xla_vmm_device::fft::FftPlanId;
use xla_vmm_device::{Backend, ImageKind, LaunchConfig, TensorMapDesc};

use crate::collective::CollOp;
use crate::custom_call::CustomCallRegistry;
use crate::error::{Result, RuntimeError};

pub use crate::conv::ConvOpLoaded;
pub use crate::custom_call::{CallOperand, CustomCallOp};
pub use crate::dynamic_slice::Window;
pub use crate::params::ParamSpec;
pub use crate::trsm::TrsmOp;

/// One loaded thunk. (Variants differ in size; ops are built once per load,
/// so boxing the large ones would buy nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Op<B: Backend> {
    Launch {
        name: String,
        function: B::Function,
        config: LaunchConfig,
        params: Vec<ParamSpec>,
        zero: Vec<Slice>,
    },
    /// A cuBLASLt / hipBLASLt matmul ([`crate::gemm`]).
    Gemm(crate::gemm::GemmOp),
    Copy {
        src: Slice,
        dst: Slice,
        bytes: u64,
    },
    Memzero(Slice),
    Memset32 {
        dst: Slice,
        value: u32,
    },
    While {
        name: String,
        condition_result: Slice,
        condition: Vec<Op<B>>,
        body: Vec<Op<B>>,
        trip_count: Option<i64>,
    },
    Conditional {
        name: String,
        index: Slice,
        is_pred: bool,
        branches: Vec<Vec<Op<B>>>,
    },
    Sequential(Vec<Op<B>>),
    DynamicSlice {
        windows: Vec<Window>,
        embedded: Vec<Op<B>>,
    },
    AsyncStart {
        id: u64,
        stream: AsyncStream,
        ops: Vec<Op<B>>,
    },
    AsyncDone {
        id: u64,
    },
    /// A collective over the devices of its clique (see [`crate::collective`]).
    Collective(Box<CollOp>),
    /// `replica_id` / `partition_id`: the u32 id of this device, written by a
    /// 32-bit memset (capturable).
    LogicalId {
        dst: Slice,
        partition: bool,
    },
    /// A typed-FFI custom call, bound to its handler at load
    /// ([`crate::custom_call`]).
    CustomCall(Box<CustomCallOp>),
    /// A triangular solve through the BLAS engine (cuBLAS / rocBLAS trsm).
    Trsm(Box<TrsmOp>),
    /// A cuDNN convolution, its execution plan built at load.
    Conv(Box<ConvOpLoaded>),
    /// A cuFFT / hipFFT transform, its plan made at load ([`crate::fft`]).
    Fft(Box<crate::fft::FftOp>),
    /// Host-offloaded compute ([`crate::host_execute`]).
    HostExecute(Box<crate::host_execute::HostExecuteOp>),
}

/// The stream an async start runs on: an extra compute stream
/// (`Computation(i)`) or a communication stream (`Communication(i)`), each
/// in its own index space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncStream {
    Compute(usize),
    Comm(usize),
}

/// What loading needs besides the plan.
pub struct LoadCtx<'a, B: Backend> {
    pub backend: &'a B,
    pub gemm: Option<&'a dyn GemmEngine<B>>,
    /// The handlers of typed-FFI custom calls.
    pub custom_calls: Option<&'a dyn CustomCallRegistry>,
    /// Loaded modules, owned by the executable.
    pub modules: Vec<B::Module>,
    /// Cubin bytes → index in `modules`.
    pub module_index: HashMap<Vec<u8>, usize>,
    /// The module binary's index in `modules`, once loaded.
    pub main_module: Option<usize>,
    /// Number of extra compute streams the async thunks use.
    pub streams_needed: usize,
    /// Number of communication streams the async thunks use.
    pub comm_streams_needed: usize,
    /// Async execution ids seen.
    pub async_ids: Vec<u64>,
    /// Every collective loaded, in load order (`CollOp::index`).
    pub collectives: Vec<CollOp>,
    /// While building inside an async start on `Communication(i)`: i + 1
    /// (collectives there get their own communicators, as in XLA); else 0.
    pub comm_tag: usize,
    /// Bytes of scratch memory the program's ops take at their offsets
    /// (FFT work areas), allocated with the program.
    pub scratch_bytes: u64,
    /// The library plans prepared so far.
    pub plans: LibraryPlans,
}

/// The library plans (GEMM, convolution, FFT) a program prepared on its
/// engine, released there when the program goes (or fails to load).
#[derive(Debug, Default)]
pub struct LibraryPlans {
    gemm: Vec<GemmPlanId>,
    conv: Vec<ConvPlanId>,
    fft: Vec<FftPlanId>,
}

impl LibraryPlans {
    pub fn release<B: Backend>(&mut self, engine: Option<&dyn GemmEngine<B>>) {
        if let Some(e) = engine {
            self.gemm.drain(..).for_each(|p| e.release(p));
            self.conv.drain(..).for_each(|p| e.release_conv(p));
            self.fft.drain(..).for_each(|p| e.release_fft(p));
        }
    }
}

fn what(t: &Thunk) -> String {
    format!("{} thunk '{}'", t.kind_name(), t.info.profile_annotation)
}

fn dim(v: u64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| RuntimeError::invalid(format!("{what} {v} does not fit u32")))
}

fn launch_config(l: &LaunchDims, pdl: bool) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid: [
            dim(l.blocks.x, "grid.x")?,
            dim(l.blocks.y, "grid.y")?,
            dim(l.blocks.z, "grid.z")?,
        ],
        block: [
            dim(l.threads.x, "block.x")?,
            dim(l.threads.y, "block.y")?,
            dim(l.threads.z, "block.z")?,
        ],
        cluster: match l.cluster {
            Some(c) if c.volume() > 1 => Some([
                dim(c.x, "cluster.x")?,
                dim(c.y, "cluster.y")?,
                dim(c.z, "cluster.z")?,
            ]),
            _ => None,
        },
        shared_mem_bytes: dim(l.shared_memory_bytes, "shared memory")?,
        pdl,
    })
}

fn tma_desc(t: &xla_vmm::TmaDescriptor) -> TensorMapDesc {
    TensorMapDesc {
        element_size: t.element_size,
        global_dims: t.global_dims.clone(),
        global_strides: t.global_strides.clone(),
        box_dims: t.box_dims.clone(),
        element_strides: t.element_strides.clone(),
        interleave: t.interleave,
        swizzle: t.swizzle,
        l2_promotion: t.l2_promotion,
        float_oob_fill: t.float_oob_fill,
    }
}

/// The parameter for kernel argument `a`: its address, or its TMA
/// descriptor when `tma_metadata` names it (XLA's `GetKernelAndArgs`).
fn arg_param(a: &KernelArg) -> ParamSpec {
    match &a.tma {
        Some(t) => ParamSpec::Tma(a.slice, tma_desc(t)),
        None => ParamSpec::Address(a.slice),
    }
}

/// Kernel parameters: one per argument, or per the packing spec (a
/// relocation takes the whole packed argument: 8 address bytes or a
/// 128-byte TMA descriptor).
pub fn param_specs(args: &[KernelArg], packing: Option<&[KernelParam]>) -> Result<Vec<ParamSpec>> {
    match packing {
        None => Ok(args.iter().map(arg_param).collect()),
        Some(spec) => spec
            .iter()
            .map(|p| match p {
                KernelParam::ArgAddress { arg_index } => {
                    args.get(*arg_index as usize).map(arg_param).ok_or_else(|| {
                        RuntimeError::invalid(format!(
                            "packing spec relocates argument {arg_index} of {}",
                            args.len()
                        ))
                    })
                }
                KernelParam::Bytes { data } => Ok(ParamSpec::Bytes(data.to_vec())),
            })
            .collect(),
    }
}

fn zero_slices(args: &[KernelArg], idx: &[u64]) -> Result<Vec<Slice>> {
    idx.iter()
        .map(|&i| {
            args.get(i as usize)
                .map(|a| a.slice)
                .ok_or_else(|| RuntimeError::invalid(format!("zeroed output index {i}")))
        })
        .collect()
}

fn image_kind<B: Backend>(backend: &B) -> ImageKind {
    if backend.info().backend == "host" {
        ImageKind::Host
    } else if backend.info().backend == "hip" {
        ImageKind::Hsaco
    } else {
        ImageKind::Cubin
    }
}

impl<B: Backend> LoadCtx<'_, B> {
    fn module_for(&mut self, bytes: &[u8], kind: ImageKind) -> Result<usize> {
        if let Some(&i) = self.module_index.get(bytes) {
            return Ok(i);
        }
        let m = self.backend.module_load(bytes, kind)?;
        self.modules.push(m);
        let i = self.modules.len() - 1;
        self.module_index.insert(bytes.to_vec(), i);
        Ok(i)
    }

    /// A select_k launch (`None`: nothing to select) on our kernel.
    fn select_k(&mut self, t: &Thunk, loaded: Option<crate::selectk::Loaded>) -> Result<Op<B>> {
        let Some(l) = loaded else {
            return Ok(Op::Sequential(Vec::new()));
        };
        let (image, kind) = crate::selectk::image(self.backend.info().backend)?;
        let module = self.module_for(&image, kind)?;
        let function = self
            .backend
            .module_function(&self.modules[module], l.entry)?;
        Ok(Op::Launch {
            name: t.info.profile_annotation.clone(),
            function,
            config: l.config,
            params: l.params,
            zero: Vec::new(),
        })
    }

    fn main_module(&mut self, plan: &Plan) -> Result<usize> {
        if let Some(i) = self.main_module {
            return Ok(i);
        }
        let i = if !plan.kernels.binary.is_empty() {
            self.module_for(&plan.kernels.binary, image_kind(self.backend))?
        } else if !plan.kernels.asm_text.is_empty() {
            self.module_for(plan.kernels.asm_text.as_bytes(), ImageKind::Ptx)?
        } else {
            return Err(RuntimeError::invalid(
                "kernel thunks but no module binary or PTX in the executable",
            ));
        };
        self.main_module = Some(i);
        Ok(i)
    }

    pub fn build_seq(&mut self, plan: &Plan, thunks: &[Thunk]) -> Result<Vec<Op<B>>> {
        thunks.iter().map(|t| self.build(plan, t)).collect()
    }

    /// Load one thunk (recursively).
    pub fn build(&mut self, plan: &Plan, t: &Thunk) -> Result<Op<B>> {
        let ctx = |e: RuntimeError| match e {
            RuntimeError::Unsupported(m) => RuntimeError::Unsupported(format!("{}: {m}", what(t))),
            RuntimeError::InvalidProgram(m) => {
                RuntimeError::InvalidProgram(format!("{}: {m}", what(t)))
            }
            RuntimeError::Device(d) => RuntimeError::InvalidProgram(format!("{}: {d}", what(t))),
            other => other,
        };
        self.build_inner(plan, t).map_err(ctx)
    }

    fn build_inner(&mut self, plan: &Plan, t: &Thunk) -> Result<Op<B>> {
        Ok(match &t.kind {
            ThunkKind::CustomKernel(k) => self.custom_kernel(plan, t, k)?,
            ThunkKind::SelectK(s) => self.select_k(t, crate::selectk::load(s)?)?,
            ThunkKind::Kernel(k) => self.kernel(plan, t, k)?,
            ThunkKind::CublasLtMatmul(m) => {
                let op = crate::gemm::build(self.gemm, &t.info.profile_annotation, m)?;
                self.plans.gemm.push(op.plan);
                Op::Gemm(op)
            }
            ThunkKind::Convolution(c) => {
                let op = crate::conv::build(self.gemm, &t.info.profile_annotation, c)?;
                self.plans.conv.push(op.plan);
                Op::Conv(Box::new(op))
            }
            ThunkKind::Fft(f) => {
                let name = &t.info.profile_annotation;
                match crate::fft::build(self.gemm, name, f, &mut self.scratch_bytes)? {
                    Some(op) => {
                        self.plans.fft.push(op.plan);
                        Op::Fft(Box::new(op))
                    }
                    None => Op::Sequential(Vec::new()),
                }
            }
            ThunkKind::TriangularSolve(ts) => Op::Trsm(Box::new(crate::trsm::build(
                self.gemm,
                &t.info.profile_annotation,
                ts,
            )?)),
            ThunkKind::Gemm(_) => {
                return Err(RuntimeError::unsupported(
                    "plain cuBLAS gemm (XLA runs it through cublasGemmEx with its own algorithm; \
                     replaying it through cuBLASLt would not be bit-identical)",
                ))
            }
            // A copy to or from the host memory space is the same copy: the
            // runtime places host-space allocations (see `Program::load`) and
            // host-space parameters are device-mapped pinned memory.
            ThunkKind::DeviceToDeviceCopy(c)
            | ThunkKind::Copy(c)
            | ThunkKind::DeviceToHostCopy(c)
            | ThunkKind::HostToDeviceCopy(c) => Op::Copy {
                src: c.source.slice,
                dst: c.destination.slice,
                bytes: c.mem_size,
            },
            ThunkKind::Memzero { dest } => Op::Memzero(dest.slice),
            ThunkKind::Memset32 { dest, value } => {
                if dest.size % 4 != 0 {
                    return Err(RuntimeError::invalid(format!(
                        "memset32 of {} bytes",
                        dest.size
                    )));
                }
                Op::Memset32 {
                    dst: *dest,
                    value: *value,
                }
            }
            ThunkKind::While(w) => Op::While {
                name: t.info.profile_annotation.clone(),
                condition_result: w.condition_result,
                condition: self.build_seq(plan, &w.condition)?,
                body: self.build_seq(plan, &w.body)?,
                trip_count: w.trip_count,
            },
            ThunkKind::Conditional(c) => self.conditional(plan, t, c)?,
            ThunkKind::Sequential { thunks } => Op::Sequential(self.build_seq(plan, thunks)?),
            ThunkKind::DynamicSliceFusion(d) => Op::DynamicSlice {
                windows: crate::dynamic_slice::windows(d)?,
                embedded: self.build_seq(plan, &d.embedded)?,
            },
            ThunkKind::AsyncStart(a) => self.async_start(plan, a)?,
            ThunkKind::AsyncDone { async_execution_id } => Op::AsyncDone {
                id: *async_execution_id,
            },
            // (`check_support` has refused legacy custom calls.)
            ThunkKind::CustomCall(c) => {
                let ordinal = self.backend.info().ordinal;
                Op::CustomCall(Box::new(crate::custom_call::build(
                    self.custom_calls,
                    ordinal,
                    t,
                    c,
                )?))
            }
            ThunkKind::HostExecuteStart(h) => {
                let bind = || crate::custom_call::host_program(self.custom_calls, t, h);
                Op::HostExecute(Box::new(crate::host_execute::build(t, h, bind)?))
            }
            // The start ran to completion on the stream: nothing to wait for.
            ThunkKind::HostExecuteDone { .. } => Op::Sequential(Vec::new()),
            ThunkKind::Collective(c) => self.collective(t, c)?,
            ThunkKind::ReplicaId { dest } | ThunkKind::PartitionId { dest } => {
                logical_id_dest(dest)?;
                Op::LogicalId {
                    dst: *dest,
                    partition: matches!(t.kind, ThunkKind::PartitionId { .. }),
                }
            }
            ThunkKind::Unsupported { .. } => {
                return Err(RuntimeError::unsupported(
                    "thunk kind not executed by this runtime",
                ))
            }
        })
    }

    /// A kernel whose code travels with the thunk (or XLA's in-process
    /// top-k, on our kernel).
    fn custom_kernel(
        &mut self,
        plan: &Plan,
        t: &Thunk,
        k: &xla_vmm::CustomKernelThunk,
    ) -> Result<Op<B>> {
        let module = match &k.spec.code {
            KernelCode::Cubin { data } => self.module_for(data, image_kind(self.backend))?,
            KernelCode::Ptx { text } => self.module_for(text.as_bytes(), ImageKind::Ptx)?,
            KernelCode::InProcessSymbol { persistent_name } => {
                return match crate::selectk::load_xla_top_k(persistent_name, k) {
                    Some(loaded) => self.select_k(t, loaded?),
                    None => Err(RuntimeError::unsupported(format!(
                        "in-process kernel symbol '{persistent_name}'"
                    ))),
                };
            }
            KernelCode::None => self.main_module(plan)?,
        };
        let function = self
            .backend
            .module_function(&self.modules[module], &k.spec.kernel_name)?;
        Ok(Op::Launch {
            name: t.info.profile_annotation.clone(),
            function,
            config: launch_config(&k.launch, k.use_pdl)?,
            params: param_specs(&k.args, k.spec.packing.as_deref())?,
            zero: zero_slices(&k.args, &k.zeroed_output_buffer_indices)?,
        })
    }

    /// A kernel of the module binary.
    fn kernel(&mut self, plan: &Plan, t: &Thunk, k: &xla_vmm::KernelThunk) -> Result<Op<B>> {
        let module = self.main_module(plan)?;
        let function = self
            .backend
            .module_function(&self.modules[module], &k.kernel_name)?;
        Ok(Op::Launch {
            name: t.info.profile_annotation.clone(),
            function,
            config: launch_config(&k.launch, k.use_pdl)?,
            params: param_specs(&k.args, None)?,
            zero: zero_slices(&k.args, &k.zeroed_output_buffer_indices)?,
        })
    }

    /// A conditional: its branches loaded, its index a predicate or an s32.
    fn conditional(
        &mut self,
        plan: &Plan,
        t: &Thunk,
        c: &xla_vmm::ConditionalThunk,
    ) -> Result<Op<B>> {
        let is_pred = c
            .branch_index
            .shape
            .as_ref()
            .is_some_and(|s| s.element_type == xla_vmm::ElementType::PRED);
        Ok(Op::Conditional {
            name: t.info.profile_annotation.clone(),
            index: c.branch_index.slice,
            is_pred,
            branches: c
                .branches
                .iter()
                .map(|b| self.build_seq(plan, b))
                .collect::<Result<_>>()?,
        })
    }

    /// An async start: its stream (counted), its id, its ops loaded (a
    /// communication stream's collectives get their own communicators).
    fn async_start(&mut self, plan: &Plan, a: &xla_vmm::AsyncStartThunk) -> Result<Op<B>> {
        let stream = match a.stream {
            xla_vmm::ExecutionStream::Computation(i) => AsyncStream::Compute(i as usize),
            xla_vmm::ExecutionStream::Default => AsyncStream::Compute(0),
            xla_vmm::ExecutionStream::Communication(i) => AsyncStream::Comm(i as usize),
        };
        match stream {
            AsyncStream::Compute(i) => self.streams_needed = self.streams_needed.max(i + 1),
            AsyncStream::Comm(i) => self.comm_streams_needed = self.comm_streams_needed.max(i + 1),
        }
        if !self.async_ids.contains(&a.async_execution_id) {
            self.async_ids.push(a.async_execution_id);
        }
        let outer = self.comm_tag;
        if let AsyncStream::Comm(i) = stream {
            self.comm_tag = i + 1;
        }
        let ops = self.build_seq(plan, &a.thunks);
        self.comm_tag = outer;
        Ok(Op::AsyncStart {
            id: a.async_execution_id,
            stream,
            ops: ops?,
        })
    }

    /// A collective, in load order, tagged with its async stream.
    fn collective(&mut self, t: &Thunk, c: &xla_vmm::CollectiveThunk) -> Result<Op<B>> {
        let mut op =
            crate::collective::load(&t.info.profile_annotation, c, self.collectives.len())?;
        op.stream_tag = self.comm_tag;
        self.collectives.push(op.clone());
        Ok(Op::Collective(Box::new(op)))
    }
}

/// A replica / partition id is one u32.
fn logical_id_dest(dest: &Slice) -> Result<()> {
    if dest.size != 4 {
        return Err(RuntimeError::invalid(format!(
            "id destination of {} bytes (expected 4)",
            dest.size
        )));
    }
    Ok(())
}

/// What the cuBLASLt path executes: one plain GEMM config, an epilogue
/// cuBLASLt has (XLA rejects SILU too), no auxiliary epilogue output.
fn gemm_support(m: &xla_vmm::CublasLtMatmulThunk) -> std::result::Result<(), String> {
    if m.grouped || m.gemm_config.is_none() {
        return Err("grouped matmul".into());
    }
    let epi = Epilogue::from_proto(m.epilogue).map_err(|e| e.to_string())?;
    if matches!(
        epi,
        Epilogue::Silu
            | Epilogue::SiluWithAux
            | Epilogue::BiasThenSilu
            | Epilogue::BiasThenSiluWithAux
    ) {
        return Err(format!(
            "epilogue {} (cuBLASLt has no SILU epilogue)",
            epilogue_name(m.epilogue)
        ));
    }
    if m.aux.is_some() {
        return Err(format!(
            "epilogue {} with an auxiliary output (not implemented)",
            epilogue_name(m.epilogue)
        ));
    }
    Ok(())
}

fn epilogue_name(e: i32) -> &'static str {
    xla_vmm::BLAS_LT_EPILOGUE_NAMES
        .get(e as usize)
        .copied()
        .unwrap_or("unknown")
}

/// What [`load_check`] looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadCheck {
    /// Kernels found in their code images (function, and on AMDGPU its
    /// kernel descriptor).
    pub kernels: usize,
    /// Distinct code images of the plan's platform.
    pub images: usize,
    /// Kernels left to the PTX JIT at load (not checkable here).
    pub ptx_kernels: usize,
    /// Kernels that take an argument as a TMA descriptor (`tma_metadata`):
    /// XLA's Triton kernels on Hopper and later. A backend without tensor
    /// maps (HIP) cannot launch them.
    pub tma_kernels: usize,
}

/// Is `image` code for `cap`: a cubin for CUDA, an AMDGPU code object of
/// the plan's gfx target for ROCm?
fn check_image(image: &[u8], cap: &ComputeCapability) -> Result<()> {
    let (em, flags) = crate::elf::machine(image)
        .ok_or_else(|| RuntimeError::invalid("a kernel image that is not ELF64"))?;
    match (cap, em) {
        (ComputeCapability::Cuda { .. }, crate::elf::EM_CUDA) => Ok(()),
        (ComputeCapability::Rocm { gcn_arch_name }, crate::elf::EM_AMDGPU) => {
            let want = gcn_arch_name.split(':').next().unwrap_or_default();
            match crate::elf::amdgpu_target(flags) {
                Some(t) if t == want => Ok(()),
                got => Err(RuntimeError::invalid(format!(
                    "a code object for {} (e_flags {flags:#x}) in a program for {gcn_arch_name}",
                    got.unwrap_or("an unknown gfx target")
                ))),
            }
        }
        (ComputeCapability::Unknown, crate::elf::EM_CUDA | crate::elf::EM_AMDGPU) => Ok(()),
        (cap, em) => Err(RuntimeError::invalid(format!(
            "a kernel image of ELF machine {em} in a program for {cap:?}"
        ))),
    }
}

/// The load check, without a device: [`check_support`], then every kernel's
/// code image is of the plan's platform (cubins for CUDA; AMDGPU code
/// objects of its gfx target for ROCm) and defines the kernel, with its
/// kernel descriptor on AMDGPU. What `xla-vmm inspect` reports and CI runs
/// on the CUDA and the ROCm (gfx942) executables.
pub fn load_check(plan: &Plan) -> Result<LoadCheck> {
    check_support(plan)?;
    let mut report = LoadCheck::default();
    let mut images: std::collections::HashSet<*const u8> = Default::default();
    let mut err = None;
    plan.walk(&mut |t, _| {
        if err.is_some() {
            return;
        }
        let args = match &t.kind {
            ThunkKind::CustomKernel(k) => &k.args[..],
            ThunkKind::Kernel(k) => &k.args[..],
            _ => &[],
        };
        report.tma_kernels += usize::from(args.iter().any(|a| a.tma.is_some()));
        let (image, name): (&[u8], &str) = match &t.kind {
            ThunkKind::CustomKernel(k) => match &k.spec.code {
                KernelCode::Cubin { data } => (data, &k.spec.kernel_name),
                KernelCode::Ptx { .. } => {
                    report.ptx_kernels += 1;
                    return;
                }
                // XLA's TopK kernel, run on ours (check_support vetted it).
                KernelCode::InProcessSymbol { .. } => return,
                _ if !plan.kernels.binary.is_empty() => (&plan.kernels.binary, &k.spec.kernel_name),
                _ => {
                    report.ptx_kernels += 1;
                    return;
                }
            },
            ThunkKind::Kernel(k) if !plan.kernels.binary.is_empty() => {
                (&plan.kernels.binary, &k.kernel_name)
            }
            ThunkKind::Kernel(_) => {
                report.ptx_kernels += 1;
                return;
            }
            _ => return,
        };
        let checked = if images.insert(image.as_ptr()) {
            check_image(image, &plan.compute_capability)
        } else {
            Ok(())
        };
        match checked.and_then(|()| crate::elf::check_kernel(image, name)) {
            Ok(()) => report.kernels += 1,
            Err(e) => err = Some(RuntimeError::invalid(format!("{}: {e}", what(t)))),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    report.images = images.len();
    Ok(report)
}

/// The load-time support check without a device: every thunk kind, kernel
/// payload, stream and parameter shape this runtime must handle. `Ok` means
/// loading can only fail on device errors (module load, memory, cuBLASLt)
/// or on a typed-FFI custom call whose handler is not registered.
pub fn check_support(plan: &Plan) -> Result<()> {
    let mut err: Option<RuntimeError> = None;
    plan.walk(&mut |t, _| {
        if err.is_some() {
            return;
        }
        let e = match &t.kind {
            ThunkKind::Unsupported { .. } => {
                Some("thunk kind not executed by this runtime".to_string())
            }
            ThunkKind::CustomCall(c) => crate::custom_call::custom_call_support(c).err(),
            ThunkKind::HostExecuteStart(h) => {
                if h.hlo_module.is_empty() {
                    Some("host compute without its HLO module".to_string())
                } else {
                    crate::host_execute::leaves(&h.args, &h.results)
                        .err()
                        .map(|e| e.to_string())
                }
            }
            ThunkKind::Gemm(_) => Some("plain cuBLAS gemm".to_string()),
            ThunkKind::SelectK(s) => crate::selectk::load(s).err().map(|e| e.to_string()),
            ThunkKind::TriangularSolve(ts) => {
                crate::trsm::trsm_op("", ts).err().map(|e| e.to_string())
            }
            ThunkKind::Convolution(c) => crate::conv::load(&t.info.profile_annotation, c)
                .err()
                .map(|e| e.to_string()),
            ThunkKind::Fft(f) => crate::fft::load(&t.info.profile_annotation, f)
                .err()
                .map(|e| e.to_string()),
            // On ROCm the thunk runs through hipBLASLt (XLA's ROCm path:
            // `device::hip::blaslt`), on CUDA through cuBLASLt.
            ThunkKind::CublasLtMatmul(m) => gemm_support(m).err(),
            ThunkKind::CustomKernel(k) => match &k.spec.code {
                KernelCode::InProcessSymbol { persistent_name } => {
                    match crate::selectk::load_xla_top_k(persistent_name, k) {
                        Some(loaded) => loaded.err().map(|e| e.to_string()),
                        None => Some(format!("in-process kernel symbol '{persistent_name}'")),
                    }
                }
                _ => param_specs(&k.args, k.spec.packing.as_deref())
                    .err()
                    .map(|e| e.to_string()),
            },
            ThunkKind::Kernel(k) => param_specs(&k.args, None).err().map(|e| e.to_string()),
            ThunkKind::Collective(c) => crate::collective::load(&t.info.profile_annotation, c, 0)
                .err()
                .map(|e| e.to_string()),
            ThunkKind::ReplicaId { dest } | ThunkKind::PartitionId { dest } => {
                logical_id_dest(dest).err().map(|e| e.to_string())
            }
            _ => None,
        };
        if let Some(m) = e {
            err = Some(RuntimeError::Unsupported(format!("{}: {m}", what(t))));
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    for a in &plan.allocations {
        match &a.role {
            xla_vmm::AllocationRole::Parameter {
                shape_index,
                number,
                ..
            } if !shape_index.is_empty() => {
                return Err(RuntimeError::unsupported(format!(
                    "tuple-shaped parameter {number}"
                )))
            }
            xla_vmm::AllocationRole::Constant { .. } => {
                constant_bytes(plan, a.index)?;
            }
            _ => {}
        }
    }
    crate::host_execute::check_pairs(plan)
}

/// The initial bytes of constant allocation `index`: its recorded content
/// (from the proto, or filled from the HLO module by the decoder), else the
/// initializer of its global `symbol_name` in the module binary or a custom
/// kernel's cubin.
pub fn constant_bytes(plan: &Plan, index: usize) -> Result<Vec<u8>> {
    let a = plan
        .allocations
        .get(index)
        .ok_or_else(|| RuntimeError::invalid(format!("allocation {index}")))?;
    let xla_vmm::AllocationRole::Constant { bytes, symbol_name } = &a.role else {
        return Err(RuntimeError::invalid(format!(
            "allocation {index} is not a constant"
        )));
    };
    if bytes.len() as u64 == a.size {
        return Ok(bytes.to_vec());
    }
    // A constant XLA inlined into its kernels keeps its allocation, without
    // a global or a content; when no thunk reads the allocation its bytes do
    // not matter (seen in sort, argsort and top-k programs).
    if !plan
        .thunks
        .iter()
        .any(|t| t.reads().iter().any(|s| s.allocation == index))
    {
        return Ok(vec![0; a.size as usize]);
    }
    let mut images: Vec<&[u8]> = vec![&plan.kernels.binary];
    images.extend(plan.custom_kernel_binaries().into_iter().map(|(_, b)| b));
    // An empty name would match the ELF's null symbol.
    if symbol_name.is_empty() {
        images.clear();
    }
    for image in images {
        if let Some(v) = crate::elf::global_bytes(image, symbol_name)? {
            if (v.len() as u64) < a.size {
                return Err(RuntimeError::invalid(format!(
                    "constant '{symbol_name}': global has {} bytes, allocation {index} {}",
                    v.len(),
                    a.size
                )));
            }
            return Ok(v[..a.size as usize].to_vec());
        }
    }
    Err(RuntimeError::unsupported(format!(
        "constant allocation {index} ('{symbol_name}'): no content and no initialized global in \
         the module images, and the executable's HLO module does not name it"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm::{Blob, TmaDescriptor};

    fn arg(allocation: usize, tma: Option<TmaDescriptor>) -> KernelArg {
        KernelArg {
            slice: Slice {
                allocation,
                offset: 0,
                size: 64,
            },
            shape: None,
            written: false,
            tma,
        }
    }

    #[test]
    fn params_follow_the_packing_spec_and_tma_metadata() {
        let tma = TmaDescriptor {
            element_size: 2,
            global_dims: vec![32, 2],
            global_strides: vec![64],
            box_dims: vec![16, 1],
            element_strides: vec![1, 1],
            interleave: 0,
            swizzle: 3,
            l2_promotion: 2,
            float_oob_fill: 0,
        };
        let args = vec![arg(0, None), arg(1, Some(tma))];
        let plain = param_specs(&args, None).unwrap();
        assert_eq!(plain[0], ParamSpec::Address(args[0].slice));
        match &plain[1] {
            ParamSpec::Tma(s, d) => {
                assert_eq!(*s, args[1].slice);
                assert_eq!((d.element_size, d.swizzle, d.l2_promotion), (2, 3, 2));
                assert_eq!(d.global_strides, vec![64]);
            }
            other => panic!("{other:?}"),
        }
        // Packed: the TMA argument first, a constant, then argument 0.
        let spec = vec![
            KernelParam::ArgAddress { arg_index: 1 },
            KernelParam::Bytes {
                data: Blob(vec![7, 0, 0, 0]),
            },
            KernelParam::ArgAddress { arg_index: 0 },
        ];
        let packed = param_specs(&args, Some(&spec)).unwrap();
        assert!(matches!(packed[0], ParamSpec::Tma(..)));
        assert_eq!(packed[1], ParamSpec::Bytes(vec![7, 0, 0, 0]));
        assert_eq!(packed[2], ParamSpec::Address(args[0].slice));
        let bad = vec![KernelParam::ArgAddress { arg_index: 2 }];
        assert!(param_specs(&args, Some(&bad)).is_err());
    }
}

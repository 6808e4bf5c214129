//! The thunk tree, mirroring `xla.gpu.ThunkProto`
//! (xla/backends/gpu/runtime/thunk.proto). A thunk is one step of the
//! program (a kernel launch, a copy, a loop, ...); thunks run in order on
//! the main stream unless an `AsyncStart` moves a sequence to another one.

use serde::Serialize;

use super::{
    Blob, BufferAllocation, CollectiveThunk, ConvolutionThunk, ElementType, FftThunk, GemmConfig,
    KernelArg, KernelSpec, LaunchDims, Shape, ShapedSlice, Slice,
};

/// `ThunkInfoProto`: what every thunk carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThunkInfo {
    /// `profile_annotation`: usually the HLO instruction name the thunk was
    /// emitted for (e.g. `"loop_fusion.3"`); shows in profiles and errors.
    pub profile_annotation: String,
    /// `thunk_id`: XLA's id, unique within the executable.
    pub thunk_id: i64,
    /// `concurrent_region_id`: only set in XLA's concurrent-regions mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_region_id: Option<i64>,
}

/// One thunk: its info plus what it does.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Thunk {
    pub info: ThunkInfo,
    pub kind: ThunkKind,
}

/// One variant per `ThunkProto.impl` kind we execute, plus `Unsupported`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ThunkKind {
    /// `custom_kernel_thunk` (36): launch a kernel whose code travels with
    /// the thunk (Triton, cuDNN-free custom fusions).
    CustomKernel(CustomKernelThunk),
    /// `kernel_thunk` (8): launch kernel `kernel_name` from the module
    /// binary (`Plan::kernels.binary` / `asm_text`).
    Kernel(KernelThunk),
    /// `cublas_lt_matmul_thunk` (22).
    CublasLtMatmul(Box<CublasLtMatmulThunk>),
    /// `gemm_thunk` (9): a plain cuBLAS / hipBLAS gemm.
    Gemm(Box<GemmThunk>),
    /// `triangular_solve_thunk` (11): BLAS trsm, in place in `b`.
    TriangularSolve(Box<TriangularSolveThunk>),
    /// `convolution_thunk` (25): a cuDNN convolution.
    Convolution(Box<ConvolutionThunk>),
    /// `fft_thunk` (27): a cuFFT / hipFFT transform.
    Fft(Box<FftThunk>),
    /// `device_to_device_copy_thunk` (13).
    DeviceToDeviceCopy(CopyThunk),
    /// `device_to_host_copy_thunk` (4): a copy into XLA's host memory space
    /// (host offload, `device_put` to `pinned_host` in a program). XLA runs
    /// it as a memcpy on the thunk's stream, like the device copy.
    DeviceToHostCopy(CopyThunk),
    /// `host_to_device_copy_thunk` (5): the copy back from the host space.
    HostToDeviceCopy(CopyThunk),
    /// `copy_thunk` (3): device-to-device copy (generic form).
    Copy(CopyThunk),
    /// `memzero_thunk` (19): set `dest` to zero bytes.
    Memzero { dest: ShapedSlice },
    /// `select_k_thunk` (20): per-row top k (XLA's TopK when its emitter
    /// picks raft's select_k).
    SelectK(SelectKThunk),
    /// `memset32bit_value_thunk` (28): fill `dest` with the 32-bit `value`
    /// repeated (`dest.size` is a multiple of 4).
    Memset32 { dest: Slice, value: u32 },
    /// `while_thunk` (7).
    While(WhileThunk),
    /// `conditional_thunk` (6).
    Conditional(ConditionalThunk),
    /// `sequential_thunk` (2): run the thunks in order.
    Sequential { thunks: Vec<Thunk> },
    /// `dynamic_slice_fusion_thunk` (60).
    DynamicSliceFusion(DynamicSliceFusionThunk),
    /// `async_start_thunk` (57).
    AsyncStart(AsyncStartThunk),
    /// `async_done_thunk` (58): make the main stream wait for the work of
    /// the `AsyncStart` with the same `async_execution_id`.
    AsyncDone { async_execution_id: u64 },
    /// `custom_call_thunk` (30).
    CustomCall(CustomCallThunk),
    /// `host_execute_start_thunk` (16): host-offloaded compute
    /// (`compute_on("device_host")`), a program compiled for the host that
    /// reads `args` and writes `results`.
    HostExecuteStart(Box<HostExecuteStartThunk>),
    /// `host_execute_done_thunk` (17): later work waits for the results of
    /// the start with the same `async_events_unique_id`.
    HostExecuteDone { async_events_unique_id: u64 },
    /// `all_gather_thunk` (38), `all_reduce_thunk` (39),
    /// `reduce_scatter_thunk` (40), `all_to_all_thunk` (41),
    /// `collective_permute_thunk` (43), `collective_broadcast_thunk` (46).
    Collective(Box<CollectiveThunk>),
    /// `replica_id_thunk` (12): write this device's replica id (a U32) to
    /// `dest`.
    ReplicaId { dest: Slice },
    /// `partition_id_thunk` (14): write this device's partition id (a U32)
    /// to `dest`.
    PartitionId { dest: Slice },
    /// Any other `ThunkProto` kind (send / recv, ragged all-to-all, cuDNN, infeed, FFT, ... or
    /// a field number this build does not know). Executing a plan that
    /// contains one must fail at load time with this information.
    Unsupported {
        /// The `ThunkProto` oneof field name without `_thunk` (e.g.
        /// `"all_reduce"`), or `"unknown"` when the field number is not in
        /// our table of XLA's kinds.
        kind_name: String,
        /// The `ThunkProto` field number of the kind (0 = no kind set).
        field_number: u32,
    },
}

/// `CustomKernelThunkProto`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CustomKernelThunk {
    /// `CustomKernelProto.name`: a display name of the kernel.
    pub name: String,
    /// The kernel code, its symbol name and parameter packing.
    pub spec: KernelSpec,
    /// Buffer arguments, in XLA order (inputs then outputs).
    pub args: Vec<KernelArg>,
    /// `block_dims` / `thread_dims` / `cluster_dim` / `shared_memory_bytes`.
    pub launch: LaunchDims,
    /// `use_pdl`: launch with programmatic dependent launch allowed.
    pub use_pdl: bool,
    /// Indices into `args` whose slices must be zeroed before the launch.
    pub zeroed_output_buffer_indices: Vec<u64>,
}

/// `KernelThunkProto`: a kernel of the module binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelThunk {
    /// Symbol name of the kernel in the module (`Plan::kernels`).
    pub kernel_name: String,
    /// Buffer arguments, one pointer (or TMA descriptor) each, in order.
    pub args: Vec<KernelArg>,
    pub launch: LaunchDims,
    pub use_pdl: bool,
    /// Indices into `args` whose slices must be zeroed before the launch.
    pub zeroed_output_buffer_indices: Vec<u64>,
}

/// `CublasLtMatmulThunkProto`: `d = epilogue(alpha * a @ b + beta * c)`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CublasLtMatmulThunk {
    /// `gemm_config`; `None` for grouped matmuls (not supported by us).
    pub gemm_config: Option<GemmConfig>,
    /// The proto carried a `grouped_gemm_config` instead.
    pub grouped: bool,
    /// `xla.BlasLtEpilogueProto` number (see `BLAS_LT_EPILOGUE_NAMES`).
    pub epilogue: i32,
    /// Index of the chosen algorithm among those cublasLt's heuristic
    /// returns for this problem (XLA's autotuner picked it).
    pub algorithm_idx: i64,
    /// `canonical_hlo`: the HLO text used as the autotuning cache key.
    pub canonical_hlo: String,
    pub a: ShapedSlice,
    pub b: ShapedSlice,
    /// Read when `beta != 0`; often the same slice as `d`.
    pub c: ShapedSlice,
    /// The output.
    pub d: ShapedSlice,
    pub bias: Option<ShapedSlice>,
    /// Auxiliary output of `*_WITH_AUX` epilogues (written).
    pub aux: Option<ShapedSlice>,
    pub a_scale: Option<ShapedSlice>,
    pub b_scale: Option<ShapedSlice>,
    pub c_scale: Option<ShapedSlice>,
    pub d_scale: Option<ShapedSlice>,
    /// Written: max |d| (fp8).
    pub d_amax: Option<ShapedSlice>,
    /// Scratch space for cublasLt (its whole size may be used).
    pub workspace: Option<ShapedSlice>,
    pub group_sizes: Option<ShapedSlice>,
    pub autotune_workspace_size: i64,
}

/// `GemmThunkProto`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GemmThunk {
    pub config: GemmConfig,
    pub lhs: Slice,
    pub rhs: Slice,
    pub output: Slice,
    pub workspace: Option<Slice>,
    pub deterministic: bool,
}

/// How a triangular solve uses `a` (`TriangularSolveOptions.transpose_a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SolveTranspose {
    NoTranspose,
    Transpose,
    /// Conjugate transpose.
    Adjoint,
}

/// `TriangularSolveThunkProto`: solves `op(a) x = b` (`left_side`) or
/// `x op(a) = b` for x, in place in `b`, for every matrix of `b`'s batch
/// (all dimensions but the last two). The matrices are column-major (XLA's
/// layout assignment makes them so): `m` = `b`'s second-to-last dimension,
/// `n` = its last, `a` is m×m (left side) or n×n. With a batch, `temp`
/// holds the two arrays of per-matrix pointers cuBLAS's batched solve reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TriangularSolveThunk {
    pub left_side: bool,
    pub lower: bool,
    pub unit_diagonal: bool,
    pub transpose_a: SolveTranspose,
    pub a: ShapedSlice,
    pub b: ShapedSlice,
    pub temp: ShapedSlice,
    /// XLA `PrimitiveType` number of `b`'s elements.
    pub element_type: ElementType,
    /// Product of `b`'s batch dimensions (1 without any).
    pub batch: i64,
    pub m: i64,
    pub n: i64,
}

impl TriangularSolveThunk {
    /// Bytes between consecutive matrices of `a` (`None` on overflow).
    pub fn a_batch_stride(&self, element_bytes: u64) -> Option<u64> {
        let k = u64::try_from(if self.left_side { self.m } else { self.n }).ok()?;
        k.checked_mul(k)?.checked_mul(element_bytes)
    }

    /// Bytes between consecutive matrices of `b` (`None` on overflow).
    pub fn b_batch_stride(&self, element_bytes: u64) -> Option<u64> {
        let (m, n) = (u64::try_from(self.m).ok()?, u64::try_from(self.n).ok()?);
        m.checked_mul(n)?.checked_mul(element_bytes)
    }
}

/// `CopyThunkProto` (also the payload of `DeviceToDeviceCopyThunkProto`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CopyThunk {
    pub source: ShapedSlice,
    pub destination: ShapedSlice,
    /// Number of bytes to copy (`mem_size`).
    pub mem_size: u64,
}

/// `WhileThunkProto`: `loop { run condition; if !*pred { break }; run body }`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhileThunk {
    /// `condition_result_buffer_index`: the slice where the condition writes
    /// its `PRED` (1 byte); the host reads it after each condition run.
    pub condition_result: Slice,
    pub condition: Vec<Thunk>,
    pub body: Vec<Thunk>,
    /// `trip_count`: when XLA proved the loop runs exactly this many times.
    /// XLA then runs the body exactly `trip_count` times and never runs the
    /// condition (nor reads `condition_result`).
    pub trip_count: Option<i64>,
}

/// `ConditionalThunkProto`: run branch `*branch_index` (an S32 index,
/// clamped to the last branch when out of range, or a PRED where true = 0
/// and false = 1 as in XLA).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConditionalThunk {
    pub branch_index: ShapedSlice,
    pub branches: Vec<Vec<Thunk>>,
}

/// Which stream an `AsyncStart` sends its work to (`execution_stream_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum ExecutionStream {
    /// `computation_stream_id`: an extra compute stream.
    Computation(u64),
    /// `communication_stream_id`: a collectives stream.
    Communication(u64),
    /// Not set.
    Default,
}

/// `AsyncStartThunkProto`: run `thunks` on `stream`, concurrently with the
/// main stream, after the main stream's previous work; the matching
/// `AsyncDone` joins it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AsyncStartThunk {
    pub async_execution_id: u64,
    pub stream: ExecutionStream,
    pub thunks: Vec<Thunk>,
}

/// `CustomCallThunkProto`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CustomCallThunk {
    pub target_name: String,
    /// Operands (read); `None` = a null operand slot.
    pub operands: Vec<Option<ShapedSlice>>,
    /// Results (written); `None` = a null result slot.
    pub results: Vec<Option<ShapedSlice>>,
    /// Legacy custom-call opaque string.
    pub opaque: Blob,
    /// `CustomCallApiVersion` number (4 = typed FFI).
    pub api_version: i32,
    /// The typed-FFI attributes, sorted by name.
    pub attributes: super::FfiAttrs,
    pub called_computation: Option<String>,
    pub use_pdl: bool,
}

/// `SelectKThunkProto`: for each of `batch` rows of `num_elements`
/// elements of `element_type` in `input`, the `k` largest in descending
/// order to `values` (`[batch, k]`, the input's type) and their indices to
/// `indices` (`[batch, k]`, S32).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SelectKThunk {
    pub input: Slice,
    pub values: Slice,
    pub indices: Slice,
    pub batch: u32,
    pub num_elements: u32,
    pub k: u32,
    pub element_type: ElementType,
}

/// `HostExecuteStartThunkProto` with its `HostOffloadingExecutableProto`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostExecuteStartThunk {
    /// `hlo_module`: the host computation as its own `xla.HloModuleProto`
    /// (its bytes; XLA extracts it from the program, with the program's
    /// entry layouts and no alias config).
    pub hlo_module: Blob,
    /// `executable_type`: 1 PJRT, 2 NanoRt (what XLA's GPU compiler emits).
    pub executable_type: i32,
    /// `aot_compilation_result`: XLA:CPU's ahead-of-time compile of the
    /// module (an `xla.cpu.CompilationResultProto`: native code for the
    /// compiling host, the code XLA's own host thunk runs), when present.
    pub aot_result: Option<Blob>,
    /// One per leaf of each operand, in operand order.
    pub args: Vec<ShapedSlice>,
    /// One per leaf of the result.
    pub results: Vec<ShapedSlice>,
    pub async_events_unique_id: u64,
}

/// `DynamicSliceFusionThunkProto`: run `embedded` thunks against synthetic
/// allocations that are windows into the real parameter / result buffers;
/// the window offsets may depend on the iteration of enclosing while loops.
///
/// The embedded thunks' slices index `embedded_allocations`, NOT the plan's
/// allocation table: entry `i < parameters.len()` is a window into
/// `parameter_buffers[parameters[i].parameter_number]`, entry
/// `parameters.len() + j` a window into
/// `result_buffers[results[j].result_number]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DynamicSliceFusionThunk {
    pub parameters: Vec<DsfParameter>,
    pub results: Vec<DsfResult>,
    /// Real slices of the fusion operands, indexed by fusion parameter number.
    pub parameter_buffers: Vec<Slice>,
    /// Real slices of the fusion results (leaves in DFS order).
    pub result_buffers: Vec<Slice>,
    /// `slice_allocations`: the synthetic allocations (their `size` is the
    /// window size).
    pub embedded_allocations: Vec<BufferAllocation>,
    pub embedded: Vec<Thunk>,
    pub verify_offsets: bool,
}

/// `DynamicSliceConfig`: byte offset of a window =
/// `byte_offset + loop_iteration[loop_index] * byte_stride` (loop index 0 =
/// innermost enclosing while loop), clamped so the window stays inside the
/// buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DynamicSliceConfig {
    pub loop_index: Option<i64>,
    pub byte_offset: i64,
    pub byte_stride: i64,
}

/// `OffsetExprProto`: one element-index offset, an expression over constants
/// and fusion parameters (scalars read from device memory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OffsetExpr {
    /// `Kind`: 1 constant, 2 parameter, 3 add, 4 subtract, 5 multiply,
    /// 6 compare, 7 select.
    pub kind: i32,
    /// The constant (CONSTANT) or the fusion parameter number (PARAMETER).
    pub value: i64,
    /// `CompareDirection` for COMPARE: 1 EQ, 2 NE, 3 GE, 4 GT, 5 LE, 6 LT.
    pub compare_direction: i32,
    pub operands: Vec<OffsetExpr>,
}

/// `OffsetProto`: the start index of one dimension.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DsfOffset {
    pub dimension: i64,
    pub expr: Option<OffsetExpr>,
}

/// `ParameterProto`: a sliced operand of the hero instruction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DsfParameter {
    /// Fusion parameter number (index into `parameter_buffers`).
    pub parameter_number: u64,
    pub parameter_shape: Option<Shape>,
    pub slice_shape: Option<Shape>,
    /// Static description of the window offset, when XLA could derive one.
    pub slice_config: Option<DynamicSliceConfig>,
    pub slice_offsets: Vec<DsfOffset>,
}

/// `ResultProto`: a result of the hero instruction (possibly written
/// through a dynamic-update-slice window).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DsfResult {
    /// The fusion parameter the update writes into in place, if any.
    pub parameter_number: Option<i64>,
    /// Index into `result_buffers`.
    pub result_number: u64,
    pub result_shape: Option<Shape>,
    pub update_shape: Option<Shape>,
    pub update_config: Option<DynamicSliceConfig>,
    pub update_offsets: Vec<DsfOffset>,
}

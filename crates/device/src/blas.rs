//! Backend-agnostic GEMM description (what XLA's `GemmConfig` says) and the
//! engine interface the runtime calls for `cublas_lt_matmul` thunks.
//!
//! The plan-setup rules mirror XLA's (`stream_executor/gpu/gpu_blas_lt.cc`,
//! `cuda/cuda_blas_lt.cc`) so that the heuristic query sees exactly the same
//! descriptors and `algorithm_idx` selects the same algorithm:
//! - batch sizes of lhs/rhs are both set to the larger one;
//! - a row-major output is made column-major by swapping the operands and
//!   transposing every layout ([`make_output_column_major`]);
//! - the computation type comes from the config, else from the precision
//!   algorithm and types ([`blas_computation_type`]);
//! - the scale type is f32 for an f32 computation (unless c is c64), else
//!   the output type ([`scale_type`]).
//!
//! The engine also runs XLA's triangular solves ([`TrsmSpec`]: cuBLAS /
//! rocBLAS `?trsm`, through `trsm_lib`) and its convolutions
//! ([`crate::dnn::ConvSpec`]: cuDNN's backend API, `cuda::cudnn`).
//!
//! This file holds only plain data and pure functions; `cuda::blaslt` does
//! the cuBLASLt calls.

use crate::backend::{Backend, DevicePtr};
use crate::dnn::{ConvArgs, ConvPlanId, ConvSpec};
use crate::error::{DeviceError, Result};
use crate::fft::{FftArgs, FftPlanId, FftSpec};

pub use crate::xla_type;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Order {
    RowMajor,
    ColumnMajor,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Transpose {
    NoTranspose,
    Transpose,
    ConjugateTranspose,
}

/// `GemmConfigProto.MatrixLayout`, values taken as given by the proto.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MatrixLayout {
    /// XLA `PrimitiveType` number.
    pub dtype: i32,
    pub num_rows: i64,
    pub num_cols: i64,
    pub order: Order,
    pub batch_size: i64,
    pub leading_dim_stride: i64,
    pub batch_stride: i64,
    pub transpose: Transpose,
}

impl MatrixLayout {
    /// XLA's `MatrixLayout::Transpose`: swap rows/cols and flip the order
    /// (the `transpose` flag is left alone).
    pub fn transpose_layout(&mut self) {
        std::mem::swap(&mut self.num_rows, &mut self.num_cols);
        self.order = match self.order {
            Order::RowMajor => Order::ColumnMajor,
            Order::ColumnMajor => Order::RowMajor,
        };
    }
}

/// `se::blas::ComputationType`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ComputationType {
    F16,
    F32,
    F64,
    I32,
    F16AsF32,
    BF16AsF32,
    TF32AsF32,
}

impl ComputationType {
    /// From `xla.BlasComputationTypeProto`; `None` for UNSET (0).
    pub fn from_proto(v: i32) -> Result<Option<Self>> {
        Ok(Some(match v {
            0 => return Ok(None),
            1 => Self::F16,
            2 => Self::F32,
            3 => Self::F64,
            4 => Self::I32,
            5 => Self::F16AsF32,
            6 => Self::BF16AsF32,
            7 => Self::TF32AsF32,
            other => {
                return Err(DeviceError::Unsupported(format!(
                    "BlasComputationTypeProto {other}"
                )))
            }
        }))
    }
}

/// `BlasLtEpilogueProto` (only the kinds cuBLASLt supports are accepted by
/// the engine; SILU variants are rejected there, as in XLA).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Epilogue {
    Default,
    Relu,
    Bias,
    BiasThenRelu,
    Gelu,
    Silu,
    SiluWithAux,
    GeluWithAux,
    BiasThenGelu,
    BiasThenSilu,
    BiasThenGeluWithAux,
    BiasThenSiluWithAux,
}

impl Epilogue {
    pub fn from_proto(v: i32) -> Result<Self> {
        use Epilogue::*;
        Ok(match v {
            0 => Default,
            1 => Relu,
            2 => Bias,
            3 => BiasThenRelu,
            4 => Gelu,
            5 => Silu,
            6 => SiluWithAux,
            7 => GeluWithAux,
            8 => BiasThenGelu,
            9 => BiasThenSilu,
            10 => BiasThenGeluWithAux,
            11 => BiasThenSiluWithAux,
            other => {
                return Err(DeviceError::Unsupported(format!(
                    "BlasLtEpilogueProto {other}"
                )))
            }
        })
    }
}

/// `xla::gpu::GemmConfig` as the plan needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmConfig {
    pub lhs: MatrixLayout,
    pub rhs: MatrixLayout,
    pub c: MatrixLayout,
    pub output: MatrixLayout,
    pub alpha_real: f64,
    pub alpha_imag: f64,
    pub beta: f64,
    pub compute_precision: i64,
    /// `xla.PrecisionConfig.Algorithm` number (0 = ALG_UNSET).
    pub precision_algorithm: i32,
    pub compute_type: Option<ComputationType>,
}

/// Descriptors as handed to the BLAS library after XLA's normalization.
#[derive(Clone, Debug, PartialEq)]
pub struct NormalizedGemm {
    pub a: MatrixLayout,
    pub b: MatrixLayout,
    pub c: MatrixLayout,
    pub d: MatrixLayout,
    pub compute_type: ComputationType,
    /// XLA `PrimitiveType` of alpha/beta.
    pub scale_type: i32,
    pub trans_a: Transpose,
    pub trans_b: Transpose,
    /// Operands a/b (and their scales) are swapped at execution time.
    pub swap_operands: bool,
    pub fast_accum: bool,
    pub alpha_real: f64,
    pub alpha_imag: f64,
    pub beta: f64,
}

fn is_f8(t: i32) -> bool {
    matches!(t, 19 | 20 | 23 | 24 | 25 | 28 | 29 | 32 | 33)
}

/// XLA's `MakeOutputColumnMajor`: returns whether the operands were swapped.
pub fn make_output_column_major(
    lhs: &mut MatrixLayout,
    rhs: &mut MatrixLayout,
    output: &mut MatrixLayout,
    c: &mut MatrixLayout,
) -> bool {
    let swap = output.order != Order::ColumnMajor;
    if swap {
        std::mem::swap(lhs, rhs);
        rhs.transpose_layout();
        lhs.transpose_layout();
        c.transpose_layout();
        output.transpose_layout();
    }
    swap
}

/// XLA's `GetBlasComputationType` for ALG_UNSET plus the explicit
/// algorithms (`algorithm_util::GetBlasComputationType`). `tf32_enabled` is
/// `tsl::tensor_float_32_execution_enabled()` (true by default in JAX).
pub fn blas_computation_type(
    precision_algorithm: i32,
    lhs_dtype: i32,
    output_dtype: i32,
    compute_precision: i64,
    tf32_enabled: bool,
) -> Result<ComputationType> {
    use xla_type::*;
    if precision_algorithm == 0 {
        return match output_dtype {
            t if is_f8(t) || t == F16 || t == BF16 => Ok(ComputationType::F32),
            F32 | C64 => {
                if tf32_enabled && compute_precision <= 1 && lhs_dtype == output_dtype {
                    Ok(ComputationType::TF32AsF32)
                } else {
                    Ok(ComputationType::F32)
                }
            }
            F64 | C128 => Ok(ComputationType::F64),
            S32 => Ok(ComputationType::I32),
            other => Err(DeviceError::Unsupported(format!(
                "GEMM output type {other} (XLA PrimitiveType)"
            ))),
        };
    }
    match precision_algorithm {
        3 => Ok(ComputationType::F16),
        6 => Ok(ComputationType::BF16AsF32),
        1 | 2 | 4 | 7 | 8 | 13 | 11 | 10 => Ok(ComputationType::F32),
        9 => Ok(ComputationType::TF32AsF32),
        12 => Ok(ComputationType::F64),
        other => Err(DeviceError::Unsupported(format!(
            "GEMM precision algorithm {other}"
        ))),
    }
}

/// XLA's `GetScaleType`.
pub fn scale_type(output_dtype: i32, compute: ComputationType) -> i32 {
    if compute == ComputationType::F32 && output_dtype != xla_type::C64 {
        xla_type::F32
    } else {
        output_dtype
    }
}

/// Apply XLA's plan setup to a config (everything `GetMatmulPlan` does
/// before creating descriptors).
pub fn normalize(cfg: &GemmConfig, tf32_enabled: bool) -> Result<NormalizedGemm> {
    let (mut lhs, mut rhs, mut output, mut c) = (cfg.lhs, cfg.rhs, cfg.output, cfg.c);
    let batch = lhs.batch_size.max(rhs.batch_size);
    lhs.batch_size = batch;
    rhs.batch_size = batch;
    let swap = make_output_column_major(&mut lhs, &mut rhs, &mut output, &mut c);
    let compute_type = match cfg.compute_type {
        Some(t) => t,
        None => blas_computation_type(
            cfg.precision_algorithm,
            lhs.dtype,
            output.dtype,
            cfg.compute_precision,
            tf32_enabled,
        )?,
    };
    let fast_accum = if cfg.precision_algorithm == 0 {
        (is_f8(lhs.dtype) || is_f8(rhs.dtype)) && cfg.compute_precision == 0
    } else {
        cfg.precision_algorithm == 2
    };
    Ok(NormalizedGemm {
        trans_a: lhs.transpose,
        trans_b: rhs.transpose,
        scale_type: scale_type(output.dtype, compute_type),
        a: lhs,
        b: rhs,
        c,
        d: output,
        compute_type,
        swap_operands: swap,
        fast_accum,
        alpha_real: cfg.alpha_real,
        alpha_imag: cfg.alpha_imag,
        beta: cfg.beta,
    })
}

/// Device buffers of one matmul (null = absent).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MatmulArgs {
    pub a: DevicePtr,
    pub b: DevicePtr,
    pub c: DevicePtr,
    pub d: DevicePtr,
    pub bias: DevicePtr,
    pub aux: DevicePtr,
    pub a_scale: DevicePtr,
    pub b_scale: DevicePtr,
    pub c_scale: DevicePtr,
    pub d_scale: DevicePtr,
    pub d_amax: DevicePtr,
    pub workspace: DevicePtr,
    pub workspace_bytes: u64,
}

/// A triangular solve as XLA's `RunTriangularSolve` hands it to the BLAS
/// library: `op(a) x = alpha b` (left side) or `x op(a) = alpha b`, alpha =
/// 1, solved in place in b; column-major matrices, `lda` = m (left) or n,
/// `ldb` = m.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TrsmSpec {
    pub left_side: bool,
    pub lower: bool,
    pub unit_diagonal: bool,
    pub transpose: Transpose,
    /// XLA `PrimitiveType`: F32, F64, C64 or C128.
    pub dtype: i32,
    pub m: i32,
    pub n: i32,
    /// Matrices solved; more than one goes through the batched entry point.
    pub batch: i32,
}

impl TrsmSpec {
    /// The element types a BLAS solves in (XLA `PrimitiveType`), in the
    /// order of its `s`, `d`, `c`, `z` entry points.
    pub const TYPES: [i32; 4] = [xla_type::F32, xla_type::F64, xla_type::C64, xla_type::C128];

    /// The leading dimension of `a`.
    pub fn lda(&self) -> i32 {
        if self.left_side {
            self.m
        } else {
            self.n
        }
    }

    /// Is there anything to solve (the BLAS rejects a leading dimension of
    /// 0, and a solve with no element writes nothing).
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }
}

/// The device operands of one solve.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TrsmArgs {
    /// `batch` is 1: the matrices themselves.
    Single { a: DevicePtr, b: DevicePtr },
    /// Arrays of `batch` device pointers to the matrices of a and of b.
    Batched {
        a_ptrs: DevicePtr,
        b_ptrs: DevicePtr,
    },
}

/// The library plans an engine keeps, by kind ([`GemmEngine::live_plans`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LivePlans {
    pub gemm: usize,
    pub conv: usize,
    pub fft: usize,
}

/// A prepared matmul: descriptors built, algorithm chosen. Its key in the
/// engine's table.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmPlanId(pub usize);

/// An engine's prepared plans (GEMM or convolution) by id, held while a
/// loaded program uses them: ids are never reused, so a stale one is an
/// error, not another program's plan.
pub struct PlanTable<T> {
    inner: std::sync::Mutex<(std::collections::HashMap<usize, std::sync::Arc<T>>, usize)>,
}

impl<T> Default for PlanTable<T> {
    fn default() -> Self {
        PlanTable {
            inner: std::sync::Mutex::new((std::collections::HashMap::new(), 0)),
        }
    }
}

impl<T> PlanTable<T> {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, (std::collections::HashMap<usize, std::sync::Arc<T>>, usize)>
    {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `plan`; its id.
    pub fn insert(&self, plan: T) -> usize {
        let mut g = self.lock();
        let id = g.1;
        g.1 += 1;
        g.0.insert(id, std::sync::Arc::new(plan));
        id
    }

    /// The plan `id` (`what` names its kind in the error).
    pub fn get(&self, id: usize, what: &str) -> Result<std::sync::Arc<T>> {
        self.lock()
            .0
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no {what} plan {id}")))
    }

    /// Let plan `id` go (a run in flight keeps its own reference).
    pub fn remove(&self, id: usize) {
        self.lock().0.remove(&id);
    }

    /// Plans kept.
    pub fn len(&self) -> usize {
        self.lock().0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the runtime needs from a BLAS-Lt library (and, for triangular
/// solves, its BLAS) for backend `B`.
///
/// `prepare` runs at load time: it builds descriptors with XLA's rules,
/// queries the heuristic for `max_algorithms` algorithms under
/// `max_workspace` bytes (XLA asks for 1 when `algorithm_idx == 0`, else
/// 128) and keeps algorithm `algorithm_idx`. `run` enqueues the matmul.
/// The program that prepared a plan releases it when it is dropped
/// ([`GemmEngine::release`]): an engine keeps no plan of a program gone.
pub trait GemmEngine<B: Backend>: Send + Sync {
    fn prepare(
        &self,
        cfg: &GemmConfig,
        epilogue: Epilogue,
        algorithm_idx: usize,
        max_algorithms: usize,
        max_workspace: u64,
    ) -> Result<GemmPlanId>;
    /// Workspace bytes the chosen algorithm needs.
    fn workspace_needed(&self, plan: GemmPlanId) -> Result<u64>;
    fn run(&self, plan: GemmPlanId, args: &MatmulArgs, stream: &B::Stream) -> Result<()>;
    /// The program that prepared `plan` is gone (or failed to load): the
    /// plan's library objects may be freed.
    fn release(&self, plan: GemmPlanId) {
        let _ = plan;
    }
    /// As [`GemmEngine::release`], for a convolution plan.
    fn release_conv(&self, plan: ConvPlanId) {
        let _ = plan;
    }
    /// As [`GemmEngine::release`], for one user of an FFT plan (plans are
    /// shared by equal specs: the last user's release frees it). Its runs
    /// have completed.
    fn release_fft(&self, plan: FftPlanId) {
        let _ = plan;
    }
    /// The plans the engine keeps: those of the loaded programs (for leak
    /// checks).
    fn live_plans(&self) -> LivePlans {
        LivePlans::default()
    }
    /// At load time: can this engine run `spec` (the BLAS library with a
    /// solver is found, the type is one it solves in)? An engine without
    /// one says so.
    fn prepare_trsm(&self, spec: &TrsmSpec) -> Result<()> {
        Err(DeviceError::Unsupported(format!(
            "triangular solve ({spec:?}): this backend's BLAS engine has no trsm"
        )))
    }
    /// At load time: build the execution plan of a convolution (cuDNN's
    /// engine by the recorded global index and knobs). An engine without a
    /// DNN library says so.
    fn prepare_conv(&self, spec: &ConvSpec) -> Result<ConvPlanId> {
        Err(DeviceError::Unsupported(format!(
            "convolution ({:?}): this backend's engine has no DNN library",
            spec.op
        )))
    }
    /// Workspace bytes a prepared convolution's plan needs.
    fn conv_workspace(&self, plan: ConvPlanId) -> Result<u64> {
        Err(DeviceError::Unsupported(format!(
            "no convolution plan {}",
            plan.0
        )))
    }
    /// Enqueue a prepared convolution.
    fn run_conv(&self, plan: ConvPlanId, args: &ConvArgs, stream: &B::Stream) -> Result<()> {
        let _ = (args, stream);
        Err(DeviceError::Unsupported(format!(
            "no convolution plan {}",
            plan.0
        )))
    }
    /// Enqueue a solve that [`GemmEngine::prepare_trsm`] accepted.
    fn trsm(&self, spec: &TrsmSpec, args: TrsmArgs, stream: &B::Stream) -> Result<()> {
        let _ = (args, stream);
        Err(DeviceError::Unsupported(format!(
            "triangular solve ({spec:?}): this backend's BLAS engine has no trsm"
        )))
    }
    /// At load time: make (or find) the FFT library's plan for `spec` (and
    /// load the BLAS an inverse transform scales with). An engine without
    /// an FFT library says so.
    fn prepare_fft(&self, spec: &FftSpec) -> Result<FftPlanId> {
        Err(DeviceError::Unsupported(format!(
            "FFT ({:?}, lengths {:?}): this backend's engine has no FFT library",
            spec.kind, spec.n
        )))
    }
    /// Work-area bytes a prepared FFT plan needs.
    fn fft_workspace(&self, plan: FftPlanId) -> Result<u64> {
        Err(DeviceError::Unsupported(format!("no FFT plan {}", plan.0)))
    }
    /// Can a stream capture take this engine's solves and transforms
    /// ([`GemmEngine::trsm`], [`GemmEngine::run_fft`]): do they only enqueue
    /// device work on the stream they are given, work that replays the same
    /// from a graph? An engine that runs them any other way (on the host, or
    /// through a library whose capture is not known to work) keeps a program
    /// with one out of graphs.
    fn library_calls_capturable(&self) -> bool {
        false
    }
    /// Enqueue a prepared transform, and for an inverse one its scaling,
    /// on `stream`.
    fn run_fft(&self, plan: FftPlanId, args: &FftArgs, stream: &B::Stream) -> Result<()> {
        let _ = (args, stream);
        Err(DeviceError::Unsupported(format!("no FFT plan {}", plan.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_table_never_reuses_an_id_and_a_released_plan_is_an_error() {
        let t = PlanTable::default();
        let (a, b) = (t.insert("a"), t.insert("b"));
        assert_eq!((a, b, t.len()), (0, 1, 2));
        assert_eq!(*t.get(b, "GEMM").unwrap(), "b");
        t.remove(a);
        let c = t.insert("c");
        assert_eq!((c, t.len()), (2, 2));
        let e = t.get(a, "GEMM").unwrap_err().to_string();
        assert!(e.contains("no GEMM plan 0"), "{e}");
        t.remove(b);
        t.remove(c);
        assert!(t.is_empty());
    }

    fn layout(rows: i64, cols: i64, order: Order, dtype: i32) -> MatrixLayout {
        MatrixLayout {
            dtype,
            num_rows: rows,
            num_cols: cols,
            order,
            batch_size: 1,
            leading_dim_stride: if order == Order::RowMajor { cols } else { rows },
            batch_stride: 0,
            transpose: Transpose::NoTranspose,
        }
    }

    #[test]
    fn row_major_output_swaps_and_transposes_everything() {
        let cfg = GemmConfig {
            lhs: layout(8, 16, Order::RowMajor, xla_type::F32),
            rhs: layout(16, 4, Order::RowMajor, xla_type::F32),
            c: layout(8, 4, Order::RowMajor, xla_type::F32),
            output: layout(8, 4, Order::RowMajor, xla_type::F32),
            alpha_real: 1.0,
            alpha_imag: 0.0,
            beta: 0.0,
            compute_precision: 0,
            precision_algorithm: 0,
            compute_type: None,
        };
        let n = normalize(&cfg, true).unwrap();
        assert!(n.swap_operands);
        // a is the old rhs, transposed to column-major 4x16.
        assert_eq!(
            (n.a.num_rows, n.a.num_cols, n.a.order),
            (4, 16, Order::ColumnMajor)
        );
        assert_eq!(
            (n.b.num_rows, n.b.num_cols, n.b.order),
            (16, 8, Order::ColumnMajor)
        );
        assert_eq!(
            (n.d.num_rows, n.d.num_cols, n.d.order),
            (4, 8, Order::ColumnMajor)
        );
        assert_eq!(n.compute_type, ComputationType::TF32AsF32);
        assert_eq!(n.scale_type, xla_type::F32);
        let col = GemmConfig {
            output: layout(8, 4, Order::ColumnMajor, xla_type::BF16),
            lhs: layout(8, 16, Order::RowMajor, xla_type::BF16),
            ..cfg
        };
        let n = normalize(&col, true).unwrap();
        assert!(!n.swap_operands);
        assert_eq!(n.compute_type, ComputationType::F32);
        assert_eq!(n.scale_type, xla_type::F32);
    }

    #[test]
    fn computation_type_follows_xla_rules() {
        use xla_type::*;
        assert_eq!(
            blas_computation_type(0, F32, F32, 2, true).unwrap(),
            ComputationType::F32
        );
        assert_eq!(
            blas_computation_type(0, F32, F32, 0, false).unwrap(),
            ComputationType::F32
        );
        assert_eq!(
            blas_computation_type(0, F64, F64, 0, true).unwrap(),
            ComputationType::F64
        );
        assert_eq!(
            blas_computation_type(6, BF16, F32, 0, true).unwrap(),
            ComputationType::BF16AsF32
        );
        assert!(blas_computation_type(0, 1, 1, 0, true).is_err());
        assert_eq!(scale_type(F64, ComputationType::F64), F64);
    }
}

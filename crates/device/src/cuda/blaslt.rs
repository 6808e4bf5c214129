//! cuBLASLt, loaded at run time, driven exactly like XLA drives it.
//!
//! The library is found in this order: `$LD_LIBRARY_PATH` directories, the
//! `nvidia-cublas` wheel of a Python installation (`nvidia/cu13/lib`, then
//! `nvidia/cublas/lib`), then the system loader's search path. We resolve
//! every symbol ourselves with `libloading` (cudarc's loader panics on a
//! missing library); the types come from `xla_vmm_ffi::cuda::cublaslt`.
//!
//! A [`LtPlan`] is XLA's `MatmulPlan`: descriptors built from a
//! [`crate::blas::NormalizedGemm`], the heuristic queried
//! for `max_algorithms` under a workspace limit, algorithm `algorithm_idx`
//! of the successful results kept. Execution sets the same descriptor
//! attributes XLA sets (bias / scale / amax / aux pointers) before
//! `cublasLtMatmul`, and passes a null C when beta is zero.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};

use xla_vmm_ffi::cuda::cublaslt as sys;

use super::cudnn::{ConvPlan, Cudnn};
use super::{CudaBackend, CudaStream};
use crate::blas::{
    xla_type, ComputationType, Epilogue, GemmConfig, GemmEngine, GemmPlanId, LivePlans, MatmulArgs,
    NormalizedGemm, Order, PlanTable, Transpose, TrsmArgs, TrsmSpec,
};
use crate::dnn::{ConvArgs, ConvPlanId, ConvSpec};
use crate::error::{DeviceError, Result};
use crate::fft::{FftArgs, FftPlanId, FftSpec};
use crate::fft_lib::FftLib;
use crate::trsm_lib::{LazyLib, LazySolver, Solver};

type Status = sys::cublasStatus_t;

/// The cuBLASLt entry points we call.
struct Api {
    create: unsafe extern "C" fn(*mut sys::cublasLtHandle_t) -> Status,
    destroy: unsafe extern "C" fn(sys::cublasLtHandle_t) -> Status,
    desc_create: unsafe extern "C" fn(
        *mut sys::cublasLtMatmulDesc_t,
        sys::cublasComputeType_t,
        sys::cudaDataType_t,
    ) -> Status,
    desc_destroy: unsafe extern "C" fn(sys::cublasLtMatmulDesc_t) -> Status,
    desc_set: unsafe extern "C" fn(
        sys::cublasLtMatmulDesc_t,
        sys::cublasLtMatmulDescAttributes_t,
        *const c_void,
        usize,
    ) -> Status,
    layout_create: unsafe extern "C" fn(
        *mut sys::cublasLtMatrixLayout_t,
        sys::cudaDataType,
        u64,
        u64,
        i64,
    ) -> Status,
    layout_destroy: unsafe extern "C" fn(sys::cublasLtMatrixLayout_t) -> Status,
    layout_set: unsafe extern "C" fn(
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayoutAttribute_t,
        *const c_void,
        usize,
    ) -> Status,
    pref_create: unsafe extern "C" fn(*mut sys::cublasLtMatmulPreference_t) -> Status,
    pref_destroy: unsafe extern "C" fn(sys::cublasLtMatmulPreference_t) -> Status,
    pref_set: unsafe extern "C" fn(
        sys::cublasLtMatmulPreference_t,
        sys::cublasLtMatmulPreferenceAttributes_t,
        *const c_void,
        usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    heuristic: unsafe extern "C" fn(
        sys::cublasLtHandle_t,
        sys::cublasLtMatmulDesc_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatmulPreference_t,
        i32,
        *mut sys::cublasLtMatmulHeuristicResult_t,
        *mut i32,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        sys::cublasLtHandle_t,
        sys::cublasLtMatmulDesc_t,
        *const c_void,
        *const c_void,
        sys::cublasLtMatrixLayout_t,
        *const c_void,
        sys::cublasLtMatrixLayout_t,
        *const c_void,
        *const c_void,
        sys::cublasLtMatrixLayout_t,
        *mut c_void,
        sys::cublasLtMatrixLayout_t,
        *const sys::cublasLtMatmulAlgo_t,
        *mut c_void,
        usize,
        sys::cudaStream_t,
    ) -> Status,
    get_version: unsafe extern "C" fn() -> usize,
    /// Keeps the library mapped for the life of the process.
    _lib: libloading::Library,
}

const LIB_NAMES: &[&str] = &["libcublasLt.so.13", "libcublasLt.so"];

/// Look up `name` in `lib` as a function pointer of type `T`.
fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
    // SAFETY: `T` is the function-pointer type declared for this symbol by
    // the cuBLASLt header (cudarc's generated bindings); the library stays
    // loaded as long as `Api` (which owns it) lives.
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| DeviceError::NotAvailable(format!("cuBLASLt symbol {name}: {e}")))
    }
}

impl Api {
    fn load() -> Result<(Api, String)> {
        let mut tried = Vec::new();
        for path in crate::libsearch::cuda(LIB_NAMES) {
            // SAFETY: loading cuBLASLt runs its initializers, which have no
            // preconditions beyond a sane process environment.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    let api = Api {
                        create: sym(&lib, "cublasLtCreate")?,
                        destroy: sym(&lib, "cublasLtDestroy")?,
                        desc_create: sym(&lib, "cublasLtMatmulDescCreate")?,
                        desc_destroy: sym(&lib, "cublasLtMatmulDescDestroy")?,
                        desc_set: sym(&lib, "cublasLtMatmulDescSetAttribute")?,
                        layout_create: sym(&lib, "cublasLtMatrixLayoutCreate")?,
                        layout_destroy: sym(&lib, "cublasLtMatrixLayoutDestroy")?,
                        layout_set: sym(&lib, "cublasLtMatrixLayoutSetAttribute")?,
                        pref_create: sym(&lib, "cublasLtMatmulPreferenceCreate")?,
                        pref_destroy: sym(&lib, "cublasLtMatmulPreferenceDestroy")?,
                        pref_set: sym(&lib, "cublasLtMatmulPreferenceSetAttribute")?,
                        heuristic: sym(&lib, "cublasLtMatmulAlgoGetHeuristic")?,
                        matmul: sym(&lib, "cublasLtMatmul")?,
                        get_version: sym(&lib, "cublasLtGetVersion")?,
                        _lib: lib,
                    };
                    return Ok((api, path.display().to_string()));
                }
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(DeviceError::NotAvailable(format!(
            "cuBLASLt not found (tried {})",
            tried.join("; ")
        )))
    }
}

fn check(call: &'static str, s: Status) -> Result<()> {
    if s == Status::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            call,
            code: s as i64,
            name: format!("{s:?}"),
            message: String::new(),
        })
    }
}

fn cuda_type(t: i32) -> Result<sys::cudaDataType_t> {
    use sys::cudaDataType_t::*;
    Ok(match t {
        xla_type::F16 => CUDA_R_16F,
        xla_type::BF16 => CUDA_R_16BF,
        xla_type::F32 => CUDA_R_32F,
        xla_type::F64 => CUDA_R_64F,
        xla_type::C64 => CUDA_C_32F,
        xla_type::C128 => CUDA_C_64F,
        xla_type::S8 => CUDA_R_8I,
        xla_type::S32 => CUDA_R_32I,
        xla_type::F8E4M3FN => CUDA_R_8F_E4M3,
        xla_type::F8E5M2 => CUDA_R_8F_E5M2,
        other => {
            return Err(DeviceError::Unsupported(format!(
                "cuBLASLt data type for XLA PrimitiveType {other}"
            )))
        }
    })
}

fn compute_type(c: ComputationType) -> sys::cublasComputeType_t {
    use sys::cublasComputeType_t::*;
    match c {
        ComputationType::F16 => CUBLAS_COMPUTE_16F,
        ComputationType::F32 => CUBLAS_COMPUTE_32F,
        ComputationType::F64 => CUBLAS_COMPUTE_64F,
        ComputationType::I32 => CUBLAS_COMPUTE_32I,
        ComputationType::F16AsF32 => CUBLAS_COMPUTE_32F_FAST_16F,
        ComputationType::BF16AsF32 => CUBLAS_COMPUTE_32F_FAST_16BF,
        ComputationType::TF32AsF32 => CUBLAS_COMPUTE_32F_FAST_TF32,
    }
}

fn op(t: Transpose) -> i32 {
    // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2.
    match t {
        Transpose::NoTranspose => 0,
        Transpose::Transpose => 1,
        Transpose::ConjugateTranspose => 2,
    }
}

fn epilogue(e: Epilogue) -> Result<sys::cublasLtEpilogue_t> {
    use sys::cublasLtEpilogue_t::*;
    Ok(match e {
        Epilogue::Default => CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Relu => CUBLASLT_EPILOGUE_RELU,
        Epilogue::Bias => CUBLASLT_EPILOGUE_BIAS,
        Epilogue::BiasThenRelu => CUBLASLT_EPILOGUE_RELU_BIAS,
        Epilogue::Gelu => CUBLASLT_EPILOGUE_GELU,
        Epilogue::GeluWithAux => CUBLASLT_EPILOGUE_GELU_AUX,
        Epilogue::BiasThenGelu => CUBLASLT_EPILOGUE_GELU_BIAS,
        Epilogue::BiasThenGeluWithAux => CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        other => {
            return Err(DeviceError::Unsupported(format!(
                "cuBLASLt epilogue {other:?} (XLA rejects SILU epilogues too)"
            )))
        }
    })
}

/// Operand type combinations XLA's `GetMatmulPlan` accepts (a, b, c, d).
fn check_operand_types(g: &NormalizedGemm) -> Result<()> {
    use xla_type::*;
    let t = (g.a.dtype, g.b.dtype, g.c.dtype, g.d.dtype);
    let f8 = |x: i32| x == F8E4M3FN || x == F8E5M2;
    let ok = matches!(
        t,
        (BF16, BF16, BF16, BF16)
            | (F16, F16, F16, F16)
            | (BF16, BF16, F32, F32)
            | (F16, F16, F32, F32)
            | (F32, F32, F32, F32)
            | (F64, F64, F64, F64)
            | (S8, S8, S32, S32)
            | (S8, S8, F32, F32)
            | (C64, C64, C64, C64)
            | (C128, C128, C128, C128)
    ) || (f8(t.0) && f8(t.1) && !(t.0 == F8E5M2 && t.1 == F8E5M2));
    if ok {
        Ok(())
    } else {
        Err(DeviceError::Unsupported(format!(
            "cuBLASLt operand types (a, b, c, d) = {t:?} (XLA PrimitiveType numbers)"
        )))
    }
}

/// alpha / beta bytes in the scale type.
fn scale_bytes(scale_type: i32, re: f64, im: f64) -> Result<Vec<u8>> {
    Ok(match scale_type {
        xla_type::F32 => (re as f32).to_le_bytes().to_vec(),
        xla_type::F64 => re.to_le_bytes().to_vec(),
        xla_type::S32 => (re as i32).to_le_bytes().to_vec(),
        xla_type::C64 => [(re as f32).to_le_bytes(), (im as f32).to_le_bytes()].concat(),
        xla_type::C128 => [re.to_le_bytes(), im.to_le_bytes()].concat(),
        other => {
            return Err(DeviceError::Unsupported(format!(
                "cuBLASLt scale type {other} (XLA PrimitiveType)"
            )))
        }
    })
}

struct Inner {
    api: Api,
    handle: sys::cublasLtHandle_t,
}

/// A cuBLASLt handle plus the library (shared by the plans made from it).
pub struct BlasLt {
    inner: Arc<Inner>,
    library: String,
}

// SAFETY: a cuBLASLt handle may be used from any thread as long as calls on
// it are not concurrent with its destruction; `BlasLt` is destroyed only by
// `Drop` (exclusive access). Plans serialize their own attribute updates.
unsafe impl Send for Inner {}
// SAFETY: see above; cublasLtMatmul / heuristic calls on one handle from
// several threads are allowed by cuBLASLt.
unsafe impl Sync for Inner {}

impl BlasLt {
    /// Load the library and create a handle. The CUDA context of the device
    /// must be current on this thread.
    pub fn new() -> Result<Self> {
        let (api, library) = Api::load()?;
        let mut handle: sys::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out pointer.
        check("cublasLtCreate", unsafe { (api.create)(&mut handle) })?;
        // SAFETY: no preconditions.
        let version = unsafe { (api.get_version)() };
        tracing::info!(library = %library, version, "cuBLASLt loaded");
        Ok(BlasLt {
            inner: Arc::new(Inner { api, handle }),
            library,
        })
    }

    /// Path (or name) of the loaded library.
    pub fn library(&self) -> &str {
        &self.library
    }

    fn layout(&self, m: &crate::blas::MatrixLayout) -> Result<Layout> {
        let mut raw: sys::cublasLtMatrixLayout_t = std::ptr::null_mut();
        let rows = u64::try_from(m.num_rows)
            .map_err(|_| DeviceError::InvalidArgument(format!("matrix rows {}", m.num_rows)))?;
        let cols = u64::try_from(m.num_cols)
            .map_err(|_| DeviceError::InvalidArgument(format!("matrix cols {}", m.num_cols)))?;
        // SAFETY: `raw` is a valid out pointer.
        check("cublasLtMatrixLayoutCreate", unsafe {
            (self.inner.api.layout_create)(
                &mut raw,
                cuda_type(m.dtype)?,
                rows,
                cols,
                m.leading_dim_stride,
            )
        })?;
        let layout = Layout {
            lt: self.inner.clone(),
            raw,
        };
        let order: i32 = match m.order {
            Order::RowMajor => sys::cublasLtOrder_t::CUBLASLT_ORDER_ROW as i32,
            Order::ColumnMajor => sys::cublasLtOrder_t::CUBLASLT_ORDER_COL as i32,
        };
        layout.set(
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_ORDER,
            &order,
        )?;
        let batch = i32::try_from(m.batch_size)
            .map_err(|_| DeviceError::InvalidArgument(format!("batch {}", m.batch_size)))?;
        layout.set(
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &batch,
        )?;
        layout.set(
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &m.batch_stride,
        )?;
        Ok(layout)
    }

    /// Build XLA's plan and pick algorithm `algorithm_idx` among the
    /// successful heuristic results for `max_algorithms` requested under
    /// `max_workspace` bytes.
    pub fn plan(
        &self,
        g: &NormalizedGemm,
        epi: Epilogue,
        algorithm_idx: usize,
        max_algorithms: usize,
        max_workspace: u64,
    ) -> Result<LtPlan> {
        check_operand_types(g)?;
        let mut raw: sys::cublasLtMatmulDesc_t = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        check("cublasLtMatmulDescCreate", unsafe {
            (self.inner.api.desc_create)(
                &mut raw,
                compute_type(g.compute_type),
                cuda_type(g.scale_type)?,
            )
        })?;
        let desc = Desc {
            lt: self.inner.clone(),
            raw,
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        let host_mode = sys::cublasLtPointerMode_t::CUBLASLT_POINTER_MODE_HOST as i32;
        desc.set(A::CUBLASLT_MATMUL_DESC_POINTER_MODE, &host_mode)?;
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSA, &op(g.trans_a))?;
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSB, &op(g.trans_b))?;
        let epi_raw = epilogue(epi)? as u32;
        desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi_raw)?;
        let fast: i8 = g.fast_accum.into();
        desc.set(A::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast)?;
        let (a, b, c, d) = (
            self.layout(&g.a)?,
            self.layout(&g.b)?,
            self.layout(&g.c)?,
            self.layout(&g.d)?,
        );

        let is_f8 = |t: i32| t == xla_type::F8E4M3FN || t == xla_type::F8E5M2;
        if is_f8(g.a.dtype) || is_f8(g.b.dtype) {
            // XLA sets dummy non-null scale pointers before the heuristic
            // query so FP8 scaling algorithms are considered.
            let dummy: usize = 0x40;
            desc.set(A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy)?;
            desc.set(A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy)?;
            if is_f8(g.c.dtype) {
                desc.set(A::CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, &dummy)?;
            }
            if is_f8(g.d.dtype) {
                desc.set(A::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &dummy)?;
            }
        }

        let mut pref: sys::cublasLtMatmulPreference_t = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check("cublasLtMatmulPreferenceCreate", unsafe {
            (self.inner.api.pref_create)(&mut pref)
        })?;
        let pref = Pref {
            lt: self.inner.clone(),
            raw: pref,
        };
        // SAFETY: the attribute takes a uint64_t; we pass 8 bytes.
        check("cublasLtMatmulPreferenceSetAttribute", unsafe {
            (self.inner.api.pref_set)(
                pref.raw,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&max_workspace as *const u64).cast(),
                8,
            )
        })?;
        let count = max_algorithms.clamp(1, i32::MAX as usize);
        // SAFETY: an all-zero heuristic result is a valid value (plain data).
        let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; count];
        let mut found: i32 = 0;
        // SAFETY: all descriptors are live; `results` has room for `count`.
        check("cublasLtMatmulAlgoGetHeuristic", unsafe {
            (self.inner.api.heuristic)(
                self.inner.handle,
                desc.raw,
                a.raw,
                b.raw,
                c.raw,
                d.raw,
                pref.raw,
                count as i32,
                results.as_mut_ptr(),
                &mut found,
            )
        })?;
        results.truncate(found.max(0) as usize);
        let ok: Vec<_> = results
            .into_iter()
            .filter(|r| r.state == Status::CUBLAS_STATUS_SUCCESS)
            .collect();
        let chosen = ok.get(algorithm_idx).ok_or_else(|| {
            DeviceError::InvalidArgument(format!(
                "cuBLASLt algorithm index {algorithm_idx} out of range: the heuristic returned {} \
                 usable algorithms (asked for {count}, workspace limit {max_workspace} B)",
                ok.len()
            ))
        })?;
        Ok(LtPlan {
            alpha: scale_bytes(g.scale_type, g.alpha_real, g.alpha_imag)?,
            beta: scale_bytes(g.scale_type, g.beta, 0.0)?,
            zero_beta: g.beta == 0.0,
            swap: g.swap_operands,
            algo: chosen.algo,
            workspace_size: chosen.workspaceSize as u64,
            lock: std::sync::Mutex::new(()),
            desc,
            a,
            b,
            c,
            d,
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the handle was created by cublasLtCreate and every plan
        // borrows `self`, so none outlives it.
        let s = unsafe { (self.api.destroy)(self.handle) };
        if s != Status::CUBLAS_STATUS_SUCCESS {
            tracing::warn!(?s, "cublasLtDestroy failed");
        }
    }
}

struct Desc {
    lt: Arc<Inner>,
    raw: sys::cublasLtMatmulDesc_t,
}
impl Desc {
    fn set<T>(&self, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
        // SAFETY: `v` points to a live `T` whose size we pass; the attribute
        // types are those cuBLASLt documents for each attribute.
        check("cublasLtMatmulDescSetAttribute", unsafe {
            (self.lt.api.desc_set)(
                self.raw,
                attr,
                (v as *const T).cast(),
                std::mem::size_of::<T>(),
            )
        })
    }
}
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed once.
        unsafe { (self.lt.api.desc_destroy)(self.raw) };
    }
}

struct Layout {
    lt: Arc<Inner>,
    raw: sys::cublasLtMatrixLayout_t,
}
impl Layout {
    fn set<T>(&self, attr: sys::cublasLtMatrixLayoutAttribute_t, v: &T) -> Result<()> {
        // SAFETY: as in `Desc::set`.
        check("cublasLtMatrixLayoutSetAttribute", unsafe {
            (self.lt.api.layout_set)(
                self.raw,
                attr,
                (v as *const T).cast(),
                std::mem::size_of::<T>(),
            )
        })
    }
}
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once.
        unsafe { (self.lt.api.layout_destroy)(self.raw) };
    }
}

struct Pref {
    lt: Arc<Inner>,
    raw: sys::cublasLtMatmulPreference_t,
}
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed once.
        unsafe { (self.lt.api.pref_destroy)(self.raw) };
    }
}

/// Device pointers of one matmul as raw addresses (0 = absent).
#[derive(Copy, Clone, Debug, Default)]
pub struct RawArgs {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub bias: u64,
    pub aux: u64,
    pub a_scale: u64,
    pub b_scale: u64,
    pub c_scale: u64,
    pub d_scale: u64,
    pub d_amax: u64,
    pub workspace: u64,
    pub workspace_bytes: u64,
}

/// XLA's `MatmulPlan` with its algorithm chosen.
pub struct LtPlan {
    desc: Desc,
    a: Layout,
    b: Layout,
    c: Layout,
    d: Layout,
    alpha: Vec<u8>,
    beta: Vec<u8>,
    zero_beta: bool,
    swap: bool,
    algo: sys::cublasLtMatmulAlgo_t,
    workspace_size: u64,
    /// Serializes descriptor updates + launch (as XLA's mutex does).
    lock: std::sync::Mutex<()>,
}

// SAFETY: the raw descriptors are only touched under `lock` (execute) or
// through `&mut`/drop; cuBLASLt objects are not thread-affine.
unsafe impl Send for LtPlan {}
// SAFETY: see above.
unsafe impl Sync for LtPlan {}

impl LtPlan {
    /// Workspace bytes the chosen algorithm needs.
    pub fn workspace_size(&self) -> u64 {
        self.workspace_size
    }

    /// Enqueue the matmul on `stream`, XLA's `MatmulPlan::ExecuteOnStream`.
    ///
    /// # Safety
    /// `stream` must be a live CUDA stream of the context current on this
    /// thread, and every non-zero pointer in `args` must address device
    /// memory of the sizes the plan's layouts describe.
    pub unsafe fn execute(&self, args: &RawArgs, stream: sys::cudaStream_t) -> Result<()> {
        let (mut a, mut b) = (args.a, args.b);
        let (mut a_scale, mut b_scale) = (args.a_scale, args.b_scale);
        if self.swap {
            std::mem::swap(&mut a, &mut b);
            std::mem::swap(&mut a_scale, &mut b_scale);
        }
        let (mut ws, mut ws_size) = (0u64, 0u64);
        if self.workspace_size > 0 {
            if args.workspace == 0 || args.workspace_bytes < self.workspace_size {
                return Err(DeviceError::InvalidArgument(format!(
                    "cuBLASLt algorithm needs {} workspace bytes, thunk gives {}",
                    self.workspace_size, args.workspace_bytes
                )));
            }
            ws = args.workspace;
            ws_size = args.workspace_bytes;
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        use sys::cublasLtMatmulDescAttributes_t as A;
        if args.bias != 0 {
            self.desc
                .set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias)?;
        }
        self.desc
            .set(A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale)?;
        self.desc
            .set(A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale)?;
        self.desc
            .set(A::CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, &args.c_scale)?;
        self.desc
            .set(A::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &args.d_scale)?;
        self.desc
            .set(A::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &args.d_amax)?;
        if args.aux != 0 {
            return Err(DeviceError::Unsupported(
                "cuBLASLt epilogue auxiliary output (needs the layout's ld / batch stride)".into(),
            ));
        }
        let c_ptr = if self.zero_beta { 0 } else { args.c };
        let lt = &self.desc.lt;
        // SAFETY: descriptors are live; alpha/beta point to scale-type
        // values; the caller guarantees pointers and stream.
        check("cublasLtMatmul", unsafe {
            (lt.api.matmul)(
                lt.handle,
                self.desc.raw,
                self.alpha.as_ptr().cast(),
                a as *const c_void,
                self.a.raw,
                b as *const c_void,
                self.b.raw,
                self.beta.as_ptr().cast(),
                c_ptr as *const c_void,
                self.c.raw,
                args.d as *mut c_void,
                self.d.raw,
                &self.algo,
                ws as *mut c_void,
                ws_size as usize,
                stream,
            )
        })
    }
}

/// The [`GemmEngine`] of a [`CudaBackend`]: one cuBLASLt handle, plans
/// prepared at load time; cuBLAS for triangular solves, loaded when the
/// first program with one is loaded.
pub struct CudaGemm {
    ctx: Arc<cudarc::driver::CudaContext>,
    lt: BlasLt,
    plans: PlanTable<LtPlan>,
    /// cuBLAS for triangular solves and inverse FFTs' scaling.
    cublas: LazySolver,
    /// cuFFT and its plans.
    cufft: LazyLib<FftLib<c_int>>,
    /// cuDNN, or why it could not be loaded (said once, at every load that
    /// needs it), and the convolution plans prepared with it.
    cudnn: OnceLock<std::result::Result<Cudnn, String>>,
    conv_plans: PlanTable<ConvPlan>,
    /// `tsl::tensor_float_32_execution_enabled()`: on in JAX by default.
    tf32: bool,
}

impl CudaGemm {
    /// Load cuBLASLt for `backend`'s device.
    pub fn new(backend: &CudaBackend) -> Result<Self> {
        backend
            .ctx
            .bind_to_thread()
            .map_err(|e| super::result::from_cudarc("cuCtxSetCurrent", e))?;
        Ok(CudaGemm {
            ctx: backend.ctx.clone(),
            lt: BlasLt::new()?,
            plans: PlanTable::default(),
            cublas: LazySolver::default(),
            cufft: LazyLib::default(),
            cudnn: OnceLock::new(),
            conv_plans: PlanTable::default(),
            tf32: true,
        })
    }

    /// Path of the loaded cuBLASLt library.
    pub fn library(&self) -> &str {
        self.lt.library()
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| super::result::from_cudarc("cuCtxSetCurrent", e))
    }

    /// How cuBLAS is loaded (on first use, with the device current).
    fn load_cublas(&self) -> Result<Solver> {
        self.bind().and_then(|()| super::cublas::solver())
    }

    /// cuDNN, loaded on first use.
    fn cudnn(&self) -> Result<&Cudnn> {
        self.cudnn
            .get_or_init(|| {
                self.bind()
                    .and_then(|()| Cudnn::new())
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| DeviceError::NotAvailable(e.clone()))
    }
}

impl GemmEngine<CudaBackend> for CudaGemm {
    fn prepare(
        &self,
        cfg: &GemmConfig,
        epi: Epilogue,
        algorithm_idx: usize,
        max_algorithms: usize,
        max_workspace: u64,
    ) -> Result<GemmPlanId> {
        self.bind()?;
        let g = crate::blas::normalize(cfg, self.tf32)?;
        let plan = self
            .lt
            .plan(&g, epi, algorithm_idx, max_algorithms, max_workspace)?;
        tracing::debug!(
            ?g,
            algorithm_idx,
            workspace = plan.workspace_size(),
            "cuBLASLt plan"
        );
        Ok(GemmPlanId(self.plans.insert(plan)))
    }

    fn workspace_needed(&self, plan: GemmPlanId) -> Result<u64> {
        Ok(self.plans.get(plan.0, "GEMM")?.workspace_size())
    }

    fn run(&self, plan: GemmPlanId, args: &MatmulArgs, stream: &CudaStream) -> Result<()> {
        let plan = self.plans.get(plan.0, "GEMM")?;
        self.bind()?;
        let raw = RawArgs {
            a: args.a.0,
            b: args.b.0,
            c: args.c.0,
            d: args.d.0,
            bias: args.bias.0,
            aux: args.aux.0,
            a_scale: args.a_scale.0,
            b_scale: args.b_scale.0,
            c_scale: args.c_scale.0,
            d_scale: args.d_scale.0,
            d_amax: args.d_amax.0,
            workspace: args.workspace.0,
            workspace_bytes: args.workspace_bytes,
        };
        // SAFETY: the stream belongs to this context (bound above); the
        // runtime resolves every pointer from the executable's slices,
        // which the decoder checked against allocation sizes.
        unsafe { plan.execute(&raw, stream.cu_stream().cast()) }
    }

    fn prepare_conv(&self, spec: &ConvSpec) -> Result<ConvPlanId> {
        let cudnn = self.cudnn()?;
        self.bind()?;
        let plan = cudnn.plan(spec)?;
        tracing::debug!(?spec, workspace = plan.workspace_size(), "cuDNN plan");
        Ok(ConvPlanId(self.conv_plans.insert(plan)))
    }

    fn conv_workspace(&self, plan: ConvPlanId) -> Result<u64> {
        Ok(self.conv_plans.get(plan.0, "convolution")?.workspace_size())
    }

    fn run_conv(&self, plan: ConvPlanId, args: &ConvArgs, stream: &CudaStream) -> Result<()> {
        let plan = self.conv_plans.get(plan.0, "convolution")?;
        self.bind()?;
        // SAFETY: the stream belongs to this context (bound above); the
        // runtime resolves the tensors from the executable's slices, which
        // it checked against the tensors' spans at load.
        unsafe { plan.execute(args, stream.cu_stream().cast()) }
    }

    fn release(&self, plan: GemmPlanId) {
        self.plans.remove(plan.0);
    }

    fn release_conv(&self, plan: ConvPlanId) {
        self.conv_plans.remove(plan.0);
    }

    fn release_fft(&self, plan: FftPlanId) {
        if let Some(cufft) = self.cufft.peek() {
            // A plan destroyed goes with the device's context current.
            if self.bind().is_ok() {
                cufft.release(plan);
            }
        }
    }

    fn live_plans(&self) -> LivePlans {
        LivePlans {
            gemm: self.plans.len(),
            conv: self.conv_plans.len(),
            fft: self.cufft.peek().map_or(0, FftLib::live),
        }
    }

    fn prepare_trsm(&self, spec: &TrsmSpec) -> Result<()> {
        self.cublas.prepare(spec, || self.load_cublas())
    }

    fn trsm(&self, spec: &TrsmSpec, args: TrsmArgs, stream: &CudaStream) -> Result<()> {
        let cublas = self.cublas.get(|| self.load_cublas())?;
        self.bind()?;
        // SAFETY: the stream belongs to this context (bound above); the
        // runtime resolves the operands from the executable's slices, which
        // the decoder checked against the solve's sizes, and writes the
        // pointer arrays of a batched solve before it on the same stream.
        unsafe { cublas.trsm(spec, args, stream.cu_stream().cast()) }
    }

    fn prepare_fft(&self, spec: &FftSpec) -> Result<FftPlanId> {
        if spec.is_inverse() {
            self.cublas.get(|| self.load_cublas())?;
        }
        self.bind()?;
        self.cufft.get(super::cufft::library)?.prepare(spec)
    }

    fn fft_workspace(&self, plan: FftPlanId) -> Result<u64> {
        self.cufft.loaded_ref()?.workspace(plan)
    }

    /// cuFFT and cuBLAS both document stream capture of their calls: a
    /// single-GPU cuFFT plan without callbacks, and cuBLAS routines whose
    /// results stay on the device. Ours enqueue nothing else: the plan's
    /// work area is ours (auto allocation off) at a fixed place in the
    /// program's scratch, scalars go in host pointer mode (captured by
    /// value), and a batched solve's pointer tables are memsets on the same
    /// stream.
    fn library_calls_capturable(&self) -> bool {
        true
    }

    fn run_fft(&self, plan: FftPlanId, args: &FftArgs, stream: &CudaStream) -> Result<()> {
        let cufft = self.cufft.loaded_ref()?;
        self.bind()?;
        // SAFETY: the stream belongs to this context (bound above); the
        // runtime resolves input and output from the executable's slices,
        // which it checked against the transform's sizes at load, and gives
        // the work area the plan asked for.
        unsafe { cufft.run(plan, args, stream.cu_stream().cast(), self.cublas.peek()) }
    }
}

impl Drop for CudaGemm {
    fn drop(&mut self) {
        // cuFFT's plans are destroyed with the device's context current.
        if self.cufft.loaded().is_some() {
            let _ = self.bind();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_bytes_follow_the_scale_type() {
        assert_eq!(
            scale_bytes(xla_type::F32, 1.0, 0.0).unwrap(),
            1.0f32.to_le_bytes()
        );
        assert_eq!(
            scale_bytes(xla_type::F64, 2.0, 0.0).unwrap(),
            2.0f64.to_le_bytes()
        );
        assert_eq!(scale_bytes(xla_type::C64, 1.0, 3.0).unwrap().len(), 8);
        assert!(scale_bytes(xla_type::BF16, 1.0, 0.0).is_err());
    }
}

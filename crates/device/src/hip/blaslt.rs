//! hipBLASLt, loaded at run time, driven like XLA's ROCm path drives it:
//! the twin of `cuda/blaslt.rs` for `cublas_lt_matmul` thunks on ROCm.
//!
//! Never run on an AMD GPU (none was available). The HIP test shim
//! (`integration/hipshim`) forwards these entry points to cuBLASLt, so that
//! this engine's calls run on an NVIDIA GPU (`gpu_check.sh` section
//! `hip-shim`); that checks our calls, not hipBLASLt.
//!
//! The library is `$XLA_VMM_HIPBLASLT_LIBRARY` when set (a path: only that
//! one is tried), else the first that opens in this order: `$LD_LIBRARY_PATH`
//! directories, `$ROCM_PATH/lib`, `/opt/rocm/lib`, then the system loader's
//! search path.
//! Debian's ROCm packages have no hipBLASLt headers, so the entry points
//! and the few types and enum values we use are declared here, from
//! hipBLASLt's `hipblaslt.h`, hipBLAS-common's `hipblas-common.h` and HIP's
//! `library_types.h` (ROCm 6 and 7 agree on every one of them):
//! `hipblasLtCreate` / `Destroy`, `hipblasLtMatmulDescCreate` / `Destroy` /
//! `SetAttribute`, `hipblasLtMatrixLayoutCreate` / `Destroy` /
//! `SetAttribute`, `hipblasLtMatmulPreferenceCreate` / `Destroy` /
//! `SetAttribute`, `hipblasLtMatmulAlgoGetHeuristic`, `hipblasLtMatmul`.
//!
//! A [`HipLtPlan`] is XLA's ROCm `MatmulPlan`: descriptors built from a
//! [`NormalizedGemm`](crate::blas::NormalizedGemm), the heuristic queried
//! for `max_algorithms` under a workspace limit, algorithm `algorithm_idx`
//! of the successful results kept (the index XLA's autotuner recorded).
//! Where hipBLASLt differs from cuBLASLt: operations are `HIPBLAS_OP_N/T/C`
//! = 111/112/113, there is no fast-accumulation attribute (XLA's ROCm path
//! sets none), the attribute and epilogue numbers are hipBLASLt's own, and
//! MI300's FP8 types are the FNUZ ones.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use super::{HipBackend, HipStream};
use crate::blas::{
    xla_type, ComputationType, Epilogue, GemmConfig, GemmEngine, GemmPlanId, LivePlans, MatmulArgs,
    NormalizedGemm, Order, PlanTable, Transpose, TrsmArgs, TrsmSpec,
};
use crate::error::{DeviceError, Result};
use crate::fft::{FftArgs, FftPlanId, FftSpec};
use crate::fft_lib::FftLib;
use crate::trsm_lib::{LazyLib, LazySolver, Solver};

/// The hipBLASLt types and values we use, declared from its headers.
mod sys {
    use std::ffi::c_void;

    pub type Status = i32; // hipblasStatus_t
    pub const HIPBLAS_STATUS_SUCCESS: Status = 0;
    pub type Handle = *mut c_void;
    pub type MatmulDesc = *mut c_void;
    pub type MatrixLayout = *mut c_void;
    pub type Preference = *mut c_void;
    pub type Stream = *mut c_void; // hipStream_t

    /// `hipblasLtMatmulAlgo_t`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default)]
    pub struct MatmulAlgo {
        pub data: [u8; 16],
        pub max_workspace_bytes: usize,
    }

    /// `hipblasLtMatmulHeuristicResult_t`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default)]
    pub struct HeuristicResult {
        pub algo: MatmulAlgo,
        pub workspace_size: usize,
        pub state: Status,
        pub waves_count: f32,
        pub reserved: [i32; 4],
    }

    // hipDataType (HIP's library_types.h).
    pub const HIP_R_32F: i32 = 0;
    pub const HIP_R_64F: i32 = 1;
    pub const HIP_R_16F: i32 = 2;
    pub const HIP_R_8I: i32 = 3;
    pub const HIP_C_32F: i32 = 4;
    pub const HIP_C_64F: i32 = 5;
    pub const HIP_R_32I: i32 = 10;
    pub const HIP_R_16BF: i32 = 14;
    pub const HIP_R_8F_E4M3: i32 = 28;
    pub const HIP_R_8F_E5M2: i32 = 29;
    pub const HIP_R_8F_E4M3_FNUZ: i32 = 1000;
    pub const HIP_R_8F_E5M2_FNUZ: i32 = 1001;

    // hipblasComputeType_t (hipblas-common.h).
    pub const HIPBLAS_COMPUTE_16F: i32 = 0;
    pub const HIPBLAS_COMPUTE_32F: i32 = 2;
    pub const HIPBLAS_COMPUTE_32F_FAST_16F: i32 = 4;
    pub const HIPBLAS_COMPUTE_32F_FAST_16BF: i32 = 5;
    pub const HIPBLAS_COMPUTE_32F_FAST_TF32: i32 = 6;
    pub const HIPBLAS_COMPUTE_64F: i32 = 7;
    pub const HIPBLAS_COMPUTE_32I: i32 = 9;

    // hipblasOperation_t.
    pub const HIPBLAS_OP_N: i32 = 111;
    pub const HIPBLAS_OP_T: i32 = 112;
    pub const HIPBLAS_OP_C: i32 = 113;

    // hipblasLtMatmulDescAttributes_t.
    pub const DESC_TRANSA: i32 = 0;
    pub const DESC_TRANSB: i32 = 1;
    pub const DESC_EPILOGUE: i32 = 2;
    pub const DESC_BIAS_POINTER: i32 = 3;
    pub const DESC_A_SCALE_POINTER: i32 = 5;
    pub const DESC_B_SCALE_POINTER: i32 = 6;
    pub const DESC_C_SCALE_POINTER: i32 = 7;
    pub const DESC_D_SCALE_POINTER: i32 = 8;
    pub const DESC_POINTER_MODE: i32 = 13;
    pub const DESC_AMAX_D_POINTER: i32 = 14;

    // hipblasLtMatrixLayoutAttribute_t.
    pub const LAYOUT_BATCH_COUNT: i32 = 0;
    pub const LAYOUT_STRIDED_BATCH_OFFSET: i32 = 1;
    pub const LAYOUT_ORDER: i32 = 3;

    // hipblasLtMatmulPreferenceAttributes_t.
    pub const PREF_MAX_WORKSPACE_BYTES: i32 = 1;

    // hipblasLtOrder_t, hipblasLtPointerMode_t.
    pub const ORDER_COL: i32 = 0;
    pub const ORDER_ROW: i32 = 1;
    pub const POINTER_MODE_HOST: i32 = 0;

    // hipblasLtEpilogue_t.
    pub const EPILOGUE_DEFAULT: u32 = 1;
    pub const EPILOGUE_RELU: u32 = 2;
    pub const EPILOGUE_BIAS: u32 = 4;
    pub const EPILOGUE_RELU_BIAS: u32 = 6;
    pub const EPILOGUE_GELU: u32 = 32;
    pub const EPILOGUE_GELU_BIAS: u32 = 36;
    pub const EPILOGUE_GELU_AUX: u32 = 160;
    pub const EPILOGUE_GELU_AUX_BIAS: u32 = 164;

    pub type SetAttr = unsafe extern "C" fn(*mut c_void, i32, *const c_void, usize) -> Status;
}

/// The hipBLASLt entry points we call.
struct Api {
    create: unsafe extern "C" fn(*mut sys::Handle) -> sys::Status,
    destroy: unsafe extern "C" fn(sys::Handle) -> sys::Status,
    desc_create: unsafe extern "C" fn(*mut sys::MatmulDesc, i32, i32) -> sys::Status,
    desc_destroy: unsafe extern "C" fn(sys::MatmulDesc) -> sys::Status,
    desc_set: sys::SetAttr,
    layout_create: unsafe extern "C" fn(*mut sys::MatrixLayout, i32, u64, u64, i64) -> sys::Status,
    layout_destroy: unsafe extern "C" fn(sys::MatrixLayout) -> sys::Status,
    layout_set: sys::SetAttr,
    pref_create: unsafe extern "C" fn(*mut sys::Preference) -> sys::Status,
    pref_destroy: unsafe extern "C" fn(sys::Preference) -> sys::Status,
    pref_set: sys::SetAttr,
    #[allow(clippy::type_complexity)]
    heuristic: unsafe extern "C" fn(
        sys::Handle,
        sys::MatmulDesc,
        sys::MatrixLayout,
        sys::MatrixLayout,
        sys::MatrixLayout,
        sys::MatrixLayout,
        sys::Preference,
        c_int,
        *mut sys::HeuristicResult,
        *mut c_int,
    ) -> sys::Status,
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        sys::Handle,
        sys::MatmulDesc,
        *const c_void,
        *const c_void,
        sys::MatrixLayout,
        *const c_void,
        sys::MatrixLayout,
        *const c_void,
        *const c_void,
        sys::MatrixLayout,
        *mut c_void,
        sys::MatrixLayout,
        *const sys::MatmulAlgo,
        *mut c_void,
        usize,
        sys::Stream,
    ) -> sys::Status,
    /// Keeps the library mapped for the life of the process.
    _lib: libloading::Library,
}

const LIB_NAMES: &[&str] = &["libhipblaslt.so.1", "libhipblaslt.so.0", "libhipblaslt.so"];

/// A path: the only hipBLASLt library tried (e.g. the HIP test shim).
pub const LIBRARY_ENV: &str = "XLA_VMM_HIPBLASLT_LIBRARY";

/// Look up `name` in `lib` as a function pointer of type `T`.
fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
    // SAFETY: `T` is the function-pointer type hipblaslt.h declares for this
    // symbol (the declarations above); the library stays loaded as long as
    // `Api` (which owns it) lives.
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| DeviceError::NotAvailable(format!("hipBLASLt symbol {name}: {e}")))
    }
}

impl Api {
    fn load() -> Result<(Api, String)> {
        if let Some(path) = xla_vmm_ffi::settings::get().hipblaslt_library.clone() {
            return Self::open(&path)
                .map(|api| (api, path.display().to_string()))
                .map_err(|e| DeviceError::NotAvailable(format!("{LIBRARY_ENV}: {e}")));
        }
        let mut tried = Vec::new();
        for path in crate::libsearch::rocm(LIB_NAMES) {
            match Self::open(&path) {
                Ok(api) => return Ok((api, path.display().to_string())),
                Err(e) => tried.push(e),
            }
        }
        Err(DeviceError::NotAvailable(format!(
            "hipBLASLt not found (tried {})",
            tried.join("; ")
        )))
    }

    /// Open `path` and resolve every entry point (an error names what failed).
    fn open(path: &std::path::Path) -> std::result::Result<Api, String> {
        // SAFETY: loading hipBLASLt runs its initializers, which have no
        // preconditions beyond a sane process environment.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let resolve = move || -> Result<Api> {
            Ok(Api {
                create: sym(&lib, "hipblasLtCreate")?,
                destroy: sym(&lib, "hipblasLtDestroy")?,
                desc_create: sym(&lib, "hipblasLtMatmulDescCreate")?,
                desc_destroy: sym(&lib, "hipblasLtMatmulDescDestroy")?,
                desc_set: sym(&lib, "hipblasLtMatmulDescSetAttribute")?,
                layout_create: sym(&lib, "hipblasLtMatrixLayoutCreate")?,
                layout_destroy: sym(&lib, "hipblasLtMatrixLayoutDestroy")?,
                layout_set: sym(&lib, "hipblasLtMatrixLayoutSetAttribute")?,
                pref_create: sym(&lib, "hipblasLtMatmulPreferenceCreate")?,
                pref_destroy: sym(&lib, "hipblasLtMatmulPreferenceDestroy")?,
                pref_set: sym(&lib, "hipblasLtMatmulPreferenceSetAttribute")?,
                heuristic: sym(&lib, "hipblasLtMatmulAlgoGetHeuristic")?,
                matmul: sym(&lib, "hipblasLtMatmul")?,
                _lib: lib,
            })
        };
        resolve().map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn check(call: &'static str, s: sys::Status) -> Result<()> {
    if s == sys::HIPBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            call,
            code: s as i64,
            name: format!("hipblasStatus_t {s}"),
            message: String::new(),
        })
    }
}

/// The hipDataType of an XLA PrimitiveType.
fn hip_type(t: i32) -> Result<i32> {
    Ok(match t {
        xla_type::F16 => sys::HIP_R_16F,
        xla_type::BF16 => sys::HIP_R_16BF,
        xla_type::F32 => sys::HIP_R_32F,
        xla_type::F64 => sys::HIP_R_64F,
        xla_type::C64 => sys::HIP_C_32F,
        xla_type::C128 => sys::HIP_C_64F,
        xla_type::S8 => sys::HIP_R_8I,
        xla_type::S32 => sys::HIP_R_32I,
        xla_type::F8E4M3FN => sys::HIP_R_8F_E4M3,
        xla_type::F8E5M2 => sys::HIP_R_8F_E5M2,
        xla_type::F8E4M3FNUZ => sys::HIP_R_8F_E4M3_FNUZ,
        xla_type::F8E5M2FNUZ => sys::HIP_R_8F_E5M2_FNUZ,
        other => {
            return Err(DeviceError::Unsupported(format!(
                "hipBLASLt data type for XLA PrimitiveType {other}"
            )))
        }
    })
}

fn compute_type(c: ComputationType) -> i32 {
    match c {
        ComputationType::F16 => sys::HIPBLAS_COMPUTE_16F,
        ComputationType::F32 => sys::HIPBLAS_COMPUTE_32F,
        ComputationType::F64 => sys::HIPBLAS_COMPUTE_64F,
        ComputationType::I32 => sys::HIPBLAS_COMPUTE_32I,
        ComputationType::F16AsF32 => sys::HIPBLAS_COMPUTE_32F_FAST_16F,
        ComputationType::BF16AsF32 => sys::HIPBLAS_COMPUTE_32F_FAST_16BF,
        ComputationType::TF32AsF32 => sys::HIPBLAS_COMPUTE_32F_FAST_TF32,
    }
}

fn op(t: Transpose) -> i32 {
    match t {
        Transpose::NoTranspose => sys::HIPBLAS_OP_N,
        Transpose::Transpose => sys::HIPBLAS_OP_T,
        Transpose::ConjugateTranspose => sys::HIPBLAS_OP_C,
    }
}

fn epilogue(e: Epilogue) -> Result<u32> {
    Ok(match e {
        Epilogue::Default => sys::EPILOGUE_DEFAULT,
        Epilogue::Relu => sys::EPILOGUE_RELU,
        Epilogue::Bias => sys::EPILOGUE_BIAS,
        Epilogue::BiasThenRelu => sys::EPILOGUE_RELU_BIAS,
        Epilogue::Gelu => sys::EPILOGUE_GELU,
        Epilogue::GeluWithAux => sys::EPILOGUE_GELU_AUX,
        Epilogue::BiasThenGelu => sys::EPILOGUE_GELU_BIAS,
        Epilogue::BiasThenGeluWithAux => sys::EPILOGUE_GELU_AUX_BIAS,
        other => {
            return Err(DeviceError::Unsupported(format!(
                "hipBLASLt epilogue {other:?} (XLA rejects SILU epilogues too)"
            )))
        }
    })
}

fn is_f8(t: i32) -> bool {
    matches!(
        t,
        xla_type::F8E4M3FN | xla_type::F8E5M2 | xla_type::F8E4M3FNUZ | xla_type::F8E5M2FNUZ
    )
}

/// Operand type combinations XLA's ROCm `GetMatmulPlan` accepts (a, b, c, d):
/// CUDA's, with MI300's FNUZ FP8 types among the FP8 ones.
fn check_operand_types(g: &NormalizedGemm) -> Result<()> {
    use xla_type::*;
    let t = (g.a.dtype, g.b.dtype, g.c.dtype, g.d.dtype);
    let both_e5m2 = matches!((t.0, t.1), (F8E5M2, F8E5M2) | (F8E5M2FNUZ, F8E5M2FNUZ));
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
    ) || (is_f8(t.0) && is_f8(t.1) && !both_e5m2);
    if ok {
        Ok(())
    } else {
        Err(DeviceError::Unsupported(format!(
            "hipBLASLt operand types (a, b, c, d) = {t:?} (XLA PrimitiveType numbers)"
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
                "hipBLASLt scale type {other} (XLA PrimitiveType)"
            )))
        }
    })
}

struct Inner {
    api: Api,
    handle: sys::Handle,
}

// SAFETY: a hipBLASLt handle may be used from any thread as long as calls on
// it are not concurrent with its destruction, which only `Drop` does
// (exclusive access). Plans serialize their own attribute updates.
unsafe impl Send for Inner {}
// SAFETY: see above; heuristic and matmul calls on one handle from several
// threads are allowed, as with cuBLASLt.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: created by hipblasLtCreate; every plan holds an `Arc` of
        // `self`, so none outlives it.
        let s = unsafe { (self.api.destroy)(self.handle) };
        if s != sys::HIPBLAS_STATUS_SUCCESS {
            tracing::warn!(status = s, "hipblasLtDestroy failed");
        }
    }
}

/// A hipBLASLt object (descriptor, layout, preference) with its setter and
/// destructor, destroyed once on drop.
struct Object {
    lt: Arc<Inner>,
    raw: *mut c_void,
    set: sys::SetAttr,
    destroy: unsafe extern "C" fn(*mut c_void) -> sys::Status,
    what: &'static str,
}

impl Object {
    fn set<T>(&self, attr: i32, v: &T) -> Result<()> {
        let set = self.set;
        // SAFETY: `v` points to a live `T` whose size we pass; each attribute
        // is given the type hipblaslt.h documents for it.
        check(self.what, unsafe {
            set(
                self.raw,
                attr,
                (v as *const T).cast(),
                std::mem::size_of::<T>(),
            )
        })
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        // SAFETY: created by the matching hipBLASLt create call, destroyed once.
        unsafe { (self.destroy)(self.raw) };
    }
}

/// XLA's ROCm `MatmulPlan` with its algorithm chosen.
pub struct HipLtPlan {
    desc: Object,
    a: Object,
    b: Object,
    c: Object,
    d: Object,
    alpha: Vec<u8>,
    beta: Vec<u8>,
    zero_beta: bool,
    swap: bool,
    algo: sys::MatmulAlgo,
    workspace_size: u64,
    /// Serializes descriptor updates + launch (as XLA's mutex does).
    lock: Mutex<()>,
}

// SAFETY: the raw objects are only touched under `lock` (execute) or on
// drop; hipBLASLt objects are not thread-affine.
unsafe impl Send for HipLtPlan {}
// SAFETY: see above.
unsafe impl Sync for HipLtPlan {}

impl HipLtPlan {
    /// Workspace bytes the chosen algorithm needs.
    pub fn workspace_size(&self) -> u64 {
        self.workspace_size
    }

    /// Enqueue the matmul on `stream`, XLA's `MatmulPlan::ExecuteOnStream`.
    ///
    /// # Safety
    /// `stream` is a live HIP stream of the device current on this thread,
    /// and every non-zero pointer in `args` addresses device memory of the
    /// sizes the plan's layouts describe.
    unsafe fn execute(&self, args: &MatmulArgs, stream: sys::Stream) -> Result<()> {
        let (mut a, mut b) = (args.a.0, args.b.0);
        let (mut a_scale, mut b_scale) = (args.a_scale.0, args.b_scale.0);
        if self.swap {
            std::mem::swap(&mut a, &mut b);
            std::mem::swap(&mut a_scale, &mut b_scale);
        }
        let (mut ws, mut ws_size) = (0u64, 0u64);
        if self.workspace_size > 0 {
            if args.workspace.0 == 0 || args.workspace_bytes < self.workspace_size {
                return Err(DeviceError::InvalidArgument(format!(
                    "hipBLASLt algorithm needs {} workspace bytes, thunk gives {}",
                    self.workspace_size, args.workspace_bytes
                )));
            }
            ws = args.workspace.0;
            ws_size = args.workspace_bytes;
        }
        if args.aux.0 != 0 {
            return Err(DeviceError::Unsupported(
                "hipBLASLt epilogue auxiliary output (needs the layout's ld / batch stride)".into(),
            ));
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if args.bias.0 != 0 {
            self.desc.set(sys::DESC_BIAS_POINTER, &args.bias.0)?;
        }
        self.desc.set(sys::DESC_A_SCALE_POINTER, &a_scale)?;
        self.desc.set(sys::DESC_B_SCALE_POINTER, &b_scale)?;
        self.desc.set(sys::DESC_C_SCALE_POINTER, &args.c_scale.0)?;
        self.desc.set(sys::DESC_D_SCALE_POINTER, &args.d_scale.0)?;
        self.desc.set(sys::DESC_AMAX_D_POINTER, &args.d_amax.0)?;
        let c_ptr = if self.zero_beta { 0 } else { args.c.0 };
        let lt = &self.desc.lt;
        // SAFETY: every object is live; alpha / beta point to scale-type
        // values; the caller guarantees the pointers and the stream.
        check("hipblasLtMatmul", unsafe {
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
                args.d.0 as *mut c_void,
                self.d.raw,
                &self.algo,
                ws as *mut c_void,
                ws_size as usize,
                stream,
            )
        })
    }
}

/// The [`GemmEngine`] of a [`HipBackend`]: one hipBLASLt handle on its
/// device, plans prepared at load time; rocBLAS for triangular solves,
/// loaded when the first program with one is loaded.
pub struct HipGemm {
    ordinal: i32,
    lt: Arc<Inner>,
    library: String,
    plans: PlanTable<HipLtPlan>,
    /// rocBLAS for triangular solves and inverse FFTs' scaling.
    rocblas: LazySolver,
    /// hipFFT and its plans.
    hipfft: LazyLib<FftLib<*mut c_void>>,
    /// `tsl::tensor_float_32_execution_enabled()`: on in JAX by default.
    tf32: bool,
}

impl HipGemm {
    /// Load hipBLASLt and create a handle on `backend`'s device.
    pub fn new(backend: &HipBackend) -> Result<Self> {
        backend.bind()?;
        let (api, library) = Api::load()?;
        let mut handle: sys::Handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out pointer; the device is current.
        check("hipblasLtCreate", unsafe { (api.create)(&mut handle) })?;
        tracing::info!(library = %library, "hipBLASLt loaded");
        Ok(HipGemm {
            ordinal: backend.ordinal,
            lt: Arc::new(Inner { api, handle }),
            library,
            plans: PlanTable::default(),
            rocblas: LazySolver::default(),
            hipfft: LazyLib::default(),
            tf32: true,
        })
    }

    /// Path (or name) of the loaded hipBLASLt library.
    pub fn library(&self) -> &str {
        &self.library
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the ordinal is the backend's, validated when it opened.
        unsafe { super::result::device::set(self.ordinal) }
    }

    fn object(
        &self,
        raw: *mut c_void,
        set: sys::SetAttr,
        destroy: unsafe extern "C" fn(*mut c_void) -> sys::Status,
        what: &'static str,
    ) -> Object {
        Object {
            lt: self.lt.clone(),
            raw,
            set,
            destroy,
            what,
        }
    }

    fn layout(&self, m: &crate::blas::MatrixLayout) -> Result<Object> {
        let rows = u64::try_from(m.num_rows)
            .map_err(|_| DeviceError::InvalidArgument(format!("matrix rows {}", m.num_rows)))?;
        let cols = u64::try_from(m.num_cols)
            .map_err(|_| DeviceError::InvalidArgument(format!("matrix cols {}", m.num_cols)))?;
        let api = &self.lt.api;
        let mut raw: sys::MatrixLayout = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        check("hipblasLtMatrixLayoutCreate", unsafe {
            (api.layout_create)(
                &mut raw,
                hip_type(m.dtype)?,
                rows,
                cols,
                m.leading_dim_stride,
            )
        })?;
        let layout = self.object(
            raw,
            api.layout_set,
            api.layout_destroy,
            "hipblasLtMatrixLayoutSetAttribute",
        );
        let order = match m.order {
            Order::RowMajor => sys::ORDER_ROW,
            Order::ColumnMajor => sys::ORDER_COL,
        };
        layout.set(sys::LAYOUT_ORDER, &order)?;
        let batch = i32::try_from(m.batch_size)
            .map_err(|_| DeviceError::InvalidArgument(format!("batch {}", m.batch_size)))?;
        layout.set(sys::LAYOUT_BATCH_COUNT, &batch)?;
        layout.set(sys::LAYOUT_STRIDED_BATCH_OFFSET, &m.batch_stride)?;
        Ok(layout)
    }

    /// Build XLA's plan and pick algorithm `algorithm_idx` among the
    /// successful heuristic results for `max_algorithms` requested under
    /// `max_workspace` bytes.
    fn plan(
        &self,
        g: &NormalizedGemm,
        epi: Epilogue,
        algorithm_idx: usize,
        max_algorithms: usize,
        max_workspace: u64,
    ) -> Result<HipLtPlan> {
        check_operand_types(g)?;
        let api = &self.lt.api;
        let mut raw: sys::MatmulDesc = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        check("hipblasLtMatmulDescCreate", unsafe {
            (api.desc_create)(
                &mut raw,
                compute_type(g.compute_type),
                hip_type(g.scale_type)?,
            )
        })?;
        let desc = self.object(
            raw,
            api.desc_set,
            api.desc_destroy,
            "hipblasLtMatmulDescSetAttribute",
        );
        desc.set(sys::DESC_POINTER_MODE, &sys::POINTER_MODE_HOST)?;
        desc.set(sys::DESC_TRANSA, &op(g.trans_a))?;
        desc.set(sys::DESC_TRANSB, &op(g.trans_b))?;
        desc.set(sys::DESC_EPILOGUE, &epilogue(epi)?)?;
        let (a, b, c, d) = (
            self.layout(&g.a)?,
            self.layout(&g.b)?,
            self.layout(&g.c)?,
            self.layout(&g.d)?,
        );
        if is_f8(g.a.dtype) || is_f8(g.b.dtype) {
            // As on CUDA: dummy non-null scale pointers before the heuristic
            // query, so that FP8 scaling algorithms are considered.
            let dummy: usize = 0x40;
            desc.set(sys::DESC_A_SCALE_POINTER, &dummy)?;
            desc.set(sys::DESC_B_SCALE_POINTER, &dummy)?;
            if is_f8(g.c.dtype) {
                desc.set(sys::DESC_C_SCALE_POINTER, &dummy)?;
            }
            if is_f8(g.d.dtype) {
                desc.set(sys::DESC_D_SCALE_POINTER, &dummy)?;
            }
        }
        let mut raw_pref: sys::Preference = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check("hipblasLtMatmulPreferenceCreate", unsafe {
            (api.pref_create)(&mut raw_pref)
        })?;
        let pref = self.object(
            raw_pref,
            api.pref_set,
            api.pref_destroy,
            "hipblasLtMatmulPreferenceSetAttribute",
        );
        pref.set(sys::PREF_MAX_WORKSPACE_BYTES, &max_workspace)?;
        let count = max_algorithms.clamp(1, i32::MAX as usize);
        let mut results = vec![sys::HeuristicResult::default(); count];
        let mut found: c_int = 0;
        // SAFETY: every object is live; `results` has room for `count`.
        check("hipblasLtMatmulAlgoGetHeuristic", unsafe {
            (api.heuristic)(
                self.lt.handle,
                desc.raw,
                a.raw,
                b.raw,
                c.raw,
                d.raw,
                pref.raw,
                count as c_int,
                results.as_mut_ptr(),
                &mut found,
            )
        })?;
        results.truncate(found.clamp(0, count as c_int) as usize);
        let ok: Vec<_> = results
            .into_iter()
            .filter(|r| r.state == sys::HIPBLAS_STATUS_SUCCESS)
            .collect();
        let chosen = ok.get(algorithm_idx).ok_or_else(|| {
            DeviceError::InvalidArgument(format!(
                "hipBLASLt algorithm index {algorithm_idx} out of range: the heuristic returned {} \
                 usable algorithms (asked for {count}, workspace limit {max_workspace} B)",
                ok.len()
            ))
        })?;
        Ok(HipLtPlan {
            alpha: scale_bytes(g.scale_type, g.alpha_real, g.alpha_imag)?,
            beta: scale_bytes(g.scale_type, g.beta, 0.0)?,
            zero_beta: g.beta == 0.0,
            swap: g.swap_operands,
            algo: chosen.algo,
            workspace_size: chosen.workspace_size as u64,
            lock: Mutex::new(()),
            desc,
            a,
            b,
            c,
            d,
        })
    }

    /// How rocBLAS is loaded (on first use, with the device current).
    fn load_rocblas(&self) -> Result<Solver> {
        self.bind().and_then(|()| super::rocblas::solver())
    }
}

impl GemmEngine<HipBackend> for HipGemm {
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
        let plan = self.plan(&g, epi, algorithm_idx, max_algorithms, max_workspace)?;
        tracing::debug!(
            ?g,
            algorithm_idx,
            workspace = plan.workspace_size(),
            "hipBLASLt plan"
        );
        Ok(GemmPlanId(self.plans.insert(plan)))
    }

    fn workspace_needed(&self, plan: GemmPlanId) -> Result<u64> {
        Ok(self.plans.get(plan.0, "GEMM")?.workspace_size())
    }

    fn run(&self, plan: GemmPlanId, args: &MatmulArgs, stream: &HipStream) -> Result<()> {
        let plan = self.plans.get(plan.0, "GEMM")?;
        self.bind()?;
        // SAFETY: the stream is this device's (bound above); the runtime
        // resolves every pointer from the executable's slices, which the
        // decoder checked against allocation sizes.
        unsafe { plan.execute(args, stream.raw.cast()) }
    }

    fn release(&self, plan: GemmPlanId) {
        self.plans.remove(plan.0);
    }

    fn release_fft(&self, plan: FftPlanId) {
        if let Some(hipfft) = self.hipfft.peek() {
            // A plan destroyed goes with the device current.
            if self.bind().is_ok() {
                hipfft.release(plan);
            }
        }
    }

    fn live_plans(&self) -> LivePlans {
        LivePlans {
            gemm: self.plans.len(),
            conv: 0,
            fft: self.hipfft.peek().map_or(0, FftLib::live),
        }
    }

    fn prepare_trsm(&self, spec: &TrsmSpec) -> Result<()> {
        self.rocblas.prepare(spec, || self.load_rocblas())
    }

    fn trsm(&self, spec: &TrsmSpec, args: TrsmArgs, stream: &HipStream) -> Result<()> {
        let rocblas = self.rocblas.get(|| self.load_rocblas())?;
        self.bind()?;
        // SAFETY: the stream is this device's (bound above); the runtime
        // resolves the operands from the executable's slices, which the
        // decoder checked against the solve's sizes, and writes the pointer
        // arrays of a batched solve before it on the same stream.
        unsafe { rocblas.trsm(spec, args, stream.raw.cast()) }
    }

    // `library_calls_capturable` stays false: no AMD GPU here has run
    // rocBLAS's solves or rocFFT's plans under a hipGraph capture, so a
    // program with one runs eager on HIP.

    fn prepare_fft(&self, spec: &FftSpec) -> Result<FftPlanId> {
        if spec.is_inverse() {
            self.rocblas.get(|| self.load_rocblas())?;
        }
        self.bind()?;
        self.hipfft.get(super::hipfft::library)?.prepare(spec)
    }

    fn fft_workspace(&self, plan: FftPlanId) -> Result<u64> {
        self.hipfft.loaded_ref()?.workspace(plan)
    }

    fn run_fft(&self, plan: FftPlanId, args: &FftArgs, stream: &HipStream) -> Result<()> {
        let hipfft = self.hipfft.loaded_ref()?;
        self.bind()?;
        // SAFETY: the stream is this device's (bound above); the runtime
        // resolves input and output from the executable's slices, which it
        // checked against the transform's sizes at load, and gives the work
        // area the plan asked for.
        unsafe { hipfft.run(plan, args, stream.raw.cast(), self.rocblas.peek()) }
    }
}

impl Drop for HipGemm {
    fn drop(&mut self) {
        // hipFFT's plans are destroyed with the device current.
        if self.hipfft.loaded().is_some() {
            let _ = self.bind();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_structs_have_the_header_layouts() {
        // hipblasLtMatmulAlgo_t: uint8_t[16] + size_t; the heuristic result
        // adds size_t, hipblasStatus_t, float and int[4].
        assert_eq!(std::mem::size_of::<sys::MatmulAlgo>(), 24);
        assert_eq!(std::mem::size_of::<sys::HeuristicResult>(), 56);
        assert_eq!(std::mem::offset_of!(sys::HeuristicResult, state), 32);
    }

    #[test]
    fn types_operations_and_epilogues_are_hipblaslts_numbers() {
        assert_eq!(hip_type(xla_type::BF16).unwrap(), 14);
        assert_eq!(hip_type(xla_type::F8E4M3FNUZ).unwrap(), 1000);
        assert_eq!(hip_type(xla_type::F8E5M2FNUZ).unwrap(), 1001);
        assert!(hip_type(99).is_err());
        assert_eq!(op(Transpose::NoTranspose), 111);
        assert_eq!(op(Transpose::ConjugateTranspose), 113);
        assert_eq!(epilogue(Epilogue::BiasThenGeluWithAux).unwrap(), 164);
        assert_eq!(compute_type(ComputationType::TF32AsF32), 6);
    }

    #[test]
    fn without_the_library_loading_is_an_error_not_a_crash() {
        if crate::libsearch::rocm(LIB_NAMES)
            .iter()
            .any(|p| p.is_absolute())
        {
            return; // a real hipBLASLt is installed here
        }
        let e = Api::load().err().expect("no hipBLASLt on this machine");
        assert!(e.to_string().contains("hipBLASLt not found"), "{e}");
    }
}

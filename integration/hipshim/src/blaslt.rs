//! The hipBLASLt entry points our HIP GEMM engine calls
//! ([`crate::HIPBLASLT_ENTRY_POINTS`], `crates/device/src/hip/blaslt.rs`),
//! on cuBLASLt (cudarc's bindings, loaded at run time: `libcublasLt.so.13`
//! on the loader's path).
//!
//! Point `XLA_VMM_HIPBLASLT_LIBRARY` at this library (the same file as the
//! HIP runtime, so one copy of the shim's state serves both).
//!
//! How it maps (hipBLASLt's numbers are the ones our engine declares; a
//! test compares the two tables):
//! - Handles, descriptors, layouts and preferences are cuBLASLt's objects
//!   (pointers on both sides); streams are the CUDA streams the shim's HIP
//!   runtime handed out.
//! - Values: data types (hipDataType and cudaDataType agree on every one we
//!   use; MI300's FNUZ FP8 types have no CUDA twin: `NOT_SUPPORTED`), compute
//!   types (hipblasComputeType_t -> cublasComputeType_t by name), operations
//!   (`HIPBLAS_OP_N/T/C` = 111/112/113 -> `CUBLAS_OP_N/T/C` = 0/1/2),
//!   epilogues, orders and pointer modes (same numbers on both sides, checked
//!   against a list), attribute numbers (translated by name: they differ).
//! - Algorithms: `hipblasLtMatmulAlgo_t` has 16 bytes of data, cuBLASLt's
//!   algorithm 64. The heuristic keeps each cuBLASLt algorithm in a table
//!   and hands out a key (a tag and an index in the 16 bytes);
//!   `hipblasLtMatmul` looks it up. An algorithm the shim did not hand out is
//!   `INVALID_VALUE`.
//!
//! Without libcuda or cuBLASLt every call is `HIPBLAS_STATUS_NOT_INITIALIZED`;
//! a panic is `HIPBLAS_STATUS_UNKNOWN`; nothing unwinds into C. This checks
//! our HIP engine's calls, not hipBLASLt: the kernels and the heuristic are
//! cuBLASLt's.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

use cudarc::cublaslt::sys as lt;

use crate::driver;

/// `hipblasStatus_t` (hipblas-common.h).
pub type Status = i32;
pub const HIPBLAS_STATUS_SUCCESS: Status = 0;
pub const HIPBLAS_STATUS_NOT_INITIALIZED: Status = 1;
pub const HIPBLAS_STATUS_ALLOC_FAILED: Status = 2;
pub const HIPBLAS_STATUS_INVALID_VALUE: Status = 3;
pub const HIPBLAS_STATUS_MAPPING_ERROR: Status = 4;
pub const HIPBLAS_STATUS_EXECUTION_FAILED: Status = 5;
pub const HIPBLAS_STATUS_INTERNAL_ERROR: Status = 6;
pub const HIPBLAS_STATUS_NOT_SUPPORTED: Status = 7;
pub const HIPBLAS_STATUS_ARCH_MISMATCH: Status = 8;
pub const HIPBLAS_STATUS_UNKNOWN: Status = 11;

type R<T> = Result<T, Status>;

/// hipBLASLt's numbers as our engine declares them
/// (`crates/device/src/hip/blaslt.rs`, module `sys`): `(name, value)`.
pub const HIP_VALUES: [(&str, i64); 44] = [
    ("HIP_R_32F", 0),
    ("HIP_R_64F", 1),
    ("HIP_R_16F", 2),
    ("HIP_R_8I", 3),
    ("HIP_C_32F", 4),
    ("HIP_C_64F", 5),
    ("HIP_R_32I", 10),
    ("HIP_R_16BF", 14),
    ("HIP_R_8F_E4M3", 28),
    ("HIP_R_8F_E5M2", 29),
    ("HIP_R_8F_E4M3_FNUZ", 1000),
    ("HIP_R_8F_E5M2_FNUZ", 1001),
    ("HIPBLAS_COMPUTE_16F", 0),
    ("HIPBLAS_COMPUTE_32F", 2),
    ("HIPBLAS_COMPUTE_32F_FAST_16F", 4),
    ("HIPBLAS_COMPUTE_32F_FAST_16BF", 5),
    ("HIPBLAS_COMPUTE_32F_FAST_TF32", 6),
    ("HIPBLAS_COMPUTE_64F", 7),
    ("HIPBLAS_COMPUTE_32I", 9),
    ("HIPBLAS_OP_N", 111),
    ("HIPBLAS_OP_T", 112),
    ("HIPBLAS_OP_C", 113),
    ("DESC_TRANSA", 0),
    ("DESC_TRANSB", 1),
    ("DESC_EPILOGUE", 2),
    ("DESC_BIAS_POINTER", 3),
    ("DESC_A_SCALE_POINTER", 5),
    ("DESC_B_SCALE_POINTER", 6),
    ("DESC_C_SCALE_POINTER", 7),
    ("DESC_D_SCALE_POINTER", 8),
    ("DESC_POINTER_MODE", 13),
    ("DESC_AMAX_D_POINTER", 14),
    ("LAYOUT_BATCH_COUNT", 0),
    ("LAYOUT_STRIDED_BATCH_OFFSET", 1),
    ("LAYOUT_ORDER", 3),
    ("PREF_MAX_WORKSPACE_BYTES", 1),
    ("EPILOGUE_DEFAULT", 1),
    ("EPILOGUE_RELU", 2),
    ("EPILOGUE_BIAS", 4),
    ("EPILOGUE_RELU_BIAS", 6),
    ("EPILOGUE_GELU", 32),
    ("EPILOGUE_GELU_BIAS", 36),
    ("EPILOGUE_GELU_AUX", 160),
    ("EPILOGUE_GELU_AUX_BIAS", 164),
];

/// A hipBLASLt number by its name in [`HIP_VALUES`].
const fn hip(name: &str) -> i64 {
    let mut i = 0;
    while i < HIP_VALUES.len() {
        if const_eq(HIP_VALUES[i].0, name) {
            return HIP_VALUES[i].1;
        }
        i += 1;
    }
    panic!("not in HIP_VALUES")
}

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `cublasOperation_t` (cublas_api.h): N, T, C.
const CUBLAS_OP: [i32; 3] = [0, 1, 2];

/// Is cuBLASLt loadable (and libcuda)? Asked once; cudarc panics on every
/// call otherwise.
fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: only tries to load the library.
        driver::cuda_present()
            && catch_unwind(|| unsafe { lt::is_culib_present() }).unwrap_or(false)
    })
}

/// Run an export's body: no libcuda / cuBLASLt: `NOT_INITIALIZED`; a panic:
/// `UNKNOWN`; never an unwind into C.
fn entry(body: impl FnOnce() -> R<()>) -> Status {
    let run = AssertUnwindSafe(|| {
        if !present() {
            return Err(HIPBLAS_STATUS_NOT_INITIALIZED);
        }
        body()
    });
    match catch_unwind(run) {
        Ok(Ok(())) => HIPBLAS_STATUS_SUCCESS,
        Ok(Err(s)) => s,
        Err(_) => HIPBLAS_STATUS_UNKNOWN,
    }
}

/// A cuBLASLt status as hipBLASLt's (cublas_api.h, hipblas-common.h).
fn from_cublas(s: lt::cublasStatus_t) -> Status {
    use lt::cublasStatus_t::*;
    match s {
        CUBLAS_STATUS_SUCCESS => HIPBLAS_STATUS_SUCCESS,
        CUBLAS_STATUS_NOT_INITIALIZED => HIPBLAS_STATUS_NOT_INITIALIZED,
        CUBLAS_STATUS_ALLOC_FAILED => HIPBLAS_STATUS_ALLOC_FAILED,
        CUBLAS_STATUS_INVALID_VALUE => HIPBLAS_STATUS_INVALID_VALUE,
        CUBLAS_STATUS_ARCH_MISMATCH => HIPBLAS_STATUS_ARCH_MISMATCH,
        CUBLAS_STATUS_MAPPING_ERROR => HIPBLAS_STATUS_MAPPING_ERROR,
        CUBLAS_STATUS_EXECUTION_FAILED => HIPBLAS_STATUS_EXECUTION_FAILED,
        CUBLAS_STATUS_INTERNAL_ERROR => HIPBLAS_STATUS_INTERNAL_ERROR,
        CUBLAS_STATUS_NOT_SUPPORTED => HIPBLAS_STATUS_NOT_SUPPORTED,
        _ => HIPBLAS_STATUS_UNKNOWN,
    }
}

fn check(s: lt::cublasStatus_t) -> R<()> {
    match from_cublas(s) {
        HIPBLAS_STATUS_SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// The cuBLASLt twin of hipBLASLt value `t`, through `(hip name, cuda value)` pairs.
fn by_name<T: Copy>(pairs: &[(&str, T)], t: i32, missing: Status) -> R<T> {
    pairs
        .iter()
        .find(|(h, _)| hip(h) == i64::from(t))
        .map(|&(_, c)| c)
        .ok_or(missing)
}

fn data_type(t: i32) -> R<lt::cudaDataType_t> {
    use lt::cudaDataType_t::*;
    let pairs = [
        ("HIP_R_32F", CUDA_R_32F),
        ("HIP_R_64F", CUDA_R_64F),
        ("HIP_R_16F", CUDA_R_16F),
        ("HIP_R_8I", CUDA_R_8I),
        ("HIP_C_32F", CUDA_C_32F),
        ("HIP_C_64F", CUDA_C_64F),
        ("HIP_R_32I", CUDA_R_32I),
        ("HIP_R_16BF", CUDA_R_16BF),
        ("HIP_R_8F_E4M3", CUDA_R_8F_E4M3),
        ("HIP_R_8F_E5M2", CUDA_R_8F_E5M2),
    ];
    by_name(&pairs, t, HIPBLAS_STATUS_NOT_SUPPORTED)
}

fn compute_type(t: i32) -> R<lt::cublasComputeType_t> {
    use lt::cublasComputeType_t::*;
    let pairs = [
        ("HIPBLAS_COMPUTE_16F", CUBLAS_COMPUTE_16F),
        ("HIPBLAS_COMPUTE_32F", CUBLAS_COMPUTE_32F),
        ("HIPBLAS_COMPUTE_32F_FAST_16F", CUBLAS_COMPUTE_32F_FAST_16F),
        (
            "HIPBLAS_COMPUTE_32F_FAST_16BF",
            CUBLAS_COMPUTE_32F_FAST_16BF,
        ),
        (
            "HIPBLAS_COMPUTE_32F_FAST_TF32",
            CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        ("HIPBLAS_COMPUTE_64F", CUBLAS_COMPUTE_64F),
        ("HIPBLAS_COMPUTE_32I", CUBLAS_COMPUTE_32I),
    ];
    by_name(&pairs, t, HIPBLAS_STATUS_INVALID_VALUE)
}

/// The attribute value the caller passed, `size` bytes at `buf`.
///
/// # Safety
/// `buf` is null or valid for `size` bytes.
unsafe fn value<'a>(buf: *const c_void, size: usize) -> R<&'a [u8]> {
    if buf.is_null() {
        return Err(HIPBLAS_STATUS_INVALID_VALUE);
    }
    // SAFETY: non-null, valid for `size` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) })
}

fn i32_of(v: &[u8]) -> R<i32> {
    v.try_into()
        .map(i32::from_ne_bytes)
        .map_err(|_| HIPBLAS_STATUS_INVALID_VALUE)
}

/// An attribute translated: cuBLASLt's attribute and value bytes.
type Translated<A> = (A, Vec<u8>);

/// A matmul descriptor attribute: operations translated, epilogues and the
/// pointer mode checked, pointers passed on.
fn desc_attribute(attr: i32, v: &[u8]) -> R<Translated<lt::cublasLtMatmulDescAttributes_t>> {
    use lt::cublasLtMatmulDescAttributes_t::*;
    let a = i64::from(attr);
    let pointer = |c| {
        if v.len() != std::mem::size_of::<usize>() {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        Ok((c, v.to_vec()))
    };
    if a == hip("DESC_TRANSA") || a == hip("DESC_TRANSB") {
        let ops = [
            hip("HIPBLAS_OP_N"),
            hip("HIPBLAS_OP_T"),
            hip("HIPBLAS_OP_C"),
        ];
        let o = i64::from(i32_of(v)?);
        let k = ops
            .iter()
            .position(|&x| x == o)
            .ok_or(HIPBLAS_STATUS_INVALID_VALUE)?;
        let c = if a == hip("DESC_TRANSA") {
            CUBLASLT_MATMUL_DESC_TRANSA
        } else {
            CUBLASLT_MATMUL_DESC_TRANSB
        };
        return Ok((c, CUBLAS_OP[k].to_ne_bytes().to_vec()));
    }
    if a == hip("DESC_EPILOGUE") {
        let e = i64::from(i32_of(v)?);
        let known = HIP_VALUES
            .iter()
            .any(|(n, x)| n.starts_with("EPILOGUE_") && *x == e);
        // cuBLASLt numbers its epilogues as hipBLASLt does.
        return if known {
            Ok((CUBLASLT_MATMUL_DESC_EPILOGUE, v.to_vec()))
        } else {
            Err(HIPBLAS_STATUS_NOT_SUPPORTED)
        };
    }
    if a == hip("DESC_POINTER_MODE") {
        // HOST (0) on both sides; nothing else is used.
        return if i32_of(v)? == 0 {
            Ok((CUBLASLT_MATMUL_DESC_POINTER_MODE, v.to_vec()))
        } else {
            Err(HIPBLAS_STATUS_NOT_SUPPORTED)
        };
    }
    let pointers = [
        ("DESC_BIAS_POINTER", CUBLASLT_MATMUL_DESC_BIAS_POINTER),
        ("DESC_A_SCALE_POINTER", CUBLASLT_MATMUL_DESC_A_SCALE_POINTER),
        ("DESC_B_SCALE_POINTER", CUBLASLT_MATMUL_DESC_B_SCALE_POINTER),
        ("DESC_C_SCALE_POINTER", CUBLASLT_MATMUL_DESC_C_SCALE_POINTER),
        ("DESC_D_SCALE_POINTER", CUBLASLT_MATMUL_DESC_D_SCALE_POINTER),
        ("DESC_AMAX_D_POINTER", CUBLASLT_MATMUL_DESC_AMAX_D_POINTER),
    ];
    match pointers.iter().find(|(h, _)| hip(h) == a) {
        Some(&(_, c)) => pointer(c),
        None => Err(HIPBLAS_STATUS_NOT_SUPPORTED),
    }
}

/// A matrix layout attribute: the order checked, counts passed on.
fn layout_attribute(attr: i32, v: &[u8]) -> R<Translated<lt::cublasLtMatrixLayoutAttribute_t>> {
    use lt::cublasLtMatrixLayoutAttribute_t::*;
    let a = i64::from(attr);
    if a == hip("LAYOUT_ORDER") {
        // COL (0) and ROW (1) on both sides.
        return match i32_of(v)? {
            0 | 1 => Ok((CUBLASLT_MATRIX_LAYOUT_ORDER, v.to_vec())),
            _ => Err(HIPBLAS_STATUS_NOT_SUPPORTED),
        };
    }
    if a == hip("LAYOUT_BATCH_COUNT") && v.len() == 4 {
        return Ok((CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, v.to_vec()));
    }
    if a == hip("LAYOUT_STRIDED_BATCH_OFFSET") && v.len() == 8 {
        return Ok((CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, v.to_vec()));
    }
    Err(HIPBLAS_STATUS_NOT_SUPPORTED)
}

/// A preference attribute: the workspace limit.
fn preference_attribute(
    attr: i32,
    v: &[u8],
) -> R<Translated<lt::cublasLtMatmulPreferenceAttributes_t>> {
    use lt::cublasLtMatmulPreferenceAttributes_t::*;
    if i64::from(attr) == hip("PREF_MAX_WORKSPACE_BYTES") && v.len() == 8 {
        Ok((CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, v.to_vec()))
    } else {
        Err(HIPBLAS_STATUS_NOT_SUPPORTED)
    }
}

// ---- algorithms -----------------------------------------------------------

/// `hipblasLtMatmulAlgo_t` (hipblaslt.h).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct HipAlgo {
    pub data: [u8; 16],
    pub max_workspace_bytes: usize,
}

/// `hipblasLtMatmulHeuristicResult_t` (hipblaslt.h).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct HipHeuristicResult {
    pub algo: HipAlgo,
    pub workspace_size: usize,
    pub state: Status,
    pub waves_count: f32,
    pub reserved: [i32; 4],
}

/// The tag in the last 8 bytes of an algorithm the shim handed out.
const TAG: [u8; 8] = *b"vmmshim\0";

/// cuBLASLt algorithms handed out, by key (index), and the key of each.
#[derive(Default)]
struct Algos {
    list: Vec<lt::cublasLtMatmulAlgo_t>,
    keys: HashMap<lt::cublasLtMatmulAlgo_t, u64>,
}

fn algos() -> std::sync::MutexGuard<'static, Algos> {
    static ALGOS: OnceLock<Mutex<Algos>> = OnceLock::new();
    ALGOS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The HIP algorithm standing for `a` (the same key for the same algorithm).
fn hand_out(a: lt::cublasLtMatmulAlgo_t, workspace: usize) -> HipAlgo {
    let mut t = algos();
    let next = t.list.len() as u64;
    let key = *t.keys.entry(a).or_insert(next);
    if key == next {
        t.list.push(a);
    }
    let mut data = [0u8; 16];
    data[..8].copy_from_slice(&key.to_le_bytes());
    data[8..].copy_from_slice(&TAG);
    HipAlgo {
        data,
        max_workspace_bytes: workspace,
    }
}

/// The cuBLASLt algorithm a HIP one stands for.
fn look_up(h: &HipAlgo) -> R<lt::cublasLtMatmulAlgo_t> {
    if h.data[8..] != TAG {
        return Err(HIPBLAS_STATUS_INVALID_VALUE);
    }
    let key = u64::from_le_bytes(h.data[..8].try_into().expect("8 bytes"));
    algos()
        .list
        .get(key as usize)
        .copied()
        .ok_or(HIPBLAS_STATUS_INVALID_VALUE)
}

// ---- exports --------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipblasLtCreate(handle: *mut lt::cublasLtHandle_t) -> Status {
    entry(|| {
        if handle.is_null() {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        driver::bind().map_err(|_| HIPBLAS_STATUS_NOT_INITIALIZED)?;
        // SAFETY: non-null out pointer (the caller's contract: writable).
        check(unsafe { lt::cublasLtCreate(handle) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtDestroy(handle: lt::cublasLtHandle_t) -> Status {
    // SAFETY: a handle from hipblasLtCreate (the caller's contract).
    entry(|| check(unsafe { lt::cublasLtDestroy(handle) }))
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatmulDescCreate(
    desc: *mut lt::cublasLtMatmulDesc_t,
    compute: i32,
    scale: i32,
) -> Status {
    entry(|| {
        if desc.is_null() {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        let (c, s) = (compute_type(compute)?, data_type(scale)?);
        // SAFETY: non-null out pointer; valid enum values.
        check(unsafe { lt::cublasLtMatmulDescCreate(desc, c, s) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatmulDescDestroy(desc: lt::cublasLtMatmulDesc_t) -> Status {
    // SAFETY: a descriptor from hipblasLtMatmulDescCreate.
    entry(|| check(unsafe { lt::cublasLtMatmulDescDestroy(desc) }))
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatmulDescSetAttribute(
    desc: lt::cublasLtMatmulDesc_t,
    attr: i32,
    buf: *const c_void,
    size: usize,
) -> Status {
    entry(|| {
        // SAFETY: `buf` is valid for `size` bytes (the caller's contract).
        let (a, v) = desc_attribute(attr, unsafe { value(buf, size) }?)?;
        // SAFETY: `v` is attribute `a`'s value, live for the call.
        check(unsafe { lt::cublasLtMatmulDescSetAttribute(desc, a, v.as_ptr().cast(), v.len()) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatrixLayoutCreate(
    layout: *mut lt::cublasLtMatrixLayout_t,
    ty: i32,
    rows: u64,
    cols: u64,
    ld: i64,
) -> Status {
    entry(|| {
        if layout.is_null() {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        let t = data_type(ty)?;
        // SAFETY: non-null out pointer; a valid data type.
        check(unsafe { lt::cublasLtMatrixLayoutCreate(layout, t, rows, cols, ld) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatrixLayoutDestroy(
    layout: lt::cublasLtMatrixLayout_t,
) -> Status {
    // SAFETY: a layout from hipblasLtMatrixLayoutCreate.
    entry(|| check(unsafe { lt::cublasLtMatrixLayoutDestroy(layout) }))
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatrixLayoutSetAttribute(
    layout: lt::cublasLtMatrixLayout_t,
    attr: i32,
    buf: *const c_void,
    size: usize,
) -> Status {
    entry(|| {
        // SAFETY: `buf` is valid for `size` bytes (the caller's contract).
        let (a, v) = layout_attribute(attr, unsafe { value(buf, size) }?)?;
        // SAFETY: `v` is attribute `a`'s value, live for the call.
        check(unsafe {
            lt::cublasLtMatrixLayoutSetAttribute(layout, a, v.as_ptr().cast(), v.len())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatmulPreferenceCreate(
    pref: *mut lt::cublasLtMatmulPreference_t,
) -> Status {
    entry(|| {
        if pref.is_null() {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        // SAFETY: non-null out pointer.
        check(unsafe { lt::cublasLtMatmulPreferenceCreate(pref) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatmulPreferenceDestroy(
    pref: lt::cublasLtMatmulPreference_t,
) -> Status {
    // SAFETY: a preference from hipblasLtMatmulPreferenceCreate.
    entry(|| check(unsafe { lt::cublasLtMatmulPreferenceDestroy(pref) }))
}

#[no_mangle]
pub unsafe extern "C" fn hipblasLtMatmulPreferenceSetAttribute(
    pref: lt::cublasLtMatmulPreference_t,
    attr: i32,
    buf: *const c_void,
    size: usize,
) -> Status {
    entry(|| {
        // SAFETY: `buf` is valid for `size` bytes (the caller's contract).
        let (a, v) = preference_attribute(attr, unsafe { value(buf, size) }?)?;
        // SAFETY: `v` is attribute `a`'s value, live for the call.
        check(unsafe {
            lt::cublasLtMatmulPreferenceSetAttribute(pref, a, v.as_ptr().cast(), v.len())
        })
    })
}

/// Most results one heuristic query returns (hipBLASLt's callers ask for
/// tens; a larger count from a C caller is not an allocation size).
const MAX_RESULTS: c_int = 1024;

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hipblasLtMatmulAlgoGetHeuristic(
    handle: lt::cublasLtHandle_t,
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    pref: lt::cublasLtMatmulPreference_t,
    requested: c_int,
    results: *mut HipHeuristicResult,
    returned: *mut c_int,
) -> Status {
    entry(|| {
        if results.is_null() || returned.is_null() || !(1..=MAX_RESULTS).contains(&requested) {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        driver::bind().map_err(|_| HIPBLAS_STATUS_NOT_INITIALIZED)?;
        let n = requested as usize;
        // SAFETY: zeroed is a valid cublasLtMatmulHeuristicResult_t (plain data).
        let mut got: Vec<lt::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; n];
        let mut found: c_int = 0;
        // SAFETY: the objects are the caller's live cuBLASLt objects; `got`
        // has room for `requested` results.
        check(unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                handle,
                desc,
                a,
                b,
                c,
                d,
                pref,
                requested,
                got.as_mut_ptr(),
                &mut found,
            )
        })?;
        let found = found.clamp(0, requested);
        for (i, r) in got.iter().take(found as usize).enumerate() {
            let hip_result = HipHeuristicResult {
                algo: hand_out(r.algo, r.workspaceSize),
                workspace_size: r.workspaceSize,
                state: from_cublas(r.state),
                waves_count: r.wavesCount,
                reserved: [0; 4],
            };
            // SAFETY: `results` has room for `requested` entries (the
            // caller's contract) and `i < found <= requested`.
            unsafe { results.add(i).write(hip_result) };
        }
        // SAFETY: non-null out pointer.
        unsafe { returned.write(found) };
        Ok(())
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hipblasLtMatmul(
    handle: lt::cublasLtHandle_t,
    desc: lt::cublasLtMatmulDesc_t,
    alpha: *const c_void,
    a: *const c_void,
    a_desc: lt::cublasLtMatrixLayout_t,
    b: *const c_void,
    b_desc: lt::cublasLtMatrixLayout_t,
    beta: *const c_void,
    c: *const c_void,
    c_desc: lt::cublasLtMatrixLayout_t,
    d: *mut c_void,
    d_desc: lt::cublasLtMatrixLayout_t,
    algo: *const HipAlgo,
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: *mut c_void,
) -> Status {
    entry(|| {
        if algo.is_null() {
            return Err(HIPBLAS_STATUS_INVALID_VALUE);
        }
        // SAFETY: non-null, a hipblasLtMatmulAlgo_t (the caller's contract).
        let cu_algo = look_up(unsafe { &*algo })?;
        driver::bind().map_err(|_| HIPBLAS_STATUS_NOT_INITIALIZED)?;
        // SAFETY: the caller's objects, device pointers and stream (one of
        // the shim's, i.e. a CUDA stream) as cublasLtMatmul takes them.
        check(unsafe {
            lt::cublasLtMatmul(
                handle,
                desc,
                alpha,
                a,
                a_desc,
                b,
                b_desc,
                beta,
                c,
                c_desc,
                d,
                d_desc,
                &cu_algo,
                workspace,
                workspace_bytes,
                stream.cast(),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_translate_by_name() {
        assert_eq!(data_type(14), Ok(lt::cudaDataType_t::CUDA_R_16BF));
        assert_eq!(data_type(1000), Err(HIPBLAS_STATUS_NOT_SUPPORTED), "FNUZ");
        assert_eq!(
            compute_type(6),
            Ok(lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32)
        );
        assert_eq!(compute_type(3), Err(HIPBLAS_STATUS_INVALID_VALUE));
        let (a, v) = desc_attribute(1, &112i32.to_ne_bytes()).unwrap();
        assert_eq!(
            a,
            lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB
        );
        assert_eq!(v, 1i32.to_ne_bytes(), "HIPBLAS_OP_T is CUBLAS_OP_T");
        assert_eq!(
            desc_attribute(0, &7i32.to_ne_bytes()),
            Err(HIPBLAS_STATUS_INVALID_VALUE)
        );
        assert!(desc_attribute(2, &36i32.to_ne_bytes()).is_ok(), "GELU_BIAS");
        assert_eq!(
            desc_attribute(2, &8i32.to_ne_bytes()),
            Err(HIPBLAS_STATUS_NOT_SUPPORTED)
        );
        assert_eq!(
            desc_attribute(3, &[0u8; 4]),
            Err(HIPBLAS_STATUS_INVALID_VALUE),
            "a pointer attribute of 4 bytes"
        );
        assert_eq!(
            layout_attribute(1, &8i64.to_ne_bytes()).unwrap().0,
            lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
        );
        assert_eq!(
            layout_attribute(3, &2i32.to_ne_bytes()),
            Err(HIPBLAS_STATUS_NOT_SUPPORTED)
        );
        assert!(preference_attribute(1, &(1u64 << 20).to_ne_bytes()).is_ok());
        assert_eq!(
            preference_attribute(0, &[0u8; 4]),
            Err(HIPBLAS_STATUS_NOT_SUPPORTED)
        );
    }

    #[test]
    fn algorithms_round_trip_and_foreign_ones_are_refused() {
        let mut a = lt::cublasLtMatmulAlgo_t { data: [7; 8] };
        let h1 = hand_out(a, 64);
        let h2 = hand_out(a, 64);
        assert_eq!(h1.data, h2.data, "one key per algorithm");
        assert_eq!(look_up(&h1).unwrap().data, [7; 8]);
        a.data[0] = 8;
        let h3 = hand_out(a, 0);
        assert_ne!(h3.data, h1.data);
        assert_eq!(look_up(&h3).unwrap().data[0], 8);
        assert_eq!(
            look_up(&HipAlgo::default()).unwrap_err(),
            HIPBLAS_STATUS_INVALID_VALUE
        );
        let mut forged = h1;
        forged.data[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(look_up(&forged).unwrap_err(), HIPBLAS_STATUS_INVALID_VALUE);
    }
}

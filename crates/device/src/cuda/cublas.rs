//! cuBLAS (not Lt), loaded at run time, for what XLA runs through it and
//! cuBLASLt cannot do: triangular solves (`TriangularSolveThunk`).
//!
//! Driven as XLA's `CUDABlas` drives it: one handle, the stream set before
//! every call, host pointer mode (alpha lives on the host), the handle's
//! default math mode (XLA switches to TF32 only for the calls that ask for
//! it, and trsm does not). The library comes from the same places as
//! cuBLASLt (`LD_LIBRARY_PATH`, the `nvidia-cublas` wheel, the system
//! loader), and is loaded the first time a program needs it.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use xla_vmm_ffi::cuda::cublas as sys;

use super::blaslt::{candidates, symbol};
use crate::blas::{xla_type, Transpose, TrsmArgs, TrsmSpec};
use crate::error::{DeviceError, Result};

type Status = sys::cublasStatus_t;

/// `cublas{S,D,C,Z}trsm_v2`: the scalar types differ, the C signature is
/// the same shape (alpha and the matrices by pointer).
type TrsmFn = unsafe extern "C" fn(
    sys::cublasHandle_t,
    sys::cublasSideMode_t,
    sys::cublasFillMode_t,
    sys::cublasOperation_t,
    sys::cublasDiagType_t,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    *mut c_void,
    c_int,
) -> Status;

/// `cublas{S,D,C,Z}trsmBatched`: as [`TrsmFn`] over arrays of matrix
/// pointers, plus the batch count.
type TrsmBatchedFn = unsafe extern "C" fn(
    sys::cublasHandle_t,
    sys::cublasSideMode_t,
    sys::cublasFillMode_t,
    sys::cublasOperation_t,
    sys::cublasDiagType_t,
    c_int,
    c_int,
    *const c_void,
    *const *const c_void,
    c_int,
    *const *mut c_void,
    c_int,
    c_int,
) -> Status;

/// The entry points for one element type.
struct Solvers {
    single: TrsmFn,
    batched: TrsmBatchedFn,
}

struct Api {
    create: unsafe extern "C" fn(*mut sys::cublasHandle_t) -> Status,
    destroy: unsafe extern "C" fn(sys::cublasHandle_t) -> Status,
    set_stream: unsafe extern "C" fn(sys::cublasHandle_t, sys::cudaStream_t) -> Status,
    set_pointer_mode: unsafe extern "C" fn(sys::cublasHandle_t, sys::cublasPointerMode_t) -> Status,
    /// F32, F64, C64, C128.
    solvers: [Solvers; 4],
    /// Keeps the library mapped for the life of the process.
    _lib: libloading::Library,
}

const LIB_NAMES: &[&str] = &["libcublas.so.13", "libcublas.so"];

impl Api {
    fn load() -> Result<(Api, String)> {
        let mut tried = Vec::new();
        for path in candidates(LIB_NAMES) {
            // SAFETY: loading cuBLAS runs its initializers, which have no
            // preconditions beyond a sane process environment.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    let solvers = |p: char| -> Result<Solvers> {
                        Ok(Solvers {
                            single: symbol(&lib, "cuBLAS", &format!("cublas{p}trsm_v2"))?,
                            batched: symbol(&lib, "cuBLAS", &format!("cublas{p}trsmBatched"))?,
                        })
                    };
                    let api = Api {
                        create: symbol(&lib, "cuBLAS", "cublasCreate_v2")?,
                        destroy: symbol(&lib, "cuBLAS", "cublasDestroy_v2")?,
                        set_stream: symbol(&lib, "cuBLAS", "cublasSetStream_v2")?,
                        set_pointer_mode: symbol(&lib, "cuBLAS", "cublasSetPointerMode_v2")?,
                        solvers: [solvers('S')?, solvers('D')?, solvers('C')?, solvers('Z')?],
                        _lib: lib,
                    };
                    return Ok((api, path.display().to_string()));
                }
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(DeviceError::NotAvailable(format!(
            "cuBLAS not found (tried {})",
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

/// Index into [`Api::solvers`] and alpha = 1 in the type's bytes (complex
/// types: real part 1, imaginary 0).
fn solver_type(dtype: i32) -> Result<(usize, &'static [u8])> {
    static ONE_F32: [u8; 8] = [0, 0, 0x80, 0x3f, 0, 0, 0, 0];
    static ONE_F64: [u8; 16] = [0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0];
    Ok(match dtype {
        xla_type::F32 => (0, &ONE_F32[..4]),
        xla_type::F64 => (1, &ONE_F64[..8]),
        xla_type::C64 => (2, &ONE_F32[..]),
        xla_type::C128 => (3, &ONE_F64[..]),
        other => {
            return Err(DeviceError::Unsupported(format!(
                "triangular solve in element type {other} (XLA PrimitiveType; cuBLAS solves \
                 F32, F64, C64 and C128)"
            )))
        }
    })
}

fn operation(t: Transpose) -> sys::cublasOperation_t {
    match t {
        Transpose::NoTranspose => sys::cublasOperation_t::CUBLAS_OP_N,
        Transpose::Transpose => sys::cublasOperation_t::CUBLAS_OP_T,
        Transpose::ConjugateTranspose => sys::cublasOperation_t::CUBLAS_OP_C,
    }
}

/// One cuBLAS handle of one device. Calls are serialized: the stream is a
/// property of the handle, set before every call.
pub struct Cublas {
    api: Api,
    handle: Mutex<sys::cublasHandle_t>,
    library: String,
}

// SAFETY: the handle is only used under its mutex (set stream + call), and
// destroyed by `Drop` with exclusive access; cuBLAS handles may move
// between threads.
unsafe impl Send for Cublas {}
// SAFETY: see above.
unsafe impl Sync for Cublas {}

impl Cublas {
    /// Load the library and create a handle. The device's CUDA context must
    /// be current on this thread.
    pub fn new() -> Result<Self> {
        let (api, library) = Api::load()?;
        let mut handle: sys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out pointer.
        check("cublasCreate_v2", unsafe { (api.create)(&mut handle) })?;
        // SAFETY: the handle was just created.
        let mode = unsafe {
            (api.set_pointer_mode)(handle, sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)
        };
        if let Err(e) = check("cublasSetPointerMode_v2", mode) {
            // SAFETY: created above, used by nobody else.
            unsafe { (api.destroy)(handle) };
            return Err(e);
        }
        tracing::info!(library = %library, "cuBLAS loaded");
        Ok(Cublas {
            api,
            handle: Mutex::new(handle),
            library,
        })
    }

    /// Path (or name) of the loaded library.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Enqueue XLA's `RunTriangularSolve` on `stream`: trsm for one matrix,
    /// trsmBatched over pointer arrays for more.
    ///
    /// # Safety
    /// `stream` is a live stream of the handle's context, which is current;
    /// the operands address matrices of `spec`'s sizes (or arrays of
    /// `spec.batch` such pointers) that stay valid until the solve ran.
    pub unsafe fn trsm(
        &self,
        spec: &TrsmSpec,
        args: TrsmArgs,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        let (ty, alpha) = solver_type(spec.dtype)?;
        if spec.is_empty() {
            return Ok(());
        }
        let side = if spec.left_side {
            sys::cublasSideMode_t::CUBLAS_SIDE_LEFT
        } else {
            sys::cublasSideMode_t::CUBLAS_SIDE_RIGHT
        };
        let uplo = if spec.lower {
            sys::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER
        } else {
            sys::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER
        };
        let diag = if spec.unit_diagonal {
            sys::cublasDiagType_t::CUBLAS_DIAG_UNIT
        } else {
            sys::cublasDiagType_t::CUBLAS_DIAG_NON_UNIT
        };
        let op = operation(spec.transpose);
        let f = &self.api.solvers[ty];
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        check("cublasSetStream_v2", (self.api.set_stream)(*handle, stream))?;
        let alpha = alpha.as_ptr().cast::<c_void>();
        match args {
            TrsmArgs::Single { a, b } => check(
                "cublas<t>trsm_v2",
                (f.single)(
                    *handle,
                    side,
                    uplo,
                    op,
                    diag,
                    spec.m,
                    spec.n,
                    alpha,
                    a.0 as *const c_void,
                    spec.lda(),
                    b.0 as *mut c_void,
                    spec.m,
                ),
            ),
            TrsmArgs::Batched { a_ptrs, b_ptrs } => check(
                "cublas<t>trsmBatched",
                (f.batched)(
                    *handle,
                    side,
                    uplo,
                    op,
                    diag,
                    spec.m,
                    spec.n,
                    alpha,
                    a_ptrs.0 as *const *const c_void,
                    spec.lda(),
                    b_ptrs.0 as *const *mut c_void,
                    spec.m,
                    spec.batch,
                ),
            ),
        }
    }

    /// Can [`Cublas::trsm`] solve in this element type?
    pub fn check_type(dtype: i32) -> Result<()> {
        solver_type(dtype).map(|_| ())
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        let handle = *self.handle.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: exclusive access; the handle was created by `new`.
        let s = unsafe { (self.api.destroy)(handle) };
        if s != Status::CUBLAS_STATUS_SUCCESS {
            tracing::warn!(status = ?s, "cublasDestroy_v2 failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_is_one_in_every_solver_type() {
        let (i, a) = solver_type(xla_type::F32).unwrap();
        assert_eq!((i, f32::from_le_bytes(a.try_into().unwrap())), (0, 1.0));
        let (i, a) = solver_type(xla_type::F64).unwrap();
        assert_eq!((i, f64::from_le_bytes(a.try_into().unwrap())), (1, 1.0));
        let (i, a) = solver_type(xla_type::C64).unwrap();
        assert_eq!(i, 2);
        assert_eq!(f32::from_le_bytes(a[..4].try_into().unwrap()), 1.0);
        assert_eq!(f32::from_le_bytes(a[4..].try_into().unwrap()), 0.0);
        let (i, a) = solver_type(xla_type::C128).unwrap();
        assert_eq!(i, 3);
        assert_eq!(f64::from_le_bytes(a[..8].try_into().unwrap()), 1.0);
        assert_eq!(f64::from_le_bytes(a[8..].try_into().unwrap()), 0.0);
        let e = solver_type(xla_type::BF16).unwrap_err().to_string();
        assert!(e.contains("element type 16"), "{e}");
    }

    #[test]
    fn empty_solves_make_no_call() {
        let spec = TrsmSpec {
            left_side: true,
            lower: true,
            unit_diagonal: false,
            transpose: Transpose::NoTranspose,
            dtype: xla_type::F32,
            m: 0,
            n: 3,
            batch: 1,
        };
        assert!(spec.is_empty());
        assert_eq!(TrsmSpec { m: 4, ..spec }.lda(), 4);
        assert_eq!(
            TrsmSpec {
                m: 4,
                left_side: false,
                ..spec
            }
            .lda(),
            3
        );
    }
}

//! Triangular solves through a vendor BLAS loaded at run time: cuBLAS on
//! CUDA (`cuda::cublas`), rocBLAS on ROCm (`hip::rocblas`), as XLA's
//! `RunTriangularSolve` calls them (`TriangularSolveThunk`); and the scaling
//! XLA's `RunFft` does with the same BLAS after an inverse FFT (`?scal`).
//!
//! Both libraries have the same C shape for what we call: a handle
//! (create, destroy, set stream, set pointer mode), `?trsm` /
//! `?trsmBatched` and `?scal` for `s`, `d`, `c`, `z`, with enums passed as
//! C ints and a status of 0 for success. Only the names, the enum values and where the
//! library lives differ: a backend describes them in a [`SolverAbi`].
//!
//! Driven as XLA drives both: one handle per device, the stream set before
//! every call (calls are serialized on the handle), host pointer mode (alpha
//! = 1 lives on the host), the handle's default math mode.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::backend::DevicePtr;
use crate::blas::{Transpose, TrsmArgs, TrsmSpec};
use crate::error::{DeviceError, Result};

/// How one BLAS library spells the solver API.
pub(crate) struct SolverAbi {
    /// The library's name in errors and logs ("cuBLAS").
    pub label: &'static str,
    pub create: &'static str,
    pub destroy: &'static str,
    pub set_stream: &'static str,
    pub set_pointer_mode: &'static str,
    /// (single, batched) entry points for F32, F64, C64, C128.
    pub solvers: [(&'static str, &'static str); 4],
    /// `?scal` for F32, F64, C64, C128 (a complex one with a complex alpha).
    pub scalers: [&'static str; 4],
    pub pointer_mode_host: c_int,
    /// Left, right.
    pub side: [c_int; 2],
    /// Lower, upper.
    pub fill: [c_int; 2],
    /// No transpose, transpose, conjugate transpose.
    pub operation: [c_int; 3],
    /// Non-unit, unit.
    pub diagonal: [c_int; 2],
}

type Status = c_int;
type Handle = *mut c_void;

/// `?trsm`: alpha and the matrices by pointer, the same for every type.
type TrsmFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    *mut c_void,
    c_int,
) -> Status;

/// `?trsmBatched`: as [`TrsmFn`] over arrays of matrix pointers, plus the
/// batch count.
type TrsmBatchedFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const *const c_void,
    c_int,
    *const *mut c_void,
    c_int,
    c_int,
) -> Status;

/// `?scal`: count, alpha by pointer, x, its increment.
type ScalFn = unsafe extern "C" fn(Handle, c_int, *const c_void, *mut c_void, c_int) -> Status;

struct Api {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    set_pointer_mode: unsafe extern "C" fn(Handle, c_int) -> Status,
    solvers: [(TrsmFn, TrsmBatchedFn); 4],
    scalers: [ScalFn; 4],
    /// Keeps the library mapped for the life of the process.
    _lib: libloading::Library,
}

/// Entry point `name` of `lib` as a `T`.
///
/// # Safety
/// `T` is the C signature the library's header gives `name` (enums as C
/// ints, handles and streams as the header types them), and the returned
/// function is not called after `lib` is unloaded.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    label: &str,
    name: &str,
) -> Result<T> {
    // SAFETY: the caller's contract.
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| DeviceError::NotAvailable(format!("{label} symbol {name}: {e}")))
    }
}

impl Api {
    fn open(abi: &SolverAbi, path: &std::path::Path) -> std::result::Result<Api, String> {
        // SAFETY: loading the BLAS runs its initializers, which have no
        // preconditions beyond a sane process environment.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let l = abi.label;
        let resolve = || -> Result<Api> {
            let pair = |(single, batched): (&str, &str)| -> Result<(TrsmFn, TrsmBatchedFn)> {
                // SAFETY: the header's signatures of the solvers; the
                // functions live in `Api` beside the library.
                unsafe { Ok((symbol(&lib, l, single)?, symbol(&lib, l, batched)?)) }
            };
            let scal = |name: &str| -> Result<ScalFn> {
                // SAFETY: as above, `?scal`'s signature.
                unsafe { symbol(&lib, l, name) }
            };
            let (s, c) = (&abi.solvers, &abi.scalers);
            // SAFETY: as above, the handle functions' signatures.
            let (create, destroy, set_stream, set_pointer_mode) = unsafe {
                (
                    symbol(&lib, l, abi.create)?,
                    symbol(&lib, l, abi.destroy)?,
                    symbol(&lib, l, abi.set_stream)?,
                    symbol(&lib, l, abi.set_pointer_mode)?,
                )
            };
            Ok(Api {
                create,
                destroy,
                set_stream,
                set_pointer_mode,
                solvers: [pair(s[0])?, pair(s[1])?, pair(s[2])?, pair(s[3])?],
                scalers: [scal(c[0])?, scal(c[1])?, scal(c[2])?, scal(c[3])?],
                _lib: lib,
            })
        };
        resolve().map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Index into the solver table ([`TrsmSpec::TYPES`]'s order) and alpha = 1
/// in the type's bytes (complex types: real part 1, imaginary 0).
fn solver_type(dtype: i32) -> Result<(usize, &'static [u8])> {
    static ONE_F32: [u8; 8] = [0, 0, 0x80, 0x3f, 0, 0, 0, 0];
    static ONE_F64: [u8; 16] = [0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0];
    let alphas: [&'static [u8]; 4] = [&ONE_F32[..4], &ONE_F64[..8], &ONE_F32, &ONE_F64];
    let i = TrsmSpec::TYPES
        .iter()
        .position(|&t| t == dtype)
        .ok_or_else(|| {
            DeviceError::Unsupported(format!(
                "triangular solve in element type {dtype} (XLA PrimitiveType; the BLAS solves \
             F32, F64, C64 and C128)"
            ))
        })?;
    Ok((i, alphas[i]))
}

/// A library of a backend engine, loaded the first time a program that
/// needs it is loaded; a failed load is kept, and said again at every load
/// that needs it.
pub(crate) struct LazyLib<T>(OnceLock<std::result::Result<T, String>>);

impl<T> Default for LazyLib<T> {
    fn default() -> Self {
        LazyLib(OnceLock::new())
    }
}

impl<T> LazyLib<T> {
    /// The library, `load`ing it the first time.
    pub fn get(&self, load: impl FnOnce() -> Result<T>) -> Result<&T> {
        self.0
            .get_or_init(|| load().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| DeviceError::NotAvailable(e.clone()))
    }

    /// The library if it was loaded (for teardown).
    pub fn loaded(&mut self) -> Option<&mut T> {
        self.0.get_mut().and_then(|r| r.as_mut().ok())
    }

    /// The library if it was loaded, without loading it.
    pub fn peek(&self) -> Option<&T> {
        self.0.get().and_then(|r| r.as_ref().ok())
    }

    /// The library a load-time preparation loaded, or why there is none.
    pub fn loaded_ref(&self) -> Result<&T> {
        match self.0.get() {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(DeviceError::NotAvailable(e.clone())),
            None => Err(DeviceError::InvalidArgument(
                "a library used before any plan was prepared with it".into(),
            )),
        }
    }
}

/// A backend engine's BLAS (solves, FFT scaling).
pub(crate) type LazySolver = LazyLib<Solver>;

impl LazySolver {
    /// `GemmEngine::prepare_trsm`: a type the BLAS solves in, and the
    /// library loaded.
    pub fn prepare(&self, spec: &TrsmSpec, load: impl FnOnce() -> Result<Solver>) -> Result<()> {
        solver_type(spec.dtype)?;
        self.get(load).map(|_| ())
    }
}

/// One handle of one device's BLAS. The device must be current on the
/// calling thread for [`Solver::new`] and [`Solver::trsm`].
pub(crate) struct Solver {
    abi: &'static SolverAbi,
    api: Api,
    handle: Mutex<Handle>,
}

// SAFETY: the handle is only used under its mutex (set stream + call), and
// destroyed by `Drop` with exclusive access; cuBLAS and rocBLAS handles may
// move between threads.
unsafe impl Send for Solver {}
// SAFETY: see above.
unsafe impl Sync for Solver {}

impl Solver {
    /// Open the first of `candidates` that has every entry point and create
    /// a handle.
    pub fn new(abi: &'static SolverAbi, candidates: Vec<PathBuf>) -> Result<Self> {
        let mut tried = Vec::new();
        for path in candidates {
            let api = match Api::open(abi, &path) {
                Ok(api) => api,
                Err(e) => {
                    tried.push(e);
                    continue;
                }
            };
            let mut handle: Handle = std::ptr::null_mut();
            // SAFETY: `handle` is a valid out pointer; the device is current.
            check(abi, "create", unsafe { (api.create)(&mut handle) })?;
            // SAFETY: the handle was just created.
            let mode = unsafe { (api.set_pointer_mode)(handle, abi.pointer_mode_host) };
            if let Err(e) = check(abi, "set pointer mode", mode) {
                // SAFETY: created above, used by nobody else.
                unsafe { (api.destroy)(handle) };
                return Err(e);
            }
            tracing::info!(library = %path.display(), "{} loaded for triangular solves", abi.label);
            return Ok(Solver {
                abi,
                api,
                handle: Mutex::new(handle),
            });
        }
        Err(DeviceError::NotAvailable(format!(
            "{} not found (tried {})",
            abi.label,
            tried.join("; ")
        )))
    }

    /// Enqueue XLA's `RunTriangularSolve` on `stream`: `?trsm` for one
    /// matrix, `?trsmBatched` over pointer arrays for more.
    ///
    /// # Safety
    /// `stream` is a live stream of the handle's device, which is current;
    /// the operands address matrices of `spec`'s sizes (or arrays of
    /// `spec.batch` such pointers) that stay valid until the solve ran.
    pub unsafe fn trsm(&self, spec: &TrsmSpec, args: TrsmArgs, stream: *mut c_void) -> Result<()> {
        let (ty, alpha) = solver_type(spec.dtype)?;
        if spec.is_empty() {
            return Ok(());
        }
        let abi = self.abi;
        let side = abi.side[usize::from(!spec.left_side)];
        let uplo = abi.fill[usize::from(!spec.lower)];
        let diag = abi.diagonal[usize::from(spec.unit_diagonal)];
        let op = abi.operation[match spec.transpose {
            Transpose::NoTranspose => 0,
            Transpose::Transpose => 1,
            Transpose::ConjugateTranspose => 2,
        }];
        let (single, batched) = self.api.solvers[ty];
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        check(abi, "set stream", (self.api.set_stream)(*handle, stream))?;
        let alpha = alpha.as_ptr().cast::<c_void>();
        let status = match args {
            TrsmArgs::Single { a, b } => single(
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
            TrsmArgs::Batched { a_ptrs, b_ptrs } => batched(
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
        };
        check(abi, "trsm", status)
    }

    /// XLA's `DoBlasScal` after an inverse FFT: `x *= alpha` over `count`
    /// elements of `dtype` (F32, F64, C64, C128; `alpha` in the type's
    /// bytes), in chunks of at most `i32::MAX` elements as XLA chunks them
    /// (the BLAS's count is a C int).
    ///
    /// # Safety
    /// `stream` is a live stream of the handle's device, which is current;
    /// `x` addresses `count` elements that stay valid until the scaling ran.
    pub unsafe fn scal(
        &self,
        dtype: i32,
        count: i64,
        alpha: &[u8],
        x: DevicePtr,
        stream: *mut c_void,
    ) -> Result<()> {
        let (ty, one) = solver_type(dtype)?;
        if alpha.len() != one.len() {
            return Err(DeviceError::InvalidArgument(format!(
                "{} scal alpha of {} bytes for element type {dtype}",
                self.abi.label,
                alpha.len()
            )));
        }
        let elem = [4u64, 8, 8, 16][ty];
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        check(
            self.abi,
            "set stream",
            (self.api.set_stream)(*handle, stream),
        )?;
        let mut done = 0i64;
        while done < count {
            let chunk = (count - done).min(i64::from(i32::MAX));
            let at = x.0 + done as u64 * elem;
            let status = (self.api.scalers[ty])(
                *handle,
                chunk as c_int,
                alpha.as_ptr().cast(),
                at as *mut c_void,
                1,
            );
            check(self.abi, "scal", status)?;
            done += chunk;
        }
        Ok(())
    }
}

fn check(abi: &SolverAbi, call: &'static str, s: Status) -> Result<()> {
    library_status(abi.label, call, s)
}

/// A vendor library's status (0: success) as a result naming the library
/// and the call.
pub(crate) fn library_status(label: &str, call: &'static str, s: c_int) -> Result<()> {
    if s == 0 {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            call,
            code: i64::from(s),
            name: format!("{label} status {s}"),
            message: String::new(),
        })
    }
}

impl Drop for Solver {
    fn drop(&mut self) {
        let handle = *self.handle.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: exclusive access; the handle was created by `new`.
        let s = unsafe { (self.api.destroy)(handle) };
        if s != 0 {
            tracing::warn!(status = s, "{} handle destroy failed", self.abi.label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blas::xla_type;

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
    fn empty_solves_and_leading_dimensions() {
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
        let right = TrsmSpec {
            m: 4,
            left_side: false,
            ..spec
        };
        assert_eq!(right.lda(), 3);
    }

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        static ABI: SolverAbi = SolverAbi {
            label: "testBLAS",
            create: "c",
            destroy: "d",
            set_stream: "s",
            set_pointer_mode: "p",
            solvers: [("a", "b"); 4],
            scalers: ["e"; 4],
            pointer_mode_host: 0,
            side: [0, 1],
            fill: [0, 1],
            operation: [0, 1, 2],
            diagonal: [0, 1],
        };
        let e = Solver::new(&ABI, vec![PathBuf::from("/nonexistent/libtestblas.so")])
            .err()
            .expect("no library")
            .to_string();
        assert!(
            e.contains("testBLAS not found") && e.contains("libtestblas"),
            "{e}"
        );
    }
}

//! NCCL (and RCCL, its ROCm port with the same C API) loaded at run time.
//!
//! Hand-written (the only hand-written bindings here): the handful of
//! entry points the collectives need, with NCCL's own enum numbering. The
//! library is found in this order (first that loads and has every symbol):
//!
//! - NCCL: `$XLA_VMM_NCCL_LIBRARY` (a path; if set, it is the only
//!   candidate); a `libnccl.so*` already mapped into the process (jaxlib's
//!   CUDA plugin loads the one in site-packages); `libnccl.so.2` and
//!   `libnccl.so` through the dynamic loader's search path; then
//!   `nvidia/nccl/lib/libnccl.so.2` under every Python `site-packages`
//!   directory we can find (`$VIRTUAL_ENV`, `$CONDA_PREFIX`, and those of
//!   libraries mapped into the process).
//! - RCCL: `$XLA_VMM_RCCL_LIBRARY`; a mapped `librccl.so*`; `librccl.so.1`;
//!   `librccl.so`; `/opt/rocm/lib/librccl.so.1`.
//!
//! Each flavour is loaded once per process ([`NcclLib::nccl`],
//! [`NcclLib::rccl`]); a missing symbol is an error naming it.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use crate::dynload::{cstr, mapped_paths, symbol};

/// `ncclComm_t`: an opaque communicator handle.
pub type ncclComm_t = *mut c_void;
/// `cudaStream_t` / `CUstream` (or `hipStream_t` for RCCL).
pub type ncclStream_t = *mut c_void;
pub type ncclResult_t = c_int;
pub type ncclDataType_t = c_int;
pub type ncclRedOp_t = c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct ncclUniqueId {
    pub internal: [c_char; 128],
}

pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;

pub const ncclInt8: ncclDataType_t = 0;
pub const ncclUint8: ncclDataType_t = 1;
pub const ncclInt32: ncclDataType_t = 2;
pub const ncclUint32: ncclDataType_t = 3;
pub const ncclInt64: ncclDataType_t = 4;
pub const ncclUint64: ncclDataType_t = 5;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclFloat64: ncclDataType_t = 8;
pub const ncclBfloat16: ncclDataType_t = 9;
pub const ncclFloat8e4m3: ncclDataType_t = 10;
pub const ncclFloat8e5m2: ncclDataType_t = 11;

pub const ncclSum: ncclRedOp_t = 0;
pub const ncclProd: ncclRedOp_t = 1;
pub const ncclMax: ncclRedOp_t = 2;
pub const ncclMin: ncclRedOp_t = 3;

/// Name of a result code (`ncclGetErrorString` gives the message).
pub fn result_name(code: ncclResult_t) -> &'static str {
    match code {
        ncclSuccess => "ncclSuccess",
        ncclUnhandledCudaError => "ncclUnhandledCudaError",
        ncclSystemError => "ncclSystemError",
        ncclInternalError => "ncclInternalError",
        ncclInvalidArgument => "ncclInvalidArgument",
        ncclInvalidUsage => "ncclInvalidUsage",
        ncclRemoteError => "ncclRemoteError",
        ncclInProgress => "ncclInProgress",
        _ => "ncclUnknownResult",
    }
}

/// Which library: NVIDIA's NCCL or AMD's RCCL.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Flavor {
    Nccl,
    Rccl,
}

/// Why no library could be loaded: every candidate and its failure.
#[derive(Clone, Debug)]
pub struct NcclLoadError {
    pub message: String,
}

impl std::fmt::Display for NcclLoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NcclLoadError {}

/// A loaded NCCL/RCCL: the library and its entry points (valid while the
/// struct lives; the process-wide instances live forever).
pub struct NcclLib {
    _lib: Library,
    pub path: PathBuf,
    pub flavor: Flavor,
    pub get_version: unsafe extern "C" fn(version: *mut c_int) -> ncclResult_t,
    pub get_unique_id: unsafe extern "C" fn(id: *mut ncclUniqueId) -> ncclResult_t,
    pub comm_init_rank: unsafe extern "C" fn(
        comm: *mut ncclComm_t,
        nranks: c_int,
        id: ncclUniqueId,
        rank: c_int,
    ) -> ncclResult_t,
    pub comm_destroy: unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t,
    pub comm_abort: unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t,
    pub comm_get_async_error:
        unsafe extern "C" fn(comm: ncclComm_t, async_error: *mut ncclResult_t) -> ncclResult_t,
    pub get_error_string: unsafe extern "C" fn(result: ncclResult_t) -> *const c_char,
    /// Not in every version.
    pub get_last_error: Option<unsafe extern "C" fn(comm: ncclComm_t) -> *const c_char>,
    pub all_reduce: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        ty: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: ncclStream_t,
    ) -> ncclResult_t,
    pub all_gather: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        ty: ncclDataType_t,
        comm: ncclComm_t,
        stream: ncclStream_t,
    ) -> ncclResult_t,
    pub reduce_scatter: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        ty: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: ncclStream_t,
    ) -> ncclResult_t,
    pub broadcast: unsafe extern "C" fn(
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        ty: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: ncclStream_t,
    ) -> ncclResult_t,
    pub send: unsafe extern "C" fn(
        send: *const c_void,
        count: usize,
        ty: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: ncclStream_t,
    ) -> ncclResult_t,
    pub recv: unsafe extern "C" fn(
        recv: *mut c_void,
        count: usize,
        ty: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: ncclStream_t,
    ) -> ncclResult_t,
    pub group_start: unsafe extern "C" fn() -> ncclResult_t,
    pub group_end: unsafe extern "C" fn() -> ncclResult_t,
}

impl std::fmt::Debug for NcclLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLib")
            .field("path", &self.path)
            .field("flavor", &self.flavor)
            .finish()
    }
}

impl NcclLib {
    /// The process-wide NCCL (loaded at the first call).
    pub fn nccl() -> Result<&'static NcclLib, NcclLoadError> {
        static LIB: OnceLock<Result<NcclLib, NcclLoadError>> = OnceLock::new();
        LIB.get_or_init(|| load_first(Flavor::Nccl))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The process-wide RCCL (loaded at the first call).
    pub fn rccl() -> Result<&'static NcclLib, NcclLoadError> {
        static LIB: OnceLock<Result<NcclLib, NcclLoadError>> = OnceLock::new();
        LIB.get_or_init(|| load_first(Flavor::Rccl))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Load the library at `path` (a file name goes through the dynamic
    /// loader's search path) and resolve every entry point.
    pub fn open(path: &Path, flavor: Flavor) -> Result<NcclLib, String> {
        // SAFETY: loading NCCL/RCCL runs their initialisers, which have no
        // preconditions on our side.
        let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?;
        // SAFETY (each `symbol` call): the types are NCCL's C prototypes
        // (nccl.h), which RCCL shares.
        unsafe {
            Ok(NcclLib {
                path: path.to_path_buf(),
                flavor,
                get_version: symbol(&lib, "ncclGetVersion")?,
                get_unique_id: symbol(&lib, "ncclGetUniqueId")?,
                comm_init_rank: symbol(&lib, "ncclCommInitRank")?,
                comm_destroy: symbol(&lib, "ncclCommDestroy")?,
                comm_abort: symbol(&lib, "ncclCommAbort")?,
                comm_get_async_error: symbol(&lib, "ncclCommGetAsyncError")?,
                get_error_string: symbol(&lib, "ncclGetErrorString")?,
                get_last_error: symbol(&lib, "ncclGetLastError").ok(),
                all_reduce: symbol(&lib, "ncclAllReduce")?,
                all_gather: symbol(&lib, "ncclAllGather")?,
                reduce_scatter: symbol(&lib, "ncclReduceScatter")?,
                broadcast: symbol(&lib, "ncclBroadcast")?,
                send: symbol(&lib, "ncclSend")?,
                recv: symbol(&lib, "ncclRecv")?,
                group_start: symbol(&lib, "ncclGroupStart")?,
                group_end: symbol(&lib, "ncclGroupEnd")?,
                _lib: lib,
            })
        }
    }

    /// `ncclGetVersion` (e.g. 22809 for 2.28.9).
    pub fn version(&self) -> Result<i32, ncclResult_t> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out pointer.
        let r = unsafe { (self.get_version)(&mut v) };
        if r == ncclSuccess {
            Ok(v)
        } else {
            Err(r)
        }
    }

    /// `ncclGetErrorString(code)` as text.
    pub fn error_string(&self, code: ncclResult_t) -> String {
        // SAFETY: NCCL returns a static NUL-terminated string (or null).
        unsafe { cstr((self.get_error_string)(code)) }
    }

    /// `ncclGetLastError(comm)` (null comm: the thread's last error), if the
    /// library has it.
    ///
    /// # Safety
    /// `comm` is null or a live communicator of this library.
    pub unsafe fn last_error(&self, comm: ncclComm_t) -> Option<String> {
        let f = self.get_last_error?;
        // SAFETY: `comm` is null or live (caller); NCCL returns a
        // NUL-terminated string it owns (or null).
        let s = unsafe { cstr(f(comm)) };
        (!s.is_empty()).then_some(s)
    }
}

/// Python `site-packages` directories we can find without running Python.
fn site_packages() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if p.is_dir() && !out.contains(&p) {
            out.push(p);
        }
    };
    for prefix in &crate::settings::get().python_prefixes {
        let lib = prefix.join("lib");
        if let Ok(entries) = std::fs::read_dir(&lib) {
            let mut dirs: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path().join("site-packages"))
                .collect();
            dirs.sort();
            dirs.into_iter().for_each(&mut push);
        }
    }
    for p in mapped_paths("site-packages") {
        let s = p.to_string_lossy();
        if let Some(i) = s.find("site-packages") {
            push(PathBuf::from(&s[..i + "site-packages".len()]));
        }
    }
    out
}

/// Candidate paths of `flavor`, in search order.
pub fn candidates(flavor: Flavor) -> Vec<PathBuf> {
    let settings = crate::settings::get();
    let (explicit, needle, names): (&Option<PathBuf>, &str, &[&str]) = match flavor {
        Flavor::Nccl => (
            &settings.nccl_library,
            "libnccl.so",
            &["libnccl.so.2", "libnccl.so"],
        ),
        Flavor::Rccl => (
            &settings.rccl_library,
            "librccl.so",
            &["librccl.so.1", "librccl.so", "/opt/rocm/lib/librccl.so.1"],
        ),
    };
    if let Some(p) = explicit {
        return vec![p.clone()];
    }
    let mut out = mapped_paths(needle);
    out.extend(names.iter().map(PathBuf::from));
    if flavor == Flavor::Nccl {
        out.extend(
            site_packages()
                .into_iter()
                .map(|d| d.join("nvidia/nccl/lib/libnccl.so.2"))
                .filter(|p| p.is_file()),
        );
    }
    out
}

fn load_first(flavor: Flavor) -> Result<NcclLib, NcclLoadError> {
    let mut tried = Vec::new();
    for path in candidates(flavor) {
        match NcclLib::open(&path, flavor) {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    let what = match flavor {
        Flavor::Nccl => "NCCL (set XLA_VMM_NCCL_LIBRARY to libnccl.so.2's path)",
        Flavor::Rccl => "RCCL (set XLA_VMM_RCCL_LIBRARY to librccl.so's path)",
    };
    Err(NcclLoadError {
        message: format!("could not load {what}; tried: {}", tried.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_an_error_naming_the_path() {
        let e = NcclLib::open(Path::new("/nonexistent/libnccl.so.2"), Flavor::Nccl)
            .expect_err("no such file");
        assert!(e.contains("/nonexistent/libnccl.so.2"), "{e}");
    }

    #[test]
    fn library_without_the_symbols_is_an_error_naming_one() {
        // libc is mapped into every process and has no NCCL symbols.
        let Some(libc) = mapped_paths("libc.so").into_iter().next() else {
            return;
        };
        let e = NcclLib::open(&libc, Flavor::Nccl).expect_err("not NCCL");
        assert!(e.contains("symbol ncclGetVersion missing"), "{e}");
    }

    #[test]
    fn unique_id_is_128_bytes() {
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
    }
}

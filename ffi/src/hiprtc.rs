//! hiprtc (HIP's run-time compiler) loaded at run time, for the few kernels
//! of our own that the HIP backend compiles for the device it finds (the
//! mirror of handing PTX to the CUDA driver): hand-written, like `nccl`,
//! because `hip-runtime-sys` does not bind it.
//!
//! The library is found in this order (first that loads and has every
//! symbol): `$XLA_VMM_HIPRTC_LIBRARY` (if set, the only candidate); a
//! mapped `libhiprtc.so*`; `libhiprtc.so.7`, `libhiprtc.so.6`,
//! `libhiprtc.so`; `/opt/rocm/lib/libhiprtc.so`; then `libamdhip64.so.5`
//! (before ROCm 6, hiprtc lived inside the HIP runtime). Loaded once per
//! process ([`Hiprtc::get`]).
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use crate::dynload::{cstr, mapped_paths, symbol};

/// `hiprtcResult` (0 = success).
pub type hiprtcResult = c_int;
/// `hiprtcProgram`: an opaque program handle.
pub type hiprtcProgram = *mut c_void;

pub const HIPRTC_SUCCESS: hiprtcResult = 0;

/// The entry points we use, resolved from one library.
pub struct Hiprtc {
    pub path: PathBuf,
    _lib: Library,
    create_program: unsafe extern "C" fn(
        prog: *mut hiprtcProgram,
        src: *const c_char,
        name: *const c_char,
        num_headers: c_int,
        headers: *const *const c_char,
        include_names: *const *const c_char,
    ) -> hiprtcResult,
    compile_program: unsafe extern "C" fn(
        prog: hiprtcProgram,
        num_options: c_int,
        options: *const *const c_char,
    ) -> hiprtcResult,
    get_program_log_size:
        unsafe extern "C" fn(prog: hiprtcProgram, size: *mut usize) -> hiprtcResult,
    get_program_log: unsafe extern "C" fn(prog: hiprtcProgram, log: *mut c_char) -> hiprtcResult,
    get_code_size: unsafe extern "C" fn(prog: hiprtcProgram, size: *mut usize) -> hiprtcResult,
    get_code: unsafe extern "C" fn(prog: hiprtcProgram, code: *mut c_char) -> hiprtcResult,
    destroy_program: unsafe extern "C" fn(prog: *mut hiprtcProgram) -> hiprtcResult,
    get_error_string: unsafe extern "C" fn(result: hiprtcResult) -> *const c_char,
}

impl std::fmt::Debug for Hiprtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hiprtc").field("path", &self.path).finish()
    }
}

/// Owns a `hiprtcProgram`; destroyed on drop.
struct Program<'a> {
    rtc: &'a Hiprtc,
    prog: hiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from hiprtcCreateProgram and is destroyed once.
        unsafe { (self.rtc.destroy_program)(&mut self.prog) };
    }
}

impl Hiprtc {
    /// The process-wide hiprtc (loaded at the first call), or why none loads.
    pub fn get() -> Result<&'static Hiprtc, String> {
        static LIB: OnceLock<Result<Hiprtc, String>> = OnceLock::new();
        LIB.get_or_init(load_first).as_ref().map_err(Clone::clone)
    }

    /// Load the library at `path` and resolve every entry point.
    pub fn open(path: &Path) -> Result<Hiprtc, String> {
        // SAFETY: loading hiprtc runs its initialisers, which have no
        // preconditions on our side.
        let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?;
        // SAFETY (each `symbol`): the types are hiprtc.h's prototypes.
        unsafe {
            Ok(Hiprtc {
                path: path.to_path_buf(),
                create_program: symbol(&lib, "hiprtcCreateProgram")?,
                compile_program: symbol(&lib, "hiprtcCompileProgram")?,
                get_program_log_size: symbol(&lib, "hiprtcGetProgramLogSize")?,
                get_program_log: symbol(&lib, "hiprtcGetProgramLog")?,
                get_code_size: symbol(&lib, "hiprtcGetCodeSize")?,
                get_code: symbol(&lib, "hiprtcGetCode")?,
                destroy_program: symbol(&lib, "hiprtcDestroyProgram")?,
                get_error_string: symbol(&lib, "hiprtcGetErrorString")?,
                _lib: lib,
            })
        }
    }

    fn error(&self, call: &str, code: hiprtcResult) -> String {
        // SAFETY: hiprtc returns a static NUL-terminated string (or null).
        let text = unsafe { cstr((self.get_error_string)(code)) };
        format!("{call} failed: {text} ({code})")
    }

    /// Compile HIP C++ `source` (no headers of its own) with `options`
    /// (e.g. `--offload-arch=gfx90a`) into a code object for
    /// `hipModuleLoadData`. The error carries the compiler's log.
    pub fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<Vec<u8>, String> {
        let c_src = CString::new(source).map_err(|_| "source holds a NUL byte".to_string())?;
        let c_name = CString::new(name).map_err(|_| "name holds a NUL byte".to_string())?;
        let c_opts = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| "an option holds a NUL byte".to_string())?;
        let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
        let n_opts = c_int::try_from(opt_ptrs.len()).map_err(|_| "too many options".to_string())?;
        let mut prog: hiprtcProgram = std::ptr::null_mut();
        // SAFETY: valid out pointer and NUL-terminated strings that outlive
        // the call; no headers.
        let r = unsafe {
            (self.create_program)(
                &mut prog,
                c_src.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != HIPRTC_SUCCESS {
            return Err(self.error("hiprtcCreateProgram", r));
        }
        let prog = Program { rtc: self, prog };
        // SAFETY: `prog` is live; the option pointers outlive the call.
        let r = unsafe { (self.compile_program)(prog.prog, n_opts, opt_ptrs.as_ptr()) };
        if r != HIPRTC_SUCCESS {
            let log = self.log(&prog).unwrap_or_default();
            return Err(format!("{}\n{log}", self.error("hiprtcCompileProgram", r)));
        }
        let mut size = 0usize;
        // SAFETY: `prog` is live and compiled; valid out pointer.
        let r = unsafe { (self.get_code_size)(prog.prog, &mut size) };
        if r != HIPRTC_SUCCESS {
            return Err(self.error("hiprtcGetCodeSize", r));
        }
        if size == 0 {
            return Err("hiprtc produced an empty code object".into());
        }
        let mut code = vec![0u8; size];
        // SAFETY: `code` has the `size` bytes hiprtc asked for.
        let r = unsafe { (self.get_code)(prog.prog, code.as_mut_ptr().cast()) };
        if r != HIPRTC_SUCCESS {
            return Err(self.error("hiprtcGetCode", r));
        }
        Ok(code)
    }

    fn log(&self, prog: &Program<'_>) -> Option<String> {
        let mut size = 0usize;
        // SAFETY: `prog` is live; valid out pointer.
        if unsafe { (self.get_program_log_size)(prog.prog, &mut size) } != HIPRTC_SUCCESS {
            return None;
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` has the size hiprtc reported (at least one byte).
        if unsafe { (self.get_program_log)(prog.prog, buf.as_mut_ptr().cast()) } != HIPRTC_SUCCESS {
            return None;
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Some(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

fn load_first() -> Result<Hiprtc, String> {
    if let Some(p) = crate::settings::get().hiprtc_library.clone() {
        return Hiprtc::open(&p)
            .map_err(|e| format!("XLA_VMM_HIPRTC_LIBRARY={}: {e}", p.display()));
    }
    let mut candidates: Vec<PathBuf> = mapped_paths("libhiprtc.so");
    for name in [
        "libhiprtc.so.7",
        "libhiprtc.so.6",
        "libhiprtc.so",
        "/opt/rocm/lib/libhiprtc.so",
        "libamdhip64.so.5",
    ] {
        candidates.push(PathBuf::from(name));
    }
    let mut tried = Vec::new();
    for c in candidates {
        match Hiprtc::open(&c) {
            Ok(l) => return Ok(l),
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    Err(format!(
        "no hiprtc found (set XLA_VMM_HIPRTC_LIBRARY); tried {}",
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let e = Hiprtc::open(Path::new("/nonexistent/libhiprtc.so")).unwrap_err();
        assert!(e.contains("/nonexistent/libhiprtc.so"), "{e}");
    }
}

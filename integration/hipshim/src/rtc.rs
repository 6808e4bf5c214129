//! The hiprtc entry points our hiprtc loader needs
//! ([`crate::HIPRTC_ENTRY_POINTS`]), on NVRTC loaded at run time.
//!
//! NVRTC is found as `$XLA_VMM_SHIM_NVRTC` (if set, the only candidate),
//! else `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` for the system
//! loader. A `hiprtcProgram` is NVRTC's `nvrtcProgram`. hiprtc and NVRTC
//! number their results alike (0..=11, checked name by name against both
//! headers); anything else reads as `HIPRTC_ERROR_INTERNAL_ERROR`, which is
//! also what every call returns when NVRTC cannot be loaded.
//!
//! Options (what our backend passes: `-O3`, `--offload-arch=<gcnArchName>`):
//! `--offload-arch=sm_XX` becomes `--gpu-architecture=sm_XX`; without one,
//! the current HIP device's `sm_XX` is added (hiprtc compiles for the
//! current device by default, and NVRTC only makes a CUBIN for a real
//! architecture); an AMD `--offload-arch=gfx...` is `HIPRTC_ERROR_INVALID_OPTION`;
//! `-O<n>` is dropped (NVRTC optimises device code by default and has no
//! such option); anything else is passed on unchanged.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

/// `hiprtcResult` (a C enum: hiprtc.h).
pub type hiprtcResult = c_int;
/// `hiprtcProgram` (here: an `nvrtcProgram`).
pub type hiprtcProgram = *mut c_void;

pub const HIPRTC_SUCCESS: hiprtcResult = 0;
pub const HIPRTC_ERROR_INVALID_INPUT: hiprtcResult = 3;
pub const HIPRTC_ERROR_INVALID_OPTION: hiprtcResult = 5;
pub const HIPRTC_ERROR_INTERNAL_ERROR: hiprtcResult = 11;

/// `(hiprtc code, "name: message\0")`; the NVRTC code of the same meaning
/// has the same value (hiprtc.h; cudarc's nvrtc bindings).
const RESULTS: [(hiprtcResult, &str); 12] = [
    (0, "HIPRTC_SUCCESS\0"),
    (1, "HIPRTC_ERROR_OUT_OF_MEMORY\0"),
    (2, "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE\0"),
    (3, "HIPRTC_ERROR_INVALID_INPUT\0"),
    (4, "HIPRTC_ERROR_INVALID_PROGRAM\0"),
    (5, "HIPRTC_ERROR_INVALID_OPTION\0"),
    (6, "HIPRTC_ERROR_COMPILATION\0"),
    (7, "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE\0"),
    (8, "HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION\0"),
    (9, "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION\0"),
    (10, "HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID\0"),
    (
        11,
        "HIPRTC_ERROR_INTERNAL_ERROR (or no NVRTC: the HIP shim loads $XLA_VMM_SHIM_NVRTC, libnvrtc.so.13, .so.12, .so)\0",
    ),
];

/// An NVRTC result as hiprtc's.
fn from_nvrtc(r: c_int) -> hiprtcResult {
    if RESULTS.iter().any(|(c, _)| *c == r) {
        r
    } else {
        HIPRTC_ERROR_INTERNAL_ERROR
    }
}

type NvrtcProgram = *mut c_void;

/// The NVRTC entry points used (nvrtc.h prototypes; results as `c_int`).
struct Nvrtc {
    _lib: Library,
    create: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut NvrtcProgram) -> c_int,
}

/// # Safety
/// `T` is the symbol's true type.
unsafe fn sym<T: Copy>(lib: &Library, name: &[u8]) -> Result<T, String> {
    // SAFETY: forwarded to the caller.
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|e| e.to_string())
}

fn open(path: &PathBuf) -> Result<Nvrtc, String> {
    // SAFETY: loading NVRTC runs its initialisers, which have no
    // preconditions on our side.
    let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?;
    // SAFETY (each `sym`): the types are nvrtc.h's prototypes.
    unsafe {
        Ok(Nvrtc {
            create: sym(&lib, b"nvrtcCreateProgram\0")?,
            compile: sym(&lib, b"nvrtcCompileProgram\0")?,
            log_size: sym(&lib, b"nvrtcGetProgramLogSize\0")?,
            log: sym(&lib, b"nvrtcGetProgramLog\0")?,
            cubin_size: sym(&lib, b"nvrtcGetCUBINSize\0")?,
            cubin: sym(&lib, b"nvrtcGetCUBIN\0")?,
            destroy: sym(&lib, b"nvrtcDestroyProgram\0")?,
            _lib: lib,
        })
    }
}

/// NVRTC candidates in search order.
pub fn nvrtc_candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("XLA_VMM_SHIM_NVRTC") {
        return vec![PathBuf::from(p)];
    }
    ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
        .iter()
        .map(PathBuf::from)
        .collect()
}

fn nvrtc() -> Option<&'static Nvrtc> {
    static LIB: OnceLock<Option<Nvrtc>> = OnceLock::new();
    LIB.get_or_init(|| nvrtc_candidates().iter().find_map(|p| open(p).ok()))
        .as_ref()
}

/// Run a hiprtc body with NVRTC: `HIPRTC_ERROR_INTERNAL_ERROR` without it
/// or on a panic.
fn with_nvrtc(body: impl FnOnce(&Nvrtc) -> hiprtcResult) -> hiprtcResult {
    catch_unwind(AssertUnwindSafe(|| match nvrtc() {
        Some(n) => body(n),
        None => HIPRTC_ERROR_INTERNAL_ERROR,
    }))
    .unwrap_or(HIPRTC_ERROR_INTERNAL_ERROR)
}

/// hiprtc options as NVRTC's (see the module docs); `default_arch` gives
/// the current device's `sm_XX` when no architecture is named.
pub fn translate_options(
    options: &[&str],
    default_arch: impl FnOnce() -> Option<String>,
) -> Result<Vec<String>, hiprtcResult> {
    let mut out = Vec::new();
    let mut arch = false;
    for &o in options {
        if let Some(a) = o.strip_prefix("--offload-arch=") {
            // "sm_90" (what the shim reports as gcnArchName), maybe with
            // feature suffixes after ':' as AMD names have.
            let a = a.split(':').next().unwrap_or_default();
            let digits = a.strip_prefix("sm_").unwrap_or_default();
            let real = digits.len() >= 2
                && digits
                    .trim_end_matches(['a', 'f'])
                    .chars()
                    .all(|c| c.is_ascii_digit());
            if !real {
                return Err(HIPRTC_ERROR_INVALID_OPTION);
            }
            out.push(format!("--gpu-architecture={a}"));
            arch = true;
        } else if o.len() >= 2 && o.starts_with("-O") {
            // -O0..-O3, -Os: hipcc's optimisation levels; NVRTC has none.
        } else {
            out.push(o.to_string());
        }
    }
    if !arch {
        if let Some(a) = default_arch() {
            out.push(format!("--gpu-architecture={a}"));
        }
    }
    Ok(out)
}

/// The current HIP device's `sm_XX`, if a driver and device answer.
fn current_arch() -> Option<String> {
    if !crate::driver::cuda_present() {
        return None;
    }
    let dev = crate::driver::device(crate::driver::current()).ok()?;
    crate::runtime::arch_name(dev).ok()
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcCreateProgram(
    prog: *mut hiprtcProgram,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> hiprtcResult {
    with_nvrtc(|n| {
        // SAFETY: the arguments follow hiprtc's contract, which is NVRTC's
        // (a program is an nvrtcProgram here).
        from_nvrtc(unsafe { (n.create)(prog, src, name, num_headers, headers, include_names) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcCompileProgram(
    prog: hiprtcProgram,
    num_options: c_int,
    options: *const *const c_char,
) -> hiprtcResult {
    with_nvrtc(|n| {
        let Ok(count) = usize::try_from(num_options) else {
            return HIPRTC_ERROR_INVALID_INPUT;
        };
        if count > 0 && options.is_null() {
            return HIPRTC_ERROR_INVALID_INPUT;
        }
        let mut given = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `options` has `num_options` NUL-terminated strings
            // (hiprtc's contract).
            let o = unsafe { options.add(i).read() };
            if o.is_null() {
                return HIPRTC_ERROR_INVALID_INPUT;
            }
            // SAFETY: as above.
            match unsafe { CStr::from_ptr(o) }.to_str() {
                Ok(s) => given.push(s),
                Err(_) => return HIPRTC_ERROR_INVALID_OPTION,
            }
        }
        let opts = match translate_options(&given, current_arch) {
            Ok(o) => o,
            Err(e) => return e,
        };
        let Ok(c_opts) = opts
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<Vec<_>, _>>()
        else {
            return HIPRTC_ERROR_INVALID_OPTION;
        };
        let ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
        let Ok(n_opts) = c_int::try_from(ptrs.len()) else {
            return HIPRTC_ERROR_INVALID_OPTION;
        };
        // SAFETY: a program from hiprtcCreateProgram; the options outlive the call.
        from_nvrtc(unsafe { (n.compile)(prog, n_opts, ptrs.as_ptr()) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcGetProgramLogSize(
    prog: hiprtcProgram,
    size: *mut usize,
) -> hiprtcResult {
    // SAFETY: hiprtc's contract, which is NVRTC's.
    with_nvrtc(|n| from_nvrtc(unsafe { (n.log_size)(prog, size) }))
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcGetProgramLog(
    prog: hiprtcProgram,
    log: *mut c_char,
) -> hiprtcResult {
    // SAFETY: hiprtc's contract, which is NVRTC's (room for the log size).
    with_nvrtc(|n| from_nvrtc(unsafe { (n.log)(prog, log) }))
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcGetCodeSize(prog: hiprtcProgram, size: *mut usize) -> hiprtcResult {
    // SAFETY: hiprtc's contract, which is NVRTC's; the code is the CUBIN.
    with_nvrtc(|n| from_nvrtc(unsafe { (n.cubin_size)(prog, size) }))
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcGetCode(prog: hiprtcProgram, code: *mut c_char) -> hiprtcResult {
    // SAFETY: hiprtc's contract, which is NVRTC's (room for the CUBIN size).
    with_nvrtc(|n| from_nvrtc(unsafe { (n.cubin)(prog, code) }))
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcDestroyProgram(prog: *mut hiprtcProgram) -> hiprtcResult {
    // SAFETY: hiprtc's contract, which is NVRTC's.
    with_nvrtc(|n| from_nvrtc(unsafe { (n.destroy)(prog) }))
}

#[no_mangle]
pub unsafe extern "C" fn hiprtcGetErrorString(result: hiprtcResult) -> *const c_char {
    catch_unwind(|| {
        RESULTS
            .iter()
            .find(|(c, _)| *c == result)
            .map_or("HIPRTC_ERROR (unlisted code)\0", |(_, s)| s)
            .as_ptr()
            .cast()
    })
    .unwrap_or(std::ptr::null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_become_nvrtc_options() {
        let o = translate_options(&["-O3", "--offload-arch=sm_90", "-DX=1"], || None).unwrap();
        assert_eq!(o, ["--gpu-architecture=sm_90", "-DX=1"]);
        // No architecture named: the current device's.
        let o = translate_options(&["-O3"], || Some("sm_80".into())).unwrap();
        assert_eq!(o, ["--gpu-architecture=sm_80"]);
        assert_eq!(
            translate_options(&["-O3"], || None).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            translate_options(&["--offload-arch=sm_90a"], || None).unwrap(),
            ["--gpu-architecture=sm_90a"]
        );
        // AMD targets cannot be compiled by NVRTC.
        assert_eq!(
            translate_options(&["--offload-arch=gfx90a:sramecc+"], || None),
            Err(HIPRTC_ERROR_INVALID_OPTION)
        );
    }

    #[test]
    fn every_result_has_a_string() {
        for (c, s) in RESULTS {
            assert!(s.ends_with('\0') && s.starts_with("HIPRTC_"), "{c}");
            assert_eq!(from_nvrtc(c), c);
        }
        assert_eq!(from_nvrtc(12), HIPRTC_ERROR_INTERNAL_ERROR);
    }
}

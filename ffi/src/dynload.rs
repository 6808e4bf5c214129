//! What the hand-written run-time loaders (`nccl`, `hiprtc`) share:
//! resolving a symbol, reading a C string, finding libraries the process
//! has already mapped.

use std::ffi::{c_char, CStr};
use std::path::PathBuf;

use libloading::Library;

/// Resolve `name` in `lib` as a value of type `T` (a fn pointer type).
///
/// # Safety
/// `T` must be the symbol's true type.
pub(crate) unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    let mut z = name.as_bytes().to_vec();
    z.push(0);
    // SAFETY: forwarded to the caller (T is the symbol's type).
    match unsafe { lib.get::<T>(&z) } {
        Ok(s) => Ok(*s),
        Err(e) => Err(format!("symbol {name} missing: {e}")),
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string.
pub(crate) unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: forwarded to the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Paths of files mapped into this process whose path contains `needle`.
pub(crate) fn mapped_paths(needle: &str) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(i) = line.find('/') else { continue };
        let path = line[i..].trim_end();
        if path.contains(needle) && !path.ends_with(" (deleted)") {
            let p = PathBuf::from(path);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

//! Host-offloaded compute (`compute_on("device_host")`: XLA's
//! host-execute thunks) compiled by JAX's CPU client: the runtime's
//! [`HostProgram`]s, served by two callbacks our Python package registers
//! ([`xla_vmm_host_compute_register`]).
//!
//! - `load(module, len, aot, aot_len, &handle, err, cap)`: a serialized
//!   `xla.HloModuleProto` and XLA:CPU's ahead-of-time compile of it (the
//!   code XLA's own host thunk would run; null when the executable carries
//!   none), ready to run on the CPU; a handle for it in `handle`.
//! - `run(handle, arrays, n_args, n_results, err, cap)`: run it over
//!   `n_args` operand arrays followed by `n_results` result arrays
//!   ([`XlaVmmHostArray`]: dense row-major bytes, the element type's XLA
//!   name, the dimensions); write every result.
//!
//! Both return 0, or non-zero with a NUL-terminated message in `err` (at
//! most `cap` bytes). A module is compiled at its first run (loading an
//! executable may happen where Python cannot be called back), once per
//! call site.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use xla_vmm::HostExecuteStartThunk;
use xla_vmm_runtime::host_execute::{HostArray, HostArrayMut, HostProgram};

/// One array handed to `run`.
#[repr(C)]
pub struct XlaVmmHostArray {
    pub data: *mut c_void,
    pub bytes: u64,
    /// The element type's XLA name (`"F32"`, `"U4"`), NUL-terminated.
    pub dtype: *const c_char,
    pub dims: *const i64,
    pub rank: u64,
}

type LoadFn =
    unsafe extern "C" fn(*const u8, usize, *const u8, usize, *mut u64, *mut c_char, usize) -> i32;
type RunFn =
    unsafe extern "C" fn(u64, *const XlaVmmHostArray, usize, usize, *mut c_char, usize) -> i32;

#[derive(Clone, Copy)]
struct Hook {
    load: LoadFn,
    run: RunFn,
}

static HOOK: Mutex<Option<Hook>> = Mutex::new(None);

fn hook() -> Option<Hook> {
    *HOOK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Room for a callback's error message.
const ERR_CAP: usize = 4096;

/// Call `f(err, cap)`; its message on a non-zero return.
fn call(f: impl FnOnce(*mut c_char, usize) -> i32, what: &str) -> Result<(), String> {
    let mut err = vec![0u8; ERR_CAP];
    let rc = f(err.as_mut_ptr().cast(), ERR_CAP);
    if rc == 0 {
        return Ok(());
    }
    err[ERR_CAP - 1] = 0;
    let msg = CStr::from_bytes_until_nul(&err)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    Err(if msg.is_empty() {
        format!("{what} failed (code {rc}) without a message")
    } else {
        msg
    })
}

/// A host computation of one call site, compiled at its first run.
pub struct HostCompute {
    name: String,
    module: Vec<u8>,
    aot: Option<Vec<u8>>,
    hook: Hook,
    handle: OnceLock<Result<u64, String>>,
}

impl std::fmt::Debug for HostCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCompute")
            .field("name", &self.name)
            .field("module_bytes", &self.module.len())
            .field("aot_bytes", &self.aot.as_ref().map(Vec::len))
            .finish()
    }
}

/// The host program of a host-execute thunk, or `None` when no CPU
/// compiler is registered.
pub fn bind(program: &HostExecuteStartThunk, name: &str) -> Option<Arc<dyn HostProgram>> {
    let hook = hook()?;
    Some(Arc::new(HostCompute {
        name: name.to_string(),
        module: program.hlo_module.to_vec(),
        aot: program.aot_result.as_ref().map(|a| a.to_vec()),
        hook,
        handle: OnceLock::new(),
    }))
}

impl HostCompute {
    fn handle(&self) -> Result<u64, String> {
        self.handle
            .get_or_init(|| {
                let mut handle = 0u64;
                let (aot, aot_len) = self
                    .aot
                    .as_ref()
                    .map_or((std::ptr::null(), 0), |a| (a.as_ptr(), a.len()));
                call(
                    // SAFETY: the registered callback, given the module's
                    // bytes (and the AOT result's, or null), a handle to
                    // fill and an error buffer of `cap`.
                    |err, cap| unsafe {
                        (self.hook.load)(
                            self.module.as_ptr(),
                            self.module.len(),
                            aot,
                            aot_len,
                            &mut handle,
                            err,
                            cap,
                        )
                    },
                    "compiling the host computation",
                )
                .map(|()| handle)
                .map_err(|e| format!("compiling it for the CPU: {e}"))
            })
            .clone()
    }
}

impl HostProgram for HostCompute {
    fn run(&self, args: &[HostArray<'_>], results: &mut [HostArrayMut<'_>]) -> Result<(), String> {
        let handle = self.handle()?;
        let name = |t: xla_vmm::ElementType| {
            CString::new(t.name().unwrap_or("UNKNOWN")).unwrap_or_default()
        };
        let names: Vec<CString> = args
            .iter()
            .map(|a| name(a.dtype))
            .chain(results.iter().map(|r| name(r.dtype)))
            .collect();
        let mut arrays = Vec::with_capacity(names.len());
        for (a, n) in args.iter().zip(&names) {
            arrays.push(XlaVmmHostArray {
                // Read only: the callback's contract for operands.
                data: a.bytes.as_ptr().cast_mut().cast(),
                bytes: a.bytes.len() as u64,
                dtype: n.as_ptr(),
                dims: a.dims.as_ptr(),
                rank: a.dims.len() as u64,
            });
        }
        for (r, n) in results.iter_mut().zip(&names[args.len()..]) {
            arrays.push(XlaVmmHostArray {
                data: r.bytes.as_mut_ptr().cast(),
                bytes: r.bytes.len() as u64,
                dtype: n.as_ptr(),
                dims: r.dims.as_ptr(),
                rank: r.dims.len() as u64,
            });
        }
        call(
            // SAFETY: the registered callback over arrays that stay alive
            // (and the results exclusively ours) for the call.
            |err, cap| unsafe {
                (self.hook.run)(handle, arrays.as_ptr(), args.len(), results.len(), err, cap)
            },
            "running the host computation",
        )
    }
}

/// Register the CPU compiler's two callbacks (see the module docs); a later
/// registration replaces an earlier one for programs loaded after it.
/// Returns null, or an error message to free with `xla_vmm_stats_free`.
///
/// # Safety
/// `load` and `run` are functions of the types above that stay callable
/// for the life of the process.
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[no_mangle]
pub unsafe extern "C" fn xla_vmm_host_compute_register(
    load: *mut c_void,
    run: *mut c_void,
) -> *mut c_char {
    crate::cabi::caller::exported(|| {
        if load.is_null() || run.is_null() {
            return Err("load or run is null".to_string());
        }
        // SAFETY: non-null functions of these types (the caller's contract).
        let hook = unsafe {
            Hook {
                load: std::mem::transmute::<*mut c_void, LoadFn>(load),
                run: std::mem::transmute::<*mut c_void, RunFn>(run),
            }
        };
        *HOOK.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
        Ok(())
    })
}

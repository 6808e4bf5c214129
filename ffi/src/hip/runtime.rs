//! The HIP runtime entry points the HIP backend calls, resolved from
//! `libamdhip64` at run time instead of linked: the HIP twin of how cudarc
//! loads the CUDA driver. A build with the `hip` feature then records no
//! dependency on `libamdhip64` (so one wheel can carry both backends), and
//! one binary runs on ROCm 5 (`libamdhip64.so.5`), 6 and 7 (`.so.6`, `.so.7`)
//! alike.
//!
//! The types, constants and prototypes are `hip-runtime-sys`'s (bindgen
//! output of HIP's headers); only the functions below are defined here, as
//! functions of the same names and signatures that call through a table
//! resolved once per process ([`load`]). Before the library loads (or
//! without one) every function returns `hipErrorSharedObjectInitFailed`, and
//! [`load`] says why. `hipGetDeviceProperties` is resolved as
//! `hipGetDevicePropertiesR0000` first: since ROCm 6 that is the ROCm 5
//! layout `hip-runtime-sys` describes.
//!
//! The library is `XLA_VMM_HIP_LIBRARY` when set (a path: only that one is
//! tried), else the first that opens of: a mapped `libamdhip64.so*` (the
//! vendor ROCm plugin loaded one), `libamdhip64.so.7`, `.so.6`, `.so.5`,
//! `libamdhip64.so` for the system loader, then `/opt/rocm/lib`.

use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

use crate::dynload::{mapped_paths, symbol};

/// Defines the table, its loader and one forwarding function per entry:
/// the required entries (a library without one is not loaded), then after
/// `@optional` those a runtime may lack (their function returns `$missing`
/// there).
macro_rules! hip_entry_points {
    ($( $name:ident [$($sym:literal),+] ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty = $fallback:expr; )*
     @optional
     $( $oname:ident [$($osym:literal),+] ( $($oarg:ident : $oty:ty),* $(,)? ) -> $oret:ty = $ofallback:expr, $missing:expr; )*) => {
        #[allow(non_snake_case)]
        struct Table {
            $( $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
            $( $oname: Option<unsafe extern "C" fn($($oty),*) -> $oret>, )*
            path: PathBuf,
            _lib: Library,
        }

        fn open(path: PathBuf) -> Result<Table, String> {
            // SAFETY: loading the HIP runtime runs its initialisers, which
            // have no preconditions on our side.
            let lib = unsafe { Library::new(&path) }
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(Table {
                $( $name: {
                    let mut found = Err(String::new());
                    for s in [$($sym),+] {
                        // SAFETY: the type is hip-runtime-sys's prototype of
                        // this entry point (the same C function).
                        found = unsafe { symbol(&lib, s) };
                        if found.is_ok() {
                            break;
                        }
                    }
                    found.map_err(|e| format!("{}: {e}", path.display()))?
                }, )*
                $( $oname: [$($osym),+].into_iter().find_map(|s| {
                    // SAFETY: the type is hip-runtime-sys's prototype of
                    // this entry point (the same C function).
                    unsafe { symbol(&lib, s) }.ok()
                }), )*
                path,
                _lib: lib,
            })
        }

        $(
            #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
            /// The HIP runtime function of this name, through the table.
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                match table() {
                    // SAFETY: forwarded to the caller (the HIP API's contract).
                    Ok(t) => unsafe { (t.$name)($($arg),*) },
                    Err(_) => $fallback,
                }
            }
        )*

        $(
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            /// The HIP runtime function of this name, through the table,
            /// where the runtime has it.
            pub unsafe fn $oname($($oarg: $oty),*) -> $oret {
                match table() {
                    // SAFETY: forwarded to the caller (the HIP API's contract).
                    Ok(Table { $oname: Some(f), .. }) => unsafe { f($($oarg),*) },
                    Ok(_) => $missing,
                    Err(_) => $ofallback,
                }
            }
        )*
    };
}

pub use hip_runtime_sys::*;
use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void};

const FAIL: hipError_t = hipError_t::hipErrorSharedObjectInitFailed;

hip_entry_points! {
    hipInit ["hipInit"] (flags: c_uint) -> hipError_t = FAIL;
    hipGetDeviceCount ["hipGetDeviceCount"] (count: *mut c_int) -> hipError_t = FAIL;
    hipSetDevice ["hipSetDevice"] (device_id: c_int) -> hipError_t = FAIL;
    hipDeviceGet ["hipDeviceGet"] (device: *mut hipDevice_t, ordinal: c_int) -> hipError_t = FAIL;
    hipDeviceGetAttribute ["hipDeviceGetAttribute"] (pi: *mut c_int, attr: hipDeviceAttribute_t, device_id: c_int) -> hipError_t = FAIL;
    hipDeviceGetName ["hipDeviceGetName"] (name: *mut c_char, len: c_int, device: hipDevice_t) -> hipError_t = FAIL;
    hipDeviceTotalMem ["hipDeviceTotalMem"] (bytes: *mut usize, device: hipDevice_t) -> hipError_t = FAIL;
    hipGetDeviceProperties ["hipGetDevicePropertiesR0000", "hipGetDeviceProperties"] (prop: *mut hipDeviceProp_t, device_id: c_int) -> hipError_t = FAIL;
    hipDeviceCanAccessPeer ["hipDeviceCanAccessPeer"] (can_access: *mut c_int, device_id: c_int, peer: c_int) -> hipError_t = FAIL;
    hipDeviceEnablePeerAccess ["hipDeviceEnablePeerAccess"] (peer: c_int, flags: c_uint) -> hipError_t = FAIL;
    hipGetErrorName ["hipGetErrorName"] (e: hipError_t) -> *const c_char = std::ptr::null();
    hipGetErrorString ["hipGetErrorString"] (e: hipError_t) -> *const c_char = std::ptr::null();
    hipMemGetInfo ["hipMemGetInfo"] (free: *mut usize, total: *mut usize) -> hipError_t = FAIL;
    hipMemCreate ["hipMemCreate"] (handle: *mut hipMemGenericAllocationHandle_t, size: usize, prop: *const hipMemAllocationProp, flags: c_ulonglong) -> hipError_t = FAIL;
    hipMemRelease ["hipMemRelease"] (handle: hipMemGenericAllocationHandle_t) -> hipError_t = FAIL;
    hipMemAddressReserve ["hipMemAddressReserve"] (ptr: *mut *mut c_void, size: usize, alignment: usize, addr: *mut c_void, flags: c_ulonglong) -> hipError_t = FAIL;
    hipMemAddressFree ["hipMemAddressFree"] (ptr: *mut c_void, size: usize) -> hipError_t = FAIL;
    hipMemMap ["hipMemMap"] (ptr: *mut c_void, size: usize, offset: usize, handle: hipMemGenericAllocationHandle_t, flags: c_ulonglong) -> hipError_t = FAIL;
    hipMemUnmap ["hipMemUnmap"] (ptr: *mut c_void, size: usize) -> hipError_t = FAIL;
    hipMemSetAccess ["hipMemSetAccess"] (ptr: *mut c_void, size: usize, desc: *const hipMemAccessDesc, count: usize) -> hipError_t = FAIL;
    hipMemGetAllocationGranularity ["hipMemGetAllocationGranularity"] (granularity: *mut usize, prop: *const hipMemAllocationProp, option: hipMemAllocationGranularity_flags) -> hipError_t = FAIL;
    hipHostMalloc ["hipHostMalloc"] (ptr: *mut *mut c_void, size: usize, flags: c_uint) -> hipError_t = FAIL;
    hipHostFree ["hipHostFree"] (ptr: *mut c_void) -> hipError_t = FAIL;
    hipHostGetDevicePointer ["hipHostGetDevicePointer"] (dev: *mut *mut c_void, host: *mut c_void, flags: c_uint) -> hipError_t = FAIL;
    hipMemcpyHtoDAsync ["hipMemcpyHtoDAsync"] (dst: hipDeviceptr_t, src: *mut c_void, bytes: usize, stream: hipStream_t) -> hipError_t = FAIL;
    hipMemcpyDtoHAsync ["hipMemcpyDtoHAsync"] (dst: *mut c_void, src: hipDeviceptr_t, bytes: usize, stream: hipStream_t) -> hipError_t = FAIL;
    hipMemcpyDtoDAsync ["hipMemcpyDtoDAsync"] (dst: hipDeviceptr_t, src: hipDeviceptr_t, bytes: usize, stream: hipStream_t) -> hipError_t = FAIL;
    hipMemsetD8Async ["hipMemsetD8Async"] (dst: hipDeviceptr_t, value: c_uchar, count: usize, stream: hipStream_t) -> hipError_t = FAIL;
    hipMemsetD32Async ["hipMemsetD32Async"] (dst: hipDeviceptr_t, value: c_int, count: usize, stream: hipStream_t) -> hipError_t = FAIL;
    hipStreamCreateWithFlags ["hipStreamCreateWithFlags"] (stream: *mut hipStream_t, flags: c_uint) -> hipError_t = FAIL;
    hipStreamDestroy ["hipStreamDestroy"] (stream: hipStream_t) -> hipError_t = FAIL;
    hipStreamSynchronize ["hipStreamSynchronize"] (stream: hipStream_t) -> hipError_t = FAIL;
    hipStreamWaitEvent ["hipStreamWaitEvent"] (stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> hipError_t = FAIL;
    hipStreamBeginCapture ["hipStreamBeginCapture"] (stream: hipStream_t, mode: hipStreamCaptureMode) -> hipError_t = FAIL;
    hipStreamEndCapture ["hipStreamEndCapture"] (stream: hipStream_t, graph: *mut hipGraph_t) -> hipError_t = FAIL;
    hipStreamIsCapturing ["hipStreamIsCapturing"] (stream: hipStream_t, status: *mut hipStreamCaptureStatus) -> hipError_t = FAIL;
    hipEventCreateWithFlags ["hipEventCreateWithFlags"] (event: *mut hipEvent_t, flags: c_uint) -> hipError_t = FAIL;
    hipEventDestroy ["hipEventDestroy"] (event: hipEvent_t) -> hipError_t = FAIL;
    hipEventRecord ["hipEventRecord"] (event: hipEvent_t, stream: hipStream_t) -> hipError_t = FAIL;
    hipEventQuery ["hipEventQuery"] (event: hipEvent_t) -> hipError_t = FAIL;
    hipEventSynchronize ["hipEventSynchronize"] (event: hipEvent_t) -> hipError_t = FAIL;
    hipEventElapsedTime ["hipEventElapsedTime"] (ms: *mut f32, start: hipEvent_t, stop: hipEvent_t) -> hipError_t = FAIL;
    hipModuleLoadData ["hipModuleLoadData"] (module: *mut hipModule_t, image: *const c_void) -> hipError_t = FAIL;
    hipModuleUnload ["hipModuleUnload"] (module: hipModule_t) -> hipError_t = FAIL;
    hipModuleGetFunction ["hipModuleGetFunction"] (function: *mut hipFunction_t, module: hipModule_t, name: *const c_char) -> hipError_t = FAIL;
    hipModuleLaunchKernel ["hipModuleLaunchKernel"] (f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void) -> hipError_t = FAIL;
    hipGraphInstantiateWithFlags ["hipGraphInstantiateWithFlags"] (exec: *mut hipGraphExec_t, graph: hipGraph_t, flags: c_ulonglong) -> hipError_t = FAIL;
    hipGraphLaunch ["hipGraphLaunch"] (exec: hipGraphExec_t, stream: hipStream_t) -> hipError_t = FAIL;
    hipGraphDestroy ["hipGraphDestroy"] (graph: hipGraph_t) -> hipError_t = FAIL;
    hipGraphExecDestroy ["hipGraphExecDestroy"] (exec: hipGraphExec_t) -> hipError_t = FAIL;
    hipGraphExecUpdate ["hipGraphExecUpdate"] (exec: hipGraphExec_t, graph: hipGraph_t, error_node: *mut hipGraphNode_t, result: *mut hipGraphExecUpdateResult) -> hipError_t = FAIL;
    hipGraphGetNodes ["hipGraphGetNodes"] (graph: hipGraph_t, nodes: *mut hipGraphNode_t, count: *mut usize) -> hipError_t = FAIL;
    hipGraphNodeGetType ["hipGraphNodeGetType"] (node: hipGraphNode_t, kind: *mut hipGraphNodeType) -> hipError_t = FAIL;
    hipGraphKernelNodeGetParams ["hipGraphKernelNodeGetParams"] (node: hipGraphNode_t, params: *mut hipKernelNodeParams) -> hipError_t = FAIL;
    hipGraphExecKernelNodeSetParams ["hipGraphExecKernelNodeSetParams"] (exec: hipGraphExec_t, node: hipGraphNode_t, params: *const hipKernelNodeParams) -> hipError_t = FAIL;
    @optional
    hipGraphNodeSetEnabled ["hipGraphNodeSetEnabled"] (exec: hipGraphExec_t, node: hipGraphNode_t, enabled: c_uint) -> hipError_t = FAIL, hipError_t::hipErrorNotSupported;
}

const LIB_NAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

/// Candidate libraries in search order.
fn candidates() -> Vec<PathBuf> {
    let mut out = mapped_paths("libamdhip64.so");
    out.extend(LIB_NAMES.iter().map(PathBuf::from));
    out.extend(
        LIB_NAMES
            .iter()
            .map(|n| PathBuf::from("/opt/rocm/lib").join(n)),
    );
    out
}

fn table() -> Result<&'static Table, &'static str> {
    static TABLE: OnceLock<Result<Table, String>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            if let Some(p) = crate::settings::get().hip_library.clone() {
                let shown = p.display().to_string();
                return open(p).map_err(|e| format!("XLA_VMM_HIP_LIBRARY={shown}: {e}"));
            }
            let mut tried = Vec::new();
            for path in candidates() {
                match open(path) {
                    Ok(t) => return Ok(t),
                    Err(e) => tried.push(e),
                }
            }
            Err(format!("no HIP runtime (tried {})", tried.join("; ")))
        })
        .as_ref()
        .map_err(String::as_str)
}

/// Load the HIP runtime (once per process): the path of the library every
/// HIP function here calls into, or why there is none.
pub fn load() -> Result<PathBuf, String> {
    table().map(|t| t.path.clone()).map_err(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_prefer_the_newest_runtime_then_the_rocm_folder() {
        let c = candidates();
        let names: Vec<_> = c.iter().filter(|p| p.is_relative()).collect();
        assert_eq!(names.len(), LIB_NAMES.len());
        assert_eq!(names[0], &PathBuf::from("libamdhip64.so.7"));
        assert!(c.last().unwrap().starts_with("/opt/rocm/lib"));
    }

    #[test]
    fn every_function_answers_with_or_without_the_library() {
        let mut n = 0;
        // SAFETY: a valid out pointer.
        let e = unsafe { hipGetDeviceCount(&mut n) };
        // An optional entry point: the runtime's answer, or NotSupported
        // from a runtime without it.
        // SAFETY: null handles are an invalid argument, not undefined.
        let o = unsafe { hipGraphNodeSetEnabled(std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        match load() {
            // A runtime (with or without a device): its own answer.
            Ok(_) => {
                assert_ne!(e, FAIL);
                assert_ne!(o, FAIL);
            }
            Err(why) => {
                assert_eq!((e, o), (FAIL, FAIL));
                assert!(why.contains("no HIP runtime"), "{why}");
            }
        }
    }
}

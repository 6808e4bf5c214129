//! Every driver symbol this backend calls, listed once as required or
//! optional, and checked when the backend is created.
//!
//! cudarc loads `libcuda` lazily and **panics** when the library or a symbol
//! is missing. [`load`] finds the library with `libloading` first (same
//! search list as cudarc) and looks up every symbol, so a machine without a
//! driver, or with one too old, gets [`DeviceError::NotAvailable`] instead of
//! a panic.

use crate::error::{DeviceError, Result};

/// Calls the backend cannot work without (CUDA 12.0+ drivers have them all).
pub const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuMemGetInfo_v2",
    // VMM
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    // streams and events
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    // copies, fills, pinned memory
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    // modules and launch
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernelEx",
    "cuFuncSetAttribute",
    "cuTensorMapEncodeTiled",
    // graphs
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecUpdate_v2",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
];

/// Kernel parameter introspection (CUDA 12.4+): needed by `launch` to check
/// argument sizes; without it launches return `Unsupported`.
pub const PARAM_INFO: &[&str] = &["cuFuncGetParamInfo"];

/// Conditional WHILE nodes captured from a stream (CUDA 12.4+).
pub const CONDITIONAL: &[&str] = &[
    "cuGraphConditionalHandleCreate",
    "cuStreamGetCaptureInfo_v3",
    "cuGraphAddNode_v2",
    "cuStreamUpdateCaptureDependencies_v2",
    "cuStreamBeginCaptureToGraph",
];

/// Batched pointer-to-pointer copies, CUDA 13 form (`_v2`: no `failIdx`).
/// Without it `copy_d2d_batch` issues one `cuMemcpyDtoDAsync` per copy.
/// (The CUDA 12.8/12.9 form `cuMemcpyBatchAsync` has another signature and
/// is not used: the bindings are generated for CUDA 13.)
pub const MEMCPY_BATCH: &[&str] = &["cuMemcpyBatchAsync_v2"];

/// Finding, updating and turning off kernel nodes of graphs (CUDA 12.0+
/// names). Without them `graph_kernel_nodes` / `graph_exec_kernel_update` /
/// `graph_exec_node_set_enabled` return `Unsupported` (VA-stable copies are
/// then batched driver copies).
pub const KERNEL_NODE_UPDATE: &[&str] = &[
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphKernelNodeGetParams_v2",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuGraphNodeSetEnabled",
];

/// What [`load`] found.
#[derive(Clone, Debug)]
pub struct Symbols {
    pub param_info: bool,
    /// [`KERNEL_NODE_UPDATE`] is present.
    pub kernel_node_update: bool,
    pub conditional: bool,
    /// [`MEMCPY_BATCH`] is present.
    pub memcpy_batch: bool,
}

/// Make sure `libcuda` loads and has every [`REQUIRED`] symbol; report the
/// optional groups.
pub fn load() -> Result<Symbols> {
    let candidates = cudarc::get_lib_name_candidates("cuda");
    // SAFETY: loading libcuda runs its initializers, which are designed to
    // be loaded by any process; we only probe whether it loads.
    let found = candidates
        .iter()
        .any(|name| unsafe { libloading::Library::new(name) }.is_ok());
    if !found {
        return Err(DeviceError::NotAvailable(format!(
            "libcuda not found (tried {})",
            candidates.join(", ")
        )));
    }
    // cudarc searches the same list, so this succeeds; catch_unwind guards
    // against a difference between the two searches anyway.
    // SAFETY: culib only loads the library (see above).
    let lib = std::panic::catch_unwind(|| unsafe { xla_vmm_ffi::cuda::driver::culib() })
        .map_err(|_| DeviceError::NotAvailable("cudarc could not load libcuda".into()))?;
    let has = |name: &str| {
        // SAFETY: we only take the symbol's address, never call it through
        // this type.
        unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_ok()
    };
    let missing: Vec<&str> = REQUIRED.iter().copied().filter(|s| !has(s)).collect();
    if !missing.is_empty() {
        return Err(DeviceError::NotAvailable(format!(
            "libcuda lacks required symbols (driver too old?): {}",
            missing.join(", ")
        )));
    }
    Ok(Symbols {
        param_info: PARAM_INFO.iter().all(|s| has(s)),
        kernel_node_update: KERNEL_NODE_UPDATE.iter().all(|s| has(s)),
        conditional: CONDITIONAL.iter().all(|s| has(s)),
        memcpy_batch: MEMCPY_BATCH.iter().all(|s| has(s)),
    })
}

//! A **test-only** HIP runtime for NVIDIA GPUs: `libamdhip64.so` exporting
//! the HIP runtime entry points our HIP backend calls
//! (`crates/device/src/hip/`, through the loader in `ffi/src/hip/runtime.rs`),
//! each forwarded to the CUDA driver API, as HIP's own NVIDIA platform does;
//! the hiprtc entry points our hiprtc loader needs (`ffi/src/hiprtc.rs`),
//! forwarded to NVRTC; and the hipBLASLt entry points our HIP GEMM engine
//! calls (`crates/device/src/hip/blaslt.rs`), forwarded to cuBLASLt
//! ([`blaslt`]).
//!
//! What it checks: **our** HIP code (the backend, its VMM, stream, event,
//! graph and module paths, our HIP kernel sources) on an NVIDIA GPU. It does
//! not check AMD's runtime or driver, nor anything AMD-specific (ISA, code
//! objects, memory model). CI compiles and host-tests it (no libcuda);
//! `integration/gpu_check.sh` section `hip-shim` runs the backend's
//! conformance suite through it, which passed on an H200 at 8520e27
//! (`integration/results/hip_shim_8520e27.md`).
//!
//! How it maps:
//! - Devices: HIP ordinal `i` is CUDA device `i`. HIP's per-thread current
//!   device is a thread-local here (default 0); each device's primary
//!   context is retained once and made current on entry of every call that
//!   needs one. `hipDeviceProp_t` is filled from device attributes, with
//!   `gcnArchName` = `sm_<major><minor>` (so the backend's hiprtc options
//!   become `--offload-arch=sm_90` on an H200).
//! - Errors: every `CUresult` is translated to a `hipError_t` by an explicit
//!   match (unknown codes: `hipErrorUnknown`); enums and structs field by
//!   field, flags bit by bit. A value the shim cannot translate (an AMD-only
//!   attribute, a flag CUDA has no twin of, a node type HIP 5.2 cannot name)
//!   is `hipErrorNotSupported`, never a guess.
//! - Handles (streams, events, modules, functions, graphs, execs, nodes) are
//!   pointers on both sides and pass through; device pointers
//!   (`hipDeviceptr_t`, a pointer) become `CUdeviceptr` (u64) and VMM
//!   handles (a pointer in HIP, a u64 in CUDA) are converted both ways.
//! - hiprtc: the program is NVRTC's; `--offload-arch=sm_XX` becomes
//!   `--gpu-architecture=sm_XX` (the current device's when none is given),
//!   `-O<n>` is dropped, other options pass through; the "code" is the CUBIN,
//!   which `hipModuleLoadData` hands to `cuModuleLoadData`. NVRTC is loaded at
//!   run time: `$XLA_VMM_SHIM_NVRTC`, else `libnvrtc.so.13`, `.so.12`, `.so`.
//!
//! What it does not do: anything beyond the entry points listed in
//! [`HIP_ENTRY_POINTS`], [`HIPRTC_ENTRY_POINTS`] and
//! [`HIPBLASLT_ENTRY_POINTS`] (no RCCL, no other HIP API), no AMD code objects (a HSACO image fails in
//! `cuModuleLoadData`), no speed (a context is made current on every call).
//!
//! Without libcuda (CI, this project's build machines) every function
//! returns an error (`hipErrorNotInitialized`; `hipGetDeviceCount` sets 0
//! and returns `hipErrorNoDevice`); `hipGetErrorName` / `hipGetErrorString`
//! and `hiprtcGetErrorString` still answer. No export unwinds into C: each
//! catches panics (cudarc panics on a symbol the driver lacks) and returns
//! `hipErrorUnknown` (hiprtc: `HIPRTC_ERROR_INTERNAL_ERROR`).
//!
//! By-value enum parameters (`hipDeviceAttribute_t`, `hipStreamCaptureMode`,
//! `hipMemAllocationGranularity_flags`, `hipError_t`) are taken as `u32`, the
//! same C ABI as those C enums, so that a value outside the Rust enum is an
//! error here instead of undefined behaviour; likewise enum fields read from
//! the caller's structs are read as integers.

// An FFI layer: unsafe is allowed, and every unsafe operation sits in its
// own block with a SAFETY comment (also inside unsafe fns).
#![deny(unsafe_op_in_unsafe_fn)]
// The exports' safety contract is the HIP API's, documented once above.
#![allow(clippy::missing_safety_doc)]

pub mod blaslt;
mod driver;
mod errors;
pub mod rtc;
pub mod runtime;

/// The HIP runtime entry points the shim exports: exactly the ones
/// `ffi/src/hip/runtime.rs` resolves (a test checks the two lists agree).
pub const HIP_ENTRY_POINTS: [&str; 56] = [
    "hipInit",
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipDeviceGet",
    "hipDeviceGetAttribute",
    "hipDeviceGetName",
    "hipDeviceTotalMem",
    "hipGetDeviceProperties",
    "hipDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess",
    "hipGetErrorName",
    "hipGetErrorString",
    "hipMemGetInfo",
    "hipMemCreate",
    "hipMemRelease",
    "hipMemAddressReserve",
    "hipMemAddressFree",
    "hipMemMap",
    "hipMemUnmap",
    "hipMemSetAccess",
    "hipMemGetAllocationGranularity",
    "hipHostMalloc",
    "hipHostFree",
    "hipHostGetDevicePointer",
    "hipMemcpyHtoDAsync",
    "hipMemcpyDtoHAsync",
    "hipMemcpyDtoDAsync",
    "hipMemsetD8Async",
    "hipMemsetD32Async",
    "hipStreamCreateWithFlags",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipStreamWaitEvent",
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipStreamIsCapturing",
    "hipEventCreateWithFlags",
    "hipEventDestroy",
    "hipEventRecord",
    "hipEventQuery",
    "hipEventSynchronize",
    "hipEventElapsedTime",
    "hipModuleLoadData",
    "hipModuleUnload",
    "hipModuleGetFunction",
    "hipModuleLaunchKernel",
    "hipGraphInstantiateWithFlags",
    "hipGraphLaunch",
    "hipGraphDestroy",
    "hipGraphExecDestroy",
    "hipGraphExecUpdate",
    "hipGraphGetNodes",
    "hipGraphNodeGetType",
    "hipGraphKernelNodeGetParams",
    "hipGraphExecKernelNodeSetParams",
    "hipGraphNodeSetEnabled",
];

/// Exported under a second name too: our loader resolves
/// `hipGetDeviceProperties` as `hipGetDevicePropertiesR0000` first (ROCm 6's
/// name of the ROCm 5 layout, the one `hip-runtime-sys` describes).
pub const HIP_ALIASES: [&str; 1] = ["hipGetDevicePropertiesR0000"];

/// The hipBLASLt entry points our HIP GEMM engine
/// (`crates/device/src/hip/blaslt.rs`) resolves, on cuBLASLt ([`blaslt`];
/// point `XLA_VMM_HIPBLASLT_LIBRARY` at this library).
pub const HIPBLASLT_ENTRY_POINTS: [&str; 13] = [
    "hipblasLtCreate",
    "hipblasLtDestroy",
    "hipblasLtMatmulDescCreate",
    "hipblasLtMatmulDescDestroy",
    "hipblasLtMatmulDescSetAttribute",
    "hipblasLtMatrixLayoutCreate",
    "hipblasLtMatrixLayoutDestroy",
    "hipblasLtMatrixLayoutSetAttribute",
    "hipblasLtMatmulPreferenceCreate",
    "hipblasLtMatmulPreferenceDestroy",
    "hipblasLtMatmulPreferenceSetAttribute",
    "hipblasLtMatmulAlgoGetHeuristic",
    "hipblasLtMatmul",
];

/// The hiprtc entry points `ffi/src/hiprtc.rs` needs, exported from the same
/// library (point `XLA_VMM_HIPRTC_LIBRARY` at it).
pub const HIPRTC_ENTRY_POINTS: [&str; 8] = [
    "hiprtcCreateProgram",
    "hiprtcCompileProgram",
    "hiprtcGetProgramLogSize",
    "hiprtcGetProgramLog",
    "hiprtcGetCodeSize",
    "hiprtcGetCode",
    "hiprtcDestroyProgram",
    "hiprtcGetErrorString",
];

//! `hipError_t`: its names and messages (for `hipGetErrorName` /
//! `hipGetErrorString`, which work without a driver), the lookup of a raw
//! code, and the translation of every `CUresult`.

use std::ffi::c_char;

use cudarc::driver::sys::CUresult;
use hip_runtime_sys::hipError_t;

/// `(code, "name\0", "message\0")` for every `hipError_t` of the bindings.
macro_rules! error_table {
    ($($v:ident => $msg:literal,)*) => {
        const ERRORS: &[(hipError_t, &str, &str)] = &[
            $( (hipError_t::$v, concat!(stringify!($v), "\0"), concat!($msg, "\0")), )*
        ];
    };
}

error_table! {
    hipSuccess => "no error",
    hipErrorInvalidValue => "invalid argument",
    hipErrorOutOfMemory => "out of memory",
    hipErrorNotInitialized => "initialization error (no CUDA driver: the HIP shim forwards to libcuda)",
    hipErrorDeinitialized => "driver shutting down",
    hipErrorProfilerDisabled => "profiler disabled",
    hipErrorProfilerNotInitialized => "profiler not initialized",
    hipErrorProfilerAlreadyStarted => "profiler already started",
    hipErrorProfilerAlreadyStopped => "profiler already stopped",
    hipErrorInvalidConfiguration => "invalid configuration argument",
    hipErrorInvalidPitchValue => "invalid pitch argument",
    hipErrorInvalidSymbol => "invalid device symbol",
    hipErrorInvalidDevicePointer => "invalid device pointer",
    hipErrorInvalidMemcpyDirection => "invalid copy direction",
    hipErrorInsufficientDriver => "driver version is insufficient",
    hipErrorMissingConfiguration => "missing configuration",
    hipErrorPriorLaunchFailure => "unspecified launch failure in prior launch",
    hipErrorInvalidDeviceFunction => "invalid device function",
    hipErrorNoDevice => "no GPU device is detected",
    hipErrorInvalidDevice => "invalid device ordinal",
    hipErrorInvalidImage => "device kernel image is invalid",
    hipErrorInvalidContext => "invalid device context",
    hipErrorContextAlreadyCurrent => "context already current",
    hipErrorMapFailed => "mapping of buffer object failed",
    hipErrorUnmapFailed => "unmapping of buffer object failed",
    hipErrorArrayIsMapped => "array is mapped",
    hipErrorAlreadyMapped => "resource already mapped",
    hipErrorNoBinaryForGpu => "no kernel image is available for execution on the device",
    hipErrorAlreadyAcquired => "resource already acquired",
    hipErrorNotMapped => "resource not mapped",
    hipErrorNotMappedAsArray => "resource not mapped as array",
    hipErrorNotMappedAsPointer => "resource not mapped as pointer",
    hipErrorECCNotCorrectable => "uncorrectable ECC error encountered",
    hipErrorUnsupportedLimit => "limit is not supported on this architecture",
    hipErrorContextAlreadyInUse => "exclusive-thread device already in use by a different thread",
    hipErrorPeerAccessUnsupported => "peer access is not supported between these two devices",
    hipErrorInvalidKernelFile => "a PTX JIT compilation failed",
    hipErrorInvalidGraphicsContext => "invalid OpenGL or DirectX context",
    hipErrorInvalidSource => "device kernel image is invalid",
    hipErrorFileNotFound => "file not found",
    hipErrorSharedObjectSymbolNotFound => "shared object symbol not found",
    hipErrorSharedObjectInitFailed => "shared object initialization failed",
    hipErrorOperatingSystem => "OS call failed or operation not supported on this OS",
    hipErrorInvalidHandle => "invalid resource handle",
    hipErrorIllegalState => "the operation cannot be performed in the present state",
    hipErrorNotFound => "named symbol not found",
    hipErrorNotReady => "device not ready",
    hipErrorIllegalAddress => "an illegal memory access was encountered",
    hipErrorLaunchOutOfResources => "too many resources requested for launch",
    hipErrorLaunchTimeOut => "the launch timed out and was terminated",
    hipErrorPeerAccessAlreadyEnabled => "peer access is already enabled",
    hipErrorPeerAccessNotEnabled => "peer access has not been enabled",
    hipErrorSetOnActiveProcess => "cannot set while device is active in this process",
    hipErrorContextIsDestroyed => "context is destroyed",
    hipErrorAssert => "device-side assert triggered",
    hipErrorHostMemoryAlreadyRegistered => "part or all of the requested memory range is already mapped",
    hipErrorHostMemoryNotRegistered => "pointer does not correspond to a registered memory region",
    hipErrorLaunchFailure => "unspecified launch failure",
    hipErrorCooperativeLaunchTooLarge => "too many blocks in cooperative launch",
    hipErrorNotSupported => "operation not supported (by the device, or not mapped by the HIP shim)",
    hipErrorStreamCaptureUnsupported => "operation not permitted when stream is capturing",
    hipErrorStreamCaptureInvalidated => "operation failed due to a previous error during capture",
    hipErrorStreamCaptureMerge => "operation would result in a merge of separate capture sequences",
    hipErrorStreamCaptureUnmatched => "capture was not ended in the same stream as it began",
    hipErrorStreamCaptureUnjoined => "capturing stream has unjoined work",
    hipErrorStreamCaptureIsolation => "dependency created on uncaptured work in another stream",
    hipErrorStreamCaptureImplicit => "operation would make the legacy stream depend on a capturing blocking stream",
    hipErrorCapturedEvent => "operation not permitted on an event last recorded in a capturing stream",
    hipErrorStreamCaptureWrongThread => "attempt to terminate a thread-local capture sequence from another thread",
    hipErrorGraphExecUpdateFailure => "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
    hipErrorUnknown => "unknown error",
    hipErrorRuntimeMemory => "runtime memory call returned error",
    hipErrorRuntimeOther => "runtime call other than memory returned error",
    hipErrorTbd => "marker that more error codes are needed",
}

fn entry(code: u32) -> Option<&'static (hipError_t, &'static str, &'static str)> {
    ERRORS.iter().find(|(e, _, _)| *e as u32 == code)
}

/// What an unlisted code reads as.
const UNLISTED: (hipError_t, &str, &str) = (
    hipError_t::hipErrorUnknown,
    "hipErrorUnknown\0",
    "unknown error (a code the HIP 5.2 bindings do not list)\0",
);

/// `hipGetErrorName`: a static NUL-terminated name (unlisted codes:
/// `hipErrorUnknown`).
pub(crate) fn name(code: u32) -> *const c_char {
    entry(code).unwrap_or(&UNLISTED).1.as_ptr().cast()
}

/// `hipGetErrorString`: a static NUL-terminated message.
pub(crate) fn message(code: u32) -> *const c_char {
    entry(code).unwrap_or(&UNLISTED).2.as_ptr().cast()
}

/// The HIP twin of a CUDA driver result. Unlisted codes (newer drivers,
/// CUDA-only conditions) become `hipErrorUnknown`.
pub(crate) fn from_cuda(r: CUresult) -> hipError_t {
    use hipError_t as H;
    use CUresult as C;
    match r {
        C::CUDA_SUCCESS => H::hipSuccess,
        C::CUDA_ERROR_INVALID_VALUE => H::hipErrorInvalidValue,
        C::CUDA_ERROR_OUT_OF_MEMORY => H::hipErrorOutOfMemory,
        C::CUDA_ERROR_NOT_INITIALIZED => H::hipErrorNotInitialized,
        C::CUDA_ERROR_DEINITIALIZED => H::hipErrorDeinitialized,
        C::CUDA_ERROR_PROFILER_DISABLED => H::hipErrorProfilerDisabled,
        C::CUDA_ERROR_PROFILER_NOT_INITIALIZED => H::hipErrorProfilerNotInitialized,
        C::CUDA_ERROR_PROFILER_ALREADY_STARTED => H::hipErrorProfilerAlreadyStarted,
        C::CUDA_ERROR_PROFILER_ALREADY_STOPPED => H::hipErrorProfilerAlreadyStopped,
        C::CUDA_ERROR_STUB_LIBRARY | C::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER => {
            H::hipErrorInsufficientDriver
        }
        C::CUDA_ERROR_NO_DEVICE => H::hipErrorNoDevice,
        C::CUDA_ERROR_INVALID_DEVICE => H::hipErrorInvalidDevice,
        C::CUDA_ERROR_INVALID_IMAGE => H::hipErrorInvalidImage,
        C::CUDA_ERROR_INVALID_CONTEXT => H::hipErrorInvalidContext,
        C::CUDA_ERROR_CONTEXT_ALREADY_CURRENT => H::hipErrorContextAlreadyCurrent,
        C::CUDA_ERROR_MAP_FAILED => H::hipErrorMapFailed,
        C::CUDA_ERROR_UNMAP_FAILED => H::hipErrorUnmapFailed,
        C::CUDA_ERROR_ARRAY_IS_MAPPED => H::hipErrorArrayIsMapped,
        C::CUDA_ERROR_ALREADY_MAPPED => H::hipErrorAlreadyMapped,
        C::CUDA_ERROR_NO_BINARY_FOR_GPU => H::hipErrorNoBinaryForGpu,
        C::CUDA_ERROR_ALREADY_ACQUIRED => H::hipErrorAlreadyAcquired,
        C::CUDA_ERROR_NOT_MAPPED => H::hipErrorNotMapped,
        C::CUDA_ERROR_NOT_MAPPED_AS_ARRAY => H::hipErrorNotMappedAsArray,
        C::CUDA_ERROR_NOT_MAPPED_AS_POINTER => H::hipErrorNotMappedAsPointer,
        C::CUDA_ERROR_ECC_UNCORRECTABLE => H::hipErrorECCNotCorrectable,
        C::CUDA_ERROR_UNSUPPORTED_LIMIT => H::hipErrorUnsupportedLimit,
        C::CUDA_ERROR_CONTEXT_ALREADY_IN_USE => H::hipErrorContextAlreadyInUse,
        C::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => H::hipErrorPeerAccessUnsupported,
        // hip_runtime_api.h: "In CUDA DRV, it is CUDA_ERROR_INVALID_PTX".
        C::CUDA_ERROR_INVALID_PTX | C::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
            H::hipErrorInvalidKernelFile
        }
        C::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT => H::hipErrorInvalidGraphicsContext,
        C::CUDA_ERROR_INVALID_SOURCE => H::hipErrorInvalidSource,
        C::CUDA_ERROR_FILE_NOT_FOUND => H::hipErrorFileNotFound,
        C::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND => H::hipErrorSharedObjectSymbolNotFound,
        C::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED => H::hipErrorSharedObjectInitFailed,
        C::CUDA_ERROR_OPERATING_SYSTEM => H::hipErrorOperatingSystem,
        C::CUDA_ERROR_INVALID_HANDLE => H::hipErrorInvalidHandle,
        C::CUDA_ERROR_ILLEGAL_STATE => H::hipErrorIllegalState,
        C::CUDA_ERROR_NOT_FOUND => H::hipErrorNotFound,
        C::CUDA_ERROR_NOT_READY => H::hipErrorNotReady,
        C::CUDA_ERROR_ILLEGAL_ADDRESS => H::hipErrorIllegalAddress,
        C::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => H::hipErrorLaunchOutOfResources,
        C::CUDA_ERROR_LAUNCH_TIMEOUT => H::hipErrorLaunchTimeOut,
        C::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => H::hipErrorPeerAccessAlreadyEnabled,
        C::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => H::hipErrorPeerAccessNotEnabled,
        C::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE => H::hipErrorSetOnActiveProcess,
        C::CUDA_ERROR_CONTEXT_IS_DESTROYED => H::hipErrorContextIsDestroyed,
        C::CUDA_ERROR_ASSERT => H::hipErrorAssert,
        C::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => H::hipErrorHostMemoryAlreadyRegistered,
        C::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => H::hipErrorHostMemoryNotRegistered,
        C::CUDA_ERROR_LAUNCH_FAILED => H::hipErrorLaunchFailure,
        C::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE => H::hipErrorCooperativeLaunchTooLarge,
        C::CUDA_ERROR_NOT_SUPPORTED => H::hipErrorNotSupported,
        C::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => H::hipErrorStreamCaptureUnsupported,
        C::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => H::hipErrorStreamCaptureInvalidated,
        C::CUDA_ERROR_STREAM_CAPTURE_MERGE => H::hipErrorStreamCaptureMerge,
        C::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => H::hipErrorStreamCaptureUnmatched,
        C::CUDA_ERROR_STREAM_CAPTURE_UNJOINED => H::hipErrorStreamCaptureUnjoined,
        C::CUDA_ERROR_STREAM_CAPTURE_ISOLATION => H::hipErrorStreamCaptureIsolation,
        C::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => H::hipErrorStreamCaptureImplicit,
        C::CUDA_ERROR_CAPTURED_EVENT => H::hipErrorCapturedEvent,
        C::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => H::hipErrorStreamCaptureWrongThread,
        C::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => H::hipErrorGraphExecUpdateFailure,
        _ => H::hipErrorUnknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_code_has_a_name_and_a_message() {
        for (e, n, m) in ERRORS {
            assert!(
                n.ends_with('\0') && m.ends_with('\0') && m.len() > 1,
                "{e:?}"
            );
            assert_eq!(entry(*e as u32).map(|x| x.0), Some(*e));
        }
        assert!(entry(123_456).is_none());
        // SAFETY: `name` returns static NUL-terminated strings.
        let unlisted = unsafe { std::ffi::CStr::from_ptr(name(123_456)) };
        assert_eq!(unlisted.to_str(), Ok("hipErrorUnknown"));
    }

    #[test]
    fn cuda_results_keep_their_meaning() {
        assert_eq!(from_cuda(CUresult::CUDA_SUCCESS), hipError_t::hipSuccess);
        assert_eq!(
            from_cuda(CUresult::CUDA_ERROR_NOT_READY),
            hipError_t::hipErrorNotReady
        );
        assert_eq!(
            from_cuda(CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE),
            hipError_t::hipErrorGraphExecUpdateFailure
        );
        assert_eq!(
            from_cuda(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
            hipError_t::hipErrorPeerAccessAlreadyEnabled
        );
        assert_eq!(
            from_cuda(CUresult::CUDA_ERROR_MPS_RPC_FAILURE),
            hipError_t::hipErrorUnknown
        );
    }
}

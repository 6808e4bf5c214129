//! hipFFT, for XLA's FFT thunks on ROCm (`FftThunk`), through
//! [`crate::fft_lib`]: XLA's ROCm path (`rocm_fft.cc`) makes and runs its
//! plans as the CUDA path does, with hipFFT's names.
//!
//! **Never run**: no AMD GPU was available, and the HIP test shim does not
//! forward hipFFT. Debian's ROCm 5.2 packages have no hipFFT headers, so the
//! values here are from hipFFT's `hipfft.h` (the same as cuFFT's, which it
//! mirrors: `HIPFFT_C2C = 0x29` ..., `HIPFFT_FORWARD = -1`); a hipFFT handle
//! is a pointer (`hipfftHandle_t *`). The library is `$ROCM_PATH/lib` /
//! `/opt/rocm/lib`'s `libhipfft.so.0` or `libhipfft.so`, after
//! `LD_LIBRARY_PATH`, then the system loader's search path; it is loaded
//! the first time a program with an FFT is loaded.

use std::ffi::c_void;

use crate::error::Result;
use crate::fft_lib::{FftAbi, FftLib};

const LIB_NAMES: &[&str] = &["libhipfft.so.0", "libhipfft.so"];

static ABI: FftAbi = FftAbi {
    label: "hipFFT",
    create: "hipfftCreate",
    destroy: "hipfftDestroy",
    set_auto_allocation: "hipfftSetAutoAllocation",
    make_plan_many64: "hipfftMakePlanMany64",
    set_work_area: "hipfftSetWorkArea",
    set_stream: "hipfftSetStream",
    exec: [
        "hipfftExecC2C",
        "hipfftExecR2C",
        "hipfftExecC2R",
        "hipfftExecZ2Z",
        "hipfftExecD2Z",
        "hipfftExecZ2D",
    ],
    // HIPFFT_C2C, _R2C, _C2R, _Z2Z, _D2Z, _Z2D.
    types: [0x29, 0x2a, 0x2c, 0x69, 0x6a, 0x6c],
    // HIPFFT_FORWARD, HIPFFT_BACKWARD.
    directions: [-1, 1],
};

/// Load hipFFT; the device must be current.
pub(crate) fn library() -> Result<FftLib<*mut c_void>> {
    FftLib::new(&ABI, crate::libsearch::rocm(LIB_NAMES))
}

//! cuFFT, for XLA's FFT thunks (`FftThunk`), through [`crate::fft_lib`]:
//! the entry points stream_executor's `cuda_fft.cc` calls, the enum values
//! from cudarc's bindings of `cufft.h`. The library comes from the same
//! places as cuBLAS (`LD_LIBRARY_PATH`, the `nvidia-cu13` / `nvidia-cufft`
//! wheels, the system loader) and is loaded the first time a program with
//! an FFT is loaded. A cuFFT handle is an `int`.

use std::ffi::c_int;

use xla_vmm_ffi::cuda::cufft as sys;

use crate::error::Result;
use crate::fft_lib::{FftAbi, FftLib};

const LIB_NAMES: &[&str] = &["libcufft.so.12", "libcufft.so.11", "libcufft.so"];

static ABI: FftAbi = FftAbi {
    label: "cuFFT",
    create: "cufftCreate",
    destroy: "cufftDestroy",
    set_auto_allocation: "cufftSetAutoAllocation",
    make_plan_many64: "cufftMakePlanMany64",
    set_work_area: "cufftSetWorkArea",
    set_stream: "cufftSetStream",
    exec: [
        "cufftExecC2C",
        "cufftExecR2C",
        "cufftExecC2R",
        "cufftExecZ2Z",
        "cufftExecD2Z",
        "cufftExecZ2D",
    ],
    types: [
        sys::cufftType::CUFFT_C2C as c_int,
        sys::cufftType::CUFFT_R2C as c_int,
        sys::cufftType::CUFFT_C2R as c_int,
        sys::cufftType::CUFFT_Z2Z as c_int,
        sys::cufftType::CUFFT_D2Z as c_int,
        sys::cufftType::CUFFT_Z2D as c_int,
    ],
    // CUFFT_FORWARD, CUFFT_INVERSE.
    directions: [-1, 1],
};

/// Load cuFFT; the device's context must be current.
pub(crate) fn library() -> Result<FftLib<c_int>> {
    FftLib::new(&ABI, crate::libsearch::cuda(LIB_NAMES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cufft_type_values_are_the_headers() {
        assert_eq!(ABI.types, [0x29, 0x2a, 0x2c, 0x69, 0x6a, 0x6c]);
    }
}

//! cuBLAS (not Lt), for what XLA runs through it and cuBLASLt cannot do:
//! triangular solves (`TriangularSolveThunk`) and the scaling after an
//! inverse FFT (`FftThunk`), through
//! [`crate::trsm_lib`]. The enum values are cuBLAS's (cudarc's bindings of
//! `cublas_api.h`); the library comes from the same places as cuBLASLt
//! (`LD_LIBRARY_PATH`, the `nvidia-cublas` wheel, the system loader) and is
//! loaded the first time a program with a solve is loaded.

use std::ffi::c_int;

use xla_vmm_ffi::cuda::cublas as sys;

use crate::error::Result;
use crate::trsm_lib::{Solver, SolverAbi};

const LIB_NAMES: &[&str] = &["libcublas.so.13", "libcublas.so"];

static ABI: SolverAbi = SolverAbi {
    label: "cuBLAS",
    create: "cublasCreate_v2",
    destroy: "cublasDestroy_v2",
    set_stream: "cublasSetStream_v2",
    set_pointer_mode: "cublasSetPointerMode_v2",
    solvers: [
        ("cublasStrsm_v2", "cublasStrsmBatched"),
        ("cublasDtrsm_v2", "cublasDtrsmBatched"),
        ("cublasCtrsm_v2", "cublasCtrsmBatched"),
        ("cublasZtrsm_v2", "cublasZtrsmBatched"),
    ],
    scalers: [
        "cublasSscal_v2",
        "cublasDscal_v2",
        "cublasCscal_v2",
        "cublasZscal_v2",
    ],
    pointer_mode_host: sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST as c_int,
    side: [
        sys::cublasSideMode_t::CUBLAS_SIDE_LEFT as c_int,
        sys::cublasSideMode_t::CUBLAS_SIDE_RIGHT as c_int,
    ],
    fill: [
        sys::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER as c_int,
        sys::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER as c_int,
    ],
    operation: [
        sys::cublasOperation_t::CUBLAS_OP_N as c_int,
        sys::cublasOperation_t::CUBLAS_OP_T as c_int,
        sys::cublasOperation_t::CUBLAS_OP_C as c_int,
    ],
    diagonal: [
        sys::cublasDiagType_t::CUBLAS_DIAG_NON_UNIT as c_int,
        sys::cublasDiagType_t::CUBLAS_DIAG_UNIT as c_int,
    ],
};

/// Load cuBLAS and create a handle; the device's context must be current.
pub(crate) fn solver() -> Result<Solver> {
    Solver::new(&ABI, crate::libsearch::cuda(LIB_NAMES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublas_enum_values_are_the_headers() {
        assert_eq!(ABI.side, [0, 1]);
        assert_eq!(ABI.fill, [0, 1]);
        assert_eq!(ABI.operation, [0, 1, 2]);
        assert_eq!(ABI.diagonal, [0, 1]);
        assert_eq!(ABI.pointer_mode_host, 0);
    }
}

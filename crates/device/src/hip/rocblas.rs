//! rocBLAS, for triangular solves on ROCm (`TriangularSolveThunk`) and the
//! scaling after an inverse FFT (`FftThunk`), through
//! [`crate::trsm_lib`]: XLA's ROCm path (`rocm_blas.cc`) runs them with
//! `rocblas_?trsm` / `rocblas_?trsm_batched`, host pointer mode.
//!
//! **Never run**: no AMD GPU was available, and the HIP test shim does not
//! forward rocBLAS. Debian's ROCm 5.2 packages have no rocBLAS headers, so
//! the entry points are declared in [`crate::trsm_lib`] and the enum values
//! here, from rocBLAS's `rocblas-types.h` (CBLAS numbering, the same in
//! ROCm 5, 6 and 7). The library is `$ROCM_PATH/lib` / `/opt/rocm/lib`'s
//! `librocblas.so.5` (ROCm 7), `.so.4` (ROCm 6) or `librocblas.so`, after
//! `LD_LIBRARY_PATH`, then the system loader's search path; it is loaded
//! the first time a program with a solve is loaded.

use crate::error::Result;
use crate::trsm_lib::{Solver, SolverAbi};

const LIB_NAMES: &[&str] = &["librocblas.so.5", "librocblas.so.4", "librocblas.so"];

static ABI: SolverAbi = SolverAbi {
    label: "rocBLAS",
    create: "rocblas_create_handle",
    destroy: "rocblas_destroy_handle",
    set_stream: "rocblas_set_stream",
    set_pointer_mode: "rocblas_set_pointer_mode",
    solvers: [
        ("rocblas_strsm", "rocblas_strsm_batched"),
        ("rocblas_dtrsm", "rocblas_dtrsm_batched"),
        ("rocblas_ctrsm", "rocblas_ctrsm_batched"),
        ("rocblas_ztrsm", "rocblas_ztrsm_batched"),
    ],
    scalers: [
        "rocblas_sscal",
        "rocblas_dscal",
        "rocblas_cscal",
        "rocblas_zscal",
    ],
    // rocblas_pointer_mode_host.
    pointer_mode_host: 0,
    // rocblas_side_left / _right.
    side: [141, 142],
    // rocblas_fill_lower / _upper.
    fill: [122, 121],
    // rocblas_operation_none / _transpose / _conjugate_transpose.
    operation: [111, 112, 113],
    // rocblas_diagonal_non_unit / _unit.
    diagonal: [131, 132],
};

/// Load rocBLAS and create a handle; the device must be current.
pub(crate) fn solver() -> Result<Solver> {
    Solver::new(&ABI, crate::libsearch::rocm(LIB_NAMES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocblas_enum_values_are_cblas_numbers() {
        assert_eq!(
            (ABI.side, ABI.fill, ABI.diagonal),
            ([141, 142], [122, 121], [131, 132])
        );
        assert_eq!(ABI.operation, [111, 112, 113]);
    }

    #[test]
    fn without_the_library_loading_is_an_error_not_a_crash() {
        // Debian's CI image has no rocBLAS.
        if crate::libsearch::rocm(LIB_NAMES)
            .iter()
            .any(|p| p.is_absolute())
        {
            return;
        }
        let e = solver().err().expect("no rocBLAS here").to_string();
        assert!(e.contains("rocBLAS not found"), "{e}");
    }
}

//! The plan's `GemmConfig` (proto numbers) → the device layer's GEMM config.

use xla_vmm_device::blas::{ComputationType, GemmConfig, MatrixLayout, Order, Transpose};

use crate::error::{Result, RuntimeError};

fn layout(m: &xla_vmm::MatrixLayout, what: &str) -> Result<MatrixLayout> {
    let order = match m.order {
        1 => Order::RowMajor,
        2 => Order::ColumnMajor,
        o => return Err(RuntimeError::invalid(format!("{what} layout order {o}"))),
    };
    let transpose = match m.transpose {
        0 => Transpose::NoTranspose,
        1 => Transpose::Transpose,
        2 => Transpose::ConjugateTranspose,
        t => return Err(RuntimeError::invalid(format!("{what} transpose {t}"))),
    };
    Ok(MatrixLayout {
        dtype: m.dtype.0,
        num_rows: m.num_rows,
        num_cols: m.num_cols,
        order,
        batch_size: m.batch_size,
        leading_dim_stride: m.leading_dim_stride,
        batch_stride: m.batch_stride,
        transpose,
    })
}

/// XLA's `GemmConfig::FromProto`.
pub fn config(c: &xla_vmm::GemmConfig) -> Result<GemmConfig> {
    Ok(GemmConfig {
        lhs: layout(&c.lhs_layout, "lhs")?,
        rhs: layout(&c.rhs_layout, "rhs")?,
        c: layout(&c.c_layout, "c")?,
        output: layout(&c.output_layout, "output")?,
        alpha_real: c.alpha_real,
        alpha_imag: c.alpha_imag,
        beta: c.beta,
        compute_precision: c.compute_precision,
        precision_algorithm: c.precision_algorithm,
        compute_type: ComputationType::from_proto(c.compute_type)?,
    })
}

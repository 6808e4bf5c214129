//! Matrix multiply configuration (`xla.GemmConfigProto`,
//! xla/stream_executor/gpu/gpu_blas_lt.proto).

use serde::Serialize;

use super::ElementType;

/// `GemmConfigProto.MatrixLayout`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MatrixLayout {
    /// `Order`: 0 unknown, 1 row major, 2 column major.
    pub order: i32,
    pub num_rows: i64,
    pub num_cols: i64,
    pub batch_size: i64,
    /// Leading dimension stride in elements.
    pub leading_dim_stride: i64,
    /// Stride between batch matrices in elements.
    pub batch_stride: i64,
    /// `xla.BlasTransposeProto`: 0 none, 1 transpose, 2 conjugate transpose.
    pub transpose: i32,
    pub dtype: ElementType,
}

/// `GemmConfigProto`: `output = alpha * op(lhs) @ op(rhs) + beta * c`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GemmConfig {
    pub lhs_layout: MatrixLayout,
    pub rhs_layout: MatrixLayout,
    pub c_layout: MatrixLayout,
    pub output_layout: MatrixLayout,
    pub alpha_real: f64,
    pub alpha_imag: f64,
    pub beta: f64,
    pub compute_precision: i64,
    /// `xla.PrecisionConfig.Algorithm` number.
    pub precision_algorithm: i32,
    /// Selected BLAS algorithm, if autotuning fixed one.
    pub algorithm: Option<i64>,
    pub grad_x: bool,
    pub grad_y: bool,
    /// `xla.BlasComputationTypeProto` number (0 = unset: derive from dtypes).
    pub compute_type: i32,
    pub scale_mode: i32,
}

/// Names of `xla.BlasLtEpilogueProto` values, indexed by number.
pub const BLAS_LT_EPILOGUE_NAMES: &[&str] = &[
    "EPILOGUE_DEFAULT",
    "EPILOGUE_RELU",
    "EPILOGUE_BIAS",
    "EPILOGUE_BIAS_THEN_RELU",
    "EPILOGUE_GELU",
    "EPILOGUE_SILU",
    "EPILOGUE_SILU_WITH_AUX",
    "EPILOGUE_GELU_WITH_AUX",
    "EPILOGUE_BIAS_THEN_GELU",
    "EPILOGUE_BIAS_THEN_SILU",
    "EPILOGUE_BIAS_THEN_GELU_WITH_AUX",
    "EPILOGUE_BIAS_THEN_SILU_WITH_AUX",
];

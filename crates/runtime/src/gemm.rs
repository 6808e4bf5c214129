//! The plan's `GemmConfig` (proto numbers) → the device layer's GEMM config.

use xla_vmm_device::blas::{ComputationType, GemmConfig, MatrixLayout, Order, Transpose};

use crate::error::{Result, RuntimeError};
use xla_vmm::{ShapedSlice, Slice};
use xla_vmm_device::blas::{Epilogue, GemmEngine, GemmPlanId, MatmulArgs};
use xla_vmm_device::{Backend, DevicePtr};

use crate::slots::SlotTable;

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

/// A loaded matmul: the engine's plan and the buffers in their roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmOp {
    pub name: String,
    pub plan: GemmPlanId,
    pub a: Slice,
    pub b: Slice,
    pub c: Slice,
    pub d: Slice,
    pub bias: Option<Slice>,
    pub aux: Option<Slice>,
    /// a, b, c, d scales and d's amax.
    pub scales: [Option<Slice>; 5],
    pub workspace: Option<Slice>,
}

fn opt(slots: &SlotTable, s: &Option<Slice>) -> Result<DevicePtr> {
    match s {
        Some(s) => slots.resolve(s),
        None => Ok(DevicePtr::NULL),
    }
}

/// Load a cuBLASLt (hipBLASLt) matmul: its descriptors and the algorithm XLA
/// chose, prepared on the engine.
pub(crate) fn build<B: Backend>(
    engine: Option<&dyn GemmEngine<B>>,
    name: &str,
    m: &xla_vmm::CublasLtMatmulThunk,
) -> Result<GemmOp> {
    let engine =
        engine.ok_or_else(|| RuntimeError::unsupported("no BLAS-Lt engine on this backend"))?;
    if m.grouped {
        return Err(RuntimeError::unsupported("grouped matmul"));
    }
    let cfg = m
        .gemm_config
        .as_ref()
        .ok_or_else(|| RuntimeError::invalid("cublas_lt_matmul without gemm_config"))?;
    let idx = usize::try_from(m.algorithm_idx)
        .map_err(|_| RuntimeError::invalid(format!("algorithm_idx {}", m.algorithm_idx)))?;
    // XLA asks the heuristic for one algorithm when the index is
    // 0, else for GemmConfig::kNumAlgorithms = 128.
    let max_algorithms = if idx == 0 { 1 } else { 128 };
    let max_ws = u64::try_from(m.autotune_workspace_size).unwrap_or(0);
    let plan_id = engine.prepare(
        &config(cfg)?,
        Epilogue::from_proto(m.epilogue)?,
        idx,
        max_algorithms,
        max_ws,
    )?;
    let s = |x: &Option<ShapedSlice>| x.as_ref().map(|x| x.slice);
    Ok(GemmOp {
        name: name.to_string(),
        plan: plan_id,
        a: m.a.slice,
        b: m.b.slice,
        c: m.c.slice,
        d: m.d.slice,
        bias: s(&m.bias),
        aux: s(&m.aux),
        scales: [
            s(&m.a_scale),
            s(&m.b_scale),
            s(&m.c_scale),
            s(&m.d_scale),
            s(&m.d_amax),
        ],
        workspace: s(&m.workspace),
    })
}

/// Enqueue a loaded matmul on `stream`.
pub(crate) fn run<B: Backend>(
    engine: Option<&dyn GemmEngine<B>>,
    op: &GemmOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let GemmOp {
        name,
        plan,
        a,
        b,
        c,
        d,
        bias,
        aux,
        scales,
        workspace,
    } = op;
    let engine = engine.ok_or_else(|| RuntimeError::unsupported("no BLAS-Lt engine"))?;
    let args = MatmulArgs {
        a: slots.resolve(a)?,
        b: slots.resolve(b)?,
        c: slots.resolve(c)?,
        d: slots.resolve(d)?,
        bias: opt(slots, bias)?,
        aux: opt(slots, aux)?,
        a_scale: opt(slots, &scales[0])?,
        b_scale: opt(slots, &scales[1])?,
        c_scale: opt(slots, &scales[2])?,
        d_scale: opt(slots, &scales[3])?,
        d_amax: opt(slots, &scales[4])?,
        workspace: opt(slots, workspace)?,
        workspace_bytes: workspace.map(|w| w.size).unwrap_or(0),
    };
    engine
        .run(*plan, &args, stream)
        .map_err(|e| RuntimeError::invalid(format!("matmul '{name}': {e}")))?;
    Ok(())
}

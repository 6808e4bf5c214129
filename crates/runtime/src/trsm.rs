//! Triangular solve thunks on the BLAS (cuBLAS / rocBLAS trsm), as XLA's
//! `RunTriangularSolve` runs them: load (the solve as the BLAS takes it,
//! prepared on the engine) and run.

use xla_vmm::{Slice, SolveTranspose};
use xla_vmm_device::blas::{GemmEngine, Transpose, TrsmArgs, TrsmSpec};
use xla_vmm_device::Backend;

use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;

/// A loaded triangular solve: XLA's `RunTriangularSolve`. With a batch, the
/// arrays of matrix pointers the batched solve reads are written into
/// `temp` (a's first, b's after them) on the stream before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrsmOp {
    pub name: String,
    pub spec: TrsmSpec,
    pub a: Slice,
    pub b: Slice,
    pub temp: Slice,
    /// Bytes between consecutive matrices of a and of b.
    pub a_stride: u64,
    pub b_stride: u64,
}

/// The solve as the BLAS takes it: 32-bit sizes, a type it solves in.
pub(crate) fn trsm_op(name: &str, t: &xla_vmm::TriangularSolveThunk) -> Result<TrsmOp> {
    let dtype = t.element_type.0;
    if !TrsmSpec::TYPES.contains(&dtype) {
        return Err(RuntimeError::unsupported(format!(
            "triangular solve in {} (the BLAS solves F32, F64, C64 and C128)",
            t.element_type.name().unwrap_or("an unknown element type")
        )));
    }
    let int = |v: i64, what: &str| {
        i32::try_from(v).map_err(|_| {
            RuntimeError::unsupported(format!(
                "triangular solve {what} {v} (the BLAS takes 32-bit sizes)"
            ))
        })
    };
    let bytes = u64::from(t.element_type.bit_width().unwrap_or(0) / 8);
    let overflow = || RuntimeError::invalid("triangular solve batch stride overflows");
    Ok(TrsmOp {
        name: name.to_string(),
        spec: TrsmSpec {
            left_side: t.left_side,
            lower: t.lower,
            unit_diagonal: t.unit_diagonal,
            transpose: match t.transpose_a {
                SolveTranspose::NoTranspose => Transpose::NoTranspose,
                SolveTranspose::Transpose => Transpose::Transpose,
                SolveTranspose::Adjoint => Transpose::ConjugateTranspose,
            },
            dtype,
            m: int(t.m, "m")?,
            n: int(t.n, "n")?,
            batch: int(t.batch, "batch")?,
        },
        a: t.a.slice,
        b: t.b.slice,
        temp: t.temp.slice,
        a_stride: t.a_batch_stride(bytes).ok_or_else(overflow)?,
        b_stride: t.b_batch_stride(bytes).ok_or_else(overflow)?,
    })
}

/// Load a solve: its spec, accepted by the engine.
pub(crate) fn build<B: Backend>(
    engine: Option<&dyn GemmEngine<B>>,
    name: &str,
    t: &xla_vmm::TriangularSolveThunk,
) -> Result<TrsmOp> {
    let engine = engine.ok_or_else(|| {
        RuntimeError::unsupported("triangular solve: no BLAS engine on this backend")
    })?;
    let op = trsm_op(name, t)?;
    engine.prepare_trsm(&op.spec)?;
    Ok(op)
}

/// XLA's `RunTriangularSolve`: one matrix is solved directly; a batch goes
/// through the batched solve, whose two pointer arrays (`a + i * a_stride`,
/// `b + i * b_stride`) are written into `temp` first, on the same stream, as
/// 32-bit memsets (two per pointer: capturable on every backend; XLA
/// launches a small kernel for the same).
pub(crate) fn run<B: Backend>(
    backend: &B,
    engine: Option<&dyn GemmEngine<B>>,
    t: &TrsmOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let engine =
        engine.ok_or_else(|| RuntimeError::unsupported("triangular solve: no BLAS engine"))?;
    let (a, b) = (slots.resolve(&t.a)?, slots.resolve(&t.b)?);
    let args = if t.spec.batch > 1 && !t.spec.is_empty() {
        let count = t.spec.batch as u64;
        let a_ptrs = slots.resolve(&t.temp)?;
        let b_ptrs = a_ptrs.offset(8 * count);
        for (table, base, stride) in [(a_ptrs, a, t.a_stride), (b_ptrs, b, t.b_stride)] {
            for i in 0..count {
                let p = base.0 + i * stride;
                let at = table.offset(8 * i);
                backend.memset_d32(at, p as u32, 1, stream)?;
                backend.memset_d32(at.offset(4), (p >> 32) as u32, 1, stream)?;
            }
        }
        TrsmArgs::Batched { a_ptrs, b_ptrs }
    } else {
        TrsmArgs::Single { a, b }
    };
    engine
        .trsm(&t.spec, args, stream)
        .map_err(|e| RuntimeError::invalid(format!("triangular solve '{}': {e}", t.name)))
}

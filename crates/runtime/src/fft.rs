//! An FFT thunk → the plan XLA's `RunFft` makes for it
//! (`xla/backends/gpu/runtime/fft_thunk.cc`): the transform over the last
//! `fft_length.len()` dimensions, batched over the others, each operand's
//! own trailing dimensions as its embed and their product as its distance,
//! double precision when the input is F64 or C128; inverse transforms scaled
//! by 1 / (the output's transform size) after; a complex-to-real transform
//! reads a copy of its input (XLA copies it into scratch first: cuFFT may
//! write the input of a C2R transform). What XLA's shape inference would
//! never emit (element types that do not match the kind, lengths that do
//! not match the shapes, a layout other than the default) is refused with
//! the reason, never guessed at.

use xla_vmm::{FftThunk, FftType, Shape, Slice};
use xla_vmm_device::blas::{xla_type, GemmEngine};
use xla_vmm_device::fft::{FftArgs, FftKind, FftPlanId, FftSpec};
use xla_vmm_device::{Backend, DevicePtr};

use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;

/// An FFT as loaded: the plan's spec and the buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FftRun {
    pub name: String,
    pub spec: FftSpec,
    pub input: Slice,
    pub output: Slice,
    /// Run on a copy of the input (complex to real).
    pub copy_input: bool,
}

/// A loaded FFT: its run, the engine's plan, and where its scratch (the
/// plan's work area, then the input's copy) lies in the program's scratch
/// memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FftOp {
    pub run: FftRun,
    pub plan: FftPlanId,
    /// Offset of the work area in the program's scratch memory.
    pub scratch_offset: u64,
    /// Bytes of the work area (the input's copy follows it).
    pub work_bytes: u64,
}

/// Scratch regions start on this boundary.
pub const SCRATCH_ALIGN: u64 = 256;

impl FftOp {
    /// Scratch bytes this transform takes: the work area, then the input's
    /// copy when it has one, each rounded up to [`SCRATCH_ALIGN`].
    pub fn scratch_bytes(&self) -> u64 {
        let copy = if self.run.copy_input {
            self.run.input.size.next_multiple_of(SCRATCH_ALIGN)
        } else {
            0
        };
        self.work_bytes.next_multiple_of(SCRATCH_ALIGN) + copy
    }
}

fn unsupported(name: &str, what: String) -> RuntimeError {
    RuntimeError::unsupported(format!("fft {name}: {what}"))
}

/// Is `shape` an array in XLA's default (row-major) layout?
fn default_layout(shape: &Shape) -> bool {
    match &shape.minor_to_major {
        None => true,
        Some(m) => m.iter().rev().copied().eq(0..shape.dimensions.len() as i64),
    }
}

/// The plan XLA makes for thunk `t` (named `name` in errors).
pub fn load(name: &str, t: &FftThunk) -> Result<FftRun> {
    use xla_type::*;
    let err = |what: String| unsupported(name, what);
    let rank = t.fft_length.len();
    if !(1..=3).contains(&rank) {
        return Err(err(format!("{rank} transform lengths (1 to 3)")));
    }
    let (ins, outs) = (&t.input_shape, &t.output_shape);
    for (s, what) in [(ins, "input"), (outs, "output")] {
        if s.is_tuple() || s.dimensions.len() < rank || s.dimensions.iter().any(|&d| d < 0) {
            return Err(err(format!(
                "{what} of dimensions {:?} for a rank-{rank} transform",
                s.dimensions
            )));
        }
        if !default_layout(s) {
            return Err(err(format!(
                "{what} layout {:?} (XLA's FFT takes the default layout)",
                s.minor_to_major.as_deref().unwrap_or_default()
            )));
        }
    }
    if ins.dimensions.len() != outs.dimensions.len() {
        return Err(err(format!(
            "input dimensions {:?}, output {:?}",
            ins.dimensions, outs.dimensions
        )));
    }
    let (in_t, out_t) = (ins.element_type.0, outs.element_type.0);
    let double = in_t == F64 || in_t == C128;
    let (real, complex) = if double { (F64, C128) } else { (F32, C64) };
    let (kind, want) = match t.fft_type {
        FftType::Fft => (FftKind::Forward, (complex, complex)),
        FftType::Ifft => (FftKind::Inverse, (complex, complex)),
        FftType::Rfft => (FftKind::RealToComplex, (real, complex)),
        FftType::Irfft => (FftKind::ComplexToReal, (complex, real)),
    };
    if (in_t, out_t) != want {
        return Err(err(format!(
            "{} from {} to {}",
            t.fft_type.name(),
            ins.element_type.name().unwrap_or("an unknown type"),
            outs.element_type.name().unwrap_or("an unknown type")
        )));
    }
    let lead = ins.dimensions.len() - rank;
    if ins.dimensions[..lead] != outs.dimensions[..lead] {
        return Err(err(format!(
            "batch dimensions {:?} in, {:?} out",
            &ins.dimensions[..lead],
            &outs.dimensions[..lead]
        )));
    }
    let n = t.fft_length.clone();
    let (inembed, onembed) = (
        ins.dimensions[lead..].to_vec(),
        outs.dimensions[lead..].to_vec(),
    );
    // The complex side of a real transform keeps n/2 + 1 terms of the last
    // dimension; every other dimension is the length itself.
    let half = |v: &[i64]| {
        let mut v = v.to_vec();
        if let Some(last) = v.last_mut() {
            *last = *last / 2 + 1;
        }
        v
    };
    let (want_in, want_out) = match kind {
        FftKind::Forward | FftKind::Inverse => (n.clone(), n.clone()),
        FftKind::RealToComplex => (n.clone(), half(&n)),
        FftKind::ComplexToReal => (half(&n), n.clone()),
    };
    if inembed != want_in || onembed != want_out {
        return Err(err(format!(
            "lengths {n:?} with input {:?} and output {:?} (XLA's shapes would be {want_in:?} \
             and {want_out:?})",
            ins.dimensions, outs.dimensions
        )));
    }
    let product = |v: &[i64]| v.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
    let too_big = || err(format!("input {:?} overflows", ins.dimensions));
    let batch = product(&ins.dimensions[..lead]).ok_or_else(too_big)?;
    if batch > i64::from(i32::MAX) {
        return Err(err(format!(
            "batch of {batch} transforms (XLA's limit is 2^31 - 1)"
        )));
    }
    let (idist, odist) = (
        product(&inembed).ok_or_else(too_big)?,
        product(&onembed).ok_or_else(too_big)?,
    );
    for (s, slice, what) in [(ins, t.input, "input"), (outs, t.output, "output")] {
        let bytes = s.byte_size().ok_or_else(too_big)?;
        if slice.size < bytes {
            return Err(RuntimeError::invalid(format!(
                "fft {name}: {what} slice of {} bytes for a {bytes}-byte {what}",
                slice.size
            )));
        }
    }
    Ok(FftRun {
        name: name.to_string(),
        spec: FftSpec {
            kind,
            double,
            n,
            inembed,
            idist,
            onembed,
            odist,
            batch,
        },
        input: t.input,
        output: t.output,
        copy_input: kind == FftKind::ComplexToReal,
    })
}

/// Load a transform: XLA's plan, made by the engine, and its scratch taken
/// at `scratch_bytes` (advanced past it). Nothing to transform: no op.
pub(crate) fn build<B: Backend>(
    engine: Option<&dyn GemmEngine<B>>,
    name: &str,
    f: &FftThunk,
    scratch_bytes: &mut u64,
) -> Result<Option<FftOp>> {
    let run = load(name, f)?;
    if is_empty(&run) {
        return Ok(None);
    }
    let engine =
        engine.ok_or_else(|| RuntimeError::unsupported("fft: no FFT engine on this backend"))?;
    let plan = engine.prepare_fft(&run.spec)?;
    let work_bytes = engine
        .fft_workspace(plan)
        .inspect_err(|_| engine.release_fft(plan))?;
    let op = FftOp {
        run,
        plan,
        scratch_offset: *scratch_bytes,
        work_bytes,
    };
    *scratch_bytes += op.scratch_bytes();
    Ok(Some(op))
}

/// Is there nothing to transform (a zero-sized dimension)?
pub fn is_empty(run: &FftRun) -> bool {
    run.spec.batch == 0 || run.spec.idist == 0 || run.spec.odist == 0
}

/// Enqueue `op` on `stream`: the input's copy when it has one, then the
/// engine's transform (and scaling) with its scratch.
pub(crate) fn run<B: Backend>(
    backend: &B,
    engine: Option<&dyn GemmEngine<B>>,
    scratch: DevicePtr,
    op: &FftOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let engine = engine.ok_or_else(|| RuntimeError::unsupported("fft: no FFT engine"))?;
    let work = scratch.offset(op.scratch_offset);
    let mut input = slots.resolve(&op.run.input)?;
    if op.run.copy_input {
        let copy = work.offset(op.work_bytes.next_multiple_of(SCRATCH_ALIGN));
        backend.copy_d2d(copy, input, op.run.input.size, stream)?;
        input = copy;
    }
    let args = FftArgs {
        input,
        output: slots.resolve(&op.run.output)?,
        workspace: work,
    };
    engine
        .run_fft(op.plan, &args, stream)
        .map_err(|e| RuntimeError::invalid(format!("fft '{}': {e}", op.run.name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm::ElementType;

    fn shape(t: i32, dims: &[i64]) -> Shape {
        Shape {
            element_type: ElementType(t),
            dimensions: dims.to_vec(),
            minor_to_major: Some((0..dims.len() as i64).rev().collect()),
            ..Default::default()
        }
    }

    fn thunk(fft_type: FftType, n: &[i64], ins: Shape, outs: Shape) -> FftThunk {
        let slice = |s: &Shape| Slice {
            allocation: 0,
            offset: 0,
            size: s.byte_size().unwrap(),
        };
        FftThunk {
            fft_type,
            fft_length: n.to_vec(),
            input: slice(&ins),
            output: slice(&outs),
            input_shape: ins,
            output_shape: outs,
        }
    }

    #[test]
    fn a_batched_2d_real_transform_gets_xlas_plan() {
        use xla_type::*;
        let t = thunk(
            FftType::Rfft,
            &[6, 8],
            shape(F32, &[2, 3, 6, 8]),
            shape(C64, &[2, 3, 6, 5]),
        );
        let r = load("rfft", &t).unwrap();
        assert_eq!(
            r.spec,
            FftSpec {
                kind: FftKind::RealToComplex,
                double: false,
                n: vec![6, 8],
                inembed: vec![6, 8],
                idist: 48,
                onembed: vec![6, 5],
                odist: 30,
                batch: 6,
            }
        );
        assert!(!r.copy_input);
        let t = thunk(
            FftType::Irfft,
            &[8],
            shape(C128, &[4, 5]),
            shape(F64, &[4, 8]),
        );
        let r = load("irfft", &t).unwrap();
        assert!(r.spec.double && r.copy_input);
        assert_eq!((r.spec.idist, r.spec.odist, r.spec.batch), (5, 8, 4));
        // XLA scales by the output's transform size.
        assert_eq!(
            f64::from_le_bytes(r.spec.scale_alpha().unwrap().try_into().unwrap()),
            0.125
        );
    }

    #[test]
    fn what_xla_would_not_emit_is_refused_with_the_reason() {
        use xla_type::*;
        let e = |t: FftThunk| load("f", &t).unwrap_err().to_string();
        let m = e(thunk(
            FftType::Fft,
            &[8],
            shape(F32, &[8]),
            shape(C64, &[8]),
        ));
        assert!(m.contains("FFT from F32 to C64"), "{m}");
        let m = e(thunk(
            FftType::Fft,
            &[4],
            shape(C64, &[8]),
            shape(C64, &[8]),
        ));
        assert!(m.contains("lengths [4]"), "{m}");
        let m = e(thunk(
            FftType::Fft,
            &[1, 2, 3, 4],
            shape(C64, &[1, 2, 3, 4]),
            shape(C64, &[1, 2, 3, 4]),
        ));
        assert!(m.contains("4 transform lengths"), "{m}");
        let mut col = shape(C64, &[2, 8]);
        col.minor_to_major = Some(vec![0, 1]);
        let m = e(thunk(FftType::Fft, &[8], col, shape(C64, &[2, 8])));
        assert!(m.contains("layout [0, 1]"), "{m}");
        let mut t = thunk(FftType::Fft, &[8], shape(C64, &[8]), shape(C64, &[8]));
        t.output.size = 8;
        let m = e(t);
        assert!(m.contains("output slice of 8 bytes"), "{m}");
        let m = e(thunk(
            FftType::Fft,
            &[8],
            shape(C64, &[2, 8]),
            shape(C64, &[3, 8]),
        ));
        assert!(m.contains("batch dimensions"), "{m}");
    }

    #[test]
    fn scratch_holds_the_work_area_then_the_inputs_copy() {
        use xla_type::*;
        let run = load(
            "irfft",
            &thunk(FftType::Irfft, &[8], shape(C64, &[5]), shape(F32, &[8])),
        )
        .unwrap();
        let op = FftOp {
            run,
            plan: FftPlanId(0),
            scratch_offset: 0,
            work_bytes: 100,
        };
        assert_eq!(op.scratch_bytes(), 256 + 256);
        let fwd = FftOp {
            run: FftRun {
                copy_input: false,
                ..op.run.clone()
            },
            work_bytes: 0,
            ..op
        };
        assert_eq!(fwd.scratch_bytes(), 0);
    }
}

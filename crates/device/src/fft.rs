//! Backend-agnostic description of an FFT as XLA's FFT thunk hands it to
//! cuFFT / hipFFT (`xla/backends/gpu/runtime/fft_thunk.cc`, `RunFft`): one
//! batched plan (`cufftMakePlanMany64`) over the last `n.len()` dimensions,
//! unit strides, the input's and output's own dimensions as their embeds,
//! out of place; an inverse transform's result scaled by 1 / `odist` with
//! the BLAS's `?scal` afterwards. The engine builds the plan from this and
//! runs it (`fft_lib`); this file holds only plain data.

use crate::backend::DevicePtr;
use crate::xla_type;

/// Which transform (cuFFT's `cufftType` with its direction).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FftKind {
    /// Complex to complex, forward (`C2C` / `Z2Z`, direction -1).
    Forward,
    /// Complex to complex, inverse (direction +1), then scaled.
    Inverse,
    /// Real to complex (`R2C` / `D2Z`).
    RealToComplex,
    /// Complex to real (`C2R` / `Z2D`), then scaled.
    ComplexToReal,
}

/// One plan's parameters, exactly as XLA passes them to the library.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FftSpec {
    pub kind: FftKind,
    /// Double precision (`Z2Z`, `D2Z`, `Z2D`).
    pub double: bool,
    /// The transform's lengths, outermost first (1 to 3).
    pub n: Vec<i64>,
    /// The input's last `n.len()` dimensions.
    pub inembed: Vec<i64>,
    /// Elements between consecutive input transforms (product of `inembed`).
    pub idist: i64,
    /// The output's last `n.len()` dimensions.
    pub onembed: Vec<i64>,
    /// Elements between consecutive output transforms (product of `onembed`).
    pub odist: i64,
    /// Transforms in the batch (product of the leading dimensions).
    pub batch: i64,
}

impl FftSpec {
    /// Does the library's result get scaled (XLA's inverse transforms)?
    pub fn is_inverse(&self) -> bool {
        matches!(self.kind, FftKind::Inverse | FftKind::ComplexToReal)
    }

    /// XLA `PrimitiveType` of the input's and the output's elements.
    pub fn dtypes(&self) -> (i32, i32) {
        use xla_type::*;
        let (real, complex) = if self.double { (F64, C128) } else { (F32, C64) };
        match self.kind {
            FftKind::Forward | FftKind::Inverse => (complex, complex),
            FftKind::RealToComplex => (real, complex),
            FftKind::ComplexToReal => (complex, real),
        }
    }

    /// Elements of the whole output (`batch * odist`), what the scaling
    /// runs over.
    pub fn output_elements(&self) -> i64 {
        self.batch.saturating_mul(self.odist)
    }

    /// The scale XLA applies after an inverse transform, in the output's
    /// element type as the BLAS takes alpha (`1.0f / float(odist)` or
    /// `1.0 / double(odist)`; complex: imaginary part 0): `None` for a
    /// forward transform.
    pub fn scale_alpha(&self) -> Option<Vec<u8>> {
        if !self.is_inverse() {
            return None;
        }
        let complex = self.kind == FftKind::Inverse;
        let mut v = if self.double {
            (1.0f64 / self.odist as f64).to_le_bytes().to_vec()
        } else {
            (1.0f32 / self.odist as f32).to_le_bytes().to_vec()
        };
        if complex {
            v.resize(v.len() * 2, 0);
        }
        Some(v)
    }
}

/// A prepared FFT plan: an index into the engine's table.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct FftPlanId(pub usize);

/// The device operands of one transform.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FftArgs {
    pub input: DevicePtr,
    pub output: DevicePtr,
    /// At least [`crate::blas::GemmEngine::fft_workspace`] bytes, the
    /// plan's work area for this run.
    pub workspace: DevicePtr,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: FftKind, double: bool) -> FftSpec {
        FftSpec {
            kind,
            double,
            n: vec![8],
            inembed: vec![8],
            idist: 8,
            onembed: vec![8],
            odist: 8,
            batch: 3,
        }
    }

    #[test]
    fn inverse_transforms_are_scaled_by_one_over_the_output_distance() {
        assert_eq!(spec(FftKind::Forward, false).scale_alpha(), None);
        assert_eq!(spec(FftKind::RealToComplex, true).scale_alpha(), None);
        let a = spec(FftKind::Inverse, false).scale_alpha().unwrap();
        assert_eq!(a.len(), 8);
        assert_eq!(f32::from_le_bytes(a[..4].try_into().unwrap()), 0.125);
        assert_eq!(f32::from_le_bytes(a[4..].try_into().unwrap()), 0.0);
        let a = spec(FftKind::ComplexToReal, true).scale_alpha().unwrap();
        assert_eq!(f64::from_le_bytes(a.try_into().unwrap()), 0.125);
        assert_eq!(spec(FftKind::Inverse, false).output_elements(), 24);
    }

    #[test]
    fn element_types_follow_the_kind_and_precision() {
        use xla_type::*;
        assert_eq!(spec(FftKind::Forward, false).dtypes(), (C64, C64));
        assert_eq!(spec(FftKind::RealToComplex, false).dtypes(), (F32, C64));
        assert_eq!(spec(FftKind::ComplexToReal, true).dtypes(), (C128, F64));
    }
}

//! `FftThunkProto`: XLA's FFT thunk (xla/backends/gpu/runtime/fft_thunk.cc),
//! a cuFFT / hipFFT transform over the last `fft_length.len()` dimensions of
//! its input, batched over the others.

use serde::Serialize;

use super::{Shape, Slice};

/// `xla.FftType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FftType {
    /// Complex to complex, forward.
    Fft,
    /// Complex to complex, inverse (scaled by 1/n, as XLA scales it).
    Ifft,
    /// Real to complex, forward (the last dimension keeps n/2 + 1 terms).
    Rfft,
    /// Complex to real, inverse (scaled by 1/n).
    Irfft,
}

impl FftType {
    /// From the proto's number (`FFT = 0, IFFT = 1, RFFT = 2, IRFFT = 3`).
    pub fn from_proto(v: i32) -> Option<Self> {
        Some(match v {
            0 => FftType::Fft,
            1 => FftType::Ifft,
            2 => FftType::Rfft,
            3 => FftType::Irfft,
            _ => return None,
        })
    }

    /// XLA's upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            FftType::Fft => "FFT",
            FftType::Ifft => "IFFT",
            FftType::Rfft => "RFFT",
            FftType::Irfft => "IRFFT",
        }
    }

    /// Does XLA scale the result by 1 / (the transform's output elements)?
    pub fn is_inverse(self) -> bool {
        matches!(self, FftType::Ifft | FftType::Irfft)
    }
}

/// `FftThunkProto`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FftThunk {
    pub fft_type: FftType,
    /// The transform's lengths, outermost first (1 to 3 of them).
    pub fft_length: Vec<i64>,
    pub input: Slice,
    pub output: Slice,
    pub input_shape: Shape,
    pub output_shape: Shape,
}

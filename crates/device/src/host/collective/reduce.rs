//! Element-wise reductions of the host collectives, with NCCL's semantics
//! per element type: integers wrap, `f32`/`f64` use native arithmetic,
//! `min`/`max` of floats ignore a NaN operand (like CUDA's `fminf`), and the
//! narrow floats (F16, BF16, F8E4M3, F8E5M2) are widened exactly to `f64`,
//! combined, and rounded once back to nearest-even (so a two-operand sum or
//! product is correctly rounded, as native `bf16`/`f16` arithmetic on the GPU
//! is). F8E4M3 is the `fn` variant (no infinities; overflow gives NaN).

use crate::collective::{CommType, ReduceOp};

/// A narrow binary float format.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Fmt {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// IEEE-like: the all-ones exponent encodes inf/NaN. `false` = the
    /// "fn" variant, where only all-ones exponent and mantissa is NaN.
    ieee: bool,
}

pub(crate) const F16: Fmt = Fmt {
    exp_bits: 5,
    man_bits: 10,
    bias: 15,
    ieee: true,
};
pub(crate) const BF16: Fmt = Fmt {
    exp_bits: 8,
    man_bits: 7,
    bias: 127,
    ieee: true,
};
pub(crate) const F8E4M3: Fmt = Fmt {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    ieee: false,
};
pub(crate) const F8E5M2: Fmt = Fmt {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    ieee: true,
};

impl Fmt {
    fn max_exp(self) -> u32 {
        (1 << self.exp_bits) - 1
    }

    fn man_mask(self) -> u32 {
        (1 << self.man_bits) - 1
    }

    /// The exact value of `bits`.
    pub(crate) fn decode(self, bits: u32) -> f64 {
        let m = self.man_bits;
        let sign = (bits >> (self.exp_bits + m)) & 1;
        let exp = (bits >> m) & self.max_exp();
        let man = bits & self.man_mask();
        let mag = if self.ieee && exp == self.max_exp() {
            if man == 0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        } else if !self.ieee && exp == self.max_exp() && man == self.man_mask() {
            f64::NAN
        } else if exp == 0 {
            man as f64 * 2f64.powi(1 - self.bias - m as i32)
        } else {
            (1.0 + man as f64 / (1u32 << m) as f64) * 2f64.powi(exp as i32 - self.bias)
        };
        if sign == 1 {
            -mag
        } else {
            mag
        }
    }

    /// `x` rounded to nearest-even in this format (overflow: infinity, or
    /// NaN for the "fn" variant).
    pub(crate) fn encode(self, x: f64) -> u32 {
        let m = self.man_bits;
        let sign = if x.is_sign_negative() {
            1 << (self.exp_bits + m)
        } else {
            0
        };
        let nan = if self.ieee {
            (self.max_exp() << m) | (1 << (m - 1))
        } else {
            (self.max_exp() << m) | self.man_mask()
        };
        if x.is_nan() {
            return sign | nan;
        }
        let a = x.abs();
        let inf = if self.ieee { self.max_exp() << m } else { nan };
        if a.is_infinite() {
            return sign | inf;
        }
        if a == 0.0 {
            return sign;
        }
        let emin = 1 - self.bias;
        let biased = ((a.to_bits() >> 52) & 0x7ff) as i32;
        // f64 subnormals are far below every format's smallest subnormal.
        let e = if biased == 0 { -1100 } else { biased - 1023 };
        let e = e.max(emin);
        let quantum = e - m as i32;
        let r = (a * 2f64.powi(-quantum)).round_ties_even();
        if r == 0.0 {
            return sign;
        }
        let r = r as u64;
        let (exp_field, man) = if r >= 1 << m {
            let mut exp_field = e + self.bias;
            let mut man = r - (1 << m);
            if r == 1 << (m + 1) {
                exp_field += 1;
                man = 0;
            }
            (exp_field, man as u32)
        } else {
            (0, r as u32)
        };
        let max = self.max_exp() as i32;
        let overflow = if self.ieee {
            exp_field >= max
        } else {
            exp_field > max || (exp_field == max && man == self.man_mask())
        };
        if overflow {
            return sign | inf;
        }
        sign | ((exp_field as u32) << m) | man
    }
}

fn combine_f64(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    }
}

fn arr<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(s);
    a
}

macro_rules! ints {
    ($t:ty, $acc:expr, $x:expr, $op:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut(N).zip($x.chunks_exact(N)) {
            let p = <$t>::from_le_bytes(arr(a));
            let q = <$t>::from_le_bytes(arr(b));
            let r = match $op {
                ReduceOp::Sum => p.wrapping_add(q),
                ReduceOp::Prod => p.wrapping_mul(q),
                ReduceOp::Min => p.min(q),
                ReduceOp::Max => p.max(q),
            };
            a.copy_from_slice(&r.to_le_bytes());
        }
    }};
}

fn narrow(fmt: Fmt, width: usize, op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    for (a, b) in acc.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
        let (p, q) = if width == 1 {
            (a[0] as u32, b[0] as u32)
        } else {
            (
                u16::from_le_bytes(arr(a)) as u32,
                u16::from_le_bytes(arr(b)) as u32,
            )
        };
        let r = fmt.encode(combine_f64(op, fmt.decode(p), fmt.decode(q)));
        if width == 1 {
            a[0] = r as u8;
        } else {
            a.copy_from_slice(&(r as u16).to_le_bytes());
        }
    }
}

/// `acc[i] = op(acc[i], x[i])` over elements of `ty` (equal lengths, a
/// multiple of the element size).
pub(crate) fn reduce_into(ty: CommType, op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    debug_assert_eq!(acc.len(), x.len());
    match ty {
        CommType::I8 => ints!(i8, acc, x, op),
        CommType::U8 => ints!(u8, acc, x, op),
        CommType::I32 => ints!(i32, acc, x, op),
        CommType::U32 => ints!(u32, acc, x, op),
        CommType::I64 => ints!(i64, acc, x, op),
        CommType::U64 => ints!(u64, acc, x, op),
        CommType::F32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                let p = f32::from_le_bytes(arr(a));
                let q = f32::from_le_bytes(arr(b));
                let r = match op {
                    ReduceOp::Sum => p + q,
                    ReduceOp::Prod => p * q,
                    ReduceOp::Min => p.min(q),
                    ReduceOp::Max => p.max(q),
                };
                a.copy_from_slice(&r.to_le_bytes());
            }
        }
        CommType::F64 => {
            for (a, b) in acc.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
                let r = combine_f64(op, f64::from_le_bytes(arr(a)), f64::from_le_bytes(arr(b)));
                a.copy_from_slice(&r.to_le_bytes());
            }
        }
        CommType::F16 => narrow(F16, 2, op, acc, x),
        CommType::Bf16 => narrow(BF16, 2, op, acc, x),
        CommType::F8E4M3 => narrow(F8E4M3, 1, op, acc, x),
        CommType::F8E5M2 => narrow(F8E5M2, 1, op, acc, x),
    }
}

/// Reduce the inputs of ranks 0, 1, ... in that order (one rounding per
/// step, like a ring).
pub(crate) fn reduce_all(ty: CommType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = inputs.first().cloned().unwrap_or_default();
    for x in inputs.iter().skip(1) {
        reduce_into(ty, op, &mut acc, x);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_all(fmt: Fmt, n: u32) {
        for bits in 0..n {
            let v = fmt.decode(bits);
            let back = fmt.encode(v);
            if v.is_nan() {
                assert!(fmt.decode(back).is_nan(), "{fmt:?} {bits:#x}");
            } else {
                assert_eq!(back, bits, "{fmt:?} {bits:#x} = {v}");
            }
        }
    }

    #[test]
    fn every_narrow_encoding_roundtrips() {
        roundtrip_all(F16, 1 << 16);
        roundtrip_all(BF16, 1 << 16);
        roundtrip_all(F8E4M3, 1 << 8);
        roundtrip_all(F8E5M2, 1 << 8);
    }

    #[test]
    fn narrow_encodings_agree_with_native_f32_layouts() {
        for bits in (0..1u32 << 16).step_by(7) {
            let f = f32::from_bits(bits << 16);
            if !f.is_nan() {
                assert_eq!(BF16.decode(bits), f as f64);
            }
        }
        assert_eq!(F16.encode(1.0), 0x3c00);
        assert_eq!(F16.encode(65504.0), 0x7bff);
        assert_eq!(F16.encode(65520.0), 0x7c00);
        assert_eq!(F8E4M3.encode(448.0), 0x7e);
        assert_eq!(F8E4M3.encode(-448.0), 0xfe);
        assert!(F8E4M3.decode(F8E4M3.encode(480.0)).is_nan());
        assert_eq!(F8E5M2.encode(57344.0), 0x7b);
        assert_eq!(F8E4M3.encode(2f64.powi(-9)), 0x01);
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        // Halfway between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
        assert_eq!(BF16.encode(1.0 + 2f64.powi(-8)), 0x3f80);
        // Halfway between 1 + 2^-7 and 1 + 2^-6: ties up to the even one.
        assert_eq!(BF16.encode(1.0 + 3.0 * 2f64.powi(-8)), 0x3f82);
        // Just above halfway rounds up.
        assert_eq!(BF16.encode(1.0 + 2f64.powi(-8) + 2f64.powi(-20)), 0x3f81);
        // Mantissa carry into the exponent.
        assert_eq!(BF16.encode(2.0 - 2f64.powi(-9)), 0x4000);
        // Half the smallest f16 subnormal ties to zero; a bit more rounds up.
        assert_eq!(F16.encode(2f64.powi(-25)), 0);
        assert_eq!(F16.encode(1.5 * 2f64.powi(-25)), 1);
    }

    #[test]
    fn reductions_per_type() {
        let a: Vec<u8> = [1i32, -5, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [3i32, 2, -9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let max = reduce_all(CommType::I32, ReduceOp::Max, &[a.clone(), b.clone()]);
        let got: Vec<i32> = max
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(arr(c)))
            .collect();
        assert_eq!(got, vec![3, 2, 7]);
        let prod = reduce_all(CommType::I32, ReduceOp::Prod, &[a, b]);
        assert_eq!(i32::from_le_bytes(arr(&prod[4..8])), -10);

        let wrap = reduce_all(CommType::U8, ReduceOp::Sum, &[vec![250], vec![10]]);
        assert_eq!(wrap, vec![4]);

        // bf16: 1 + 2^-8 (as 1 and 2^-8) rounds once to even = 1.0.
        let one = 0x3f80u16.to_le_bytes().to_vec();
        let tiny = (BF16.encode(2f64.powi(-8)) as u16).to_le_bytes().to_vec();
        let s = reduce_all(CommType::Bf16, ReduceOp::Sum, &[one, tiny]);
        assert_eq!(u16::from_le_bytes(arr(&s)), 0x3f80);

        let m = reduce_all(
            CommType::F32,
            ReduceOp::Min,
            &[f32::NAN.to_le_bytes().to_vec(), 2f32.to_le_bytes().to_vec()],
        );
        assert_eq!(f32::from_le_bytes(arr(&m)), 2.0);
    }
}

//! Element types and host layouts: sizes of `PJRT_Buffer_Type`s and the
//! strided ⇄ dense (major-to-minor) conversions `BufferFromHostBuffer` and
//! `ToHostBuffer` need.

use xla_vmm_ffi::pjrt::*;

use crate::cabi::error::{Error, Result};

/// Bits per element of a sub-byte type (`s4`, `u2`, `f4e2m1fn`, ...): on
/// the device XLA packs them, element 0 in the lowest bits of byte 0; on the
/// host (numpy's ml_dtypes) each takes a byte.
pub fn sub_byte_bits(t: PJRT_Buffer_Type) -> Option<u32> {
    match t {
        PJRT_Buffer_Type_S4 | PJRT_Buffer_Type_U4 | PJRT_Buffer_Type_F4E2M1FN => Some(4),
        PJRT_Buffer_Type_S2 | PJRT_Buffer_Type_U2 => Some(2),
        PJRT_Buffer_Type_S1 | PJRT_Buffer_Type_U1 => Some(1),
        _ => None,
    }
}

/// Bytes of one element in a host array: a byte for sub-byte types, 0 for
/// a token.
pub fn host_element_size(t: PJRT_Buffer_Type) -> Result<usize> {
    match sub_byte_bits(t) {
        Some(_) => Ok(1),
        None => element_size(t),
    }
}

/// Device bytes of `n` elements of `t` (packed for sub-byte types).
pub fn device_bytes(t: PJRT_Buffer_Type, n: u64) -> Result<u64> {
    if let Some(bits) = sub_byte_bits(t) {
        return Ok(n.div_ceil(8 / bits as u64));
    }
    n.checked_mul(element_size(t)? as u64)
        .ok_or_else(|| Error::invalid(format!("{n} elements of {} overflow", type_name(t))))
}

/// One host byte per element → the device's packing (`bits` per element).
pub fn pack(unpacked: &[u8], bits: u32) -> Vec<u8> {
    let per = (8 / bits) as usize;
    let mask = (1u16 << bits) as u8 - 1;
    let mut out = vec![0u8; unpacked.len().div_ceil(per)];
    for (i, &v) in unpacked.iter().enumerate() {
        out[i / per] |= (v & mask) << ((i % per) as u32 * bits);
    }
    out
}

/// The device's packing → one host byte per element (`n` elements, each
/// the element's bits, the rest zero, as XLA unpacks them).
pub fn unpack(packed: &[u8], bits: u32, n: usize) -> Vec<u8> {
    let per = (8 / bits) as usize;
    let mask = (1u16 << bits) as u8 - 1;
    (0..n)
        .map(|i| (packed[i / per] >> ((i % per) as u32 * bits)) & mask)
        .collect()
}

/// Bytes per element (0 for a token); sub-byte types have none (see
/// [`sub_byte_bits`]).
pub fn element_size(t: PJRT_Buffer_Type) -> Result<usize> {
    Ok(match t {
        PJRT_Buffer_Type_PRED | PJRT_Buffer_Type_S8 | PJRT_Buffer_Type_U8 => 1,
        PJRT_Buffer_Type_F8E5M2
        | PJRT_Buffer_Type_F8E4M3FN
        | PJRT_Buffer_Type_F8E4M3B11FNUZ
        | PJRT_Buffer_Type_F8E5M2FNUZ
        | PJRT_Buffer_Type_F8E4M3FNUZ
        | PJRT_Buffer_Type_F8E4M3
        | PJRT_Buffer_Type_F8E3M4
        | PJRT_Buffer_Type_F8E8M0FNU => 1,
        PJRT_Buffer_Type_S16 | PJRT_Buffer_Type_U16 => 2,
        PJRT_Buffer_Type_F16 | PJRT_Buffer_Type_BF16 => 2,
        PJRT_Buffer_Type_S32 | PJRT_Buffer_Type_U32 | PJRT_Buffer_Type_F32 => 4,
        PJRT_Buffer_Type_S64 | PJRT_Buffer_Type_U64 | PJRT_Buffer_Type_F64 => 8,
        PJRT_Buffer_Type_C64 => 8,
        PJRT_Buffer_Type_C128 => 16,
        // A token orders side effects and holds no data (XLA's
        // `ShapeUtil::ByteSizeOf` of a token is 0): a buffer of no bytes.
        PJRT_Buffer_Type_TOKEN => 0,
        other => {
            return Err(Error::unimplemented(format!(
                "element type {other} ({}) is not supported by xla-vmm buffers",
                type_name(other)
            )))
        }
    })
}

pub fn type_name(t: PJRT_Buffer_Type) -> &'static str {
    match t {
        PJRT_Buffer_Type_PRED => "pred",
        PJRT_Buffer_Type_S8 => "s8",
        PJRT_Buffer_Type_S16 => "s16",
        PJRT_Buffer_Type_S32 => "s32",
        PJRT_Buffer_Type_S64 => "s64",
        PJRT_Buffer_Type_U8 => "u8",
        PJRT_Buffer_Type_U16 => "u16",
        PJRT_Buffer_Type_U32 => "u32",
        PJRT_Buffer_Type_U64 => "u64",
        PJRT_Buffer_Type_F16 => "f16",
        PJRT_Buffer_Type_F32 => "f32",
        PJRT_Buffer_Type_F64 => "f64",
        PJRT_Buffer_Type_BF16 => "bf16",
        PJRT_Buffer_Type_C64 => "c64",
        PJRT_Buffer_Type_C128 => "c128",
        PJRT_Buffer_Type_S4 => "s4",
        PJRT_Buffer_Type_U4 => "u4",
        PJRT_Buffer_Type_S2 => "s2",
        PJRT_Buffer_Type_U2 => "u2",
        PJRT_Buffer_Type_S1 => "s1",
        PJRT_Buffer_Type_U1 => "u1",
        PJRT_Buffer_Type_TOKEN => "token",
        PJRT_Buffer_Type_INVALID => "invalid",
        _ => "f8/f6/f4 or unknown",
    }
}

/// Checked element count of `dims`.
pub fn num_elements(dims: &[i64]) -> Result<u64> {
    dims.iter().try_fold(1u64, |acc, &d| {
        if d < 0 {
            return Err(Error::invalid(format!(
                "negative dimension {d} in {dims:?}"
            )));
        }
        acc.checked_mul(d as u64)
            .ok_or_else(|| Error::invalid(format!("shape {dims:?} overflows")))
    })
}

/// Dense major-to-minor byte strides.
pub fn dense_strides(dims: &[i64], elem: usize) -> Vec<i64> {
    let mut s = vec![0i64; dims.len()];
    let mut acc = elem as i64;
    for i in (0..dims.len()).rev() {
        s[i] = acc;
        acc = acc.saturating_mul(dims[i].max(1));
    }
    s
}

/// Byte strides of a dense layout given as `minor_to_major`.
pub fn strides_from_minor_to_major(dims: &[i64], m2m: &[i64], elem: usize) -> Result<Vec<i64>> {
    let n = dims.len();
    let mut seen = vec![false; n];
    if m2m.len() != n {
        return Err(Error::invalid(format!(
            "minor_to_major {m2m:?} does not match rank {n}"
        )));
    }
    let mut s = vec![0i64; n];
    let mut acc = elem as i64;
    for &d in m2m {
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d < n && !seen[d])
            .ok_or_else(|| {
                Error::invalid(format!("minor_to_major {m2m:?} is not a permutation"))
            })?;
        seen[d] = true;
        s[d] = acc;
        acc = acc.saturating_mul(dims[d].max(1));
    }
    Ok(s)
}

/// (lowest, highest+1) byte offsets a strided array touches, relative to
/// the address of element 0.
pub fn extent(dims: &[i64], strides: &[i64], elem: usize) -> (i64, i64) {
    if dims.contains(&0) {
        return (0, 0);
    }
    let (mut lo, mut hi) = (0i64, 0i64);
    for (&d, &s) in dims.iter().zip(strides) {
        let span = (d - 1).saturating_mul(s);
        if span < 0 {
            lo = lo.saturating_add(span);
        } else {
            hi = hi.saturating_add(span);
        }
    }
    (lo, hi.saturating_add(elem as i64))
}

/// Visit every element in major-to-minor order with its strided offset.
fn for_each_offset(dims: &[i64], strides: &[i64], mut f: impl FnMut(usize, i64)) {
    let n = dims.len();
    if dims.contains(&0) {
        return;
    }
    let total: i64 = dims.iter().product();
    let mut idx = vec![0i64; n];
    let mut off = 0i64;
    for k in 0..total as usize {
        f(k, off);
        for d in (0..n).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < dims[d] {
                break;
            }
            off -= strides[d] * dims[d];
            idx[d] = 0;
        }
    }
}

/// Gather a strided array into dense major-to-minor bytes. `src` starts at
/// offset `base` below element 0 (`base = -extent().0`).
pub fn gather(src: &[u8], base: i64, dims: &[i64], strides: &[i64], elem: usize) -> Vec<u8> {
    let n = num_elements(dims).unwrap_or(0) as usize;
    let mut out = vec![0u8; n * elem];
    for_each_offset(dims, strides, |k, off| {
        let s = (base + off) as usize;
        out[k * elem..(k + 1) * elem].copy_from_slice(&src[s..s + elem]);
    });
    out
}

/// Scatter dense major-to-minor bytes into a strided destination.
pub fn scatter(
    dense: &[u8],
    dst: &mut [u8],
    base: i64,
    dims: &[i64],
    strides: &[i64],
    elem: usize,
) {
    for_each_offset(dims, strides, |k, off| {
        let d = (base + off) as usize;
        dst[d..d + elem].copy_from_slice(&dense[k * elem..(k + 1) * elem]);
    });
}

/// The PJRT buffer type of an XLA element type name (`"BF16"` → BF16).
pub fn from_xla_name(name: &str) -> Option<PJRT_Buffer_Type> {
    Some(match name {
        "PRED" => PJRT_Buffer_Type_PRED,
        "S8" => PJRT_Buffer_Type_S8,
        "S16" => PJRT_Buffer_Type_S16,
        "S32" => PJRT_Buffer_Type_S32,
        "S64" => PJRT_Buffer_Type_S64,
        "U8" => PJRT_Buffer_Type_U8,
        "U16" => PJRT_Buffer_Type_U16,
        "U32" => PJRT_Buffer_Type_U32,
        "U64" => PJRT_Buffer_Type_U64,
        "F16" => PJRT_Buffer_Type_F16,
        "F32" => PJRT_Buffer_Type_F32,
        "F64" => PJRT_Buffer_Type_F64,
        "BF16" => PJRT_Buffer_Type_BF16,
        "C64" => PJRT_Buffer_Type_C64,
        "C128" => PJRT_Buffer_Type_C128,
        "F8E5M2" => PJRT_Buffer_Type_F8E5M2,
        "F8E4M3FN" => PJRT_Buffer_Type_F8E4M3FN,
        "F8E4M3B11FNUZ" => PJRT_Buffer_Type_F8E4M3B11FNUZ,
        "F8E5M2FNUZ" => PJRT_Buffer_Type_F8E5M2FNUZ,
        "F8E4M3FNUZ" => PJRT_Buffer_Type_F8E4M3FNUZ,
        "F8E4M3" => PJRT_Buffer_Type_F8E4M3,
        "F8E3M4" => PJRT_Buffer_Type_F8E3M4,
        "F8E8M0FNU" => PJRT_Buffer_Type_F8E8M0FNU,
        "S4" => PJRT_Buffer_Type_S4,
        "U4" => PJRT_Buffer_Type_U4,
        "S2" => PJRT_Buffer_Type_S2,
        "U2" => PJRT_Buffer_Type_U2,
        "S1" => PJRT_Buffer_Type_S1,
        "U1" => PJRT_Buffer_Type_U1,
        "F4E2M1FN" => PJRT_Buffer_Type_F4E2M1FN,
        "TOKEN" => PJRT_Buffer_Type_TOKEN,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_via_strides_round_trips() {
        // A 2x3 f32-sized array stored column-major (a transposed 3x2).
        let dims = [2i64, 3];
        let col_major = [4i64, 8];
        let src: Vec<u8> = (0u8..24).collect();
        let (lo, hi) = extent(&dims, &col_major, 4);
        assert_eq!((lo, hi), (0, 24));
        let dense = gather(&src, 0, &dims, &col_major, 4);
        // Row 0 = elements (0,0),(0,1),(0,2) = bytes 0..4, 8..12, 16..20.
        assert_eq!(&dense[0..12], &[0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]);
        let mut back = vec![0u8; 24];
        scatter(&dense, &mut back, 0, &dims, &col_major, 4);
        assert_eq!(back, src);
        assert_eq!(
            strides_from_minor_to_major(&dims, &[0, 1], 4).unwrap(),
            vec![4, 8]
        );
        assert_eq!(dense_strides(&dims, 4), vec![12, 4]);
    }

    #[test]
    fn negative_strides_read_reversed() {
        let dims = [4i64];
        let strides = [-2i64];
        let src: Vec<u8> = (0u8..8).collect();
        let (lo, _) = extent(&dims, &strides, 2);
        assert_eq!(lo, -6);
        let dense = gather(&src, 6, &dims, &strides, 2);
        assert_eq!(dense, vec![6, 7, 4, 5, 2, 3, 0, 1]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(num_elements(&[-1]).is_err());
        assert!(num_elements(&[i64::MAX, 4]).is_err());
        assert!(element_size(PJRT_Buffer_Type_S4).is_err());
        assert_eq!(host_element_size(PJRT_Buffer_Type_S4).unwrap(), 1);
        assert!(strides_from_minor_to_major(&[2, 2], &[0, 0], 4).is_err());
    }

    #[test]
    fn sub_byte_types_pack_low_bits_first() {
        // s4: [1, -1 (0xF), 7] -> 0xF1, 0x07; u2: four per byte.
        assert_eq!(pack(&[1, 0xFF, 7], 4), vec![0xF1, 0x07]);
        assert_eq!(unpack(&[0xF1, 0x07], 4, 3), vec![1, 0x0F, 7]);
        assert_eq!(pack(&[1, 2, 3, 0, 1], 2), vec![0b0011_1001, 0b01]);
        assert_eq!(
            unpack(&pack(&[1, 2, 3, 0, 1], 2), 2, 5),
            vec![1, 2, 3, 0, 1]
        );
        assert_eq!(device_bytes(PJRT_Buffer_Type_S4, 5).unwrap(), 3);
        assert_eq!(device_bytes(PJRT_Buffer_Type_U1, 9).unwrap(), 2);
        assert_eq!(device_bytes(PJRT_Buffer_Type_F32, 3).unwrap(), 12);
    }
}

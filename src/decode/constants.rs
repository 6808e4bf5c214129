//! Constant values from the executable's HLO module.
//!
//! When an executable carries its HLO module, XLA serializes its constants
//! *without* content (`ConstantInfo::ToProto(skip_content_serialization)`)
//! and, when loading it, takes each value from the HLO `constant`
//! instruction whose global name `buffer_for_<name>` equals the constant's
//! `symbol_name` (only instructions whose name needs no sanitizing count).
//! The value bytes are the literal's dense data in its layout order, sub-byte
//! types packed low bits first (what XLA's `LiteralToXlaFormat` produces).
//!
//! [`fill_from_hlo_module`] does the same for every constant allocation whose
//! bytes do not cover it, so every consumer of the plan sees the values.

use std::collections::HashMap;

use prost::Message;

use super::convert::invalid;
use super::DecodeError;
use crate::plan::{AllocationRole, Blob, BufferAllocation};
use crate::proto::xla::{HloInstructionProto, HloModuleProtoWithConfig, LiteralProto};

/// Fills the constant allocations without (complete) content from the
/// serialized `HloModuleProtoWithConfig` (`GpuExecutableProto` field 1, may be
/// empty). Constants the module does not name keep what they had (the
/// runtime rejects them at load time). Returns how many were filled.
pub(crate) fn fill_from_hlo_module(
    allocs: &mut [BufferAllocation],
    module_with_config: &[u8],
) -> Result<usize, DecodeError> {
    let needs = |a: &BufferAllocation| matches!(&a.role, AllocationRole::Constant { bytes, .. } if bytes.len() as u64 != a.size);
    if module_with_config.is_empty() || !allocs.iter().any(needs) {
        return Ok(0);
    }
    let with_config = HloModuleProtoWithConfig::decode(module_with_config).map_err(|source| {
        DecodeError::Proto {
            what: "xla.HloModuleProtoWithConfig (GpuExecutableProto.hlo_module_with_config)".into(),
            source,
        }
    })?;
    let Some(module) = with_config.hlo_module else {
        return Ok(0);
    };
    let mut by_global: HashMap<String, &HloInstructionProto> = HashMap::new();
    for instr in module.computations.iter().flat_map(|c| &c.instructions) {
        if instr.opcode == "constant" && !instr.name.contains(['.', '-', ';']) {
            by_global
                .entry(format!("buffer_for_{}", instr.name))
                .or_insert(instr);
        }
    }
    let mut filled = 0;
    for a in allocs.iter_mut() {
        let size = a.size;
        let AllocationRole::Constant { symbol_name, bytes } = &mut a.role else {
            continue;
        };
        if bytes.len() as u64 == size {
            continue;
        }
        let Some(instr) = by_global.get(symbol_name.as_str()) else {
            tracing::warn!(
                "constant '{symbol_name}' (allocation {}) has no content and no HLO constant",
                a.index
            );
            continue;
        };
        let literal = instr.literal.as_ref().ok_or_else(|| {
            invalid(format!(
                "HLO constant '{}' for '{symbol_name}' has no literal",
                instr.name
            ))
        })?;
        let value = literal_bytes(literal)
            .map_err(|m| invalid(format!("HLO constant '{}': {m}", instr.name)))?;
        if value.len() as u64 != size {
            return Err(invalid(format!(
                "HLO constant '{}' has {} bytes, its allocation {} has {size}",
                instr.name,
                value.len(),
                a.index
            )));
        }
        *bytes = Blob(value);
        filled += 1;
    }
    tracing::debug!("{filled} constants filled from the HLO module");
    Ok(filled)
}

fn le_bytes<T: Copy, const N: usize>(values: &[T], to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

/// One element per byte (low bits) → `bits`-wide elements packed into bytes,
/// element i in bits `(i % per_byte) * bits..` of byte `i / per_byte`.
fn pack(unpacked: &[u8], bits: usize) -> Vec<u8> {
    let per_byte = 8 / bits;
    let mask = (1u8 << bits) - 1;
    unpacked
        .chunks(per_byte)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .fold(0u8, |acc, (i, &v)| acc | ((v & mask) << (i * bits)))
        })
        .collect()
}

/// The device bytes of an array literal (XLA's `LiteralToXlaFormat`), chosen
/// by the literal's element type (`xla.PrimitiveType` numbers).
pub(crate) fn literal_bytes(l: &LiteralProto) -> Result<Vec<u8>, String> {
    let ty = l
        .shape
        .as_ref()
        .map(|s| s.element_type)
        .ok_or("literal without a shape")?;
    Ok(match ty {
        1 => l.preds.iter().map(|&b| u8::from(b)).collect(),
        2 => l.s8s.clone(),
        3 => l.s16s.clone(),
        4 => le_bytes(&l.s32s, i32::to_le_bytes),
        5 => le_bytes(&l.s64s, i64::to_le_bytes),
        6 => l.u8s.clone(),
        7 => l.u16s.clone(),
        8 => le_bytes(&l.u32s, u32::to_le_bytes),
        9 => le_bytes(&l.u64s, u64::to_le_bytes),
        10 => l.f16s.clone(),
        11 => le_bytes(&l.f32s, f32::to_le_bytes),
        12 => le_bytes(&l.f64s, f64::to_le_bytes),
        15 => le_bytes(&l.c64s, f32::to_le_bytes),
        16 => l.bf16s.clone(),
        18 => le_bytes(&l.c128s, f64::to_le_bytes),
        19 => l.f8e5m2s.clone(),
        20 => l.f8e4m3fns.clone(),
        23 => l.f8e4m3b11fnuzs.clone(),
        24 => l.f8e5m2fnuzs.clone(),
        25 => l.f8e4m3fnuzs.clone(),
        28 => l.f8e4m3s.clone(),
        29 => l.f8e3m4s.clone(),
        33 => l.f8e8m0fnus.clone(),
        // Sub-byte types: stored one element per byte in the literal.
        30 => pack(&l.s1s, 1),
        31 => pack(&l.u1s, 1),
        26 => pack(&l.s2s, 2),
        27 => pack(&l.u2s, 2),
        21 => pack(&l.s4s, 4),
        22 => pack(&l.u4s, 4),
        32 => pack(&l.f4e2m1fns, 4),
        other => {
            let ty = crate::plan::ElementType(other);
            return Err(format!(
                "element type {} is not supported for constants",
                ty.name().map_or_else(|| other.to_string(), str::to_string)
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::xla::ShapeProto;

    fn lit(element_type: i32) -> LiteralProto {
        LiteralProto {
            shape: Some(ShapeProto {
                element_type,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn literals_become_dense_little_endian_bytes() {
        let mut l = lit(4);
        l.s32s = vec![1, 2, 300, -1];
        assert_eq!(
            literal_bytes(&l).unwrap(),
            [1, 0, 0, 0, 2, 0, 0, 0, 44, 1, 0, 0, 255, 255, 255, 255]
        );
        let mut l = lit(11);
        l.f32s = vec![1.5];
        assert_eq!(literal_bytes(&l).unwrap(), 1.5f32.to_le_bytes());
        let mut l = lit(1);
        l.preds = vec![true, false, true];
        assert_eq!(literal_bytes(&l).unwrap(), [1, 0, 1]);
        let mut l = lit(16);
        l.bf16s = vec![0x80, 0x3f];
        assert_eq!(literal_bytes(&l).unwrap(), [0x80, 0x3f]);
        let mut l = lit(8);
        l.u32s = vec![u32::MAX];
        assert_eq!(literal_bytes(&l).unwrap(), [255; 4]);
        let mut l = lit(15);
        l.c64s = vec![1.0, -2.0];
        let want: Vec<u8> = [1.0f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(literal_bytes(&l).unwrap(), want);
    }

    #[test]
    fn sub_byte_literals_are_packed_low_bits_first() {
        let mut l = lit(21); // S4: -1, 2, 3 (unpacked, one per byte)
        l.s4s = vec![0xff, 0x02, 0x03];
        assert_eq!(literal_bytes(&l).unwrap(), [0x2f, 0x03]);
        let mut l = lit(27); // U2
        l.u2s = vec![1, 2, 3, 0, 1];
        assert_eq!(literal_bytes(&l).unwrap(), [0b0011_1001, 0b01]);
        let mut l = lit(31); // U1
        l.u1s = vec![1, 0, 0, 0, 0, 0, 0, 1, 1];
        assert_eq!(literal_bytes(&l).unwrap(), [0x81, 0x01]);
    }

    #[test]
    fn unsupported_and_shapeless_literals_are_errors() {
        assert!(literal_bytes(&lit(35)).unwrap_err().contains("F6E3M2FN"));
        assert!(literal_bytes(&lit(13)).unwrap_err().contains("TUPLE"));
        assert!(literal_bytes(&LiteralProto::default()).is_err());
    }
}

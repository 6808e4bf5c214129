//! Constant values from the executable's HLO module.
//!
//! When the executable carries its HLO module, XLA serializes constants
//! *without* their content (`ConstantInfo::ToProto(skip_content = true)`)
//! and, on deserialization, takes each value from the HLO `constant`
//! instruction whose global name (`buffer_for_<name>`) matches the
//! constant's `symbol_name` (`MakeConstantsMap` + `LiteralToXlaFormat` in
//! gpu_executable.cc). The module binary only declares the global (an
//! uninitialized `.nv.global`), so its value must come from here.
//!
//! The plan does not carry the HLO module, so this reads it from the
//! serialized bytes (`GpuExecutableProto.hlo_module_with_config` = 1 →
//! `hlo_module` = 1 → `computations` = 3 → `instructions` = 2 → `name` = 1,
//! `opcode` = 2, `literal` = 8) with a minimal protobuf wire reader, and
//! [`fill_constants`] puts the values into the plan.

use std::collections::HashMap;

use xla_vmm::{AllocationRole, Plan};

use crate::error::{Result, RuntimeError};

fn bad(m: impl Into<String>) -> RuntimeError {
    RuntimeError::invalid(format!("HLO module: {}", m.into()))
}

fn varint(b: &[u8], p: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*p).ok_or_else(|| bad("truncated varint"))?;
        *p += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(v);
        }
    }
    Err(bad("varint too long"))
}

/// One field of a message: number and payload.
enum Field<'a> {
    Varint(u64),
    Fixed64(&'a [u8]),
    Bytes(&'a [u8]),
    Fixed32(&'a [u8]),
}

fn fields(b: &[u8]) -> Result<Vec<(u32, Field<'_>)>> {
    let mut p = 0;
    let mut out = Vec::new();
    while p < b.len() {
        let key = varint(b, &mut p)?;
        let (num, wt) = ((key >> 3) as u32, key & 7);
        let take = |p: &mut usize, n: usize| -> Result<&[u8]> {
            let s = b.get(*p..*p + n).ok_or_else(|| bad("truncated field"))?;
            *p += n;
            Ok(s)
        };
        let f = match wt {
            0 => Field::Varint(varint(b, &mut p)?),
            1 => Field::Fixed64(take(&mut p, 8)?),
            2 => {
                let n = varint(b, &mut p)? as usize;
                Field::Bytes(take(&mut p, n)?)
            }
            5 => Field::Fixed32(take(&mut p, 4)?),
            w => return Err(bad(format!("wire type {w}"))),
        };
        out.push((num, f));
    }
    Ok(out)
}

fn sub(b: &[u8], num: u32) -> Result<Vec<&[u8]>> {
    Ok(fields(b)?
        .into_iter()
        .filter_map(|(n, f)| match f {
            Field::Bytes(s) if n == num => Some(s),
            _ => None,
        })
        .collect())
}

/// Little-endian bytes of a repeated numeric field (packed or not), each
/// element `width` bytes (varints narrowed to `width`).
fn numeric(fs: &[(u32, Field<'_>)], num: u32, width: usize, varint_kind: bool) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (n, f) in fs {
        if *n != num {
            continue;
        }
        match f {
            Field::Bytes(s) if varint_kind => {
                let mut p = 0;
                while p < s.len() {
                    let v = varint(s, &mut p)?;
                    out.extend_from_slice(&v.to_le_bytes()[..width]);
                }
            }
            Field::Bytes(s) => out.extend_from_slice(s),
            Field::Varint(v) => out.extend_from_slice(&v.to_le_bytes()[..width]),
            Field::Fixed32(s) | Field::Fixed64(s) => out.extend_from_slice(s),
        }
    }
    Ok(out)
}

/// The dense bytes of a `LiteralProto` (XLA's `LiteralToXlaFormat` for
/// byte-sized types).
fn literal_bytes(lit: &[u8]) -> Result<Option<Vec<u8>>> {
    let fs = fields(lit)?;
    // (field, element width, varint-encoded)
    const NUMERIC: &[(u32, usize, bool)] = &[
        (2, 1, true),   // preds
        (4, 4, true),   // s32s
        (5, 8, true),   // s64s
        (6, 4, true),   // u32s
        (7, 8, true),   // u64s
        (8, 4, false),  // f32s
        (9, 8, false),  // f64s
        (12, 4, false), // c64s
        (18, 8, false), // c128s
    ];
    // bytes fields of byte-sized types (s8, u8, f16, bf16, u16, s16, f8*).
    const RAW: &[u32] = &[15, 3, 11, 13, 16, 17, 29, 23, 20, 25, 28, 24, 19, 33];
    const SUB_BYTE: &[u32] = &[30, 26, 21, 31, 27, 22, 32, 35, 36];
    for &(num, w, v) in NUMERIC {
        if fs.iter().any(|(n, _)| *n == num) {
            return Ok(Some(numeric(&fs, num, w, v)?));
        }
    }
    for &num in RAW {
        if let Some((_, Field::Bytes(s))) = fs.iter().find(|(n, _)| *n == num) {
            return Ok(Some(s.to_vec()));
        }
    }
    if fs.iter().any(|(n, _)| SUB_BYTE.contains(n)) {
        return Err(RuntimeError::unsupported("sub-byte constant literals"));
    }
    Ok(None)
}

/// Global name (`buffer_for_<instruction name>`) → value bytes of every
/// constant instruction of the HLO module in `serialized` (the bytes given to
/// `xla_vmm::decode::decode`). Empty when the executable has no HLO module.
pub fn constant_values(serialized: &[u8]) -> Result<HashMap<String, Vec<u8>>> {
    let outer = xla_vmm::decode::decode_executable_and_options(serialized)
        .map_err(|e| bad(e.to_string()))?;
    let exe = xla_vmm::decode::read_split_proto(
        &outer.serialized_executable,
        "xla.gpu.GpuExecutableProto",
    )
    .map_err(|e| bad(e.to_string()))?;
    let mut out = HashMap::new();
    for with_config in sub(&exe, 1)? {
        for module in sub(with_config, 1)? {
            for comp in sub(module, 3)? {
                for instr in sub(comp, 2)? {
                    let fs = fields(instr)?;
                    let text = |num: u32| {
                        fs.iter().find_map(|(n, f)| match f {
                            Field::Bytes(s) if *n == num => std::str::from_utf8(s).ok(),
                            _ => None,
                        })
                    };
                    if text(2) != Some("constant") {
                        continue;
                    }
                    let (Some(name), Some(lit)) = (text(1), sub(instr, 8)?.first().copied()) else {
                        continue;
                    };
                    if let Some(bytes) = literal_bytes(lit)? {
                        out.insert(format!("buffer_for_{name}"), bytes);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Fill every constant allocation of `plan` that has no content from the
/// HLO module in `serialized`, as XLA does when deserializing. Returns how
/// many were filled. Call after `xla_vmm::decode::decode(serialized)`.
pub fn fill_constants(plan: &mut Plan, serialized: &[u8]) -> Result<usize> {
    let needs = plan.allocations.iter().any(|a| {
        matches!(&a.role, AllocationRole::Constant { bytes, .. } if bytes.len() as u64 != a.size)
    });
    if !needs {
        return Ok(0);
    }
    let values = constant_values(serialized)?;
    let mut filled = 0;
    for a in &mut plan.allocations {
        let size = a.size;
        if let AllocationRole::Constant { symbol_name, bytes } = &mut a.role {
            if bytes.len() as u64 == size {
                continue;
            }
            if let Some(v) = values.get(symbol_name.as_str()) {
                if v.len() as u64 != size {
                    return Err(bad(format!(
                        "constant '{symbol_name}' has {} bytes, allocation {} has {size}",
                        v.len(),
                        a.index
                    )));
                }
                *bytes = xla_vmm::Blob(v.clone());
                filled += 1;
            }
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u32, wt: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut key = (u64::from(num) << 3) | wt;
        loop {
            let b = (key & 0x7f) as u8;
            key >>= 7;
            if key == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        if wt == 2 {
            out.push(payload.len() as u8);
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn literals_become_dense_little_endian_bytes() {
        // s32s packed: 1, 2, 300.
        let lit = field(4, 2, &[1, 2, 0xac, 0x02]);
        assert_eq!(
            literal_bytes(&lit).unwrap().unwrap(),
            [1, 0, 0, 0, 2, 0, 0, 0, 44, 1, 0, 0]
        );
        // f32s packed.
        let lit = field(8, 2, &1.5f32.to_le_bytes());
        assert_eq!(literal_bytes(&lit).unwrap().unwrap(), 1.5f32.to_le_bytes());
        // preds packed.
        let lit = field(2, 2, &[1, 0, 1]);
        assert_eq!(literal_bytes(&lit).unwrap().unwrap(), [1, 0, 1]);
        // bf16s raw bytes.
        let lit = field(13, 2, &[0x80, 0x3f]);
        assert_eq!(literal_bytes(&lit).unwrap().unwrap(), [0x80, 0x3f]);
        // s4s: not handled.
        assert!(literal_bytes(&field(21, 2, &[0x21])).is_err());
    }

    #[test]
    fn fixture_constants_come_from_the_hlo_module() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures");
        let Ok(bytes) = std::fs::read(dir.join("loop.pjrt")) else {
            return;
        };
        let mut plan = xla_vmm::decode::decode(&bytes).unwrap();
        let values = constant_values(&bytes).unwrap();
        // loop.hlo.txt: %constant_7_0 = s32[] constant(0)
        assert_eq!(values.get("buffer_for_constant_7_0"), Some(&vec![0u8; 4]));
        assert_eq!(fill_constants(&mut plan, &bytes).unwrap(), 1);
        crate::ops::check_support(&plan).unwrap();
    }
}

//! `.npz` files (a zip of `.npy` arrays) as raw bytes + shape.
//!
//! The runtime never interprets element values: an array is its `descr`
//! string (numpy's dtype, e.g. `<f4`; bf16 arrays saved by JAX appear as a
//! void dtype `<V2` / `|V2`), its shape and its bytes in C order. Callers check
//! byte sizes against the executable's parameter shapes.

use std::io::{Read, Write};

use crate::error::{Result, RuntimeError};

/// One array of an `.npz` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyArray {
    /// numpy dtype string, e.g. `<f4`, `|b1`, `<V2`.
    pub descr: String,
    pub shape: Vec<u64>,
    /// Element bytes in C (row-major) order.
    pub data: Vec<u8>,
}

impl NpyArray {
    /// Size of one element in bytes, parsed from `descr` (`<f4` → 4, `<V2` → 2).
    pub fn item_size(&self) -> Option<usize> {
        descr_item_size(&self.descr)
    }

    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The numpy dtype string we write for an XLA element type name (`"F32"`);
/// types numpy lacks (bf16, fp8) become void types of their byte width.
pub fn descr_for_element(name: &str, byte_width: usize) -> String {
    let d = match name {
        "PRED" => "|b1",
        "S8" => "|i1",
        "U8" => "|u1",
        "S16" => "<i2",
        "U16" => "<u2",
        "S32" => "<i4",
        "U32" => "<u4",
        "S64" => "<i8",
        "U64" => "<u8",
        "F16" => "<f2",
        "F32" => "<f4",
        "F64" => "<f8",
        "C64" => "<c8",
        "C128" => "<c16",
        _ => return format!("|V{byte_width}"),
    };
    d.to_string()
}

fn descr_item_size(descr: &str) -> Option<usize> {
    let body = descr.trim_start_matches(['<', '>', '|', '=']);
    let digits: String = body.chars().skip_while(|c| c.is_alphabetic()).collect();
    digits.parse().ok().filter(|&n: &usize| n > 0)
}

fn io_err(path: &str, message: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Io {
        path: path.to_string(),
        message: message.to_string(),
    }
}

/// Parse one `.npy` file's bytes.
pub fn parse_npy(bytes: &[u8], what: &str) -> Result<NpyArray> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(io_err(what, "not an .npy file (bad magic)"));
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(io_err(what, "truncated .npy header"));
            }
            let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (n as usize, 12)
        }
        v => return Err(io_err(what, format!("unsupported .npy version {v}"))),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| io_err(what, "truncated .npy header"))?;
    let header = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| io_err(what, "non-UTF-8 .npy header"))?;
    let descr = dict_value(header, "descr")
        .and_then(unquote)
        .ok_or_else(|| io_err(what, format!("no descr in header {header:?}")))?;
    let fortran = dict_value(header, "fortran_order")
        .map(|v| v.trim().starts_with("True"))
        .unwrap_or(false);
    let shape_text = dict_value(header, "shape")
        .ok_or_else(|| io_err(what, format!("no shape in header {header:?}")))?;
    let shape = parse_shape(shape_text)
        .ok_or_else(|| io_err(what, format!("bad shape in header {header:?}")))?;
    if fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(io_err(what, "Fortran-order arrays are not supported"));
    }
    let array = NpyArray {
        descr,
        shape,
        data: bytes[end..].to_vec(),
    };
    let item = array
        .item_size()
        .ok_or_else(|| io_err(what, format!("unknown dtype {:?}", array.descr)))?;
    let expected = array.element_count() as usize * item;
    if array.data.len() != expected {
        return Err(io_err(
            what,
            format!(
                "data is {} bytes, shape {:?} of {} needs {expected}",
                array.data.len(),
                array.shape,
                array.descr
            ),
        ));
    }
    Ok(array)
}

/// The text after `'key':` up to the next top-level comma.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("'{key}'");
    let at = header.find(&pat)? + pat.len();
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    if rest.starts_with('(') {
        let close = rest.find(')')?;
        return Some(&rest[..=close]);
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(&rest[..end])
}

fn unquote(v: &str) -> Option<String> {
    let v = v.trim();
    let q = v.chars().next()?;
    if q != '\'' && q != '"' {
        return None;
    }
    let inner = &v[1..];
    Some(inner[..inner.find(q)?].to_string())
}

fn parse_shape(v: &str) -> Option<Vec<u64>> {
    let inner = v.trim().strip_prefix('(')?.strip_suffix(')')?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().ok())
        .collect()
}

/// Serialize one array as `.npy` (version 1.0).
pub fn npy_bytes(array: &NpyArray) -> Vec<u8> {
    let shape = match array.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", array.shape[0]),
        _ => format!(
            "({})",
            array
                .shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        array.descr
    );
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + array.data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&array.data);
    out
}

/// Read every array of an `.npz` file, keyed by name (without `.npy`), in
/// file order.
pub fn read_npz(path: &std::path::Path) -> Result<Vec<(String, NpyArray)>> {
    let p = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| io_err(&p, e))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| io_err(&p, e))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| io_err(&p, e))?;
        let name = entry.name().map_err(|e| io_err(&p, e))?.to_string();
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| io_err(&p, format!("{name}: {e}")))?;
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        out.push((key, parse_npy(&bytes, &format!("{p}:{name}"))?));
    }
    Ok(out)
}

/// Write arrays as an uncompressed `.npz` (what `numpy.savez` writes).
pub fn write_npz(path: &std::path::Path, arrays: &[(String, NpyArray)]) -> Result<()> {
    let p = path.display().to_string();
    let file = std::fs::File::create(path).map_err(|e| io_err(&p, e))?;
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true);
    for (name, array) in arrays {
        zip.start_file(format!("{name}.npy"), options)
            .map_err(|e| io_err(&p, e))?;
        zip.write_all(&npy_bytes(array))
            .map_err(|e| io_err(&p, e))?;
    }
    zip.finish().map_err(|e| io_err(&p, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip_keeps_bytes_shape_and_dtype() {
        let a = NpyArray {
            descr: "<V2".into(),
            shape: vec![3, 2],
            data: (0u8..12).collect(),
        };
        let b = parse_npy(&npy_bytes(&a), "t").unwrap();
        assert_eq!(a, b);
        assert_eq!(b.item_size(), Some(2));
        let s = NpyArray {
            descr: "<f4".into(),
            shape: vec![],
            data: 1.5f32.to_le_bytes().to_vec(),
        };
        assert_eq!(parse_npy(&npy_bytes(&s), "t").unwrap(), s);
    }

    #[test]
    fn npy_rejects_size_mismatch_and_bad_magic() {
        let mut bytes = npy_bytes(&NpyArray {
            descr: "<f4".into(),
            shape: vec![4],
            data: vec![0; 16],
        });
        bytes.pop();
        assert!(parse_npy(&bytes, "t").is_err());
        assert!(parse_npy(b"PK\x03\x04garbage", "t").is_err());
    }

    #[test]
    fn npz_round_trip_through_a_file() {
        let dir = std::env::temp_dir().join(format!("xla-vmm-npz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.npz");
        let arrays = vec![
            (
                "in_0".to_string(),
                NpyArray {
                    descr: "<i4".into(),
                    shape: vec![2],
                    data: vec![1, 0, 0, 0, 2, 0, 0, 0],
                },
            ),
            (
                "out_0".to_string(),
                NpyArray {
                    descr: "|b1".into(),
                    shape: vec![1],
                    data: vec![1],
                },
            ),
        ];
        write_npz(&path, &arrays).unwrap();
        assert_eq!(read_npz(&path).unwrap(), arrays);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn fixture_npz_files_parse() {
        let path = xla_vmm::testdata::require_fixtures_dir().join("loop.npz");
        let arrays = read_npz(&path).unwrap();
        let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names.contains(&"in_0") && names.contains(&"out_0"),
            "{names:?}"
        );
        for (_, a) in &arrays {
            assert_eq!(
                a.data.len() as u64,
                a.element_count() * a.item_size().unwrap() as u64
            );
        }
    }
}

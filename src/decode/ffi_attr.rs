//! `xla.ffi.AttributesMapProto` → [`FfiAttrs`] (sorted by name).

use super::convert::invalid;
use super::DecodeError;
use crate::plan::{FfiArray, FfiAttr, FfiAttrs, FfiScalar};
use crate::proto::xla::ffi::{
    array_proto::Value as A, attribute_proto::Value as V, scalar_proto::Value as S, ArrayProto,
    AttributesMapProto, ScalarProto,
};

/// Deepest nesting of attribute dictionaries accepted (bounds recursion on
/// hostile input).
const MAX_DEPTH: usize = 16;

pub(crate) fn attributes(
    m: Option<AttributesMapProto>,
    path: &str,
) -> Result<FfiAttrs, DecodeError> {
    map(m.unwrap_or_default(), path, 0)
}

fn map(m: AttributesMapProto, path: &str, depth: usize) -> Result<FfiAttrs, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!(
            "{path}: attributes nested deeper than {MAX_DEPTH} dictionaries"
        )));
    }
    let mut out = Vec::with_capacity(m.attrs.len());
    for (name, a) in m.attrs {
        let at = format!("{path}.{name}");
        let v = match a.value {
            Some(V::Scalar(s)) => FfiAttr::Scalar(scalar(s, &at)?),
            Some(V::Array(a)) => FfiAttr::Array(array(a, &at)?),
            Some(V::Str(s)) => FfiAttr::Str(s),
            Some(V::Dict(d)) => FfiAttr::Dict(map(d, &at, depth + 1)?),
            None => return Err(invalid(format!("attribute {at}: no value"))),
        };
        out.push((name, v));
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// A proto int32 / uint32 narrowed to the attribute's type.
fn narrow<T: TryFrom<W>, W: Copy + std::fmt::Display>(v: W, at: &str) -> Result<T, DecodeError> {
    T::try_from(v).map_err(|_| {
        invalid(format!(
            "attribute {at}: {v} is out of range of {}",
            std::any::type_name::<T>()
        ))
    })
}

fn narrow_all<T: TryFrom<W>, W: Copy + std::fmt::Display>(
    v: &[W],
    at: &str,
) -> Result<Vec<T>, DecodeError> {
    v.iter().map(|&x| narrow(x, at)).collect()
}

fn scalar(s: ScalarProto, at: &str) -> Result<FfiScalar, DecodeError> {
    Ok(match s.value {
        Some(S::B(v)) => FfiScalar::Pred(v),
        Some(S::I8(v)) => FfiScalar::S8(narrow(v, at)?),
        Some(S::I16(v)) => FfiScalar::S16(narrow(v, at)?),
        Some(S::I32(v)) => FfiScalar::S32(v),
        Some(S::I64(v)) => FfiScalar::S64(v),
        Some(S::U8(v)) => FfiScalar::U8(narrow(v, at)?),
        Some(S::U16(v)) => FfiScalar::U16(narrow(v, at)?),
        Some(S::U32(v)) => FfiScalar::U32(v),
        Some(S::U64(v)) => FfiScalar::U64(v),
        Some(S::F32(v)) => FfiScalar::F32(v),
        Some(S::F64(v)) => FfiScalar::F64(v),
        None => return Err(invalid(format!("attribute {at}: scalar without a value"))),
    })
}

fn array(a: ArrayProto, at: &str) -> Result<FfiArray, DecodeError> {
    Ok(match a.value {
        Some(A::I8(v)) => FfiArray::S8(narrow_all(&v.values, at)?),
        Some(A::I16(v)) => FfiArray::S16(narrow_all(&v.values, at)?),
        Some(A::I32(v)) => FfiArray::S32(v.values),
        Some(A::I64(v)) => FfiArray::S64(v.values),
        Some(A::U8(v)) => FfiArray::U8(narrow_all(&v.values, at)?),
        Some(A::U16(v)) => FfiArray::U16(narrow_all(&v.values, at)?),
        Some(A::U32(v)) => FfiArray::U32(v.values),
        Some(A::U64(v)) => FfiArray::U64(v.values),
        Some(A::F32(v)) => FfiArray::F32(v.values),
        Some(A::F64(v)) => FfiArray::F64(v.values),
        None => return Err(invalid(format!("attribute {at}: array without a value"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::xla::ffi::{array_proto, AttributeProto};

    fn attr(v: V) -> AttributeProto {
        AttributeProto { value: Some(v) }
    }

    #[test]
    fn attributes_are_sorted_by_name_and_typed() {
        let mut inner = AttributesMapProto::default();
        inner.attrs.insert(
            "k".into(),
            attr(V::Scalar(ScalarProto {
                value: Some(S::I8(-3)),
            })),
        );
        let mut m = AttributesMapProto::default();
        m.attrs.insert(
            "index".into(),
            attr(V::Scalar(ScalarProto {
                value: Some(S::U64(7)),
            })),
        );
        m.attrs.insert("b_str".into(), attr(V::Str(b"hi".to_vec())));
        // Not UTF-8 (a Mosaic kernel): kept as bytes.
        m.attrs
            .insert("c_bin".into(), attr(V::Str(vec![0xff, 0x00, 0xfe])));
        m.attrs.insert(
            "a_dims".into(),
            attr(V::Array(ArrayProto {
                value: Some(A::I64(array_proto::Int64ArrayProto { values: vec![2, 3] })),
            })),
        );
        m.attrs.insert("d".into(), attr(V::Dict(inner)));
        let got = attributes(Some(m), "cc").unwrap();
        let names: Vec<_> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a_dims", "b_str", "c_bin", "d", "index"]);
        assert_eq!(got[0].1, FfiAttr::Array(FfiArray::S64(vec![2, 3])));
        assert_eq!(got[1].1, FfiAttr::Str(b"hi".to_vec()));
        assert_eq!(got[2].1, FfiAttr::Str(vec![0xff, 0x00, 0xfe]));
        assert_eq!(
            got[3].1,
            FfiAttr::Dict(vec![("k".into(), FfiAttr::Scalar(FfiScalar::S8(-3)))])
        );
        assert_eq!(got[4].1, FfiAttr::Scalar(FfiScalar::U64(7)));
        assert_eq!(FfiScalar::U64(7).bytes(), 7u64.to_ne_bytes());
        assert!(attributes(None, "cc").unwrap().is_empty());
    }

    #[test]
    fn out_of_range_and_empty_values_are_errors_naming_the_attribute() {
        let mut m = AttributesMapProto::default();
        m.attrs.insert(
            "small".into(),
            attr(V::Scalar(ScalarProto {
                value: Some(S::I8(300)),
            })),
        );
        let e = attributes(Some(m), "cc").unwrap_err().to_string();
        assert!(e.contains("cc.small") && e.contains("300"), "{e}");
        let mut m = AttributesMapProto::default();
        m.attrs
            .insert("none".into(), AttributeProto { value: None });
        let e = attributes(Some(m), "cc").unwrap_err().to_string();
        assert!(e.contains("cc.none"), "{e}");
        // Dictionaries nested past the bound.
        let mut m = AttributesMapProto::default();
        for _ in 0..=MAX_DEPTH + 1 {
            let mut outer = AttributesMapProto::default();
            outer.attrs.insert("x".into(), attr(V::Dict(m)));
            m = outer;
        }
        let e = attributes(Some(m), "cc").unwrap_err().to_string();
        assert!(e.contains("nested deeper"), "{e}");
    }
}

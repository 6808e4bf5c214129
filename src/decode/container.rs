//! The container layers: the optional IFRT header, the riegeli file, and
//! XLA's split-proto reassembly (xla/util/split_proto).
//!
//! A split proto is a riegeli file whose record 0 is a `SplitProtoManifest`
//! naming the result message type and listing the records that follow, in
//! order. A *merge* record is a serialized result message merged into the
//! result; a *field override* record is the raw value of one top-level
//! string/bytes field that replaces the field's value. Records of unknown
//! type are skipped, as XLA does.
//!
//! Protobuf merge semantics make the reassembly a concatenation: parsing
//! `A ++ B` equals parsing `A` then merging `B` (repeated fields append,
//! messages merge, singular scalars/strings: last wins). An override of a
//! singular string field is therefore appended as one encoded field.

use std::io::Cursor;

use prost::Message;
use riegeli::{ReaderOptions, RecordReader, RecordWriter, WriterOptions};

use super::{wire, DecodeError};
use crate::proto::xla::{record, record::RecordType, Record, SplitProtoManifest};

/// The first 4 bytes of every riegeli file (the hash in its first block
/// header, which is the same for every file).
pub const RIEGELI_SIGNATURE: [u8; 4] = [0x83, 0xAF, 0x70, 0xD1];

/// Returns the riegeli file inside `bytes`: `bytes` itself when it starts
/// with the riegeli signature, or what follows an IFRT header (a varint
/// length plus that many bytes) when the signature comes right after it.
/// `None` when neither holds.
pub fn strip_ifrt_header(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.starts_with(&RIEGELI_SIGNATURE) {
        return Some(bytes);
    }
    let (len, n) = wire::read_varint(bytes)?;
    let start = usize::try_from(len).ok()?.checked_add(n)?;
    let rest = bytes.get(start..)?;
    rest.starts_with(&RIEGELI_SIGNATURE).then_some(rest)
}

/// Is `bytes` a riegeli file (by its signature)?
pub fn is_riegeli(bytes: &[u8]) -> bool {
    bytes.starts_with(&RIEGELI_SIGNATURE)
}

/// The split proto XLA would write for the serialized message `message` of
/// type `ty`: a manifest and one merge record (what the tests, the fuzzers
/// and tools wrap synthetic or mutated messages in).
pub fn write_split_proto(ty: &str, message: &[u8]) -> Vec<u8> {
    let manifest = SplitProtoManifest {
        result_proto_type: ty.into(),
        records: vec![Record {
            record_type: Some(RecordType::ProtoMergeRecord(record::ProtoMergeRecord {})),
        }],
    };
    let mut buf = Vec::new();
    // Writing to memory cannot fail but for allocation (which aborts anyway).
    let mut w = RecordWriter::new(&mut buf, WriterOptions::new()).expect("riegeli writer");
    w.write_record(&manifest.encode_to_vec())
        .expect("riegeli record");
    w.write_record(message).expect("riegeli record");
    w.close().expect("riegeli close");
    buf
}

/// Reassembles the split proto in the riegeli file `bytes`, checking that
/// its manifest names `expected_type`; returns the serialized message.
pub fn read_split_proto(bytes: &[u8], expected_type: &str) -> Result<Vec<u8>, DecodeError> {
    let riegeli_err = |source| DecodeError::Riegeli {
        what: expected_type.to_string(),
        source,
    };
    let mut reader =
        RecordReader::new(Cursor::new(bytes), ReaderOptions::new()).map_err(riegeli_err)?;
    let split_err = |msg: String| DecodeError::SplitProto {
        what: expected_type.to_string(),
        msg,
    };
    let manifest_bytes = reader
        .read_record()
        .map_err(riegeli_err)?
        .ok_or_else(|| split_err("riegeli file has no records (no manifest)".into()))?;
    let manifest = SplitProtoManifest::decode(&manifest_bytes[..]).map_err(|e| {
        split_err(format!(
            "record 0 is not a SplitProtoManifest ({e}); not a split proto"
        ))
    })?;
    if manifest.result_proto_type != expected_type {
        return Err(split_err(format!(
            "manifest says the result is `{}`, expected `{expected_type}`",
            manifest.result_proto_type
        )));
    }
    tracing::debug!(
        ty = expected_type,
        records = manifest.records.len(),
        "split proto manifest"
    );

    let mut out = Vec::new();
    for (i, record) in manifest.records.iter().enumerate() {
        let data = reader.read_record().map_err(riegeli_err)?.ok_or_else(|| {
            split_err(format!(
                "manifest lists {} records but the file ends after {i}",
                manifest.records.len()
            ))
        })?;
        match &record.record_type {
            Some(RecordType::ProtoMergeRecord(_)) => out.extend_from_slice(&data),
            Some(RecordType::FieldOverrideRecord(o)) => {
                if o.field_type != 1 {
                    return Err(split_err(format!(
                        "record {i}: field override of type {} (only TYPE_STRING is defined)",
                        o.field_type
                    )));
                }
                let [part] = o.field_path.as_slice() else {
                    return Err(split_err(format!(
                        "record {i}: field override path has {} parts (only one is supported, as in XLA)",
                        o.field_path.len()
                    )));
                };
                let number = u32::try_from(part.field_number)
                    .ok()
                    .filter(|&n| n > 0 && n < (1 << 29))
                    .ok_or_else(|| {
                        split_err(format!(
                            "record {i}: invalid field number {}",
                            part.field_number
                        ))
                    })?;
                if part.index.is_some() {
                    return Err(split_err(format!(
                        "record {i}: field override of a repeated/map element (unsupported, as in XLA)"
                    )));
                }
                wire::write_len_field(number, &data, &mut out);
            }
            None => tracing::warn!(record = i, "ignoring split proto record of unknown type"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifrt_header_is_stripped() {
        let mut riegeli = RIEGELI_SIGNATURE.to_vec();
        riegeli.extend_from_slice(b"rest");
        assert_eq!(strip_ifrt_header(&riegeli), Some(&riegeli[..]));
        let mut wrapped = vec![3, b'h', b'd', b'r'];
        wrapped.extend_from_slice(&riegeli);
        assert_eq!(strip_ifrt_header(&wrapped), Some(&riegeli[..]));
        assert_eq!(strip_ifrt_header(&[3, 1, 2]), None);
        assert_eq!(strip_ifrt_header(&[0xff; 12]), None);
        assert_eq!(strip_ifrt_header(&[]), None);
    }
}

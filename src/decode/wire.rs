//! Minimal protobuf wire-format reading: enough to read a `ThunkProto`'s
//! oneof tag by hand and to encode split-proto field overrides.

use super::DecodeError;

/// Protobuf wire types.
pub(crate) const WIRE_VARINT: u8 = 0;
pub(crate) const WIRE_I64: u8 = 1;
pub(crate) const WIRE_LEN: u8 = 2;
pub(crate) const WIRE_I32: u8 = 5;

/// Reads a base-128 varint from the front of `buf`; returns it and the
/// number of bytes used.
pub(crate) fn read_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

pub(crate) fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One top-level field of a serialized message.
pub(crate) struct Field<'a> {
    pub number: u32,
    pub wire_type: u8,
    /// The payload of a length-delimited field (empty for other wire types).
    pub data: &'a [u8],
}

/// Iterates over the top-level fields of a serialized message.
pub(crate) struct Fields<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }

    fn err(&mut self, msg: &str) -> DecodeError {
        self.buf = &[];
        DecodeError::Wire(format!("{}: {msg}", self.what))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let Some((key, n)) = read_varint(self.buf) else {
            return Some(Err(self.err("truncated field key")));
        };
        let number = key >> 3;
        let wire_type = (key & 7) as u8;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Some(Err(self.err("invalid field number")));
        }
        let number = number as u32;
        let rest = &self.buf[n..];
        let (data, used) = match wire_type {
            WIRE_VARINT => match read_varint(rest) {
                Some((_, m)) => (&rest[..0], m),
                None => return Some(Err(self.err("truncated varint"))),
            },
            WIRE_I64 if rest.len() >= 8 => (&rest[..0], 8),
            WIRE_I32 if rest.len() >= 4 => (&rest[..0], 4),
            WIRE_LEN => match read_varint(rest) {
                Some((len, m)) if (len as u128) <= (rest.len() - m) as u128 => {
                    let len = len as usize;
                    (&rest[m..m + len], m + len)
                }
                _ => return Some(Err(self.err("truncated length-delimited field"))),
            },
            WIRE_I64 | WIRE_I32 => return Some(Err(self.err("truncated fixed-width field"))),
            _ => return Some(Err(self.err("unsupported wire type (group)"))),
        };
        self.buf = &rest[used..];
        Some(Ok(Field {
            number,
            wire_type,
            data,
        }))
    }
}

/// Appends a length-delimited field (`number`, `data`) to `out`.
pub(crate) fn write_len_field(number: u32, data: &[u8], out: &mut Vec<u8>) {
    write_varint((u64::from(number) << 3) | u64::from(WIRE_LEN), out);
    write_varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            write_varint(v, &mut b);
            assert_eq!(read_varint(&b), Some((v, b.len())));
        }
        assert_eq!(read_varint(&[0x80, 0x80]), None);
    }

    #[test]
    fn fields_iterate_and_reject_truncation() {
        let mut b = Vec::new();
        write_len_field(36, b"abc", &mut b);
        b.extend_from_slice(&[0x08, 0x96, 0x01]); // field 1 varint 150
        let fields: Vec<_> = Fields::new(&b, "t").collect::<Result<_, _>>().unwrap();
        assert_eq!(fields.len(), 2);
        assert_eq!((fields[0].number, fields[0].data), (36, &b"abc"[..]));
        assert_eq!((fields[1].number, fields[1].wire_type), (1, WIRE_VARINT));
        let cut = &b[..4];
        assert!(Fields::new(cut, "t").any(|f| f.is_err()));
    }
}

//! The attributes of a typed-FFI custom call (`xla.ffi.AttributesMapProto`):
//! what XLA passes a handler in its call frame's `attrs`, sorted by name.

use serde::Serialize;

/// XLA's `PrimitiveType` numbers, which are also `XLA_FFI_DataType`'s.
pub mod dtype {
    pub const PRED: i32 = 1;
    pub const S8: i32 = 2;
    pub const S16: i32 = 3;
    pub const S32: i32 = 4;
    pub const S64: i32 = 5;
    pub const U8: i32 = 6;
    pub const U16: i32 = 7;
    pub const U32: i32 = 8;
    pub const U64: i32 = 9;
    pub const F32: i32 = 11;
    pub const F64: i32 = 12;
    pub const TOKEN: i32 = 17;
}

/// A scalar attribute.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum FfiScalar {
    Pred(bool),
    S8(i8),
    S16(i16),
    S32(i32),
    S64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
}

/// An array attribute.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum FfiArray {
    S8(Vec<i8>),
    S16(Vec<i16>),
    S32(Vec<i32>),
    S64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// One attribute value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum FfiAttr {
    Scalar(FfiScalar),
    Array(FfiArray),
    /// A string attribute's bytes (UTF-8 as a rule; Pallas Mosaic GPU
    /// custom calls carry binary kernels in one).
    Str(Vec<u8>),
    Dict(FfiAttrs),
}

/// Named attributes, sorted by name (byte order, as XLA hands them to a
/// handler, which finds them by position).
pub type FfiAttrs = Vec<(String, FfiAttr)>;

impl FfiScalar {
    /// Its `XLA_FFI_DataType`.
    pub fn dtype(&self) -> i32 {
        match self {
            FfiScalar::Pred(_) => dtype::PRED,
            FfiScalar::S8(_) => dtype::S8,
            FfiScalar::S16(_) => dtype::S16,
            FfiScalar::S32(_) => dtype::S32,
            FfiScalar::S64(_) => dtype::S64,
            FfiScalar::U8(_) => dtype::U8,
            FfiScalar::U16(_) => dtype::U16,
            FfiScalar::U32(_) => dtype::U32,
            FfiScalar::U64(_) => dtype::U64,
            FfiScalar::F32(_) => dtype::F32,
            FfiScalar::F64(_) => dtype::F64,
        }
    }

    /// The value's bytes in memory (native order), as a handler reads it.
    pub fn bytes(&self) -> Vec<u8> {
        match *self {
            FfiScalar::Pred(v) => vec![v as u8],
            FfiScalar::S8(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::S16(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::S32(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::S64(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::U8(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::U16(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::U32(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::U64(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::F32(v) => v.to_ne_bytes().to_vec(),
            FfiScalar::F64(v) => v.to_ne_bytes().to_vec(),
        }
    }
}

macro_rules! array_bytes {
    ($v:expr) => {
        $v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    };
}

impl FfiArray {
    /// (its element `XLA_FFI_DataType`, its length, its elements' bytes).
    pub fn parts(&self) -> (i32, usize, Vec<u8>) {
        match self {
            FfiArray::S8(v) => (dtype::S8, v.len(), array_bytes!(v)),
            FfiArray::S16(v) => (dtype::S16, v.len(), array_bytes!(v)),
            FfiArray::S32(v) => (dtype::S32, v.len(), array_bytes!(v)),
            FfiArray::S64(v) => (dtype::S64, v.len(), array_bytes!(v)),
            FfiArray::U8(v) => (dtype::U8, v.len(), array_bytes!(v)),
            FfiArray::U16(v) => (dtype::U16, v.len(), array_bytes!(v)),
            FfiArray::U32(v) => (dtype::U32, v.len(), array_bytes!(v)),
            FfiArray::U64(v) => (dtype::U64, v.len(), array_bytes!(v)),
            FfiArray::F32(v) => (dtype::F32, v.len(), array_bytes!(v)),
            FfiArray::F64(v) => (dtype::F64, v.len(), array_bytes!(v)),
        }
    }
}

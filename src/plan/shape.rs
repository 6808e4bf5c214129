//! Shapes and element types, mirroring `xla.ShapeProto`, `xla.PrimitiveType`
//! and `xla.ProgramShapeProto` (xla/xla_data.proto).

use serde::{Serialize, Serializer};

/// An XLA element type (`xla.PrimitiveType`), kept as its proto number so that
/// types added by newer XLA versions survive decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ElementType(pub i32);

/// (proto number, XLA name, size of one element in bits; 0 = not an array type).
const ELEMENT_TYPES: &[(i32, &str, u32)] = &[
    (0, "PRIMITIVE_TYPE_INVALID", 0),
    (1, "PRED", 8),
    (30, "S1", 1),
    (26, "S2", 2),
    (21, "S4", 4),
    (2, "S8", 8),
    (3, "S16", 16),
    (4, "S32", 32),
    (5, "S64", 64),
    (31, "U1", 1),
    (27, "U2", 2),
    (22, "U4", 4),
    (6, "U8", 8),
    (7, "U16", 16),
    (8, "U32", 32),
    (9, "U64", 64),
    (10, "F16", 16),
    (11, "F32", 32),
    (16, "BF16", 16),
    (12, "F64", 64),
    (19, "F8E5M2", 8),
    (28, "F8E4M3", 8),
    (20, "F8E4M3FN", 8),
    (23, "F8E4M3B11FNUZ", 8),
    (29, "F8E3M4", 8),
    (24, "F8E5M2FNUZ", 8),
    (25, "F8E4M3FNUZ", 8),
    (32, "F4E2M1FN", 4),
    (33, "F8E8M0FNU", 8),
    (35, "F6E3M2FN", 6),
    (36, "F6E2M3FN", 6),
    (15, "C64", 64),
    (18, "C128", 128),
    (13, "TUPLE", 0),
    (14, "OPAQUE_TYPE", 0),
    (17, "TOKEN", 0),
    (34, "BUFFER", 0),
];

impl ElementType {
    pub const PRED: Self = Self(1);
    pub const S32: Self = Self(4);
    pub const U64: Self = Self(9);
    pub const F32: Self = Self(11);
    pub const BF16: Self = Self(16);
    pub const TUPLE: Self = Self(13);
    pub const TOKEN: Self = Self(17);

    /// XLA's upper-case name (`"F32"`, `"BF16"`, `"TUPLE"`), or `None` for a
    /// number this build does not know.
    pub fn name(self) -> Option<&'static str> {
        ELEMENT_TYPES.iter().find(|e| e.0 == self.0).map(|e| e.1)
    }

    /// Size of one element in bits (4 for S4, 32 for F32); `None` for
    /// non-array types (tuple, token, opaque) and unknown numbers.
    pub fn bit_width(self) -> Option<u32> {
        ELEMENT_TYPES
            .iter()
            .find(|e| e.0 == self.0)
            .map(|e| e.2)
            .filter(|&b| b > 0)
    }
}

impl Serialize for ElementType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.name() {
            Some(n) => s.serialize_str(n),
            None => s.serialize_i32(self.0),
        }
    }
}

/// XLA's `Layout::kHostMemorySpace`: an array in host memory.
pub const HOST_MEMORY_SPACE: i64 = 5;

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// `xla.ShapeProto`: an array shape, or a tuple of shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Element type; `TUPLE` for tuples (then `tuple_shapes` holds the parts).
    pub element_type: ElementType,
    /// Size of each dimension, dimension 0 first (an upper bound when the
    /// dimension is dynamic). Empty for scalars and tuples.
    pub dimensions: Vec<i64>,
    /// Per dimension: is it dynamically sized. Empty = all static.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub is_dynamic_dimension: Vec<bool>,
    /// Parts of a tuple shape.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tuple_shapes: Vec<Shape>,
    /// Layout `minor_to_major` (dimension numbers, most minor first); `None`
    /// when the proto had no layout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_to_major: Option<Vec<i64>>,
    /// The layout's memory space: 0 device memory, [`HOST_MEMORY_SPACE`]
    /// host memory (XLA's `Layout::kHostMemorySpace`: host offload).
    #[serde(skip_serializing_if = "is_zero")]
    pub memory_space: i64,
}

impl Shape {
    pub fn is_tuple(&self) -> bool {
        self.element_type == ElementType::TUPLE
    }

    /// Number of elements of an array shape (1 for a scalar); `None` for
    /// tuples or on overflow.
    pub fn element_count(&self) -> Option<u64> {
        if self.is_tuple() {
            return None;
        }
        self.dimensions.iter().try_fold(1u64, |acc, &d| {
            u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        })
    }

    /// Dense byte size of an array shape (sub-byte types rounded up), or
    /// `None` for tuples / unknown element types.
    pub fn byte_size(&self) -> Option<u64> {
        let bits = u64::from(self.element_type.bit_width()?);
        Some(self.element_count()?.checked_mul(bits)?.div_ceil(8))
    }
}

/// `xla.ProgramShapeProto`: the entry computation's signature.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProgramShape {
    /// One shape per entry parameter, in parameter-number order.
    pub parameters: Vec<Shape>,
    /// The result shape (a tuple when the program returns several values).
    pub result: Shape,
    /// Parameter names, parallel to `parameters` (may be empty).
    pub parameter_names: Vec<String>,
}

//! XLA `PrimitiveType` numbers of the element types the device layer's
//! engines take (`xla.PrimitiveType`).

pub const S8: i32 = 2;
pub const S32: i32 = 4;
pub const F16: i32 = 10;
pub const F32: i32 = 11;
pub const F64: i32 = 12;
pub const C64: i32 = 15;
pub const BF16: i32 = 16;
pub const C128: i32 = 18;
pub const F8E5M2: i32 = 19;
pub const F8E4M3FN: i32 = 20;
/// MI300's FP8 types (ROCm).
pub const F8E5M2FNUZ: i32 = 24;
pub const F8E4M3FNUZ: i32 = 25;

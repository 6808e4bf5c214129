//! The vendor XLA GPU plugin as a compiler (and its runtime as the fallback): found, loaded, driven
//! through its C API.

pub mod compiler;
pub mod executable;
pub mod locate;

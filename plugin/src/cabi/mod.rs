//! What crosses the C boundary: caller memory, handles, errors, the options and device assignments the
//! caller passes, buffer types and memory kinds, the key-value store, the FFI extension's state, the
//! stats and crash report exported for Python.

pub mod assignment;
pub(crate) mod caller;
pub mod crash;
pub mod dtype;
pub mod error;
pub mod ffi_state;
pub mod handles;
pub mod kv;
pub mod memory_kind;
pub mod options;
pub mod stats;

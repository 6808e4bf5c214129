//! The C entry points: the `PJRT_Api` table, what every entry does around the Rust function, the plugin's own
//! entries and its extensions (FFI, profiler).

pub(crate) mod entry;
pub mod execute_context;
pub(crate) mod plugin;
pub mod profiler;
pub(crate) mod table;

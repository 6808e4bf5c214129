//! The XLA FFI tables our runtime's custom calls see, and the handlers served through them (host
//! callbacks, Mosaic GPU kernels).

pub mod api;
pub mod host_compute;
pub mod mosaic;

//! Each device's context on the xla-vmm runtime (memory, streams, programs, completions, staging,
//! collectives), in safe Rust.
#![forbid(unsafe_code)]

pub mod collectives;
pub mod completion;
pub mod context;
pub mod event;
pub mod handle;
pub mod program;
pub mod staging;
pub(crate) mod watchdog;

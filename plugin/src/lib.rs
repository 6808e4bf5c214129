//! xla-vmm PJRT plugin: JAX runs jit programs on the xla-vmm runtime.
//!
//! A `cdylib` exporting `GetPjrtApi`, which returns one static, fully
//! populated [`PJRT_Api`](xla_vmm_ffi::pjrt::PJRT_Api) table (PJRT C API
//! 0.114, `struct_size` the real size).
//!
//! Where to start reading:
//! - `api.rs`: the table, one line per entry (implemented or `none`).
//! - `entry.rs`: what every entry does before and after the Rust function
//!   (null / `struct_size` checks, `catch_unwind`, error mapping).
//! - `handles.rs`: how C pointers are validated (a registry of live objects,
//!   looked up before any dereference).
//! - `cabi.rs`: the only module that reads or writes caller memory.
//! - `client.rs`, `device.rs`, `buffer.rs`, `event.rs`: the objects.
//! - `executable.rs` (compile, load, run one device's step), `execute.rs`
//!   (the `Execute` entry) and `exec_queries.rs` (what JAX asks of an
//!   executable); `program.rs`: the runtime behind a trait.
//! - Several devices and processes: `assignment.rs` (device assignments),
//!   `worker.rs` (a thread per device for multi-device steps),
//!   `collectives.rs` (the runtime's cliques), `kv.rs` (the
//!   `jax.distributed` key-value store: topology and clique ids),
//!   `remote.rs` (other processes' devices).
//! - `devmem.rs`: device memory, from the project's `VmmAllocator`.
//! - `vendor_locate.rs`, `vendor.rs`: finding and driving the vendor XLA GPU
//!   plugin as a compiler only (compile → `PJRT_Executable_Serialize` bytes);
//!   `vendor_exec.rs`: its executables (compiled, loaded, or run on the
//!   vendor runtime as the fallback).
//! - `execute_context.rs`: the FFI extension's entries; `ffi_state.rs` what
//!   they keep (execute contexts, pending handler registrations);
//!   `xla_ffi_api.rs`: the XLA FFI API our runtime's custom calls see;
//!   `profiler.rs`: the profiler extension (traces in `jax.profiler`).
//!
//! Imports run one way: no module imports one that imports it back.
//!
//! Who validates what: the entry layer checks the args struct; each
//! implementation validates the handles it receives (`Handle::from_c`) and
//! the shapes, strides and sizes; the device layer checks ranges and driver
//! results. Nothing reachable from C panics on bad input; a panic anyway is
//! caught and returned as `INTERNAL`.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]
// Patterns match the C header's constant names (`PJRT_Buffer_Type_F32`).
#![allow(non_upper_case_globals)]

mod api;
pub mod assignment;
pub mod buffer;
mod cabi;
pub mod client;
pub mod collectives;
pub mod completion;
pub mod crash;
pub mod device;
pub mod devmem;
pub mod dtype;
mod entry;
pub mod error;
pub mod event;
pub mod exec_queries;
pub mod executable;
pub mod execute;
pub mod execute_context;
pub mod ffi_state;
pub mod handles;
pub mod host_compute;
pub mod kv;
pub mod memory_kind;
pub mod mosaic;
pub mod options;
mod plugin;
pub mod profiler;
pub mod program;
pub mod remote;
pub mod staging;
pub mod stats;
pub mod topology;
pub mod vendor;
pub mod vendor_exec;
pub mod vendor_locate;
mod watchdog;
pub mod worker;
pub mod xla_ffi_api;

#[doc(hidden)]
pub use api::raw;
pub use api::ENTRIES;
#[doc(hidden)]
pub use entry::RawEntry;
pub use xla_vmm_ffi::pjrt;

/// The PJRT entry point jaxlib looks up after `dlopen`.
// SAFETY (no_mangle): `GetPjrtApi` is the one symbol the PJRT plugin
// protocol requires; no other library in the process exports it from us.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn GetPjrtApi() -> *const pjrt::PJRT_Api {
    &api::API.0
}

/// Counts of live C-visible objects, for leak checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveObjects {
    pub buffers: usize,
    pub events: usize,
    pub errors: usize,
}

pub fn live_objects() -> LiveObjects {
    LiveObjects {
        buffers: buffer::live_buffers(),
        events: event::live_events(),
        errors: error::live_errors(),
    }
}

/// Install a `tracing` subscriber with `process`'s filter (`XLA_VMM_LOG`,
/// e.g. `info`, `xla_vmm_plugin=debug`; default `warn`, so fallbacks and
/// hangs are reported), once, unless the host process installed one. Colour
/// only on a terminal (not in a log file or a CI log), and never under
/// `NO_COLOR` (no-color.org).
pub fn init_logging(process: &options::ProcessOptions) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(&process.log_filter))
            .with_writer(std::io::stderr)
            .with_ansi(process.color)
            .try_init();
    });
}

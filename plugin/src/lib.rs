//! xla-vmm PJRT plugin: JAX runs jit programs on the xla-vmm runtime.
//!
//! A `cdylib` exporting `GetPjrtApi`, which returns one static, fully
//! populated [`PJRT_Api`](xla_vmm_ffi::pjrt::PJRT_Api) table (PJRT C API
//! 0.114, `struct_size` the real size).
//!
//! The crate is in wings by role; imports run one way, from the top wing
//! down (no module imports one that imports it back):
//! - `api/`: the C entry points. `table.rs` is the table, one line per
//!   entry (implemented or `none`); `entry.rs` what every entry does before
//!   and after the Rust function (null / `struct_size` checks,
//!   `catch_unwind`, error mapping); `plugin.rs` the plugin's own entries;
//!   `execute_context.rs` the FFI extension's entries; `profiler.rs` the
//!   profiler extension (traces in `jax.profiler`).
//! - `objects/`: the PJRT objects, in safe Rust: `client.rs`, `device.rs`,
//!   `topology.rs`, `buffer.rs`; `executable.rs` (compile, load, run one
//!   device's step), `execute.rs` (the `Execute` entry), `exec_queries.rs`
//!   (what JAX asks of an executable); `worker.rs` (a thread per device for
//!   multi-device steps), `remote.rs` (other processes' devices).
//! - `runtime/`: each device's context on our runtime, in safe Rust:
//!   `context.rs` (memory from the project's `VmmAllocator`, streams,
//!   programs), `program.rs` (the runtime behind a trait), `completion.rs`
//!   and `event.rs` (asynchronous work and its `PJRT_Event`s),
//!   `staging.rs`, `collectives.rs` (the runtime's cliques), `watchdog.rs`.
//! - `xla_ffi/`: the XLA FFI API our runtime's custom calls see (`api.rs`),
//!   host callbacks (`host_compute.rs`), Mosaic GPU kernels (`mosaic.rs`).
//! - `vendor_plugin/`: the vendor XLA GPU plugin as a compiler only: `locate.rs`
//!   finds it, `compiler.rs` drives it (compile → `PJRT_Executable_Serialize`
//!   bytes), `executable.rs` its executables (compiled, loaded, or run on the
//!   vendor runtime as the fallback).
//! - `cabi/`: what crosses the C boundary: `caller.rs` (the only module
//!   that reads or writes caller memory), `handles.rs` (C pointers validated
//!   against a registry of live objects before any dereference), `error.rs`,
//!   `options.rs` (client options, the environment as fallback: the front
//!   door of configuration), `assignment.rs` (device assignments), `dtype.rs`
//!   and `memory_kind.rs` (buffer types, memory kinds), `kv.rs` (the
//!   `jax.distributed` key-value store), `ffi_state.rs` (what the FFI
//!   extension keeps), `stats.rs` (`stats()` / `report()` for Python),
//!   `crash.rs` (the opt-in crash report).
//!
//! Unsafe code lives in `api/`, `cabi/`, `xla_ffi/` and `vendor_plugin/` (the
//! C ABI both ways and the FFI tables); `objects/` and `runtime/` forbid it.
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

pub mod api;
pub mod cabi;
pub mod objects;
pub mod runtime;
pub mod vendor_plugin;
pub mod xla_ffi;

#[doc(hidden)]
pub use api::entry::RawEntry;
#[doc(hidden)]
pub use api::table::raw;
pub use api::table::ENTRIES;
pub use xla_vmm_ffi::pjrt;

/// The PJRT entry point jaxlib looks up after `dlopen`.
// SAFETY (no_mangle): `GetPjrtApi` is the one symbol the PJRT plugin
// protocol requires; no other library in the process exports it from us.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn GetPjrtApi() -> *const pjrt::PJRT_Api {
    &api::table::API.0
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
        buffers: objects::buffer::live_buffers(),
        events: runtime::event::live_events(),
        errors: cabi::error::live_errors(),
    }
}

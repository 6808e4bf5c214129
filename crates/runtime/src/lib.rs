//! xla-vmm runtime: execute decoded XLA GPU executables ([`xla_vmm::Plan`])
//! on any [`xla_vmm_device::Backend`], eagerly or as one captured graph.
//!
//! Where to start reading:
//! - [`RunConfig`] (config.rs): how programs run, resolved once at a front
//!   door (the plugin's client options, the CLI's flags).
//! - [`Executable`] (executable.rs): load a plan, bind parameters, run,
//!   outputs. The execution API, over an immutable [`Program`] (program.rs:
//!   what loading builds) and one runner per mode (eager inline,
//!   recapture.rs, vastable.rs) and the never-slower guard that picks
//!   among them (guard.rs).
//! - [`ops`]: loading: kernels resolved, GEMM plans prepared, unsupported
//!   thunks rejected at load time (naming kind and `profile_annotation`).
//! - [`exec`]: the thunk semantics (XLA's `*_thunk.cc`, re-implemented).
//! - [`collective`]: device assignment, participants, communicators
//!   ([`Cliques`]) and the collective ops (issue 7).
//! - [`slots`]: slot → address resolution in one place ([`SlotTable`]).
//! - [`dynamic_slice`]: dynamic-slice-fusion windows; [`gemm`]: GEMM config mapping;
//!   [`npz`]: `.npz` input/output files.
//!
//! Who validates what: the decoder checks slices against allocation sizes;
//! the loader checks kinds, kernel names, packing specs and launch
//! dimensions; the slot table checks every resolved slice against the bound
//! size; the backend checks handles and driver results.
#![deny(unsafe_code)]

pub mod binding;
pub mod collective;
pub mod config;
pub mod conv;
pub mod copykernel;
pub mod custom_call;
pub mod dynamic_slice;
pub mod elf;
pub mod error;
pub mod exec;
pub mod executable;
pub mod fft;
pub mod gemm;
pub mod guard;
pub mod host_execute;
pub mod mode;
pub mod npz;
pub mod ops;
pub mod params;
mod per_device;
pub mod program;
mod recapture;
pub mod report;
pub mod residency;
pub mod selectk;
pub mod slots;
pub mod staging;
mod temps;
pub mod trace;
pub mod trsm;
pub mod vastable;

pub use binding::{BindingConfig, BindingStats, CopyPath, Probe, RemapSource, UserBuffer};
pub use collective::{Cliques, CollectiveEnv, DeviceAssignment, IdExchange, LocalExchange};
pub use config::{OptionSpec, RunConfig, OPTIONS};
pub use custom_call::{
    BoundCall, CallBuffer, CallContext, CallScratch, CallSite, CustomCallRegistry, Invocation,
};
pub use error::{Result, RuntimeError};
pub use executable::{Executable, Mode, Output, Reclaimed};
pub use guard::{GuardReport, Runner, SecondLook};
pub use host_execute::{HostArray, HostArrayMut, HostProgram};
pub use program::Program;
pub use slots::{DeviceBuffer, Redirect, SlotTable};
pub use staging::StagingSummary;
pub use xla_vmm_policy::Threshold;

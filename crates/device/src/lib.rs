//! xla-vmm device layer.
//!
//! - [`backend`]: the [`Backend`] trait (the driver contract; start reading here).
//! - [`budget`]: where physical memory lives (device or host) and the
//!   device's memory budget every allocation goes through.
//! - [`host`]: a backend on host memory that emulates VMM (granularity, VA
//!   ranges, mappings) and its failure modes, and really moves bytes: all
//!   code above the backend is tested on it in CI.
//! - `cuda` (feature `cuda`): NVIDIA, on cudarc. `hip` (feature `hip`): AMD,
//!   compiled in CI, unverified on hardware.
//! - [`vmm`]: the VMM allocator (allocation ids, stream-ordered frees,
//!   sub-allocation of small buffers), generic over the backend.
//! - [`conformance`]: one suite of backend checks, run on every backend.
//!
//! Unsafe code and raw driver calls live only in the backend modules (`cuda`,
//! `hip`, and `nccl_common`: the NCCL/RCCL communicator both share).

pub mod backend;
pub mod blas;
pub mod budget;
pub mod capture_gate;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod checks;
pub mod collective;
pub mod conformance;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;
pub mod dnn;
pub mod error;
pub mod fft;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod fft_lib;
#[cfg(feature = "hip")]
#[allow(unsafe_code)]
pub mod hip;
pub mod host;
mod libsearch;
#[cfg(any(feature = "cuda", feature = "hip"))]
#[allow(unsafe_code)]
mod nccl_common;
pub mod probe;
mod ptr;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod trsm_lib;
pub mod vmm;
pub mod xla_type;

pub use backend::{
    merge_copies, Backend, DeviceInfo, DevicePtr, EventStatus, ImageKind, LaunchConfig,
    TensorMapDesc,
};
pub use budget::{MemLocation, MemoryBudget, MemoryLimits, MemoryUsage};
pub use collective::{CliqueId, CommType, Communicator, ReduceOp};
pub use error::{DeviceError, Result};
pub use host::{HostBackend, HostConfig};
pub use vmm::{AllocationId, Buffer, VmmAllocator, VmmConfig, VmmStats};
/// The process settings of the layers below the front doors (library
/// overrides, timeouts): installed by a front door, read once.
pub use xla_vmm_ffi::settings;

//! Handle types of the CUDA backend (the `safe` layer for what cudarc leaves
//! raw). Each carries the id of the backend that made it, so a handle from
//! another backend instance is rejected instead of reaching the driver.
//!
//! Releasing is explicit (`Backend::*_release/destroy/free`, which return
//! `Result`); a handle dropped without release leaks its driver object, it
//! never frees it twice. Modules are the exception: functions keep their
//! module alive (`Arc`), so unloading happens when the last user is gone and
//! a launch can never reach an unloaded module.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent as RawEvent, CudaStream as RawStream};
use xla_vmm_ffi::cuda::driver as sys;

/// A physical allocation (`cuMemCreate`).
#[derive(Debug)]
pub struct CudaPhysMem {
    pub(super) owner: u64,
    pub(super) handle: sys::CUmemGenericAllocationHandle,
    pub(super) bytes: u64,
    pub(super) location: crate::budget::MemLocation,
}

/// A VA reservation (`cuMemAddressReserve`).
#[derive(Debug)]
pub struct CudaVaRange {
    pub(super) owner: u64,
    pub(super) base: sys::CUdeviceptr,
    pub(super) bytes: u64,
}

/// A non-blocking stream (cudarc's RAII stream).
#[derive(Debug)]
pub struct CudaStream {
    pub(super) owner: u64,
    pub(super) inner: Arc<RawStream>,
}

impl CudaStream {
    /// The raw stream, for FFI callers in this crate (cuBLASLt).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }
}

/// An event created with timing enabled (cudarc's RAII event).
pub struct CudaEvent {
    pub(super) owner: u64,
    pub(super) inner: RawEvent,
}

impl std::fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEvent")
            .field("owner", &self.owner)
            .field("event", &self.inner.cu_event())
            .finish()
    }
}

/// Page-locked host memory (`cuMemHostAlloc`).
#[derive(Debug)]
pub struct CudaHostBuffer {
    pub(super) owner: u64,
    /// Null only when `len == 0`.
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; shared access
// only hands out `&[u8]` (through `&self`) and mutation needs `&mut self`.
unsafe impl Send for CudaHostBuffer {}
// SAFETY: see `Send`; no interior mutability.
unsafe impl Sync for CudaHostBuffer {}

/// A loaded module; unloaded when the last handle to it (module or function)
/// is dropped.
#[derive(Debug)]
pub(super) struct ModuleInner {
    pub(super) module: sys::CUmodule,
    pub(super) ctx: Arc<CudaContext>,
}

// SAFETY: a CUmodule may be used from any thread once its context is current
// (every use binds the context first); it is only unloaded in Drop.
unsafe impl Send for ModuleInner {}
// SAFETY: see `Send`; the driver synchronizes concurrent use of a module.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        let r = self.ctx.bind_to_thread().and_then(|()| {
            // SAFETY: the module is live (we own it) and no function handle
            // exists any more (they hold an Arc to us).
            unsafe { cudarc::driver::result::module::unload(self.module) }
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "cuModuleUnload failed in drop");
            self.ctx.record_err::<()>(Err(e));
        }
    }
}

#[derive(Debug)]
pub struct CudaModule {
    pub(super) owner: u64,
    pub(super) inner: Arc<ModuleInner>,
}

/// A kernel; keeps its module loaded.
#[derive(Debug, Clone)]
pub struct CudaFunction {
    pub(super) owner: u64,
    pub(super) func: sys::CUfunction,
    /// Byte size of each kernel parameter (from `cuFuncGetParamInfo`).
    pub(super) params: Arc<[usize]>,
    pub(super) _module: Arc<ModuleInner>,
}

// SAFETY: a CUfunction is an immutable driver handle valid while its module
// is loaded, which `_module` guarantees.
unsafe impl Send for CudaFunction {}
// SAFETY: see `Send`.
unsafe impl Sync for CudaFunction {}

/// A captured graph (`cuStreamEndCapture`).
#[derive(Debug)]
pub struct CudaGraph {
    pub(super) owner: u64,
    pub(super) graph: sys::CUgraph,
}

// SAFETY: a CUgraph may be moved between threads; it is not Sync (the driver
// does not synchronize graph mutation) and the trait does not require it.
unsafe impl Send for CudaGraph {}

/// An instantiated graph.
#[derive(Debug)]
pub struct CudaGraphExec {
    pub(super) owner: u64,
    pub(super) exec: sys::CUgraphExec,
}

// SAFETY: as `CudaGraph`.
unsafe impl Send for CudaGraphExec {}

/// A node of a captured graph (`cuGraphGetNodes`): a name for the same node
/// in the graphs instantiated from it.
#[derive(Clone, Debug)]
pub struct CudaGraphNode {
    pub(super) owner: u64,
    pub(super) node: sys::CUgraphNode,
}

// SAFETY: only used as an identifier passed back to the driver together
// with its graph exec; never dereferenced by us.
unsafe impl Send for CudaGraphNode {}
// SAFETY: see `Send`.
unsafe impl Sync for CudaGraphNode {}

use crate::checks::owned;

owned!(
    CudaPhysMem,
    CudaVaRange,
    CudaStream,
    CudaEvent,
    CudaHostBuffer,
    CudaModule,
    CudaFunction,
    CudaGraph,
    CudaGraphExec,
    CudaGraphNode
);

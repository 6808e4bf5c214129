//! Handle types of the HIP backend (mirrors `cuda/handles.rs`). Each carries
//! the id of the backend that made it, so a handle from another backend
//! instance is rejected instead of reaching the runtime.
//!
//! Releasing is explicit and returns `Result`; a handle dropped without
//! release leaks, it never frees twice. Modules stay loaded while any of
//! their functions exists (`Arc`).

use std::sync::Arc;

use xla_vmm_ffi::hip::runtime as sys;

/// A physical allocation (`hipMemCreate`).
#[derive(Debug)]
pub struct HipPhysMem {
    pub(super) owner: u64,
    pub(super) handle: sys::hipMemGenericAllocationHandle_t,
    pub(super) bytes: u64,
    pub(super) location: crate::budget::MemLocation,
}

/// A VA reservation (`hipMemAddressReserve`).
#[derive(Debug)]
pub struct HipVaRange {
    pub(super) owner: u64,
    pub(super) base: u64,
    pub(super) bytes: u64,
}

/// A non-blocking stream.
#[derive(Debug)]
pub struct HipStream {
    pub(super) owner: u64,
    pub(super) raw: sys::hipStream_t,
}

impl HipStream {
    /// The raw stream, for FFI callers in this crate (hipBLASLt).
    pub fn hip_stream(&self) -> sys::hipStream_t {
        self.raw
    }
}

/// An event with timing enabled.
#[derive(Debug)]
pub struct HipEvent {
    pub(super) owner: u64,
    pub(super) raw: sys::hipEvent_t,
}

/// Page-locked host memory (`hipHostMalloc`).
#[derive(Debug)]
pub struct HipHostBuffer {
    pub(super) owner: u64,
    /// Null only when `len == 0`.
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

/// A loaded code object; unloaded when the last handle to it is dropped.
#[derive(Debug)]
pub(super) struct ModuleInner {
    pub(super) module: sys::hipModule_t,
    pub(super) ordinal: i32,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: the module is live (we own it), no function handle exists
        // any more (they hold an Arc to us), and the ordinal is valid.
        let r = unsafe {
            super::result::device::set(self.ordinal)
                .and_then(|()| super::result::module::unload(self.module))
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "hipModuleUnload failed in drop");
        }
    }
}

#[derive(Debug)]
pub struct HipModule {
    pub(super) owner: u64,
    pub(super) inner: Arc<ModuleInner>,
}

/// A kernel; keeps its module loaded.
#[derive(Debug, Clone)]
pub struct HipFunction {
    pub(super) owner: u64,
    pub(super) func: sys::hipFunction_t,
    pub(super) _module: Arc<ModuleInner>,
}

/// A captured graph.
#[derive(Debug)]
pub struct HipGraph {
    pub(super) owner: u64,
    pub(super) graph: sys::hipGraph_t,
}

/// An instantiated graph.
#[derive(Debug)]
pub struct HipGraphExec {
    pub(super) owner: u64,
    pub(super) exec: sys::hipGraphExec_t,
}

/// A node of a captured graph (`hipGraphGetNodes`): a name for the same
/// node in the graphs instantiated from it.
#[derive(Clone, Debug)]
pub struct HipGraphNode {
    pub(super) owner: u64,
    pub(super) node: sys::hipGraphNode_t,
}

// SAFETY (all impls below): these wrap HIP runtime handles, which the
// runtime allows to be used from any thread (the backend selects the device
// on the calling thread first). Host buffers are plain memory owned by the
// value; mutation needs `&mut`. Graphs are Send only: the runtime does not
// synchronize concurrent use of one graph.
unsafe impl Send for HipPhysMem {}
// SAFETY: see the note above these impls.
unsafe impl Sync for HipPhysMem {}
// SAFETY: see the note above these impls.
unsafe impl Send for HipStream {}
// SAFETY: see the note above these impls.
unsafe impl Sync for HipStream {}
// SAFETY: see the note above these impls.
unsafe impl Send for HipEvent {}
// SAFETY: see the note above these impls.
unsafe impl Sync for HipEvent {}
// SAFETY: see the note above these impls.
unsafe impl Send for HipHostBuffer {}
// SAFETY: see the note above these impls.
unsafe impl Sync for HipHostBuffer {}
// SAFETY: see the note above these impls.
unsafe impl Send for ModuleInner {}
// SAFETY: see the note above these impls.
unsafe impl Sync for ModuleInner {}
// SAFETY: only an identifier passed back to the runtime with its graph exec.
unsafe impl Send for HipGraphNode {}
// SAFETY: as `Send`.
unsafe impl Sync for HipGraphNode {}
// SAFETY: see the note above these impls.
unsafe impl Send for HipFunction {}
// SAFETY: see the note above these impls.
unsafe impl Sync for HipFunction {}
// SAFETY: see the note above these impls.
unsafe impl Send for HipGraph {}
// SAFETY: see the note above these impls.
unsafe impl Send for HipGraphExec {}

use crate::checks::owned;

owned!(
    HipPhysMem,
    HipVaRange,
    HipStream,
    HipEvent,
    HipHostBuffer,
    HipModule,
    HipFunction,
    HipGraph,
    HipGraphExec,
    HipGraphNode
);

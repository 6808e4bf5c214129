//! The backend contract: what the runtime needs from a GPU driver, no more.
//!
//! One trait, [`Backend`], names the handle types (physical memory, VA range,
//! stream, event, pinned host memory, module, function, graph, graph exec) and
//! the operations on them. A backend object stands for **one device** (one
//! ordinal) with its driver context; every method may be called from any
//! thread (the backend makes its context current itself).
//!
//! # Who validates what
//! - The backend validates handles (a handle from another backend instance, or
//!   one already released, is an error, never UB), ranges (offset + size inside
//!   the VA range, granularity alignment of VMM calls) and driver results.
//! - The caller (allocator, runtime) owns ordering: a range must not be
//!   unmapped while queued GPU work still uses it (`cuMemUnmap` is **not**
//!   stream ordered), host memory given to an async copy must stay untouched
//!   until an event recorded after the copy has completed.
//! - Handles are plain values; releasing is explicit and returns `Result`.
//!   RAII wrappers live one layer up (`crate::vmm`), where teardown order is
//!   enforced by ownership and errors in `Drop` are recorded, not lost.
//!
//! # Extending the trait
//! A method added after the first version gets a default body that returns
//! [`DeviceError::Unsupported`], so every backend keeps compiling (or, where
//! the older methods can express it, a working default: see
//! [`Backend::copy_d2d_batch`]).

use crate::budget::{MemLocation, MemoryBudget};
use crate::error::{DeviceError, Result};
pub use crate::ptr::DevicePtr;

/// Sort `(dst, src, bytes)` copies by destination, drop empty ones and merge
/// neighbours that are contiguous on both sides (`a.dst + a.bytes == b.dst`
/// and `a.src + a.bytes == b.src`) into one copy.
pub fn merge_copies(copies: &[(DevicePtr, DevicePtr, u64)]) -> Vec<(DevicePtr, DevicePtr, u64)> {
    let mut sorted: Vec<_> = copies.iter().copied().filter(|c| c.2 > 0).collect();
    sorted.sort_by_key(|c| (c.0, c.1));
    let mut out: Vec<(DevicePtr, DevicePtr, u64)> = Vec::with_capacity(sorted.len());
    for (d, s, n) in sorted {
        match out.last_mut() {
            Some((ld, ls, ln))
                if ld.0.checked_add(*ln) == Some(d.0) && ls.0.checked_add(*ln) == Some(s.0) =>
            {
                *ln += n
            }
            _ => out.push((d, s, n)),
        }
    }
    out
}

/// Static facts about the device, read once at backend creation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    /// Backend name: "cuda", "hip" or "host".
    pub backend: &'static str,
    pub ordinal: usize,
    pub name: String,
    /// (major, minor): compute capability on CUDA, gfx version on ROCm.
    pub compute_capability: (u32, u32),
    /// e.g. "gfx942" on ROCm; empty on CUDA.
    pub arch_name: String,
    pub multiprocessor_count: u32,
    pub total_memory: u64,
    /// VMM allocation granularity (minimum, in bytes): 2 MiB on H200.
    pub vmm_granularity: u64,
    /// Peak memory bandwidth from device attributes (bytes/s):
    /// 2 × memory clock × bus width / 8.
    pub memory_bandwidth: f64,
    /// Does the device support VMM (cuMemCreate / hipMemCreate)?
    pub vmm_supported: bool,
    /// Does the driver support conditional (IF/WHILE) graph nodes?
    pub conditional_nodes: bool,
    /// Are conditionals (`Backend::capture_case`: one IF node per branch)
    /// captured into graphs? Else a program with one runs eager.
    pub case_nodes: bool,
    /// Can an event recorded while a stream captures become a node of the
    /// graph, recorded again at every replay
    /// ([`Backend::event_record_in_graph`])? Else graphs are not timed.
    pub graph_event_records: bool,
}

/// Kind of a module image.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// CUDA cubin / fatbin (ELF).
    Cubin,
    /// CUDA PTX text (JIT-compiled by the driver).
    Ptx,
    /// ROCm code object.
    Hsaco,
    /// HIP C++ source of our own kernels, compiled by the HIP backend for
    /// the device it runs on (hiprtc), as the CUDA driver compiles PTX.
    HipSource,
    /// A module of the host backend: a list of registered host kernel names.
    Host,
}

/// Launch geometry and attributes of one kernel launch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Thread-block cluster dims (Hopper); `None` = no cluster attribute.
    pub cluster: Option<[u32; 3]>,
    pub shared_mem_bytes: u32,
    /// Programmatic dependent launch (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION).
    pub pdl: bool,
}

impl LaunchConfig {
    /// What [`Backend::graph_exec_kernel_update`] accepts: a non-zero grid
    /// and block, no cluster, no programmatic dependent launch (node
    /// parameters cannot carry launch attributes).
    pub fn check_node_update(&self) -> Result<()> {
        if self.cluster.is_some() || self.pdl {
            return Err(DeviceError::Unsupported(
                "kernel node updates with cluster or PDL attributes".into(),
            ));
        }
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(DeviceError::InvalidArgument(format!(
                "kernel node update: grid {:?} / block {:?} has a zero dimension",
                self.grid, self.block
            )));
        }
        Ok(())
    }
}

/// Parameters of a tiled TMA descriptor (`cuTensorMapEncodeTiled`), as XLA's
/// `TmaDescriptorProto` gives them. Enum fields use the proto numbers, which
/// equal CUDA's enum values.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TensorMapDesc {
    /// Bytes per element (1, 2, 4, 8): the tensor map's unsigned data type.
    pub element_size: u64,
    /// Global dims, innermost first (elements).
    pub global_dims: Vec<u64>,
    /// Global strides in bytes, one fewer than dims.
    pub global_strides: Vec<u64>,
    pub box_dims: Vec<u32>,
    pub element_strides: Vec<u32>,
    pub interleave: i32,
    pub swizzle: i32,
    pub l2_promotion: i32,
    pub float_oob_fill: i32,
}

/// Status of an event.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EventStatus {
    /// All work captured by the event has completed.
    Complete,
    /// Work is still pending.
    Pending,
}

/// The driver surface the runtime needs. See the module docs for the contract.
///
/// Sizes and offsets are in bytes. VMM calls (`map`, `unmap`, `set_access`)
/// take offsets and sizes that are multiples of [`DeviceInfo::vmm_granularity`].
pub trait Backend: Send + Sync + 'static {
    /// A physical allocation (cuMemCreate / hipMemCreate).
    type PhysMem: Send + Sync + std::fmt::Debug;
    /// A reserved virtual address range (cuMemAddressReserve).
    type VaRange: Send + Sync + std::fmt::Debug;
    type Stream: Send + Sync + std::fmt::Debug;
    type Event: Send + Sync + std::fmt::Debug;
    /// Page-locked host memory, usable for async H2D / D2H copies.
    type HostBuffer: Send + Sync + std::fmt::Debug;
    type Module: Send + Sync + std::fmt::Debug;
    /// A kernel inside a loaded module. Cheap to clone.
    type Function: Send + Sync + Clone + std::fmt::Debug;
    /// A captured (not yet instantiated) graph.
    type Graph: Send + std::fmt::Debug;
    /// An instantiated, launchable graph.
    type GraphExec: Send + std::fmt::Debug;
    /// A node of a captured graph: names the same node in every graph
    /// instantiated from it (see [`Backend::graph_exec_kernel_update`]).
    type GraphNode: Send + Sync + Clone + std::fmt::Debug;

    // ---- device facts ----------------------------------------------------
    fn info(&self) -> &DeviceInfo;
    /// (free, total) device memory in bytes, right now.
    fn mem_info(&self) -> Result<(u64, u64)>;

    // ---- VMM: physical memory, VA ranges, mappings ---------------------
    /// The device's memory budget: every [`Backend::mem_create`] and
    /// [`Backend::mem_create_at`] goes through it.
    fn budget(&self) -> &MemoryBudget;
    /// Create `bytes` (multiple of granularity) of physical memory at
    /// `location`, whatever the budget says (the backends' own call; use
    /// [`Backend::mem_create`]). [`MemLocation::Host`] is unsupported where
    /// the driver cannot create host-located memory.
    fn mem_create_raw(&self, bytes: u64, location: MemLocation) -> Result<Self::PhysMem>;
    /// Release memory made by [`Backend::mem_create_raw`].
    fn mem_release_raw(&self, mem: Self::PhysMem) -> Result<()>;
    fn mem_size(&self, mem: &Self::PhysMem) -> u64;
    fn mem_location(&self, mem: &Self::PhysMem) -> MemLocation;

    /// Create `bytes` (multiple of granularity) of device memory for an
    /// ordinary allocation: within the device budget less the staging
    /// reserve ([`MemoryBudget::ordinary_device_ceiling`]), else out of
    /// memory saying which.
    fn mem_create_device(&self, bytes: u64) -> Result<Self::PhysMem> {
        let budget = self.budget();
        let ceiling = budget.ordinary_device_ceiling(self.info().total_memory);
        if !budget.try_take_below(MemLocation::Device, bytes, ceiling) {
            return Err(DeviceError::OutOfMemory {
                what: "the device memory limit, less the staging reserve, is reached".into(),
                bytes,
            });
        }
        self.mem_create_raw(bytes, MemLocation::Device)
            .inspect_err(|_| budget.give(MemLocation::Device, bytes))
    }

    /// Create `bytes` (multiple of granularity) of physical memory where the
    /// budget has room: [`Backend::mem_create_device`], else on the host
    /// (counted as a spill) up to the host limit, else out of memory.
    fn mem_create(&self, bytes: u64) -> Result<Self::PhysMem> {
        let why = match self.mem_create_device(bytes) {
            Ok(m) => return Ok(m),
            Err(DeviceError::OutOfMemory { what, .. }) => what,
            Err(e) => return Err(e),
        };
        let m = self
            .mem_create_at(bytes, MemLocation::Host)
            .map_err(|e| match e {
                DeviceError::Unsupported(_) | DeviceError::OutOfMemory { .. } => {
                    DeviceError::OutOfMemory {
                        what: format!("{why}; host memory: {e}"),
                        bytes,
                    }
                }
                e => e,
            })?;
        self.budget().note_spill(bytes, &why);
        Ok(m)
    }

    /// Create `bytes` of physical memory at `location`, within its limit.
    fn mem_create_at(&self, bytes: u64, location: MemLocation) -> Result<Self::PhysMem> {
        let budget = self.budget();
        if !budget.try_take(location, bytes) {
            return Err(DeviceError::OutOfMemory {
                what: budget.exhausted(bytes),
                bytes,
            });
        }
        self.mem_create_raw(bytes, location).inspect_err(|_| {
            budget.give(location, bytes);
        })
    }

    /// Release physical memory (and its share of the budget).
    fn mem_release(&self, mem: Self::PhysMem) -> Result<()> {
        let (bytes, location) = (self.mem_size(&mem), self.mem_location(&mem));
        let r = self.mem_release_raw(mem);
        if r.is_ok() {
            self.budget().give(location, bytes);
        }
        r
    }
    /// Reserve `bytes` of virtual address space aligned to `align` (0 = granularity).
    fn va_reserve(&self, bytes: u64, align: u64) -> Result<Self::VaRange>;
    fn va_free(&self, va: Self::VaRange) -> Result<()>;
    fn va_base(&self, va: &Self::VaRange) -> DevicePtr;
    fn va_size(&self, va: &Self::VaRange) -> u64;
    /// Map `bytes` of `mem` starting at `mem_offset` at `va + va_offset`.
    /// Mapping over a range that is already mapped is an error.
    fn map(
        &self,
        va: &Self::VaRange,
        va_offset: u64,
        mem: &Self::PhysMem,
        mem_offset: u64,
        bytes: u64,
    ) -> Result<()>;
    /// Unmap `[va + va_offset, +bytes)`. Not stream ordered: the caller
    /// guarantees no queued work uses the range.
    fn unmap(&self, va: &Self::VaRange, va_offset: u64, bytes: u64) -> Result<()>;
    /// Grant this device read/write access to a mapped range.
    fn set_access(&self, va: &Self::VaRange, va_offset: u64, bytes: u64) -> Result<()>;

    // ---- streams and events ---------------------------------------------
    fn stream_create(&self) -> Result<Self::Stream>;
    fn stream_destroy(&self, stream: Self::Stream) -> Result<()>;
    fn stream_synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// The stream's native handle (`CUstream`, `hipStream_t`; the host
    /// backend's stream id), for foreign code that enqueues work on it: the
    /// XLA FFI handlers of custom calls (`XLA_FFI_Stream_Get`).
    fn stream_native(&self, stream: &Self::Stream) -> usize;
    /// Make `stream` wait for `event` (device side; the host does not block).
    fn stream_wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    fn event_create(&self) -> Result<Self::Event>;
    /// An event that is never timed ([`Backend::event_elapsed_ms`] refuses
    /// it): cheaper to record and to query where the backend has such
    /// events (CUDA's `CU_EVENT_DISABLE_TIMING`, HIP's
    /// `hipEventDisableTiming`). For completions that are only waited for.
    fn event_create_untimed(&self) -> Result<Self::Event> {
        self.event_create()
    }
    fn event_destroy(&self, event: Self::Event) -> Result<()>;
    fn event_record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;
    /// Record `event` on `stream`, which is capturing: the record becomes a
    /// node of the graph and the event is recorded each time the graph runs
    /// there (CUDA's `CU_EVENT_RECORD_EXTERNAL`), so that graph replays can
    /// be timed. Where [`DeviceInfo::graph_event_records`] is false:
    /// unsupported (nothing is called).
    fn event_record_in_graph(&self, _event: &Self::Event, _stream: &Self::Stream) -> Result<()> {
        Err(crate::error::DeviceError::Unsupported(
            "event records inside a graph".to_string(),
        ))
    }
    fn event_query(&self, event: &Self::Event) -> Result<EventStatus>;
    fn event_synchronize(&self, event: &Self::Event) -> Result<()>;
    /// Milliseconds between two completed events (both created with timing).
    fn event_elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32>;

    // ---- copies and fills (stream ordered) -------------------------------
    fn copy_d2d(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: &Self::Stream,
    ) -> Result<()>;
    /// Enqueue several device-to-device copies `(dst, src, bytes)` on
    /// `stream` as one operation where the driver has one (CUDA 13:
    /// `cuMemcpyBatchAsync`). The batch as a whole is ordered after earlier
    /// work on `stream` and before later work; the copies inside it are
    /// **not** ordered among themselves, so no copy may write a range that
    /// another copy of the batch reads or writes. Zero-byte copies are
    /// ignored.
    ///
    /// Unlike later additions this method has a working default: one
    /// [`Backend::copy_d2d`] per copy, so every backend supports it.
    fn copy_d2d_batch(
        &self,
        copies: &[(DevicePtr, DevicePtr, u64)],
        stream: &Self::Stream,
    ) -> Result<()> {
        for &(dst, src, bytes) in copies {
            if bytes > 0 {
                self.copy_d2d(dst, src, bytes, stream)?;
            }
        }
        Ok(())
    }
    /// Async copy from pinned host memory. `host` must not be written until
    /// the copy completes (record an event after it).
    fn copy_h2d(
        &self,
        dst: DevicePtr,
        host: &Self::HostBuffer,
        host_offset: usize,
        bytes: usize,
        stream: &Self::Stream,
    ) -> Result<()>;
    /// Async copy into pinned host memory. `host` must not be read until the
    /// copy completes.
    fn copy_d2h(
        &self,
        host: &Self::HostBuffer,
        host_offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: &Self::Stream,
    ) -> Result<()>;
    /// Blocking upload from ordinary (pageable) memory; returns when the data
    /// is on the device (ordered after prior work on `stream`).
    fn write_sync(&self, dst: DevicePtr, data: &[u8], stream: &Self::Stream) -> Result<()>;
    /// Blocking download into ordinary memory; returns when `out` is filled.
    fn read_sync(&self, out: &mut [u8], src: DevicePtr, stream: &Self::Stream) -> Result<()>;
    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64, stream: &Self::Stream)
        -> Result<()>;
    fn memset_d32(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: &Self::Stream,
    ) -> Result<()>;

    // ---- pinned host memory -----------------------------------------------
    fn host_alloc(&self, bytes: usize) -> Result<Self::HostBuffer>;
    fn host_free(&self, buf: Self::HostBuffer) -> Result<()>;
    /// The host buffer's bytes. The caller must not hold this while an async
    /// copy into the buffer is in flight.
    fn host_bytes<'a>(&self, buf: &'a Self::HostBuffer) -> &'a [u8];
    fn host_bytes_mut<'a>(&self, buf: &'a mut Self::HostBuffer) -> &'a mut [u8];
    /// The device address of a pinned host buffer (zero-copy: kernels read
    /// and write the host bytes through it). Host writes made before a
    /// launch are visible to the launched work.
    fn host_device_ptr(&self, _buf: &Self::HostBuffer) -> Result<DevicePtr> {
        Err(DeviceError::Unsupported(
            "host_device_ptr (zero-copy host memory)".into(),
        ))
    }

    // ---- modules and kernels ----------------------------------------------
    fn module_load(&self, image: &[u8], kind: ImageKind) -> Result<Self::Module>;
    fn module_unload(&self, module: Self::Module) -> Result<()>;
    fn module_function(&self, module: &Self::Module, name: &str) -> Result<Self::Function>;
    /// Launch `function`; `args[i]` holds the bytes of kernel parameter i
    /// (a device pointer is 8 bytes, a TMA descriptor 128).
    fn launch(
        &self,
        function: &Self::Function,
        config: &LaunchConfig,
        args: &[&[u8]],
        stream: &Self::Stream,
    ) -> Result<()>;

    // ---- graphs ---------------------------------------------------------------
    /// Start capturing work queued on `stream` (and streams joined to it by events).
    fn stream_begin_capture(&self, stream: &Self::Stream) -> Result<()>;
    fn stream_end_capture(&self, stream: &Self::Stream) -> Result<Self::Graph>;
    fn graph_instantiate(&self, graph: &Self::Graph) -> Result<Self::GraphExec>;
    fn graph_launch(&self, exec: &Self::GraphExec, stream: &Self::Stream) -> Result<()>;
    /// Try to update `exec` in place to `graph` (same topology). `Ok(false)`
    /// when the driver refuses the update (re-instantiate then).
    fn graph_exec_update(&self, exec: &Self::GraphExec, graph: &Self::Graph) -> Result<bool>;
    fn graph_destroy(&self, graph: Self::Graph) -> Result<()>;
    fn graph_exec_destroy(&self, exec: Self::GraphExec) -> Result<()>;

    /// The kernel nodes of `graph` that launch `function` (in no particular
    /// order), including those inside its conditional bodies where the
    /// backend can see them.
    fn graph_kernel_nodes(
        &self,
        _graph: &Self::Graph,
        _function: &Self::Function,
    ) -> Result<Vec<Self::GraphNode>> {
        Err(DeviceError::Unsupported(
            "updating graph kernel nodes on this backend".into(),
        ))
    }

    /// Give kernel node `node` of `exec` (a node of the graph `exec` was
    /// instantiated from, launching `function`) new arguments and grid for
    /// the following launches of `exec`. Launches already enqueued keep
    /// what they were launched with, so this never waits for the device.
    /// `config` may change the grid and block only (no cluster, no PDL, the
    /// same shared memory).
    fn graph_exec_kernel_update(
        &self,
        _exec: &Self::GraphExec,
        _node: &Self::GraphNode,
        _function: &Self::Function,
        _config: &LaunchConfig,
        _args: &[&[u8]],
    ) -> Result<()> {
        Err(DeviceError::Unsupported(
            "updating graph kernel nodes on this backend".into(),
        ))
    }

    /// Turn kernel node `node` of `exec` off (it runs as an empty node: its
    /// dependencies kept, nothing launched) or back on, for the following
    /// launches of `exec`; launches already enqueued keep their state.
    /// Independent of [`Backend::graph_exec_kernel_update`]: a node updated
    /// while off stays off.
    fn graph_exec_node_set_enabled(
        &self,
        _exec: &Self::GraphExec,
        _node: &Self::GraphNode,
        _enabled: bool,
    ) -> Result<()> {
        Err(DeviceError::Unsupported(
            "turning graph nodes off on this backend".into(),
        ))
    }

    /// Encode a 128-byte TMA descriptor (`CUtensorMap`) for the tensor at
    /// `base`: the bytes passed as the kernel parameter. Host-side only (not
    /// a stream operation), so allowed during capture.
    fn tensor_map_encode(&self, _desc: &TensorMapDesc, _base: DevicePtr) -> Result<[u8; 128]> {
        Err(DeviceError::Unsupported(
            "TMA descriptors on this backend".into(),
        ))
    }

    /// Capture a WHILE conditional node into the graph being captured on
    /// `stream`: the body (captured by `body`) runs while the `u8`/`bool` at
    /// `predicate` is non-zero. Only where `info().conditional_nodes`.
    fn capture_while(
        &self,
        _stream: &Self::Stream,
        _predicate: DevicePtr,
        _body: &mut dyn FnMut(&Self::Stream) -> Result<()>,
    ) -> Result<()> {
        Err(DeviceError::Unsupported(
            "conditional WHILE graph nodes on this backend".into(),
        ))
    }

    /// Capture XLA's conditional into the graph being captured on `stream`:
    /// of the `branches` bodies (captured by `body(i, stream)`), the one the
    /// value at `index` picks runs, picked on the device when the graph runs
    /// (an `is_pred` byte: non-zero picks branch 0, zero branch 1; else an
    /// `s32`, out of range picking the last branch), read once before any
    /// branch runs. Only where `info().conditional_nodes`.
    fn capture_case(
        &self,
        _stream: &Self::Stream,
        _index: DevicePtr,
        _is_pred: bool,
        _branches: usize,
        _body: &mut dyn FnMut(usize, &Self::Stream) -> Result<()>,
    ) -> Result<()> {
        Err(DeviceError::Unsupported(
            "conditional graph nodes on this backend".into(),
        ))
    }

    // ---- collectives (see [`crate::collective`]) --------------------------

    /// A fresh clique id (`ncclGetUniqueId`), made by one rank and handed to
    /// every rank of the clique.
    fn clique_id(&self) -> Result<crate::collective::CliqueId> {
        Err(DeviceError::Unsupported(
            "collectives on this backend".into(),
        ))
    }

    /// Join clique `id` as `rank` of `nranks` on this device
    /// (`ncclCommInitRank`). Blocks until every rank has joined, so the
    /// ranks of one process must call it from different threads.
    fn comm_init_rank(
        &self,
        _id: &crate::collective::CliqueId,
        _nranks: usize,
        _rank: usize,
    ) -> Result<Box<dyn crate::collective::Communicator<Self::Stream>>>
    where
        Self: Sized,
    {
        Err(DeviceError::Unsupported(
            "collectives on this backend".into(),
        ))
    }

    /// Let this device read and write memory of device `peer` (same
    /// process), e.g. `cuCtxEnablePeerAccess`; VMM mappings additionally
    /// need `set_access` for the peer. Default: unsupported.
    fn enable_peer_access(&self, _peer: usize) -> Result<()> {
        Err(DeviceError::Unsupported(
            "peer access on this backend".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_copies_joins_neighbours_on_both_sides_only() {
        let p = DevicePtr;
        let merged = merge_copies(&[
            (p(300), p(1300), 10),
            (p(100), p(1100), 50),
            (p(150), p(1150), 50), // contiguous with the previous on both sides
            (p(200), p(5000), 8),  // dst contiguous, src not
            (p(400), p(0), 0),     // empty
        ]);
        assert_eq!(
            merged,
            vec![
                (p(100), p(1100), 100),
                (p(200), p(5000), 8),
                (p(300), p(1300), 10)
            ]
        );
        assert!(merge_copies(&[]).is_empty());
    }
}

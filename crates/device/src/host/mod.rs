//! `host`: a backend on host memory that emulates VMM and really moves bytes.
//!
//! Physical allocations are zeroed host vectors; VA ranges are bump-allocated
//! from a fake 47-bit address space (non-zero, aligned, never reused, one
//! guard granule between reservations); mappings are tracked per range and
//! every device access is translated through them (see `memory.rs`). Streams
//! are in-order queues run on the calling thread (see `exec.rs`); graphs are
//! recorded op lists; kernels are registered Rust closures (see `kernel.rs`).
//!
//! Failure modes, all returned as [`DeviceError`] (never a panic): access
//! through an unmapped VA or before `set_access`, map over a mapped range,
//! unmap of a range that is not exactly mapped, misaligned VMM sizes, out of
//! memory (capacity is configurable), stale or foreign handles (each handle
//! carries its backend id and a never-reused id checked against the live
//! set), and injected failure of the Nth driver call
//! ([`HostBackend::inject_failure`]). Every trait call is counted by name
//! ([`HostBackend::call_count`]).
//!
//! An injected failure of a call that consumes its handle (`mem_release`,
//! `va_free`, `*_destroy`, `host_free`, `module_unload`) still releases the
//! resource and then returns the error, so leak accounting stays exact; any
//! other injected failure has no effect besides the error.
#![deny(unsafe_code)]

mod backend_impl;
mod collective;
mod exec;
mod kernel;
mod memory;
mod pinned;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use kernel::{arg_ptr, arg_u32, arg_u64, HostKernelCtx, HostKernelFn};

use crate::backend::{DeviceInfo, DevicePtr};
use crate::error::{DeviceError, Result};
use exec::State;
use memory::Memory;
use pinned::PinnedStorage;

/// Configuration of a [`HostBackend`].
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// VMM granularity in bytes (power of two). Default 2 MiB, like H200.
    pub granularity: u64,
    /// Device memory capacity in bytes; `mem_create` past it is out of memory.
    pub capacity: u64,
    /// Reported in `DeviceInfo::memory_bandwidth` (bytes/s).
    pub memory_bandwidth: f64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            granularity: 2 << 20,
            capacity: 1 << 30,
            memory_bandwidth: 100e9,
        }
    }
}

/// Live objects of a host backend (what "no leaks" is checked against).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostOutstanding {
    /// Physical memory handles not yet released.
    pub phys_handles: usize,
    /// Physical allocations still holding memory (handle live or mapped).
    pub phys_allocations: usize,
    pub phys_bytes: u64,
    pub va_ranges: usize,
    pub mappings: usize,
    pub streams: usize,
    pub events: usize,
    pub host_buffers: usize,
    pub modules: usize,
    pub graphs: usize,
    pub graph_execs: usize,
}

impl HostOutstanding {
    /// Total number of live handles and objects.
    pub fn total(&self) -> usize {
        self.phys_handles
            + self.phys_allocations
            + self.va_ranges
            + self.mappings
            + self.streams
            + self.events
            + self.host_buffers
            + self.modules
            + self.graphs
            + self.graph_execs
    }
}

struct Injection {
    /// `None` = any call.
    call: Option<String>,
    remaining: u64,
}

#[derive(Default)]
struct CallLog {
    counts: BTreeMap<&'static str, u64>,
    injections: Vec<Injection>,
}

/// Source of backend ids (handles remember which backend made them).
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// The host backend. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct HostBackend {
    id: u64,
    info: DeviceInfo,
    budget: crate::budget::MemoryBudget,
    state: Arc<Mutex<State>>,
    calls: Arc<Mutex<CallLog>>,
    next_handle: AtomicU64,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend").field("id", &self.id).finish()
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        HostBackend::new(HostConfig::default()).expect("the default config is valid")
    }
}

/// A physical allocation of the host backend.
#[derive(Debug)]
pub struct HostPhys {
    backend: u64,
    id: u64,
    size: u64,
    location: crate::budget::MemLocation,
}

/// A reserved VA range of the host backend.
#[derive(Debug)]
pub struct HostVa {
    backend: u64,
    id: u64,
    base: u64,
    size: u64,
}

#[derive(Debug)]
pub struct HostStream {
    backend: u64,
    id: u64,
}

#[derive(Debug)]
pub struct HostEvent {
    backend: u64,
    id: u64,
}

/// A "pinned" host buffer.
pub struct HostPinned {
    backend: u64,
    id: u64,
    storage: Arc<PinnedStorage>,
}

impl std::fmt::Debug for HostPinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPinned")
            .field("id", &self.id)
            .field("len", &self.storage.len())
            .finish()
    }
}

#[derive(Debug)]
pub struct HostModule {
    backend: u64,
    id: u64,
}

/// A kernel of a loaded host module.
#[derive(Clone)]
pub struct HostFunction {
    backend: u64,
    module: u64,
    name: Arc<str>,
    kernel: HostKernelFn,
}

impl std::fmt::Debug for HostFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostFunction")
            .field("module", &self.module)
            .field("name", &self.name)
            .finish()
    }
}

#[derive(Debug)]
pub struct HostGraph {
    backend: u64,
    id: u64,
}

#[derive(Debug)]
pub struct HostGraphExec {
    backend: u64,
    id: u64,
}

/// A kernel node of a host graph: its position in the graph's op tree
/// (indices into nested graph / WHILE bodies), the same in every exec.
#[derive(Clone, Debug)]
pub struct HostGraphNode {
    backend: u64,
    path: Vec<usize>,
}

impl HostBackend {
    pub fn new(config: HostConfig) -> Result<Self> {
        if !config.granularity.is_power_of_two() {
            return Err(DeviceError::InvalidArgument(format!(
                "host backend granularity {} is not a power of two",
                config.granularity
            )));
        }
        let info = DeviceInfo {
            backend: "host",
            ordinal: 0,
            name: "host (emulated VMM)".into(),
            compute_capability: (0, 0),
            arch_name: String::new(),
            multiprocessor_count: 1,
            total_memory: config.capacity,
            vmm_granularity: config.granularity,
            memory_bandwidth: config.memory_bandwidth,
            vmm_supported: true,
            conditional_nodes: true,
            case_nodes: true,
            graph_event_records: true,
        };
        Ok(HostBackend {
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            info,
            budget: Default::default(),
            state: Arc::new(Mutex::new(State::new(Memory::new(
                config.granularity,
                config.capacity,
            )))),
            calls: Arc::new(Mutex::new(CallLog::default())),
            next_handle: AtomicU64::new(1),
        })
    }

    /// Make kernel `name` available to host modules loaded afterwards.
    /// The kernel runs with the backend locked: it must not call the backend.
    pub fn register_kernel(&self, name: &str, kernel: HostKernelFn) {
        self.lock().kernels.insert(name.to_string(), kernel);
    }

    /// Make the `n`th (1-based) future call named `call` fail with a driver
    /// error; `call` is a `Backend` method name (e.g. `"map"`), or `"*"` /
    /// `"any"` for any call. Several injections may be armed at once.
    pub fn inject_failure(&self, call: &str, n: u64) {
        let call = match call {
            "*" | "any" => None,
            c => Some(c.to_string()),
        };
        self.calls().injections.push(Injection {
            call,
            remaining: n.max(1),
        });
    }

    /// Number of injected failures armed and not yet fired.
    pub fn injections_armed(&self) -> usize {
        self.calls().injections.len()
    }

    /// Disarm all injected failures.
    pub fn clear_injected_failures(&self) {
        self.calls().injections.clear();
    }

    /// How many times `call` (a `Backend` method name) was made.
    pub fn call_count(&self, call: &str) -> u64 {
        self.calls().counts.get(call).copied().unwrap_or(0)
    }

    /// All call counts by name.
    pub fn call_counts(&self) -> BTreeMap<&'static str, u64> {
        self.calls().counts.clone()
    }

    /// Total number of counted calls.
    pub fn total_calls(&self) -> u64 {
        self.calls().counts.values().sum()
    }

    pub fn reset_call_counts(&self) {
        self.calls().counts.clear();
    }

    /// Live objects right now.
    pub fn outstanding(&self) -> HostOutstanding {
        let st = self.lock();
        HostOutstanding {
            phys_handles: st.mem.phys_handles(),
            phys_allocations: st.mem.phys_allocations(),
            phys_bytes: st.mem.phys_bytes(),
            va_ranges: st.mem.va_count(),
            mappings: st.mem.mapping_count(),
            streams: st.streams.len(),
            events: st.events.len(),
            host_buffers: st.host_bufs.len(),
            modules: st.modules.len(),
            graphs: st.graphs.len(),
            graph_execs: st.execs.len(),
        }
    }

    /// Hold `stream`: work submitted to it queues up until
    /// [`release_stream`](Self::release_stream). Not counted as a call.
    pub fn hold_stream(&self, stream: &HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.lock();
        let s = st
            .streams
            .get_mut(&stream.id)
            .ok_or_else(|| stale("stream"))?;
        s.held = true;
        Ok(())
    }

    /// Release a held stream and run everything that can now run.
    pub fn release_stream(&self, stream: &HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.lock();
        let s = st
            .streams
            .get_mut(&stream.id)
            .ok_or_else(|| stale("stream"))?;
        s.held = false;
        st.pump();
        Ok(())
    }

    /// Read device memory directly (test helper; not a counted call, not
    /// stream ordered).
    pub fn peek(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0; len];
        self.lock().mem.read(ptr, &mut out)?;
        Ok(out)
    }

    /// Write device memory directly (test helper; not counted, not ordered).
    pub fn poke(&self, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        self.lock().mem.write(ptr, data)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking host kernel poisons the lock; the state itself stays
        // consistent (every mutation validates first), so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn calls(&self) -> MutexGuard<'_, CallLog> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn check(&self, backend: u64) -> Result<()> {
        if backend != self.id {
            return Err(DeviceError::InvalidArgument(format!(
                "handle of host backend {backend} used with host backend {}",
                self.id
            )));
        }
        Ok(())
    }

    /// Count a driver call and return its injected failure, if one is due.
    fn count(&self, call: &'static str) -> Option<DeviceError> {
        count_call(&self.calls, call)
    }

    /// Start a counted call: injected failure first, then the locked state.
    fn enter(&self, call: &'static str) -> Result<MutexGuard<'_, State>> {
        match self.count(call) {
            Some(e) => Err(e),
            None => Ok(self.lock()),
        }
    }
}

/// Count `call` in `calls` and return its injected failure, if one is due
/// (shared by the backend and its communicators).
fn count_call(calls: &Mutex<CallLog>, call: &'static str) -> Option<DeviceError> {
    let mut log = calls.lock().unwrap_or_else(|e| e.into_inner());
    *log.counts.entry(call).or_insert(0) += 1;
    let mut fired = None;
    let mut i = 0;
    while i < log.injections.len() {
        let inj = &mut log.injections[i];
        if inj.call.as_deref().is_none_or(|c| c == call) {
            inj.remaining -= 1;
            if inj.remaining == 0 {
                log.injections.remove(i);
                fired.get_or_insert(DeviceError::Driver {
                    call,
                    code: 999,
                    name: "HOST_INJECTED_FAILURE".into(),
                    message: "failure injected by HostBackend::inject_failure".into(),
                });
                continue;
            }
        }
        i += 1;
    }
    if fired.is_some() {
        tracing::debug!(call, "host backend: injected failure");
    }
    fired
}

fn stale(what: &str) -> DeviceError {
    DeviceError::InvalidArgument(format!(
        "{what} handle is not live (released or never created)"
    ))
}

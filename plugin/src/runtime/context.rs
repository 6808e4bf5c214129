//! A device as the plugin sees it, behind object-safe traits so that the
//! C-facing code is not generic over the backend: its memory ([`Memory`]:
//! allocate, upload, download, copy; an [`Allocation`] frees itself, and
//! its [`Backing`] says what else its memory can do) and its context
//! ([`DeviceContext`]: the stream and completions, the programs loaded on
//! it).
//!
//! [`VmmDevice`] implements both for any backend the plugin runs on, on the
//! project's [`VmmAllocator`]: every buffer JAX sees is a VMM allocation
//! with an allocation id (the runtime binds slots by id, not by address).
//!
//! Ordering: one stream per client (per device) carries everything that
//! writes buffers: executions, device copies, uploads (staged in pinned
//! memory, `staging.rs`, so they need not wait for it). Reads to the host
//! of a buffer whose producer has completed go on a second, transfer
//! stream, so that they do not wait for the steps queued since (a live
//! buffer is immutable; its state lock keeps it alive during the copy).
//! Work on the stream is asynchronous; [`DeviceContext::complete_after`] records a device
//! event after what was enqueued so far and the completion thread
//! (`completion.rs`) completes the PJRT event when the device has done it.
//! Freeing an allocation is stream ordered (`vmm::Buffer::free_on`): its
//! memory is handed out again only after the work queued before the free.
//! `XLA_VMM_SYNC_EXECUTE=1` makes `complete_after` wait for the stream
//! instead (synchronous mode, for debugging and A/B).

use std::sync::Arc;

use xla_vmm_device::vmm::{Buffer as VmmBuffer, VmmAllocator, VmmConfig, VmmStats};
use xla_vmm_device::{Backend, DeviceInfo, DevicePtr, MemLocation};

use crate::cabi::assignment::MultiDevice;
use crate::cabi::error::{Error, Result};
use crate::runtime::collectives::Cliques;
use crate::runtime::completion::Completions;
use crate::runtime::event::Event;
use crate::runtime::handle::{BufferHandle, PluginBackend};
use crate::runtime::program::{Program, RuntimeProgram, SharedStream};
use crate::runtime::staging::StagingPool;
use xla_vmm_device::blas::GemmEngine;
use xla_vmm_runtime::RunConfig;

use crate::cabi::options::ExecOptions;
use xla_vmm_runtime::Threshold;

/// At most this many executions (device events) in flight per client:
/// `Execute` waits for the oldest beyond it, so the host cannot run
/// arbitrarily far ahead (memory freed in stream order is reusable only
/// once the device gets there).
pub const MAX_IN_FLIGHT: usize = 32;

/// An allocator buffer whose free is ordered on the client's stream.
struct OwnedBuffer<B: Backend> {
    buf: Option<VmmBuffer<B>>,
    stream: Arc<SharedStream<B>>,
}

impl<B: Backend> Drop for OwnedBuffer<B> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let guard = self.stream.lock();
        match guard.as_ref() {
            Some(s) => {
                if let Err(e) = buf.free_on(s) {
                    tracing::warn!("stream-ordered free: {e}");
                }
            }
            // No stream any more: it was synchronized when shut down.
            None => drop(buf),
        }
    }
}

/// Pinned host memory of the `pinned_host` memory space, addressed by the
/// device through its mapping. Freed once the work queued on the client's
/// stream (which may read or write it) has completed.
struct OwnedHost<B: Backend> {
    buf: Option<B::HostBuffer>,
    backend: Arc<B>,
    stream: Arc<SharedStream<B>>,
}

impl<B: Backend> Drop for OwnedHost<B> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let guard = self.stream.lock();
        if let Some(s) = guard.as_ref() {
            if let Err(e) = self.backend.stream_synchronize(s) {
                tracing::warn!("waiting before freeing pinned host memory: {e}");
            }
        }
        if let Err(e) = self.backend.host_free(buf) {
            tracing::warn!("freeing pinned host memory: {e}");
        }
    }
}

/// The memory behind an [`Allocation`]: what it can do besides being freed
/// (in stream order, when dropped).
pub trait Backing: Send + Sync {
    /// Where it lives and whether it can move under its address (`None`:
    /// not the allocator's memory: pinned host memory).
    fn placement(&self) -> (Option<MemLocation>, bool) {
        (None, false)
    }
    /// Move it to `to` under its address, its bytes copied after the work
    /// queued on the client's stream (waited for): its new allocation id,
    /// `None` when it cannot move or is there already.
    fn relocate(&mut self, _to: MemLocation) -> Result<Option<u64>> {
        Ok(None)
    }
    /// New content in the same memory: a new generation.
    fn renew(&mut self) {}
    /// What VA-stable graph mode needs to map it (its physical memory and
    /// allocation id), for [`Program::run_bound`].
    fn handle(&self) -> Option<BufferHandle> {
        None
    }
}

impl<B: PluginBackend> Backing for OwnedBuffer<B> {
    fn placement(&self) -> (Option<MemLocation>, bool) {
        match &self.buf {
            // Memory another program still maps (or binds) would stay
            // beside the new: such a buffer does not move.
            Some(buf) => (
                Some(buf.location()),
                buf.remappable() && !buf.held_elsewhere(),
            ),
            None => (None, false),
        }
    }

    fn relocate(&mut self, to: MemLocation) -> Result<Option<u64>> {
        let Some(buf) = self.buf.as_mut() else {
            return Ok(None);
        };
        // Checked again under the buffer's lock: an execute on another
        // thread may have taken its handle since the plan was made (it
        // runs with the memory that handle holds).
        if buf.held_elsewhere() {
            return Ok(None);
        }
        let moved = self.stream.with(|s| Ok(buf.relocate(to, s)?))?;
        Ok(moved.then(|| buf.allocation_id().0))
    }

    fn renew(&mut self) {
        if let Some(buf) = self.buf.as_mut() {
            buf.renew();
        }
    }

    fn handle(&self) -> Option<BufferHandle> {
        let buf = self.buf.as_ref()?;
        Some(B::handle(xla_vmm_runtime::UserBuffer::from_vmm(buf)))
    }
}

impl<B: Backend> Backing for OwnedHost<B> {}

/// Ids of pinned host allocations (apart from the allocator's).
static HOST_ALLOCATION_IDS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(1 << 62);

/// One live device allocation. Dropping it frees the memory, ordered after
/// the work already queued on the client's stream.
pub struct Allocation {
    pub id: u64,
    pub ptr: DevicePtr,
    /// Bytes requested (the buffer's logical size).
    pub size: u64,
    /// The host address of pinned host memory (None: device memory).
    pub host_addr: Option<usize>,
    /// The memory (the allocator's buffer, or pinned host memory).
    pub inner: Box<dyn Backing>,
}

impl Allocation {
    /// Where its memory lives and whether it can move
    /// ([`Allocation::relocate`]); `None`: not the allocator's memory.
    pub fn placement(&self) -> (Option<MemLocation>, bool) {
        self.inner.placement()
    }

    /// Move its memory to `to` under its address (see
    /// [`Backing::relocate`]); it gets the new allocation id. `Ok(false)`:
    /// it cannot move or is there already.
    pub fn relocate(&mut self, to: MemLocation) -> Result<bool> {
        let moved = self.inner.relocate(to)?;
        if let Some(id) = moved {
            self.id = id;
        }
        Ok(moved.is_some())
    }

    /// It holds new content in its memory (a program wrote it in place):
    /// a new generation ([`VmmBuffer::renew`]), so that no program takes it
    /// for the content it held before.
    pub fn renew(&mut self) {
        self.inner.renew();
    }

    /// What VA-stable graph mode needs to map it.
    pub fn handle(&self) -> Option<BufferHandle> {
        self.inner.handle()
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("id", &self.id)
            .field("ptr", &format_args!("{:#x}", self.ptr.0))
            .field("size", &self.size)
            .finish()
    }
}

/// A device's memory as buffers see it: allocate, upload, download and
/// copy on one device.
pub trait Memory: Send + Sync {
    /// `bytes` of device memory (host-located past the device budget).
    fn alloc(&self, bytes: u64) -> Result<Allocation>;
    /// Pinned host memory the device addresses directly (the `pinned_host`
    /// memory space): host to device transfers, copies and kernels reach it
    /// through the returned address.
    fn alloc_host(&self, _bytes: u64) -> Result<Allocation> {
        Err(Error::unimplemented(
            "this device has no pinned host memory space",
        ))
    }
    /// Host → device copy behind the work already queued on the stream,
    /// without waiting for it: `data` is no longer needed on return (it was
    /// copied into pinned staging memory), and the returned event completes
    /// when the copy has landed. `None`: the copy was made synchronously
    /// (synchronous mode, or an upload too big to stage).
    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<Option<Arc<Event>>>;
    /// Device → host copy of memory whose producer has completed (the
    /// caller waited for the buffer's ready event) and which nothing queued
    /// writes: it does not wait for the work queued since (the next step in
    /// flight). Blocks until the data has landed.
    fn download(&self, out: &mut [u8], src: DevicePtr) -> Result<()>;
    /// Device → device copy, enqueued on the stream (asynchronous).
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()>;
    /// Device → device copies (dst, src, bytes) whose destinations do not
    /// overlap, enqueued on the stream as one batch where the backend has
    /// one (CUDA 13's `cuMemcpyBatchAsync`), else one by one.
    fn copy_many(&self, copies: &[(DevicePtr, DevicePtr, u64)]) -> Result<()> {
        copies.iter().try_for_each(|&(d, s, n)| self.copy(d, s, n))
    }
}

/// A device's context: its memory ([`Memory`]), the stream that orders its
/// work and the completions that follow it, the programs loaded on it
/// (with its GEMM engine, collectives and run options).
pub trait DeviceContext: Memory {
    fn info(&self) -> &DeviceInfo;
    /// Complete `done` once the device has finished everything queued on
    /// the stream so far (at once in synchronous mode, or after shutdown);
    /// a device error fails it.
    fn complete_after(&self, done: Arc<Event>);
    /// Wait for everything queued on the stream.
    fn synchronize(&self) -> Result<()>;
    /// Synchronous mode (`XLA_VMM_SYNC_EXECUTE=1`)?
    fn is_sync(&self) -> bool;
    /// Block while [`MAX_IN_FLIGHT`] or more completions are pending.
    fn throttle(&self) {}
    /// Client destroy: wait for the stream, stop the completion thread.
    fn shutdown(&self);
    fn stats(&self) -> VmmStats;
    /// (free, total) device memory.
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// Load a decoded program on this device (the runtime's `Executable`);
    /// `multi`: the executable runs on several devices, this is one of them
    /// (its collectives join the other devices' programs).
    fn load_program(
        &self,
        plan: xla_vmm::Plan,
        multi: Option<&MultiDevice>,
    ) -> Result<Box<dyn Program>>;
}

/// [`DeviceContext`] on a [`Backend`] through the [`VmmAllocator`].
pub struct VmmDevice<B: PluginBackend> {
    allocator: VmmAllocator<B>,
    stream: Arc<SharedStream<B>>,
    completions: Completions<B>,
    sync: bool,
    gemm: Option<Arc<dyn GemmEngine<B>>>,
    /// How the client runs its programs (mode, guard, binding).
    run: RunConfig,
    /// The client's collective cliques (shared by all its devices).
    cliques: Option<Arc<Cliques<B>>>,
    /// Pinned buffers of asynchronous uploads.
    staging: Arc<StagingPool<B>>,
    /// Downloads of completed buffers (not behind the queued steps).
    transfer: SharedStream<B>,
}

impl<B: PluginBackend> VmmDevice<B> {
    pub fn new(backend: Arc<B>) -> Result<Self> {
        Self::with_run_config(backend, RunConfig::default(), ExecOptions::default())
    }

    /// Device memory for a client whose programs run as `run` says: under
    /// copy threshold 0 (remap everything) no buffer is sub-allocated, so
    /// every buffer is its own remappable allocation, as XLA's own VMM
    /// allocator does.
    pub fn with_run_config(backend: Arc<B>, run: RunConfig, exec: ExecOptions) -> Result<Self> {
        backend.budget().set_limits(run.memory);
        crate::cabi::stats::record_memory(&backend);
        let stream = backend.stream_create()?;
        let transfer = match backend.stream_create() {
            Ok(t) => t,
            Err(e) => {
                let _ = backend.stream_destroy(stream);
                return Err(e.into());
            }
        };
        let cfg = if run.binding.threshold == Threshold::RemapAll {
            VmmConfig {
                small_threshold: 0,
                ..VmmConfig::default()
            }
        } else {
            VmmConfig::default()
        };
        let completions = match Completions::new(backend.clone(), exec.plain_backoff) {
            Ok(c) => c,
            Err(e) => {
                let _ = backend.stream_destroy(stream);
                let _ = backend.stream_destroy(transfer);
                return Err(e);
            }
        };
        let allocator = match VmmAllocator::new(backend.clone(), cfg) {
            Ok(a) => a,
            Err(e) => {
                let _ = backend.stream_destroy(stream);
                let _ = backend.stream_destroy(transfer);
                return Err(e.into());
            }
        };
        crate::cabi::stats::record_allocator(&allocator);
        Ok(VmmDevice {
            staging: StagingPool::new(backend.clone()),
            transfer: SharedStream::new(transfer),
            allocator,
            stream: Arc::new(SharedStream::new(stream)),
            completions,
            sync: exec.sync,
            gemm: None,
            run,
            cliques: None,
        })
    }

    /// Programs with GEMM thunks run them on `gemm` (cuBLASLt on CUDA).
    pub fn with_gemm(mut self, gemm: Option<Arc<dyn GemmEngine<B>>>) -> Self {
        if let Some(g) = &gemm {
            crate::cabi::stats::record_plans(&**self.allocator.backend(), g);
        }
        self.gemm = gemm;
        self
    }

    /// Multi-device programs find their peers through `cliques` (one per
    /// client, shared by all its devices).
    pub fn with_cliques(mut self, cliques: Arc<Cliques<B>>) -> Self {
        self.cliques = Some(cliques);
        self
    }

    pub fn allocator(&self) -> &VmmAllocator<B> {
        &self.allocator
    }

    pub fn backend(&self) -> &Arc<B> {
        self.allocator.backend()
    }

    /// Run `f` with the client's stream (serialized).
    pub fn with_stream<T>(&self, f: impl FnOnce(&B, &B::Stream) -> Result<T>) -> Result<T> {
        self.stream.with(|s| f(self.allocator.backend(), s))
    }

    /// Force synchronous (`true`) or asynchronous mode (tests; the default
    /// comes from `XLA_VMM_SYNC_EXECUTE`).
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// Device events the completion thread still waits on.
    pub fn pending_completions(&self) -> usize {
        self.completions.outstanding()
    }
}

impl<B: PluginBackend> Memory for VmmDevice<B> {
    fn alloc(&self, bytes: u64) -> Result<Allocation> {
        let buf: VmmBuffer<B> = self.allocator.alloc(bytes)?;
        tracing::trace!(
            bytes,
            ptr = buf.ptr().0,
            id = buf.allocation_id().0,
            "alloc"
        );
        Ok(Allocation {
            id: buf.allocation_id().0,
            ptr: buf.ptr(),
            size: bytes,
            host_addr: None,
            inner: Box::new(OwnedBuffer {
                buf: Some(buf),
                stream: self.stream.clone(),
            }),
        })
    }
    fn alloc_host(&self, bytes: u64) -> Result<Allocation> {
        let b = self.allocator.backend();
        let len = usize::try_from(bytes.max(1))
            .map_err(|_| Error::invalid(format!("{bytes} bytes of host memory")))?;
        let buf = b.host_alloc(len)?;
        let host_addr = Some(b.host_bytes(&buf).as_ptr() as usize);
        let ptr = match b.host_device_ptr(&buf) {
            Ok(p) => p,
            Err(e) => {
                let _ = b.host_free(buf);
                return Err(Error::from(e).context("mapping pinned host memory for the device"));
            }
        };
        Ok(Allocation {
            id: HOST_ALLOCATION_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ptr,
            size: bytes,
            host_addr,
            inner: Box::new(OwnedHost {
                buf: Some(buf),
                backend: b.clone(),
                stream: self.stream.clone(),
            }),
        })
    }
    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<Option<Arc<Event>>> {
        if data.is_empty() {
            return Ok(None);
        }
        let staged = if self.sync {
            None
        } else {
            self.staging.stage(data).unwrap_or_else(|e| {
                tracing::debug!("no staging buffer ({e}); uploading synchronously");
                None
            })
        };
        let Some(buf) = staged else {
            self.with_stream(|b, s| Ok(b.write_sync(dst, data, s)?))?;
            return Ok(None);
        };
        let len = data.len();
        if let Err(e) = self.with_stream(|b, s| Ok(b.copy_h2d(dst, &buf, 0, len, s)?)) {
            // Not enqueued: nothing reads the buffer.
            self.staging.give_back(buf);
            return Err(e);
        }
        let done = Event::pending();
        let pool = self.staging.clone();
        // Back to the pool once the copy has landed (or the device failed:
        // then nothing reads it either).
        done.then(Box::new(move |_| pool.give_back(buf)));
        self.complete_after(done.clone());
        Ok(Some(done))
    }
    fn download(&self, out: &mut [u8], src: DevicePtr) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        if self.sync {
            return self.with_stream(|b, s| Ok(b.read_sync(out, src, s)?));
        }
        let be = self.allocator.backend();
        self.transfer.with(|t| Ok(be.read_sync(out, src, t)?))
    }
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.with_stream(|b, s| Ok(b.copy_d2d(dst, src, bytes, s)?))
    }
    fn copy_many(&self, copies: &[(DevicePtr, DevicePtr, u64)]) -> Result<()> {
        match copies {
            [] => Ok(()),
            &[(d, s, n)] => self.copy(d, s, n),
            _ => self.with_stream(|b, s| Ok(b.copy_d2d_batch(copies, s)?)),
        }
    }
}

impl<B: PluginBackend> DeviceContext for VmmDevice<B> {
    fn info(&self) -> &DeviceInfo {
        self.allocator.backend().info()
    }

    fn complete_after(&self, done: Arc<Event>) {
        let be = self.allocator.backend();
        if self.sync {
            done.set(self.synchronize());
            return;
        }
        let recorded = self.stream.with(|s| {
            // Only waited for: untimed (cheaper to record and to query).
            let e = be.event_create_untimed()?;
            if let Err(err) = be.event_record(&e, s) {
                let _ = be.event_destroy(e);
                return Err(err.into());
            }
            Ok(e)
        });
        match recorded {
            Ok(e) => {
                if let Err((e, done)) = self.completions.push(e, done) {
                    // Shut down: no thread to wait for it.
                    let r = be.event_synchronize(&e).map_err(Error::from);
                    let _ = be.event_destroy(e);
                    done.set(r);
                }
            }
            // Cannot record: fall back to waiting here.
            Err(err) => {
                tracing::warn!(
                    "event_record failed ({}); waiting for the stream",
                    err.message
                );
                done.set(self.synchronize());
            }
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.with_stream(|b, s| Ok(b.stream_synchronize(s)?))
    }

    fn is_sync(&self) -> bool {
        self.sync
    }

    fn throttle(&self) {
        self.completions.wait_below(MAX_IN_FLIGHT);
    }

    fn shutdown(&self) {
        match self.synchronize() {
            Ok(()) => {}
            Err(e) if e.code == xla_vmm_ffi::pjrt::PJRT_Error_Code_FAILED_PRECONDITION => {}
            Err(e) => tracing::warn!("waiting for the stream at shutdown: {}", e.message),
        }
        self.completions.shutdown();
    }

    fn stats(&self) -> VmmStats {
        self.allocator.stats()
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        Ok(self.allocator.backend().mem_info()?)
    }

    fn load_program(
        &self,
        plan: xla_vmm::Plan,
        multi: Option<&MultiDevice>,
    ) -> Result<Box<dyn Program>> {
        let collectives = match multi {
            None => None,
            Some(m) => Some((
                m,
                self.cliques.clone().ok_or_else(|| {
                    Error::internal("a multi-device program on device memory without cliques")
                })?,
            )),
        };
        let p = RuntimeProgram::load(
            self.allocator.backend().clone(),
            plan,
            self.gemm.clone(),
            &self.run,
            self.stream.clone(),
            collectives,
        )?;
        Ok(Box::new(p))
    }
}

impl<B: PluginBackend> Drop for VmmDevice<B> {
    fn drop(&mut self) {
        self.shutdown();
        // Every upload has completed (shutdown waited for the stream and the
        // completion thread ran their callbacks).
        self.staging.clear();
        for shared in [&*self.stream, &self.transfer] {
            let stream = shared.lock().take();
            if let Some(s) = stream {
                if let Err(e) = self.allocator.backend().stream_destroy(s) {
                    tracing::warn!("stream_destroy at shutdown: {e}");
                }
            }
        }
        if let Err(e) = self.allocator.trim() {
            tracing::warn!("allocator trim at shutdown: {e}");
        }
        for e in self.allocator.take_deferred_errors() {
            tracing::warn!("deferred device error: {e}");
        }
    }
}

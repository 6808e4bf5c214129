//! NVIDIA backend on cudarc (feature `cuda`).
//!
//! - [`symbols`]: every driver symbol, required or optional, checked at
//!   creation: no driver means [`DeviceError::NotAvailable`], never a panic.
//! - [`result`]: `Result`-returning wrappers for what cudarc leaves raw (VMM,
//!   graph update, conditional nodes, `cuLaunchKernelEx`, pinned memory).
//! - [`handles`]: the handle types; `conditional`: WHILE nodes in capture;
//!   `info`: the device facts read at creation.
//! - This file: [`CudaBackend`], the [`Backend`] implementation. Contexts,
//!   streams and events come from cudarc's safe layer.
//!
//! Every method makes the device's primary context current on the calling
//! thread first (cudarc's `bind_to_thread`), so the backend may be used from
//! any thread.

pub mod blaslt;
mod conditional;
pub(crate) mod cublas;
pub mod cudnn;
pub(crate) mod cufft;
pub mod handles;
mod info;
pub mod nccl;
mod remap_cost;
pub mod result;
pub mod symbols;
mod tma;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;
use xla_vmm_ffi::cuda::driver as sys;

use crate::backend::{
    merge_copies, Backend, DeviceInfo, DevicePtr, EventStatus, ImageKind, LaunchConfig,
};
use crate::budget::{MemLocation, MemoryBudget};
use crate::checks::{host_range, ArgChecks};
use crate::error::{DeviceError, Result};
use handles::ModuleInner;
pub use handles::{
    CudaEvent, CudaFunction, CudaGraph, CudaGraphExec, CudaGraphNode, CudaHostBuffer, CudaModule,
    CudaPhysMem, CudaStream, CudaVaRange,
};
use result::from_cudarc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One CUDA device (its primary context).
pub struct CudaBackend {
    id: u64,
    ordinal: i32,
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    symbols: symbols::Symbols,
    /// The kernels that set conditional handles from device memory (a
    /// loop predicate; a conditional's branch), loaded at the first
    /// `capture_while` / `capture_case`.
    set_condition: OnceLock<std::result::Result<conditional::SetKernels, DeviceError>>,
    /// `cuMemcpyBatchAsync` failed once: batches are copied one by one.
    batch_off: AtomicBool,
    /// ROCm's remap cost emulated (`XLA_VMM_EMULATE_REMAP_MS`; A/B only).
    remap_cost: Option<remap_cost::RemapCost>,
    budget: MemoryBudget,
    /// Host-located memory: the host NUMA node next to the device and its
    /// granularity, or why the driver cannot make it.
    host_memory: std::result::Result<(i32, u64), String>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ordinal)
            .field("name", &self.info.name)
            .finish()
    }
}

impl ArgChecks for CudaBackend {
    fn instance_id(&self) -> u64 {
        self.id
    }
    fn granularity(&self) -> u64 {
        self.info.vmm_granularity
    }
}

/// The host NUMA node of `ctx`'s device (0 where the driver does not say)
/// and the granularity of pinned memory there, when the driver can create
/// host-located memory whose granularity divides the device's (so that a
/// device-sized block can live there).
fn host_memory(
    ctx: &Arc<CudaContext>,
    device_granularity: u64,
) -> std::result::Result<(i32, u64), String> {
    use xla_vmm_ffi::cuda::driver::CUdevice_attribute as A;
    // SAFETY: the device behind a live context.
    let numa =
        unsafe { result::device::attribute(ctx.cu_device(), A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID) }
            .ok()
            .filter(|&n| n >= 0)
            .unwrap_or(0);
    // SAFETY: the driver is initialized (the context exists).
    let g = unsafe { result::vmm::host_granularity(numa) }.map_err(|e| e.to_string())?;
    if g == 0 || device_granularity == 0 || !device_granularity.is_multiple_of(g) {
        return Err(format!(
            "host granularity {g} does not divide the device's {device_granularity}"
        ));
    }
    Ok((numa, g))
}

impl CudaBackend {
    /// Open device `ordinal`. [`DeviceError::NotAvailable`] when libcuda is
    /// missing or too old, no such device exists, or the driver fails to
    /// initialize.
    pub fn new(ordinal: usize) -> Result<Self> {
        let symbols = symbols::load()?;
        let unavailable = |e: cudarc::driver::DriverError| {
            DeviceError::NotAvailable(format!("CUDA device {ordinal}: {e}"))
        };
        let ctx = CudaContext::new(ordinal).map_err(unavailable)?;
        // SAFETY: we never use cudarc's CudaSlice, the only user of event
        // tracking; disabling it keeps `new_stream` from synchronizing the
        // context (which would break a capture in progress).
        unsafe { ctx.disable_event_tracking() };
        let ordinal_i32 = i32::try_from(ordinal)
            .map_err(|_| DeviceError::InvalidArgument(format!("device ordinal {ordinal}")))?;
        let info = info::read(&ctx, ordinal_i32, &symbols)?;
        let remap_cost = remap_cost::RemapCost::from_env()?;
        if let Some(c) = &remap_cost {
            tracing::warn!(
                ordinal,
                remap_ms = c.remap_ms(),
                "{}: every remap synchronizes \
                the device and costs about that long, as on ROCm (for A/B measurements)",
                remap_cost::ENV
            );
        }
        let host_memory = host_memory(&ctx, info.vmm_granularity);
        tracing::info!(ordinal, name = %info.name, memcpy_batch = symbols.memcpy_batch,
            host_memory = ?host_memory, "cuda backend ready");
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ordinal: ordinal_i32,
            ctx,
            info,
            symbols,
            set_condition: OnceLock::new(),
            batch_off: AtomicBool::new(false),
            remap_cost,
            budget: MemoryBudget::default(),
            host_memory,
        })
    }

    /// How many CUDA devices this process sees (an error when the driver is
    /// missing or too old, never a panic).
    pub fn device_count() -> Result<usize> {
        symbols::load()?;
        let n = CudaContext::device_count()
            .map_err(|e| DeviceError::NotAvailable(format!("counting CUDA devices: {e}")))?;
        Ok(n.max(0) as usize)
    }

    /// The cudarc context (for other modules of this crate, e.g. cuBLASLt).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Make device `ordinal`'s primary context (the one every backend of
    /// that device uses) current on this thread, for foreign code that works
    /// in "the current context" (a kernel library loading its module).
    pub fn bind_primary_context(ordinal: usize) -> Result<()> {
        symbols::load()?;
        let ctx =
            CudaContext::new(ordinal).map_err(|e| from_cudarc("cuDevicePrimaryCtxRetain", e))?;
        // The context stays current (and alive: its backend holds it) after
        // this handle's release.
        ctx.bind_to_thread()
            .map_err(|e| from_cudarc("cuCtxSetCurrent", e))
    }

    /// `XLA_VMM_EMULATE_REMAP_MS`: after an unmap or a set access that
    /// started at `t0`, wait for the device and pad the call (remap_cost.rs).
    fn pay_remap_cost(&self, t0: std::time::Instant) -> Result<()> {
        match &self.remap_cost {
            None => Ok(()),
            Some(c) => c.pay(t0, || {
                self.ctx
                    .synchronize()
                    .map_err(|e| from_cudarc("cuCtxSynchronize", e))
            }),
        }
    }

    /// A new event of this context with `flags`.
    fn event_with(&self, flags: sys::CUevent_flags) -> Result<CudaEvent> {
        let inner = self
            .ctx
            .new_event(Some(flags))
            .map_err(|e| from_cudarc("cuEventCreate", e))?;
        Ok(CudaEvent {
            owner: self.id,
            inner,
        })
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| from_cudarc("cuCtxSetCurrent", e))
    }

    /// Blocking copies borrow host memory only for the call, so they must
    /// not be recorded into a graph.
    fn refuse_capture(&self, stream: &CudaStream, what: &str) -> Result<()> {
        // SAFETY: the stream is live and ours (checked by the caller).
        if unsafe { result::graph::is_capturing(stream.cu_stream())? } {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} on a capturing stream (use copy_h2d/copy_d2h with pinned memory)"
            )));
        }
        Ok(())
    }
}

/// Every kernel argument in 8-byte aligned storage of exactly its
/// parameter's size (checked against `function`'s parameter sizes), so the
/// driver reads only bytes we own.
fn param_storage(function: &CudaFunction, args: &[&[u8]]) -> Result<Vec<Vec<u64>>> {
    if args.len() != function.params.len() {
        return Err(DeviceError::InvalidArgument(format!(
            "kernel takes {} parameters, {} given",
            function.params.len(),
            args.len()
        )));
    }
    let mut storage: Vec<Vec<u64>> = Vec::with_capacity(args.len());
    for (i, (arg, &size)) in args.iter().zip(function.params.iter()).enumerate() {
        if arg.len() != size {
            return Err(DeviceError::InvalidArgument(format!(
                "kernel parameter {i} is {size} bytes, {} given",
                arg.len()
            )));
        }
        let mut words = vec![0u64; size.div_ceil(8).max(1)];
        // SAFETY: `words` has at least `size` bytes; u64 has no invalid bit
        // patterns, so viewing it as bytes is sound.
        let dst = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), size) };
        dst.copy_from_slice(arg);
        storage.push(words);
    }
    Ok(storage)
}

impl Backend for CudaBackend {
    type PhysMem = CudaPhysMem;
    type VaRange = CudaVaRange;
    type Stream = CudaStream;
    type Event = CudaEvent;
    type HostBuffer = CudaHostBuffer;
    type Module = CudaModule;
    type Function = CudaFunction;
    type Graph = CudaGraph;
    type GraphExec = CudaGraphExec;
    type GraphNode = CudaGraphNode;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        // SAFETY: our context is current.
        unsafe { result::device::mem_info() }
    }

    // ---- VMM ----------------------------------------------------------------
    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    fn mem_create_raw(&self, bytes: u64, location: MemLocation) -> Result<CudaPhysMem> {
        self.aligned("size", bytes)?;
        if bytes == 0 {
            return Err(DeviceError::InvalidArgument("mem_create of 0 bytes".into()));
        }
        self.bind()?;
        let handle = match location {
            // SAFETY: context current, size checked against the granularity.
            MemLocation::Device => unsafe { result::vmm::create(self.ordinal, bytes)? },
            MemLocation::Host => {
                let (numa, _) = self.host_memory.as_ref().map_err(|why| {
                    DeviceError::Unsupported(format!("host-located memory: {why}"))
                })?;
                // SAFETY: driver initialized; `bytes` is a multiple of the
                // device granularity, which the host granularity divides.
                unsafe { result::vmm::create_host(*numa, bytes)? }
            }
        };
        Ok(CudaPhysMem {
            owner: self.id,
            handle,
            bytes,
            location,
        })
    }

    fn mem_location(&self, mem: &CudaPhysMem) -> MemLocation {
        mem.location
    }

    fn mem_release_raw(&self, mem: CudaPhysMem) -> Result<()> {
        self.own(&mem, "physical memory")?;
        self.bind()?;
        // SAFETY: `mem` is ours and consumed here, so released once. The
        // driver keeps the memory alive while mappings of it remain.
        unsafe { result::vmm::release(mem.handle) }
    }

    fn mem_size(&self, mem: &CudaPhysMem) -> u64 {
        mem.bytes
    }

    fn va_reserve(&self, bytes: u64, align: u64) -> Result<CudaVaRange> {
        self.aligned("size", bytes)?;
        if bytes == 0 {
            return Err(DeviceError::InvalidArgument("va_reserve of 0 bytes".into()));
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(DeviceError::InvalidArgument(format!("alignment {align}")));
        }
        self.bind()?;
        // SAFETY: context current, size checked.
        let base = unsafe { result::vmm::address_reserve(bytes, align)? };
        self.budget().note_va(true, bytes);
        Ok(CudaVaRange {
            owner: self.id,
            base,
            bytes,
        })
    }

    fn va_free(&self, va: CudaVaRange) -> Result<()> {
        self.own(&va, "VA range")?;
        self.bind()?;
        // SAFETY: exactly the reservation we made, consumed here. The driver
        // rejects freeing a range that still has mappings.
        unsafe { result::vmm::address_free(va.base, va.bytes) }?;
        self.budget().note_va(false, va.bytes);
        Ok(())
    }

    fn va_base(&self, va: &CudaVaRange) -> DevicePtr {
        DevicePtr(va.base)
    }

    fn va_size(&self, va: &CudaVaRange) -> u64 {
        va.bytes
    }

    fn map(
        &self,
        va: &CudaVaRange,
        va_offset: u64,
        mem: &CudaPhysMem,
        mem_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        self.own(va, "VA range")?;
        self.own(mem, "physical memory")?;
        self.vmm_range("map (VA)", va_offset, bytes, va.bytes)?;
        self.vmm_range("map (physical)", mem_offset, bytes, mem.bytes)?;
        self.bind()?;
        // SAFETY: both ranges checked to lie inside live objects we own;
        // mapping over an existing mapping is rejected by the driver.
        unsafe { result::vmm::map(va.base + va_offset, bytes, mem_offset, mem.handle) }?;
        self.budget().note_mapping(true);
        Ok(())
    }

    fn unmap(&self, va: &CudaVaRange, va_offset: u64, bytes: u64) -> Result<()> {
        self.own(va, "VA range")?;
        self.vmm_range("unmap", va_offset, bytes, va.bytes)?;
        self.bind()?;
        let t0 = std::time::Instant::now();
        // SAFETY: range inside our reservation; "no queued work uses it" is
        // the caller's documented obligation (a violation faults the GPU
        // context, it cannot corrupt host memory).
        unsafe { result::vmm::unmap(va.base + va_offset, bytes) }?;
        self.budget().note_mapping(false);
        self.pay_remap_cost(t0)
    }

    fn set_access(&self, va: &CudaVaRange, va_offset: u64, bytes: u64) -> Result<()> {
        self.own(va, "VA range")?;
        self.vmm_range("set_access", va_offset, bytes, va.bytes)?;
        self.bind()?;
        let t0 = std::time::Instant::now();
        // SAFETY: range inside our reservation; the driver rejects unmapped parts.
        unsafe { result::vmm::set_access(va.base + va_offset, bytes, self.ordinal) }?;
        self.pay_remap_cost(t0)
    }

    // ---- streams and events -------------------------------------------------
    fn stream_create(&self) -> Result<CudaStream> {
        let inner = self
            .ctx
            .new_stream()
            .map_err(|e| from_cudarc("cuStreamCreate", e))?;
        Ok(CudaStream {
            owner: self.id,
            inner,
        })
    }

    fn stream_destroy(&self, stream: CudaStream) -> Result<()> {
        self.own(&stream, "stream")?;
        drop(stream);
        // cudarc records errors of its Drop in the context: surface them now.
        self.ctx
            .check_err()
            .map_err(|e| from_cudarc("cuStreamDestroy", e))
    }

    fn stream_native(&self, stream: &CudaStream) -> usize {
        stream.cu_stream() as usize
    }
    fn stream_synchronize(&self, stream: &CudaStream) -> Result<()> {
        self.own(stream, "stream")?;
        self.bind()?;
        stream
            .inner
            .synchronize()
            .map_err(|e| from_cudarc("cuStreamSynchronize", e))
    }

    fn stream_wait_event(&self, stream: &CudaStream, event: &CudaEvent) -> Result<()> {
        self.own(stream, "stream")?;
        self.own(event, "event")?;
        stream
            .inner
            .wait(&event.inner)
            .map_err(|e| from_cudarc("cuStreamWaitEvent", e))
    }

    fn event_create(&self) -> Result<CudaEvent> {
        self.event_with(sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    fn event_create_untimed(&self) -> Result<CudaEvent> {
        self.event_with(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    fn event_destroy(&self, event: CudaEvent) -> Result<()> {
        self.own(&event, "event")?;
        drop(event);
        self.ctx
            .check_err()
            .map_err(|e| from_cudarc("cuEventDestroy", e))
    }

    fn event_record(&self, event: &CudaEvent, stream: &CudaStream) -> Result<()> {
        self.own(event, "event")?;
        self.own(stream, "stream")?;
        event
            .inner
            .record(&stream.inner)
            .map_err(|e| from_cudarc("cuEventRecord", e))
    }

    fn event_record_in_graph(&self, event: &CudaEvent, stream: &CudaStream) -> Result<()> {
        self.own(event, "event")?;
        self.own(stream, "stream")?;
        self.bind()?;
        let flags = sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as std::ffi::c_uint;
        // SAFETY: both handles are live (owned by this backend, checked
        // above); the driver validates that the stream is capturing.
        result::check("cuEventRecordWithFlags", unsafe {
            sys::cuEventRecordWithFlags(event.inner.cu_event(), stream.cu_stream(), flags)
        })
    }

    fn event_query(&self, event: &CudaEvent) -> Result<EventStatus> {
        self.own(event, "event")?;
        self.bind()?;
        match event.inner.try_is_complete() {
            Ok(true) => Ok(EventStatus::Complete),
            Ok(false) => Ok(EventStatus::Pending),
            Err(e) => Err(from_cudarc("cuEventQuery", e)),
        }
    }

    fn event_synchronize(&self, event: &CudaEvent) -> Result<()> {
        self.own(event, "event")?;
        event
            .inner
            .synchronize()
            .map_err(|e| from_cudarc("cuEventSynchronize", e))
    }

    fn event_elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        self.own(start, "event")?;
        self.own(end, "event")?;
        start
            .inner
            .elapsed_ms(&end.inner)
            .map_err(|e| from_cudarc("cuEventElapsedTime", e))
    }

    // ---- copies and fills -----------------------------------------------------
    fn copy_d2d(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: stream is live; device addresses are checked by the driver
        // and the GPU (a bad one faults the context, not host memory).
        unsafe { result::memory::copy_d2d(dst.0, src.0, bytes as usize, stream.cu_stream()) }
    }

    /// One `cuMemcpyBatchAsync` for the whole batch (contiguous copies
    /// merged first). Copied one by one instead when the driver lacks the
    /// call (before CUDA 13), when the stream is capturing (the call has no
    /// graph node) or is the legacy NULL stream, or after the call failed
    /// once (logged; the loop then gives the real error, if any).
    fn copy_d2d_batch(
        &self,
        copies: &[(DevicePtr, DevicePtr, u64)],
        stream: &CudaStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        let merged = merge_copies(copies);
        let one_by_one = |list: &[(DevicePtr, DevicePtr, u64)]| {
            list.iter()
                .try_for_each(|&(d, s, n)| self.copy_d2d(d, s, n, stream))
        };
        if merged.len() <= 1
            || !self.symbols.memcpy_batch
            || self.batch_off.load(Ordering::Relaxed)
            || stream.cu_stream().is_null()
        {
            return one_by_one(&merged);
        }
        self.bind()?;
        // SAFETY: the stream is live and ours (checked above).
        if unsafe { result::graph::is_capturing(stream.cu_stream())? } {
            return one_by_one(&merged);
        }
        let mut dsts: Vec<sys::CUdeviceptr> = merged.iter().map(|c| c.0 .0).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = merged.iter().map(|c| c.1 .0).collect();
        let mut sizes = Vec::with_capacity(merged.len());
        for c in &merged {
            sizes.push(
                usize::try_from(c.2)
                    .map_err(|_| DeviceError::InvalidArgument(format!("copy of {} bytes", c.2)))?,
            );
        }
        // SAFETY: the symbol is present (symbols.memcpy_batch), the stream is
        // live, not capturing and not the NULL stream; the three arrays have
        // the same length; device ranges are the caller's responsibility (a
        // bad address faults the context, not host memory).
        let r = unsafe {
            result::memory::copy_d2d_batch(
                &mut dsts,
                &mut srcs,
                &mut sizes,
                self.ordinal,
                stream.cu_stream(),
            )
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                // Re-running every copy is safe: within a batch no copy
                // writes what another reads.
                tracing::warn!(%e, copies = merged.len(),
                    "cuMemcpyBatchAsync failed; copying one by one from now on");
                self.batch_off.store(true, Ordering::Relaxed);
                one_by_one(&merged)
            }
        }
    }

    fn copy_h2d(
        &self,
        dst: DevicePtr,
        host: &CudaHostBuffer,
        host_offset: usize,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        self.own(host, "host buffer")?;
        host_range(host.len, host_offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the host range is inside the pinned buffer (checked); the
        // trait contract keeps the buffer alive and unwritten until the copy
        // completes.
        unsafe {
            result::memory::copy_h2d(
                dst.0,
                host.ptr.add(host_offset).cast(),
                bytes,
                stream.cu_stream(),
            )
        }
    }

    fn copy_d2h(
        &self,
        host: &CudaHostBuffer,
        host_offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        self.own(host, "host buffer")?;
        host_range(host.len, host_offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the host range is inside the pinned buffer (checked); the
        // trait contract keeps it alive and unread until the copy completes.
        unsafe {
            result::memory::copy_d2h(
                host.ptr.add(host_offset).cast(),
                src.0,
                bytes,
                stream.cu_stream(),
            )
        }
    }

    fn write_sync(&self, dst: DevicePtr, data: &[u8], stream: &CudaStream) -> Result<()> {
        self.own(stream, "stream")?;
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.refuse_capture(stream, "write_sync")?;
        // SAFETY: `data` is borrowed for the whole call; the stream is not
        // capturing (a captured copy would read `data` at replay, after the
        // borrow ends). A pageable-to-device copy returns once `data` has
        // been staged, and we synchronize the stream before returning.
        unsafe {
            result::memory::copy_h2d(dst.0, data.as_ptr().cast(), data.len(), stream.cu_stream())?;
        }
        self.stream_synchronize(stream)
    }

    fn read_sync(&self, out: &mut [u8], src: DevicePtr, stream: &CudaStream) -> Result<()> {
        self.own(stream, "stream")?;
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.refuse_capture(stream, "read_sync")?;
        // SAFETY: `out` is exclusively borrowed for the call and the stream
        // is not capturing. A device-to-pageable copy returns only once the
        // data has landed, and we also synchronize the stream before returning.
        unsafe {
            result::memory::copy_d2h(
                out.as_mut_ptr().cast(),
                src.0,
                out.len(),
                stream.cu_stream(),
            )?;
        }
        self.stream_synchronize(stream)
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64, stream: &CudaStream) -> Result<()> {
        self.own(stream, "stream")?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: as copy_d2d.
        unsafe { result::memory::memset_d8(dst.0, value, bytes as usize, stream.cu_stream()) }
    }

    fn memset_d32(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        if !dst.0.is_multiple_of(4) {
            return Err(DeviceError::InvalidArgument(format!(
                "memset_d32 destination {:#x} is not 4-byte aligned",
                dst.0
            )));
        }
        if count == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: as copy_d2d; alignment checked.
        unsafe { result::memory::memset_d32(dst.0, value, count as usize, stream.cu_stream()) }
    }

    // ---- pinned host memory ------------------------------------------------------
    fn host_alloc(&self, bytes: usize) -> Result<CudaHostBuffer> {
        if bytes == 0 {
            return Ok(CudaHostBuffer {
                owner: self.id,
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        self.bind()?;
        // SAFETY: context current.
        let ptr = unsafe { result::memory::host_alloc(bytes)? };
        Ok(CudaHostBuffer {
            owner: self.id,
            ptr: ptr.cast(),
            len: bytes,
        })
    }

    fn host_free(&self, buf: CudaHostBuffer) -> Result<()> {
        self.own(&buf, "host buffer")?;
        if buf.len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: allocated by host_alloc, consumed here so freed once.
        unsafe { result::memory::host_free(buf.ptr.cast()) }
    }

    fn host_bytes<'a>(&self, buf: &'a CudaHostBuffer) -> &'a [u8] {
        if buf.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` points to `len` bytes of pinned memory owned by `buf`
        // and alive while it is borrowed; the trait contract forbids holding
        // this slice while an async copy writes into the buffer.
        unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) }
    }

    fn host_bytes_mut<'a>(&self, buf: &'a mut CudaHostBuffer) -> &'a mut [u8] {
        if buf.len == 0 {
            return &mut [];
        }
        // SAFETY: as host_bytes, and `&mut` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(buf.ptr, buf.len) }
    }

    fn host_device_ptr(&self, buf: &CudaHostBuffer) -> Result<DevicePtr> {
        self.own(buf, "host buffer")?;
        if buf.len == 0 {
            return Err(DeviceError::InvalidArgument(
                "host_device_ptr of an empty host buffer".into(),
            ));
        }
        self.bind()?;
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `buf.ptr` came from cuMemHostAlloc (DEVICEMAP) and is
        // alive while `buf` is borrowed; `d` is a valid out pointer.
        result::check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut d, buf.ptr.cast(), 0)
        })?;
        Ok(DevicePtr(d))
    }

    // ---- modules and kernels ----------------------------------------------------------
    fn module_load(&self, image: &[u8], kind: ImageKind) -> Result<CudaModule> {
        // cuModuleLoadData reads a cubin/fatbin by its ELF header and PTX as
        // a NUL-terminated string: give it a NUL-terminated copy either way.
        let mut bytes = match kind {
            ImageKind::Cubin | ImageKind::Ptx => image.to_vec(),
            ImageKind::Hsaco | ImageKind::HipSource | ImageKind::Host => {
                return Err(DeviceError::Unsupported(format!("{kind:?} images on CUDA")))
            }
        };
        if kind == ImageKind::Ptx && bytes.contains(&0) {
            return Err(DeviceError::InvalidArgument(
                "PTX text contains a NUL byte".into(),
            ));
        }
        bytes.push(0);
        self.bind()?;
        // SAFETY: `bytes` outlives the call and is NUL-terminated, so the
        // driver cannot read past it when parsing PTX.
        let module = unsafe { cudarc::driver::result::module::load_data(bytes.as_ptr().cast()) }
            .map_err(|e| from_cudarc("cuModuleLoadData", e))?;
        Ok(CudaModule {
            owner: self.id,
            inner: Arc::new(ModuleInner {
                module,
                ctx: self.ctx.clone(),
            }),
        })
    }

    fn module_unload(&self, module: CudaModule) -> Result<()> {
        self.own(&module, "module")?;
        // Functions of the module keep it loaded; the last one to go unloads
        // it (errors then land in the context's error state).
        drop(module);
        self.ctx
            .check_err()
            .map_err(|e| from_cudarc("cuModuleUnload", e))
    }

    fn module_function(&self, module: &CudaModule, name: &str) -> Result<CudaFunction> {
        self.own(module, "module")?;
        let cname = std::ffi::CString::new(name)
            .map_err(|_| DeviceError::InvalidArgument(format!("kernel name {name:?}")))?;
        self.bind()?;
        // SAFETY: the module is loaded (we hold it).
        let func =
            unsafe { cudarc::driver::result::module::get_function(module.inner.module, cname) }
                .map_err(|e| from_cudarc("cuModuleGetFunction", e))?;
        let params: Arc<[usize]> = if self.symbols.param_info {
            // SAFETY: `func` was just obtained from a loaded module.
            unsafe { result::launch::param_sizes(func)? }.into()
        } else {
            return Err(DeviceError::Unsupported(
                "kernel launch needs cuFuncGetParamInfo (CUDA 12.4+ driver)".into(),
            ));
        };
        Ok(CudaFunction {
            owner: self.id,
            func,
            params,
            _module: module.inner.clone(),
        })
    }

    fn launch(
        &self,
        function: &CudaFunction,
        config: &LaunchConfig,
        args: &[&[u8]],
        stream: &CudaStream,
    ) -> Result<()> {
        self.own(function, "function")?;
        self.own(stream, "stream")?;
        let mut storage = param_storage(function, args)?;
        let mut ptrs: Vec<*mut std::ffi::c_void> =
            storage.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
        self.bind()?;
        if config.shared_mem_bytes > 0 {
            tma::set_max_dynamic_shared(function.func, config.shared_mem_bytes)?;
        }
        // SAFETY: function and stream are live and ours; `ptrs[i]` points to
        // `params[i]` readable bytes that outlive the call (the driver copies
        // parameters at launch).
        unsafe {
            result::launch::launch_ex(
                function.func,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                config.cluster,
                config.pdl,
                stream.cu_stream(),
                &mut ptrs,
            )
        }
    }

    fn tensor_map_encode(&self, desc: &crate::TensorMapDesc, base: DevicePtr) -> Result<[u8; 128]> {
        tma::encode(desc, base)
    }

    // ---- graphs ----------------------------------------------------------------------
    fn stream_begin_capture(&self, stream: &CudaStream) -> Result<()> {
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: the stream is live and ours.
        unsafe { result::graph::begin_capture(stream.cu_stream()) }
    }

    fn stream_end_capture(&self, stream: &CudaStream) -> Result<CudaGraph> {
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: the stream is live and ours.
        let graph = unsafe { result::graph::end_capture(stream.cu_stream())? };
        if graph.is_null() {
            return Err(DeviceError::InvalidArgument(
                "capture produced no graph".into(),
            ));
        }
        Ok(CudaGraph {
            owner: self.id,
            graph,
        })
    }

    fn graph_instantiate(&self, graph: &CudaGraph) -> Result<CudaGraphExec> {
        self.own(graph, "graph")?;
        self.bind()?;
        // SAFETY: the graph is live and ours.
        let exec = unsafe { result::graph::instantiate(graph.graph)? };
        Ok(CudaGraphExec {
            owner: self.id,
            exec,
        })
    }

    fn graph_launch(&self, exec: &CudaGraphExec, stream: &CudaStream) -> Result<()> {
        self.own(exec, "graph exec")?;
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: both live and ours.
        unsafe { result::graph::launch(exec.exec, stream.cu_stream()) }
    }

    fn graph_exec_update(&self, exec: &CudaGraphExec, graph: &CudaGraph) -> Result<bool> {
        self.own(exec, "graph exec")?;
        self.own(graph, "graph")?;
        self.bind()?;
        // SAFETY: both live and ours; the trait's `&` receivers plus `!Sync`
        // handles keep other threads from using them concurrently.
        unsafe { result::graph::exec_update(exec.exec, graph.graph) }
    }

    fn graph_destroy(&self, graph: CudaGraph) -> Result<()> {
        self.own(&graph, "graph")?;
        self.bind()?;
        // SAFETY: ours, consumed here (destroyed once).
        unsafe { result::graph::destroy(graph.graph) }
    }

    fn graph_exec_destroy(&self, exec: CudaGraphExec) -> Result<()> {
        self.own(&exec, "graph exec")?;
        self.bind()?;
        // SAFETY: ours, consumed here; the driver keeps launched work valid.
        unsafe { result::graph::exec_destroy(exec.exec) }
    }

    fn graph_kernel_nodes(
        &self,
        graph: &CudaGraph,
        function: &CudaFunction,
    ) -> Result<Vec<CudaGraphNode>> {
        self.own(graph, "graph")?;
        self.own(function, "function")?;
        if !self.symbols.kernel_node_update {
            return Err(DeviceError::Unsupported(
                "updating graph kernel nodes needs cuGraphExecKernelNodeSetParams_v2 (CUDA 12+)"
                    .into(),
            ));
        }
        self.bind()?;
        let mut found = Vec::new();
        // SAFETY: the graph is live and ours (the trait's `&` receiver and
        // the `!Sync` handle keep it from being mutated meanwhile); every
        // node comes from it.
        unsafe {
            for node in result::graph::nodes(graph.graph)? {
                if result::graph::kernel_node_function(node)? == Some(function.func) {
                    found.push(CudaGraphNode {
                        owner: self.id,
                        node,
                    });
                }
            }
        }
        Ok(found)
    }

    fn graph_exec_kernel_update(
        &self,
        exec: &CudaGraphExec,
        node: &CudaGraphNode,
        function: &CudaFunction,
        config: &LaunchConfig,
        args: &[&[u8]],
    ) -> Result<()> {
        self.own(exec, "graph exec")?;
        self.own(node, "graph node")?;
        self.own(function, "function")?;
        config.check_node_update()?;
        let mut storage = param_storage(function, args)?;
        let mut ptrs: Vec<*mut std::ffi::c_void> =
            storage.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
        self.bind()?;
        // SAFETY: exec, node and function are live and ours; the caller
        // names a kernel node of the graph `exec` came from that launches
        // `function` (the driver rejects anything else); `ptrs[i]` points to
        // `params[i]` readable bytes that outlive the call.
        unsafe {
            result::graph::exec_kernel_node_set(
                exec.exec,
                node.node,
                function.func,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                &mut ptrs,
            )
        }
    }

    fn graph_exec_node_set_enabled(
        &self,
        exec: &CudaGraphExec,
        node: &CudaGraphNode,
        enabled: bool,
    ) -> Result<()> {
        self.own(exec, "graph exec")?;
        self.own(node, "graph node")?;
        if !self.symbols.kernel_node_update {
            return Err(DeviceError::Unsupported(
                "turning graph nodes off needs cuGraphNodeSetEnabled (CUDA 12+)".into(),
            ));
        }
        self.bind()?;
        // SAFETY: exec and node are live and ours; the driver rejects a node
        // that is not of the graph `exec` was instantiated from.
        unsafe { result::graph::exec_node_set_enabled(exec.exec, node.node, enabled) }
    }

    fn capture_while(
        &self,
        stream: &CudaStream,
        predicate: DevicePtr,
        body: &mut dyn FnMut(&CudaStream) -> Result<()>,
    ) -> Result<()> {
        conditional::capture_while(self, stream, predicate, body)
    }

    fn capture_case(
        &self,
        stream: &CudaStream,
        index: DevicePtr,
        is_pred: bool,
        branches: usize,
        body: &mut dyn FnMut(usize, &CudaStream) -> Result<()>,
    ) -> Result<()> {
        conditional::capture_case(self, stream, index, is_pred, branches, body)
    }

    // ---- collectives (NCCL, see `nccl`) ------------------------------------------
    fn clique_id(&self) -> Result<crate::collective::CliqueId> {
        self.nccl_clique_id()
    }

    fn comm_init_rank(
        &self,
        id: &crate::collective::CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn crate::collective::Communicator<Self::Stream>>> {
        self.nccl_comm_init_rank(id, nranks, rank)
    }

    fn enable_peer_access(&self, peer: usize) -> Result<()> {
        self.cuda_enable_peer_access(peer)
    }
}

//! AMD backend on the HIP runtime (feature `hip`): **unverified on hardware**.
//!
//! It compiles in CI against Debian's `libamdhip64-dev` (ROCm 5.2 headers;
//! the bindings come from `hip-runtime-sys`), but no AMD GPU is available to
//! this project, so none of it has run on AMD hardware. A test-only shim
//! (`integration/hipshim`: the HIP runtime forwarded to the CUDA driver,
//! hiprtc to NVRTC) runs it on an NVIDIA GPU (`tests/hip_conformance.rs`,
//! gpu_check section `hip-shim`; both tests passed on an H200 at 8520e27):
//! that checks this code, not AMD's runtime. Paths the conformance suite
//! does not reach are untested.
//!
//! Mirrors `cuda/` file for file:
//! - [`result`]: `Result`-returning wrappers of every HIP call used (HIP has
//!   no cudarc, so streams, events and modules are wrapped there too).
//! - [`handles`]: the handle types; `info`: the device facts read at creation.
//! - This file: [`HipBackend`], the [`Backend`] implementation.
//!
//! Differences from CUDA, by design:
//! - No `symbols.rs`: `hip-runtime-sys` links `libamdhip64` at build time,
//!   so a missing library stops the process at start-up; a missing *device*
//!   gives [`DeviceError::NotAvailable`].
//! - No `conditional.rs`: ROCm 5.2 has no conditional graph nodes, so
//!   `capture_while` keeps the trait's `Unsupported` default.
//! - Launches: no thread-block clusters (`Unsupported`); the programmatic
//!   dependent launch flag is ignored (HIP keeps full stream order, which is
//!   the stricter behaviour). Arguments are packed into one kernarg buffer,
//!   each aligned to its own size rounded up to a power of two (at most 8):
//!   HIP has no parameter-size query, and the buffer form lets the runtime
//!   read exactly the bytes we pass.
//! - Bindings caveat: `hip-runtime-sys` declares `hipError_t` as a Rust enum;
//!   a runtime newer than the headers returning an unlisted code would break
//!   that enum's invariant. Pin ROCm accordingly when this first runs.

pub mod blaslt;
pub mod handles;
pub(crate) mod hipfft;
mod info;
pub mod rccl;
pub mod result;
pub(crate) mod rocblas;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, DeviceInfo, DevicePtr, EventStatus, ImageKind, LaunchConfig};
use crate::budget::{MemLocation, MemoryBudget};
use crate::checks::{host_range, ArgChecks};
use crate::error::{DeviceError, Result};
use handles::ModuleInner;
pub use handles::{
    HipEvent, HipFunction, HipGraph, HipGraphExec, HipGraphNode, HipHostBuffer, HipModule,
    HipPhysMem, HipStream, HipVaRange,
};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One HIP device.
#[derive(Debug)]
pub struct HipBackend {
    id: u64,
    ordinal: i32,
    info: DeviceInfo,
    budget: MemoryBudget,
    /// Host-located memory: NUMA node 0's granularity, or why HIP cannot
    /// make it (ROCm before host-NUMA `hipMemCreate`). Unverified on an AMD
    /// GPU: it mirrors the CUDA backend.
    host_memory: std::result::Result<u64, String>,
}

/// A device of HIP's NVIDIA platform (its ISA name is CUDA's `sm_NN`, as
/// the test shim and HIP-on-CUDA report it), where `hipModuleLoadData` takes
/// a cubin.
fn nvidia_platform(arch_name: &str) -> bool {
    arch_name
        .strip_prefix("sm_")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric()))
}

impl ArgChecks for HipBackend {
    fn instance_id(&self) -> u64 {
        self.id
    }
    fn granularity(&self) -> u64 {
        self.info.vmm_granularity
    }
}

impl HipBackend {
    /// Open device `ordinal`; [`DeviceError::NotAvailable`] when HIP fails
    /// to initialize or the device does not exist.
    pub fn new(ordinal: usize) -> Result<Self> {
        let ord = i32::try_from(ordinal)
            .map_err(|_| DeviceError::InvalidArgument(format!("device ordinal {ordinal}")))?;
        let unavailable =
            |e: DeviceError| DeviceError::NotAvailable(format!("HIP device {ordinal}: {e}"));
        // The runtime is loaded at run time (libamdhip64.so.7 / .6 / .5):
        // without one, say so instead of every call's generic failure.
        let runtime = xla_vmm_ffi::hip::runtime::load()
            .map_err(|why| DeviceError::NotAvailable(format!("HIP device {ordinal}: {why}")))?;
        tracing::debug!(runtime = %runtime.display(), "HIP runtime");
        // SAFETY: hipInit has no preconditions; the count bounds `ord`.
        let count = unsafe { result::device::init().and_then(|()| result::device::count()) }
            .map_err(unavailable)?;
        if ord >= count {
            return Err(DeviceError::NotAvailable(format!(
                "HIP device {ordinal}: only {count} device(s)"
            )));
        }
        // SAFETY: `ord` is a valid device.
        unsafe { result::device::set(ord) }.map_err(unavailable)?;
        let info = info::read(ord)?;
        tracing::info!(ordinal, name = %info.name, "hip backend ready (unverified on hardware)");
        // SAFETY: HIP is initialized (the device was selected above).
        let host_memory = match unsafe { result::vmm::host_granularity(0) } {
            Ok(g) if g > 0 && info.vmm_granularity.is_multiple_of(g) => Ok(g),
            Ok(g) => Err(format!(
                "host granularity {g} does not divide the device's {}",
                info.vmm_granularity
            )),
            Err(e) => Err(e.to_string()),
        };
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ordinal: ord,
            info,
            budget: MemoryBudget::default(),
            host_memory,
        })
    }

    /// A new event on this device, timed unless `untimed`.
    fn event_with(&self, untimed: bool) -> Result<HipEvent> {
        self.bind()?;
        // SAFETY: device current.
        let raw = unsafe { result::stream::event_create(untimed)? };
        Ok(HipEvent {
            owner: self.id,
            raw,
        })
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `ordinal` was validated at creation.
        unsafe { result::device::set(self.ordinal) }
    }

    /// Compile HIP C++ source (our own kernels, `ImageKind::HipSource`) for
    /// this device with hiprtc: for its ISA when the device reports it,
    /// else hiprtc's default (the current device, selected here).
    fn compile_source(&self, source: &[u8]) -> Result<Vec<u8>> {
        let source = std::str::from_utf8(source)
            .map_err(|_| DeviceError::InvalidArgument("HIP source is not UTF-8".into()))?;
        let rtc = xla_vmm_ffi::hiprtc::Hiprtc::get().map_err(DeviceError::NotAvailable)?;
        self.bind()?;
        let mut options = vec!["-O3".to_string()];
        // SAFETY: `ordinal` was validated at creation.
        if let Some(arch) = unsafe { result::device::gcn_arch_name(self.ordinal) } {
            options.push(format!("--offload-arch={arch}"));
        }
        // One compile per (source, options) and process: every executable
        // loads the same kernels, and hiprtc takes a while. Failures are
        // remembered too.
        type Cache = HashMap<(String, Vec<String>), std::result::Result<Arc<Vec<u8>>, String>>;
        static CACHE: Mutex<Option<Cache>> = Mutex::new(None);
        let key = (source.to_string(), options.clone());
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        let entry = cache
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_insert_with(|| {
                rtc.compile("xla_vmm_kernel.hip", source, &options)
                    .map(Arc::new)
                    .map_err(|e| format!("hiprtc ({}): {e}", rtc.path.display()))
            });
        match entry {
            Ok(code) => Ok(code.to_vec()),
            Err(e) => Err(DeviceError::Unsupported(e.clone())),
        }
    }

    /// Blocking copies borrow host memory only for the call, so they must
    /// not be recorded into a graph.
    fn refuse_capture(&self, stream: &HipStream, what: &str) -> Result<()> {
        // SAFETY: the stream is live and ours (checked by the caller).
        if unsafe { result::graph::is_capturing(stream.raw)? } {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} on a capturing stream (use copy_h2d/copy_d2h with pinned memory)"
            )));
        }
        Ok(())
    }

    /// Pack kernel arguments into one kernarg buffer (see the module docs).
    fn pack_args(args: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        for arg in args {
            let align = arg.len().next_power_of_two().clamp(1, 8);
            buf.resize(buf.len().next_multiple_of(align), 0);
            buf.extend_from_slice(arg);
        }
        buf
    }
}

/// `arg`'s bytes in 8-byte aligned storage of at least one word, so that a
/// driver reading a kernel argument reads only memory we own.
fn aligned_words(arg: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; arg.len().div_ceil(8).max(1)];
    for (w, chunk) in words.iter_mut().zip(arg.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_ne_bytes(b);
    }
    words
}

impl Backend for HipBackend {
    type PhysMem = HipPhysMem;
    type VaRange = HipVaRange;
    type Stream = HipStream;
    type Event = HipEvent;
    type HostBuffer = HipHostBuffer;
    type Module = HipModule;
    type Function = HipFunction;
    type Graph = HipGraph;
    type GraphExec = HipGraphExec;
    type GraphNode = HipGraphNode;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        // SAFETY: our device is current.
        unsafe { result::device::mem_info() }
    }

    // ---- VMM ----------------------------------------------------------------
    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    fn mem_create_raw(&self, bytes: u64, location: MemLocation) -> Result<HipPhysMem> {
        self.aligned("size", bytes)?;
        if bytes == 0 {
            return Err(DeviceError::InvalidArgument("mem_create of 0 bytes".into()));
        }
        self.bind()?;
        let handle = match location {
            // SAFETY: device current, size checked.
            MemLocation::Device => unsafe { result::vmm::create(self.ordinal, bytes)? },
            MemLocation::Host => {
                self.host_memory.as_ref().map_err(|why| {
                    DeviceError::Unsupported(format!("host-located memory: {why}"))
                })?;
                // SAFETY: HIP initialized; `bytes` is a multiple of the device
                // granularity, which the host granularity divides.
                unsafe { result::vmm::create_host(0, bytes)? }
            }
        };
        Ok(HipPhysMem {
            owner: self.id,
            handle,
            bytes,
            location,
        })
    }

    fn mem_location(&self, mem: &HipPhysMem) -> MemLocation {
        mem.location
    }

    fn mem_release_raw(&self, mem: HipPhysMem) -> Result<()> {
        self.own(&mem, "physical memory")?;
        self.bind()?;
        // SAFETY: ours, consumed here so released once.
        unsafe { result::vmm::release(mem.handle) }
    }

    fn mem_size(&self, mem: &HipPhysMem) -> u64 {
        mem.bytes
    }

    fn va_reserve(&self, bytes: u64, align: u64) -> Result<HipVaRange> {
        self.aligned("size", bytes)?;
        if bytes == 0 {
            return Err(DeviceError::InvalidArgument("va_reserve of 0 bytes".into()));
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(DeviceError::InvalidArgument(format!("alignment {align}")));
        }
        self.bind()?;
        // SAFETY: device current, size checked.
        let base = unsafe { result::vmm::address_reserve(bytes, align)? };
        self.budget().note_va(true, bytes);
        Ok(HipVaRange {
            owner: self.id,
            base,
            bytes,
        })
    }

    fn va_free(&self, va: HipVaRange) -> Result<()> {
        self.own(&va, "VA range")?;
        self.bind()?;
        // SAFETY: exactly our reservation, consumed here.
        unsafe { result::vmm::address_free(va.base, va.bytes) }?;
        self.budget().note_va(false, va.bytes);
        Ok(())
    }

    fn va_base(&self, va: &HipVaRange) -> DevicePtr {
        DevicePtr(va.base)
    }

    fn va_size(&self, va: &HipVaRange) -> u64 {
        va.bytes
    }

    fn map(
        &self,
        va: &HipVaRange,
        va_offset: u64,
        mem: &HipPhysMem,
        mem_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        self.own(va, "VA range")?;
        self.own(mem, "physical memory")?;
        self.vmm_range("map (VA)", va_offset, bytes, va.bytes)?;
        self.vmm_range("map (physical)", mem_offset, bytes, mem.bytes)?;
        self.bind()?;
        // SAFETY: both ranges lie inside live objects we own.
        unsafe { result::vmm::map(va.base + va_offset, bytes, mem_offset, mem.handle) }?;
        self.budget().note_mapping(true);
        Ok(())
    }

    fn unmap(&self, va: &HipVaRange, va_offset: u64, bytes: u64) -> Result<()> {
        self.own(va, "VA range")?;
        self.vmm_range("unmap", va_offset, bytes, va.bytes)?;
        self.bind()?;
        // SAFETY: range inside our reservation; queued-work ordering is the
        // caller's documented obligation.
        unsafe { result::vmm::unmap(va.base + va_offset, bytes) }?;
        self.budget().note_mapping(false);
        Ok(())
    }

    fn set_access(&self, va: &HipVaRange, va_offset: u64, bytes: u64) -> Result<()> {
        self.own(va, "VA range")?;
        self.vmm_range("set_access", va_offset, bytes, va.bytes)?;
        self.bind()?;
        // SAFETY: range inside our reservation.
        unsafe { result::vmm::set_access(va.base + va_offset, bytes, self.ordinal) }
    }

    // ---- streams and events -------------------------------------------------
    fn stream_create(&self) -> Result<HipStream> {
        self.bind()?;
        // SAFETY: device current.
        let raw = unsafe { result::stream::create()? };
        Ok(HipStream {
            owner: self.id,
            raw,
        })
    }

    fn stream_destroy(&self, stream: HipStream) -> Result<()> {
        self.own(&stream, "stream")?;
        self.bind()?;
        // SAFETY: ours, consumed here.
        unsafe { result::stream::destroy(stream.raw) }
    }

    fn stream_native(&self, stream: &HipStream) -> usize {
        stream.hip_stream() as usize
    }
    fn stream_synchronize(&self, stream: &HipStream) -> Result<()> {
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: live and ours.
        unsafe { result::stream::synchronize(stream.raw) }
    }

    fn stream_wait_event(&self, stream: &HipStream, event: &HipEvent) -> Result<()> {
        self.own(stream, "stream")?;
        self.own(event, "event")?;
        self.bind()?;
        // SAFETY: both live and ours.
        unsafe { result::stream::wait_event(stream.raw, event.raw) }
    }

    fn event_create(&self) -> Result<HipEvent> {
        self.event_with(false)
    }

    fn event_create_untimed(&self) -> Result<HipEvent> {
        self.event_with(true)
    }

    fn event_destroy(&self, event: HipEvent) -> Result<()> {
        self.own(&event, "event")?;
        self.bind()?;
        // SAFETY: ours, consumed here.
        unsafe { result::stream::event_destroy(event.raw) }
    }

    fn event_record(&self, event: &HipEvent, stream: &HipStream) -> Result<()> {
        self.own(event, "event")?;
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: both live and ours.
        unsafe { result::stream::event_record(event.raw, stream.raw) }
    }

    fn event_query(&self, event: &HipEvent) -> Result<EventStatus> {
        self.own(event, "event")?;
        self.bind()?;
        // SAFETY: live and ours.
        match unsafe { result::stream::event_query(event.raw)? } {
            true => Ok(EventStatus::Complete),
            false => Ok(EventStatus::Pending),
        }
    }

    fn event_synchronize(&self, event: &HipEvent) -> Result<()> {
        self.own(event, "event")?;
        self.bind()?;
        // SAFETY: live and ours.
        unsafe { result::stream::event_synchronize(event.raw) }
    }

    fn event_elapsed_ms(&self, start: &HipEvent, end: &HipEvent) -> Result<f32> {
        self.own(start, "event")?;
        self.own(end, "event")?;
        self.bind()?;
        // SAFETY: both live and ours.
        unsafe { result::stream::event_elapsed_ms(start.raw, end.raw) }
    }

    // ---- copies and fills -----------------------------------------------------
    // `copy_d2d_batch` is the trait's default: one `hipMemcpyDtoDAsync` per
    // copy (HIP's `hipMemcpyBatchAsync` ignores the attributes and is not
    // verified on hardware here).
    fn copy_d2d(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: &HipStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: stream live; bad device addresses fault the device only.
        unsafe { result::memory::copy_d2d(dst.0, src.0, bytes as usize, stream.raw) }
    }

    fn copy_h2d(
        &self,
        dst: DevicePtr,
        host: &HipHostBuffer,
        host_offset: usize,
        bytes: usize,
        stream: &HipStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        self.own(host, "host buffer")?;
        host_range(host.len, host_offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: range inside the pinned buffer; the trait contract keeps it
        // alive and unwritten until the copy completes.
        unsafe {
            result::memory::copy_h2d(dst.0, host.ptr.add(host_offset).cast(), bytes, stream.raw)
        }
    }

    fn copy_d2h(
        &self,
        host: &HipHostBuffer,
        host_offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: &HipStream,
    ) -> Result<()> {
        self.own(stream, "stream")?;
        self.own(host, "host buffer")?;
        host_range(host.len, host_offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: range inside the pinned buffer; the trait contract keeps it
        // alive and unread until the copy completes.
        unsafe {
            result::memory::copy_d2h(host.ptr.add(host_offset).cast(), src.0, bytes, stream.raw)
        }
    }

    fn write_sync(&self, dst: DevicePtr, data: &[u8], stream: &HipStream) -> Result<()> {
        self.own(stream, "stream")?;
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.refuse_capture(stream, "write_sync")?;
        // SAFETY: `data` is borrowed for the call, the stream is not
        // capturing (a captured copy would read `data` at replay) and is
        // synchronized before returning. If the copy was queued but the
        // synchronize fails, HIP's pageable-memory copies are staged before
        // the call returns, so `data` is no longer read.
        unsafe { result::memory::copy_h2d(dst.0, data.as_ptr().cast(), data.len(), stream.raw)? };
        self.stream_synchronize(stream)
    }

    fn read_sync(&self, out: &mut [u8], src: DevicePtr, stream: &HipStream) -> Result<()> {
        self.own(stream, "stream")?;
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.refuse_capture(stream, "read_sync")?;
        // SAFETY: `out` is exclusively borrowed, the stream is not capturing;
        // device-to-pageable copies
        // complete before the call returns, and we synchronize as well.
        unsafe { result::memory::copy_d2h(out.as_mut_ptr().cast(), src.0, out.len(), stream.raw)? };
        self.stream_synchronize(stream)
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64, stream: &HipStream) -> Result<()> {
        self.own(stream, "stream")?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: as copy_d2d.
        unsafe { result::memory::memset_d8(dst.0, value, bytes as usize, stream.raw) }
    }

    fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64, stream: &HipStream) -> Result<()> {
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
        unsafe { result::memory::memset_d32(dst.0, value, count as usize, stream.raw) }
    }

    // ---- pinned host memory ------------------------------------------------------
    fn host_alloc(&self, bytes: usize) -> Result<HipHostBuffer> {
        if bytes == 0 {
            return Ok(HipHostBuffer {
                owner: self.id,
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        self.bind()?;
        // SAFETY: device current.
        let ptr = unsafe { result::memory::host_alloc(bytes)? };
        Ok(HipHostBuffer {
            owner: self.id,
            ptr: ptr.cast(),
            len: bytes,
        })
    }

    fn host_free(&self, buf: HipHostBuffer) -> Result<()> {
        self.own(&buf, "host buffer")?;
        if buf.len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: from host_alloc, consumed here so freed once.
        unsafe { result::memory::host_free(buf.ptr.cast()) }
    }

    fn host_bytes<'a>(&self, buf: &'a HipHostBuffer) -> &'a [u8] {
        if buf.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes owned by `buf`, alive while borrowed; the trait
        // contract forbids holding this during an async copy into it.
        unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) }
    }

    fn host_bytes_mut<'a>(&self, buf: &'a mut HipHostBuffer) -> &'a mut [u8] {
        if buf.len == 0 {
            return &mut [];
        }
        // SAFETY: as host_bytes; `&mut` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(buf.ptr, buf.len) }
    }

    fn host_device_ptr(&self, buf: &HipHostBuffer) -> Result<DevicePtr> {
        self.own(buf, "host buffer")?;
        if buf.len == 0 {
            return Err(DeviceError::InvalidArgument(
                "host_device_ptr of an empty host buffer".into(),
            ));
        }
        self.bind()?;
        let mut d: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `buf.ptr` came from hipHostMalloc and is alive while `buf`
        // is borrowed; `d` is a valid out pointer.
        result::check("hipHostGetDevicePointer", unsafe {
            xla_vmm_ffi::hip::runtime::hipHostGetDevicePointer(&mut d, buf.ptr.cast(), 0)
        })?;
        Ok(DevicePtr(d as u64))
    }

    // ---- modules and kernels ----------------------------------------------------------
    fn module_load(&self, image: &[u8], kind: ImageKind) -> Result<HipModule> {
        let compiled;
        let image = match kind {
            ImageKind::Hsaco => image,
            ImageKind::HipSource => {
                compiled = self.compile_source(image)?;
                &compiled[..]
            }
            // HIP's NVIDIA platform loads CUDA code objects.
            ImageKind::Cubin if nvidia_platform(&self.info.arch_name) => image,
            ImageKind::Cubin | ImageKind::Ptx | ImageKind::Host => {
                return Err(DeviceError::Unsupported(format!(
                    "{kind:?} images on HIP (device {})",
                    self.info.arch_name
                )))
            }
        };
        if image.is_empty() {
            return Err(DeviceError::InvalidArgument("empty code object".into()));
        }
        self.bind()?;
        // SAFETY: `image` is a complete code object borrowed for the call
        // (HIP copies it while loading).
        let module = unsafe { result::module::load_data(image.as_ptr().cast())? };
        Ok(HipModule {
            owner: self.id,
            inner: Arc::new(ModuleInner {
                module,
                ordinal: self.ordinal,
            }),
        })
    }

    fn module_unload(&self, module: HipModule) -> Result<()> {
        self.own(&module, "module")?;
        // Unloaded when the last function of it is dropped (errors logged).
        drop(module);
        Ok(())
    }

    fn module_function(&self, module: &HipModule, name: &str) -> Result<HipFunction> {
        self.own(module, "module")?;
        let cname = std::ffi::CString::new(name)
            .map_err(|_| DeviceError::InvalidArgument(format!("kernel name {name:?}")))?;
        self.bind()?;
        // SAFETY: the module is loaded (we hold it).
        let func = unsafe { result::module::function(module.inner.module, &cname)? };
        Ok(HipFunction {
            owner: self.id,
            func,
            _module: module.inner.clone(),
        })
    }

    fn launch(
        &self,
        function: &HipFunction,
        config: &LaunchConfig,
        args: &[&[u8]],
        stream: &HipStream,
    ) -> Result<()> {
        self.own(function, "function")?;
        self.own(stream, "stream")?;
        if config.cluster.is_some() {
            return Err(DeviceError::Unsupported(
                "thread-block clusters on HIP".into(),
            ));
        }
        if config.pdl {
            tracing::trace!("programmatic dependent launch ignored on HIP");
        }
        let mut kernarg = Self::pack_args(args);
        self.bind()?;
        // SAFETY: function and stream live and ours; the runtime copies
        // exactly `kernarg.len()` bytes, which outlive the call.
        unsafe {
            result::module::launch(
                function.func,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                stream.raw,
                &mut kernarg,
            )
        }
    }

    // ---- graphs ----------------------------------------------------------------------
    fn stream_begin_capture(&self, stream: &HipStream) -> Result<()> {
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: live and ours.
        unsafe { result::graph::begin_capture(stream.raw) }
    }

    fn stream_end_capture(&self, stream: &HipStream) -> Result<HipGraph> {
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: live and ours.
        let graph = unsafe { result::graph::end_capture(stream.raw)? };
        if graph.is_null() {
            return Err(DeviceError::InvalidArgument(
                "capture produced no graph".into(),
            ));
        }
        Ok(HipGraph {
            owner: self.id,
            graph,
        })
    }

    fn graph_instantiate(&self, graph: &HipGraph) -> Result<HipGraphExec> {
        self.own(graph, "graph")?;
        self.bind()?;
        // SAFETY: live and ours.
        let exec = unsafe { result::graph::instantiate(graph.graph)? };
        Ok(HipGraphExec {
            owner: self.id,
            exec,
        })
    }

    fn graph_launch(&self, exec: &HipGraphExec, stream: &HipStream) -> Result<()> {
        self.own(exec, "graph exec")?;
        self.own(stream, "stream")?;
        self.bind()?;
        // SAFETY: both live and ours.
        unsafe { result::graph::launch(exec.exec, stream.raw) }
    }

    fn graph_kernel_nodes(
        &self,
        graph: &HipGraph,
        function: &HipFunction,
    ) -> Result<Vec<HipGraphNode>> {
        self.own(graph, "graph")?;
        self.own(function, "function")?;
        self.bind()?;
        let mut found = Vec::new();
        // SAFETY: the graph is live and ours and not mutated meanwhile (the
        // handle is !Sync); every node comes from it.
        unsafe {
            for node in result::graph::nodes(graph.graph)? {
                if result::graph::kernel_node_function(node)? == Some(function.func.cast()) {
                    found.push(HipGraphNode {
                        owner: self.id,
                        node,
                    });
                }
            }
        }
        Ok(found)
    }

    fn graph_exec_node_set_enabled(
        &self,
        exec: &HipGraphExec,
        node: &HipGraphNode,
        enabled: bool,
    ) -> Result<()> {
        self.own(exec, "graph exec")?;
        self.own(node, "graph node")?;
        self.bind()?;
        // SAFETY: both live and ours; the runtime rejects a node that is not
        // of the graph `exec` was instantiated from.
        unsafe { result::graph::exec_node_set_enabled(exec.exec, node.node, enabled) }
    }

    fn graph_exec_kernel_update(
        &self,
        exec: &HipGraphExec,
        node: &HipGraphNode,
        function: &HipFunction,
        config: &LaunchConfig,
        args: &[&[u8]],
    ) -> Result<()> {
        self.own(exec, "graph exec")?;
        self.own(node, "graph node")?;
        self.own(function, "function")?;
        config.check_node_update()?;
        // Each argument in 8-byte aligned storage of its own; the runtime
        // copies them by the kernel's argument sizes.
        let mut storage: Vec<Vec<u64>> = args.iter().map(|a| aligned_words(a)).collect();
        let mut ptrs: Vec<*mut std::ffi::c_void> =
            storage.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
        self.bind()?;
        // SAFETY: exec, node and function live and ours; the runtime rejects
        // a node that is not a kernel node of this exec; `ptrs` outlive the call.
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

    fn graph_exec_update(&self, exec: &HipGraphExec, graph: &HipGraph) -> Result<bool> {
        self.own(exec, "graph exec")?;
        self.own(graph, "graph")?;
        self.bind()?;
        // SAFETY: both live and ours; `!Sync` handles prevent concurrent use.
        unsafe { result::graph::exec_update(exec.exec, graph.graph) }
    }

    fn graph_destroy(&self, graph: HipGraph) -> Result<()> {
        self.own(&graph, "graph")?;
        self.bind()?;
        // SAFETY: ours, consumed here.
        unsafe { result::graph::destroy(graph.graph) }
    }

    fn graph_exec_destroy(&self, exec: HipGraphExec) -> Result<()> {
        self.own(&exec, "graph exec")?;
        self.bind()?;
        // SAFETY: ours, consumed here.
        unsafe { result::graph::exec_destroy(exec.exec) }
    }

    // ---- collectives (RCCL, see `rccl`; unverified on hardware) --------------------
    fn clique_id(&self) -> Result<crate::collective::CliqueId> {
        self.rccl_clique_id()
    }

    fn comm_init_rank(
        &self,
        id: &crate::collective::CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn crate::collective::Communicator<Self::Stream>>> {
        self.rccl_comm_init_rank(id, nranks, rank)
    }

    fn enable_peer_access(&self, peer: usize) -> Result<()> {
        self.hip_enable_peer_access(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_hip_device_opening_one_is_an_error_that_says_why() {
        // CI machines have no AMD GPU (and maybe no HIP runtime at all).
        if let Err(e) = HipBackend::new(0) {
            assert!(matches!(e, DeviceError::NotAvailable(_)), "{e}");
            assert!(e.to_string().contains("HIP device 0"), "{e}");
        }
        assert!(HipBackend::new(usize::MAX).is_err());
    }

    #[test]
    fn cubins_load_on_hips_nvidia_platform_only() {
        for arch in ["sm_90", "sm_100a", "sm_80"] {
            assert!(nvidia_platform(arch), "{arch}");
        }
        for arch in ["gfx942", "gfx90a", "", "sm_", "sm_9 0", "xsm_90"] {
            assert!(!nvidia_platform(arch), "{arch:?}");
        }
    }

    #[test]
    fn kernel_arguments_are_packed_at_natural_alignment() {
        let a = [1u8];
        let b = 2u32.to_ne_bytes();
        let c = 3u64.to_ne_bytes();
        let buf = HipBackend::pack_args(&[&a, &b, &c]);
        // u8 at 0, u32 at 4, u64 at 8.
        assert_eq!(buf.len(), 16);
        assert_eq!(buf[0], 1);
        assert_eq!(&buf[4..8], &b);
        assert_eq!(&buf[8..16], &c);
    }
}

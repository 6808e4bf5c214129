//! Device memory as the plugin sees it: allocate, free, upload, download,
//! copy on one device, behind an object-safe trait so that the C-facing code
//! is not generic over the backend.
//!
//! [`VmmMemory`] implements it for any [`Backend`] on the project's
//! [`VmmAllocator`]: every buffer JAX sees is a VMM allocation with an
//! allocation id (the runtime binds slots by id, not by address).

use std::any::Any;
use std::sync::{Arc, Mutex};

use xla_vmm_device::vmm::{Buffer as VmmBuffer, VmmAllocator, VmmConfig, VmmStats};
use xla_vmm_device::{Backend, DeviceInfo, DevicePtr};

use crate::error::{Error, Result};
use crate::program::{Program, RuntimeProgram};
use xla_vmm_device::blas::GemmEngine;

/// One live device allocation. Dropping it frees the memory (no queued work
/// may use it then: the plugin's copies are synchronous).
pub struct Allocation {
    pub id: u64,
    pub ptr: DevicePtr,
    /// Bytes requested (the buffer's logical size).
    pub size: u64,
    /// The backend's buffer object (`vmm::Buffer<B>`), kept for the runtime.
    pub inner: Box<dyn Any + Send + Sync>,
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

/// What buffers need from a device.
pub trait DeviceMemory: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    fn alloc(&self, bytes: u64) -> Result<Allocation>;
    /// Blocking host → device copy.
    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()>;
    /// Blocking device → host copy.
    fn download(&self, out: &mut [u8], src: DevicePtr) -> Result<()>;
    /// Device → device copy, complete on return.
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()>;
    fn stats(&self) -> VmmStats;
    /// (free, total) device memory.
    fn mem_info(&self) -> Result<(u64, u64)>;
    fn as_any(&self) -> &dyn Any;
    /// Load a decoded program on this device (the runtime's `Executable`).
    fn load_program(&self, plan: xla_vmm::Plan) -> Result<Box<dyn Program>>;
    /// What VA-stable graph mode needs to map `a` (its physical memory and
    /// allocation id), for [`Program::run_bound`].
    fn remap_handle(&self, _a: &Allocation) -> Option<Box<dyn Any + Send>> {
        None
    }
}

/// [`DeviceMemory`] on a [`Backend`] through the [`VmmAllocator`].
pub struct VmmMemory<B: Backend> {
    allocator: VmmAllocator<B>,
    stream: Mutex<Option<B::Stream>>,
    gemm: Option<Arc<dyn GemmEngine<B>>>,
    /// `xla_vmm_tmp_copy_threshold` of the client (0 / 1 auto / N).
    threshold: u64,
}

impl<B: Backend> VmmMemory<B> {
    pub fn new(backend: Arc<B>) -> Result<Self> {
        Self::with_threshold(backend, 1)
    }

    /// Device memory for a client whose copy threshold is `threshold`: under
    /// 0 (remap everything) no buffer is sub-allocated, so every buffer is
    /// its own remappable allocation, as XLA's own VMM allocator does.
    pub fn with_threshold(backend: Arc<B>, threshold: u64) -> Result<Self> {
        let stream = backend.stream_create()?;
        let cfg = if threshold == 0 {
            VmmConfig {
                small_threshold: 0,
                ..VmmConfig::default()
            }
        } else {
            VmmConfig::default()
        };
        let allocator = VmmAllocator::new(backend, cfg)?;
        Ok(VmmMemory {
            allocator,
            stream: Mutex::new(Some(stream)),
            gemm: None,
            threshold,
        })
    }

    /// Programs with GEMM thunks run them on `gemm` (cuBLASLt on CUDA).
    pub fn with_gemm(mut self, gemm: Option<Arc<dyn GemmEngine<B>>>) -> Self {
        self.gemm = gemm;
        self
    }

    pub fn allocator(&self) -> &VmmAllocator<B> {
        &self.allocator
    }

    pub fn backend(&self) -> &Arc<B> {
        self.allocator.backend()
    }

    /// Run `f` with the plugin's copy stream (serialized).
    pub fn with_stream<T>(&self, f: impl FnOnce(&B, &B::Stream) -> Result<T>) -> Result<T> {
        let guard = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let stream = guard
            .as_ref()
            .ok_or_else(|| Error::failed_precondition("device memory is shut down"))?;
        f(self.allocator.backend(), stream)
    }
}

impl<B: Backend> DeviceMemory for VmmMemory<B> {
    fn info(&self) -> &DeviceInfo {
        self.allocator.backend().info()
    }

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
            inner: Box::new(buf),
        })
    }

    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.with_stream(|b, s| Ok(b.write_sync(dst, data, s)?))
    }

    fn download(&self, out: &mut [u8], src: DevicePtr) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.with_stream(|b, s| Ok(b.read_sync(out, src, s)?))
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.with_stream(|b, s| {
            b.copy_d2d(dst, src, bytes, s)?;
            Ok(b.stream_synchronize(s)?)
        })
    }

    fn stats(&self) -> VmmStats {
        self.allocator.stats()
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        Ok(self.allocator.backend().mem_info()?)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn load_program(&self, plan: xla_vmm::Plan) -> Result<Box<dyn Program>> {
        let p = RuntimeProgram::load(
            self.allocator.backend().clone(),
            plan,
            self.gemm.clone(),
            self.threshold,
        )?;
        Ok(Box::new(p))
    }

    fn remap_handle(&self, a: &Allocation) -> Option<Box<dyn Any + Send>> {
        let buf = a.inner.downcast_ref::<VmmBuffer<B>>()?;
        Some(Box::new(xla_vmm_runtime::UserBuffer::from_vmm(buf)))
    }
}

impl<B: Backend> Drop for VmmMemory<B> {
    fn drop(&mut self) {
        let stream = self
            .stream
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(s) = stream {
            if let Err(e) = self.allocator.backend().stream_destroy(s) {
                tracing::warn!("stream_destroy at shutdown: {e}");
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

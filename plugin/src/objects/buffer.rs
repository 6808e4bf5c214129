//! `PJRT_Buffer`: an array in device memory from the VMM allocator.
//!
//! A buffer is live until `PJRT_Buffer_Delete` or donation to an execution;
//! after that every access is an error that says which of the two happened
//! (`PJRT_Buffer_Destroy` only drops the handle). Device layout is always
//! dense major-to-minor; host layouts may be strided or permuted.
//!
//! Each buffer has a *ready* event, completed by the client's completion
//! thread: for an upload when its copy has landed (`BufferFromHostBuffer`
//! stages the bytes in pinned memory and enqueues the copy behind the work
//! already queued, without waiting for it: `staging.rs`), for outputs of
//! executions and device copies when the device has made them. Reads and
//! writes need not wait for it: they are all ordered on the client's
//! stream (`runtime/context.rs`), and deleting a buffer frees its memory after the
//! work already queued.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller;
use crate::cabi::dtype;
use crate::cabi::error::{Error, Result};
use crate::cabi::handles::{Handle, Registry};
use crate::objects::client::{self, Client};
use crate::objects::device::{Device, Memory};
use crate::runtime::context::Allocation;
use crate::runtime::event::Event;

pub enum State {
    Live(Allocation),
    /// Deleted; the memory is kept while external references (a zero-copy
    /// numpy view of a pinned host buffer, DLPack) remain, freed with the
    /// last one.
    Deleted(Option<Allocation>),
    Donated,
}

pub struct Buffer {
    pub device: Arc<Device>,
    pub memory: Arc<Memory>,
    pub dtype: PJRT_Buffer_Type,
    pub dims: Vec<i64>,
    minor_to_major: Vec<i64>,
    /// Logical size in bytes (elements × element size).
    pub bytes: u64,
    state: Mutex<State>,
    /// Completes when the buffer's producer has run on the device.
    ready: Mutex<Arc<Event>>,
    /// `IncreaseExternalReferenceCount` calls not yet matched by a decrease
    /// (changed under the state lock, so that a delete sees it).
    external_refs: AtomicU64,
}

static BUFFERS: Registry<Buffer> = Registry::new();

impl Handle for Buffer {
    type C = PJRT_Buffer;
    const KIND: &'static str = "PJRT_Buffer";
    fn registry() -> &'static Registry<Self> {
        &BUFFERS
    }
}

/// Number of live `PJRT_Buffer` handles (leak checks in tests).
pub fn live_buffers() -> usize {
    BUFFERS.len()
}

/// Sanity limit on a host array's byte extent (guards against garbage strides).
const MAX_HOST_EXTENT: i64 = 1 << 46;

/// Dense bytes of a `dtype` array of shape `dims` (an error if it overflows).
fn byte_size(dtype: PJRT_Buffer_Type, dims: &[i64]) -> Result<u64> {
    dtype::device_bytes(dtype, dtype::num_elements(dims)?)
        .map_err(|_| Error::invalid(format!("shape {dims:?} overflows")))
}

impl Buffer {
    /// A new buffer of `dtype[dims]` on `device`, uninitialized.
    pub fn alloc(
        device: Arc<Device>,
        dtype: PJRT_Buffer_Type,
        dims: &[i64],
    ) -> Result<Arc<Buffer>> {
        let memory = device.default_memory()?;
        Self::alloc_in(device, memory, dtype, dims)
    }

    /// A new buffer of `dtype[dims]` in `memory` (one of `device`'s: its
    /// device memory or its pinned host memory), uninitialized.
    pub fn alloc_in(
        device: Arc<Device>,
        memory: Arc<Memory>,
        dtype: PJRT_Buffer_Type,
        dims: &[i64],
    ) -> Result<Arc<Buffer>> {
        let bytes = byte_size(dtype, dims)?;
        let allocation = if memory.kind == crate::objects::device::PINNED_HOST_MEMORY_KIND {
            device.mem.alloc_host(bytes)?
        } else {
            device.mem.alloc(bytes)?
        };
        Self::from_allocation_in(
            device,
            memory,
            dtype,
            dims,
            allocation,
            Event::ready(Ok(())),
        )
    }

    /// A buffer over an existing allocation (an execution's output), ready
    /// when `ready` completes.
    pub fn from_allocation(
        device: Arc<Device>,
        dtype: PJRT_Buffer_Type,
        dims: &[i64],
        allocation: Allocation,
        ready: Arc<Event>,
    ) -> Result<Arc<Buffer>> {
        let memory = device.default_memory()?;
        Self::from_allocation_in(device, memory, dtype, dims, allocation, ready)
    }

    /// [`from_allocation`](Self::from_allocation) in `memory`.
    pub fn from_allocation_in(
        device: Arc<Device>,
        memory: Arc<Memory>,
        dtype: PJRT_Buffer_Type,
        dims: &[i64],
        allocation: Allocation,
        ready: Arc<Event>,
    ) -> Result<Arc<Buffer>> {
        let bytes = byte_size(dtype, dims)?;
        Ok(Arc::new(Buffer {
            device,
            memory,
            dtype,
            dims: dims.to_vec(),
            minor_to_major: (0..dims.len() as i64).rev().collect(),
            bytes,
            state: Mutex::new(State::Live(allocation)),
            ready: Mutex::new(ready),
            external_refs: AtomicU64::new(0),
        }))
    }

    /// The event that completes when the buffer's contents are written.
    pub fn ready(&self) -> Arc<Event> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_ready(&self, e: Arc<Event>) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gone(state: &State) -> Error {
        let what = match state {
            State::Donated => "was donated to an execution (its memory now belongs to the output)",
            _ => "was deleted",
        };
        Error::failed_precondition(format!("the buffer {what}; it cannot be used any more"))
    }

    /// Run `f` on the live allocation.
    pub fn with_live<T>(&self, f: impl FnOnce(&Allocation) -> Result<T>) -> Result<T> {
        match &*self.lock() {
            State::Live(a) => f(a),
            other => Err(Self::gone(other)),
        }
    }

    /// [`Buffer::with_live`] with the allocation to change (its memory
    /// moved under its address).
    pub fn with_live_mut<T>(&self, f: impl FnOnce(&mut Allocation) -> Result<T>) -> Result<T> {
        match &mut *self.lock() {
            State::Live(a) => f(a),
            other => Err(Self::gone(other)),
        }
    }

    /// Take the allocation out for donation; the buffer reads as donated.
    pub fn take_for_donation(&self) -> Result<Allocation> {
        let mut s = self.lock();
        if matches!(*s, State::Live(_)) {
            self.check_donatable()?;
        }
        match std::mem::replace(&mut *s, State::Donated) {
            State::Live(a) => Ok(a),
            other => {
                let e = Self::gone(&other);
                *s = other;
                Err(e)
            }
        }
    }

    /// Delete: the memory is freed after the work already queued on the
    /// stream (which may still read or write it).
    /// Memory that external references still read is kept until the last
    /// of them is dropped.
    pub fn delete(&self) {
        let freed = {
            let mut s = self.lock();
            let State::Live(_) = *s else { return };
            let held = self.external_refs.load(Ordering::Acquire) > 0;
            match std::mem::replace(&mut *s, State::Deleted(None)) {
                State::Live(a) if held => {
                    *s = State::Deleted(Some(a));
                    None
                }
                State::Live(a) => Some(a),
                _ => None,
            }
        };
        drop(freed);
    }

    /// Does an external reference (a zero-copy view, a DLPack export) read
    /// its memory now?
    pub fn externally_held(&self) -> bool {
        self.external_refs.load(Ordering::Acquire) > 0
    }

    /// Donation hands the memory to an output: refused while an external
    /// reference (a zero-copy view, a DLPack export) reads it.
    pub fn check_donatable(&self) -> Result<()> {
        match self.external_refs.load(Ordering::Acquire) {
            0 => Ok(()),
            refs => Err(Error::invalid(format!(
                "the buffer has {refs} external reference(s) (a zero-copy view or DLPack \
                 export reads its memory); it cannot be donated"
            ))),
        }
    }

    /// In the pinned host memory space (JAX reads it in place: `IsOnCpu`)?
    pub fn on_host(&self) -> bool {
        self.memory.kind == crate::objects::device::PINNED_HOST_MEMORY_KIND
    }

    fn add_external_ref(&self) -> Result<()> {
        self.with_live(|_| {
            self.external_refs.fetch_add(1, Ordering::AcqRel);
            Ok(())
        })
    }

    fn drop_external_ref(&self) -> Result<()> {
        let freed = {
            let mut s = self.lock();
            self.external_refs
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .map_err(|_| {
                    Error::failed_precondition(
                        "DecreaseExternalReferenceCount without a matching increase (the count is 0)",
                    )
                })?;
            match &mut *s {
                State::Deleted(kept) if self.external_refs.load(Ordering::Acquire) == 0 => {
                    kept.take()
                }
                _ => None,
            }
        };
        drop(freed);
        Ok(())
    }

    pub fn is_deleted(&self) -> bool {
        !matches!(*self.lock(), State::Live(_))
    }

    /// Dense major-to-minor bytes of the whole buffer, once its producer has
    /// completed (a failed producer's error). Not behind the work queued
    /// since (the next step in flight): a live buffer is immutable, and the
    /// state lock held during the copy keeps it from being deleted or
    /// donated meanwhile.
    pub fn read_all(&self) -> Result<Vec<u8>> {
        self.ready().wait()?;
        let mut out = vec![0u8; self.bytes as usize];
        self.with_live(|a| self.device.mem.download(&mut out, a.ptr))?;
        Ok(out)
    }
}

/// Host byte strides for `layout` (null = dense major-to-minor).
fn host_strides(
    layout: *const PJRT_Buffer_MemoryLayout,
    dims: &[i64],
    elem: usize,
) -> Result<Vec<i64>> {
    if layout.is_null() {
        return Ok(dtype::dense_strides(dims, elem));
    }
    match caller::host_layout(layout)? {
        caller::HostLayout::Strides(strides) => {
            if strides.len() != dims.len() {
                return Err(Error::invalid(format!(
                    "{} byte strides for a rank-{} array",
                    strides.len(),
                    dims.len()
                )));
            }
            Ok(strides.to_vec())
        }
        caller::HostLayout::Tiled {
            minor_to_major,
            num_tiles,
        } => {
            if num_tiles != 0 {
                return Err(Error::unimplemented("tiled host layouts are not supported"));
            }
            dtype::strides_from_minor_to_major(dims, minor_to_major, elem)
        }
    }
}

fn check_extent(lo: i64, hi: i64) -> Result<()> {
    if lo <= -MAX_HOST_EXTENT || hi >= MAX_HOST_EXTENT {
        return Err(Error::invalid(format!(
            "host array extent [{lo}, {hi}) is implausible (bad strides?)"
        )));
    }
    Ok(())
}

// ---- entries ----------------------------------------------------------------

pub fn from_host(a: &mut PJRT_Client_BufferFromHostBuffer_Args) -> Result<()> {
    let _span = xla_vmm_runtime::trace::span("transfer to device");
    let client = Client::from_c(a.client)?;
    let (device, memory) = if !a.memory.is_null() {
        let device = client::memory_device(&client, a.memory)?;
        (device, Memory::from_c(a.memory)?)
    } else {
        let device = client.device(a.device)?;
        let memory = device.default_memory()?;
        (device, memory)
    };
    if !(PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
        ..=PJRT_HostBufferSemantics_kMutableZeroCopy)
        .contains(&a.host_buffer_semantics)
    {
        return Err(Error::invalid(format!(
            "host_buffer_semantics = {}: not a PJRT_HostBufferSemantics",
            a.host_buffer_semantics
        )));
    }
    let dims = caller::vec_at_most(a.dims, a.num_dims, caller::MAX_RANK, "dims")?;
    let elem = dtype::host_element_size(a.type_)?;
    if !a.device_layout.is_null() {
        let strides = host_strides(a.device_layout, &dims, elem)?;
        if strides != dtype::dense_strides(&dims, elem) {
            return Err(Error::unimplemented(
                "device layouts other than dense major-to-minor are not supported",
            ));
        }
    }
    let strides = if a.num_byte_strides == 0 {
        dtype::dense_strides(&dims, elem)
    } else {
        let s = caller::slice(a.byte_strides, a.num_byte_strides, "byte_strides")?;
        if s.len() != dims.len() {
            return Err(Error::invalid(format!(
                "{} byte strides for a rank-{} array",
                s.len(),
                dims.len()
            )));
        }
        s.to_vec()
    };
    let buffer = Buffer::alloc_in(device, memory, a.type_, &dims)?;
    let (lo, hi) = dtype::extent(&dims, &strides, elem);
    check_extent(lo, hi)?;
    if buffer.bytes > 0 {
        let start = a.data.cast::<u8>().wrapping_offset(lo as isize);
        let src = caller::slice(start, (hi - lo) as usize, "data")?;
        let dense_strides = dtype::dense_strides(&dims, elem);
        // Staged and enqueued behind the work on the stream (not waiting for
        // it); the buffer is ready when the copy has landed.
        let landed = buffer.with_live(|alloc| {
            let bits = dtype::sub_byte_bits(a.type_);
            if strides == dense_strides && bits.is_none() {
                return buffer.device.mem.upload(alloc.ptr, src);
            }
            let dense = if strides == dense_strides {
                src.to_vec()
            } else {
                dtype::gather(src, -lo, &dims, &strides, elem)
            };
            match bits {
                Some(bits) => buffer
                    .device
                    .mem
                    .upload(alloc.ptr, &dtype::pack(&dense, bits)),
                None => buffer.device.mem.upload(alloc.ptr, &dense),
            }
        })?;
        if let Some(e) = landed {
            buffer.set_ready(e);
        }
    }
    // The host data was copied (to the device, or to staging memory) before
    // this returns: it may be freed at once.
    a.done_with_host_buffer = Event::ready(Ok(())).into_c();
    a.buffer = buffer.into_c();
    Ok(())
}

pub fn to_host(a: &mut PJRT_Buffer_ToHostBuffer_Args) -> Result<()> {
    let _span = xla_vmm_runtime::trace::span("transfer to host");
    let b = Buffer::from_c(a.src)?;
    let elem = dtype::host_element_size(b.dtype)?;
    let strides = host_strides(a.host_layout, &b.dims, elem)?;
    let (lo, hi) = dtype::extent(&b.dims, &strides, elem);
    check_extent(lo, hi)?;
    let needed = (hi - lo) as usize;
    if a.dst.is_null() {
        a.dst_size = needed;
        return Ok(());
    }
    if a.dst_size < needed {
        return Err(Error::invalid(format!(
            "dst_size is {} bytes, the buffer needs {needed}",
            a.dst_size
        )));
    }
    let mut data = b.read_all()?;
    if let Some(bits) = dtype::sub_byte_bits(b.dtype) {
        data = dtype::unpack(&data, bits, dtype::num_elements(&b.dims)? as usize);
    }
    let dst = caller::slice_mut(a.dst.cast::<u8>(), needed, "dst")?;
    if strides == dtype::dense_strides(&b.dims, elem) {
        dst.copy_from_slice(&data);
    } else {
        dtype::scatter(&data, dst, -lo, &b.dims, &strides, elem);
    }
    a.event = Event::ready(Ok(())).into_c();
    Ok(())
}

/// A copy of `b` in `memory` of `device` (device memory or pinned host
/// memory: the device reaches both).
fn copy_to(b: &Buffer, device: Arc<Device>, memory: Arc<Memory>) -> Result<Arc<Buffer>> {
    let out = Buffer::alloc_in(device, memory, b.dtype, &b.dims)?;
    if Arc::ptr_eq(&out.device.mem, &b.device.mem) {
        // Enqueued after the source's producer; ready when done.
        b.with_live(|src| out.with_live(|dst| b.device.mem.copy(dst.ptr, src.ptr, b.bytes)))?;
        let done = Event::pending();
        out.set_ready(done.clone());
        b.device.mem.complete_after(done);
    } else {
        let data = b.read_all()?;
        if let Some(landed) = out.with_live(|dst| out.device.mem.upload(dst.ptr, &data))? {
            out.set_ready(landed);
        }
    }
    Ok(out)
}

pub fn copy_to_device(a: &mut PJRT_Buffer_CopyToDevice_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    let device = Device::from_c(a.dst_device)?;
    let memory = device.default_memory()?;
    a.dst_buffer = copy_to(&b, device, memory)?.into_c();
    Ok(())
}

pub fn copy_to_memory(a: &mut PJRT_Buffer_CopyToMemory_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    let m = Memory::from_c(a.dst_memory)?;
    // A memory of some device (its device memory or its pinned host memory):
    // jax's device_put to a device or to a memory kind copies this way.
    let device = match m.first_device() {
        Some(d) => Device::from_c(d)?,
        None => b.device.clone(),
    };
    a.dst_buffer = copy_to(&b, device, m)?.into_c();
    Ok(())
}

pub fn destroy(a: &mut PJRT_Buffer_Destroy_Args) -> Result<()> {
    Buffer::release(a.buffer)?;
    Ok(())
}

pub fn delete(a: &mut PJRT_Buffer_Delete_Args) -> Result<()> {
    Buffer::from_c(a.buffer)?.delete();
    Ok(())
}

pub fn is_deleted(a: &mut PJRT_Buffer_IsDeleted_Args) -> Result<()> {
    a.is_deleted = Buffer::from_c(a.buffer)?.is_deleted();
    Ok(())
}

pub fn element_type(a: &mut PJRT_Buffer_ElementType_Args) -> Result<()> {
    a.type_ = Buffer::from_c(a.buffer)?.dtype;
    Ok(())
}

pub fn dimensions(a: &mut PJRT_Buffer_Dimensions_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    // Lives as long as the buffer handle.
    a.dims = b.dims.as_ptr();
    a.num_dims = b.dims.len();
    Ok(())
}

pub fn unpadded_dimensions(a: &mut PJRT_Buffer_UnpaddedDimensions_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    a.unpadded_dims = b.dims.as_ptr();
    a.num_dims = b.dims.len();
    Ok(())
}

pub fn dynamic_dimension_indices(a: &mut PJRT_Buffer_DynamicDimensionIndices_Args) -> Result<()> {
    Buffer::from_c(a.buffer)?;
    a.dynamic_dim_indices = std::ptr::null();
    a.num_dynamic_dims = 0;
    Ok(())
}

pub fn memory_layout(a: &mut PJRT_Buffer_GetMemoryLayout_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    a.layout.type_ = PJRT_Buffer_MemoryLayout_Type_Tiled;
    a.layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE as usize;
    a.layout.__bindgen_anon_1.tiled = PJRT_Buffer_MemoryLayout_Tiled {
        struct_size: PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE as usize,
        extension_start: std::ptr::null_mut(),
        minor_to_major: b.minor_to_major.as_ptr(),
        minor_to_major_size: b.minor_to_major.len(),
        tile_dims: std::ptr::null(),
        tile_dim_sizes: std::ptr::null(),
        num_tiles: 0,
    };
    Ok(())
}

pub fn on_device_size(a: &mut PJRT_Buffer_OnDeviceSizeInBytes_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    b.with_live(|_| Ok(()))?;
    a.on_device_size_in_bytes = b.bytes as usize;
    Ok(())
}

pub fn device(a: &mut PJRT_Buffer_Device_Args) -> Result<()> {
    a.device = Buffer::from_c(a.buffer)?.device.c_ptr();
    Ok(())
}

pub fn memory(a: &mut PJRT_Buffer_Memory_Args) -> Result<()> {
    a.memory = Buffer::from_c(a.buffer)?.memory.c_ptr();
    Ok(())
}

/// A pinned host buffer is on the CPU: JAX then reads it in place (a
/// zero-copy numpy view over the host address, held by an external
/// reference) instead of copying it.
pub fn is_on_cpu(a: &mut PJRT_Buffer_IsOnCpu_Args) -> Result<()> {
    a.is_on_cpu = Buffer::from_c(a.buffer)?.on_host();
    Ok(())
}

pub fn ready_event(a: &mut PJRT_Buffer_ReadyEvent_Args) -> Result<()> {
    let b = Buffer::from_c(a.buffer)?;
    // Each call hands out its own event (the caller destroys it).
    a.event = b.ready().follower().into_c();
    Ok(())
}

/// The address of the buffer's memory: the device address, or the host
/// address of a pinned host buffer (where the CPU reads it).
fn address(b: &Buffer) -> Result<usize> {
    b.with_live(|al| Ok(al.host_addr.unwrap_or(al.ptr.0 as usize)))
}

pub fn unsafe_pointer(a: &mut PJRT_Buffer_UnsafePointer_Args) -> Result<()> {
    a.buffer_pointer = address(&*Buffer::from_c(a.buffer)?)?;
    Ok(())
}

pub fn opaque_device_pointer(a: &mut PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args) -> Result<()> {
    a.device_memory_ptr = address(&*Buffer::from_c(a.buffer)?)? as *mut std::ffi::c_void;
    Ok(())
}

pub fn increase_external_ref(
    a: &mut PJRT_Buffer_IncreaseExternalReferenceCount_Args,
) -> Result<()> {
    Buffer::from_c(a.buffer)?.add_external_ref()
}

pub fn decrease_external_ref(
    a: &mut PJRT_Buffer_DecreaseExternalReferenceCount_Args,
) -> Result<()> {
    Buffer::from_c(a.buffer)?.drop_external_ref()
}

//! RAII wrappers over backend handles: [`Phys`] (a physical allocation) and
//! [`VaReservation`] (a reserved VA range and the mappings inside it).
//!
//! Ownership enforces teardown order: a mapping holds an `Arc<Phys>`, so the
//! physical memory outlives every mapping of it, and a reservation unmaps
//! everything before freeing its range. Errors met in `Drop` are not lost:
//! they go to the [`VmmContext`]'s list, read with
//! [`VmmContext::take_deferred_errors`]. Explicit `release` methods return
//! them instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, DevicePtr};
use crate::budget::MemLocation;
use crate::error::{DeviceError, Result};

#[derive(Default, Debug)]
struct Shared {
    deferred: Mutex<Vec<DeviceError>>,
    phys_handles: AtomicU64,
    phys_bytes: AtomicU64,
    va_handles: AtomicU64,
    va_bytes: AtomicU64,
    mapped_bytes: AtomicU64,
}

/// Counters of the handles owned through one [`VmmContext`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HandleCounts {
    pub phys_handles: u64,
    pub phys_bytes: u64,
    pub va_handles: u64,
    pub va_bytes: u64,
    pub mapped_bytes: u64,
}

/// A backend plus the shared bookkeeping of the wrappers made from it.
pub struct VmmContext<B: Backend> {
    backend: Arc<B>,
    shared: Arc<Shared>,
}

impl<B: Backend> Clone for VmmContext<B> {
    fn clone(&self) -> Self {
        VmmContext {
            backend: self.backend.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<B: Backend> VmmContext<B> {
    pub fn new(backend: Arc<B>) -> Self {
        VmmContext {
            backend,
            shared: Arc::default(),
        }
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Errors that happened while dropping wrappers made from this context.
    pub fn take_deferred_errors(&self) -> Vec<DeviceError> {
        std::mem::take(
            &mut *self
                .shared
                .deferred
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Record an error that cannot be returned (teardown).
    pub fn record_deferred(&self, e: DeviceError) {
        tracing::warn!(error = %e, "device error during teardown");
        self.shared
            .deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    pub fn handle_counts(&self) -> HandleCounts {
        let s = &self.shared;
        HandleCounts {
            phys_handles: s.phys_handles.load(Ordering::Relaxed),
            phys_bytes: s.phys_bytes.load(Ordering::Relaxed),
            va_handles: s.va_handles.load(Ordering::Relaxed),
            va_bytes: s.va_bytes.load(Ordering::Relaxed),
            mapped_bytes: s.mapped_bytes.load(Ordering::Relaxed),
        }
    }
}

/// An owned physical allocation. Share it as `Arc<Phys<B>>`: mappings hold
/// one, so it is released only after its last mapping is gone.
pub struct Phys<B: Backend> {
    ctx: VmmContext<B>,
    raw: Option<B::PhysMem>,
    size: u64,
}

impl<B: Backend> std::fmt::Debug for Phys<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phys")
            .field("raw", &self.raw)
            .field("size", &self.size)
            .finish()
    }
}

impl<B: Backend> Phys<B> {
    /// `mem_create(bytes)` (where the device's budget has room: see
    /// [`crate::budget`]); `bytes` must be a multiple of the granularity.
    pub fn create(ctx: &VmmContext<B>, bytes: u64) -> Result<Self> {
        let raw = ctx.backend.mem_create(bytes)?;
        Ok(Self::adopt(ctx, raw, bytes))
    }

    /// `mem_create_device(bytes)`: device memory for an ordinary
    /// allocation (the staging reserve left free), or out of memory.
    pub fn create_device(ctx: &VmmContext<B>, bytes: u64) -> Result<Self> {
        let raw = ctx.backend.mem_create_device(bytes)?;
        Ok(Self::adopt(ctx, raw, bytes))
    }

    /// `mem_create_at(bytes, location)`: there or out of memory.
    pub fn create_at(ctx: &VmmContext<B>, bytes: u64, location: MemLocation) -> Result<Self> {
        let raw = ctx.backend.mem_create_at(bytes, location)?;
        Ok(Self::adopt(ctx, raw, bytes))
    }

    fn adopt(ctx: &VmmContext<B>, raw: B::PhysMem, bytes: u64) -> Self {
        ctx.shared.phys_handles.fetch_add(1, Ordering::Relaxed);
        ctx.shared.phys_bytes.fetch_add(bytes, Ordering::Relaxed);
        Phys {
            ctx: ctx.clone(),
            raw: Some(raw),
            size: bytes,
        }
    }

    /// Where the memory lives.
    pub fn location(&self) -> MemLocation {
        self.ctx.backend.mem_location(self.raw())
    }

    /// The backend handle (to map it elsewhere with `Backend::map`).
    pub fn raw(&self) -> &B::PhysMem {
        self.raw.as_ref().expect("present until drop")
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Release now and return the error, if any.
    pub fn release(mut self) -> Result<()> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<()> {
        match self.raw.take() {
            Some(raw) => {
                self.ctx.shared.phys_handles.fetch_sub(1, Ordering::Relaxed);
                self.ctx
                    .shared
                    .phys_bytes
                    .fetch_sub(self.size, Ordering::Relaxed);
                self.ctx.backend.mem_release(raw)
            }
            None => Ok(()),
        }
    }
}

impl<B: Backend> Drop for Phys<B> {
    fn drop(&mut self) {
        if let Err(e) = self.release_inner() {
            self.ctx.record_deferred(e);
        }
    }
}

/// One mapping inside a reservation.
#[derive(Debug)]
pub struct Mapping<B: Backend> {
    pub phys: Arc<Phys<B>>,
    pub phys_offset: u64,
    pub size: u64,
}

/// An owned VA reservation and the mappings inside it.
pub struct VaReservation<B: Backend> {
    ctx: VmmContext<B>,
    raw: Option<B::VaRange>,
    base: DevicePtr,
    size: u64,
    maps: BTreeMap<u64, Mapping<B>>,
}

impl<B: Backend> std::fmt::Debug for VaReservation<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaReservation")
            .field("base", &self.base)
            .field("size", &self.size)
            .field("mappings", &self.maps.len())
            .finish()
    }
}

impl<B: Backend> VaReservation<B> {
    /// `va_reserve(bytes, align)` (align 0 = granularity).
    pub fn reserve(ctx: &VmmContext<B>, bytes: u64, align: u64) -> Result<Self> {
        let raw = ctx.backend.va_reserve(bytes, align)?;
        let base = ctx.backend.va_base(&raw);
        ctx.shared.va_handles.fetch_add(1, Ordering::Relaxed);
        ctx.shared.va_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(VaReservation {
            ctx: ctx.clone(),
            raw: Some(raw),
            base,
            size: bytes,
            maps: BTreeMap::new(),
        })
    }

    pub fn base(&self) -> DevicePtr {
        self.base
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn raw(&self) -> &B::VaRange {
        self.raw.as_ref().expect("present until drop")
    }

    /// Map `bytes` of `phys` (from `phys_offset`) at `offset`. No access yet.
    pub fn map(
        &mut self,
        offset: u64,
        phys: &Arc<Phys<B>>,
        phys_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        self.ctx
            .backend
            .map(self.raw(), offset, phys.raw(), phys_offset, bytes)?;
        self.ctx
            .shared
            .mapped_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        self.maps.insert(
            offset,
            Mapping {
                phys: phys.clone(),
                phys_offset,
                size: bytes,
            },
        );
        Ok(())
    }

    /// Grant read/write access to `[offset, +bytes)` (must be mapped).
    pub fn set_access(&self, offset: u64, bytes: u64) -> Result<()> {
        self.ctx.backend.set_access(self.raw(), offset, bytes)
    }

    /// `map` + `set_access`; on failure nothing stays mapped.
    pub fn map_rw(
        &mut self,
        offset: u64,
        phys: &Arc<Phys<B>>,
        phys_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        self.map(offset, phys, phys_offset, bytes)?;
        if let Err(e) = self.set_access(offset, bytes) {
            if let Err(u) = self.unmap_retry(offset) {
                self.ctx.record_deferred(u);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Unmap the mapping that starts at `offset`. On error it stays mapped
    /// (and recorded), so the reservation stays consistent with the driver.
    pub fn unmap(&mut self, offset: u64) -> Result<Arc<Phys<B>>> {
        let size = self
            .maps
            .get(&offset)
            .ok_or_else(|| {
                DeviceError::InvalidArgument(format!("no mapping starts at offset {offset:#x}"))
            })?
            .size;
        self.ctx.backend.unmap(self.raw(), offset, size)?;
        self.ctx
            .shared
            .mapped_bytes
            .fetch_sub(size, Ordering::Relaxed);
        Ok(self.maps.remove(&offset).expect("checked").phys)
    }

    /// Move the memory mapped at `offset` (a whole physical allocation) to
    /// new physical memory at `location`, under the same addresses: the new
    /// memory is created (within the budget), its bytes copied from the old
    /// on `stream` when `copy` (waited for: the caller makes sure nothing
    /// else writes the range meanwhile), then mapped in place of the old.
    /// Returns the new memory; the old goes when its last holder drops it.
    /// Counted in the budget ([`crate::MemoryBudget::relocations`]).
    /// On an error the old memory stays mapped (if even remapping it fails,
    /// that error is returned and the range is left unmapped).
    pub fn relocate(
        &mut self,
        offset: u64,
        location: MemLocation,
        copy: Option<&B::Stream>,
    ) -> Result<Arc<Phys<B>>> {
        let (old, size) = match self.maps.get(&offset) {
            Some(m) if m.phys_offset == 0 && m.size == m.phys.size() => (m.phys.clone(), m.size),
            Some(_) => {
                return Err(DeviceError::InvalidArgument(format!(
                    "the mapping at offset {offset:#x} is part of a physical allocation: it cannot move"
                )))
            }
            None => {
                return Err(DeviceError::InvalidArgument(format!(
                    "no mapping starts at offset {offset:#x}"
                )))
            }
        };
        let new = Arc::new(Phys::create_at(&self.ctx, size, location)?);
        if let Some(stream) = copy {
            let mut tmp = VaReservation::reserve(&self.ctx, size, 0)?;
            tmp.map_rw(0, &new, 0, size)?;
            let be = &self.ctx.backend;
            be.copy_d2d(tmp.base(), self.base.offset(offset), size, stream)?;
            be.stream_synchronize(stream)?;
            tmp.release()?;
        }
        self.unmap(offset)?;
        if let Err(e) = self.map_rw(offset, &new, 0, size) {
            self.map_rw(offset, &old, 0, size)?;
            return Err(e);
        }
        self.ctx.backend.budget().note_relocation();
        Ok(new)
    }

    /// Teardown flavour of `unmap`: one retry (a transient failure must not
    /// leak the range), the first error is returned.
    fn unmap_retry(&mut self, offset: u64) -> Result<()> {
        match self.unmap(offset) {
            Ok(_) => Ok(()),
            Err(first) => {
                self.unmap(offset).map(|_| ()).or(Err(first.clone()))?;
                Err(first)
            }
        }
    }

    /// The mapping starting at `offset`.
    pub fn mapping(&self, offset: u64) -> Option<&Mapping<B>> {
        self.maps.get(&offset)
    }

    pub fn mappings(&self) -> impl Iterator<Item = (u64, &Mapping<B>)> {
        self.maps.iter().map(|(o, m)| (*o, m))
    }

    /// Unmap everything and free the range; the first error is returned
    /// (later ones are recorded as deferred).
    pub fn release(mut self) -> Result<()> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<()> {
        let Some(_) = self.raw.as_ref() else {
            return Ok(());
        };
        let mut first: Option<DeviceError> = None;
        let offsets: Vec<u64> = self.maps.keys().copied().collect();
        for off in offsets {
            if let Err(e) = self.unmap_retry(off) {
                if first.is_some() {
                    self.ctx.record_deferred(e);
                } else {
                    first = Some(e);
                }
            }
        }
        if self.maps.is_empty() {
            let raw = self.raw.take().expect("checked");
            self.ctx.shared.va_handles.fetch_sub(1, Ordering::Relaxed);
            self.ctx
                .shared
                .va_bytes
                .fetch_sub(self.size, Ordering::Relaxed);
            if let Err(e) = self.ctx.backend.va_free(raw) {
                if first.is_some() {
                    self.ctx.record_deferred(e);
                } else {
                    first = Some(e);
                }
            }
        } else {
            // Still mapped after the retries: freeing the range would fail
            // too. It is leaked (and counted as outstanding), never reused.
            let e = DeviceError::InvalidArgument(format!(
                "VA range {:#x} leaked: {} mapping(s) could not be unmapped",
                self.base.0,
                self.maps.len()
            ));
            if first.is_some() {
                self.ctx.record_deferred(e);
            } else {
                first = Some(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<B: Backend> Drop for VaReservation<B> {
    fn drop(&mut self) {
        if let Err(e) = self.release_inner() {
            self.ctx.record_deferred(e);
        }
    }
}

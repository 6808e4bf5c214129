//! Slot → device address resolution, in ONE place (XLA's
//! `BufferAllocations`), and the per-slot device memory the executable owns.
//!
//! Thunks hold [`Slice`]s, never pointers. Every address the executor uses
//! comes from [`SlotTable::resolve`], so binding a run to other memory (or,
//! later, to one VA reservation holding every slot) is swapping this table.

use std::sync::Arc;
use xla_vmm::Slice;

use xla_vmm_device::vmm::{Phys, VaReservation, VmmContext};
use xla_vmm_device::{Backend, DevicePtr, MemLocation};

use crate::error::{Result, RuntimeError};

/// Base address and size of every allocation (slot) of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotTable {
    bases: Vec<DevicePtr>,
    sizes: Vec<u64>,
    /// Byte ranges served from elsewhere for now (staged copies in device
    /// memory, [`crate::staging`]); empty unless a program is staged.
    redirects: Vec<Redirect>,
}

/// Bytes `start..end` of slot `allocation` are at `to` for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Redirect {
    pub allocation: usize,
    pub start: u64,
    pub end: u64,
    pub to: DevicePtr,
}

impl SlotTable {
    /// A table of `n` unbound slots.
    pub fn new(n: usize) -> Self {
        SlotTable {
            bases: vec![DevicePtr::NULL; n],
            sizes: vec![0; n],
            redirects: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.bases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bases.is_empty()
    }

    /// Bind slot `index` to `size` bytes at `base`.
    pub fn bind(&mut self, index: usize, base: DevicePtr, size: u64) -> Result<()> {
        let n = self.bases.len();
        let (b, s) = self
            .bases
            .get_mut(index)
            .zip(self.sizes.get_mut(index))
            .ok_or_else(|| RuntimeError::invalid(format!("slot {index} of {n}")))?;
        *b = base;
        *s = size;
        Ok(())
    }

    /// Base address of slot `index`.
    pub fn base(&self, index: usize) -> Result<DevicePtr> {
        self.bases
            .get(index)
            .copied()
            .ok_or_else(|| RuntimeError::invalid(format!("slot {index} of {}", self.bases.len())))
    }

    pub fn size(&self, index: usize) -> Result<u64> {
        self.sizes
            .get(index)
            .copied()
            .ok_or_else(|| RuntimeError::invalid(format!("slot {index} of {}", self.sizes.len())))
    }

    /// The device address of `slice`: `base(slot) + offset`, checked against
    /// the bound size. A zero-sized slice of an unbound slot resolves to null.
    pub fn resolve(&self, slice: &Slice) -> Result<DevicePtr> {
        let base = self.base(slice.allocation)?;
        let size = self.sizes[slice.allocation];
        if slice.end() > size {
            return Err(RuntimeError::invalid(format!(
                "slice {}+{} of slot {} is outside its {size} bytes",
                slice.offset, slice.size, slice.allocation
            )));
        }
        if base == DevicePtr::NULL {
            if slice.size == 0 {
                return Ok(DevicePtr::NULL);
            }
            return Err(RuntimeError::invalid(format!(
                "slot {} is not bound to memory",
                slice.allocation
            )));
        }
        if !self.redirects.is_empty() {
            if let Some(to) = self.redirected(slice)? {
                return Ok(to);
            }
        }
        Ok(base.offset(slice.offset))
    }

    /// Where a redirect serves `slice` (a slice straddling one's edge is
    /// an error: the staging plan stages whole segments).
    fn redirected(&self, slice: &Slice) -> Result<Option<DevicePtr>> {
        for r in &self.redirects {
            if r.allocation != slice.allocation || slice.size == 0 {
                continue;
            }
            if r.start <= slice.offset && slice.end() <= r.end {
                return Ok(Some(r.to.offset(slice.offset - r.start)));
            }
            if slice.offset < r.end && r.start < slice.end() {
                return Err(RuntimeError::invalid(format!(
                    "slice {}+{} of slot {} straddles its staged bytes {}..{}",
                    slice.offset, slice.size, slice.allocation, r.start, r.end
                )));
            }
        }
        Ok(None)
    }

    /// Serve these ranges from elsewhere from now on (replacing the last).
    pub fn set_redirects(&mut self, redirects: &[Redirect]) {
        self.redirects.clear();
        self.redirects.extend_from_slice(redirects);
    }

    /// All bases, for cache keys (a captured graph is valid for one table).
    pub fn bases(&self) -> &[DevicePtr] {
        &self.bases
    }
}

/// A device buffer of its own: physical memory mapped read/write into a VA
/// reservation of its own, owned through [`xla_vmm_device::vmm`]'s RAII
/// types, so that dropping it unmaps and releases it (errors go to the
/// deferred list of its VMM context).
#[derive(Debug)]
pub struct DeviceBuffer<B: Backend> {
    /// Maps `phys` at offset 0 (holds it until unmapped).
    va: VaReservation<B>,
    phys: Arc<Phys<B>>,
    /// Bytes requested.
    size: u64,
    /// Bytes of `phys` mapped (all of it, or the start of memory others
    /// map too: [`DeviceBuffer::map_shared`]).
    mapped: u64,
    /// Made by [`DeviceBuffer::map_shared`]: its memory is not its own.
    shared: bool,
}

impl<B: Backend> DeviceBuffer<B> {
    /// Allocate at least `size` bytes (at least one granule), in a context
    /// of its own.
    pub fn alloc(backend: &Arc<B>, size: u64) -> Result<Self> {
        Self::alloc_in(&VmmContext::new(backend.clone()), size)
    }

    /// Allocate at least `size` bytes in `ctx` (whose deferred errors and
    /// handle counts it shares).
    pub fn alloc_in(ctx: &VmmContext<B>, size: u64) -> Result<Self> {
        Self::alloc_where(ctx, size, None)
    }

    /// Allocate at least `size` bytes in `ctx` at `location`, within the
    /// budget (never spilled elsewhere).
    pub fn alloc_at(ctx: &VmmContext<B>, size: u64, location: MemLocation) -> Result<Self> {
        Self::alloc_where(ctx, size, Some(location))
    }

    fn alloc_where(ctx: &VmmContext<B>, size: u64, at: Option<MemLocation>) -> Result<Self> {
        let gran = ctx.backend().info().vmm_granularity.max(1);
        let mapped = size.max(1).div_ceil(gran) * gran;
        let phys = Arc::new(match at {
            Some(l) => Phys::create_at(ctx, mapped, l)?,
            None => Phys::create(ctx, mapped)?,
        });
        let mut va = VaReservation::reserve(ctx, mapped, 0)?;
        va.map_rw(0, &phys, 0, mapped)?;
        Ok(DeviceBuffer {
            va,
            phys,
            size,
            mapped,
            shared: false,
        })
    }

    /// `size` bytes at the start of `phys` (memory other buffers map too:
    /// several programs' temporaries, never used at once), at an address of
    /// its own in `ctx`. The whole of `phys` is mapped, however small
    /// `size`: the CUDA driver refused to map a prefix of a larger shared
    /// memory (`CUDA_ERROR_NOT_SUPPORTED`, H100, driver 580.159.04), where
    /// whole allocations map at several addresses every step (VA-stable
    /// remaps).
    pub fn map_shared(ctx: &VmmContext<B>, phys: &Arc<Phys<B>>, size: u64) -> Result<Self> {
        let mapped = phys.size();
        if size > mapped {
            return Err(RuntimeError::invalid(format!(
                "{size} bytes mapped from {mapped} bytes of memory"
            )));
        }
        let mut va = VaReservation::reserve(ctx, mapped, 0)?;
        va.map_rw(0, phys, 0, mapped)?;
        Ok(DeviceBuffer {
            va,
            phys: phys.clone(),
            size,
            mapped,
            shared: true,
        })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.va.base()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes mapped (the size rounded up to the granularity).
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Is its memory mapped by other buffers too ([`DeviceBuffer::map_shared`])?
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// Where its memory lives.
    pub fn location(&self) -> MemLocation {
        self.phys.location()
    }

    /// Move its memory to `to` under the same address, its bytes copied on
    /// `copy` when given (waited for). `Ok(false)`: already there.
    /// Shared memory does not move (an error).
    pub fn relocate(&mut self, to: MemLocation, copy: Option<&B::Stream>) -> Result<bool> {
        if self.phys.location() == to {
            return Ok(false);
        }
        if self.shared {
            return Err(RuntimeError::invalid(
                "memory other buffers map too does not move",
            ));
        }
        self.phys = self.va.relocate(0, to, copy)?;
        Ok(true)
    }

    /// The physical memory (for mapping it again elsewhere).
    pub(crate) fn raw_mem(&self) -> &B::PhysMem {
        self.phys.raw()
    }

    /// Unmap and release now, returning the first error (the caller
    /// guarantees no queued work uses it). Dropping does the same, with the
    /// errors deferred to the context.
    pub fn free(self) -> Result<()> {
        let DeviceBuffer { va, phys, .. } = self;
        va.release()?;
        match Arc::try_unwrap(phys) {
            Ok(p) => p.release()?,
            // Still mapped elsewhere: released with its last mapping.
            Err(shared) => drop(shared),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_checks_bounds_and_binding() {
        let mut t = SlotTable::new(2);
        t.bind(0, DevicePtr(0x1000), 64).unwrap();
        let s = |allocation, offset, size| Slice {
            allocation,
            offset,
            size,
        };
        assert_eq!(t.resolve(&s(0, 16, 48)).unwrap(), DevicePtr(0x1010));
        assert!(t.resolve(&s(0, 16, 49)).is_err());
        assert!(t.resolve(&s(1, 0, 4)).is_err());
        assert_eq!(t.resolve(&s(1, 0, 0)).unwrap(), DevicePtr::NULL);
        assert!(t.resolve(&s(2, 0, 0)).is_err());
        assert!(t.bind(5, DevicePtr(1), 1).is_err());
        t.set_redirects(&[Redirect {
            allocation: 0,
            start: 16,
            end: 32,
            to: DevicePtr(0x9000),
        }]);
        assert_eq!(t.resolve(&s(0, 20, 8)).unwrap(), DevicePtr(0x9004));
        assert_eq!(t.resolve(&s(0, 32, 8)).unwrap(), DevicePtr(0x1020));
        assert!(t.resolve(&s(0, 8, 16)).is_err(), "straddles the redirect");
        t.set_redirects(&[]);
        assert_eq!(t.resolve(&s(0, 20, 8)).unwrap(), DevicePtr(0x1014));
    }
}

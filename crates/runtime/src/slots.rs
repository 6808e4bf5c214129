//! Slot → device address resolution, in ONE place (XLA's
//! `BufferAllocations`), and the per-slot device memory the executable owns.
//!
//! Thunks hold [`Slice`]s, never pointers. Every address the executor uses
//! comes from [`SlotTable::resolve`], so binding a run to other memory (or,
//! later, to one VA reservation holding every slot) is swapping this table.

use xla_vmm::Slice;
use xla_vmm_device::{Backend, DevicePtr};

use crate::error::{Result, RuntimeError};

/// Base address and size of every allocation (slot) of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotTable {
    bases: Vec<DevicePtr>,
    sizes: Vec<u64>,
}

impl SlotTable {
    /// A table of `n` unbound slots.
    pub fn new(n: usize) -> Self {
        SlotTable {
            bases: vec![DevicePtr::NULL; n],
            sizes: vec![0; n],
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
        Ok(base.offset(slice.offset))
    }

    /// All bases, for cache keys (a captured graph is valid for one table).
    pub fn bases(&self) -> &[DevicePtr] {
        &self.bases
    }
}

/// Device memory owned by the runtime: one VMM chunk mapped into its own
/// reservation, read/write for this device.
#[derive(Debug)]
pub struct DeviceBuffer<B: Backend> {
    mem: B::PhysMem,
    va: B::VaRange,
    ptr: DevicePtr,
    /// Bytes requested.
    size: u64,
    /// Bytes mapped (size rounded up to the granularity).
    mapped: u64,
}

impl<B: Backend> DeviceBuffer<B> {
    /// Allocate at least `size` bytes (at least one granule).
    pub fn alloc(backend: &B, size: u64) -> Result<Self> {
        let gran = backend.info().vmm_granularity.max(1);
        let mapped = size.max(1).div_ceil(gran) * gran;
        let mem = backend.mem_create(mapped)?;
        let va = match backend.va_reserve(mapped, 0) {
            Ok(va) => va,
            Err(e) => {
                backend.mem_release(mem).ok();
                return Err(e.into());
            }
        };
        if let Err(e) = backend
            .map(&va, 0, &mem, 0, mapped)
            .and_then(|()| backend.set_access(&va, 0, mapped))
        {
            backend.unmap(&va, 0, mapped).ok();
            backend.va_free(va).ok();
            backend.mem_release(mem).ok();
            return Err(e.into());
        }
        let ptr = backend.va_base(&va);
        Ok(DeviceBuffer {
            mem,
            va,
            ptr,
            size,
            mapped,
        })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes mapped (the size rounded up to the granularity).
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// The physical memory (for mapping it again elsewhere).
    pub(crate) fn raw_mem(&self) -> &B::PhysMem {
        &self.mem
    }

    /// Unmap and release. The caller guarantees no queued work uses it.
    pub fn free(self, backend: &B) -> Result<()> {
        backend.unmap(&self.va, 0, self.mapped)?;
        backend.va_free(self.va)?;
        backend.mem_release(self.mem)?;
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
    }
}

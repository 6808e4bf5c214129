//! Emulated device memory of the host backend: physical allocations, a fake
//! virtual address space with reservations, and mappings between them.
//!
//! Every device access (copy, memset, kernel read/write) goes through
//! [`Memory::segments`], which translates a device address range into
//! pieces of physical allocations and fails, with an error, on any byte that
//! is outside a reservation, unmapped, or mapped without access.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::backend::DevicePtr;
use crate::error::{DeviceError, Result};

use super::pinned::PinnedStorage;

/// Start of the fake address space: non-zero, far from host pointers.
const VA_START: u64 = 0x0000_7e00_0000_0000;
/// Start of the device addresses of pinned host buffers (zero-copy
/// windows), above every reservation (those end below `1 << 62`).
const WINDOW_START: u64 = 1 << 62;

fn invalid(msg: impl Into<String>) -> DeviceError {
    DeviceError::InvalidArgument(msg.into())
}

struct PhysEntry {
    data: Vec<u8>,
    /// Host-located (not counted against the emulated device's capacity).
    host: bool,
    /// The handle has not been released yet.
    handle_live: bool,
    /// Number of mappings that reference this allocation.
    maps: u64,
}

struct MapEntry {
    size: u64,
    phys: u64,
    phys_offset: u64,
    access: bool,
}

struct VaEntry {
    size: u64,
    /// Mappings by offset inside the reservation; never overlapping.
    maps: BTreeMap<u64, MapEntry>,
}

/// One contiguous piece of a translated device range.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Segment {
    pub phys: u64,
    pub offset: u64,
    pub len: u64,
}

pub(crate) struct Memory {
    granularity: u64,
    capacity: u64,
    /// Bytes of physical memory alive (released handles still mapped count).
    phys_bytes: u64,
    phys: HashMap<u64, PhysEntry>,
    /// Reservations by base address.
    vas: BTreeMap<u64, VaEntry>,
    va_base_by_id: HashMap<u64, u64>,
    /// Next free address: reservations are bump-allocated and never reused.
    next_va: u64,
    /// Pinned host buffers visible to device accesses, by window base.
    windows: BTreeMap<u64, Arc<PinnedStorage>>,
    window_by_pinned: HashMap<u64, u64>,
    next_window: u64,
}

impl Memory {
    pub fn new(granularity: u64, capacity: u64) -> Self {
        Memory {
            granularity,
            capacity,
            phys_bytes: 0,
            phys: HashMap::new(),
            vas: BTreeMap::new(),
            va_base_by_id: HashMap::new(),
            next_va: VA_START,
            windows: BTreeMap::new(),
            window_by_pinned: HashMap::new(),
            next_window: WINDOW_START,
        }
    }

    /// The device address of pinned buffer `id` (a window created on first
    /// use, 4 KiB aligned, never reused).
    pub fn window(&mut self, id: u64, storage: &Arc<PinnedStorage>) -> Result<u64> {
        if let Some(&base) = self.window_by_pinned.get(&id) {
            return Ok(base);
        }
        let len = storage.len() as u64;
        if len == 0 {
            return Err(invalid("host_device_ptr of an empty host buffer"));
        }
        let base = self.next_window;
        self.next_window = base
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(4096))
            .and_then(|e| e.checked_add(4096))
            .ok_or_else(|| invalid("fake window address space exhausted"))?;
        self.windows.insert(base, storage.clone());
        self.window_by_pinned.insert(id, base);
        Ok(base)
    }

    /// Forget pinned buffer `id`'s window (the buffer is freed).
    pub fn drop_window(&mut self, id: u64) {
        if let Some(base) = self.window_by_pinned.remove(&id) {
            self.windows.remove(&base);
        }
    }

    /// The window holding `[ptr, ptr + len)` and the offset in it, if `ptr`
    /// is a window address (then the whole range must lie inside it).
    fn in_window(&self, ptr: DevicePtr, len: u64) -> Result<Option<(&PinnedStorage, usize)>> {
        if ptr.0 < WINDOW_START {
            return Ok(None);
        }
        let (&base, st) = self
            .windows
            .range(..=ptr.0)
            .next_back()
            .ok_or_else(|| invalid(format!("access to {:#x}: no host window", ptr.0)))?;
        let off = ptr.0 - base;
        if off.checked_add(len).is_none_or(|e| e > st.len() as u64) {
            return Err(invalid(format!(
                "access to {:#x} (+{len:#x} bytes) leaves its host window",
                ptr.0
            )));
        }
        Ok(Some((st, off as usize)))
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn phys_bytes(&self) -> u64 {
        self.phys_bytes
    }

    /// Live physical handles (not yet released).
    pub fn phys_handles(&self) -> usize {
        self.phys.values().filter(|p| p.handle_live).count()
    }

    /// Physical allocations still holding memory (live handle or mapped).
    pub fn phys_allocations(&self) -> usize {
        self.phys.len()
    }

    pub fn va_count(&self) -> usize {
        self.vas.len()
    }

    pub fn mapping_count(&self) -> usize {
        self.vas.values().map(|v| v.maps.len()).sum()
    }

    fn check_granular(&self, what: &str, value: u64) -> Result<()> {
        if !value.is_multiple_of(self.granularity) {
            return Err(invalid(format!(
                "{what} {value:#x} is not a multiple of the granularity {:#x}",
                self.granularity
            )));
        }
        Ok(())
    }

    /// `host`: host-located memory, which the emulated device's capacity
    /// does not bound.
    pub fn phys_create(&mut self, id: u64, bytes: u64, host: bool) -> Result<()> {
        if bytes == 0 {
            return Err(invalid("mem_create of 0 bytes"));
        }
        self.check_granular("mem_create size", bytes)?;
        if !host && bytes > self.capacity - self.phys_bytes {
            return Err(DeviceError::OutOfMemory {
                what: format!(
                    "host backend: {} of {} bytes in use",
                    self.phys_bytes, self.capacity
                ),
                bytes,
            });
        }
        let len = usize::try_from(bytes).map_err(|_| invalid("mem_create size too large"))?;
        self.phys.insert(
            id,
            PhysEntry {
                data: vec![0; len],
                host,
                handle_live: true,
                maps: 0,
            },
        );
        if !host {
            self.phys_bytes += bytes;
        }
        Ok(())
    }

    fn live_phys(&self, id: u64) -> Result<&PhysEntry> {
        match self.phys.get(&id) {
            Some(p) if p.handle_live => Ok(p),
            _ => Err(invalid(format!("physical memory handle {id} is not live"))),
        }
    }

    pub fn phys_release(&mut self, id: u64) -> Result<()> {
        self.live_phys(id)?;
        let entry = self.phys.get_mut(&id).expect("checked above");
        entry.handle_live = false;
        self.drop_phys_if_unused(id);
        Ok(())
    }

    /// Like cuMemRelease: the memory goes away when the handle is released
    /// and the last mapping is removed.
    fn drop_phys_if_unused(&mut self, id: u64) {
        if let Some(p) = self.phys.get(&id) {
            if !p.handle_live && p.maps == 0 {
                if !p.host {
                    self.phys_bytes -= p.data.len() as u64;
                }
                self.phys.remove(&id);
            }
        }
    }

    pub fn va_reserve(&mut self, id: u64, bytes: u64, align: u64) -> Result<u64> {
        if bytes == 0 {
            return Err(invalid("va_reserve of 0 bytes"));
        }
        self.check_granular("va_reserve size", bytes)?;
        let align = if align == 0 { self.granularity } else { align };
        if !align.is_power_of_two() {
            return Err(invalid(format!(
                "va_reserve alignment {align:#x} is not a power of two"
            )));
        }
        let align = align.max(self.granularity);
        let base = self
            .next_va
            .checked_next_multiple_of(align)
            .ok_or_else(|| invalid("fake address space exhausted"))?;
        // One granule of guard space between reservations so an overrun
        // faults instead of landing in the neighbour.
        let end = base
            .checked_add(bytes)
            .and_then(|e| e.checked_add(self.granularity))
            .filter(|e| *e < (1u64 << 62))
            .ok_or_else(|| DeviceError::OutOfMemory {
                what: "host backend virtual address space".into(),
                bytes,
            })?;
        self.next_va = end;
        self.vas.insert(
            base,
            VaEntry {
                size: bytes,
                maps: BTreeMap::new(),
            },
        );
        self.va_base_by_id.insert(id, base);
        Ok(base)
    }

    fn va_entry(&self, id: u64) -> Result<(u64, &VaEntry)> {
        let base = *self
            .va_base_by_id
            .get(&id)
            .ok_or_else(|| invalid(format!("VA range handle {id} is not live")))?;
        Ok((base, &self.vas[&base]))
    }

    pub fn va_free(&mut self, id: u64) -> Result<()> {
        let (base, entry) = self.va_entry(id)?;
        if !entry.maps.is_empty() {
            return Err(invalid(format!(
                "va_free of range {base:#x} that still has {} mapping(s)",
                entry.maps.len()
            )));
        }
        self.vas.remove(&base);
        self.va_base_by_id.remove(&id);
        Ok(())
    }

    fn check_va_range(&self, entry: &VaEntry, offset: u64, bytes: u64) -> Result<()> {
        self.check_granular("VA offset", offset)?;
        self.check_granular("size", bytes)?;
        if bytes == 0 {
            return Err(invalid("VMM operation on 0 bytes"));
        }
        if offset.checked_add(bytes).is_none_or(|end| end > entry.size) {
            return Err(invalid(format!(
                "range [{offset:#x}, +{bytes:#x}) is outside the reservation of {:#x} bytes",
                entry.size
            )));
        }
        Ok(())
    }

    pub fn map(
        &mut self,
        va: u64,
        va_offset: u64,
        phys: u64,
        phys_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        let (base, entry) = self.va_entry(va)?;
        self.check_va_range(entry, va_offset, bytes)?;
        let p = self.live_phys(phys)?;
        self.check_granular("physical offset", phys_offset)?;
        if phys_offset
            .checked_add(bytes)
            .is_none_or(|end| end > p.data.len() as u64)
        {
            return Err(invalid(format!(
                "physical range [{phys_offset:#x}, +{bytes:#x}) is outside the allocation of {:#x} bytes",
                p.data.len()
            )));
        }
        let end = va_offset + bytes;
        if let Some((off, m)) = entry.maps.range(..end).next_back() {
            if off + m.size > va_offset {
                return Err(invalid(format!(
                    "map over a mapped range: {:#x} is already mapped",
                    base + (*off).max(va_offset)
                )));
            }
        }
        let entry = self.vas.get_mut(&base).expect("looked up above");
        entry.maps.insert(
            va_offset,
            MapEntry {
                size: bytes,
                phys,
                phys_offset,
                access: false,
            },
        );
        self.phys.get_mut(&phys).expect("checked live").maps += 1;
        Ok(())
    }

    /// Offsets of the mappings that exactly tile `[offset, offset + bytes)`,
    /// or an error naming the first gap or partial mapping.
    fn tiling(&self, entry: &VaEntry, base: u64, offset: u64, bytes: u64) -> Result<Vec<u64>> {
        let end = offset + bytes;
        if let Some((off, m)) = entry.maps.range(..offset).next_back() {
            if off + m.size > offset {
                return Err(invalid(format!(
                    "range starting at {:#x} splits the mapping at {:#x}",
                    base + offset,
                    base + off
                )));
            }
        }
        let mut cursor = offset;
        let mut offsets = Vec::new();
        for (&off, m) in entry.maps.range(offset..end) {
            if off != cursor {
                break;
            }
            if off + m.size > end {
                return Err(invalid(format!(
                    "range ending at {:#x} splits the mapping at {:#x}",
                    base + end,
                    base + off
                )));
            }
            offsets.push(off);
            cursor = off + m.size;
        }
        if cursor != end {
            return Err(invalid(format!("{:#x} is not mapped", base + cursor)));
        }
        Ok(offsets)
    }

    pub fn unmap(&mut self, va: u64, va_offset: u64, bytes: u64) -> Result<()> {
        let (base, entry) = self.va_entry(va)?;
        self.check_va_range(entry, va_offset, bytes)?;
        let offsets = self.tiling(entry, base, va_offset, bytes)?;
        let entry = self.vas.get_mut(&base).expect("looked up above");
        let mut freed = Vec::with_capacity(offsets.len());
        for off in offsets {
            let m = entry.maps.remove(&off).expect("tiling returned it");
            freed.push(m.phys);
        }
        for phys in freed {
            if let Some(p) = self.phys.get_mut(&phys) {
                p.maps -= 1;
            }
            self.drop_phys_if_unused(phys);
        }
        Ok(())
    }

    pub fn set_access(&mut self, va: u64, va_offset: u64, bytes: u64) -> Result<()> {
        let (base, entry) = self.va_entry(va)?;
        self.check_va_range(entry, va_offset, bytes)?;
        let offsets = self.tiling(entry, base, va_offset, bytes)?;
        let entry = self.vas.get_mut(&base).expect("looked up above");
        for off in offsets {
            entry.maps.get_mut(&off).expect("tiling returned it").access = true;
        }
        Ok(())
    }

    /// Translate `[ptr, ptr + len)` into physical pieces.
    pub fn segments(&self, ptr: DevicePtr, len: u64) -> Result<Vec<Segment>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let addr = ptr.0;
        let fault = |what: &str| invalid(format!("access to {addr:#x} (+{len:#x} bytes): {what}"));
        let (&base, entry) = self
            .vas
            .range(..=addr)
            .next_back()
            .ok_or_else(|| fault("address is not in any reservation"))?;
        let end = addr
            .checked_add(len)
            .ok_or_else(|| fault("range overflows"))?;
        if end > base + entry.size {
            return Err(fault("range leaves its reservation"));
        }
        let mut out = Vec::new();
        let mut cur = addr - base;
        let stop = end - base;
        while cur < stop {
            let (&off, m) = entry
                .maps
                .range(..=cur)
                .next_back()
                .filter(|(off, m)| **off + m.size > cur)
                .ok_or_else(|| invalid(format!("access to unmapped address {:#x}", base + cur)))?;
            if !m.access {
                return Err(invalid(format!(
                    "access to {:#x}: mapped but access was never granted (set_access)",
                    base + cur
                )));
            }
            let take = (off + m.size).min(stop) - cur;
            out.push(Segment {
                phys: m.phys,
                offset: m.phys_offset + (cur - off),
                len: take,
            });
            cur += take;
        }
        Ok(out)
    }

    fn slice_mut(&mut self, s: Segment) -> &mut [u8] {
        let data = &mut self
            .phys
            .get_mut(&s.phys)
            .expect("segment of live phys")
            .data;
        &mut data[s.offset as usize..(s.offset + s.len) as usize]
    }

    /// `[ptr, ptr + len)` is accessible (a host window, or mapped with
    /// access granted); nothing is read.
    pub fn check_range(&self, ptr: DevicePtr, len: u64) -> Result<()> {
        if self.in_window(ptr, len)?.is_none() {
            self.segments(ptr, len)?;
        }
        Ok(())
    }

    pub fn read(&self, ptr: DevicePtr, out: &mut [u8]) -> Result<()> {
        if let Some((st, off)) = self.in_window(ptr, out.len() as u64)? {
            st.read(off, out);
            return Ok(());
        }
        let mut pos = 0usize;
        for s in self.segments(ptr, out.len() as u64)? {
            let data = &self.phys[&s.phys].data;
            let n = s.len as usize;
            out[pos..pos + n].copy_from_slice(&data[s.offset as usize..s.offset as usize + n]);
            pos += n;
        }
        Ok(())
    }

    pub fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        if let Some((st, off)) = self.in_window(ptr, data.len() as u64)? {
            st.write(off, data);
            return Ok(());
        }
        let mut pos = 0usize;
        for s in self.segments(ptr, data.len() as u64)? {
            let n = s.len as usize;
            self.slice_mut(s).copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
        Ok(())
    }

    /// Fill `[ptr, ptr + len)` with a repeating pattern (1 or 4 bytes).
    pub fn fill(&mut self, ptr: DevicePtr, len: u64, pattern: &[u8]) -> Result<()> {
        let segs = self.segments(ptr, len)?;
        let mut pos = 0usize;
        for s in segs {
            let dst = self.slice_mut(s);
            if let [byte] = pattern {
                dst.fill(*byte);
            } else {
                for b in dst.iter_mut() {
                    *b = pattern[pos % pattern.len()];
                    pos += 1;
                }
            }
        }
        Ok(())
    }

    pub fn copy(&mut self, dst: DevicePtr, src: DevicePtr, len: u64) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| invalid("copy size too large"))?;
        // Validate both sides before touching anything.
        self.check_range(dst, len)?;
        let mut tmp = vec![0u8; n];
        self.read(src, &mut tmp)?;
        self.write(dst, &tmp)
    }
}

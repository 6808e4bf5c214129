//! [`VmmAllocator`] and [`Buffer`]. See the module docs for the policy.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::events::{EventKey, FreeEvents};
use super::raii::{Phys, VaReservation, VmmContext};
use super::{AllocationId, VmmConfig, VmmStats};
use crate::backend::{Backend, DevicePtr};
use crate::budget::MemLocation;
use crate::error::{DeviceError, Result};

/// A whole physical block with its own mapping. Field order is drop order:
/// the reservation (and its mapping) goes before the physical memory.
struct Large<B: Backend> {
    va: VaReservation<B>,
    phys: Arc<Phys<B>>,
    id: AllocationId,
    generation: u64,
}

impl<B: Backend> Large<B> {
    /// Is its range still mapped to its memory (a failed move may leave it
    /// unmapped)?
    fn intact(&self) -> bool {
        self.va
            .mapping(0)
            .is_some_and(|m| Arc::ptr_eq(&m.phys, &self.phys))
    }
}

/// A sub-allocation slot inside a granule.
struct Slot {
    granule: u64,
    offset: u64,
    /// `None` until first handed out.
    id: Option<AllocationId>,
    generation: u64,
}

struct Granule<B: Backend> {
    va: VaReservation<B>,
    phys: Arc<Phys<B>>,
    class: u64,
    /// Slots that fit in the granule.
    slots: u64,
    /// Slots handed out at least once (carved from the front).
    carved: u64,
    /// Slots handed out now.
    live: u64,
}

enum Kind<B: Backend> {
    Large(Large<B>),
    Small(Slot),
}

/// A freed item; `event: None` means ready for reuse.
struct Free<T> {
    item: T,
    event: Option<EventKey>,
}

/// FIFO of freed items per size class.
type FreeLists<T> = BTreeMap<u64, VecDeque<Free<T>>>;

struct State<B: Backend> {
    large: FreeLists<Large<B>>,
    small: FreeLists<Slot>,
    granules: BTreeMap<u64, Granule<B>>,
    next_granule: u64,
    events: FreeEvents<B>,
    quarantine: Vec<Kind<B>>,
    large_live: u64,
    /// Quarantined slots (counted as live in their granule).
    small_quarantined: u64,
    stats: VmmStats,
}

struct Inner<B: Backend> {
    ctx: VmmContext<B>,
    cfg: VmmConfig,
    granularity: u64,
    state: Mutex<State<B>>,
}

/// The allocator. Cheap to clone (shared state); buffers keep it alive.
pub struct VmmAllocator<B: Backend> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for VmmAllocator<B> {
    fn clone(&self) -> Self {
        VmmAllocator {
            inner: self.inner.clone(),
        }
    }
}

/// A handle on an allocator that does not keep it alive: what a report
/// reads, and a trim, while the allocator's device lives.
pub struct WeakAllocator<B: Backend> {
    inner: std::sync::Weak<Inner<B>>,
}

impl<B: Backend> WeakAllocator<B> {
    /// [`VmmAllocator::stats`] (`None`: the allocator is gone).
    pub fn stats(&self) -> Option<VmmStats> {
        self.upgrade().map(|a| a.stats())
    }

    /// [`VmmAllocator::trim`] (`None`: the allocator is gone).
    pub fn trim(&self) -> Option<Result<u64>> {
        self.upgrade().map(|a| a.trim())
    }

    fn upgrade(&self) -> Option<VmmAllocator<B>> {
        self.inner.upgrade().map(|inner| VmmAllocator { inner })
    }
}

/// A device buffer. Dropping it frees it immediately (no queued work may
/// use it); use [`Buffer::free_on`] / [`VmmAllocator::free`] to free it in
/// stream order.
pub struct Buffer<B: Backend> {
    owner: Arc<Inner<B>>,
    kind: Option<Kind<B>>,
    ptr: DevicePtr,
    size: u64,
    capacity: u64,
    id: AllocationId,
    generation: u64,
    phys: Arc<Phys<B>>,
    phys_offset: u64,
}

impl<B: Backend> std::fmt::Debug for Buffer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("ptr", &format_args!("{:#x}", self.ptr.0))
            .field("size", &self.size)
            .field("id", &self.id)
            .field("generation", &self.generation)
            .field("remappable", &self.remappable())
            .finish()
    }
}

impl<B: Backend> Buffer<B> {
    /// Device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// Requested size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Bytes of backing memory (granularity multiple for remappable
    /// buffers, the slot size for sub-allocated ones).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn allocation_id(&self) -> AllocationId {
        self.id
    }
    /// 0 for a freshly created block, +1 on every reuse of it and on every
    /// [`Buffer::renew`].
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// Its content is new though its memory stays (a program it was donated
    /// to wrote it in place, and it now holds that program's output): a new
    /// generation, as a reuse of the block gives, so that the allocation id
    /// and the generation keep naming one content (what the VA-stable
    /// binding's copy elision and the staging's kept buffers rely on).
    pub fn renew(&mut self) {
        self.generation += 1;
        match &mut self.kind {
            Some(Kind::Large(b)) => b.generation = self.generation,
            Some(Kind::Small(s)) => s.generation = self.generation,
            None => {}
        }
    }
    /// Where its memory lives.
    pub fn location(&self) -> MemLocation {
        self.phys.location()
    }
    /// Move its memory to `to` under the same address, its bytes copied on
    /// `stream` (waited for: nothing else may write it meanwhile). It gets
    /// a new allocation id (generation 0): the old memory may still be
    /// mapped elsewhere (a VA-stable graph), and `(id, generation)` names
    /// one memory's content. `Ok(false)`: already there, or sub-allocated
    /// (its granule holds other buffers: it stays).
    pub fn relocate(&mut self, to: MemLocation, stream: &B::Stream) -> Result<bool> {
        let Some(Kind::Large(b)) = &mut self.kind else {
            return Ok(false);
        };
        if b.phys.location() == to {
            return Ok(false);
        }
        let new = b.va.relocate(0, to, Some(stream))?;
        b.phys = new.clone();
        b.id = AllocationId::fresh();
        b.generation = 0;
        self.phys = new;
        self.id = b.id;
        self.generation = 0;
        tracing::debug!(id = self.id.0, bytes = self.capacity, to = ?to, "vmm: buffer relocated");
        Ok(true)
    }
    /// Is its physical memory held by anything besides the buffer and its
    /// own mapping (another reservation that maps it: a VA-stable graph's;
    /// a program's binding of it)? A move then frees nothing until those
    /// let go: the old memory stays, beside the new.
    pub fn held_elsewhere(&self) -> bool {
        // The buffer's own holders: itself, its block and its mapping.
        let own = match &self.kind {
            Some(Kind::Large(b)) => {
                2 + usize::from(
                    b.va.mapping(0)
                        .is_some_and(|m| Arc::ptr_eq(&m.phys, &self.phys)),
                )
            }
            _ => 1,
        };
        Arc::strong_count(&self.phys) > own
    }
    /// Can the runtime map `phys()` (offset `phys_offset()`, `capacity()`
    /// bytes) into another reservation? False for sub-allocated buffers.
    pub fn remappable(&self) -> bool {
        matches!(self.kind, Some(Kind::Large(_)))
    }
    /// The physical allocation backing this buffer.
    pub fn phys(&self) -> &Arc<Phys<B>> {
        &self.phys
    }
    pub fn phys_offset(&self) -> u64 {
        self.phys_offset
    }
    /// Free once the work queued on `stream` so far has completed.
    pub fn free_on(mut self, stream: &B::Stream) -> Result<()> {
        let kind = self.kind.take().expect("a live buffer has a block");
        self.owner.release(vec![(kind, self.size)], Some(stream))
    }
}

impl<B: Backend> Drop for Buffer<B> {
    fn drop(&mut self) {
        if let Some(kind) = self.kind.take() {
            if let Err(e) = self.owner.release(vec![(kind, self.size)], None) {
                self.owner.ctx.record_deferred(e);
            }
        }
    }
}

/// Take the oldest ready entry of a FIFO that `prefer` accepts, else the
/// oldest ready one (querying pending events in order).
fn take_ready<B: Backend, T>(
    backend: &B,
    list: &mut VecDeque<Free<T>>,
    events: &mut FreeEvents<B>,
    prefer: impl Fn(&T) -> bool,
) -> Result<Option<T>> {
    let mut found = None;
    for (i, f) in list.iter().enumerate() {
        let ready = match f.event {
            None => true,
            Some(k) => match events.done(backend, k) {
                Ok(r) => r,
                // A block is at hand: an unrelated entry's error waits.
                Err(_) if found.is_some() => break,
                Err(e) => return Err(e),
            },
        };
        if ready {
            found.get_or_insert(i);
            if prefer(&f.item) {
                found = Some(i);
                break;
            }
        }
    }
    let Some(i) = found else {
        return Ok(None);
    };
    let f = list.remove(i).expect("index in range");
    if let Some(k) = f.event {
        events.release(k);
    }
    Ok(Some(f.item))
}

/// Is the entry ready (event complete)? Drops its event reference if so.
fn settle<B: Backend, T>(backend: &B, f: &mut Free<T>, events: &mut FreeEvents<B>) -> Result<bool> {
    if let Some(k) = f.event {
        if !events.done(backend, k)? {
            return Ok(false);
        }
        events.release(k);
        f.event = None;
    }
    Ok(true)
}

fn keep_first(first: &mut Option<DeviceError>, r: Result<()>) {
    if let Err(e) = r {
        first.get_or_insert(e);
    }
}

impl<B: Backend> VmmAllocator<B> {
    pub fn new(backend: Arc<B>, cfg: VmmConfig) -> Result<Self> {
        Self::with_context(VmmContext::new(backend), cfg)
    }

    /// An allocator on an existing context (its handle counters are shared).
    pub fn with_context(ctx: VmmContext<B>, cfg: VmmConfig) -> Result<Self> {
        let granularity = ctx.backend().info().vmm_granularity;
        if granularity == 0 || !granularity.is_power_of_two() {
            return Err(DeviceError::InvalidArgument(format!(
                "backend granularity {granularity} is not a power of two"
            )));
        }
        if cfg.small_threshold > granularity {
            return Err(DeviceError::InvalidArgument(format!(
                "small_threshold {} exceeds the granularity {granularity}",
                cfg.small_threshold
            )));
        }
        if cfg.small_threshold > 0
            && (!cfg.small_min.is_power_of_two() || cfg.small_min > granularity)
        {
            return Err(DeviceError::InvalidArgument(format!(
                "small_min {} must be a power of two no larger than the granularity",
                cfg.small_min
            )));
        }
        Ok(VmmAllocator {
            inner: Arc::new(Inner {
                ctx,
                cfg,
                granularity,
                state: Mutex::new(State {
                    large: BTreeMap::new(),
                    small: BTreeMap::new(),
                    granules: BTreeMap::new(),
                    next_granule: 0,
                    events: FreeEvents::new(),
                    quarantine: Vec::new(),
                    large_live: 0,
                    small_quarantined: 0,
                    stats: VmmStats::default(),
                }),
            }),
        })
    }

    pub fn context(&self) -> &VmmContext<B> {
        &self.inner.ctx
    }

    pub fn backend(&self) -> &Arc<B> {
        self.inner.ctx.backend()
    }

    /// A handle that does not keep the allocator alive.
    pub fn downgrade(&self) -> WeakAllocator<B> {
        WeakAllocator {
            inner: Arc::downgrade(&self.inner),
        }
    }

    pub fn granularity(&self) -> u64 {
        self.inner.granularity
    }

    pub fn config(&self) -> &VmmConfig {
        &self.inner.cfg
    }

    /// Is a buffer of `size` bytes sub-allocated (non-remappable)?
    pub fn is_small(&self, size: u64) -> bool {
        self.inner.is_small(size)
    }

    /// Allocate `size` bytes (0 is treated as 1).
    pub fn alloc(&self, size: u64) -> Result<Buffer<B>> {
        let inner = &self.inner;
        let size = size.max(1);
        let mut st = inner.lock();
        let (kind, reused) = if inner.is_small(size) {
            inner.alloc_small(&mut st, size)?
        } else {
            inner.alloc_large(&mut st, size)?
        };
        let (ptr, capacity, id, generation, phys, phys_offset) = match &kind {
            Kind::Large(b) => (
                b.va.base(),
                b.va.size(),
                b.id,
                b.generation,
                b.phys.clone(),
                0,
            ),
            Kind::Small(s) => {
                let g = &st.granules[&s.granule];
                (
                    g.va.base().offset(s.offset),
                    g.class,
                    s.id.expect("assigned when handed out"),
                    s.generation,
                    g.phys.clone(),
                    s.offset,
                )
            }
        };
        if matches!(kind, Kind::Large(_)) {
            st.large_live += 1;
        }
        let counts = inner.ctx.handle_counts();
        let s = &mut st.stats;
        if reused {
            s.allocs_reused += 1;
        } else {
            s.allocs_fresh += 1;
        }
        s.bytes_in_use += size;
        s.bytes_in_use_peak = s.bytes_in_use_peak.max(s.bytes_in_use);
        s.buffers_live += 1;
        s.buffers_live_peak = s.buffers_live_peak.max(s.buffers_live);
        s.bytes_physical_peak = s.bytes_physical_peak.max(counts.phys_bytes);
        tracing::trace!(size, id = id.0, generation, reused, "vmm alloc");
        Ok(Buffer {
            owner: inner.clone(),
            kind: Some(kind),
            ptr,
            size,
            capacity,
            id,
            generation,
            phys,
            phys_offset,
        })
    }

    /// Free `buf` once the work queued on `stream` so far has completed.
    /// If the event cannot be recorded the allocator synchronizes `stream`
    /// (block reusable) or, failing that, quarantines the block; the buffer
    /// is consumed either way and the error returned.
    pub fn free(&self, buf: Buffer<B>, stream: &B::Stream) -> Result<()> {
        buf.free_on(stream)
    }

    /// Free many buffers once the work queued on `stream` so far has
    /// completed, with one event for all of them (cheaper than `free` each).
    /// Buffers of another allocator are freed on their own allocator.
    pub fn free_all(
        &self,
        bufs: impl IntoIterator<Item = Buffer<B>>,
        stream: &B::Stream,
    ) -> Result<()> {
        let mut mine = Vec::new();
        let mut result = Ok(());
        for mut buf in bufs {
            if Arc::ptr_eq(&buf.owner, &self.inner) {
                let kind = buf.kind.take().expect("a live buffer has a block");
                mine.push((kind, buf.size));
            } else if let Err(e) = buf.free_on(stream) {
                result = result.and(Err(e));
            }
        }
        let r = self.inner.release(mine, Some(stream));
        result.and(r)
    }

    /// Release cached memory: ready blocks, empty granules, pooled events.
    /// Returns the physical bytes released.
    pub fn trim(&self) -> Result<u64> {
        let mut st = self.inner.lock();
        self.inner.trim_locked(&mut st)
    }

    pub fn stats(&self) -> VmmStats {
        let st = self.inner.lock();
        let c = self.inner.ctx.handle_counts();
        let mut s = st.stats.clone();
        s.bytes_reserved = c.va_bytes;
        s.bytes_mapped = c.mapped_bytes;
        s.bytes_physical = c.phys_bytes;
        s.bytes_physical_peak = s.bytes_physical_peak.max(c.phys_bytes);
        s.phys_handles = c.phys_handles;
        s.va_handles = c.va_handles;
        s.cached_blocks = st.large.values().map(|l| l.len() as u64).sum();
        let pending_large: usize = st
            .large
            .values()
            .flatten()
            .filter(|f| f.event.is_some())
            .count();
        let pending_small: usize = st
            .small
            .values()
            .flatten()
            .filter(|f| f.event.is_some())
            .count();
        s.pending_frees = (pending_large + pending_small) as u64;
        s.granules = st.granules.len() as u64;
        s.quarantined = st.quarantine.len() as u64;
        s.event_handles = st.events.handles() as u64;
        s
    }

    /// Errors met while dropping buffers or wrappers of this allocator.
    pub fn take_deferred_errors(&self) -> Vec<DeviceError> {
        self.inner.ctx.take_deferred_errors()
    }

    /// Check internal invariants (granule occupancy, live counts, classes).
    pub fn check_consistency(&self) -> std::result::Result<(), String> {
        let st = self.inner.lock();
        let mut free_per_granule: BTreeMap<u64, u64> = BTreeMap::new();
        for (class, list) in &st.small {
            for f in list {
                let g = st
                    .granules
                    .get(&f.item.granule)
                    .ok_or_else(|| format!("free slot of missing granule {}", f.item.granule))?;
                if g.class != *class {
                    return Err(format!("slot of class {} in free list {class}", g.class));
                }
                *free_per_granule.entry(f.item.granule).or_default() += 1;
            }
        }
        let mut small_live = 0;
        for (key, g) in &st.granules {
            let free = free_per_granule.get(key).copied().unwrap_or(0);
            if free + g.live != g.carved || g.carved > g.slots {
                return Err(format!(
                    "granule {key}: {free} free + {} live != {} carved (of {})",
                    g.live, g.carved, g.slots
                ));
            }
            small_live += g.live;
        }
        for (class, list) in &st.large {
            if let Some(f) = list.iter().find(|f| f.item.va.size() != *class) {
                return Err(format!(
                    "block of {} bytes in free list {class}",
                    f.item.va.size()
                ));
            }
        }
        if st.large_live + small_live != st.stats.buffers_live + st.small_quarantined {
            return Err(format!(
                "{} large + {small_live} small live != {} buffers live + {} quarantined slots",
                st.large_live, st.stats.buffers_live, st.small_quarantined
            ));
        }
        Ok(())
    }
}

impl<B: Backend> Inner<B> {
    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backend(&self) -> &B {
        self.ctx.backend()
    }

    fn is_small(&self, size: u64) -> bool {
        size <= self.cfg.small_threshold
    }

    fn small_class(&self, size: u64) -> u64 {
        size.next_power_of_two().max(self.cfg.small_min)
    }

    /// Device memory, else (the cache trimmed once) wherever the budget
    /// has room: host memory past the device's budget (see
    /// [`crate::budget`]), else out of memory.
    fn create_phys(&self, st: &mut State<B>, bytes: u64) -> Result<Arc<Phys<B>>> {
        match Phys::create_device(&self.ctx, bytes) {
            Err(DeviceError::OutOfMemory { .. }) => {
                let freed = self.trim_locked(st)?;
                tracing::debug!(
                    bytes,
                    freed,
                    "vmm: out of device memory, trimmed cache and retrying"
                );
                Ok(Arc::new(Phys::create(&self.ctx, bytes)?))
            }
            r => Ok(Arc::new(r?)),
        }
    }

    /// A fresh physical block mapped read/write at its own reservation.
    fn create_mapped(
        &self,
        st: &mut State<B>,
        bytes: u64,
    ) -> Result<(VaReservation<B>, Arc<Phys<B>>)> {
        let phys = self.create_phys(st, bytes)?;
        let mut va = VaReservation::reserve(&self.ctx, bytes, 0)?;
        va.map_rw(0, &phys, 0, bytes)?;
        Ok((va, phys))
    }

    fn alloc_large(&self, st: &mut State<B>, size: u64) -> Result<(Kind<B>, bool)> {
        let class = size
            .checked_next_multiple_of(self.granularity)
            .ok_or_else(|| {
                DeviceError::InvalidArgument(format!("allocation of {size} bytes overflows"))
            })?;
        // A cached block in device memory first; one in host memory (spilled
        // past the budget, or moved there) only while the device has no
        // room for a new block: then it goes, and a device block is made.
        let on_device = |b: &Large<B>| b.phys.location() == MemLocation::Device;
        if let Some(list) = st.large.get_mut(&class) {
            if let Some(mut b) = take_ready(self.backend(), list, &mut st.events, on_device)? {
                if list.is_empty() {
                    st.large.remove(&class);
                }
                if on_device(&b) || !self.device_has_room(class) {
                    b.generation += 1;
                    return Ok((Kind::Large(b), true));
                }
                if let Err(e) = Self::release_large(b) {
                    self.ctx.record_deferred(e);
                }
            }
        }
        let (va, phys) = self.create_mapped(st, class)?;
        Ok((
            Kind::Large(Large {
                va,
                phys,
                id: AllocationId::fresh(),
                generation: 0,
            }),
            false,
        ))
    }

    /// Could a new block of `bytes` be made in device memory now (the
    /// budget's room for ordinary allocations)?
    fn device_has_room(&self, bytes: u64) -> bool {
        let be = self.backend();
        let budget = be.budget();
        let ceiling = budget.ordinary_device_ceiling(be.info().total_memory);
        budget.usage().device_bytes.saturating_add(bytes) <= ceiling
    }

    fn alloc_small(&self, st: &mut State<B>, size: u64) -> Result<(Kind<B>, bool)> {
        let class = self.small_class(size);
        let found = match st.small.get_mut(&class) {
            Some(list) => take_ready(self.backend(), list, &mut st.events, |_| true)?,
            None => None,
        };
        let mut slot = match found {
            Some(s) => s,
            None => {
                // Carve from a granule of this class that has room, oldest
                // first; freed slots are always preferred (above).
                let with_room = st
                    .granules
                    .iter()
                    .find(|(_, g)| g.class == class && g.carved < g.slots)
                    .map(|(k, _)| *k);
                let key = match with_room {
                    Some(k) => k,
                    None => {
                        let (va, phys) = self.create_mapped(st, self.granularity)?;
                        let key = st.next_granule;
                        st.next_granule += 1;
                        st.granules.insert(
                            key,
                            Granule {
                                va,
                                phys,
                                class,
                                slots: self.granularity / class,
                                carved: 0,
                                live: 0,
                            },
                        );
                        key
                    }
                };
                let g = st.granules.get_mut(&key).expect("chosen above");
                let offset = g.carved * class;
                g.carved += 1;
                Slot {
                    granule: key,
                    offset,
                    id: None,
                    generation: 0,
                }
            }
        };
        let reused = match slot.id {
            Some(_) => {
                slot.generation += 1;
                true
            }
            None => {
                slot.id = Some(AllocationId::fresh());
                false
            }
        };
        st.granules
            .get_mut(&slot.granule)
            .expect("slot of a live granule")
            .live += 1;
        Ok((Kind::Small(slot), reused))
    }

    /// Return blocks to their free lists, ordered after `stream` if given
    /// (one event for all of them).
    fn release(&self, blocks: Vec<(Kind<B>, u64)>, stream: Option<&B::Stream>) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        for (kind, size) in &blocks {
            st.stats.bytes_in_use -= size;
            st.stats.buffers_live -= 1;
            match kind {
                Kind::Large(_) => st.large_live -= 1,
                Kind::Small(s) => {
                    st.granules
                        .get_mut(&s.granule)
                        .expect("slot of a live granule")
                        .live -= 1;
                }
            }
        }
        let (event, result) = match stream {
            None => (None, Ok(())),
            Some(stream) => match st
                .events
                .record(self.backend(), stream, blocks.len() as u64)
            {
                Ok(k) => (Some(k), Ok(())),
                Err(e) => {
                    // Cannot order the free: wait for the stream instead, or
                    // never hand the blocks out again.
                    if let Err(sync) = self.backend().stream_synchronize(stream) {
                        tracing::warn!(error = %sync, "vmm: free could not be ordered; blocks quarantined");
                        for (kind, _) in blocks {
                            self.quarantine(&mut st, kind);
                        }
                        return Err(e);
                    }
                    (None, Err(e))
                }
            },
        };
        for (kind, _) in blocks {
            match kind {
                Kind::Large(b) if !b.intact() => {
                    // A move that failed twice left its range unmapped (or
                    // mapped elsewhere): never handed out again.
                    tracing::warn!(
                        id = b.id.0,
                        "vmm: a block whose mapping was lost is quarantined"
                    );
                    self.quarantine(&mut st, Kind::Large(b));
                }
                Kind::Large(b) => {
                    let class = b.va.size();
                    st.large
                        .entry(class)
                        .or_default()
                        .push_back(Free { item: b, event });
                }
                Kind::Small(s) => {
                    let class = st.granules[&s.granule].class;
                    st.small
                        .entry(class)
                        .or_default()
                        .push_back(Free { item: s, event });
                }
            }
        }
        result
    }

    fn quarantine(&self, st: &mut State<B>, kind: Kind<B>) {
        if let Kind::Small(s) = &kind {
            // The slot stays counted as occupied so its granule is kept.
            st.granules.get_mut(&s.granule).expect("live granule").live += 1;
            st.small_quarantined += 1;
        }
        st.quarantine.push(kind);
    }

    fn release_large(b: Large<B>) -> Result<u64> {
        let Large { va, phys, .. } = b;
        let mut first = None;
        keep_first(&mut first, va.release());
        let bytes = phys.size();
        if let Ok(p) = Arc::try_unwrap(phys) {
            keep_first(&mut first, p.release());
        }
        first.map_or(Ok(bytes), Err)
    }

    fn trim_locked(&self, st: &mut State<B>) -> Result<u64> {
        let backend = self.ctx.backend().clone();
        let mut first: Option<DeviceError> = None;
        let mut released = 0;
        let mut ready_large = Vec::new();
        for list in st.large.values_mut() {
            let mut keep = VecDeque::with_capacity(list.len());
            for mut f in list.drain(..) {
                match settle(&*backend, &mut f, &mut st.events) {
                    Ok(true) => ready_large.push(f.item),
                    Ok(false) => keep.push_back(f),
                    Err(e) => {
                        first.get_or_insert(e);
                        keep.push_back(f);
                    }
                }
            }
            *list = keep;
        }
        st.large.retain(|_, l| !l.is_empty());
        for b in ready_large {
            match Self::release_large(b) {
                Ok(n) => released += n,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        // Granules with no live slot and every free slot settled.
        let empty: Vec<u64> = st
            .granules
            .iter()
            .filter(|(_, g)| g.live == 0)
            .map(|(k, _)| *k)
            .collect();
        for key in empty {
            let class = st.granules[&key].class;
            let list = st
                .small
                .get_mut(&class)
                .expect("class of a granule has a list");
            let mut all_ready = true;
            for f in list.iter_mut().filter(|f| f.item.granule == key) {
                match settle(&*backend, f, &mut st.events) {
                    Ok(true) => {}
                    Ok(false) => all_ready = false,
                    Err(e) => {
                        all_ready = false;
                        first.get_or_insert(e);
                    }
                }
            }
            if !all_ready {
                continue;
            }
            list.retain(|f| f.item.granule != key);
            if list.is_empty() {
                st.small.remove(&class);
            }
            let g = st.granules.remove(&key).expect("listed above");
            let b = Large {
                va: g.va,
                phys: g.phys,
                id: AllocationId(0),
                generation: 0,
            };
            match Self::release_large(b) {
                Ok(n) => released += n,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        keep_first(&mut first, st.events.destroy_pool(&*backend));
        match first {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }
}

impl<B: Backend> Drop for Inner<B> {
    /// Teardown: wait for pending frees, then release everything (errors
    /// are recorded in the context).
    fn drop(&mut self) {
        let ctx = self.ctx.clone();
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let mut blocks: Vec<Large<B>> = Vec::new();
        for f in std::mem::take(&mut st.large).into_values().flatten() {
            blocks.push(f.item);
        }
        st.small.clear();
        // Wait for pending frees before any memory goes back to the driver.
        st.events.teardown(&ctx);
        for k in std::mem::take(&mut st.quarantine) {
            if let Kind::Large(b) = k {
                blocks.push(b);
            }
        }
        for g in std::mem::take(&mut st.granules).into_values() {
            blocks.push(Large {
                va: g.va,
                phys: g.phys,
                id: AllocationId(0),
                generation: 0,
            });
        }
        for b in blocks {
            if let Err(e) = Self::release_large(b) {
                ctx.record_deferred(e);
            }
        }
    }
}

//! The VMM allocator, generic over the [`Backend`](crate::Backend).
//!
//! Start with [`VmmAllocator`]. Every [`Buffer`] has a physical allocation,
//! identified by an [`AllocationId`], mapped at its own device address:
//!
//! - **Ids.** A fresh physical block gets a new id (process-wide counter,
//!   never reused); handing out a freed block again keeps its id and bumps
//!   its [`Buffer::generation`]. So `(id, generation)` names one buffer
//!   lifetime and `id` names the physical memory: ABA-safe.
//! - **Large buffers** (above [`VmmConfig::small_threshold`]) get a block of
//!   their size rounded up to the granularity: one `mem_create`, one VA
//!   reservation, one `map` + `set_access`. The block keeps its mapping while
//!   cached, so reusing it costs no VMM call. They are remappable: the
//!   runtime may map [`Buffer::phys`] into its own reservation.
//! - **Small buffers** (at most the threshold; `0` disables this) are
//!   sub-allocated from granule-sized pooled blocks in power-of-two classes
//!   (minimum [`VmmConfig::small_min`]); each slot has its own id. They are
//!   not remappable (their memory shares a granule).
//! - **Stream-ordered frees.** [`VmmAllocator::free`] records an event on the
//!   freeing stream; the block is reused only once that event has completed.
//!   [`VmmAllocator::free_all`] frees many buffers with one event.
//!   Dropping a `Buffer` frees it at once (the caller asserts that no queued
//!   work uses it).
//! - **Deterministic reuse.** Each size class is a FIFO of freed blocks; an
//!   allocation takes the oldest block whose free event has completed, and
//!   creates a new one only when none has. A loop that allocates and frees
//!   the same sizes in the same order lands on the same blocks every step.
//! - **Out of memory.** A failed `mem_create` trims the cache (ready blocks
//!   of every class, empty granules) and retries once.
//!
//! RAII wrappers ([`Phys`], [`VaReservation`]) own the backend handles and
//! release them in order; errors in `Drop` are kept
//! ([`VmmAllocator::take_deferred_errors`]).
#![deny(unsafe_code)]

mod allocator;
mod events;
mod raii;

pub use allocator::{Buffer, VmmAllocator, WeakAllocator};
pub use raii::{HandleCounts, Mapping, Phys, VaReservation, VmmContext};

use std::sync::atomic::{AtomicU64, Ordering};

/// Identity of a physical block (a whole allocation or a sub-allocation
/// slot). Never reused for different memory within the process.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct AllocationId(pub u64);

static NEXT_ALLOCATION_ID: AtomicU64 = AtomicU64::new(1);

impl AllocationId {
    pub(crate) fn fresh() -> Self {
        AllocationId(NEXT_ALLOCATION_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// Allocator configuration.
#[derive(Clone, Debug)]
pub struct VmmConfig {
    /// Buffers of at most this many bytes are sub-allocated from pooled
    /// granules; 0 = never sub-allocate. Must not exceed the granularity.
    pub small_threshold: u64,
    /// Smallest sub-allocation slot (power of two); also its alignment.
    pub small_min: u64,
}

impl Default for VmmConfig {
    fn default() -> Self {
        VmmConfig {
            small_threshold: 64 << 10,
            small_min: 256,
        }
    }
}

/// Allocator statistics (bytes and counts).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VmmStats {
    /// VA bytes reserved through this allocator's context.
    pub bytes_reserved: u64,
    /// Bytes mapped through this allocator's context.
    pub bytes_mapped: u64,
    /// Physical bytes held through this allocator's context.
    pub bytes_physical: u64,
    pub bytes_physical_peak: u64,
    /// Requested bytes of live buffers.
    pub bytes_in_use: u64,
    pub bytes_in_use_peak: u64,
    pub buffers_live: u64,
    pub buffers_live_peak: u64,
    /// Freed large blocks kept for reuse (ready or pending).
    pub cached_blocks: u64,
    /// Freed blocks and slots whose free event has not been seen complete.
    pub pending_frees: u64,
    /// Pooled granules for small buffers.
    pub granules: u64,
    /// Blocks whose free could not be stream ordered: never reused.
    pub quarantined: u64,
    pub phys_handles: u64,
    pub va_handles: u64,
    /// Events owned by the allocator (pooled or pending).
    pub event_handles: u64,
    pub allocs_fresh: u64,
    pub allocs_reused: u64,
}

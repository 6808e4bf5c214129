//! Pinned staging memory for asynchronous uploads (`BufferFromHostBuffer`).
//!
//! A host-to-device copy from ordinary (pageable) memory has to finish
//! before the caller may reuse its array, and doing it on the client's
//! stream means waiting for everything queued there: a `device_put` of the
//! next batch would wait for the training step in flight. Instead the bytes
//! are copied on the host into a pinned buffer from this pool, the device
//! copy is enqueued behind the step, and the buffer comes back to the pool
//! when that copy has completed (the event's callback).
//!
//! Bounded: uploads above [`MAX_UPLOAD`] bytes, and uploads that would take
//! the staging memory in use above [`MAX_IN_USE`] bytes, are not staged
//! (the caller copies synchronously instead). At most [`MAX_IDLE`] bytes stay
//! pooled while idle.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use xla_vmm_device::Backend;

use crate::cabi::error::Result;

/// Largest upload staged (bigger ones are rare: initial weights).
pub const MAX_UPLOAD: usize = 64 << 20;
/// Staging memory allocated at once, in flight or idle.
pub const MAX_IN_USE: usize = 512 << 20;
/// Staging memory kept while idle.
pub const MAX_IDLE: usize = 256 << 20;
/// Smallest buffer allocated (sizes are rounded up to a power of two).
const MIN_BUFFER: usize = 64 << 10;

/// Idle buffers with their sizes, and the sum of those sizes.
type Idle<H> = (Vec<(usize, H)>, usize);

pub struct StagingPool<B: Backend> {
    backend: Arc<B>,
    idle: Mutex<Idle<B::HostBuffer>>,
    /// Bytes of every staging buffer alive (idle or in flight).
    in_use: AtomicUsize,
}

impl<B: Backend> StagingPool<B> {
    pub fn new(backend: Arc<B>) -> Arc<Self> {
        Arc::new(StagingPool {
            backend,
            idle: Mutex::new((Vec::new(), 0)),
            in_use: AtomicUsize::new(0),
        })
    }

    fn len_of(&self, b: &B::HostBuffer) -> usize {
        self.backend.host_bytes(b).len()
    }

    /// A buffer of at least `len` bytes holding a copy of `data`
    /// (`data.len() == len`), or `None` when this upload is not to be staged
    /// (too big, or the pool is at its bound).
    pub fn stage(&self, data: &[u8]) -> Result<Option<B::HostBuffer>> {
        let len = data.len();
        if len == 0 || len > MAX_UPLOAD {
            return Ok(None);
        }
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest idle buffer that fits.
            let best = idle
                .0
                .iter()
                .enumerate()
                .filter(|(_, (size, _))| *size >= len)
                .min_by_key(|(_, (size, _))| *size)
                .map(|(i, _)| i);
            best.map(|i| {
                let (size, b) = idle.0.swap_remove(i);
                idle.1 -= size;
                b
            })
        };
        let mut buf = match reused {
            Some(b) => b,
            None => {
                let size = len.next_power_of_two().max(MIN_BUFFER);
                if self.in_use.fetch_add(size, Ordering::AcqRel) + size > MAX_IN_USE {
                    self.in_use.fetch_sub(size, Ordering::AcqRel);
                    return Ok(None);
                }
                match self.backend.host_alloc(size) {
                    Ok(b) => b,
                    Err(e) => {
                        self.in_use.fetch_sub(size, Ordering::AcqRel);
                        return Err(e.into());
                    }
                }
            }
        };
        self.backend.host_bytes_mut(&mut buf)[..len].copy_from_slice(data);
        Ok(Some(buf))
    }

    /// Hand a buffer back once nothing reads it any more (its copy has
    /// completed, or was never enqueued).
    pub fn give_back(&self, buf: B::HostBuffer) {
        let size = self.len_of(&buf);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.1 + size <= MAX_IDLE {
            idle.0.push((size, buf));
            idle.1 += size;
            return;
        }
        drop(idle);
        self.free(buf, size);
    }

    fn free(&self, buf: B::HostBuffer, size: usize) {
        self.in_use.fetch_sub(size, Ordering::AcqRel);
        if let Err(e) = self.backend.host_free(buf) {
            tracing::warn!("freeing a staging buffer: {e}");
        }
    }

    /// Free the idle buffers (client teardown, after the stream is done).
    pub fn clear(&self) {
        let (idle, _) = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        for (size, b) in idle {
            self.free(b, size);
        }
    }

    /// Bytes of staging memory alive (idle or in flight).
    pub fn bytes_in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }
}

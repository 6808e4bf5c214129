//! "Pinned" host buffers of the host backend.
//!
//! The [`Backend`](crate::Backend) contract hands out `&[u8]` / `&mut [u8]`
//! views of a host buffer while copies write into it through a shared
//! reference (`copy_d2h(&HostBuffer)`), exactly like DMA on a GPU. The bytes
//! are therefore stored as atomics: the backend's own reads and writes are
//! plain atomic operations (no unsafe), and only the two view functions below
//! reinterpret them as bytes. They are sound as long as the caller keeps the
//! contract of `host_bytes`: no view is held while a queued copy into the
//! buffer is in flight (the same rule CUDA's pinned memory has).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU8, Ordering};

pub(crate) struct PinnedStorage {
    bytes: Box<[AtomicU8]>,
}

impl PinnedStorage {
    pub fn new(len: usize) -> Self {
        PinnedStorage {
            bytes: (0..len).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn read(&self, offset: usize, out: &mut [u8]) {
        for (o, b) in out.iter_mut().zip(&self.bytes[offset..]) {
            *o = b.load(Ordering::Relaxed);
        }
    }

    pub fn write(&self, offset: usize, data: &[u8]) {
        for (d, b) in data.iter().zip(&self.bytes[offset..]) {
            b.store(*d, Ordering::Relaxed);
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: AtomicU8 has the same size, alignment and bit validity as
        // u8, so the slice layout is identical. Writes happen only through
        // `write` (atomic stores made by queued copies); the backend contract
        // (`Backend::host_bytes`) forbids holding this view while such a copy
        // is in flight, so no write overlaps the lifetime of the view.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), self.bytes.len()) }
    }

    #[allow(clippy::mut_from_ref)]
    pub fn as_bytes_mut(&self) -> &mut [u8] {
        // SAFETY: same layout argument as `as_bytes`. The bytes live inside
        // AtomicU8 (an UnsafeCell), so writing through a pointer derived from
        // a shared reference is permitted. The only caller is
        // `HostBackend::host_bytes_mut`, which holds `&mut HostBuffer` (the
        // unique handle to this storage for user code); queued copies are the
        // only other accessors and the contract forbids them being in flight.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.bytes.as_ptr().cast::<u8>().cast_mut(),
                self.bytes.len(),
            )
        }
    }
}

//! Handles: how Rust objects cross the C boundary and come back checked.
//!
//! Every object the C side holds a pointer to (client, device, memory,
//! buffer, event, executable, error) is an `Arc<T>` kept in a per-kind
//! [`Registry`], keyed by its address. The pointer handed out is
//! `Arc::as_ptr`. When a pointer comes back, it is looked up in the registry
//! *before* anything is read through it: a stale, foreign, or wrong-kind
//! pointer is an error (`INVALID_ARGUMENT`, naming the kind), never a read of
//! freed memory. This is the liveness check ZLUDA does with a cookie, made
//! exact: no dereference happens until the address is known to be live.
//!
//! Objects whose header layout the caller reads (`PJRT_Memory`, `PJRT_Error`:
//! a function-table pointer first) are `#[repr(C)]` with that field first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// A pointer that is not a live object of the kind asked for (null,
/// destroyed, never made here, another kind): an invalid argument, with
/// what it was (`crate::cabi::error::Error` converts it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleHandle(pub String);

type Result<T> = std::result::Result<T, StaleHandle>;

/// Live objects of one kind, by address.
pub struct Registry<T> {
    live: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub const fn new() -> Self {
        Registry {
            live: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Arc<T>>> {
        // A panic while holding the lock (caught at the entry) leaves the
        // map consistent: every operation on it is a single insert/remove.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// An object that the C side refers to by pointer.
pub trait Handle: Sized + Send + Sync + 'static {
    /// The opaque C type (`PJRT_Buffer`, ...).
    type C;
    /// Its C name, for error messages.
    const KIND: &'static str;
    fn registry() -> &'static Registry<Self>;

    /// Register `self` and return the pointer to give the caller.
    fn into_c(self: Arc<Self>) -> *mut Self::C {
        let addr = Arc::as_ptr(&self) as usize;
        Self::registry().lock().insert(addr, self);
        addr as *mut Self::C
    }

    /// The live object behind `ptr`.
    fn from_c(ptr: *const Self::C) -> Result<Arc<Self>> {
        if ptr.is_null() {
            return Err(StaleHandle(format!("{} is null", Self::KIND)));
        }
        Self::registry()
            .lock()
            .get(&(ptr as usize))
            .cloned()
            .ok_or_else(|| {
                StaleHandle(format!(
                    "{} {ptr:p} is not a live object of this plugin (destroyed, or never created here)",
                    Self::KIND
                ))
            })
    }

    /// Unregister `ptr` and return the object (dropped when the last `Arc`
    /// held elsewhere goes).
    fn release(ptr: *const Self::C) -> Result<Arc<Self>> {
        if ptr.is_null() {
            return Err(StaleHandle(format!("{} is null", Self::KIND)));
        }
        Self::registry()
            .lock()
            .remove(&(ptr as usize))
            .ok_or_else(|| {
                StaleHandle(format!(
                    "{} {ptr:p} is not a live object of this plugin (destroyed twice?)",
                    Self::KIND
                ))
            })
    }

    /// The pointer the caller knows this object by (it must be registered).
    fn c_ptr(self: &Arc<Self>) -> *mut Self::C {
        Arc::as_ptr(self) as *mut Self::C
    }
}

//! # Temporaries' memory shared by the programs of a device
//!
//! A program's temporaries hold nothing from one step to the next, and the
//! programs of a device whose steps run one after the other on one stream
//! (`RunConfig::one_stream`, the plugin) never use theirs at once. Each
//! such program maps its temporaries at addresses of its own (its graphs
//! stay valid) onto the start of one physical memory of the device, as
//! large as the largest program's temporaries: the device holds the
//! largest, not the sum (stock XLA allocates them per execution from one
//! pool, to the same effect). A program larger than every earlier one
//! makes a larger memory, which later programs share; the earlier ones keep
//! theirs until they are dropped.
//!
//! Only device memory is shared. Under a device budget that has no room
//! left, a program's temporaries are its own memory wherever the budget
//! puts it (host memory): memory other buffers map does not move, so
//! shared temporaries in host memory could never come back to the device
//! for a plan that wants them there.
//!
//! Each program maps the whole memory ([`crate::slots::DeviceBuffer::map_shared`]:
//! the driver refused a prefix of it, and that program then ran on the
//! vendor runtime); a mapping that fails all the same leaves the program
//! temporaries of its own.

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

use xla_vmm_device::vmm::{Phys, VmmContext};
use xla_vmm_device::Backend;

/// Each device's (backend's) temporaries' memories, while a program maps
/// them.
static MEMORIES: Mutex<Vec<(usize, Weak<dyn Any + Send + Sync>)>> = Mutex::new(Vec::new());

/// The device's memories for temporaries that loaded programs map:
/// (how many, their bytes).
pub(crate) fn held<B: Backend + 'static>(backend: &Arc<B>) -> (usize, u64) {
    let key = Arc::as_ptr(backend) as *const () as usize;
    let all = MEMORIES.lock().unwrap_or_else(|e| e.into_inner());
    all.iter()
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, w)| w.upgrade()?.downcast::<Phys<B>>().ok())
        .fold((0, 0), |(n, b), p| (n + 1, b + p.size()))
}

/// Device memory of at least `bytes` (a multiple of the granularity) for
/// temporaries on `ctx`'s device: the smallest of the device's live ones
/// that is as large, else a new one (then the device's too, for later
/// programs; the smaller ones stay with the programs that map them).
/// `None`: the device budget has no room for a new one (the caller's
/// temporaries are its own memory).
pub(crate) fn memory<B: Backend + 'static>(
    ctx: &VmmContext<B>,
    bytes: u64,
) -> Option<Arc<Phys<B>>> {
    let key = Arc::as_ptr(ctx.backend()) as *const () as usize;
    let mut all = MEMORIES.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    let found = all
        .iter()
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, w)| w.upgrade()?.downcast::<Phys<B>>().ok())
        .filter(|p| p.size() >= bytes)
        .min_by_key(|p| p.size());
    if let Some(p) = found {
        return Some(p);
    }
    let phys = match Phys::create_device(ctx, bytes) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            tracing::debug!(bytes, error = %e, "temporaries not shared: no device memory for them");
            return None;
        }
    };
    let any: Arc<dyn Any + Send + Sync> = phys.clone();
    all.push((key, Arc::downgrade(&any)));
    Some(phys)
}

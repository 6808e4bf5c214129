//! The memory kinds JAX names (`PJRT_Memory_Kind`): a device's own memory
//! and pinned host memory.

/// The kind name of device memory, as the vendor GPU plugin names it.
pub const DEVICE_MEMORY_KIND: &str = "device";
/// Page-locked host memory the device addresses (XLA's `pinned_host`: host
/// offload, `device_put(x, memory_kind="pinned_host")`).
pub const PINNED_HOST_MEMORY_KIND: &str = "pinned_host";

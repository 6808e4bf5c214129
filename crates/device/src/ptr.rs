//! Device addresses: what kernels see, and what every layer computes with.

/// A device virtual address (what kernels see). Plain integer: the runtime
/// does address arithmetic on it; the backend checks it on use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

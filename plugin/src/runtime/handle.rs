//! Typed handles across the plugin's backend-erased layer.
//!
//! The C-facing objects are not generic over the backend: a buffer's
//! memory is an [`Allocation`](crate::runtime::context::Allocation) whose
//! backing says what it can do ([`Backing`](crate::runtime::context::Backing)),
//! and what the VA-stable binding needs of it travels to the program as a
//! [`BufferHandle`]: one variant per backend the plugin is built with, so a
//! program takes back exactly its own backend's buffer
//! ([`PluginBackend::user_buffer`]) and a handle of another backend is
//! an error, not a silent copy.

use xla_vmm_device::{Backend, HostBackend};
use xla_vmm_runtime::UserBuffer;

/// What a program binds of a caller's buffer (its physical memory,
/// allocation id, generation, location), for any backend built in.
pub enum BufferHandle {
    Host(UserBuffer<HostBackend>),
    #[cfg(feature = "cuda")]
    Cuda(UserBuffer<xla_vmm_device::cuda::CudaBackend>),
    #[cfg(feature = "hip")]
    Hip(UserBuffer<xla_vmm_device::hip::HipBackend>),
}

/// A backend the plugin runs programs on: its buffers in and out of a
/// [`BufferHandle`].
pub trait PluginBackend: Backend + Sized {
    /// Wrap one of its buffers.
    fn handle(buffer: UserBuffer<Self>) -> BufferHandle;
    /// Its buffer, if `handle` is one of its backend's.
    fn user_buffer(handle: BufferHandle) -> Option<UserBuffer<Self>>;
}

/// [`PluginBackend`] for a backend and its variant.
macro_rules! plugin_backend {
    ($backend:ty, $variant:ident) => {
        impl PluginBackend for $backend {
            fn handle(buffer: UserBuffer<Self>) -> BufferHandle {
                BufferHandle::$variant(buffer)
            }
            #[allow(unreachable_patterns)] // one backend built in
            fn user_buffer(handle: BufferHandle) -> Option<UserBuffer<Self>> {
                match handle {
                    BufferHandle::$variant(b) => Some(b),
                    _ => None,
                }
            }
        }
    };
}

plugin_backend!(HostBackend, Host);
#[cfg(feature = "cuda")]
plugin_backend!(xla_vmm_device::cuda::CudaBackend, Cuda);
#[cfg(feature = "hip")]
plugin_backend!(xla_vmm_device::hip::HipBackend, Hip);

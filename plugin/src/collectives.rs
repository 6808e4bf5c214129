//! Collectives of multi-device executables: the one place the plugin meets
//! the runtime's collective API (`xla_vmm_runtime::collective`).
//!
//! Every client has one set of cliques shared by its devices; clique ids go
//! through an in-process exchange (one process) or the `jax.distributed`
//! key-value store (`kv.rs`, several processes). Each device's program gets
//! the executable's device assignment and its own global id.

use std::sync::Arc;

use xla_vmm_device::Backend;
use xla_vmm_runtime::Executable;

use crate::assignment::MultiDevice;
use crate::error::Result;
use crate::kv::KvExchange;

/// Where clique ids are exchanged.
#[derive(Clone)]
pub enum Exchange {
    /// All devices are in this process.
    Local,
    /// Through the `jax.distributed` key-value store.
    Kv(Arc<KvExchange>),
}

/// Placeholder until the runtime's `Cliques` lands: keeps the exchange.
pub struct Cliques<B: Backend> {
    _exchange: Exchange,
    _backend: std::marker::PhantomData<fn() -> B>,
}

/// The cliques of a new client.
pub fn cliques<B: Backend>(exchange: Exchange) -> Arc<Cliques<B>> {
    Arc::new(Cliques {
        _exchange: exchange,
        _backend: std::marker::PhantomData,
    })
}

/// Give a freshly loaded program its place in the assignment.
pub fn attach<B: Backend>(
    _exe: &mut Executable<B>,
    multi: &MultiDevice,
    _cliques: Arc<Cliques<B>>,
) -> Result<()> {
    tracing::debug!(
        device = multi.device_id,
        replicas = multi.assignment.replicas,
        partitions = multi.assignment.partitions,
        "multi-device program"
    );
    Ok(())
}

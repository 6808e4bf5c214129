//! Collectives of multi-device executables: the one place the plugin meets
//! the runtime's collective API (`xla_vmm_runtime::collective`).
//!
//! Every client has one set of cliques shared by its devices; clique ids go
//! through an in-process exchange (one process) or the `jax.distributed`
//! key-value store (`kv.rs`, several processes). Each device's program gets
//! the executable's device assignment and its own global id.

use std::sync::Arc;
use std::time::Duration;

use xla_vmm_device::Backend;
pub use xla_vmm_runtime::Cliques;
use xla_vmm_runtime::{CollectiveEnv, Executable, IdExchange, LocalExchange, RuntimeError};

use crate::cabi::assignment::MultiDevice;
use crate::cabi::error::Result;
use crate::cabi::kv::KvExchange;

/// Where clique ids are exchanged.
#[derive(Clone)]
pub enum Exchange {
    /// All devices are in this process.
    Local,
    /// Through the `jax.distributed` key-value store.
    Kv(Arc<KvExchange>),
}

impl IdExchange for KvExchange {
    fn put(&self, key: &str, value: &str) -> std::result::Result<(), RuntimeError> {
        KvExchange::put(self, key, value).map_err(|e| RuntimeError::InvalidArgument(e.message))
    }

    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<String, RuntimeError> {
        KvExchange::get(self, key, timeout).map_err(|e| RuntimeError::InvalidArgument(e.message))
    }
}

/// The cliques of a new client (shared by all its devices).
pub fn cliques<B: Backend>(exchange: Exchange) -> Arc<Cliques<B>> {
    let exchange: Arc<dyn IdExchange> = match exchange {
        Exchange::Local => LocalExchange::new(),
        Exchange::Kv(kv) => kv,
    };
    Cliques::new(exchange)
}

/// Give a freshly loaded program its place in the assignment (before its
/// first run; its communicators are made at the first run).
pub fn attach<B: Backend>(
    exe: &mut Executable<B>,
    multi: &MultiDevice,
    cliques: Arc<Cliques<B>>,
) -> Result<()> {
    tracing::debug!(
        device = multi.device_id,
        replicas = multi.assignment.replicas,
        partitions = multi.assignment.partitions,
        "multi-device program"
    );
    exe.set_collectives(CollectiveEnv {
        assignment: multi.assignment.clone(),
        device_id: multi.device_id,
        cliques,
    })?;
    Ok(())
}

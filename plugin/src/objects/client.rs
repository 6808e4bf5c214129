//! `PJRT_Client`: options, the device backend, devices and memories.
//!
//! The platform name is `cuda` on every backend (the host backend too), so
//! JAX applies its GPU lowering rules to programs for this client.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use xla_vmm_device::{HostBackend, HostConfig};
use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{self, CPtr};
use crate::cabi::error::{Error, Result};
use crate::cabi::handles::{Handle, Registry};
use crate::cabi::kv::{KvExchange, KvStore};
use crate::cabi::options::{BackendKind, ClientOptions};
use crate::objects::device::{Device, Memory, Place};
use crate::objects::remote::RemoteDevice;
use crate::runtime::collectives::{self, Exchange};
use crate::runtime::context::{DeviceContext, VmmDevice};
use crate::runtime::handle::PluginBackend;
use crate::vendor_plugin::compiler::{VendorClient, VendorPlugin, VendorTopology};
use crate::vendor_plugin::locate;

pub const PLATFORM_NAME: &str = "cuda";

pub struct Client {
    pub options: ClientOptions,
    /// The vendor compiler, created at the first compile.
    vendor: Mutex<Option<Arc<VendorClient>>>,
    pub platform_version: String,
    /// The vendor client's platform version (e.g. "cuda 13000"), reported
    /// as ours when known.
    vendor_platform_version: OnceLock<String>,
    /// Every device of the job, by global id (other processes' devices are
    /// listed, not addressable).
    pub devices: Vec<Arc<Device>>,
    /// This process's devices, in local order.
    pub addressable: Vec<Arc<Device>>,
    /// The `jax.distributed` key-value store (multi-process), passed on to
    /// the vendor client.
    kv: Option<KvStore>,
    device_ptrs: Vec<CPtr<PJRT_Device>>,
    addressable_ptrs: Vec<CPtr<PJRT_Device>>,
    memory_ptrs: Vec<CPtr<PJRT_Memory>>,
    /// The job's topology (owned here; `PJRT_Client_TopologyDescription`).
    pub topology: Arc<crate::objects::topology::Topology>,
}

static CLIENTS: Registry<Client> = Registry::new();

impl Handle for Client {
    type C = PJRT_Client;
    const KIND: &'static str = "PJRT_Client";
    fn registry() -> &'static Registry<Self> {
        &CLIENTS
    }
}

impl Client {
    /// A client over an existing backend (tests pass a `HostBackend` they
    /// keep a handle to, to check for leaks after destroy).
    pub fn with_backend<B: PluginBackend>(
        options: ClientOptions,
        backend: Arc<B>,
    ) -> Result<Arc<Client>> {
        Self::with_backends(options, vec![backend], None)
    }

    /// A client with one device per backend (in local order); `kv`: the
    /// key-value store of a multi-process run.
    pub fn with_backends<B: PluginBackend>(
        options: ClientOptions,
        backends: Vec<Arc<B>>,
        kv: Option<KvStore>,
    ) -> Result<Arc<Client>> {
        let mems = backends
            .into_iter()
            .map(|b| VmmDevice::with_run_config(b, options.run.clone(), options.exec))
            .collect::<Result<Vec<_>>>()?;
        Self::with_memories(options, mems, kv)
    }

    /// A client over prepared device memory (backend + allocator + GEMM),
    /// one device.
    pub fn with_memory<B: PluginBackend>(
        options: ClientOptions,
        mem: Arc<VmmDevice<B>>,
    ) -> Result<Arc<Client>> {
        let local: Vec<Arc<dyn DeviceContext>> = vec![mem];
        Self::assemble(options, local, None)
    }

    /// A client over prepared device memories (one device each), which
    /// share one set of collective cliques.
    pub fn with_memories<B: PluginBackend>(
        options: ClientOptions,
        mems: Vec<VmmDevice<B>>,
        kv: Option<KvStore>,
    ) -> Result<Arc<Client>> {
        let exchange = match (&kv, options.num_nodes > 1) {
            (Some(store), true) => {
                Exchange::Kv(KvExchange::new(*store, options.node_id, options.num_nodes))
            }
            _ => Exchange::Local,
        };
        let cliques = collectives::cliques::<B>(exchange.clone());
        let local: Vec<Arc<dyn DeviceContext>> = mems
            .into_iter()
            .map(|m| Arc::new(m.with_cliques(cliques.clone())) as Arc<dyn DeviceContext>)
            .collect();
        let kv_exchange = match exchange {
            Exchange::Kv(k) => Some(k),
            Exchange::Local => None,
        };
        Self::assemble_with(options, local, kv, kv_exchange)
    }

    fn assemble(
        options: ClientOptions,
        local: Vec<Arc<dyn DeviceContext>>,
        kv: Option<KvStore>,
    ) -> Result<Arc<Client>> {
        let exchange = match (&kv, options.num_nodes > 1) {
            (Some(store), true) => {
                Some(KvExchange::new(*store, options.node_id, options.num_nodes))
            }
            _ => None,
        };
        Self::assemble_with(options, local, kv, exchange)
    }

    /// The devices of the job: every process's local count (through the
    /// key-value store when there are several processes), global ids in
    /// process order.
    fn assemble_with(
        options: ClientOptions,
        local: Vec<Arc<dyn DeviceContext>>,
        kv: Option<KvStore>,
        exchange: Option<Arc<KvExchange>>,
    ) -> Result<Arc<Client>> {
        let first = local
            .first()
            .ok_or_else(|| Error::not_found("no device to create the client on"))?;
        let info = first.info().clone();
        let counts = if options.num_nodes > 1 {
            let ex = exchange.ok_or_else(|| {
                Error::invalid(format!(
                    "num_nodes {} needs the key-value store of jax.distributed \
                     (PJRT_Client_Create kv_get_callback / kv_put_callback); none was given",
                    options.num_nodes
                ))
            })?;
            ex.topology(
                options.node_id,
                options.num_nodes,
                local.len(),
                options.topology_timeout,
            )?
        } else {
            vec![local.len()]
        };
        let platform_version = format!(
            "xla-vmm {} ({} backend, {})",
            env!("CARGO_PKG_VERSION"),
            info.backend,
            info.name
        );
        let mut devices = Vec::new();
        let mut addressable = Vec::new();
        let mut next_id = 0i32;
        let mut local_mems = local.iter();
        for (node, &count) in counts.iter().enumerate() {
            for j in 0..count {
                let place = Place {
                    id: next_id,
                    local_hardware_id: j as i32,
                    process_index: node as i32,
                    addressable: node == options.node_id,
                };
                let mem: Arc<dyn DeviceContext> = if place.addressable {
                    local_mems
                        .next()
                        .cloned()
                        .ok_or_else(|| Error::internal("fewer local devices than counted"))?
                } else {
                    Arc::new(RemoteDevice::new(&info, next_id, node as i32))
                };
                let d = Device::create_at(place, mem);
                if place.addressable {
                    addressable.push(d.clone());
                }
                devices.push(d);
                next_id += 1;
            }
        }
        let ptrs = |ds: &[Arc<Device>]| ds.iter().map(|d| CPtr(d.c_ptr())).collect::<Vec<_>>();
        let device_ptrs = ptrs(&devices);
        let addressable_ptrs = ptrs(&addressable);
        let memory_ptrs = addressable
            .iter()
            .flat_map(|d| d.memories.get().into_iter().flatten())
            .map(|m| CPtr(m.c_ptr()))
            .collect();
        tracing::info!(backend = info.backend, device = %info.name,
            local = addressable.len(), global = devices.len(),
            process = options.node_id, "xla-vmm client created");
        let topology = crate::objects::topology::Topology::register(
            PLATFORM_NAME,
            &platform_version,
            &devices,
        );
        Ok(Arc::new(Client {
            options,
            vendor: Mutex::new(None),
            topology,
            platform_version,
            vendor_platform_version: OnceLock::new(),
            devices,
            addressable,
            kv,
            device_ptrs,
            addressable_ptrs,
            memory_ptrs,
        }))
    }

    /// A client as `PJRT_Client_Create` makes it: every local device of
    /// the backend (host: `host_devices` emulated ones).
    pub fn new(options: ClientOptions, kv: Option<KvStore>) -> Result<Arc<Client>> {
        match options.backend {
            BackendKind::Host => {
                let n = options
                    .max_devices
                    .map_or(options.host_devices, |m| m.min(options.host_devices));
                let backends = (0..n)
                    .map(|_| HostBackend::new(HostConfig::default()).map(Arc::new))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Self::with_backends(options, backends, kv)
            }
            BackendKind::Cuda => new_cuda(options, kv),
            BackendKind::Hip => new_hip(options, kv),
        }
    }

    /// The device behind `ptr`, one of this client's.
    pub fn device(&self, ptr: *mut PJRT_Device) -> Result<Arc<Device>> {
        let d = Device::from_c(ptr)?;
        if !self.devices.iter().any(|x| Arc::ptr_eq(x, &d)) {
            return Err(Error::invalid("the device belongs to another client"));
        }
        Ok(d)
    }

    /// The addressable device with global id `id`.
    pub fn addressable_device(&self, id: i64) -> Result<Arc<Device>> {
        if let Some(d) = self.addressable.iter().find(|d| d.id() as i64 == id) {
            return Ok(d.clone());
        }
        match self.devices.iter().find(|d| d.id() as i64 == id) {
            Some(d) => Err(Error::invalid(format!(
                "device {id} belongs to process {}, this is process {}",
                d.description.process_index, self.options.node_id
            ))),
            None => Err(Error::invalid(format!(
                "no device {id} (this client has {} devices)",
                self.devices.len()
            ))),
        }
    }

    /// The vendor compiler client (located, loaded and created on first use).
    pub fn vendor(&self) -> Result<Arc<VendorClient>> {
        let mut slot = self.vendor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = slot.as_ref() {
            return Ok(v.clone());
        }
        let path = locate::locate(
            self.options.vendor_plugin_path.as_deref(),
            &self.options.search_env,
        )?;
        let plugin = VendorPlugin::load(&path)?;
        let topology = VendorTopology {
            node_id: self.options.node_id,
            num_nodes: self.options.num_nodes,
            kv: self.kv,
        };
        let client = Arc::new(VendorClient::create(plugin, &topology)?);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The vendor client if one can be had (no error: host-backend clients
    /// and machines without the vendor plugin simply have none).
    pub fn vendor_if_available(&self) -> Option<Arc<VendorClient>> {
        if self.options.backend == BackendKind::Host && self.options.vendor_plugin_path.is_none() {
            return None;
        }
        match self.vendor() {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::debug!("no vendor client: {e}");
                None
            }
        }
    }

    /// Destroy: wait for the devices' queued work, stop the completion
    /// threads (their pending events complete first), unregister the devices.
    fn teardown(&self) {
        // Waiting for a device's stream can block forever if a collective
        // there waits for a peer process that is gone; a watchdog says
        // which step teardown is waiting in, after 2 s (a process asked to
        // exit is expected to within a few) and then every 10 s, so such a
        // hang is named in the log instead of being silent.
        let watch = crate::runtime::watchdog::Watchdog::start(
            "client teardown",
            Duration::from_secs(2),
            Duration::from_secs(10),
        );
        for d in &self.addressable {
            watch.stage(format!("device {}: worker thread", d.id()));
            d.worker.shutdown();
            watch.stage(format!("device {}: stream and completions", d.id()));
            d.mem.shutdown();
        }
        watch.stage("vendor client".into());
        let vendor = self.vendor.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(v) = vendor {
            // Under jax.distributed the vendor's client is a multi-process
            // one too: its destroy gets the same bound as a communicator's
            // (nothing of ours depends on it finishing).
            use xla_vmm_device::collective::{destroy_timeout, Reaper};
            Reaper::process().destroy("the vendor PJRT client", destroy_timeout(), move || drop(v));
        }
        for d in &self.devices {
            d.unregister();
        }
        self.topology.unregister();
    }
}

/// A client on every visible GPU of one backend: `open(ordinal)` until an
/// ordinal does not exist (the driver applies `CUDA_VISIBLE_DEVICES` /
/// `HIP_VISIBLE_DEVICES`), up to `max_devices`; `gemm` gives each device its
/// GEMM engine where there is one (without it, programs with GEMM thunks
/// fail to load with a clear error and everything else works). The vendor
/// compiler is created at once: `PJRT_Plugin_Attributes` (called right
/// after) reports its versions, and the platform version is its (JAX reads
/// the CUDA / ROCm versions from it); without it buffers still work and
/// compiling reports why there is none.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn new_gpu<B: PluginBackend + 'static>(
    options: ClientOptions,
    kv: Option<KvStore>,
    name: &str,
    open: impl Fn(usize) -> xla_vmm_device::Result<B>,
    gemm: impl Fn(&Arc<B>) -> Option<Arc<dyn xla_vmm_device::blas::GemmEngine<B>>>,
) -> Result<Arc<Client>> {
    let first = Arc::new(open(0).map_err(|e| {
        Error::from(e).context(&format!(
            "creating the {name} backend (to run without a GPU: set XLA_VMM_BACKEND=host, or the client option backend=host)"
        ))
    })?);
    let mut backends = vec![first];
    let cap = options.max_devices.unwrap_or(usize::MAX);
    while backends.len() < cap {
        match open(backends.len()) {
            Ok(b) => backends.push(Arc::new(b)),
            Err(e) => {
                tracing::debug!("no {name} device {}: {e}", backends.len());
                break;
            }
        }
    }
    let mut mems = Vec::with_capacity(backends.len());
    for backend in backends {
        let g = gemm(&backend);
        mems.push(
            VmmDevice::with_run_config(backend, options.run.clone(), options.exec)?.with_gemm(g),
        );
    }
    let client = Client::with_memories(options, mems, kv)?;
    match client.vendor() {
        Ok(v) => match v.platform_version() {
            Ok(pv) => {
                let _ = client.vendor_platform_version.set(pv);
            }
            Err(e) => tracing::warn!("vendor platform version: {e}"),
        },
        Err(e) => tracing::warn!("no vendor compiler yet: {e}"),
    }
    Ok(client)
}

#[cfg(feature = "cuda")]
fn new_cuda(options: ClientOptions, kv: Option<KvStore>) -> Result<Arc<Client>> {
    use xla_vmm_device::cuda::{blaslt::CudaGemm, CudaBackend};
    new_gpu(
        options,
        kv,
        "CUDA",
        CudaBackend::new,
        |b| match CudaGemm::new(b) {
            Ok(g) => Some(Arc::new(g)),
            Err(e) => {
                tracing::warn!("cuBLASLt not available: {e}");
                None
            }
        },
    )
}

#[cfg(not(feature = "cuda"))]
fn new_cuda(_options: ClientOptions, _kv: Option<KvStore>) -> Result<Arc<Client>> {
    Err(Error::unimplemented(
        "this build of the xla-vmm plugin has no CUDA backend (feature `cuda`)",
    ))
}

/// ROCm: every visible HIP device, the ROCm vendor plugin as the compiler
/// and hipBLASLt (`hip/blaslt.rs`) for the GEMM thunks. Compiled in CI,
/// never run on an AMD GPU.
#[cfg(feature = "hip")]
fn new_hip(options: ClientOptions, kv: Option<KvStore>) -> Result<Arc<Client>> {
    use xla_vmm_device::hip::{blaslt::HipGemm, HipBackend};
    new_gpu(
        options,
        kv,
        "HIP",
        HipBackend::new,
        |b| match HipGemm::new(b) {
            Ok(g) => Some(Arc::new(g)),
            Err(e) => {
                tracing::warn!("hipBLASLt not available: {e}");
                None
            }
        },
    )
}

#[cfg(not(feature = "hip"))]
fn new_hip(_options: ClientOptions, _kv: Option<KvStore>) -> Result<Arc<Client>> {
    Err(Error::unimplemented(
        "this build of the xla-vmm plugin has no HIP backend (feature `hip`)",
    ))
}

/// Register a client and return its C handle.
pub fn into_c(client: Arc<Client>) -> *mut PJRT_Client {
    client.into_c()
}

// ---- entries ----------------------------------------------------------------

pub fn create(a: &mut PJRT_Client_Create_Args) -> Result<()> {
    let items = caller::read_named_values(a.create_options, a.num_options)?;
    let options = ClientOptions::parse(&items)?;
    a.client = Client::new(options, KvStore::from_create_args(a))?.into_c();
    Ok(())
}

pub fn destroy(a: &mut PJRT_Client_Destroy_Args) -> Result<()> {
    let client = Client::release(a.client)?;
    client.teardown();
    Ok(())
}

pub fn platform_name(a: &mut PJRT_Client_PlatformName_Args) -> Result<()> {
    Client::from_c(a.client)?;
    a.platform_name = PLATFORM_NAME.as_ptr().cast();
    a.platform_name_size = PLATFORM_NAME.len();
    Ok(())
}

pub fn process_index(a: &mut PJRT_Client_ProcessIndex_Args) -> Result<()> {
    a.process_index = Client::from_c(a.client)?.options.node_id as i32;
    Ok(())
}

pub fn platform_version(a: &mut PJRT_Client_PlatformVersion_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    // The string lives as long as the client.
    let v = c
        .vendor_platform_version
        .get()
        .unwrap_or(&c.platform_version);
    a.platform_version = v.as_ptr().cast();
    a.platform_version_size = v.len();
    Ok(())
}

pub fn devices(a: &mut PJRT_Client_Devices_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    a.devices = c.device_ptrs.as_ptr().cast();
    a.num_devices = c.device_ptrs.len();
    Ok(())
}

/// jax.distributed tells every client the state of every process (task)
/// when it changes. Our collectives need nothing from it (a failed peer
/// surfaces as a communicator error); the states are checked and logged.
pub fn update_global_process_info(a: &mut PJRT_Client_UpdateGlobalProcessInfo_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    let infos = caller::slice(
        a.process_infos.cast_const(),
        a.num_process_infos,
        "process_infos",
    )?;
    for p in infos {
        let message = if p.error_message.is_null() || p.error_message_size == 0 {
            String::new()
        } else {
            String::from_utf8_lossy(caller::slice(
                p.error_message.cast::<u8>(),
                p.error_message_size,
                "error_message",
            )?)
            .into_owned()
        };
        tracing::debug!(node = c.options.node_id, task = p.task_id, incarnation = p.incarnation_id,
            state = p.state as i64, error_code = p.error_code, %message, "global process info");
        if p.error_code != 0 {
            tracing::warn!(task = p.task_id, error_code = p.error_code, %message,
                "jax.distributed reports a failed process");
        }
    }
    Ok(())
}

pub fn addressable_devices(a: &mut PJRT_Client_AddressableDevices_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    a.addressable_devices = c.addressable_ptrs.as_ptr().cast();
    a.num_addressable_devices = c.addressable_ptrs.len();
    Ok(())
}

pub fn lookup_device(a: &mut PJRT_Client_LookupDevice_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    let d = c
        .devices
        .iter()
        .find(|d| d.id() == a.id)
        .ok_or_else(|| Error::invalid(format!("no device with id {}", a.id)))?;
    a.device = d.c_ptr();
    Ok(())
}

pub fn lookup_addressable_device(a: &mut PJRT_Client_LookupAddressableDevice_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    let d = c
        .addressable
        .iter()
        .find(|d| d.local_hardware_id == a.local_hardware_id)
        .ok_or_else(|| {
            Error::invalid(format!(
                "no device with local hardware id {}",
                a.local_hardware_id
            ))
        })?;
    a.addressable_device = d.c_ptr();
    Ok(())
}

pub fn addressable_memories(a: &mut PJRT_Client_AddressableMemories_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    a.addressable_memories = c.memory_ptrs.as_ptr().cast();
    a.num_addressable_memories = c.memory_ptrs.len();
    Ok(())
}

pub fn default_device_assignment(a: &mut PJRT_Client_DefaultDeviceAssignment_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    if a.num_replicas < 1 || a.num_partitions < 1 {
        return Err(Error::invalid(format!(
            "{} replicas x {} partitions: both must be at least 1",
            a.num_replicas, a.num_partitions
        )));
    }
    let n = (a.num_replicas as usize).saturating_mul(a.num_partitions as usize);
    if n > c.devices.len() {
        return Err(Error::invalid(format!(
            "{} replicas x {} partitions need {n} devices; this client has {}",
            a.num_replicas,
            a.num_partitions,
            c.devices.len()
        )));
    }
    if a.default_assignment_size < n {
        return Err(Error::invalid(format!(
            "default_assignment has room for {} ids, {n} needed",
            a.default_assignment_size
        )));
    }
    let ids: Vec<i32> = c.devices.iter().take(n).map(|d| d.id()).collect();
    caller::write_slice(a.default_assignment, &ids, "default_assignment")?;
    Ok(())
}

/// The device of `memory` (for buffers placed by memory).
pub fn memory_device(client: &Client, memory: *mut PJRT_Memory) -> Result<Arc<Device>> {
    let m = Memory::from_c(memory)?;
    client
        .addressable
        .iter()
        .find(|d| {
            d.memories
                .get()
                .into_iter()
                .flatten()
                .any(|x| Arc::ptr_eq(x, &m))
        })
        .cloned()
        .ok_or_else(|| Error::invalid("the memory belongs to another client"))
}

pub fn topology_description(a: &mut PJRT_Client_TopologyDescription_Args) -> Result<()> {
    a.topology = Client::from_c(a.client)?.topology.c_ptr();
    Ok(())
}

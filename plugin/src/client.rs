//! `PJRT_Client`: options, the device backend, devices and memories.
//!
//! The platform name is `cuda` on every backend (the host backend too), so
//! JAX applies its GPU lowering rules to programs for this client.

use std::sync::{Arc, Mutex, OnceLock};

use xla_vmm_device::{Backend, HostBackend, HostConfig};
use xla_vmm_ffi::pjrt::*;

use crate::cabi::{self, CPtr};
use crate::device::{Device, Memory};
use crate::devmem::{DeviceMemory, VmmMemory};
use crate::error::{Error, Result};
use crate::handles::{Handle, Registry};
use crate::options::{BackendKind, ClientOptions};
use crate::vendor::{VendorClient, VendorPlugin};
use crate::vendor_locate;

pub const PLATFORM_NAME: &str = "cuda";

pub struct Client {
    pub options: ClientOptions,
    /// The vendor compiler, created at the first compile.
    vendor: Mutex<Option<Arc<VendorClient>>>,
    pub platform_version: String,
    /// The vendor client's platform version (e.g. "cuda 13000"), reported
    /// as ours when known.
    vendor_platform_version: OnceLock<String>,
    pub devices: Vec<Arc<Device>>,
    device_ptrs: Vec<CPtr<PJRT_Device>>,
    memory_ptrs: Vec<CPtr<PJRT_Memory>>,
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
    pub fn with_backend<B: Backend>(
        options: ClientOptions,
        backend: Arc<B>,
    ) -> Result<Arc<Client>> {
        let t = options.tmp_copy_threshold;
        Self::with_memory(options, Arc::new(VmmMemory::with_threshold(backend, t)?))
    }

    /// A client over prepared device memory (backend + allocator + GEMM).
    pub fn with_memory<B: Backend>(
        options: ClientOptions,
        mem: Arc<VmmMemory<B>>,
    ) -> Result<Arc<Client>> {
        let backend = mem.backend().clone();
        let mem: Arc<dyn DeviceMemory> = mem;
        let info = backend.info();
        let platform_version = format!(
            "xla-vmm {} ({} backend, {})",
            env!("CARGO_PKG_VERSION"),
            info.backend,
            info.name
        );
        let devices = vec![Device::create(0, mem)];
        let device_ptrs = devices.iter().map(|d| CPtr(d.c_ptr())).collect();
        let memory_ptrs = devices
            .iter()
            .flat_map(|d| d.memories.get().into_iter().flatten())
            .map(|m| CPtr(m.c_ptr()))
            .collect();
        tracing::info!(backend = info.backend, device = %info.name, "xla-vmm client created");
        Ok(Arc::new(Client {
            options,
            vendor: Mutex::new(None),
            platform_version,
            vendor_platform_version: OnceLock::new(),
            devices,
            device_ptrs,
            memory_ptrs,
        }))
    }

    pub fn new(options: ClientOptions) -> Result<Arc<Client>> {
        match options.backend {
            BackendKind::Host => {
                let backend = Arc::new(HostBackend::new(HostConfig::default())?);
                Self::with_backend(options, backend)
            }
            BackendKind::Cuda => new_cuda(options),
        }
    }

    pub fn device(&self, ptr: *mut PJRT_Device) -> Result<Arc<Device>> {
        let d = Device::from_c(ptr)?;
        if !self.devices.iter().any(|x| Arc::ptr_eq(x, &d)) {
            return Err(Error::invalid("the device belongs to another client"));
        }
        Ok(d)
    }

    /// The vendor compiler client (located, loaded and created on first use).
    pub fn vendor(&self) -> Result<Arc<VendorClient>> {
        let mut slot = self.vendor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = slot.as_ref() {
            return Ok(v.clone());
        }
        let path = vendor_locate::locate(self.options.vendor_plugin_path.as_deref())?;
        let plugin = VendorPlugin::load(&path)?;
        let client = Arc::new(VendorClient::create(plugin)?);
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

    /// Destroy: wait for the device's queued work, stop the completion
    /// thread (its pending events complete first), unregister the devices.
    fn teardown(&self) {
        for d in &self.devices {
            d.mem.shutdown();
            d.unregister();
        }
    }
}

#[cfg(feature = "cuda")]
fn new_cuda(options: ClientOptions) -> Result<Arc<Client>> {
    use xla_vmm_device::blas::GemmEngine;
    use xla_vmm_device::cuda::{blaslt::CudaGemm, CudaBackend};
    let backend = Arc::new(CudaBackend::new(0).map_err(|e| {
        Error::from(e).context("creating the CUDA backend (set backend=host to run without a GPU)")
    })?);
    // cuBLASLt is needed only by programs with GEMM thunks; without it those
    // fail to load with a clear error, everything else works.
    let gemm: Option<Arc<dyn GemmEngine<CudaBackend>>> = match CudaGemm::new(&backend) {
        Ok(g) => Some(Arc::new(g)),
        Err(e) => {
            tracing::warn!("cuBLASLt not available: {e}");
            None
        }
    };
    let mem = VmmMemory::with_threshold(backend, options.tmp_copy_threshold)?.with_gemm(gemm);
    let client = Client::with_memory(options, Arc::new(mem))?;
    // Create the vendor compiler now: PJRT_Plugin_Attributes (called right
    // after this) reports its versions, and the platform version is its
    // (JAX reads CUDA versions from it). Without it buffers still work;
    // compiling reports why there is none.
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

#[cfg(not(feature = "cuda"))]
fn new_cuda(_options: ClientOptions) -> Result<Arc<Client>> {
    Err(Error::unimplemented(
        "this build of the xla-vmm plugin has no CUDA backend (feature `cuda`)",
    ))
}

/// Register a client and return its C handle.
pub fn into_c(client: Arc<Client>) -> *mut PJRT_Client {
    client.into_c()
}

// ---- entries ----------------------------------------------------------------

pub fn create(a: &mut PJRT_Client_Create_Args) -> Result<()> {
    let items = cabi::read_named_values(a.create_options, a.num_options)?;
    let options = ClientOptions::parse(&items)?;
    a.client = Client::new(options)?.into_c();
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
    Client::from_c(a.client)?;
    a.process_index = 0;
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

pub fn addressable_devices(a: &mut PJRT_Client_AddressableDevices_Args) -> Result<()> {
    let c = Client::from_c(a.client)?;
    a.addressable_devices = c.device_ptrs.as_ptr().cast();
    a.num_addressable_devices = c.device_ptrs.len();
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
        .devices
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
    let n = (a.num_replicas.max(0) as usize) * (a.num_partitions.max(0) as usize);
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
    cabi::write_slice(a.default_assignment, &ids, "default_assignment")?;
    Ok(())
}

/// The one memory of `device` (for buffers placed by memory).
pub fn memory_device(client: &Client, memory: *mut PJRT_Memory) -> Result<Arc<Device>> {
    let m = Memory::from_c(memory)?;
    client
        .devices
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

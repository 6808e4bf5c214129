//! Devices, device descriptions and memories (`PJRT_Device*`,
//! `PJRT_DeviceDescription*`, `PJRT_Memory*`).
//!
//! A client owns its devices and memories: they are registered when the
//! client is created and unregistered when it is destroyed. Buffers keep
//! their device alive (an `Arc`) so a buffer outliving its client still
//! frees its memory correctly.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{CPtr, NamedValues, Value};
use crate::cabi::error::{Error, Result};
use crate::cabi::handles::{Handle, Registry};
pub use crate::cabi::memory_kind::{DEVICE_MEMORY_KIND, PINNED_HOST_MEMORY_KIND};
use crate::objects::worker::Worker;
use crate::runtime::context::DeviceContext;

pub struct DeviceDescription {
    pub id: i32,
    pub process_index: i32,
    pub kind: String,
    pub debug_string: String,
    pub to_string: String,
    pub attributes: NamedValues,
}

/// Where a device is: its global id, its index among its process's
/// devices, its process, and whether this process can use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub id: i32,
    pub local_hardware_id: i32,
    pub process_index: i32,
    pub addressable: bool,
}

pub struct Device {
    pub description: Arc<DeviceDescription>,
    pub local_hardware_id: i32,
    /// False for the devices of other processes (their `mem` is a
    /// `RemoteDevice` that refuses every operation).
    pub addressable: bool,
    pub mem: Arc<dyn DeviceContext>,
    /// Set once, right after the memories are created.
    pub memories: OnceLock<Vec<Arc<Memory>>>,
    /// Enqueues this device's steps of multi-device executions.
    pub worker: Worker,
    memory_ptrs: OnceLock<Vec<CPtr<PJRT_Memory>>>,
    /// The programs loaded on this device (those alive): the heaviest one
    /// has the others give back what they hold between runs.
    pub(crate) programs: Mutex<Vec<Weak<crate::objects::executable::DeviceProgram>>>,
}

/// `#[repr(C)]`: jaxlib reads `PJRT_Memory::vtable` (first field; null = none).
#[repr(C)]
pub struct Memory {
    vtable: usize,
    pub id: i32,
    pub kind: String,
    pub kind_id: i32,
    pub debug_string: String,
    pub to_string: String,
    devices: Vec<CPtr<PJRT_Device>>,
}

impl Memory {
    /// The first device that can address this memory (its owner).
    pub fn first_device(&self) -> Option<*mut PJRT_Device> {
        self.devices.first().map(|d| d.0)
    }
}

static DESCRIPTIONS: Registry<DeviceDescription> = Registry::new();
static DEVICES: Registry<Device> = Registry::new();
static MEMORIES: Registry<Memory> = Registry::new();

impl Handle for DeviceDescription {
    type C = PJRT_DeviceDescription;
    const KIND: &'static str = "PJRT_DeviceDescription";
    fn registry() -> &'static Registry<Self> {
        &DESCRIPTIONS
    }
}
impl Handle for Device {
    type C = PJRT_Device;
    const KIND: &'static str = "PJRT_Device";
    fn registry() -> &'static Registry<Self> {
        &DEVICES
    }
}
impl Handle for Memory {
    type C = PJRT_Memory;
    const KIND: &'static str = "PJRT_Memory";
    fn registry() -> &'static Registry<Self> {
        &MEMORIES
    }
}

/// Ids of the pinned host memories: apart from the device memories' (which
/// are the device ids).
const PINNED_HOST_MEMORY_ID_BASE: i32 = 1 << 16;

impl Device {
    /// Create and register device `id` (process 0, addressable, its local
    /// hardware id the backend's ordinal) with its one memory space.
    pub fn create(id: i32, mem: Arc<dyn DeviceContext>) -> Arc<Device> {
        let local_hardware_id = mem.info().ordinal as i32;
        Self::create_at(
            Place {
                id,
                local_hardware_id,
                process_index: 0,
                addressable: true,
            },
            mem,
        )
    }

    /// Create and register the device at `place` with its one memory space.
    pub fn create_at(place: Place, mem: Arc<dyn DeviceContext>) -> Arc<Device> {
        let id = place.id;
        let info = mem.info().clone();
        let (cc_major, cc_minor) = info.compute_capability;
        let kind = if info.name.is_empty() {
            format!("xla-vmm {}", info.backend)
        } else {
            info.name.clone()
        };
        let description = Arc::new(DeviceDescription {
            id,
            process_index: place.process_index,
            // As the vendor GPU plugin names its devices (str(device) in JAX).
            debug_string: format!("cuda:{id}"),
            to_string: format!("CudaDevice(id={id})"),
            kind,
            attributes: NamedValues::new(vec![
                (
                    "compute_capability",
                    Value::Str(format!("{cc_major}.{cc_minor}")),
                ),
                ("core_count", Value::Int(info.multiprocessor_count as i64)),
                (
                    "device_vendor",
                    Value::Str(match info.backend {
                        "cuda" => "NVIDIA Corporation".into(),
                        "hip" => "Advanced Micro Devices, Inc".into(),
                        other => format!("xla-vmm {other}"),
                    }),
                ),
                ("xla_vmm_backend", Value::Str(info.backend.into())),
            ]),
        });
        description.clone().into_c();
        let device = Arc::new(Device {
            description,
            local_hardware_id: place.local_hardware_id,
            addressable: place.addressable,
            mem,
            memories: OnceLock::new(),
            memory_ptrs: OnceLock::new(),
            worker: Worker::default(),
            programs: Mutex::new(Vec::new()),
        });
        let device_ptr = device.clone().into_c();
        let memory = Arc::new(Memory {
            vtable: 0,
            id,
            kind: DEVICE_MEMORY_KIND.into(),
            kind_id: 0,
            debug_string: format!("xla-vmm device memory of device {id}"),
            to_string: format!("MEMORY_SPACE_{id}"),
            devices: vec![CPtr(device_ptr)],
        });
        let host_id = PINNED_HOST_MEMORY_ID_BASE + id;
        let pinned = Arc::new(Memory {
            vtable: 0,
            id: host_id,
            kind: PINNED_HOST_MEMORY_KIND.into(),
            kind_id: 1,
            debug_string: format!("xla-vmm pinned host memory of device {id}"),
            to_string: format!("PINNED_HOST_MEMORY_SPACE_{host_id}"),
            devices: vec![CPtr(device_ptr)],
        });
        let ptrs = vec![CPtr(memory.clone().into_c()), CPtr(pinned.clone().into_c())];
        // The device's memory first: it is the default.
        let _ = device.memories.set(vec![memory, pinned]);
        let _ = device.memory_ptrs.set(ptrs);
        device
    }

    pub fn id(&self) -> i32 {
        self.description.id
    }

    /// This device's memory of `kind` ("device" or "pinned_host").
    pub fn memory(&self, kind: &str) -> Result<Arc<Memory>> {
        self.memories
            .get()
            .and_then(|m| m.iter().find(|m| m.kind == kind).cloned())
            .ok_or_else(|| Error::internal(format!("device {} has no {kind} memory", self.id())))
    }

    pub fn default_memory(&self) -> Result<Arc<Memory>> {
        self.memories
            .get()
            .and_then(|m| m.first().cloned())
            .ok_or_else(|| Error::internal("device has no memory space"))
    }

    /// Unregister the device, its description and its memories.
    pub fn unregister(self: &Arc<Self>) {
        let _ = Device::release(self.c_ptr());
        let _ = DeviceDescription::release(self.description.c_ptr());
        for m in self.memories.get().into_iter().flatten() {
            let _ = Memory::release(m.c_ptr());
        }
    }
}

fn out_str(s: &str) -> (*const std::ffi::c_char, usize) {
    (s.as_ptr().cast(), s.len())
}

// ---- device description --------------------------------------------------

pub fn desc_id(a: &mut PJRT_DeviceDescription_Id_Args) -> Result<()> {
    a.id = DeviceDescription::from_c(a.device_description)?.id;
    Ok(())
}
pub fn desc_process_index(a: &mut PJRT_DeviceDescription_ProcessIndex_Args) -> Result<()> {
    a.process_index = DeviceDescription::from_c(a.device_description)?.process_index;
    Ok(())
}
pub fn desc_attributes(a: &mut PJRT_DeviceDescription_Attributes_Args) -> Result<()> {
    let d = DeviceDescription::from_c(a.device_description)?;
    a.attributes = d.attributes.as_ptr();
    a.num_attributes = d.attributes.len();
    Ok(())
}
pub fn desc_kind(a: &mut PJRT_DeviceDescription_Kind_Args) -> Result<()> {
    let d = DeviceDescription::from_c(a.device_description)?;
    (a.device_kind, a.device_kind_size) = out_str(&d.kind);
    Ok(())
}
pub fn desc_debug_string(a: &mut PJRT_DeviceDescription_DebugString_Args) -> Result<()> {
    let d = DeviceDescription::from_c(a.device_description)?;
    (a.debug_string, a.debug_string_size) = out_str(&d.debug_string);
    Ok(())
}
pub fn desc_to_string(a: &mut PJRT_DeviceDescription_ToString_Args) -> Result<()> {
    let d = DeviceDescription::from_c(a.device_description)?;
    (a.to_string, a.to_string_size) = out_str(&d.to_string);
    Ok(())
}

// ---- device -----------------------------------------------------------------

/// Tracking events are a profiling aid; we hand out none (null is allowed,
/// and jaxlib treats an error here as fatal).
pub fn create_async_tracking_event(
    a: &mut PJRT_Device_CreateAsyncTrackingEvent_Args,
) -> Result<()> {
    Device::from_c(a.device)?;
    a.event = std::ptr::null_mut();
    Ok(())
}

pub fn destroy_async_tracking_event(_a: &mut PJRT_AsyncTrackingEvent_Destroy_Args) -> Result<()> {
    Ok(())
}

extern "C" fn no_device_attributes(_: *mut PJRT_Device_Attributes) {}

/// jaxlib (API >= 0.92) calls this at client creation whenever the slot is
/// set and treats an error as fatal: it must work. Same attributes as the
/// description; they live as long as the device.
pub fn get_attributes(a: &mut PJRT_Device_GetAttributes_Args) -> Result<()> {
    let d = Device::from_c(a.device)?;
    a.attributes = d.description.attributes.as_ptr();
    a.num_attributes = d.description.attributes.len();
    a.device_attributes = std::ptr::null_mut();
    a.attributes_deleter = Some(no_device_attributes);
    Ok(())
}

pub fn get_description(a: &mut PJRT_Device_GetDescription_Args) -> Result<()> {
    a.device_description = Device::from_c(a.device)?.description.c_ptr();
    Ok(())
}
pub fn is_addressable(a: &mut PJRT_Device_IsAddressable_Args) -> Result<()> {
    a.is_addressable = Device::from_c(a.device)?.addressable;
    Ok(())
}
pub fn local_hardware_id(a: &mut PJRT_Device_LocalHardwareId_Args) -> Result<()> {
    a.local_hardware_id = Device::from_c(a.device)?.local_hardware_id;
    Ok(())
}
pub fn addressable_memories(a: &mut PJRT_Device_AddressableMemories_Args) -> Result<()> {
    let d = Device::from_c(a.device)?;
    let ptrs = d.memory_ptrs.get().map(|v| v.as_slice()).unwrap_or(&[]);
    a.memories = ptrs.as_ptr().cast();
    a.num_memories = ptrs.len();
    Ok(())
}
pub fn default_memory(a: &mut PJRT_Device_DefaultMemory_Args) -> Result<()> {
    a.memory = Device::from_c(a.device)?.default_memory()?.c_ptr();
    Ok(())
}
pub fn memory_stats(a: &mut PJRT_Device_MemoryStats_Args) -> Result<()> {
    let d = Device::from_c(a.device)?;
    let s = d.mem.stats();
    // Every output field is written: callers do not zero the struct.
    a.bytes_in_use = s.bytes_in_use as i64;
    a.peak_bytes_in_use = s.bytes_in_use_peak as i64;
    a.peak_bytes_in_use_is_set = true;
    a.num_allocs = s.buffers_live as i64;
    a.num_allocs_is_set = true;
    a.largest_alloc_size = 0;
    a.largest_alloc_size_is_set = false;
    a.bytes_reserved = s.bytes_physical as i64;
    a.bytes_reserved_is_set = true;
    a.peak_bytes_reserved = s.bytes_physical_peak as i64;
    a.peak_bytes_reserved_is_set = true;
    (a.bytes_limit, a.bytes_limit_is_set) = match d.mem.mem_info() {
        Ok((_, total)) => (total as i64, true),
        Err(_) => (0, false),
    };
    a.bytes_reservable_limit = 0;
    a.bytes_reservable_limit_is_set = false;
    a.largest_free_block_bytes = 0;
    a.largest_free_block_bytes_is_set = false;
    a.pool_bytes = 0;
    a.pool_bytes_is_set = false;
    a.peak_pool_bytes = 0;
    a.peak_pool_bytes_is_set = false;
    a.peak_allocated_bytes = 0;
    a.peak_allocated_bytes_is_set = false;
    Ok(())
}

// ---- memory -----------------------------------------------------------------

pub fn memory_id(a: &mut PJRT_Memory_Id_Args) -> Result<()> {
    a.id = Memory::from_c(a.memory)?.id;
    Ok(())
}
pub fn memory_kind(a: &mut PJRT_Memory_Kind_Args) -> Result<()> {
    let m = Memory::from_c(a.memory)?;
    (a.kind, a.kind_size) = out_str(&m.kind);
    Ok(())
}
pub fn memory_kind_id(a: &mut PJRT_Memory_Kind_Id_Args) -> Result<()> {
    a.kind_id = Memory::from_c(a.memory)?.kind_id;
    Ok(())
}
pub fn memory_debug_string(a: &mut PJRT_Memory_DebugString_Args) -> Result<()> {
    let m = Memory::from_c(a.memory)?;
    (a.debug_string, a.debug_string_size) = out_str(&m.debug_string);
    Ok(())
}
pub fn memory_to_string(a: &mut PJRT_Memory_ToString_Args) -> Result<()> {
    let m = Memory::from_c(a.memory)?;
    (a.to_string, a.to_string_size) = out_str(&m.to_string);
    Ok(())
}
pub fn memory_addressable_by_devices(a: &mut PJRT_Memory_AddressableByDevices_Args) -> Result<()> {
    let m = Memory::from_c(a.memory)?;
    a.devices = m.devices.as_ptr().cast();
    a.num_devices = m.devices.len();
    Ok(())
}

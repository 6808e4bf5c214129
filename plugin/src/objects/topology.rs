//! The client's topology (`PJRT_Client_TopologyDescription`,
//! `PJRT_TopologyDescription_*`): platform, version and the descriptions of
//! every device of the job, with a fingerprint JAX's compilation cache puts
//! in its keys (`get_topology_for_devices(..).fingerprint()`).
//!
//! The client owns its topology (the C API's callers never destroy it): it
//! is registered when the client is created and unregistered with it.

use std::sync::Arc;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{CPtr, NamedValues, Value};
use crate::cabi::error::Result;
use crate::cabi::handles::{Handle, Registry};
use crate::objects::device::Device;

pub struct Topology {
    platform_name: &'static str,
    platform_version: String,
    descriptions: Vec<CPtr<PJRT_DeviceDescription>>,
    attributes: NamedValues,
    fingerprint: u64,
}

static TOPOLOGIES: Registry<Topology> = Registry::new();

impl Handle for Topology {
    type C = PJRT_TopologyDescription;
    const KIND: &'static str = "PJRT_TopologyDescription";
    fn registry() -> &'static Registry<Self> {
        &TOPOLOGIES
    }
}

/// FNV-1a: stable across processes and builds (the fingerprint keys an
/// on-disk cache), unlike std's hasher.
fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl Topology {
    /// The topology of `devices` (every device of the job) on platform
    /// `platform_name`, registered.
    pub fn register(
        platform_name: &'static str,
        platform_version: &str,
        devices: &[Arc<Device>],
    ) -> Arc<Topology> {
        let mut h = fnv1a(0xcbf2_9ce4_8422_2325, platform_name.as_bytes());
        h = fnv1a(h, platform_version.as_bytes());
        let processes = devices
            .iter()
            .map(|d| d.description.process_index)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        for d in devices {
            let desc = &d.description;
            h = fnv1a(h, desc.kind.as_bytes());
            h = fnv1a(h, &desc.id.to_le_bytes());
            h = fnv1a(h, &desc.process_index.to_le_bytes());
        }
        let t = Arc::new(Topology {
            platform_name,
            platform_version: platform_version.to_owned(),
            descriptions: devices
                .iter()
                .map(|d| CPtr(d.description.c_ptr()))
                .collect(),
            attributes: NamedValues::new(vec![
                ("num_devices", Value::Int(devices.len() as i64)),
                ("num_processes", Value::Int(processes as i64)),
            ]),
            fingerprint: h,
        });
        t.clone().into_c();
        t
    }

    pub fn unregister(self: &Arc<Self>) {
        let _ = Topology::release(self.c_ptr());
    }
}

pub fn platform_name(a: &mut PJRT_TopologyDescription_PlatformName_Args) -> Result<()> {
    let t = Topology::from_c(a.topology)?;
    a.platform_name = t.platform_name.as_ptr().cast();
    a.platform_name_size = t.platform_name.len();
    Ok(())
}

pub fn platform_version(a: &mut PJRT_TopologyDescription_PlatformVersion_Args) -> Result<()> {
    let t = Topology::from_c(a.topology)?;
    // The string lives as long as the topology (the client's).
    a.platform_version = t.platform_version.as_ptr().cast();
    a.platform_version_size = t.platform_version.len();
    Ok(())
}

pub fn device_descriptions(
    a: &mut PJRT_TopologyDescription_GetDeviceDescriptions_Args,
) -> Result<()> {
    let t = Topology::from_c(a.topology)?;
    a.descriptions = t.descriptions.as_ptr().cast();
    a.num_descriptions = t.descriptions.len();
    Ok(())
}

pub fn attributes(a: &mut PJRT_TopologyDescription_Attributes_Args) -> Result<()> {
    let t = Topology::from_c(a.topology)?;
    a.attributes = t.attributes.as_ptr();
    a.num_attributes = t.attributes.len();
    Ok(())
}

pub fn fingerprint(a: &mut PJRT_TopologyDescription_Fingerprint_Args) -> Result<()> {
    a.fingerprint = Topology::from_c(a.topology)?.fingerprint;
    Ok(())
}

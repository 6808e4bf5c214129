//! Static device facts read once at backend creation ([`DeviceInfo`]).
//! Mirrors `cuda/info.rs`.

use xla_vmm_ffi::hip::runtime as sys;

use super::result;
use crate::backend::DeviceInfo;
use crate::error::Result;

/// Read the [`DeviceInfo`] of device `ord` (valid, checked by the caller).
pub(super) fn read(ord: i32) -> Result<DeviceInfo> {
    use sys::hipDeviceAttribute_t as A;
    // SAFETY: `ord` is a valid device (checked by the caller).
    let attr = |a: A| unsafe { result::device::attribute(ord, a) };
    // SAFETY: as above.
    let (name, total_memory) =
        unsafe { (result::device::name(ord)?, result::device::total_mem(ord)?) };
    let clock_khz = attr(A::hipDeviceAttributeMemoryClockRate)
        .unwrap_or(0)
        .max(0) as f64;
    let bus_bits = attr(A::hipDeviceAttributeMemoryBusWidth)
        .unwrap_or(0)
        .max(0) as f64;
    let vmm_supported =
        attr(A::hipDeviceAttributeVirtualMemoryManagementSupported).unwrap_or(0) != 0;
    let vmm_granularity = if vmm_supported {
        // SAFETY: HIP is initialized.
        unsafe { result::vmm::granularity(ord)? }
    } else {
        0
    };
    let gcn = attr(A::hipDeviceAttributeGcnArch).unwrap_or(0);
    Ok(DeviceInfo {
        backend: "hip",
        ordinal: ord as usize,
        name,
        compute_capability: (
            attr(A::hipDeviceAttributeComputeCapabilityMajor)?.max(0) as u32,
            attr(A::hipDeviceAttributeComputeCapabilityMinor)?.max(0) as u32,
        ),
        // The ISA name without its feature suffix ("gfx90a"); the numeric
        // attribute ("gfx910" for gfx90a) only when the name is unreadable.
        // SAFETY: `ord` is a valid device.
        arch_name: match unsafe { result::device::gcn_arch_name(ord) } {
            Some(n) => n.split(':').next().unwrap_or_default().to_string(),
            None if gcn > 0 => format!("gfx{gcn}"),
            None => String::new(),
        },
        multiprocessor_count: attr(A::hipDeviceAttributeMultiprocessorCount)?.max(0) as u32,
        total_memory,
        vmm_granularity,
        memory_bandwidth: 2.0 * clock_khz * 1000.0 * bus_bits / 8.0,
        vmm_supported,
        conditional_nodes: false,
        case_nodes: false,
        // HIP 5's headers have no hipEventRecordWithFlags: graphs untimed.
        graph_event_records: false,
    })
}

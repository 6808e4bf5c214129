//! Static device facts read once at backend creation ([`DeviceInfo`]).

use std::sync::Arc;

use cudarc::driver::CudaContext;
use xla_vmm_ffi::cuda::driver as sys;

use super::{result, result::from_cudarc, symbols};
use crate::backend::DeviceInfo;
use crate::error::Result;

/// Read the [`DeviceInfo`] of `ctx`'s device.
pub(super) fn read(
    ctx: &Arc<CudaContext>,
    ordinal: i32,
    syms: &symbols::Symbols,
) -> Result<DeviceInfo> {
    use sys::CUdevice_attribute as A;
    let dev = ctx.cu_device();
    // SAFETY: `dev` is the valid device behind `ctx`.
    let attr = |a: A| unsafe { result::device::attribute(dev, a) };
    let name = ctx.name().map_err(|e| from_cudarc("cuDeviceGetName", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| from_cudarc("cuDeviceGetAttribute", e))?;
    let total_memory = ctx
        .total_mem()
        .map_err(|e| from_cudarc("cuDeviceTotalMem", e))? as u64;
    // Peak bandwidth: double data rate × clock (kHz) × bus width (bits) / 8.
    let clock_khz = attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
        .unwrap_or(0)
        .max(0) as f64;
    let bus_bits = attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
        .unwrap_or(0)
        .max(0) as f64;
    let vmm_supported =
        attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).unwrap_or(0) != 0;
    let vmm_granularity = if vmm_supported {
        // SAFETY: the driver is initialized (the context exists).
        unsafe { result::vmm::granularity(ordinal)? }
    } else {
        0
    };
    // SAFETY: the driver is initialized.
    let version = unsafe { result::device::driver_version()? };
    Ok(DeviceInfo {
        backend: "cuda",
        ordinal: ordinal as usize,
        name,
        compute_capability: (major.max(0) as u32, minor.max(0) as u32),
        arch_name: String::new(),
        multiprocessor_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32,
        total_memory,
        vmm_granularity,
        memory_bandwidth: 2.0 * clock_khz * 1000.0 * bus_bits / 8.0,
        vmm_supported,
        // WHILE nodes via cuGraphAddNode: CUDA 12.4+.
        conditional_nodes: syms.conditional && version >= 12040,
        // IF nodes per branch (`conditional.rs`), the same driver calls: the
        // conformance check `graph_conditional_case` passed on an H100
        // (driver 580, CUDA 13.0).
        case_nodes: syms.conditional && version >= 12040,
        graph_event_records: true,
    })
}

//! The executable queries JAX makes (`PJRT_Executable_*` on a view,
//! `PJRT_LoadedExecutable_*` besides `Execute`): answered from what
//! `executable.rs` computed at load time; all strings and arrays handed out
//! live as long as the executable.

use std::sync::Arc;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller;
use crate::cabi::error::{Error, Result};
use crate::cabi::handles::Handle;
use crate::objects::executable::{loaded, view, Blob, ExecutableView, LoadedExecutable};

// ---- loaded executable ----------------------------------------------------

pub fn loaded_destroy(a: &mut PJRT_LoadedExecutable_Destroy_Args) -> Result<()> {
    LoadedExecutable::release(a.executable)?;
    Ok(())
}

pub fn loaded_get_executable(a: &mut PJRT_LoadedExecutable_GetExecutable_Args) -> Result<()> {
    let e = loaded(a.loaded_executable)?;
    a.executable = Arc::new(ExecutableView(e)).into_c();
    Ok(())
}

pub fn loaded_addressable_devices(
    a: &mut PJRT_LoadedExecutable_AddressableDevices_Args,
) -> Result<()> {
    let e = loaded(a.executable)?;
    a.addressable_devices = e.device_ptrs.as_ptr().cast();
    a.num_addressable_devices = e.device_ptrs.len();
    Ok(())
}

pub fn loaded_delete(a: &mut PJRT_LoadedExecutable_Delete_Args) -> Result<()> {
    loaded(a.executable)?.unload();
    Ok(())
}

pub fn loaded_is_deleted(a: &mut PJRT_LoadedExecutable_IsDeleted_Args) -> Result<()> {
    a.is_deleted = loaded(a.executable)?.is_unloaded();
    Ok(())
}

pub fn loaded_fingerprint(a: &mut PJRT_LoadedExecutable_Fingerprint_Args) -> Result<()> {
    let e = loaded(a.executable)?;
    a.executable_fingerprint = e.fingerprint.as_ptr().cast();
    a.executable_fingerprint_size = e.fingerprint.len();
    Ok(())
}

extern "C" fn no_device_assignment(_: *mut PJRT_DeviceAssignmentSerialized) {}

pub fn loaded_device_assignment(
    a: &mut PJRT_LoadedExecutable_GetDeviceAssignment_Args,
) -> Result<()> {
    let e = loaded(a.executable)?;
    // Bytes owned by the executable; the deleter has nothing to free.
    a.serialized_bytes = e.device_assignment.as_ptr().cast();
    a.serialized_bytes_size = e.device_assignment.len();
    a.serialized_device_assignment = std::ptr::null_mut();
    a.serialized_device_assignment_deleter = Some(no_device_assignment);
    Ok(())
}

pub fn loaded_logical_ids(
    a: &mut PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args,
) -> Result<()> {
    let e = loaded(a.executable)?;
    // Owned by the executable, in `AddressableDevices` order.
    a.addressable_device_logical_ids = e.logical_ids.as_ptr().cast_mut();
    a.num_addressable_device_logical_ids = e.logical_ids.len();
    Ok(())
}

// ---- executable view ------------------------------------------------------

pub fn destroy(a: &mut PJRT_Executable_Destroy_Args) -> Result<()> {
    ExecutableView::release(a.executable)?;
    Ok(())
}

pub fn name(a: &mut PJRT_Executable_Name_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.executable_name = e.name.as_ptr().cast();
    a.executable_name_size = e.name.len();
    Ok(())
}

pub fn num_replicas(a: &mut PJRT_Executable_NumReplicas_Args) -> Result<()> {
    a.num_replicas = view(a.executable)?.assignment.replicas;
    Ok(())
}

pub fn num_partitions(a: &mut PJRT_Executable_NumPartitions_Args) -> Result<()> {
    a.num_partitions = view(a.executable)?.assignment.partitions;
    Ok(())
}

pub fn num_outputs(a: &mut PJRT_Executable_NumOutputs_Args) -> Result<()> {
    a.num_outputs = view(a.executable)?.outputs.len();
    Ok(())
}

pub fn code_size(a: &mut PJRT_Executable_SizeOfGeneratedCodeInBytes_Args) -> Result<()> {
    a.size_in_bytes = view(a.executable)?.code_size;
    Ok(())
}

pub fn output_element_types(a: &mut PJRT_Executable_OutputElementTypes_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.output_types = e.queries.out_types.as_ptr().cast_mut();
    a.num_output_types = e.queries.out_types.len();
    Ok(())
}

pub fn output_dimensions(a: &mut PJRT_Executable_OutputDimensions_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.num_outputs = e.outputs.len();
    a.dims = e.queries.out_dims.as_ptr();
    a.dim_sizes = e.queries.out_dim_sizes.as_ptr();
    Ok(())
}

pub fn output_memory_kinds(a: &mut PJRT_Executable_OutputMemoryKinds_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.num_outputs = e.outputs.len();
    a.memory_kinds = e.queries.out_kinds.as_ptr().cast();
    a.memory_kind_sizes = e.queries.out_kind_sizes.as_ptr();
    Ok(())
}

pub fn parameter_memory_kinds(a: &mut PJRT_Executable_ParameterMemoryKinds_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.num_parameters = e.params.len();
    a.memory_kinds = e.queries.param_kinds.as_ptr().cast();
    a.memory_kind_sizes = e.queries.param_kind_sizes.as_ptr();
    Ok(())
}

pub fn fingerprint(a: &mut PJRT_Executable_Fingerprint_Args) -> Result<()> {
    let e = view(a.executable)?;
    a.executable_fingerprint = e.fingerprint.as_ptr().cast();
    a.executable_fingerprint_size = e.fingerprint.len();
    Ok(())
}

pub fn cost_analysis(a: &mut PJRT_Executable_GetCostAnalysis_Args) -> Result<()> {
    let e = view(a.executable)?;
    let cost = e.cost.as_ref().ok_or_else(|| {
        Error::unimplemented("cost analysis is only known for executables the vendor compiler saw")
    })?;
    a.properties = cost.as_ptr();
    a.num_properties = cost.len();
    Ok(())
}

pub fn optimized_program(a: &mut PJRT_Executable_OptimizedProgram_Args) -> Result<()> {
    let e = view(a.executable)?;
    let (code, format) = e.optimized.as_ref().ok_or_else(|| {
        Error::unimplemented(
            "the optimized program is only kept for executables compiled in this process",
        )
    })?;
    let p = caller::program_mut(a.program)?;
    p.format = format.as_ptr().cast();
    p.format_size = format.len();
    if p.code.is_null() {
        p.code_size = code.len();
        return Ok(());
    }
    if p.code_size < code.len() {
        return Err(Error::invalid(format!(
            "program code buffer holds {} bytes, {} needed",
            p.code_size,
            code.len()
        )));
    }
    caller::write_slice(p.code.cast::<u8>(), code, "program code")?;
    p.code_size = code.len();
    Ok(())
}

extern "C" fn free_blob(blob: *mut PJRT_SerializedExecutable) {
    let _ = std::panic::catch_unwind(|| Blob::release(blob));
}

pub fn serialize(a: &mut PJRT_Executable_Serialize_Args) -> Result<()> {
    let e = view(a.executable.cast_mut())?;
    let blob = Arc::new(Blob(e.serialized.clone()));
    a.serialized_bytes = blob.0.as_ptr().cast();
    a.serialized_bytes_size = blob.0.len();
    a.serialized_executable = blob.into_c();
    a.serialized_executable_deleter = Some(free_blob);
    Ok(())
}

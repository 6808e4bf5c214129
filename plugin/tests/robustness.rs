//! Robustness: every slot of the table called with a zeroed args struct
//! (null handles, zero lengths) returns an error or succeeds; nothing
//! crashes, and every error carries the entry's name. Generated from the
//! table's slot list (one line per slot).
#![allow(unsafe_code)]

mod common;

use common::*;
use xla_vmm_plugin::pjrt::*;

/// (name, error) for a zeroed call of `slot`.
macro_rules! zeroed_call {
    ($slot:ident, $args:ident) => {{
        let (err, _) = call!($slot, $args, |a| {});
        (stringify!($slot), err)
    }};
}

#[test]
fn every_entry_survives_zeroed_args() {
    let mut results = Vec::new();
    results.push(zeroed_call!(PJRT_Error_GetCode, PJRT_Error_GetCode_Args));
    results.push(zeroed_call!(
        PJRT_Plugin_Initialize,
        PJRT_Plugin_Initialize_Args
    ));
    results.push(zeroed_call!(
        PJRT_Plugin_Attributes,
        PJRT_Plugin_Attributes_Args
    ));
    results.push(zeroed_call!(PJRT_Event_Destroy, PJRT_Event_Destroy_Args));
    results.push(zeroed_call!(PJRT_Event_IsReady, PJRT_Event_IsReady_Args));
    results.push(zeroed_call!(PJRT_Event_Error, PJRT_Event_Error_Args));
    results.push(zeroed_call!(PJRT_Event_Await, PJRT_Event_Await_Args));
    results.push(zeroed_call!(PJRT_Event_OnReady, PJRT_Event_OnReady_Args));
    results.push(zeroed_call!(PJRT_Client_Create, PJRT_Client_Create_Args));
    results.push(zeroed_call!(PJRT_Client_Destroy, PJRT_Client_Destroy_Args));
    results.push(zeroed_call!(
        PJRT_Client_PlatformName,
        PJRT_Client_PlatformName_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_ProcessIndex,
        PJRT_Client_ProcessIndex_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_PlatformVersion,
        PJRT_Client_PlatformVersion_Args
    ));
    results.push(zeroed_call!(PJRT_Client_Devices, PJRT_Client_Devices_Args));
    results.push(zeroed_call!(
        PJRT_Client_AddressableDevices,
        PJRT_Client_AddressableDevices_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_LookupDevice,
        PJRT_Client_LookupDevice_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_LookupAddressableDevice,
        PJRT_Client_LookupAddressableDevice_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_AddressableMemories,
        PJRT_Client_AddressableMemories_Args
    ));
    results.push(zeroed_call!(PJRT_Client_Compile, PJRT_Client_Compile_Args));
    results.push(zeroed_call!(
        PJRT_Client_DefaultDeviceAssignment,
        PJRT_Client_DefaultDeviceAssignment_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_BufferFromHostBuffer,
        PJRT_Client_BufferFromHostBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_DeviceDescription_Id,
        PJRT_DeviceDescription_Id_Args
    ));
    results.push(zeroed_call!(
        PJRT_DeviceDescription_ProcessIndex,
        PJRT_DeviceDescription_ProcessIndex_Args
    ));
    results.push(zeroed_call!(
        PJRT_DeviceDescription_Attributes,
        PJRT_DeviceDescription_Attributes_Args
    ));
    results.push(zeroed_call!(
        PJRT_DeviceDescription_Kind,
        PJRT_DeviceDescription_Kind_Args
    ));
    results.push(zeroed_call!(
        PJRT_DeviceDescription_DebugString,
        PJRT_DeviceDescription_DebugString_Args
    ));
    results.push(zeroed_call!(
        PJRT_DeviceDescription_ToString,
        PJRT_DeviceDescription_ToString_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_IsAddressable,
        PJRT_Device_IsAddressable_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_LocalHardwareId,
        PJRT_Device_LocalHardwareId_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_AddressableMemories,
        PJRT_Device_AddressableMemories_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_DefaultMemory,
        PJRT_Device_DefaultMemory_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_MemoryStats,
        PJRT_Device_MemoryStats_Args
    ));
    results.push(zeroed_call!(PJRT_Memory_Id, PJRT_Memory_Id_Args));
    results.push(zeroed_call!(PJRT_Memory_Kind, PJRT_Memory_Kind_Args));
    results.push(zeroed_call!(
        PJRT_Memory_DebugString,
        PJRT_Memory_DebugString_Args
    ));
    results.push(zeroed_call!(
        PJRT_Memory_ToString,
        PJRT_Memory_ToString_Args
    ));
    results.push(zeroed_call!(
        PJRT_Memory_AddressableByDevices,
        PJRT_Memory_AddressableByDevices_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_Destroy,
        PJRT_Executable_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_Name,
        PJRT_Executable_Name_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_NumReplicas,
        PJRT_Executable_NumReplicas_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_NumPartitions,
        PJRT_Executable_NumPartitions_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_NumOutputs,
        PJRT_Executable_NumOutputs_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_SizeOfGeneratedCodeInBytes,
        PJRT_Executable_SizeOfGeneratedCodeInBytes_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_GetCostAnalysis,
        PJRT_Executable_GetCostAnalysis_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_OutputMemoryKinds,
        PJRT_Executable_OutputMemoryKinds_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_OptimizedProgram,
        PJRT_Executable_OptimizedProgram_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_Serialize,
        PJRT_Executable_Serialize_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_Destroy,
        PJRT_LoadedExecutable_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_GetExecutable,
        PJRT_LoadedExecutable_GetExecutable_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_AddressableDevices,
        PJRT_LoadedExecutable_AddressableDevices_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_Delete,
        PJRT_LoadedExecutable_Delete_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_IsDeleted,
        PJRT_LoadedExecutable_IsDeleted_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_Execute,
        PJRT_LoadedExecutable_Execute_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_DeserializeAndLoad,
        PJRT_Executable_DeserializeAndLoad_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_Fingerprint,
        PJRT_LoadedExecutable_Fingerprint_Args
    ));
    results.push(zeroed_call!(PJRT_Buffer_Destroy, PJRT_Buffer_Destroy_Args));
    results.push(zeroed_call!(
        PJRT_Buffer_ElementType,
        PJRT_Buffer_ElementType_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_Dimensions,
        PJRT_Buffer_Dimensions_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_UnpaddedDimensions,
        PJRT_Buffer_UnpaddedDimensions_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_DynamicDimensionIndices,
        PJRT_Buffer_DynamicDimensionIndices_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_GetMemoryLayout,
        PJRT_Buffer_GetMemoryLayout_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_OnDeviceSizeInBytes,
        PJRT_Buffer_OnDeviceSizeInBytes_Args
    ));
    results.push(zeroed_call!(PJRT_Buffer_Device, PJRT_Buffer_Device_Args));
    results.push(zeroed_call!(PJRT_Buffer_Memory, PJRT_Buffer_Memory_Args));
    results.push(zeroed_call!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args));
    results.push(zeroed_call!(
        PJRT_Buffer_IsDeleted,
        PJRT_Buffer_IsDeleted_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_CopyToDevice,
        PJRT_Buffer_CopyToDevice_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_ToHostBuffer,
        PJRT_Buffer_ToHostBuffer_Args
    ));
    results.push(zeroed_call!(PJRT_Buffer_IsOnCpu, PJRT_Buffer_IsOnCpu_Args));
    results.push(zeroed_call!(
        PJRT_Buffer_ReadyEvent,
        PJRT_Buffer_ReadyEvent_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_UnsafePointer,
        PJRT_Buffer_UnsafePointer_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_IncreaseExternalReferenceCount,
        PJRT_Buffer_IncreaseExternalReferenceCount_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_DecreaseExternalReferenceCount,
        PJRT_Buffer_DecreaseExternalReferenceCount_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_OpaqueDeviceMemoryDataPointer,
        PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args
    ));
    results.push(zeroed_call!(
        PJRT_CopyToDeviceStream_Destroy,
        PJRT_CopyToDeviceStream_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_CopyToDeviceStream_AddChunk,
        PJRT_CopyToDeviceStream_AddChunk_Args
    ));
    results.push(zeroed_call!(
        PJRT_CopyToDeviceStream_TotalBytes,
        PJRT_CopyToDeviceStream_TotalBytes_Args
    ));
    results.push(zeroed_call!(
        PJRT_CopyToDeviceStream_GranuleSize,
        PJRT_CopyToDeviceStream_GranuleSize_Args
    ));
    results.push(zeroed_call!(
        PJRT_CopyToDeviceStream_CurrentBytes,
        PJRT_CopyToDeviceStream_CurrentBytes_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_Create,
        PJRT_TopologyDescription_Create_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_Destroy,
        PJRT_TopologyDescription_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_PlatformName,
        PJRT_TopologyDescription_PlatformName_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_PlatformVersion,
        PJRT_TopologyDescription_PlatformVersion_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_GetDeviceDescriptions,
        PJRT_TopologyDescription_GetDeviceDescriptions_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_Serialize,
        PJRT_TopologyDescription_Serialize_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_Attributes,
        PJRT_TopologyDescription_Attributes_Args
    ));
    results.push(zeroed_call!(PJRT_Compile, PJRT_Compile_Args));
    results.push(zeroed_call!(
        PJRT_Executable_OutputElementTypes,
        PJRT_Executable_OutputElementTypes_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_OutputDimensions,
        PJRT_Executable_OutputDimensions_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_CopyToMemory,
        PJRT_Buffer_CopyToMemory_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_CreateViewOfDeviceBuffer,
        PJRT_Client_CreateViewOfDeviceBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_Fingerprint,
        PJRT_Executable_Fingerprint_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_TopologyDescription,
        PJRT_Client_TopologyDescription_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_GetCompiledMemoryStats,
        PJRT_Executable_GetCompiledMemoryStats_Args
    ));
    results.push(zeroed_call!(PJRT_Memory_Kind_Id, PJRT_Memory_Kind_Id_Args));
    results.push(zeroed_call!(
        PJRT_ExecuteContext_Create,
        PJRT_ExecuteContext_Create_Args
    ));
    results.push(zeroed_call!(
        PJRT_ExecuteContext_Destroy,
        PJRT_ExecuteContext_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_CopyRawToHost,
        PJRT_Buffer_CopyRawToHost_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_Destroy,
        PJRT_AsyncHostToDeviceTransferManager_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_TransferData,
        PJRT_AsyncHostToDeviceTransferManager_TransferData_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_CreateBuffersForAsyncHostToDevice,
        PJRT_Client_CreateBuffersForAsyncHostToDevice_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer,
        PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_Device,
        PJRT_AsyncHostToDeviceTransferManager_Device_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_BufferCount,
        PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_BufferSize,
        PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_SetBufferError,
        PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_AddMetadata,
        PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args
    ));
    results.push(zeroed_call!(PJRT_Client_DmaMap, PJRT_Client_DmaMap_Args));
    results.push(zeroed_call!(
        PJRT_Client_DmaUnmap,
        PJRT_Client_DmaUnmap_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_CreateUninitializedBuffer,
        PJRT_Client_CreateUninitializedBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_UpdateGlobalProcessInfo,
        PJRT_Client_UpdateGlobalProcessInfo_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_Deserialize,
        PJRT_TopologyDescription_Deserialize_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_CreateAliasBuffer,
        PJRT_Client_CreateAliasBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_FulfillAliasBuffer,
        PJRT_Client_FulfillAliasBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_GetDeviceAssignment,
        PJRT_LoadedExecutable_GetDeviceAssignment_Args
    ));
    results.push(zeroed_call!(
        PJRT_Client_CreateErrorBuffer,
        PJRT_Client_CreateErrorBuffer_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncHostToDeviceTransferManager_TransferLiteral,
        PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_CopyRawToHostFuture,
        PJRT_Buffer_CopyRawToHostFuture_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_PoisonExecution,
        PJRT_Device_PoisonExecution_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_CreateAsyncTrackingEvent,
        PJRT_Device_CreateAsyncTrackingEvent_Args
    ));
    results.push(zeroed_call!(
        PJRT_AsyncTrackingEvent_Destroy,
        PJRT_AsyncTrackingEvent_Destroy_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_GetCompileOptions,
        PJRT_Executable_GetCompileOptions_Args
    ));
    results.push(zeroed_call!(
        PJRT_Buffer_DonateWithControlDependency,
        PJRT_Buffer_DonateWithControlDependency_Args
    ));
    results.push(zeroed_call!(PJRT_Event_Create, PJRT_Event_Create_Args));
    results.push(zeroed_call!(PJRT_Event_Set, PJRT_Event_Set_Args));
    results.push(zeroed_call!(
        PJRT_Device_GetAttributes,
        PJRT_Device_GetAttributes_Args
    ));
    results.push(zeroed_call!(PJRT_Client_Load, PJRT_Client_Load_Args));
    results.push(zeroed_call!(
        PJRT_LoadedExecutable_AddressableDeviceLogicalIds,
        PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args
    ));
    results.push(zeroed_call!(PJRT_Buffer_Bitcast, PJRT_Buffer_Bitcast_Args));
    results.push(zeroed_call!(
        PJRT_Error_ForEachPayload,
        PJRT_Error_ForEachPayload_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_Fingerprint,
        PJRT_TopologyDescription_Fingerprint_Args
    ));
    results.push(zeroed_call!(
        PJRT_Executable_ParameterMemoryKinds,
        PJRT_Executable_ParameterMemoryKinds_Args
    ));
    results.push(zeroed_call!(
        PJRT_Device_ClearMemoryStats,
        PJRT_Device_ClearMemoryStats_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace,
        PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args
    ));
    results.push(zeroed_call!(
        PJRT_TopologyDescription_GetMemorySpaceKindIds,
        PJRT_TopologyDescription_GetMemorySpaceKindIds_Args
    ));
    assert_eq!(results.len(), xla_vmm_plugin::ENTRIES.len() - 2);
    let mut ok = Vec::new();
    for (name, err) in results {
        match err {
            Some((code, msg)) => {
                assert_ne!(code, PJRT_Error_Code_INTERNAL, "{name}: {msg}");
                assert!(
                    msg.starts_with(name),
                    "{name}: error without the entry name: {msg}"
                );
            }
            None => ok.push(name),
        }
    }
    // Only entries that need no input may succeed on all-zero args.
    for name in &ok {
        assert!(
            [
                "PJRT_Plugin_Initialize",
                "PJRT_Plugin_Attributes",
                "PJRT_Event_Create",
                "PJRT_AsyncTrackingEvent_Destroy",
                // Makes an empty context (never destroyed here: one leaked handle).
                "PJRT_ExecuteContext_Create",
            ]
            .contains(name),
            "{name} succeeded on zeroed args"
        );
    }
}

#[test]
fn void_entries_accept_null_errors() {
    // PJRT_Error_Destroy(null) is allowed; PJRT_Error_Message(null) must not crash.
    let mut d: PJRT_Error_Destroy_Args = unsafe { std::mem::zeroed() };
    d.struct_size = std::mem::size_of::<PJRT_Error_Destroy_Args>();
    unsafe { (api().PJRT_Error_Destroy.unwrap())(&mut d) };
    let mut m: PJRT_Error_Message_Args = unsafe { std::mem::zeroed() };
    m.struct_size = std::mem::size_of::<PJRT_Error_Message_Args>();
    unsafe { (api().PJRT_Error_Message.unwrap())(&mut m) };
    assert!(m.message.is_null());
    unsafe { (api().PJRT_Error_Destroy.unwrap())(std::ptr::null_mut()) };
}

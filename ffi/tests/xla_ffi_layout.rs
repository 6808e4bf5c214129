//! Layout checks of the hand-written XLA FFI 0.4 types (x86-64 / aarch64
//! LP64) against `integration/results/ffi_abi_0.4.md`: each struct's
//! `*_STRUCT_SIZE` (offset of its last counted field plus that field's size)
//! and the offsets a handler reads. The call frame's 168 bytes are what
//! jaxlib 0.11.2's handlers were measured to require.

use std::mem::{offset_of, size_of};
use xla_vmm_ffi::xla_ffi::*;

/// `offsetof(last) + sizeof(last)`.
macro_rules! ss {
    ($t:ty, $f:ident, $fty:ty) => {
        offset_of!($t, $f) + size_of::<$fty>()
    };
}

#[test]
fn version_is_0_4() {
    assert_eq!((XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR), (0, 4));
}

#[test]
fn call_frame_is_168_bytes_up_to_its_attributes() {
    assert_eq!(offset_of!(XLA_FFI_CallFrame, api), 16);
    assert_eq!(offset_of!(XLA_FFI_CallFrame, ctx), 24);
    assert_eq!(offset_of!(XLA_FFI_CallFrame, stage), 32);
    assert_eq!(offset_of!(XLA_FFI_CallFrame, args), 40);
    assert_eq!(offset_of!(XLA_FFI_CallFrame, rets), 80);
    assert_eq!(offset_of!(XLA_FFI_CallFrame, attrs), 120);
    assert_eq!(offset_of!(XLA_FFI_CallFrame, future), 168);
    assert_eq!(
        ss!(XLA_FFI_CallFrame, attrs, XLA_FFI_Attrs),
        XLA_FFI_CallFrame_STRUCT_SIZE
    );
    assert_eq!(size_of::<XLA_FFI_CallFrame>(), 176);
}

#[test]
fn frame_parts_and_values() {
    assert_eq!(ss!(XLA_FFI_Args, args, usize), XLA_FFI_Args_STRUCT_SIZE);
    assert_eq!(ss!(XLA_FFI_Rets, rets, usize), XLA_FFI_Rets_STRUCT_SIZE);
    assert_eq!(ss!(XLA_FFI_Attrs, attrs, usize), XLA_FFI_Attrs_STRUCT_SIZE);
    assert_eq!(offset_of!(XLA_FFI_Attrs, names), 32);
    assert_eq!(offset_of!(XLA_FFI_Buffer, dtype), 16);
    assert_eq!(offset_of!(XLA_FFI_Buffer, data), 24);
    assert_eq!(offset_of!(XLA_FFI_Buffer, rank), 32);
    assert_eq!(ss!(XLA_FFI_Buffer, dims, usize), XLA_FFI_Buffer_STRUCT_SIZE);
    assert_eq!(size_of::<XLA_FFI_ByteSpan>(), 16);
    assert_eq!(size_of::<XLA_FFI_Scalar>(), 16);
    assert_eq!(size_of::<XLA_FFI_Array>(), 24);
    assert_eq!(size_of::<XLA_FFI_TypeId>(), 8);
}

#[test]
fn version_metadata_and_extensions() {
    assert_eq!(
        ss!(XLA_FFI_Api_Version, minor_version, i32),
        XLA_FFI_Api_Version_STRUCT_SIZE
    );
    assert_eq!(
        ss!(XLA_FFI_InternalExtension, next, usize),
        XLA_FFI_InternalExtension_STRUCT_SIZE
    );
    assert_eq!(offset_of!(XLA_FFI_Metadata, api_version), 8);
    assert_eq!(
        ss!(XLA_FFI_Metadata, traits, u32),
        XLA_FFI_Metadata_STRUCT_SIZE
    );
    assert_eq!(offset_of!(XLA_FFI_Metadata, state_type_id), 40);
    assert_eq!(size_of::<XLA_FFI_Metadata>(), 48);
    assert_eq!(
        ss!(XLA_FFI_Metadata_Extension, metadata, usize),
        XLA_FFI_Metadata_Extension_STRUCT_SIZE
    );
    assert_eq!(size_of::<XLA_FFI_Handler_Bundle>(), 40);
}

#[test]
fn function_argument_structs() {
    // (offsetof(last) + sizeof(last), the declared STRUCT_SIZE, the struct).
    let sizes = [
        (
            ss!(XLA_FFI_Error_Create_Args, errc, i32),
            XLA_FFI_Error_Create_Args_STRUCT_SIZE,
            "Error_Create",
        ),
        (
            ss!(XLA_FFI_Error_GetDetails_Args, errc, i32),
            XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE,
            "Error_GetDetails",
        ),
        (
            ss!(XLA_FFI_Error_Destroy_Args, error, usize),
            XLA_FFI_Error_Destroy_Args_STRUCT_SIZE,
            "Error_Destroy",
        ),
        (
            ss!(XLA_FFI_Stream_Get_Args, stream, usize),
            XLA_FFI_Stream_Get_Args_STRUCT_SIZE,
            "Stream_Get",
        ),
        (
            ss!(XLA_FFI_InvokeContext_Get_Args, data, usize),
            XLA_FFI_InvokeContext_Get_Args_STRUCT_SIZE,
            "InvokeContext_Get",
        ),
        (
            ss!(XLA_FFI_State_Args, state, usize),
            XLA_FFI_State_Args_STRUCT_SIZE,
            "State_Set / State_Get",
        ),
        (
            ss!(XLA_FFI_TypeInfo, deleter, usize),
            XLA_FFI_TypeInfo_STRUCT_SIZE,
            "TypeInfo",
        ),
        (
            ss!(XLA_FFI_Type_Register_Args, type_id, usize),
            XLA_FFI_Type_Register_Args_STRUCT_SIZE,
            "Type_Register",
        ),
        (
            ss!(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal, i32),
            XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
            "DeviceOrdinal_Get",
        ),
        (
            ss!(XLA_FFI_DeviceMemory_Allocate_Args, data, usize),
            XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE,
            "DeviceMemory_Allocate",
        ),
        (
            ss!(XLA_FFI_DeviceMemory_Free_Args, data, usize),
            XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE,
            "DeviceMemory_Free",
        ),
        (
            ss!(XLA_FFI_RunId_Get_Args, run_id, i64),
            XLA_FFI_RunId_Get_Args_STRUCT_SIZE,
            "RunId_Get",
        ),
        (
            ss!(XLA_FFI_InvokeContext_FindExtension_Args, extension, usize),
            XLA_FFI_InvokeContext_FindExtension_Args_STRUCT_SIZE,
            "InvokeContext_FindExtension",
        ),
    ];
    for (got, want, what) in sizes {
        assert_eq!(got, want, "{what}");
    }
    assert_eq!(offset_of!(XLA_FFI_Error_GetDetails_Args, message), 24);
    assert_eq!(offset_of!(XLA_FFI_State_Args, type_id), 32);
    assert_eq!(offset_of!(XLA_FFI_Type_Register_Args, type_id), 32);
}

#[test]
fn api_table_has_19_functions_in_order() {
    assert_eq!(offset_of!(XLA_FFI_Api, api_version), 16);
    assert_eq!(offset_of!(XLA_FFI_Api, internal_api), 40);
    let slots = [
        offset_of!(XLA_FFI_Api, XLA_FFI_Error_Create),
        offset_of!(XLA_FFI_Api, XLA_FFI_Error_GetDetails),
        offset_of!(XLA_FFI_Api, XLA_FFI_Error_Destroy),
        offset_of!(XLA_FFI_Api, XLA_FFI_Handler_Register),
        offset_of!(XLA_FFI_Api, XLA_FFI_Stream_Get),
        offset_of!(XLA_FFI_Api, XLA_FFI_Type_Register),
        offset_of!(XLA_FFI_Api, XLA_FFI_InvokeContext_Get),
        offset_of!(XLA_FFI_Api, XLA_FFI_State_Set),
        offset_of!(XLA_FFI_Api, XLA_FFI_State_Get),
        offset_of!(XLA_FFI_Api, XLA_FFI_DeviceMemory_Allocate),
        offset_of!(XLA_FFI_Api, XLA_FFI_DeviceMemory_Free),
        offset_of!(XLA_FFI_Api, XLA_FFI_ThreadPool_Schedule),
        offset_of!(XLA_FFI_Api, XLA_FFI_ThreadPool_NumThreads),
        offset_of!(XLA_FFI_Api, XLA_FFI_Future_Create),
        offset_of!(XLA_FFI_Api, XLA_FFI_Future_SetAvailable),
        offset_of!(XLA_FFI_Api, XLA_FFI_Future_SetError),
        offset_of!(XLA_FFI_Api, XLA_FFI_RunId_Get),
        offset_of!(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get),
        offset_of!(XLA_FFI_Api, XLA_FFI_InvokeContext_FindExtension),
    ];
    for (i, off) in slots.iter().enumerate() {
        assert_eq!(*off, 48 + 8 * i, "slot {}", i + 1);
    }
    assert_eq!(size_of::<XLA_FFI_Api>(), XLA_FFI_Api_STRUCT_SIZE);
}

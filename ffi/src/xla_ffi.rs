// The XLA FFI C API at version 0.4 (`xla/ffi/api/c_api.h` as jaxlib 0.11.2's
// wheel ships it: the ABI its FFI handlers were built for, measured on the H200
// with `integration/diag/ffi_probe.py`), written by hand: the types a runtime
// needs to call a handler (call frame, arguments, results, attributes, the API
// table and the argument structs of its functions). Layouts are described in
// `integration/results/ffi_abi_0.4.md` and checked in `tests/xla_ffi_layout.rs`.
// Types only: the plugin serves the table (`plugin/src/xla_ffi/api.rs`).
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use core::ffi::{c_char, c_int, c_void};

pub const XLA_FFI_API_MAJOR: c_int = 0;
pub const XLA_FFI_API_MINOR: c_int = 4;

/// Opaque to handlers (`XLA_FFI_Error`, `XLA_FFI_InvokeContext`, ...).
#[repr(C)]
pub struct XLA_FFI_Error {
    _private: [u8; 0],
}
#[repr(C)]
pub struct XLA_FFI_InvokeContext {
    _private: [u8; 0],
}
#[repr(C)]
pub struct XLA_FFI_Future {
    _private: [u8; 0],
}
#[repr(C)]
pub struct XLA_FFI_InternalApi {
    _private: [u8; 0],
}

// ---- enums (C enums: 4 bytes) ----------------------------------------------
pub type XLA_FFI_Error_Code = c_int;
pub const XLA_FFI_Error_Code_OK: XLA_FFI_Error_Code = 0;
pub const XLA_FFI_Error_Code_INVALID_ARGUMENT: XLA_FFI_Error_Code = 3;
pub const XLA_FFI_Error_Code_NOT_FOUND: XLA_FFI_Error_Code = 5;
pub const XLA_FFI_Error_Code_RESOURCE_EXHAUSTED: XLA_FFI_Error_Code = 8;
pub const XLA_FFI_Error_Code_UNIMPLEMENTED: XLA_FFI_Error_Code = 12;
pub const XLA_FFI_Error_Code_INTERNAL: XLA_FFI_Error_Code = 13;

/// `xla::PrimitiveType` numbers.
pub type XLA_FFI_DataType = c_int;

pub type XLA_FFI_ArgType = c_int;
pub const XLA_FFI_ArgType_BUFFER: XLA_FFI_ArgType = 1;
pub type XLA_FFI_RetType = c_int;
pub const XLA_FFI_RetType_BUFFER: XLA_FFI_RetType = 1;

pub type XLA_FFI_AttrType = c_int;
pub const XLA_FFI_AttrType_ARRAY: XLA_FFI_AttrType = 1;
pub const XLA_FFI_AttrType_DICTIONARY: XLA_FFI_AttrType = 2;
pub const XLA_FFI_AttrType_SCALAR: XLA_FFI_AttrType = 3;
pub const XLA_FFI_AttrType_STRING: XLA_FFI_AttrType = 4;

pub type XLA_FFI_ExecutionStage = c_int;
pub const XLA_FFI_ExecutionStage_INSTANTIATE: XLA_FFI_ExecutionStage = 0;
pub const XLA_FFI_ExecutionStage_PREPARE: XLA_FFI_ExecutionStage = 1;
pub const XLA_FFI_ExecutionStage_INITIALIZE: XLA_FFI_ExecutionStage = 2;
pub const XLA_FFI_ExecutionStage_EXECUTE: XLA_FFI_ExecutionStage = 3;
pub const XLA_FFI_ExecutionStage_RECORD: XLA_FFI_ExecutionStage = 4;

pub type XLA_FFI_InternalExtension_Type = c_int;
pub const XLA_FFI_Extension_Metadata: XLA_FFI_InternalExtension_Type = 1;

pub type XLA_FFI_Handler_Traits = u32;
pub const XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE: XLA_FFI_Handler_Traits = 1;

// ---- small value types -------------------------------------------------------
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
#[derive(Debug, Copy, Clone, Default, PartialEq, Eq)]
pub struct XLA_FFI_TypeId {
    pub type_id: i64,
}

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Scalar {
    pub dtype: XLA_FFI_DataType,
    pub value: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Array {
    pub dtype: XLA_FFI_DataType,
    pub size: usize,
    pub data: *mut c_void,
}

// ---- extensions and version -------------------------------------------------
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_InternalExtension {
    pub struct_size: usize,
    pub type_: XLA_FFI_InternalExtension_Type,
    pub next: *mut XLA_FFI_InternalExtension,
}
pub const XLA_FFI_InternalExtension_STRUCT_SIZE: usize = 24;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub major_version: c_int,
    pub minor_version: c_int,
}
pub const XLA_FFI_Api_Version_STRUCT_SIZE: usize = 24;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Metadata {
    pub struct_size: usize,
    pub api_version: XLA_FFI_Api_Version,
    pub traits: XLA_FFI_Handler_Traits,
    pub state_type_id: XLA_FFI_TypeId,
}
pub const XLA_FFI_Metadata_STRUCT_SIZE: usize = 36;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Metadata_Extension {
    pub extension_base: XLA_FFI_InternalExtension,
    pub metadata: *mut XLA_FFI_Metadata,
}
pub const XLA_FFI_Metadata_Extension_STRUCT_SIZE: usize = 32;

// ---- the call frame ------------------------------------------------------------
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Buffer {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub dtype: XLA_FFI_DataType,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *mut i64,
}
pub const XLA_FFI_Buffer_STRUCT_SIZE: usize = 48;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    pub types: *mut XLA_FFI_ArgType,
    pub args: *mut *mut c_void,
}
pub const XLA_FFI_Args_STRUCT_SIZE: usize = 40;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Rets {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    pub types: *mut XLA_FFI_RetType,
    pub rets: *mut *mut c_void,
}
pub const XLA_FFI_Rets_STRUCT_SIZE: usize = 40;

/// Attributes sorted by name.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Attrs {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    pub types: *mut XLA_FFI_AttrType,
    pub names: *mut *mut XLA_FFI_ByteSpan,
    pub attrs: *mut *mut c_void,
}
pub const XLA_FFI_Attrs_STRUCT_SIZE: usize = 48;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub api: *const XLA_FFI_Api,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub stage: XLA_FFI_ExecutionStage,
    pub args: XLA_FFI_Args,
    pub rets: XLA_FFI_Rets,
    pub attrs: XLA_FFI_Attrs,
    /// Out: set by an asynchronous handler (not counted in the size).
    pub future: *mut XLA_FFI_Future,
}
/// Up to `attrs`: what a handler compares `struct_size` with, exactly.
pub const XLA_FFI_CallFrame_STRUCT_SIZE: usize = 168;

pub type XLA_FFI_Handler =
    unsafe extern "C" fn(call_frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Handler_Bundle {
    pub instantiate: Option<XLA_FFI_Handler>,
    pub prepare: Option<XLA_FFI_Handler>,
    pub initialize: Option<XLA_FFI_Handler>,
    pub execute: Option<XLA_FFI_Handler>,
    pub record: Option<XLA_FFI_Handler>,
}

// ---- argument structs of the table's functions --------------------------------
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Error_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub message: *const c_char,
    pub errc: XLA_FFI_Error_Code,
}
pub const XLA_FFI_Error_Create_Args_STRUCT_SIZE: usize = 28;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Error_GetDetails_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub error: *mut XLA_FFI_Error,
    /// Out.
    pub message: *const c_char,
    /// Out.
    pub errc: XLA_FFI_Error_Code,
}
pub const XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE: usize = 36;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub error: *mut XLA_FFI_Error,
}
pub const XLA_FFI_Error_Destroy_Args_STRUCT_SIZE: usize = 24;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Stream_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    /// Out: the platform stream (`CUstream` / `hipStream_t`).
    pub stream: *mut c_void,
}
pub const XLA_FFI_Stream_Get_Args_STRUCT_SIZE: usize = 32;

/// The table's slot 7 (`InvokeContext_Get`, formerly `ExecutionContext_Get`):
/// user data of a type.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_InvokeContext_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub type_id: *mut XLA_FFI_TypeId,
    /// Out.
    pub data: *mut c_void,
}
pub const XLA_FFI_InvokeContext_Get_Args_STRUCT_SIZE: usize = 40;

/// `State_Set` (state in) and `State_Get` (state out) share the layout.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_State_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub stage: XLA_FFI_ExecutionStage,
    pub type_id: *mut XLA_FFI_TypeId,
    pub state: *mut c_void,
}
pub const XLA_FFI_State_Args_STRUCT_SIZE: usize = 48;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_TypeInfo {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub deleter: Option<unsafe extern "C" fn(object: *mut c_void)>,
}
pub const XLA_FFI_TypeInfo_STRUCT_SIZE: usize = 24;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Type_Register_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub name: XLA_FFI_ByteSpan,
    /// In-out.
    pub type_id: *mut XLA_FFI_TypeId,
    /// Not counted in the size (an upstream quirk).
    pub type_info: *const XLA_FFI_TypeInfo,
}
pub const XLA_FFI_Type_Register_Args_STRUCT_SIZE: usize = 40;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_DeviceOrdinal_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    /// Out.
    pub device_ordinal: i32,
}
pub const XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE: usize = 28;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_DeviceMemory_Allocate_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub size: usize,
    pub alignment: usize,
    pub data: *mut c_void,
}
pub const XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE: usize = 48;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_DeviceMemory_Free_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub size: usize,
    pub data: *mut c_void,
}
pub const XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE: usize = 40;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_RunId_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub run_id: i64,
}
pub const XLA_FFI_RunId_Get_Args_STRUCT_SIZE: usize = 32;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_InvokeContext_FindExtension_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub extension_type: i64,
    pub extension: *const c_void,
}
pub const XLA_FFI_InvokeContext_FindExtension_Args_STRUCT_SIZE: usize = 40;

// ---- the API table -------------------------------------------------------------
/// A table entry; every function takes a pointer to its argument struct.
pub type XLA_FFI_Fn = Option<unsafe extern "C" fn(args: *mut c_void) -> *mut XLA_FFI_Error>;
/// The two entries that return nothing (`Error_GetDetails`, `Error_Destroy`).
pub type XLA_FFI_VoidFn = Option<unsafe extern "C" fn(args: *mut c_void)>;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct XLA_FFI_Api {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub api_version: XLA_FFI_Api_Version,
    pub internal_api: *const XLA_FFI_InternalApi,
    pub XLA_FFI_Error_Create: XLA_FFI_Fn,
    pub XLA_FFI_Error_GetDetails: XLA_FFI_VoidFn,
    pub XLA_FFI_Error_Destroy: XLA_FFI_VoidFn,
    pub XLA_FFI_Handler_Register: XLA_FFI_Fn,
    pub XLA_FFI_Stream_Get: XLA_FFI_Fn,
    pub XLA_FFI_Type_Register: XLA_FFI_Fn,
    pub XLA_FFI_InvokeContext_Get: XLA_FFI_Fn,
    pub XLA_FFI_State_Set: XLA_FFI_Fn,
    pub XLA_FFI_State_Get: XLA_FFI_Fn,
    pub XLA_FFI_DeviceMemory_Allocate: XLA_FFI_Fn,
    pub XLA_FFI_DeviceMemory_Free: XLA_FFI_Fn,
    pub XLA_FFI_ThreadPool_Schedule: XLA_FFI_Fn,
    pub XLA_FFI_ThreadPool_NumThreads: XLA_FFI_Fn,
    pub XLA_FFI_Future_Create: XLA_FFI_Fn,
    pub XLA_FFI_Future_SetAvailable: XLA_FFI_Fn,
    pub XLA_FFI_Future_SetError: XLA_FFI_Fn,
    pub XLA_FFI_RunId_Get: XLA_FFI_Fn,
    pub XLA_FFI_DeviceOrdinal_Get: XLA_FFI_Fn,
    pub XLA_FFI_InvokeContext_FindExtension: XLA_FFI_Fn,
}
pub const XLA_FFI_Api_STRUCT_SIZE: usize = 200;

// The PJRT FFI extension (`xla/pjrt/c/pjrt_c_api_ffi_extension.h`, extension
// version 2), written by hand: the header is not part of the bindgen run of
// `generate_pjrt.sh`, and it is four plain structs. The layouts are checked
// against the header's `PJRT_DEFINE_STRUCT_TRAITS` sizes in
// `tests/pjrt_layout.rs`.



pub const PJRT_API_FFI_EXTENSION_VERSION: i32 = 2;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PJRT_FFI_TypeID_Register_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub type_name: *const ::core::ffi::c_char,
    pub type_name_size: usize,
    /// In-out: 0 asks XLA to assign one.
    pub type_id: i64,
}
pub const PJRT_FFI_TypeID_Register_Args_STRUCT_SIZE: usize = 40;

/// User data forwarded to FFI handlers; `deleter` (optional) runs when the
/// execute context is destroyed.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PJRT_FFI_UserData {
    pub type_id: i64,
    pub data: *mut ::core::ffi::c_void,
    pub deleter: Option<unsafe extern "C" fn(data: *mut ::core::ffi::c_void)>,
}

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PJRT_FFI_UserData_Add_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub context: *mut PJRT_ExecuteContext,
    pub user_data: PJRT_FFI_UserData,
}
pub const PJRT_FFI_UserData_Add_Args_STRUCT_SIZE: usize = 48;

pub type PJRT_FFI_Handler_TraitsBits = ::core::ffi::c_uint;
pub const PJRT_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE: PJRT_FFI_Handler_TraitsBits = 1;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PJRT_FFI_Register_Handler_Args {
    pub struct_size: usize,
    pub target_name: *const ::core::ffi::c_char,
    pub target_name_size: usize,
    /// 0: an untyped call, 1: typed (XLA FFI).
    pub api_version: ::core::ffi::c_int,
    pub handler: *mut ::core::ffi::c_void,
    pub platform_name: *const ::core::ffi::c_char,
    pub platform_name_size: usize,
    pub traits: PJRT_FFI_Handler_TraitsBits,
}
pub const PJRT_FFI_Register_Handler_Args_STRUCT_SIZE: usize = 60;

pub type PJRT_FFI_TypeID_Register =
    unsafe extern "C" fn(args: *mut PJRT_FFI_TypeID_Register_Args) -> *mut PJRT_Error;
pub type PJRT_FFI_UserData_Add =
    unsafe extern "C" fn(args: *mut PJRT_FFI_UserData_Add_Args) -> *mut PJRT_Error;
pub type PJRT_FFI_Register_Handler =
    unsafe extern "C" fn(args: *mut PJRT_FFI_Register_Handler_Args) -> *mut PJRT_Error;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PJRT_FFI_Extension {
    pub base: PJRT_Extension_Base,
    pub type_id_register: Option<PJRT_FFI_TypeID_Register>,
    pub user_data_add: Option<PJRT_FFI_UserData_Add>,
    pub register_handler: Option<PJRT_FFI_Register_Handler>,
}
pub const PJRT_FFI_Extension_STRUCT_SIZE: usize = 48;

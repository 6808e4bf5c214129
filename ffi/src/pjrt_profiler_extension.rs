// The PJRT profiler extension (`xla/pjrt/c/pjrt_c_api_profiler_extension.h`,
// extension version 1) and the plugin profiler API it points to
// (`xla/backends/profiler/plugin/profiler_c_api.h`, PLUGIN_PROFILER_VERSION
// 1), written by hand: neither header is part of the bindgen run of
// `generate_pjrt.sh`. JAX finds the extension in a plugin's chain at load
// (`register_plugin_profiler`) and drives the API around a profiler session
// (`PluginTracer`: create with the serialized ProfileOptions, start, stop,
// collect the XSpace, destroy). Layouts checked against the headers'
// `PROFILER_DEFINE_STRUCT_TRAITS` sizes in `tests/pjrt_layout.rs`.

pub const PJRT_API_PROFILER_EXTENSION_VERSION: i32 = 1;
pub const PLUGIN_PROFILER_VERSION: i32 = 1;

/// The plugin's profiler object (opaque to the caller).
#[repr(C)]
pub struct PLUGIN_Profiler {
    _private: [u8; 0],
}

/// The plugin's error object (opaque to the caller).
#[repr(C)]
pub struct PLUGIN_Profiler_Error {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_Error_Destroy_Args {
    pub struct_size: usize,
    pub priv_: *mut ::core::ffi::c_void,
    pub error: *mut PLUGIN_Profiler_Error,
}
pub const PLUGIN_Profiler_Error_Destroy_Args_STRUCT_SIZE: usize = 24;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_Error_Message_Args {
    pub struct_size: usize,
    pub priv_: *mut ::core::ffi::c_void,
    pub error: *const PLUGIN_Profiler_Error,
    /// Out; lives as long as `error`.
    pub message: *const ::core::ffi::c_char,
    pub message_size: usize,
}
pub const PLUGIN_Profiler_Error_Message_Args_STRUCT_SIZE: usize = 40;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_Error_GetCode_Args {
    pub struct_size: usize,
    pub priv_: *mut ::core::ffi::c_void,
    pub error: *const PLUGIN_Profiler_Error,
    /// Out: an absl status code.
    pub code: ::core::ffi::c_int,
}
pub const PLUGIN_Profiler_Error_GetCode_Args_STRUCT_SIZE: usize = 28;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_Create_Args {
    pub struct_size: usize,
    /// A serialized `tensorflow.ProfileOptions`.
    pub options: *const ::core::ffi::c_char,
    pub options_size: usize,
    /// Out.
    pub profiler: *mut PLUGIN_Profiler,
}
pub const PLUGIN_Profiler_Create_Args_STRUCT_SIZE: usize = 32;

/// The arguments of destroy, start and stop: the profiler.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_Args {
    pub struct_size: usize,
    pub profiler: *mut PLUGIN_Profiler,
}
pub type PLUGIN_Profiler_Destroy_Args = PLUGIN_Profiler_Args;
pub type PLUGIN_Profiler_Start_Args = PLUGIN_Profiler_Args;
pub type PLUGIN_Profiler_Stop_Args = PLUGIN_Profiler_Args;
pub const PLUGIN_Profiler_Args_STRUCT_SIZE: usize = 16;

/// Called with `buffer` null: the plugin sets `buffer_size_in_bytes` (and,
/// as newer callers expect, `buffer` to its own copy of the data); called
/// again with a caller's buffer of that size: the plugin writes the data
/// there. The data is a serialized `tensorflow.profiler.XSpace`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_CollectData_Args {
    pub struct_size: usize,
    pub profiler: *mut PLUGIN_Profiler,
    pub buffer: *mut u8,
    pub buffer_size_in_bytes: usize,
}
pub const PLUGIN_Profiler_CollectData_Args_STRUCT_SIZE: usize = 32;

pub type PLUGIN_Profiler_Error_Destroy =
    unsafe extern "C" fn(args: *mut PLUGIN_Profiler_Error_Destroy_Args);
pub type PLUGIN_Profiler_Error_Message =
    unsafe extern "C" fn(args: *mut PLUGIN_Profiler_Error_Message_Args);
pub type PLUGIN_Profiler_Error_GetCode =
    unsafe extern "C" fn(args: *mut PLUGIN_Profiler_Error_GetCode_Args) -> *mut PLUGIN_Profiler_Error;
pub type PLUGIN_Profiler_Create =
    unsafe extern "C" fn(args: *mut PLUGIN_Profiler_Create_Args) -> *mut PLUGIN_Profiler_Error;
pub type PLUGIN_Profiler_Call =
    unsafe extern "C" fn(args: *mut PLUGIN_Profiler_Args) -> *mut PLUGIN_Profiler_Error;
pub type PLUGIN_Profiler_CollectData = unsafe extern "C" fn(
    args: *mut PLUGIN_Profiler_CollectData_Args,
) -> *mut PLUGIN_Profiler_Error;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PLUGIN_Profiler_Api {
    pub struct_size: usize,
    pub priv_: *mut ::core::ffi::c_void,
    pub error_destroy: Option<PLUGIN_Profiler_Error_Destroy>,
    pub error_message: Option<PLUGIN_Profiler_Error_Message>,
    pub error_get_code: Option<PLUGIN_Profiler_Error_GetCode>,
    pub create: Option<PLUGIN_Profiler_Create>,
    pub destroy: Option<PLUGIN_Profiler_Call>,
    pub start: Option<PLUGIN_Profiler_Call>,
    pub stop: Option<PLUGIN_Profiler_Call>,
    pub collect_data: Option<PLUGIN_Profiler_CollectData>,
}
pub const PLUGIN_Profiler_Api_STRUCT_SIZE: usize = 80;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct PJRT_Profiler_Extension {
    pub base: PJRT_Extension_Base,
    /// Null when the extension is used as an args extension.
    pub profiler_api: *mut PLUGIN_Profiler_Api,
    /// Valid only as an args extension.
    pub traceme_context_id: i64,
}
pub const PJRT_Profiler_Extension_STRUCT_SIZE: usize = 40;

//! Layout checks of the generated PJRT bindings (x86-64 / aarch64 LP64).
//!
//! The header's `*_STRUCT_SIZE` constants are `offsetof(last field) +
//! sizeof(last field)`; a struct whose last field is pointer sized has no
//! trailing padding, so its Rust size must equal the constant. The version
//! and table size are the ones the plugin reports to jaxlib.

use std::mem::{offset_of, size_of};
use xla_vmm_ffi::pjrt::*;

#[test]
fn api_version_is_0_114() {
    assert_eq!(PJRT_API_MAJOR, 0);
    assert_eq!(PJRT_API_MINOR, 114);
}

#[test]
fn api_table_size_matches_header() {
    // 3 header words + a 24-byte version struct + 138 entry pointers.
    assert_eq!(size_of::<PJRT_Api>(), PJRT_Api_STRUCT_SIZE as usize);
    assert_eq!(size_of::<PJRT_Api>(), 1144);
    assert_eq!(offset_of!(PJRT_Api, pjrt_api_version), 16);
    assert_eq!(offset_of!(PJRT_Api, PJRT_Error_Destroy), 40);
    // The first slots keep their place across versions (jaxlib reads them
    // before it looks at the version).
    assert_eq!(offset_of!(PJRT_Api, PJRT_Client_Create), 40 + 10 * 8);
}

#[test]
fn args_struct_sizes_match_header() {
    assert_eq!(
        size_of::<PJRT_Client_Create_Args>(),
        PJRT_Client_Create_Args_STRUCT_SIZE as usize
    );
    assert_eq!(
        size_of::<PJRT_Client_BufferFromHostBuffer_Args>(),
        PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE as usize
    );
    assert_eq!(
        size_of::<PJRT_Buffer_ToHostBuffer_Args>(),
        PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE as usize
    );
    assert_eq!(
        size_of::<PJRT_LoadedExecutable_Execute_Args>(),
        PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE as usize
    );
    assert_eq!(
        size_of::<PJRT_NamedValue>(),
        PJRT_NamedValue_STRUCT_SIZE as usize
    );
    assert_eq!(size_of::<PJRT_NamedValue>(), 56);
    assert_eq!(offset_of!(PJRT_NamedValue, value_size), 48);
}

#[test]
fn objects_the_caller_reads_start_with_a_vtable() {
    // jaxlib (API >= 0.105) reads `PJRT_Memory::vtable`; errors carry one too.
    assert_eq!(size_of::<PJRT_Memory>(), size_of::<usize>());
    assert_eq!(size_of::<PJRT_Error>(), size_of::<usize>());
}

#[test]
fn ffi_extension_structs_match_header() {
    // offsetof(last field) + sizeof(last field), as PJRT_DEFINE_STRUCT_TRAITS.
    let end = |off: usize, size: usize| off + size;
    assert_eq!(
        end(offset_of!(PJRT_FFI_TypeID_Register_Args, type_id), 8),
        PJRT_FFI_TypeID_Register_Args_STRUCT_SIZE
    );
    assert_eq!(size_of::<PJRT_FFI_UserData>(), 24);
    assert_eq!(
        end(offset_of!(PJRT_FFI_UserData_Add_Args, user_data), 24),
        PJRT_FFI_UserData_Add_Args_STRUCT_SIZE
    );
    assert_eq!(offset_of!(PJRT_FFI_Register_Handler_Args, handler), 32);
    assert_eq!(
        end(offset_of!(PJRT_FFI_Register_Handler_Args, traits), 4),
        PJRT_FFI_Register_Handler_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(offset_of!(PJRT_FFI_Extension, register_handler), 8),
        PJRT_FFI_Extension_STRUCT_SIZE
    );
    assert_eq!(
        size_of::<PJRT_FFI_Extension>(),
        PJRT_FFI_Extension_STRUCT_SIZE
    );
}

#[test]
fn profiler_extension_structs_match_header() {
    let end = |off: usize, size: usize| off + size;
    assert_eq!(
        end(offset_of!(PLUGIN_Profiler_Error_Destroy_Args, error), 8),
        PLUGIN_Profiler_Error_Destroy_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(
            offset_of!(PLUGIN_Profiler_Error_Message_Args, message_size),
            8
        ),
        PLUGIN_Profiler_Error_Message_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(offset_of!(PLUGIN_Profiler_Error_GetCode_Args, code), 4),
        PLUGIN_Profiler_Error_GetCode_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(offset_of!(PLUGIN_Profiler_Create_Args, profiler), 8),
        PLUGIN_Profiler_Create_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(offset_of!(PLUGIN_Profiler_Args, profiler), 8),
        PLUGIN_Profiler_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(
            offset_of!(PLUGIN_Profiler_CollectData_Args, buffer_size_in_bytes),
            8
        ),
        PLUGIN_Profiler_CollectData_Args_STRUCT_SIZE
    );
    assert_eq!(
        end(offset_of!(PLUGIN_Profiler_Api, collect_data), 8),
        PLUGIN_Profiler_Api_STRUCT_SIZE
    );
    assert_eq!(offset_of!(PJRT_Profiler_Extension, profiler_api), 24);
    assert_eq!(
        end(offset_of!(PJRT_Profiler_Extension, traceme_context_id), 8),
        PJRT_Profiler_Extension_STRUCT_SIZE
    );
}

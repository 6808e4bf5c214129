//! Execute contexts (`PJRT_ExecuteContext_*`) and the PJRT FFI extension:
//! the side channel through which JAX hands user data to FFI handlers (the
//! Python callables of `pure_callback`, `io_callback`, `jax.debug.print`,
//! `buffer_callback`), by type id.
//!
//! jaxlib creates a context for an `Execute`, adds its user data through
//! our extension's `user_data_add`, and passes the context in the execute
//! options. Our runtime's custom calls read it (`xla_ffi/api.rs`); a
//! program on the vendor runtime gets it added to a vendor context made for
//! that run (`vendor/executable.rs`). Typed-FFI handler registrations are kept
//! for our runtime (`xla_ffi/api.rs`); handler and type registrations also
//! go to the vendor plugin: at once when it is loaded, else when it is
//! (`vendor/compiler.rs` replays them).
#![allow(unsafe_code)]

use std::sync::Arc;

use xla_vmm_ffi::pjrt::*;

use crate::api::entry::run;
use crate::cabi::caller;
use crate::cabi::error::{Error, Result};
use crate::cabi::ffi_state::{add_pending, ExecuteContext, Registration, UserData};
use crate::cabi::handles::Handle;

pub fn create(a: &mut PJRT_ExecuteContext_Create_Args) -> Result<()> {
    a.context = Arc::new(ExecuteContext::default()).into_c();
    Ok(())
}

/// Destroy: the handle goes now; the user data when no run in flight holds
/// the context any more.
pub fn destroy(a: &mut PJRT_ExecuteContext_Destroy_Args) -> Result<()> {
    ExecuteContext::release(a.context)?;
    Ok(())
}

fn user_data_add(a: &mut PJRT_FFI_UserData_Add_Args) -> Result<()> {
    let c = ExecuteContext::from_c(a.context)?;
    let mut list = c.user_data.lock().unwrap_or_else(|p| p.into_inner());
    if list.iter().any(|u| u.type_id == a.user_data.type_id) {
        return Err(Error::invalid(format!(
            "user data of type id {} is already in this execute context",
            a.user_data.type_id
        )));
    }
    list.push(UserData {
        type_id: a.user_data.type_id,
        data: a.user_data.data as usize,
        deleter: a.user_data.deleter,
    });
    Ok(())
}

fn register_handler(a: &mut PJRT_FFI_Register_Handler_Args) -> Result<()> {
    let target = caller::str(a.target_name, a.target_name_size, "target_name")?;
    let platform = caller::str(a.platform_name, a.platform_name_size, "platform_name")?;
    if a.handler.is_null() {
        return Err(Error::invalid(format!("handler for {target} is null")));
    }
    // A typed-FFI handler (API version 1 here) also runs on our runtime
    // (its execute stage: the extension passes one function).
    if a.api_version == 1 {
        // SAFETY: non-null (checked): an `XLA_FFI_Handler` for API version 1.
        let execute: xla_vmm_ffi::xla_ffi::XLA_FFI_Handler =
            unsafe { std::mem::transmute(a.handler) };
        crate::xla_ffi::api::register_handler(
            target,
            crate::xla_ffi::api::Handler {
                execute,
                instantiate: None,
                traits: a.traits,
            },
        );
    }
    let r = Registration::Handler {
        target: target.as_bytes().to_vec(),
        platform: platform.as_bytes().to_vec(),
        api_version: a.api_version,
        handler: a.handler as usize,
        traits: a.traits,
    };
    match crate::vendor_plugin::compiler::VendorPlugin::loaded() {
        Some(v) => v.register(&r),
        None => {
            add_pending(r);
            Ok(())
        }
    }
}

fn type_id_register(a: &mut PJRT_FFI_TypeID_Register_Args) -> Result<()> {
    let name = caller::str(a.type_name, a.type_name_size, "type_name")?;
    let v = crate::vendor_plugin::compiler::VendorPlugin::loaded().ok_or_else(|| {
        Error::failed_precondition(format!(
            "FFI type {name}: the vendor plugin (which keeps XLA's type registry) is not loaded yet"
        ))
    })?;
    a.type_id = v.register_type_id(name, a.type_id)?;
    Ok(())
}

unsafe extern "C" fn ext_user_data_add(args: *mut PJRT_FFI_UserData_Add_Args) -> *mut PJRT_Error {
    run(
        "PJRT_FFI_UserData_Add",
        args,
        PJRT_FFI_UserData_Add_Args_STRUCT_SIZE,
        user_data_add,
    )
}
unsafe extern "C" fn ext_register_handler(
    args: *mut PJRT_FFI_Register_Handler_Args,
) -> *mut PJRT_Error {
    run(
        "PJRT_FFI_Register_Handler",
        args,
        PJRT_FFI_Register_Handler_Args_STRUCT_SIZE,
        register_handler,
    )
}
unsafe extern "C" fn ext_type_id_register(
    args: *mut PJRT_FFI_TypeID_Register_Args,
) -> *mut PJRT_Error {
    run(
        "PJRT_FFI_TypeID_Register",
        args,
        PJRT_FFI_TypeID_Register_Args_STRUCT_SIZE,
        type_id_register,
    )
}

/// The extension chain's first entry (`PJRT_Api::extension_start`); the
/// profiler's follows.
#[repr(transparent)]
pub struct SyncExtension(pub PJRT_FFI_Extension);
// SAFETY: immutable after construction; its only data pointer (`next`)
// points to an immutable static, the rest are function pointers.
unsafe impl Sync for SyncExtension {}

pub static FFI_EXTENSION: SyncExtension = SyncExtension(PJRT_FFI_Extension {
    base: PJRT_Extension_Base {
        struct_size: PJRT_FFI_Extension_STRUCT_SIZE,
        type_: PJRT_Extension_Type_FFI,
        next: &crate::api::profiler::PROFILER_EXTENSION.0.base as *const PJRT_Extension_Base
            as *mut PJRT_Extension_Base,
    },
    type_id_register: Some(ext_type_id_register),
    user_data_add: Some(ext_user_data_add),
    register_handler: Some(ext_register_handler),
});

//! What the FFI extension keeps between calls: execute contexts and their
//! user data (`PJRT_ExecuteContext`), and the handler registrations made
//! before the vendor plugin was loaded (`execute_context.rs` takes them in,
//! `vendor/compiler.rs` replays them, `vendor/executable.rs` hands a run's user data on).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Mutex;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::handles::{Handle, Registry};

/// One user data entry (a plain copy of `PJRT_FFI_UserData`).
#[derive(Clone, Copy, Debug)]
pub struct UserData {
    pub type_id: i64,
    pub data: usize,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut c_void)>,
}

impl UserData {
    /// As the C struct, without a deleter: the vendor context borrows the
    /// data, ours deletes it.
    pub fn borrowed(&self) -> PJRT_FFI_UserData {
        PJRT_FFI_UserData {
            type_id: self.type_id,
            data: self.data as *mut c_void,
            deleter: None,
        }
    }
}

#[derive(Default)]
pub struct ExecuteContext {
    pub(crate) user_data: Mutex<Vec<UserData>>,
}

static CONTEXTS: Registry<ExecuteContext> = Registry::new();

impl Handle for ExecuteContext {
    type C = PJRT_ExecuteContext;
    const KIND: &'static str = "PJRT_ExecuteContext";
    fn registry() -> &'static Registry<Self> {
        &CONTEXTS
    }
}

impl ExecuteContext {
    pub fn user_data(&self) -> Vec<UserData> {
        self.user_data
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Custom calls on our runtime read the run's user data by type id
/// (`XLA_FFI_InvokeContext_Get`).
impl xla_vmm_runtime::CallContext for ExecuteContext {
    fn user_data(&self, type_id: i64) -> Option<usize> {
        self.user_data
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|u| u.type_id == type_id)
            .map(|u| u.data)
    }
}

impl Drop for ExecuteContext {
    fn drop(&mut self) {
        let entries = std::mem::take(self.user_data.get_mut().unwrap_or_else(|p| p.into_inner()));
        for u in entries {
            if let Some(delete) = u.deleter {
                // SAFETY: the deleter the caller gave with this data, called
                // once, when the context goes (the extension's contract).
                unsafe { delete(u.data as *mut c_void) };
            }
        }
    }
}

/// A handler or type registration for the vendor plugin, kept until it is
/// loaded (the strings owned).
#[derive(Clone, Debug)]
pub enum Registration {
    Handler {
        target: Vec<u8>,
        platform: Vec<u8>,
        api_version: i32,
        handler: usize,
        traits: u32,
    },
}

static PENDING: Mutex<Vec<Registration>> = Mutex::new(Vec::new());

/// Keep `r` for the vendor plugin's load.
pub fn add_pending(r: Registration) {
    PENDING.lock().unwrap_or_else(|p| p.into_inner()).push(r);
}

/// The registrations made before the vendor plugin was loaded (taken).
pub fn take_pending() -> Vec<Registration> {
    std::mem::take(&mut *PENDING.lock().unwrap_or_else(|p| p.into_inner()))
}

//! The key-value store JAX hands a client in a multi-process run
//! (`jax.distributed.initialize()`): `PJRT_Client_Create_Args`'
//! `kv_get_callback` / `kv_put_callback` (and `kv_try_get_callback`).
//!
//! [`KvStore`] wraps the callbacks; [`KvExchange`] is the store seen under
//! this client's key prefix `xla_vmm/<incarnation>/`: the incarnation counts
//! the clients this process created before for the same `node_id` (and
//! `num_nodes`), so a
//! second client in the same processes (created in the same order
//! everywhere) never reads the ids of the first (and two "processes"
//! emulated in one, as tests do, still agree). It carries the topology (each process's local
//! device count) and the collective clique ids.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::error::{Error, ErrorObj, Result};
use crate::cabi::handles::Handle;

/// The callbacks and their user arguments, as the caller passed them; they
/// stay valid as long as the client (jaxlib keeps them with its client).
#[derive(Clone, Copy)]
pub struct KvStore {
    pub get: PJRT_KeyValueGetCallback,
    pub get_arg: *mut c_void,
    pub put: PJRT_KeyValuePutCallback,
    pub put_arg: *mut c_void,
    pub try_get: PJRT_KeyValueTryGetCallback,
    pub try_get_arg: *mut c_void,
}

// SAFETY: the callbacks are thread safe by the PJRT contract (jaxlib's are
// calls into its distributed runtime client); the user args are opaque.
unsafe impl Send for KvStore {}
// SAFETY: as above.
unsafe impl Sync for KvStore {}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("try_get", &self.try_get.is_some())
            .finish()
    }
}

/// `callback_error` for the callbacks: makes one of our `PJRT_Error`s
/// (taken back by [`take_callback_error`]).
extern "C" fn callback_error(
    code: PJRT_Error_Code,
    message: *const std::ffi::c_char,
    message_size: usize,
) -> *mut PJRT_Error {
    let r = std::panic::catch_unwind(|| {
        let msg = crate::cabi::caller::str(message, message_size, "key-value store error message")
            .map(str::to_string)
            .unwrap_or_else(|_| "(unreadable message)".into());
        crate::cabi::error::into_c(Error::new(code, msg))
    });
    r.unwrap_or(std::ptr::null_mut())
}

#[repr(transparent)]
struct CallbackErrorSlot(PJRT_CallbackError);
// SAFETY: an immutable function pointer.
unsafe impl Sync for CallbackErrorSlot {}
static CALLBACK_ERROR: CallbackErrorSlot = CallbackErrorSlot(Some(callback_error));

fn callback_error_ptr() -> *mut PJRT_CallbackError {
    // The callee only reads it.
    &CALLBACK_ERROR.0 as *const PJRT_CallbackError as *mut PJRT_CallbackError
}

/// Our error back from a callback's returned `PJRT_Error` (null: none).
fn take_callback_error(err: *mut PJRT_Error, what: &str) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    match ErrorObj::release(err) {
        Ok(e) => Err(e.error.clone().context(what)),
        Err(_) => Err(Error::internal(format!(
            "{what}: the key-value callback returned an error not made by its callback_error"
        ))),
    }
}

impl KvStore {
    /// The store of `a`, when the caller passed one (get and put both set).
    pub fn from_create_args(a: &PJRT_Client_Create_Args) -> Option<KvStore> {
        let (get, put) = (a.kv_get_callback?, a.kv_put_callback?);
        // Callers built against an older header have no try_get fields.
        let has_try_get = a.struct_size
            >= std::mem::offset_of!(PJRT_Client_Create_Args, kv_try_get_user_arg)
                + std::mem::size_of::<*mut c_void>();
        let (try_get, try_get_arg) = if has_try_get {
            (a.kv_try_get_callback, a.kv_try_get_user_arg)
        } else {
            (None, std::ptr::null_mut())
        };
        Some(KvStore {
            get: Some(get),
            get_arg: a.kv_get_user_arg,
            put: Some(put),
            put_arg: a.kv_put_user_arg,
            try_get,
            try_get_arg,
        })
    }

    /// Put the callbacks into `a` (the vendor client's create args).
    pub fn fill_create_args(&self, a: &mut PJRT_Client_Create_Args) {
        a.kv_get_callback = self.get;
        a.kv_get_user_arg = self.get_arg;
        a.kv_put_callback = self.put;
        a.kv_put_user_arg = self.put_arg;
        a.kv_try_get_callback = self.try_get;
        a.kv_try_get_user_arg = self.try_get_arg;
    }

    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        let f = self
            .put
            .ok_or_else(|| Error::failed_precondition("no key-value put callback"))?;
        let mut a = PJRT_KeyValuePutCallback_Args {
            struct_size: PJRT_KeyValuePutCallback_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            key: key.as_ptr().cast(),
            key_size: key.len(),
            value: value.as_ptr().cast(),
            value_size: value.len(),
            callback_error: callback_error_ptr(),
            user_arg: self.put_arg,
        };
        // SAFETY: the caller's put callback with complete args; key and
        // value outlive the call.
        let err = unsafe { f(&mut a) };
        take_callback_error(err, &format!("key-value put {key:?}"))
    }

    /// The value of `key`, waiting up to `timeout` for some process to put it.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<String> {
        let f = self
            .get
            .ok_or_else(|| Error::failed_precondition("no key-value get callback"))?;
        let mut a = PJRT_KeyValueGetCallback_Args {
            struct_size: PJRT_KeyValueGetCallback_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            key: key.as_ptr().cast(),
            key_size: key.len(),
            timeout_in_ms: timeout.as_millis().min(i32::MAX as u128) as i32,
            callback_error: callback_error_ptr(),
            user_arg: self.get_arg,
            value: std::ptr::null_mut(),
            value_size: 0,
            value_deleter_callback: None,
        };
        // SAFETY: the caller's get callback with complete args.
        let err = unsafe { f(&mut a) };
        take_callback_error(err, &format!("key-value get {key:?}"))?;
        let value = crate::cabi::caller::str(a.value, a.value_size, "key-value value")
            .map(str::to_string)
            .map_err(|e| e.context(&format!("key-value get {key:?}")));
        if let (Some(free), false) = (a.value_deleter_callback, a.value.is_null()) {
            // SAFETY: the value the callback returned, freed once with the
            // deleter it came with.
            unsafe { free(a.value) };
        }
        value
    }
}

/// Clients created with a key-value store in this process so far, by
/// (node id, node count).
static INCARNATIONS: Mutex<Option<HashMap<(usize, usize), u64>>> = Mutex::new(None);

/// The store under this client's prefix `xla_vmm/<incarnation>/`.
#[derive(Debug)]
pub struct KvExchange {
    store: KvStore,
    prefix: String,
}

impl KvExchange {
    /// A new client's view (the next incarnation of `node_id` of
    /// `num_nodes`).
    pub fn new(store: KvStore, node_id: usize, num_nodes: usize) -> Arc<KvExchange> {
        let n = {
            let mut m = INCARNATIONS.lock().unwrap_or_else(|p| p.into_inner());
            let c = m
                .get_or_insert_with(HashMap::new)
                .entry((node_id, num_nodes))
                .or_insert(0);
            *c += 1;
            *c - 1
        };
        Arc::new(KvExchange {
            store,
            prefix: format!("xla_vmm/{n}/"),
        })
    }

    pub fn store(&self) -> &KvStore {
        &self.store
    }

    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        self.store.put(&format!("{}{key}", self.prefix), value)
    }

    pub fn get(&self, key: &str, timeout: Duration) -> Result<String> {
        self.store.get(&format!("{}{key}", self.prefix), timeout)
    }

    /// Publish this node's local device count and read every node's
    /// (`topology/<node_id>`), in node order.
    pub fn topology(
        &self,
        node_id: usize,
        num_nodes: usize,
        local_devices: usize,
        timeout: Duration,
    ) -> Result<Vec<usize>> {
        self.put(&format!("topology/{node_id}"), &local_devices.to_string())?;
        (0..num_nodes)
            .map(|n| {
                if n == node_id {
                    return Ok(local_devices);
                }
                let v = self.get(&format!("topology/{n}"), timeout).map_err(|e| {
                    e.context(&format!(
                        "waiting for process {n} of {num_nodes} to publish its devices"
                    ))
                })?;
                v.trim().parse::<usize>().map_err(|_| {
                    Error::invalid(format!("process {n} published {v:?} as its device count"))
                })
            })
            .collect()
    }
}

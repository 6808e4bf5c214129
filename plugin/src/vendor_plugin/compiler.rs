//! The vendor XLA GPU plugin (`xla_cuda_plugin.so`), used as a compiler only.
//!
//! Compile path (see `docs/DESIGN.md` §1): `PJRT_Client_Compile` on our client
//! forwards the program and the serialized `CompileOptionsProto` to the
//! vendor client (`vendor_exec::VendorExecutable::compile`); the vendor
//! executable's `PJRT_Executable_Serialize` bytes go to `xla_vmm::decode`
//! and the runtime's `Executable::load`. The vendor client is created with
//! `allocator=platform`, `preallocate=false` and a tiny memory fraction, so
//! it holds no device memory pool: every buffer JAX sees is ours.
//!
//! Every call into the vendor table goes through [`VendorPlugin::call`],
//! which sets `struct_size`, checks the slot exists, and turns a vendor
//! `PJRT_Error` into our [`Error`] (message and code copied, error freed).
#![allow(unsafe_code)]

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{CPtr, NamedValues, Value};
use crate::cabi::error::{Error, Result};

pub struct VendorPlugin {
    lib: libloading::Library,
    api: CPtr<PJRT_Api>,
    pub path: String,
}

/// The process loads one vendor plugin, once (XLA's plugins expect that).
static VENDOR: OnceLock<Mutex<Option<Arc<VendorPlugin>>>> = OnceLock::new();

impl VendorPlugin {
    /// Load (once per process) and initialize the plugin at `path`.
    pub fn load(path: &Path) -> Result<Arc<VendorPlugin>> {
        let slot = VENDOR.get_or_init(|| Mutex::new(None));
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let shown = path.display().to_string();
        // SAFETY: loading a shared library runs its initializers; the vendor
        // PJRT plugin is built to be dlopen'ed into a process like this one.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| Error::not_found(format!("dlopen {shown}: {e}")))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const PJRT_Api> =
            unsafe { lib.get(b"GetPjrtApi\0") }
                .map_err(|e| Error::not_found(format!("{shown}: no GetPjrtApi: {e}")))?;
        // SAFETY: calling the plugin's entry point (no arguments).
        let api = unsafe { get() };
        if api.is_null() {
            return Err(Error::internal(format!(
                "{shown}: GetPjrtApi returned null"
            )));
        }
        // SAFETY: non-null pointer to the plugin's static table; we read the
        // header only, then check its size before using any slot.
        let (size, major, minor) = unsafe {
            (
                (*api).struct_size,
                (*api).pjrt_api_version.major_version,
                (*api).pjrt_api_version.minor_version,
            )
        };
        let needed = std::mem::offset_of!(PJRT_Api, PJRT_Executable_Fingerprint) + 8;
        if major != PJRT_API_MAJOR as i32 || size < needed {
            return Err(Error::failed_precondition(format!(
                "{shown}: PJRT C API {major}.{minor} with a {size}-byte table; need 0.x with at least {needed} bytes"
            )));
        }
        let plugin = Arc::new(VendorPlugin {
            lib,
            api: CPtr(api as *mut PJRT_Api),
            path: shown,
        });
        let mut init = PJRT_Plugin_Initialize_Args {
            struct_size: PJRT_Plugin_Initialize_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
        };
        plugin.call(
            "PJRT_Plugin_Initialize",
            |a| a.PJRT_Plugin_Initialize,
            &mut init,
        )?;
        tracing::info!(path = %plugin.path, major, minor, "vendor PJRT plugin loaded");
        *slot = Some(plugin.clone());
        // FFI handlers registered with us before the vendor was here.
        for r in crate::cabi::ffi_state::take_pending() {
            if let Err(e) = plugin.register(&r) {
                tracing::debug!("replaying an FFI registration: {}", e.message);
            }
        }
        Ok(plugin)
    }

    /// The address of symbol `name` (NUL-terminated) the vendor library
    /// exports, if it does.
    pub fn symbol_address(&self, name: &[u8]) -> Option<*mut std::ffi::c_void> {
        // SAFETY: looking a symbol up runs nothing; the address is only
        // used by callers that know its type.
        let sym: libloading::Symbol<*mut std::ffi::c_void> = unsafe { self.lib.get(name) }.ok()?;
        Some(*sym)
    }

    /// The plugin loaded in this process, if any.
    pub fn loaded() -> Option<Arc<VendorPlugin>> {
        VENDOR
            .get()
            .and_then(|m| m.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// The vendor's PJRT FFI extension, if its table has one.
    fn ffi_extension(&self) -> Option<&PJRT_FFI_Extension> {
        let mut ext = self.api().extension_start;
        while !ext.is_null() {
            // SAFETY: the vendor's extension chain: static structs, each
            // starting with a `PJRT_Extension_Base`, linked by `next`.
            let base = unsafe { &*ext };
            if base.type_ == PJRT_Extension_Type_FFI
                && base.struct_size >= PJRT_FFI_Extension_STRUCT_SIZE
            {
                // SAFETY: type FFI and large enough: a `PJRT_FFI_Extension`.
                return Some(unsafe { &*ext.cast::<PJRT_FFI_Extension>() });
            }
            ext = base.next;
        }
        None
    }

    fn ffi(&self, what: &str) -> Result<&PJRT_FFI_Extension> {
        self.ffi_extension().ok_or_else(|| {
            Error::unimplemented(format!(
                "vendor plugin {} has no FFI extension ({what})",
                self.path
            ))
        })
    }

    /// Register an FFI handler with the vendor (jaxlib's registrations made
    /// through our extension). A repeat of one jaxlib made directly through
    /// the vendor's table is an error there: logged, not passed on.
    pub fn register(&self, r: &crate::cabi::ffi_state::Registration) -> Result<()> {
        let crate::cabi::ffi_state::Registration::Handler {
            target,
            platform,
            api_version,
            handler,
            traits,
        } = r;
        let f = self
            .ffi("register_handler")?
            .register_handler
            .ok_or_else(|| Error::unimplemented("vendor FFI extension: no register_handler"))?;
        let mut a = PJRT_FFI_Register_Handler_Args {
            struct_size: PJRT_FFI_Register_Handler_Args_STRUCT_SIZE,
            target_name: target.as_ptr().cast(),
            target_name_size: target.len(),
            api_version: *api_version,
            handler: *handler as *mut std::ffi::c_void,
            platform_name: platform.as_ptr().cast(),
            platform_name_size: platform.len(),
            traits: *traits,
        };
        // SAFETY: a complete args struct whose strings outlive the call.
        let err = unsafe { f(&mut a) };
        if let Err(e) = self.take_error(err) {
            tracing::debug!(
                target = %String::from_utf8_lossy(target),
                "vendor FFI handler registration: {}",
                e.message
            );
        }
        Ok(())
    }

    /// Register (or check) an FFI type id in the vendor's registry.
    pub fn register_type_id(&self, name: &str, id: i64) -> Result<i64> {
        let f = self
            .ffi("type_id_register")?
            .type_id_register
            .ok_or_else(|| Error::unimplemented("vendor FFI extension: no type_id_register"))?;
        let mut a = PJRT_FFI_TypeID_Register_Args {
            struct_size: PJRT_FFI_TypeID_Register_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            type_name: name.as_ptr().cast(),
            type_name_size: name.len(),
            type_id: id,
        };
        // SAFETY: a complete args struct whose string outlives the call.
        let err = unsafe { f(&mut a) };
        self.take_error(err)
            .map_err(|e| e.context("vendor PJRT_FFI_TypeID_Register"))?;
        Ok(a.type_id)
    }

    /// A vendor execute context holding `user_data` (borrowed: our context
    /// owns it and outlives the run); destroyed with the returned guard.
    pub fn execute_context(
        self: &Arc<Self>,
        user_data: &[crate::cabi::ffi_state::UserData],
    ) -> Result<VendorContext> {
        let add = self
            .ffi("user data")?
            .user_data_add
            .ok_or_else(|| Error::unimplemented("vendor FFI extension: no user_data_add"))?;
        let mut c = PJRT_ExecuteContext_Create_Args {
            struct_size: PJRT_ExecuteContext_Create_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            context: std::ptr::null_mut(),
        };
        self.call(
            "PJRT_ExecuteContext_Create",
            |t| t.PJRT_ExecuteContext_Create,
            &mut c,
        )?;
        let ctx = VendorContext {
            plugin: self.clone(),
            context: CPtr(c.context),
        };
        for u in user_data {
            let mut a = PJRT_FFI_UserData_Add_Args {
                struct_size: PJRT_FFI_UserData_Add_Args_STRUCT_SIZE,
                extension_start: std::ptr::null_mut(),
                context: c.context,
                user_data: u.borrowed(),
            };
            // SAFETY: a complete args struct for the context just created.
            let err = unsafe { add(&mut a) };
            self.take_error(err)
                .map_err(|e| e.context("vendor PJRT_FFI_UserData_Add"))?;
        }
        Ok(ctx)
    }

    /// The vendor's `PJRT_Plugin_Attributes` (e.g. its StableHLO versions).
    pub fn attributes(&self) -> Result<Vec<(String, Value)>> {
        let mut a = PJRT_Plugin_Attributes_Args {
            struct_size: PJRT_Plugin_Attributes_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            attributes: std::ptr::null(),
            num_attributes: 0,
        };
        self.call(
            "PJRT_Plugin_Attributes",
            |t| t.PJRT_Plugin_Attributes,
            &mut a,
        )?;
        crate::cabi::caller::read_named_values(a.attributes, a.num_attributes)
    }

    /// Does the vendor's table reach the slot at byte `offset` of
    /// `PJRT_Api` (older plugins have shorter tables)?
    pub fn has_slot(&self, offset: usize) -> bool {
        offset + std::mem::size_of::<usize>() <= self.api().struct_size
    }

    fn api(&self) -> &PJRT_Api {
        // SAFETY: the table is static in the plugin, which `lib` keeps loaded.
        unsafe { &*self.api.0 }
    }

    /// Call a vendor entry with `args` (whose `struct_size` the caller set).
    pub fn call<A>(
        &self,
        name: &str,
        slot: impl FnOnce(&PJRT_Api) -> Option<unsafe extern "C" fn(*mut A) -> *mut PJRT_Error>,
        args: &mut A,
    ) -> Result<()> {
        let f = slot(self.api()).ok_or_else(|| {
            Error::unimplemented(format!("vendor plugin {} has no {name}", self.path))
        })?;
        // Not while one of our streams captures (the vendor may synchronize
        // the context, which a capture in flight does not survive).
        let gate = xla_vmm_device::capture_gate::foreign();
        // SAFETY: `args` is a fully initialized args struct of the type the
        // slot expects, alive for the call.
        let err = unsafe { f(args) };
        drop(gate);
        self.take_error(err)
            .map_err(|e| e.context(&format!("vendor {name}")))
    }

    /// Our [`Error`] from a vendor `PJRT_Error` (which is destroyed).
    fn take_error(&self, err: *mut PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let api = self.api();
        let mut m = PJRT_Error_Message_Args {
            struct_size: PJRT_Error_Message_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            error: err,
            message: std::ptr::null(),
            message_size: 0,
        };
        let mut c = PJRT_Error_GetCode_Args {
            struct_size: PJRT_Error_GetCode_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            error: err,
            code: PJRT_Error_Code_UNKNOWN,
        };
        // SAFETY: `err` is a live vendor error; these are the vendor's own
        // accessors, called with complete args; the message is copied before
        // the error is destroyed.
        unsafe {
            if let Some(f) = api.PJRT_Error_Message {
                f(&mut m);
            }
            if let Some(f) = api.PJRT_Error_GetCode {
                let e2 = f(&mut c);
                debug_assert!(e2.is_null());
            }
        }
        let msg = crate::cabi::caller::str(m.message, m.message_size, "vendor error message")
            .map(str::to_string)
            .unwrap_or_else(|_| "(unreadable vendor error message)".into());
        let mut d = PJRT_Error_Destroy_Args {
            struct_size: PJRT_Error_Destroy_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            error: err,
        };
        if let Some(f) = api.PJRT_Error_Destroy {
            // SAFETY: destroys the vendor error exactly once, with complete args.
            unsafe { f(&mut d) };
        }
        Err(Error::new(c.code, msg))
    }
}

/// A vendor client used only to compile (and, for programs our runtime
/// rejects, to run them on buffers that stay ours; see `executable.rs`).
pub struct VendorClient {
    pub plugin: Arc<VendorPlugin>,
    pub(crate) client: CPtr<PJRT_Client>,
    /// The vendor's device 0 (views of our buffers are placed on it).
    pub(crate) device: CPtr<PJRT_Device>,
}

/// The job the vendor client is part of: in a multi-process run it gets
/// the same process id, process count and key-value store as ours, so its
/// compiler sees the global devices (its keys do not collide with ours:
/// ours are under `xla_vmm/`).
#[derive(Clone, Copy, Debug, Default)]
pub struct VendorTopology {
    pub node_id: usize,
    pub num_nodes: usize,
    pub kv: Option<crate::cabi::kv::KvStore>,
}

impl VendorClient {
    pub fn create(plugin: Arc<VendorPlugin>, topology: &VendorTopology) -> Result<VendorClient> {
        let mut items = vec![
            ("allocator", Value::Str("platform".into())),
            ("preallocate", Value::Bool(false)),
            ("memory_fraction", Value::Float(0.01)),
        ];
        let multi = topology.num_nodes > 1 && topology.kv.is_some();
        if multi {
            items.push(("node_id", Value::Int(topology.node_id as i64)));
            items.push(("num_nodes", Value::Int(topology.num_nodes as i64)));
        }
        let options = NamedValues::new(items);
        // SAFETY: all-zero is a valid value for this plain C struct.
        let mut a: PJRT_Client_Create_Args = unsafe { std::mem::zeroed() };
        a.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE as usize;
        a.create_options = options.as_ptr();
        a.num_options = options.len();
        if let (true, Some(kv)) = (multi, topology.kv.as_ref()) {
            kv.fill_create_args(&mut a);
        }
        plugin.call("PJRT_Client_Create", |t| t.PJRT_Client_Create, &mut a)?;
        let mut vc = VendorClient {
            plugin,
            client: CPtr(a.client),
            device: CPtr(std::ptr::null_mut()),
        };
        // SAFETY: all-zero is a valid value for this plain C struct.
        let mut d: PJRT_Client_AddressableDevices_Args = unsafe { std::mem::zeroed() };
        d.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE as usize;
        d.client = a.client;
        vc.plugin.call(
            "PJRT_Client_AddressableDevices",
            |t| t.PJRT_Client_AddressableDevices,
            &mut d,
        )?;
        let devices = crate::cabi::caller::slice(
            d.addressable_devices,
            d.num_addressable_devices,
            "vendor devices",
        )?;
        vc.device = CPtr(
            *devices
                .first()
                .ok_or_else(|| Error::not_found("the vendor client has no device"))?,
        );
        Ok(vc)
    }

    /// `PJRT_Client_PlatformVersion` of the vendor client.
    pub fn platform_version(&self) -> Result<String> {
        let mut a = PJRT_Client_PlatformVersion_Args {
            struct_size: PJRT_Client_PlatformVersion_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            client: self.client.0,
            platform_version: std::ptr::null(),
            platform_version_size: 0,
        };
        self.plugin.call(
            "PJRT_Client_PlatformVersion",
            |t| t.PJRT_Client_PlatformVersion,
            &mut a,
        )?;
        Ok(crate::cabi::caller::str(
            a.platform_version,
            a.platform_version_size,
            "platform version",
        )?
        .to_string())
    }
}

impl Drop for VendorClient {
    fn drop(&mut self) {
        let mut a = PJRT_Client_Destroy_Args {
            struct_size: PJRT_Client_Destroy_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            client: self.client.0,
        };
        if let Err(e) = self
            .plugin
            .call("PJRT_Client_Destroy", |t| t.PJRT_Client_Destroy, &mut a)
        {
            tracing::warn!("destroying the vendor client: {e}");
        }
    }
}

/// A vendor `PJRT_ExecuteContext`, destroyed on drop.
pub struct VendorContext {
    plugin: Arc<VendorPlugin>,
    pub context: CPtr<PJRT_ExecuteContext>,
}

impl Drop for VendorContext {
    fn drop(&mut self) {
        let mut d = PJRT_ExecuteContext_Destroy_Args {
            struct_size: PJRT_ExecuteContext_Destroy_Args_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            context: self.context.0,
        };
        if let Err(e) = self.plugin.call(
            "PJRT_ExecuteContext_Destroy",
            |t| t.PJRT_ExecuteContext_Destroy,
            &mut d,
        ) {
            tracing::warn!("{}", e.message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_a_missing_or_foreign_library_is_an_error() {
        let e = VendorPlugin::load(Path::new("/nonexistent/xla_cuda_plugin.so"))
            .err()
            .unwrap();
        assert_eq!(e.code, PJRT_Error_Code_NOT_FOUND);
        assert!(e.message.contains("dlopen"), "{}", e.message);
    }
}

//! XLA's FFI C API (version 0.4, `ffi/src/xla_ffi.rs`), served by the plugin
//! to the FFI handlers of typed custom calls, so that programs with host
//! callbacks (`pure_callback`, `io_callback`, `jax.debug.print`:
//! `xla_ffi_python_gpu_callback`), `buffer_callback` and user FFI targets
//! run on our runtime, not the vendor's.
//!
//! - **Handlers** come from jaxlib: our Python package hands us the GPU
//!   plugin extension's (`ffi_handlers()`, with their instantiate stage, and
//!   `ffi_types()` for their state's deleter) through
//!   [`xla_vmm_ffi_register_handler`] / [`xla_vmm_ffi_register_type`], and
//!   every later `jax.ffi.register_ffi_target` for the GPU platform; a
//!   registration through our PJRT FFI extension lands here too. A
//!   handler's traits (command-buffer compatible or not) are asked of the
//!   handler itself (XLA's metadata call) unless given.
//! - **Binding** ([`Registry`], the runtime's [`CustomCallRegistry`]): once
//!   per call site at load, the attributes are laid out as XLA's call frame
//!   holds them (sorted by name) and the instantiate stage runs, as XLA's
//!   `CustomCallThunk` does at creation; its state (`State_Set`) is kept per
//!   site and deleted with it, by the deleter its type registered.
//! - **Execution** ([`FfiCall`]): one call frame per run: typed buffers, the
//!   attributes, stage EXECUTE, and an invoke context that answers
//!   `Stream_Get` (the runtime's stream), `DeviceOrdinal_Get`,
//!   `InvokeContext_Get` (the user data of this `Execute`'s context: the
//!   Python callables) and `State_Get`. An error a handler returns (made by
//!   our `Error_Create`) becomes the step's error with its message.
//!   What we do not serve (device memory allocation, thread pools, futures,
//!   extensions, handler registration from inside a call) answers
//!   UNIMPLEMENTED / NOT_FOUND, naming itself.
//!
//! Every `extern "C"` function here catches panics: none crosses into the
//! handler's C++.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, LazyLock, Mutex};

use xla_vmm::{FfiAttr, FfiAttrs};
use xla_vmm_ffi::xla_ffi::*;
use xla_vmm_runtime::custom_call::{
    BoundCall, CallBuffer, CallContext, CallScratch, CallSite, CustomCallRegistry, Invocation,
};

/// A registered handler (its stages; traits as the handler declares them).
#[derive(Clone, Copy, Debug)]
pub struct Handler {
    pub execute: XLA_FFI_Handler,
    pub instantiate: Option<XLA_FFI_Handler>,
    pub traits: XLA_FFI_Handler_Traits,
}

type Deleter = unsafe extern "C" fn(*mut c_void);

static HANDLERS: LazyLock<Mutex<HashMap<String, Handler>>> = LazyLock::new(Default::default);
/// FFI types' deleters, by the address of their `XLA_FFI_TypeId` (the
/// static a handler passes to `State_Set`) and by its value.
static TYPES: LazyLock<Mutex<HashMap<TypeKey, Deleter>>> = LazyLock::new(Default::default);

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum TypeKey {
    Address(usize),
    Id(i64),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Register `name`'s handler (a later registration of the same name wins,
/// as in XLA's registry for a re-registration; a different pointer is
/// logged).
pub fn register_handler(name: &str, h: Handler) {
    let mut map = lock(&HANDLERS);
    if let Some(old) = map.get(name) {
        if old.execute as usize != h.execute as usize {
            tracing::debug!(%name, "FFI handler registered again with another function");
        }
    }
    tracing::debug!(%name, traits = h.traits, instantiate = h.instantiate.is_some(), "FFI handler registered");
    map.insert(name.to_string(), h);
}

/// The handler of `name`, if registered.
pub fn handler(name: &str) -> Option<Handler> {
    lock(&HANDLERS).get(name).copied()
}

/// Register an FFI type's deleter (`XLA_FFI_TypeInfo`), by its type id's
/// address and value.
///
/// # Safety
/// `type_id` is null or points to the type's `XLA_FFI_TypeId` static.
unsafe fn register_type(type_id: *const XLA_FFI_TypeId, deleter: Option<Deleter>) {
    let Some(d) = deleter else { return };
    let mut map = lock(&TYPES);
    if !type_id.is_null() {
        map.insert(TypeKey::Address(type_id as usize), d);
        // SAFETY: non-null, the caller's static.
        let id = unsafe { (*type_id).type_id };
        if id != 0 {
            map.insert(TypeKey::Id(id), d);
        }
    }
}

fn deleter(address: usize, id: i64) -> Option<Deleter> {
    let map = lock(&TYPES);
    map.get(&TypeKey::Address(address))
        .or_else(|| map.get(&TypeKey::Id(id)))
        .copied()
}

// ---- errors ----------------------------------------------------------------------

/// What our `XLA_FFI_Error*` points to.
struct FfiError {
    message: CString,
    code: XLA_FFI_Error_Code,
}

fn new_error(code: XLA_FFI_Error_Code, message: impl Into<Vec<u8>>) -> *mut XLA_FFI_Error {
    let mut bytes = message.into();
    bytes.retain(|&b| b != 0);
    let message = CString::new(bytes).unwrap_or_default();
    Box::into_raw(Box::new(FfiError { message, code })).cast()
}

/// Take an error a handler returned: (code, message); the error is freed.
///
/// # Safety
/// `e` was made by [`new_error`] (our `Error_Create`) and is not used after.
unsafe fn take_error(e: *mut XLA_FFI_Error) -> (XLA_FFI_Error_Code, String) {
    // SAFETY: the caller's contract.
    let e = unsafe { Box::from_raw(e.cast::<FfiError>()) };
    (e.code, e.message.to_string_lossy().into_owned())
}

/// Run an API function's body on its args struct: null and short structs
/// and panics become errors.
fn entry<A>(
    name: &str,
    args: *mut c_void,
    min_size: usize,
    body: impl FnOnce(&mut A) -> Result<(), (XLA_FFI_Error_Code, String)>,
) -> *mut XLA_FFI_Error {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if args.is_null() {
            return Err((
                XLA_FFI_Error_Code_INVALID_ARGUMENT,
                format!("{name}: args is null"),
            ));
        }
        // SAFETY: every args struct starts with `size_t struct_size`.
        let size = unsafe { *args.cast::<usize>() };
        if size < min_size {
            return Err((
                XLA_FFI_Error_Code_INVALID_ARGUMENT,
                format!("{name}: args struct_size {size}, expected at least {min_size}"),
            ));
        }
        // SAFETY: non-null, and at least as large as the struct we read.
        body(unsafe { &mut *args.cast::<A>() })
    }));
    match r {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err((code, m))) => new_error(code, m),
        Err(_) => new_error(
            XLA_FFI_Error_Code_INTERNAL,
            format!("{name}: panic in xla-vmm"),
        ),
    }
}

/// The invoke context of one call (what `XLA_FFI_InvokeContext*` points to).
struct InvokeCtx<'a> {
    stream: usize,
    device_ordinal: i32,
    context: Option<&'a dyn CallContext>,
    state: &'a Mutex<Option<State>>,
    /// Device memory for the call (none at instantiation).
    scratch: Option<&'a dyn CallScratch>,
}

/// # Safety
/// `ctx` is null or the invoke context of a call in progress.
unsafe fn invoke_ctx<'a>(
    ctx: *mut XLA_FFI_InvokeContext,
    name: &str,
) -> Result<&'a InvokeCtx<'a>, (XLA_FFI_Error_Code, String)> {
    if ctx.is_null() {
        return Err((
            XLA_FFI_Error_Code_INVALID_ARGUMENT,
            format!("{name}: ctx is null"),
        ));
    }
    // SAFETY: the caller's contract: a frame's ctx is an `InvokeCtx`.
    Ok(unsafe { &*ctx.cast::<InvokeCtx<'a>>() })
}

/// The value of a handler's type id.
///
/// # Safety
/// `p` is null or points to an `XLA_FFI_TypeId`.
unsafe fn type_id_value(p: *const XLA_FFI_TypeId) -> Result<i64, (XLA_FFI_Error_Code, String)> {
    if p.is_null() {
        return Err((
            XLA_FFI_Error_Code_INVALID_ARGUMENT,
            "type_id is null".into(),
        ));
    }
    // SAFETY: non-null (checked); the caller's contract.
    Ok(unsafe { (*p).type_id })
}

fn unimplemented(name: &str) -> (XLA_FFI_Error_Code, String) {
    (
        XLA_FFI_Error_Code_UNIMPLEMENTED,
        format!("{name} is not implemented by xla-vmm's FFI"),
    )
}

unsafe extern "C" fn error_create(args: *mut c_void) -> *mut XLA_FFI_Error {
    // Error_Create returns the error it makes, not an error about itself.
    let mut made = std::ptr::null_mut();
    let e = entry(
        "XLA_FFI_Error_Create",
        args,
        XLA_FFI_Error_Create_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_Error_Create_Args| {
            let message = if a.message.is_null() {
                Vec::new()
            } else {
                // SAFETY: a NUL-terminated C string (the API's contract).
                unsafe { CStr::from_ptr(a.message) }.to_bytes().to_vec()
            };
            made = new_error(a.errc, message);
            Ok(())
        },
    );
    if e.is_null() {
        made
    } else {
        e
    }
}

unsafe extern "C" fn error_get_details(args: *mut c_void) {
    let e = entry(
        "XLA_FFI_Error_GetDetails",
        args,
        XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_Error_GetDetails_Args| {
            if a.error.is_null() {
                return Err((XLA_FFI_Error_Code_INVALID_ARGUMENT, "error is null".into()));
            }
            // SAFETY: errors handed to handlers are ours (`new_error`).
            let err = unsafe { &*a.error.cast::<FfiError>() };
            a.message = err.message.as_ptr();
            a.errc = err.code;
            Ok(())
        },
    );
    if !e.is_null() {
        // SAFETY: just made by `entry`.
        let (_, m) = unsafe { take_error(e) };
        tracing::warn!("XLA_FFI_Error_GetDetails: {m}");
    }
}

unsafe extern "C" fn error_destroy(args: *mut c_void) {
    let e = entry(
        "XLA_FFI_Error_Destroy",
        args,
        XLA_FFI_Error_Destroy_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_Error_Destroy_Args| {
            if !a.error.is_null() {
                // SAFETY: ours, destroyed once (the API's contract).
                drop(unsafe { take_error(a.error) });
            }
            Ok(())
        },
    );
    if !e.is_null() {
        // SAFETY: just made by `entry`.
        let (_, m) = unsafe { take_error(e) };
        tracing::warn!("XLA_FFI_Error_Destroy: {m}");
    }
}

unsafe extern "C" fn handler_register(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_Handler_Register",
        args,
        16,
        |_: &mut [usize; 2]| {
            Err(unimplemented(
                "XLA_FFI_Handler_Register (register through jax.ffi.register_ffi_target)",
            ))
        },
    )
}

unsafe extern "C" fn stream_get(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_Stream_Get",
        args,
        XLA_FFI_Stream_Get_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_Stream_Get_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_Stream_Get") }?;
            a.stream = c.stream as *mut c_void;
            Ok(())
        },
    )
}

static NEXT_TYPE_ID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1 << 40);

unsafe extern "C" fn type_register(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_Type_Register",
        args,
        XLA_FFI_Type_Register_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_Type_Register_Args| {
            // SAFETY: null or the caller's type id (in-out).
            if unsafe { type_id_value(a.type_id) }? == 0 {
                // SAFETY: non-null (just read).
                let id = unsafe { &mut *a.type_id };
                id.type_id = NEXT_TYPE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            // `type_info` lies past the 0.4 STRUCT_SIZE: read only when the
            // caller's struct has it.
            let size = a.struct_size;
            let info = if size >= std::mem::size_of::<XLA_FFI_Type_Register_Args>() {
                a.type_info
            } else {
                std::ptr::null()
            };
            // SAFETY: null or the caller's type info.
            let deleter = unsafe { info.as_ref() }.and_then(|i| i.deleter);
            // SAFETY: the caller's static type id.
            unsafe { register_type(a.type_id, deleter) };
            Ok(())
        },
    )
}

unsafe extern "C" fn invoke_context_get(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_InvokeContext_Get",
        args,
        XLA_FFI_InvokeContext_Get_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_InvokeContext_Get_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_InvokeContext_Get") }?;
            // SAFETY: null or the handler's type id.
            let id = unsafe { type_id_value(a.type_id) }?;
            match c.context.and_then(|x| x.user_data(id)) {
                Some(d) => {
                    a.data = d as *mut c_void;
                    Ok(())
                }
                None => Err((
                    XLA_FFI_Error_Code_NOT_FOUND,
                    format!("no user data of FFI type id {id} in this execute context"),
                )),
            }
        },
    )
}

/// A call site's state (`State_Set` at instantiation).
#[derive(Debug)]
struct State {
    type_address: usize,
    type_id: i64,
    data: usize,
}

unsafe extern "C" fn state_set(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_State_Set",
        args,
        XLA_FFI_State_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_State_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_State_Set") }?;
            if a.stage != XLA_FFI_ExecutionStage_INSTANTIATE {
                return Err(unimplemented(
                    "XLA_FFI_State_Set at a stage other than instantiate",
                ));
            }
            // SAFETY: null or the handler's type id.
            let type_id = unsafe { type_id_value(a.type_id) }?;
            let mut slot = lock(c.state);
            if slot.is_some() {
                return Err((
                    XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "the instantiate state is already set".into(),
                ));
            }
            *slot = Some(State {
                type_address: a.type_id as usize,
                type_id,
                data: a.state as usize,
            });
            Ok(())
        },
    )
}

unsafe extern "C" fn state_get(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_State_Get",
        args,
        XLA_FFI_State_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_State_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_State_Get") }?;
            // SAFETY: null or the handler's type id.
            let id = unsafe { type_id_value(a.type_id) }?;
            match &*lock(c.state) {
                Some(s) if s.type_id == id || s.type_address == a.type_id as usize => {
                    a.state = s.data as *mut c_void;
                    Ok(())
                }
                Some(s) => Err((
                    XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    format!("the state is of FFI type id {}, not {id}", s.type_id),
                )),
                None => Err((
                    XLA_FFI_Error_Code_NOT_FOUND,
                    "this call site has no state".into(),
                )),
            }
        },
    )
}

macro_rules! not_served {
    ($f:ident, $name:literal) => {
        unsafe extern "C" fn $f(args: *mut c_void) -> *mut XLA_FFI_Error {
            entry($name, args, 16, |_: &mut [usize; 2]| {
                Err(unimplemented($name))
            })
        }
    };
}
unsafe extern "C" fn device_memory_allocate(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_DeviceMemory_Allocate",
        args,
        XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_DeviceMemory_Allocate_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_DeviceMemory_Allocate") }?;
            let scratch = c
                .scratch
                .ok_or_else(|| unimplemented("XLA_FFI_DeviceMemory_Allocate at instantiation"))?;
            let p = scratch
                .allocate(a.size as u64, a.alignment as u64)
                .map_err(|e| {
                    (
                        XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                        format!("XLA_FFI_DeviceMemory_Allocate of {} bytes: {e}", a.size),
                    )
                })?;
            a.data = p.0 as *mut c_void;
            Ok(())
        },
    )
}

unsafe extern "C" fn device_memory_free(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_DeviceMemory_Free",
        args,
        XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_DeviceMemory_Free_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_DeviceMemory_Free") }?;
            let scratch = c
                .scratch
                .ok_or_else(|| unimplemented("XLA_FFI_DeviceMemory_Free at instantiation"))?;
            scratch
                .free(xla_vmm_device::DevicePtr(a.data as u64))
                .map_err(|e| {
                    (
                        XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        format!("XLA_FFI_DeviceMemory_Free: {e}"),
                    )
                })
        },
    )
}
not_served!(thread_pool_schedule, "XLA_FFI_ThreadPool_Schedule");
not_served!(thread_pool_num_threads, "XLA_FFI_ThreadPool_NumThreads");
not_served!(future_create, "XLA_FFI_Future_Create");
not_served!(future_set_available, "XLA_FFI_Future_SetAvailable");
not_served!(future_set_error, "XLA_FFI_Future_SetError");

unsafe extern "C" fn run_id_get(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_RunId_Get",
        args,
        XLA_FFI_RunId_Get_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_RunId_Get_Args| {
            a.run_id = 0;
            Ok(())
        },
    )
}

unsafe extern "C" fn device_ordinal_get(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_DeviceOrdinal_Get",
        args,
        XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_DeviceOrdinal_Get_Args| {
            // SAFETY: the frame's ctx.
            let c = unsafe { invoke_ctx(a.ctx, "XLA_FFI_DeviceOrdinal_Get") }?;
            a.device_ordinal = c.device_ordinal;
            Ok(())
        },
    )
}

unsafe extern "C" fn find_extension(args: *mut c_void) -> *mut XLA_FFI_Error {
    entry(
        "XLA_FFI_InvokeContext_FindExtension",
        args,
        XLA_FFI_InvokeContext_FindExtension_Args_STRUCT_SIZE,
        |a: &mut XLA_FFI_InvokeContext_FindExtension_Args| {
            a.extension = std::ptr::null();
            Err((
                XLA_FFI_Error_Code_NOT_FOUND,
                format!(
                    "xla-vmm's FFI has no extension of type {}",
                    a.extension_type
                ),
            ))
        },
    )
}

/// The table, immutable: function pointers only.
struct SyncApi(XLA_FFI_Api);
// SAFETY: never written after construction; its pointers are null or
// function pointers.
unsafe impl Sync for SyncApi {}

static API: SyncApi = SyncApi(XLA_FFI_Api {
    struct_size: XLA_FFI_Api_STRUCT_SIZE,
    extension_start: std::ptr::null_mut(),
    api_version: XLA_FFI_Api_Version {
        struct_size: XLA_FFI_Api_Version_STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        major_version: XLA_FFI_API_MAJOR,
        minor_version: XLA_FFI_API_MINOR,
    },
    internal_api: std::ptr::null(),
    XLA_FFI_Error_Create: Some(error_create),
    XLA_FFI_Error_GetDetails: Some(error_get_details),
    XLA_FFI_Error_Destroy: Some(error_destroy),
    XLA_FFI_Handler_Register: Some(handler_register),
    XLA_FFI_Stream_Get: Some(stream_get),
    XLA_FFI_Type_Register: Some(type_register),
    XLA_FFI_InvokeContext_Get: Some(invoke_context_get),
    XLA_FFI_State_Set: Some(state_set),
    XLA_FFI_State_Get: Some(state_get),
    XLA_FFI_DeviceMemory_Allocate: Some(device_memory_allocate),
    XLA_FFI_DeviceMemory_Free: Some(device_memory_free),
    XLA_FFI_ThreadPool_Schedule: Some(thread_pool_schedule),
    XLA_FFI_ThreadPool_NumThreads: Some(thread_pool_num_threads),
    XLA_FFI_Future_Create: Some(future_create),
    XLA_FFI_Future_SetAvailable: Some(future_set_available),
    XLA_FFI_Future_SetError: Some(future_set_error),
    XLA_FFI_RunId_Get: Some(run_id_get),
    XLA_FFI_DeviceOrdinal_Get: Some(device_ordinal_get),
    XLA_FFI_InvokeContext_FindExtension: Some(find_extension),
});

/// Our API table (for tests and the metadata call).
pub fn api() -> *const XLA_FFI_Api {
    &API.0
}

// ---- attributes as the call frame holds them ---------------------------------------

/// A call site's attributes laid out as `XLA_FFI_Attrs` (names sorted),
/// with every pointer into storage this value owns.
struct CAttrs {
    root: XLA_FFI_Attrs,
    /// Owned storage the pointers point into (never moved out of its box).
    _keep: Vec<Box<dyn std::any::Any>>,
}

// SAFETY: immutable after construction; the raw pointers point into the
// boxed storage it owns, read only by handlers during a call.
unsafe impl Send for CAttrs {}
// SAFETY: as above: shared reads only.
unsafe impl Sync for CAttrs {}

/// `bytes` in 8-byte aligned storage (scalars and arrays are read as their
/// type, e.g. `*(uint64_t*)value`).
fn aligned(bytes: &[u8], keep: &mut Vec<Box<dyn std::any::Any>>) -> *mut c_void {
    let mut words = vec![0u64; bytes.len().div_ceil(8).max(1)].into_boxed_slice();
    // SAFETY: `words` has at least `bytes.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len())
    };
    let p = words.as_mut_ptr().cast::<c_void>();
    keep.push(Box::new(words));
    p
}

fn boxed<T: 'static>(v: T, keep: &mut Vec<Box<dyn std::any::Any>>) -> *mut c_void {
    let mut b = Box::new(v);
    let p = (&mut *b as *mut T).cast::<c_void>();
    keep.push(b);
    p
}

fn byte_span(s: &[u8], keep: &mut Vec<Box<dyn std::any::Any>>) -> XLA_FFI_ByteSpan {
    let bytes: Box<[u8]> = s.into();
    let span = XLA_FFI_ByteSpan {
        ptr: bytes.as_ptr().cast::<c_char>(),
        len: bytes.len(),
    };
    keep.push(Box::new(bytes));
    span
}

fn lay_out(attrs: &FfiAttrs, keep: &mut Vec<Box<dyn std::any::Any>>) -> XLA_FFI_Attrs {
    let mut types = Vec::with_capacity(attrs.len());
    let mut names = Vec::with_capacity(attrs.len());
    let mut values = Vec::with_capacity(attrs.len());
    for (name, a) in attrs {
        let span = byte_span(name.as_bytes(), keep);
        names.push(boxed(span, keep).cast::<XLA_FFI_ByteSpan>());
        let (t, v) = match a {
            FfiAttr::Scalar(s) => {
                let value = aligned(&s.bytes(), keep);
                let scalar = XLA_FFI_Scalar {
                    dtype: s.dtype(),
                    value,
                };
                (XLA_FFI_AttrType_SCALAR, boxed(scalar, keep))
            }
            FfiAttr::Array(arr) => {
                let (dtype, size, bytes) = arr.parts();
                let data = aligned(&bytes, keep);
                let array = XLA_FFI_Array { dtype, size, data };
                (XLA_FFI_AttrType_ARRAY, boxed(array, keep))
            }
            FfiAttr::Str(s) => {
                let span = byte_span(s, keep);
                (XLA_FFI_AttrType_STRING, boxed(span, keep))
            }
            FfiAttr::Dict(d) => {
                let inner = lay_out(d, keep);
                (XLA_FFI_AttrType_DICTIONARY, boxed(inner, keep))
            }
        };
        types.push(t);
        values.push(v);
    }
    let mut types = types.into_boxed_slice();
    let mut names = names.into_boxed_slice();
    let mut values = values.into_boxed_slice();
    let c = XLA_FFI_Attrs {
        struct_size: XLA_FFI_Attrs_STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        size: attrs.len() as i64,
        types: types.as_mut_ptr(),
        names: names.as_mut_ptr(),
        attrs: values.as_mut_ptr(),
    };
    keep.push(Box::new(types));
    keep.push(Box::new(names));
    keep.push(Box::new(values));
    c
}

impl CAttrs {
    fn new(attrs: &FfiAttrs) -> Self {
        let mut keep = Vec::new();
        let root = lay_out(attrs, &mut keep);
        CAttrs { root, _keep: keep }
    }
}

// ---- calls ------------------------------------------------------------------------

/// Buffers as `XLA_FFI_Buffer`s (their dims owned by `CallBuffer`s).
fn c_buffers(v: &[CallBuffer]) -> Vec<XLA_FFI_Buffer> {
    v.iter()
        .map(|b| XLA_FFI_Buffer {
            struct_size: XLA_FFI_Buffer_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            dtype: b.dtype,
            data: b.data.0 as *mut c_void,
            rank: b.dims.len() as i64,
            dims: b.dims.as_ptr().cast_mut(),
        })
        .collect()
}

/// Call `handler` with one frame; its error's message on failure.
fn invoke(
    handler: XLA_FFI_Handler,
    stage: XLA_FFI_ExecutionStage,
    ctx: &InvokeCtx<'_>,
    attrs: &XLA_FFI_Attrs,
    args: &[CallBuffer],
    rets: &[CallBuffer],
) -> Result<(), String> {
    let ctx = (ctx as *const InvokeCtx<'_>).cast_mut().cast();
    call_frame(handler, stage, ctx, std::ptr::null_mut(), attrs, args, rets)
}

/// One call frame of XLA's layout (`extension` null, or XLA's metadata
/// request), and the call.
fn call_frame(
    handler: XLA_FFI_Handler,
    stage: XLA_FFI_ExecutionStage,
    ctx: *mut XLA_FFI_InvokeContext,
    extension: *mut XLA_FFI_InternalExtension,
    attrs: &XLA_FFI_Attrs,
    args: &[CallBuffer],
    rets: &[CallBuffer],
) -> Result<(), String> {
    let mut a = c_buffers(args);
    let mut r = c_buffers(rets);
    let mut a_ptrs: Vec<*mut c_void> = a
        .iter_mut()
        .map(|b| (b as *mut XLA_FFI_Buffer).cast())
        .collect();
    let mut r_ptrs: Vec<*mut c_void> = r
        .iter_mut()
        .map(|b| (b as *mut XLA_FFI_Buffer).cast())
        .collect();
    let mut a_types = vec![XLA_FFI_ArgType_BUFFER; a.len()];
    let mut r_types = vec![XLA_FFI_RetType_BUFFER; r.len()];
    let mut frame = XLA_FFI_CallFrame {
        struct_size: XLA_FFI_CallFrame_STRUCT_SIZE,
        extension_start: extension,
        api: api(),
        ctx,
        stage,
        args: XLA_FFI_Args {
            struct_size: XLA_FFI_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            size: a.len() as i64,
            types: a_types.as_mut_ptr(),
            args: a_ptrs.as_mut_ptr(),
        },
        rets: XLA_FFI_Rets {
            struct_size: XLA_FFI_Rets_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            size: r.len() as i64,
            types: r_types.as_mut_ptr(),
            rets: r_ptrs.as_mut_ptr(),
        },
        attrs: *attrs,
        future: std::ptr::null_mut(),
    };
    // SAFETY: a complete call frame whose every pointer outlives the call;
    // the handler is a registered `XLA_FFI_Handler`.
    let err = unsafe { handler(&mut frame) };
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: handlers make errors with our `Error_Create`.
    let (code, m) = unsafe { take_error(err) };
    Err(format!("{m} (XLA FFI error code {code})"))
}

/// The handler's traits, from XLA's metadata call (0 when it does not
/// answer one).
pub fn query_traits(handler: XLA_FFI_Handler) -> XLA_FFI_Handler_Traits {
    let mut md = XLA_FFI_Metadata {
        struct_size: XLA_FFI_Metadata_STRUCT_SIZE,
        api_version: XLA_FFI_Api_Version {
            struct_size: XLA_FFI_Api_Version_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            major_version: 0,
            minor_version: 0,
        },
        traits: 0,
        state_type_id: XLA_FFI_TypeId::default(),
    };
    let mut ext = XLA_FFI_Metadata_Extension {
        extension_base: XLA_FFI_InternalExtension {
            struct_size: XLA_FFI_Metadata_Extension_STRUCT_SIZE,
            type_: XLA_FFI_Extension_Metadata,
            next: std::ptr::null_mut(),
        },
        metadata: &mut md,
    };
    let empty = CAttrs::new(&Vec::new());
    let extension = (&mut ext as *mut XLA_FFI_Metadata_Extension).cast();
    let asked = call_frame(
        handler,
        XLA_FFI_ExecutionStage_EXECUTE,
        std::ptr::null_mut(),
        extension,
        &empty.root,
        &[],
        &[],
    );
    if let Err(m) = asked {
        tracing::debug!("FFI metadata call: {m}; traits taken as 0");
        return 0;
    }
    md.traits
}

/// A call site bound to its handler.
pub struct FfiCall {
    target: String,
    handler: Handler,
    attrs: CAttrs,
    state: Mutex<Option<State>>,
}

impl std::fmt::Debug for FfiCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FfiCall")
            .field("target", &self.target)
            .field("traits", &self.handler.traits)
            .finish()
    }
}

impl BoundCall for FfiCall {
    fn graph_compatible(&self) -> bool {
        self.handler.traits & XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE != 0
    }

    fn execute(&self, call: &Invocation<'_>) -> Result<(), String> {
        let ctx = InvokeCtx {
            stream: call.stream,
            device_ordinal: call.device_ordinal as i32,
            context: call.context,
            state: &self.state,
            scratch: Some(call.scratch),
        };
        invoke(
            self.handler.execute,
            XLA_FFI_ExecutionStage_EXECUTE,
            &ctx,
            &self.attrs.root,
            call.args,
            call.rets,
        )
    }
}

impl Drop for FfiCall {
    fn drop(&mut self) {
        let Some(s) = self
            .state
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        match deleter(s.type_address, s.type_id) {
            // SAFETY: the state the handler set, deleted once by its type's
            // deleter.
            Some(d) => unsafe { d(s.data as *mut c_void) },
            None => tracing::debug!(target = %self.target,
                "FFI state of an unregistered type (id {}) is not freed", s.type_id),
        }
    }
}

/// The plugin's handlers, as the runtime binds call sites.
#[derive(Clone, Copy, Debug, Default)]
pub struct Registry;

impl CustomCallRegistry for Registry {
    fn bind(&self, site: &CallSite<'_>) -> Result<Option<Arc<dyn BoundCall>>, String> {
        let Some(h) = handler(site.target) else {
            // Pallas Mosaic GPU kernels: their handler never reaches us,
            // the vendor's compiler does (crate::xla_ffi::mosaic).
            if site.target == crate::xla_ffi::mosaic::TARGET {
                return crate::xla_ffi::mosaic::bind(site);
            }
            return Ok(None);
        };
        let call = FfiCall {
            target: site.target.to_string(),
            handler: h,
            attrs: CAttrs::new(site.attributes),
            state: Mutex::new(None),
        };
        if let Some(inst) = h.instantiate {
            let ctx = InvokeCtx {
                stream: 0,
                device_ordinal: 0,
                context: None,
                state: &call.state,
                scratch: None,
            };
            invoke(
                inst,
                XLA_FFI_ExecutionStage_INSTANTIATE,
                &ctx,
                &call.attrs.root,
                &[],
                &[],
            )
            .map_err(|e| format!("its instantiate stage: {e}"))?;
        }
        Ok(Some(Arc::new(call)))
    }

    fn bind_host_program(
        &self,
        program: &xla_vmm::HostExecuteStartThunk,
        name: &str,
    ) -> Result<Option<Arc<dyn xla_vmm_runtime::HostProgram>>, String> {
        Ok(crate::xla_ffi::host_compute::bind(program, name))
    }
}

// ---- registration from Python (ctypes) -------------------------------------------

/// Register an FFI handler for our runtime: `execute` (required) and
/// `instantiate` (or null) are `XLA_FFI_Handler` pointers, as jaxlib's
/// `ffi_handlers()` capsules hold them; `traits` < 0 asks the handler.
/// Returns null, or an error message to free with `xla_vmm_stats_free`.
///
/// # Safety
/// `name` points to `name_len` bytes; the handlers are XLA FFI handlers
/// that stay loaded for the life of the process.
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[no_mangle]
pub unsafe extern "C" fn xla_vmm_ffi_register_handler(
    name: *const c_char,
    name_len: usize,
    execute: *mut c_void,
    instantiate: *mut c_void,
    traits: i64,
) -> *mut c_char {
    crate::cabi::caller::exported(|| {
        if name.is_null() || execute.is_null() || name_len > 4096 {
            return Err(
                "name or execute handler is null, or the name is over 4096 bytes".to_string(),
            );
        }
        // SAFETY: `name_len` bytes at `name` (the caller's contract).
        let bytes = unsafe { std::slice::from_raw_parts(name.cast::<u8>(), name_len) };
        let name = std::str::from_utf8(bytes).map_err(|_| "the name is not UTF-8".to_string())?;
        // SAFETY: non-null XLA FFI handler pointers (the caller's contract).
        let execute: XLA_FFI_Handler = unsafe { std::mem::transmute(execute) };
        let instantiate: Option<XLA_FFI_Handler> =
            // SAFETY: as above, or null (`None`).
            (!instantiate.is_null()).then(|| unsafe { std::mem::transmute(instantiate) });
        let traits = if traits < 0 {
            query_traits(execute)
        } else {
            traits as u32
        };
        register_handler(
            name,
            Handler {
                execute,
                instantiate,
                traits,
            },
        );
        Ok(())
    })
}

/// Register an FFI type's deleter: `type_id` points to its `XLA_FFI_TypeId`,
/// `type_info` to its `XLA_FFI_TypeInfo` (jaxlib's `ffi_types()` capsules).
/// Returns null, or an error message to free with `xla_vmm_stats_free`.
///
/// # Safety
/// Both point to the type's statics, alive for the life of the process.
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[no_mangle]
pub unsafe extern "C" fn xla_vmm_ffi_register_type(
    type_id: *const c_void,
    type_info: *const c_void,
) -> *mut c_char {
    crate::cabi::caller::exported(|| {
        if type_id.is_null() || type_info.is_null() {
            return Err("type_id or type_info is null".to_string());
        }
        // SAFETY: the type's `XLA_FFI_TypeInfo` (the caller's contract).
        let info = unsafe { &*type_info.cast::<XLA_FFI_TypeInfo>() };
        if info.struct_size != XLA_FFI_TypeInfo_STRUCT_SIZE {
            return Err(format!(
                "type_info struct_size {} (XLA FFI 0.4's XLA_FFI_TypeInfo is {XLA_FFI_TypeInfo_STRUCT_SIZE}); \
                 its states would not be freed",
                info.struct_size
            ));
        }
        // SAFETY: the type's `XLA_FFI_TypeId` static.
        unsafe { register_type(type_id.cast(), info.deleter) };
        Ok(())
    })
}

#[cfg(test)]
// The test handlers are C-side code: every block dereferences the frame or
// the args the API hands them, as a handler does.
#[allow(clippy::undocumented_unsafe_blocks)]
mod tests {
    //! The C side: handlers written against the 0.4 ABI (as jaxlib's are),
    //! registered through the exported functions, bound and run.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use xla_vmm::{FfiArray, FfiScalar};
    use xla_vmm_device::DevicePtr;

    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    static STATE_TYPE: XLA_FFI_TypeId = XLA_FFI_TypeId { type_id: 77 };
    struct SyncInfo(XLA_FFI_TypeInfo);
    // SAFETY: immutable; a null pointer and a function pointer.
    unsafe impl Sync for SyncInfo {}
    static STATE_INFO: SyncInfo = SyncInfo(XLA_FFI_TypeInfo {
        struct_size: XLA_FFI_TypeInfo_STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        deleter: Some(delete_state),
    });
    static USER_TYPE: XLA_FFI_TypeId = XLA_FFI_TypeId { type_id: 42 };

    unsafe extern "C" fn delete_state(p: *mut c_void) {
        drop(unsafe { Box::from_raw(p.cast::<u64>()) });
        DELETED.fetch_add(1, Ordering::SeqCst);
    }

    /// Call table function `f` on `args`; its error's message.
    unsafe fn call(f: XLA_FFI_Fn, args: *mut c_void) -> Result<(), String> {
        let e = unsafe { f.unwrap()(args) };
        if e.is_null() {
            return Ok(());
        }
        let api = unsafe { &*api() };
        let mut d = XLA_FFI_Error_GetDetails_Args {
            struct_size: XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            error: e,
            message: std::ptr::null(),
            errc: 0,
        };
        unsafe { api.XLA_FFI_Error_GetDetails.unwrap()(&mut d as *mut _ as *mut c_void) };
        let m = unsafe { CStr::from_ptr(d.message) }
            .to_string_lossy()
            .into_owned();
        let mut x = XLA_FFI_Error_Destroy_Args {
            struct_size: XLA_FFI_Error_Destroy_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            error: e,
        };
        unsafe { api.XLA_FFI_Error_Destroy.unwrap()(&mut x as *mut _ as *mut c_void) };
        Err(format!("{m} [{}]", d.errc))
    }

    fn fail(api: &XLA_FFI_Api, m: &CStr) -> *mut XLA_FFI_Error {
        let mut a = XLA_FFI_Error_Create_Args {
            struct_size: XLA_FFI_Error_Create_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            message: m.as_ptr(),
            errc: XLA_FFI_Error_Code_INVALID_ARGUMENT,
        };
        unsafe { api.XLA_FFI_Error_Create.unwrap()(&mut a as *mut _ as *mut c_void) }
    }

    /// Instantiate: sets a `u64` state of 1000 + attribute `index`.
    unsafe extern "C" fn instantiate(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
        let f = unsafe { &*frame };
        let api = unsafe { &*f.api };
        assert_eq!(f.stage, XLA_FFI_ExecutionStage_INSTANTIATE);
        let index = attr_u64(f, "index");
        let mut a = XLA_FFI_State_Args {
            struct_size: XLA_FFI_State_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            stage: XLA_FFI_ExecutionStage_INSTANTIATE,
            type_id: (&STATE_TYPE as *const XLA_FFI_TypeId).cast_mut(),
            state: Box::into_raw(Box::new(1000 + index)).cast(),
        };
        match unsafe { call(api.XLA_FFI_State_Set, &mut a as *mut _ as *mut c_void) } {
            Ok(()) => std::ptr::null_mut(),
            Err(m) => fail(api, &CString::new(m).unwrap()),
        }
    }

    /// The u64 scalar attribute `name` (attributes found by position, as
    /// XLA's handlers do, after checking the name).
    fn attr_u64(f: &XLA_FFI_CallFrame, name: &str) -> u64 {
        let attrs = &f.attrs;
        for i in 0..attrs.size as usize {
            let n = unsafe { &**attrs.names.add(i) };
            let n = unsafe { std::slice::from_raw_parts(n.ptr.cast::<u8>(), n.len) };
            if n == name.as_bytes() {
                assert_eq!(unsafe { *attrs.types.add(i) }, XLA_FFI_AttrType_SCALAR);
                let s = unsafe { &*(*attrs.attrs.add(i)).cast::<XLA_FFI_Scalar>() };
                assert_eq!(s.dtype, xla_vmm::ffi_dtype::U64);
                return unsafe { *s.value.cast::<u64>() };
            }
        }
        panic!("no attribute {name}")
    }

    /// Execute: records the frame as it sees it; fails when attribute
    /// `index` is 13. Answers XLA's metadata call with traits 1.
    unsafe extern "C" fn execute(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
        let f = unsafe { &mut *frame };
        let api = unsafe { &*f.api };
        if !f.extension_start.is_null() {
            let ext = unsafe { &*f.extension_start.cast::<XLA_FFI_Metadata_Extension>() };
            assert_eq!(ext.extension_base.type_, XLA_FFI_Extension_Metadata);
            unsafe { (*ext.metadata).traits = XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE };
            return std::ptr::null_mut();
        }
        assert_eq!(f.struct_size, 168);
        let index = attr_u64(f, "index");
        if index == 13 {
            return fail(api, c"unlucky index");
        }
        let names: Vec<String> = (0..f.attrs.size as usize)
            .map(|i| {
                let n = unsafe { &**f.attrs.names.add(i) };
                String::from_utf8_lossy(unsafe {
                    std::slice::from_raw_parts(n.ptr.cast::<u8>(), n.len)
                })
                .into_owned()
            })
            .collect();
        let mut s = XLA_FFI_Stream_Get_Args {
            struct_size: XLA_FFI_Stream_Get_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            stream: std::ptr::null_mut(),
        };
        unsafe { call(api.XLA_FFI_Stream_Get, &mut s as *mut _ as *mut c_void) }.unwrap();
        let mut d = XLA_FFI_DeviceOrdinal_Get_Args {
            struct_size: XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            device_ordinal: -1,
        };
        unsafe {
            call(
                api.XLA_FFI_DeviceOrdinal_Get,
                &mut d as *mut _ as *mut c_void,
            )
        }
        .unwrap();
        let mut st = XLA_FFI_State_Args {
            struct_size: XLA_FFI_State_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            stage: XLA_FFI_ExecutionStage_INSTANTIATE,
            type_id: (&STATE_TYPE as *const XLA_FFI_TypeId).cast_mut(),
            state: std::ptr::null_mut(),
        };
        let state = unsafe { call(api.XLA_FFI_State_Get, &mut st as *mut _ as *mut c_void) }
            .map(|()| unsafe { *st.state.cast::<u64>() });
        let mut u = XLA_FFI_InvokeContext_Get_Args {
            struct_size: XLA_FFI_InvokeContext_Get_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            type_id: (&USER_TYPE as *const XLA_FFI_TypeId).cast_mut(),
            data: std::ptr::null_mut(),
        };
        let user = unsafe {
            call(
                api.XLA_FFI_InvokeContext_Get,
                &mut u as *mut _ as *mut c_void,
            )
        }
        .map(|()| u.data as usize);
        let mut m = XLA_FFI_DeviceMemory_Allocate_Args {
            struct_size: XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            size: 64,
            alignment: 16,
            data: std::ptr::null_mut(),
        };
        unsafe {
            call(
                api.XLA_FFI_DeviceMemory_Allocate,
                &mut m as *mut _ as *mut c_void,
            )
        }
        .unwrap();
        let mut fr = XLA_FFI_DeviceMemory_Free_Args {
            struct_size: XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            size: 64,
            data: m.data,
        };
        unsafe {
            call(
                api.XLA_FFI_DeviceMemory_Free,
                &mut fr as *mut _ as *mut c_void,
            )
        }
        .unwrap();
        let bufs = |n: i64, p: *mut *mut c_void| -> Vec<(i32, u64, Vec<i64>)> {
            (0..n as usize)
                .map(|i| {
                    let b = unsafe { &*(*p.add(i)).cast::<XLA_FFI_Buffer>() };
                    let dims = unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) };
                    (b.dtype, b.data as u64, dims.to_vec())
                })
                .collect()
        };
        SEEN.lock().unwrap().push(format!(
            "attrs={names:?} stream={:#x} scratch={:#x} device={} state={state:?} user={user:?} args={:?} rets={:?}",
            s.stream as usize,
            m.data as usize,
            d.device_ordinal,
            bufs(f.args.size, f.args.args),
            bufs(f.rets.size, f.rets.rets),
        ));
        std::ptr::null_mut()
    }

    /// Hands out `0x5000 + bytes`; frees only that.
    struct TestScratch;
    impl CallScratch for TestScratch {
        fn allocate(&self, bytes: u64, _alignment: u64) -> Result<DevicePtr, String> {
            Ok(DevicePtr(0x5000 + bytes))
        }
        fn free(&self, ptr: DevicePtr) -> Result<(), String> {
            (ptr.0 >= 0x5000)
                .then_some(())
                .ok_or_else(|| "not ours".into())
        }
    }

    struct Ctx;
    impl CallContext for Ctx {
        fn user_data(&self, type_id: i64) -> Option<usize> {
            (type_id == 42).then_some(0xbeef)
        }
    }

    fn site_attrs(index: u64) -> FfiAttrs {
        vec![
            ("dims".into(), FfiAttr::Array(FfiArray::S64(vec![2, 3]))),
            ("index".into(), FfiAttr::Scalar(FfiScalar::U64(index))),
            ("name".into(), FfiAttr::Str(b"cb".to_vec())),
            (
                "nested".into(),
                FfiAttr::Dict(vec![("x".into(), FfiAttr::Scalar(FfiScalar::Pred(true)))]),
            ),
        ]
    }

    fn register(name: &str, with_instantiate: bool) {
        let inst = if with_instantiate {
            instantiate as *mut c_void
        } else {
            std::ptr::null_mut()
        };
        let e = unsafe {
            xla_vmm_ffi_register_handler(
                name.as_ptr().cast(),
                name.len(),
                execute as *mut c_void,
                inst,
                -1,
            )
        };
        assert!(e.is_null());
    }

    #[test]
    fn handlers_run_with_xla_s_call_frame_context_and_state() {
        let e = unsafe {
            xla_vmm_ffi_register_type(
                (&STATE_TYPE as *const XLA_FFI_TypeId).cast(),
                (&STATE_INFO.0 as *const XLA_FFI_TypeInfo).cast(),
            )
        };
        assert!(e.is_null());
        register("test_cb", true);
        // The metadata call gave the traits.
        assert_eq!(handler("test_cb").unwrap().traits, 1);
        let attrs = site_attrs(5);
        let site = CallSite {
            target: "test_cb",
            name: "custom-call.1",
            attributes: &attrs,
            device_ordinal: 0,
        };
        let call = Registry.bind(&site).unwrap().unwrap();
        assert!(call.graph_compatible());
        let args = [
            CallBuffer {
                dtype: 11,
                data: DevicePtr(0x1000),
                dims: vec![2, 3],
            },
            CallBuffer {
                dtype: 17,
                data: DevicePtr::NULL,
                dims: vec![],
            },
        ];
        let rets = [CallBuffer {
            dtype: 4,
            data: DevicePtr(0x2000),
            dims: vec![],
        }];
        let inv = Invocation {
            stream: 0xabc,
            device_ordinal: 3,
            args: &args,
            rets: &rets,
            context: Some(&Ctx),
            scratch: &TestScratch,
        };
        call.execute(&inv).unwrap();
        let seen = SEEN.lock().unwrap().pop().unwrap();
        assert_eq!(
            seen,
            "attrs=[\"dims\", \"index\", \"name\", \"nested\"] stream=0xabc scratch=0x5040 device=3 \
             state=Ok(1005) user=Ok(48879) args=[(11, 4096, [2, 3]), (17, 0, [])] \
             rets=[(4, 8192, [])]"
        );
        // Without a context: the handler's InvokeContext_Get is NOT_FOUND.
        let inv = Invocation {
            context: None,
            ..inv
        };
        call.execute(&inv).unwrap();
        let seen = SEEN.lock().unwrap().pop().unwrap();
        assert!(
            seen.contains("user=Err(\"no user data of FFI type id 42") && seen.contains("[5]"),
            "{seen}"
        );
        // The state goes with the call site, by its type's deleter.
        let before = DELETED.load(Ordering::SeqCst);
        drop(call);
        assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn handler_errors_and_unserved_functions_are_errors_not_crashes() {
        register("test_cb_plain", false);
        let attrs = site_attrs(13);
        let site = CallSite {
            target: "test_cb_plain",
            name: "custom-call.2",
            attributes: &attrs,
            device_ordinal: 0,
        };
        let call = Registry.bind(&site).unwrap().unwrap();
        let inv = Invocation {
            stream: 0,
            device_ordinal: 0,
            args: &[],
            rets: &[],
            context: None,
            scratch: &TestScratch,
        };
        let e = call.execute(&inv).unwrap_err();
        assert!(e.contains("unlucky index") && e.contains("code 3"), "{e}");
        // No state without an instantiate stage.
        let attrs = site_attrs(1);
        let site = CallSite {
            attributes: &attrs,
            ..site
        };
        Registry
            .bind(&site)
            .unwrap()
            .unwrap()
            .execute(&inv)
            .unwrap();
        let seen = SEEN.lock().unwrap().pop().unwrap();
        assert!(
            seen.contains("state=Err(\"this call site has no state"),
            "{seen}"
        );
        // Unknown targets are not bound; bad registrations are refused.
        let site = CallSite {
            target: "nobody",
            ..site
        };
        assert!(Registry.bind(&site).unwrap().is_none());
        let e = unsafe {
            xla_vmm_ffi_register_handler(
                c"x".as_ptr(),
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        assert!(!e.is_null());
        unsafe { crate::cabi::stats::xla_vmm_stats_free(e) };
        // Functions we do not serve answer an error naming themselves;
        // null and short args too.
        let api = unsafe { &*api() };
        let mut args = [16usize, 0, 0, 0, 0, 0];
        let e = unsafe { call_fn(api.XLA_FFI_ThreadPool_Schedule, args.as_mut_ptr().cast()) }
            .unwrap_err();
        assert!(e.contains("XLA_FFI_ThreadPool_Schedule"), "{e}");
        let e = unsafe { call_fn(api.XLA_FFI_Stream_Get, std::ptr::null_mut()) }.unwrap_err();
        assert!(e.contains("args is null"), "{e}");
        let e = unsafe { call_fn(api.XLA_FFI_Stream_Get, args.as_mut_ptr().cast()) }.unwrap_err();
        assert!(e.contains("struct_size 16"), "{e}");
        // Type_Register gives an unset id a value and keeps the deleter.
        let mut id = XLA_FFI_TypeId { type_id: 0 };
        let mut reg = XLA_FFI_Type_Register_Args {
            struct_size: std::mem::size_of::<XLA_FFI_Type_Register_Args>(),
            extension_start: std::ptr::null_mut(),
            name: XLA_FFI_ByteSpan {
                ptr: c"T".as_ptr(),
                len: 1,
            },
            type_id: &mut id,
            type_info: &STATE_INFO.0,
        };
        unsafe { call_fn(api.XLA_FFI_Type_Register, &mut reg as *mut _ as *mut c_void) }.unwrap();
        assert_ne!(id.type_id, 0);
        assert!(deleter(0, id.type_id).is_some());
        reg.type_id = std::ptr::null_mut();
        let e = unsafe { call_fn(api.XLA_FFI_Type_Register, &mut reg as *mut _ as *mut c_void) }
            .unwrap_err();
        assert!(e.contains("type_id is null"), "{e}");
        assert_eq!(api.struct_size, 200);
        assert_eq!(
            (api.api_version.major_version, api.api_version.minor_version),
            (0, 4)
        );
    }

    use self::call as call_fn;
}

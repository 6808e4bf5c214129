//! Errors: one Rust type ([`Error`]: a PJRT error code and a message), and
//! the C objects it becomes (`PJRT_Error`), with the `PJRT_Error_*` entries.
//!
//! This is the one place where a [`DeviceError`] (or a runtime error) turns
//! into a `PJRT_Error`.

use std::sync::Arc;

use xla_vmm_device::DeviceError;
use xla_vmm_ffi::pjrt::*;

use crate::cabi::handles::{Handle, Registry};

/// A PJRT status code (`PJRT_Error_Code`).
pub type Code = PJRT_Error_Code;

/// What an entry point returns on failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(PJRT_Error_Code_INVALID_ARGUMENT, message)
    }
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(PJRT_Error_Code_UNIMPLEMENTED, message)
    }
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(PJRT_Error_Code_FAILED_PRECONDITION, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(PJRT_Error_Code_INTERNAL, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(PJRT_Error_Code_NOT_FOUND, message)
    }
    /// Prefix the message with where it happened.
    pub fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for Error {}

impl From<crate::cabi::handles::StaleHandle> for Error {
    fn from(e: crate::cabi::handles::StaleHandle) -> Self {
        Error::invalid(e.0)
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        let code = match &e {
            DeviceError::OutOfMemory { .. } => PJRT_Error_Code_RESOURCE_EXHAUSTED,
            DeviceError::Unsupported(_) => PJRT_Error_Code_UNIMPLEMENTED,
            DeviceError::InvalidArgument(_) => PJRT_Error_Code_INVALID_ARGUMENT,
            DeviceError::Driver { .. } => PJRT_Error_Code_INTERNAL,
            DeviceError::NotAvailable(_) => PJRT_Error_Code_UNAVAILABLE,
        };
        Error::new(code, e.to_string())
    }
}

// ---- the C object ---------------------------------------------------------

/// A live `PJRT_Error`. `#[repr(C)]` with the function-table pointer first,
/// as the header lays out `struct PJRT_Error`.
#[repr(C)]
pub struct ErrorObj {
    vtable: *const PJRT_Error_FunctionTable,
    pub error: Error,
}

// SAFETY: `vtable` points to an immutable static table; nothing else is shared.
#[allow(unsafe_code)]
unsafe impl Send for ErrorObj {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for ErrorObj {}

static ERRORS: Registry<ErrorObj> = Registry::new();

impl Handle for ErrorObj {
    type C = PJRT_Error;
    const KIND: &'static str = "PJRT_Error";
    fn registry() -> &'static Registry<Self> {
        &ERRORS
    }
}

/// The function table the header attaches to every `PJRT_Error`.
#[repr(transparent)]
struct SyncTable(PJRT_Error_FunctionTable);
// SAFETY: immutable after construction; its only pointer is null.
#[allow(unsafe_code)]
unsafe impl Sync for SyncTable {}

static ERROR_VTABLE: SyncTable = SyncTable(PJRT_Error_FunctionTable {
    struct_size: PJRT_Error_FunctionTable_STRUCT_SIZE as usize,
    instance_size: std::mem::size_of::<PJRT_Error>(),
    extension_start: std::ptr::null_mut(),
    destroy: Some(vtable_destroy),
    message: Some(vtable_message),
    get_code: Some(vtable_get_code),
    for_each_payload: Some(vtable_for_each_payload),
});

/// Hand an error to the C caller (it owns it until `PJRT_Error_Destroy`).
pub fn into_c(error: Error) -> *mut PJRT_Error {
    tracing::debug!(code = error.code, message = %error.message, "PJRT error");
    Arc::new(ErrorObj {
        vtable: &ERROR_VTABLE.0,
        error,
    })
    .into_c()
}

/// Number of live `PJRT_Error` objects (leak checks in tests).
pub fn live_errors() -> usize {
    ERRORS.len()
}

// ---- entries ----------------------------------------------------------------

pub fn destroy(args: &mut PJRT_Error_Destroy_Args) -> Result<()> {
    if !args.error.is_null() {
        ErrorObj::release(args.error)?;
    }
    Ok(())
}

pub fn message(args: &mut PJRT_Error_Message_Args) -> Result<()> {
    let obj = ErrorObj::from_c(args.error)?;
    // The message lives inside the object, which the registry keeps alive
    // until PJRT_Error_Destroy: the pointer stays valid that long.
    args.message = obj.error.message.as_ptr().cast();
    args.message_size = obj.error.message.len();
    Ok(())
}

pub fn get_code(args: &mut PJRT_Error_GetCode_Args) -> Result<()> {
    args.code = ErrorObj::from_c(args.error)?.error.code;
    Ok(())
}

pub fn for_each_payload(args: &mut PJRT_Error_ForEachPayload_Args) -> Result<()> {
    // Our errors carry no payloads: validate the handle, visit nothing.
    ErrorObj::from_c(args.error)?;
    Ok(())
}

extern "C" fn vtable_destroy(error: *mut PJRT_Error) {
    let _ = std::panic::catch_unwind(|| ErrorObj::release(error));
}

#[allow(unsafe_code)]
extern "C" fn vtable_message(
    error: *const PJRT_Error,
    msg: *mut *const std::ffi::c_char,
    size: *mut usize,
) {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(obj) = ErrorObj::from_c(error) {
            if !msg.is_null() && !size.is_null() {
                // SAFETY: both out pointers are non-null (checked) and, per
                // the function table's contract, point to writable slots.
                unsafe {
                    *msg = obj.error.message.as_ptr().cast();
                    *size = obj.error.message.len();
                }
            }
        }
    });
}

extern "C" fn vtable_get_code(error: *const PJRT_Error) -> PJRT_Error_Code {
    std::panic::catch_unwind(|| ErrorObj::from_c(error).map(|o| o.error.code))
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or(PJRT_Error_Code_UNKNOWN)
}

extern "C" fn vtable_for_each_payload(
    _error: *const PJRT_Error,
    _visitor: PJRT_Error_PayloadVisitor,
    _user_arg: *mut std::ffi::c_void,
) {
}

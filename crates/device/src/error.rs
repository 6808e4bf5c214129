//! One error type for every driver-facing operation.

/// What went wrong below the runtime. Backends turn driver result codes into
/// this; the PJRT layer turns it into a `PJRT_Error` in exactly one place.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    /// The device (or host, for pinned memory) is out of memory.
    #[error("out of memory: {what} ({bytes} bytes requested)")]
    OutOfMemory { what: String, bytes: u64 },
    /// The backend or device cannot do this (e.g. no VMM, no conditional nodes).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A caller mistake caught before reaching the driver (bad handle, range
    /// outside a reservation, misaligned VMM size, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A driver call failed. `call` is the driver function, `code` its result.
    #[error("{call} failed: {name} ({code}){}", if .message.is_empty() { String::new() } else { format!(": {}", .message) })]
    Driver {
        call: &'static str,
        code: i64,
        name: String,
        message: String,
    },
    /// The driver library could not be loaded or lacks a required symbol.
    #[error("driver not available: {0}")]
    NotAvailable(String),
}

impl DeviceError {
    /// A failed driver call's error with `message` (what the call was
    /// about) in place of its own; any other error as it is.
    pub fn with_message(self, message: impl FnOnce() -> String) -> Self {
        match self {
            DeviceError::Driver {
                call, code, name, ..
            } => DeviceError::Driver {
                call,
                code,
                name,
                message: message(),
            },
            e => e,
        }
    }
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

//! The runtime's error type.

use xla_vmm_device::DeviceError;

/// What can go wrong loading or running an executable.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A device call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The executable uses something this runtime does not execute (a thunk
    /// kind, a data type, an epilogue). Raised at load time where possible.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The executable is malformed: a slice outside its allocation, a missing
    /// kernel, an argument index out of range.
    #[error("invalid executable: {0}")]
    InvalidProgram(String),
    /// The caller passed wrong arguments (count, byte size, aliasing).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Reading or writing a file (npz) failed.
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

impl RuntimeError {
    pub(crate) fn unsupported(msg: impl Into<String>) -> Self {
        RuntimeError::Unsupported(msg.into())
    }
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        RuntimeError::InvalidProgram(msg.into())
    }
    pub(crate) fn arg(msg: impl Into<String>) -> Self {
        RuntimeError::InvalidArgument(msg.into())
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

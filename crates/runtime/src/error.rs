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
    /// A custom call's handler failed at run time (its message).
    #[error("{0}")]
    Handler(String),
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

/// The failures of one teardown, which goes on past each of them: reported
/// once when dropped, as one warning naming every failed call (instead of
/// each dropped with `.ok()`).
pub(crate) struct Teardown {
    what: &'static str,
    failed: Vec<String>,
}

impl Teardown {
    pub(crate) fn new(what: &'static str) -> Self {
        Teardown {
            what,
            failed: Vec::new(),
        }
    }

    /// Note `r`'s error, if any, as `call`'s.
    pub(crate) fn check<T, E: std::fmt::Display>(&mut self, call: &str, r: Result<T, E>) {
        if let Err(e) = r {
            self.failed.push(format!("{call}: {e}"));
        }
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if !self.failed.is_empty() {
            tracing::warn!(what = self.what, failed = ?self.failed,
                "teardown: {} call(s) failed", self.failed.len());
        }
    }
}

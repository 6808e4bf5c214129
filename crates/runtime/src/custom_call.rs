//! Custom calls through XLA's typed FFI (`CustomCallThunk` with API version
//! 4): the runtime's side, in safe Rust. The handlers themselves are foreign
//! code (the ones JAX registers: host callbacks, `buffer_callback`, user FFI
//! targets); whoever embeds the runtime gives a [`CustomCallRegistry`] at
//! load (the plugin's speaks XLA's FFI C API to them), and each call site is
//! bound to its handler once, at load ([`CustomCallRegistry::bind`]: XLA
//! runs a handler's instantiate stage then too).
//!
//! At run time the call gets what XLA's `CustomCallThunk` gives a handler:
//! the stream it runs on, the device, its operands and results as typed
//! buffers (a null operand or result slot, XLA's token, as a `TOKEN` buffer
//! with no data), its attributes (bound at load) and the run's execute
//! context (the user data JAX attached to this `Execute`: the Python
//! callables of the host callbacks). A handler that is not command-buffer
//! compatible keeps its program out of graphs ([`crate::exec`]'s capture
//! check): it runs eager, thunk by thunk, on this runtime.

use std::sync::Arc;

use xla_vmm::FfiAttrs;
use xla_vmm_device::DevicePtr;

/// One operand or result of a call, as XLA hands it to a handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallBuffer {
    /// `xla.PrimitiveType` number (`XLA_FFI_DataType`).
    pub dtype: i32,
    pub data: DevicePtr,
    pub dims: Vec<i64>,
}

/// A call site, as loading sees it.
#[derive(Clone, Copy, Debug)]
pub struct CallSite<'a> {
    /// The custom call target (`custom_call_target` in the HLO).
    pub target: &'a str,
    /// The thunk's `profile_annotation`.
    pub name: &'a str,
    pub attributes: &'a FfiAttrs,
    /// The device the program is loaded for (the backend's ordinal).
    pub device_ordinal: usize,
}

/// The user data of one run, by FFI type id (what `Execute`'s context
/// holds: an opaque address the handler knows the type of).
pub trait CallContext: Send + Sync {
    fn user_data(&self, type_id: i64) -> Option<usize>;
}

/// Device memory a handler asks for during a call
/// (`XLA_FFI_DeviceMemory_Allocate`: cuSOLVER's workspaces): valid until
/// the call's work on its stream is done, released then (a `free` before
/// that only says the handler is done with it, as with XLA's stream-ordered
/// allocator).
pub trait CallScratch {
    fn allocate(&self, bytes: u64, alignment: u64) -> Result<DevicePtr, String>;
    fn free(&self, ptr: DevicePtr) -> Result<(), String>;
}

/// One run of a bound call.
pub struct Invocation<'a> {
    /// The stream's native handle ([`xla_vmm_device::Backend::stream_native`]).
    pub stream: usize,
    pub device_ordinal: usize,
    pub args: &'a [CallBuffer],
    pub rets: &'a [CallBuffer],
    pub context: Option<&'a dyn CallContext>,
    pub scratch: &'a dyn CallScratch,
}

/// A call site bound to its handler (and the handler's per-site state).
pub trait BoundCall: Send + Sync + std::fmt::Debug {
    /// May the call be recorded into a graph (XLA's
    /// `COMMAND_BUFFER_COMPATIBLE` trait)?
    fn graph_compatible(&self) -> bool;
    /// Run it (enqueue on `call.stream`, or run on the host): the handler's
    /// error message on failure.
    fn execute(&self, call: &Invocation<'_>) -> Result<(), String>;
}

/// Where handlers come from.
pub trait CustomCallRegistry: Send + Sync {
    /// Bind `site` to the handler registered for its target; `Ok(None)`
    /// when there is none.
    fn bind(&self, site: &CallSite<'_>) -> Result<Option<Arc<dyn BoundCall>>, String>;

    /// The host-offloaded computation of host-execute thunk `name` (its
    /// HLO module, and XLA:CPU's compile of it when the executable carries
    /// one), ready to run on the CPU ([`crate::host_execute`]); `Ok(None)`
    /// when this registry has no CPU compiler.
    fn bind_host_program(
        &self,
        _program: &xla_vmm::HostExecuteStartThunk,
        _name: &str,
    ) -> Result<Option<Arc<dyn crate::host_execute::HostProgram>>, String> {
        Ok(None)
    }
}

/// The typed-FFI custom call API version (`API_VERSION_TYPED_FFI`).
pub const API_VERSION_TYPED_FFI: i32 = 4;

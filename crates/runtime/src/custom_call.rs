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

use xla_vmm::{FfiAttrs, ShapedSlice, Slice};
use xla_vmm_device::vmm::VmmContext;
use xla_vmm_device::{Backend, DevicePtr};

use crate::error::{Result, RuntimeError};
use crate::slots::{DeviceBuffer, SlotTable};

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

/// A loaded custom call.
#[derive(Debug)]
pub struct CustomCallOp {
    pub name: String,
    pub target: String,
    pub call: std::sync::Arc<dyn BoundCall>,
    /// Operands and results: slice, dtype, dims; `None` = a token.
    pub operands: Vec<Option<CallOperand>>,
    pub results: Vec<Option<CallOperand>>,
}

/// A buffer of a custom call, as loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallOperand {
    pub slice: Slice,
    pub dtype: i32,
    pub dims: Vec<i64>,
}

pub(crate) fn call_operands(
    v: &[Option<ShapedSlice>],
    what: &str,
) -> Result<Vec<Option<CallOperand>>> {
    v.iter()
        .enumerate()
        .map(|(i, s)| {
            let Some(s) = s else { return Ok(None) };
            let shape = s.shape.as_ref().ok_or_else(|| {
                RuntimeError::invalid(format!("custom call {what} {i} has no shape"))
            })?;
            Ok(Some(CallOperand {
                slice: s.slice,
                dtype: shape.element_type.0,
                dims: shape.dimensions.clone(),
            }))
        })
        .collect()
}

/// Legacy (untyped) custom calls are not run; typed-FFI ones are, given a
/// registry.
pub(crate) fn custom_call_support(c: &xla_vmm::CustomCallThunk) -> std::result::Result<(), String> {
    if c.api_version != API_VERSION_TYPED_FFI {
        return Err(format!(
            "custom call '{}' of API version {} (only typed-FFI custom calls, version {API_VERSION_TYPED_FFI}, are run)",
            c.target_name, c.api_version
        ));
    }
    Ok(())
}

/// Bind a typed-FFI custom call to its handler (`registry`: the loaded
/// ones), with its operands and results in their order.
pub(crate) fn build(
    registry: Option<&dyn CustomCallRegistry>,
    device_ordinal: usize,
    t: &xla_vmm::Thunk,
    c: &xla_vmm::CustomCallThunk,
) -> Result<CustomCallOp> {
    let registry = registry.ok_or_else(|| {
        RuntimeError::unsupported(format!(
            "custom call '{}': this runtime was loaded without FFI handlers",
            c.target_name
        ))
    })?;
    let site = CallSite {
        target: &c.target_name,
        name: &t.info.profile_annotation,
        attributes: &c.attributes,
        device_ordinal,
    };
    let call = registry
        .bind(&site)
        .map_err(|e| {
            RuntimeError::unsupported(format!(
                "custom call '{}': binding its FFI handler: {e}",
                c.target_name
            ))
        })?
        .ok_or_else(|| {
            RuntimeError::unsupported(format!(
                "custom call '{}': no FFI handler is registered for it",
                c.target_name
            ))
        })?;
    Ok(CustomCallOp {
        name: t.info.profile_annotation.clone(),
        target: c.target_name.clone(),
        call,
        operands: call_operands(&c.operands, "operand")?,
        results: call_operands(&c.results, "result")?,
    })
}

/// XLA's `CustomCallThunk::ExecuteFfiHandler`: the handler gets the stream,
/// the device, every operand and result as a typed buffer (a token as a
/// `TOKEN` buffer without data) and the run's execute context.
/// What a call needs of the run besides its buffers.
pub(crate) struct CallEnv<'a, B: Backend> {
    pub backend: &'a B,
    /// Where scratch memory comes from.
    pub vmm: &'a VmmContext<B>,
    /// The run's execute context (the handlers' user data).
    pub context: Option<&'a dyn CallContext>,
    /// The stream is being captured into a graph.
    pub capturing: bool,
}

pub(crate) fn run<B: Backend>(
    env: CallEnv<'_, B>,
    c: &CustomCallOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    if env.capturing && !c.call.graph_compatible() {
        return Err(RuntimeError::unsupported(format!(
            "custom call '{}': its handler is not command-buffer compatible, it cannot be captured",
            c.target
        )));
    }
    let buffers = |v: &[Option<CallOperand>]| -> Result<Vec<CallBuffer>> {
        v.iter()
            .map(|o| match o {
                Some(o) => Ok(CallBuffer {
                    dtype: o.dtype,
                    data: slots.resolve(&o.slice)?,
                    dims: o.dims.clone(),
                }),
                None => Ok(CallBuffer {
                    dtype: xla_vmm::ElementType::TOKEN.0,
                    data: DevicePtr::NULL,
                    dims: Vec::new(),
                }),
            })
            .collect()
    };
    let (args, rets) = (buffers(&c.operands)?, buffers(&c.results)?);
    let scratch = Scratch {
        vmm: env.vmm,
        capturing: env.capturing,
        buffers: std::sync::Mutex::new(Vec::new()),
    };
    let call = Invocation {
        stream: env.backend.stream_native(stream),
        device_ordinal: env.backend.info().ordinal,
        args: &args,
        rets: &rets,
        context: env.context,
        scratch: &scratch,
    };
    tracing::trace!(target = %c.target, name = %c.name, "custom call");
    let r = c.call.execute(&call).map_err(|e| {
        RuntimeError::Handler(format!("custom call '{}' ({}): {e}", c.target, c.name))
    });
    // Scratch memory outlives the work the handler enqueued on the stream.
    let buffers = scratch
        .buffers
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    let released = (|| -> Result<()> {
        if !buffers.is_empty() {
            env.backend.stream_synchronize(stream)?;
            for b in buffers {
                b.free()?;
            }
        }
        Ok(())
    })();
    r.and(released)
}

/// A custom call's scratch memory: one VMM buffer per request, released
/// after the call ([`run_custom_call`]).
struct Scratch<'a, B: Backend> {
    vmm: &'a VmmContext<B>,
    capturing: bool,
    buffers: std::sync::Mutex<Vec<DeviceBuffer<B>>>,
}

impl<B: Backend> CallScratch for Scratch<'_, B> {
    fn allocate(&self, bytes: u64, alignment: u64) -> std::result::Result<DevicePtr, String> {
        if self.capturing {
            return Err("device memory for a custom call inside a graph capture".into());
        }
        let granule = self.vmm.backend().info().vmm_granularity.max(1);
        if alignment > granule || (alignment > 0 && !alignment.is_power_of_two()) {
            return Err(format!(
                "alignment {alignment} (at most the {granule}-byte VMM granule, a power of two)"
            ));
        }
        let b = DeviceBuffer::alloc_in(self.vmm, bytes).map_err(|e| e.to_string())?;
        let p = b.ptr();
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(b);
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr) -> std::result::Result<(), String> {
        let known = self
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|b| b.ptr() == ptr);
        if known {
            Ok(())
        } else {
            Err(format!("{ptr:?} was not allocated for this call"))
        }
    }
}

/// The program of host-offloaded compute `h`, bound through `registry` (the
/// package registers JAX's CPU compiler as its source).
pub(crate) fn host_program(
    registry: Option<&dyn CustomCallRegistry>,
    t: &xla_vmm::Thunk,
    h: &xla_vmm::HostExecuteStartThunk,
) -> Result<Arc<dyn crate::host_execute::HostProgram>> {
    let registry = registry.ok_or_else(|| {
        RuntimeError::unsupported(
            "host compute: this runtime was loaded without a host-program source",
        )
    })?;
    registry
        .bind_host_program(h, &t.info.profile_annotation)
        .map_err(|e| RuntimeError::unsupported(format!("host compute: {e}")))?
        .ok_or_else(|| {
            RuntimeError::unsupported(
                "host compute: no host-program source is registered \
                 (the xla_vmm Python package registers JAX's CPU compiler)",
            )
        })
}

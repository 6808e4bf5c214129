//! Pallas / Mosaic GPU kernels (custom call `mosaic_gpu_v2`) on our
//! runtime.
//!
//! jaxlib registers the call's FFI handler from C++ into the registry of
//! the XLA it is linked with (the vendor plugin's), where the FFI C API
//! cannot read it back, so no handler ever reaches us. The vendor library
//! exports the same compiler the handler uses, for JAX's PyTorch interop:
//! `MosaicGpuCompile(module, len)` compiles the call's `module` attribute
//! (serialized MLIR) for the current device and loads it into the current
//! context, returning `{function, host_launch, kernel}`;
//! `host_launch(function, stream, buffers)` launches it over the operands
//! then the results, as the handler's execute stage does;
//! `MosaicGpuUnload` frees it. XLA's handler does the same: compile at
//! instantiate (here: at bind, with the device's context made current),
//! launch at execute, command-buffer compatible. Refused, as XLA refuses
//! them or we lack the runtime for them: `use_custom_barrier`, and kernels
//! with XLA's collective metadata (multi-GPU Mosaic kernels).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use xla_vmm::{FfiAttr, FfiScalar};
use xla_vmm_runtime::custom_call::{BoundCall, CallSite, Invocation};

/// The custom call target.
pub const TARGET: &str = "mosaic_gpu_v2";

type CompileFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut *mut c_void;
type UnloadFn = unsafe extern "C" fn(*mut *mut c_void);
type LaunchFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void);

/// A compiled, loaded kernel of one call site.
pub struct MosaicKernel {
    name: String,
    device_ordinal: usize,
    /// `MosaicGpuCompile`'s result: `[function, host_launch, kernel]`.
    compiled: *mut *mut c_void,
    function: *mut c_void,
    launch: LaunchFn,
    unload: UnloadFn,
}

// SAFETY: the compiled kernel is immutable after compilation; launching it
// from any thread with its device's context current is what XLA's handler
// does too (its execute stage runs on XLA's thunk threads).
unsafe impl Send for MosaicKernel {}
// SAFETY: see `Send`: launches only read the kernel.
unsafe impl Sync for MosaicKernel {}

impl std::fmt::Debug for MosaicKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MosaicKernel")
            .field("name", &self.name)
            .field("device_ordinal", &self.device_ordinal)
            .finish()
    }
}

fn attr<'a>(site: &'a CallSite<'_>, name: &str) -> Option<&'a FfiAttr> {
    site.attributes
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| a)
}

fn flag(site: &CallSite<'_>, name: &str) -> Result<bool, String> {
    match attr(site, name) {
        None => Ok(false),
        Some(FfiAttr::Scalar(FfiScalar::Pred(b))) => Ok(*b),
        Some(other) => Err(format!("attribute {name} is {other:?}, not a bool")),
    }
}

/// The call site's kernel module, if it is one this runtime launches.
fn kernel_module<'a>(site: &'a CallSite<'_>) -> Result<&'a [u8], String> {
    if flag(site, "use_custom_barrier")? {
        return Err(
            "a Mosaic GPU kernel with use_custom_barrier (XLA refuses it on GPUs too)".into(),
        );
    }
    if flag(site, "uses_xla_collective_metadata")? {
        return Err(
            "a Mosaic GPU kernel with XLA's collective metadata (multi-GPU kernels are not run here)"
                .into(),
        );
    }
    match attr(site, "module") {
        Some(FfiAttr::Str(bytes)) if !bytes.is_empty() => Ok(bytes),
        _ => Err("no `module` attribute (the kernel's serialized MLIR)".into()),
    }
}

/// Compile the call site's kernel (`Ok(None)`: the vendor library has no
/// Mosaic compiler, so the call is not ours).
pub fn bind(site: &CallSite<'_>) -> Result<Option<Arc<dyn BoundCall>>, String> {
    let module = kernel_module(site)?;
    let Some(vendor) = crate::vendor_plugin::compiler::VendorPlugin::loaded() else {
        return Ok(None);
    };
    let (Some(compile), Some(unload)) = (
        vendor.symbol_address(b"MosaicGpuCompile\0"),
        vendor.symbol_address(b"MosaicGpuUnload\0"),
    ) else {
        return Ok(None);
    };
    let len = c_int::try_from(module.len())
        .map_err(|_| format!("a {}-byte Mosaic module", module.len()))?;
    #[cfg(feature = "cuda")]
    xla_vmm_device::cuda::CudaBackend::bind_primary_context(site.device_ordinal).map_err(|e| {
        format!(
            "making device {}'s context current: {e}",
            site.device_ordinal
        )
    })?;
    // SAFETY: the vendor's exported functions, of these types (jaxlib's
    // custom_call.cc; JAX's torch interop calls them the same way).
    let (compile, unload) = unsafe {
        (
            std::mem::transmute::<*mut c_void, CompileFn>(compile),
            std::mem::transmute::<*mut c_void, UnloadFn>(unload),
        )
    };
    // SAFETY: `module` is `len` bytes; the result is null or a new
    // three-pointer array that `unload` frees.
    let compiled = unsafe { compile(module.as_ptr().cast(), len) };
    if compiled.is_null() {
        return Err(format!(
            "MosaicGpuCompile failed for '{}' (the vendor's Mosaic GPU compiler gives no reason; \
             XLA_FLAGS / MOSAIC_GPU_DUMP settings of jaxlib show more)",
            site.name
        ));
    }
    // SAFETY: the non-null result has three entries: function, host launch
    // (a function of `LaunchFn`'s type), kernel.
    let (function, launch) = unsafe {
        (
            *compiled,
            std::mem::transmute::<*mut c_void, LaunchFn>(*compiled.add(1)),
        )
    };
    tracing::debug!(
        name = site.name,
        bytes = module.len(),
        "Mosaic GPU kernel compiled"
    );
    Ok(Some(Arc::new(MosaicKernel {
        name: site.name.to_string(),
        device_ordinal: site.device_ordinal,
        compiled,
        function,
        launch,
        unload,
    })))
}

impl BoundCall for MosaicKernel {
    fn graph_compatible(&self) -> bool {
        true // XLA's handler is command-buffer compatible: one kernel launch on the stream.
    }

    fn execute(&self, call: &Invocation<'_>) -> Result<(), String> {
        let mut buffers: Vec<*mut c_void> = call
            .args
            .iter()
            .chain(call.rets)
            .map(|b| b.data.0 as *mut c_void)
            .collect();
        // SAFETY: the kernel compiled for this call site, launched on the
        // call's stream over its operands and results (device addresses the
        // runtime bound), as XLA's execute stage launches it.
        unsafe {
            (self.launch)(
                self.function,
                call.stream as *mut c_void,
                buffers.as_mut_ptr(),
            )
        };
        Ok(())
    }
}

impl Drop for MosaicKernel {
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if let Err(e) = xla_vmm_device::cuda::CudaBackend::bind_primary_context(self.device_ordinal)
        {
            tracing::warn!(name = %self.name, error = %e, "unloading a Mosaic GPU kernel");
        }
        // SAFETY: `MosaicGpuCompile`'s result, freed once.
        unsafe { (self.unload)(self.compiled) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(attributes: &xla_vmm::FfiAttrs) -> CallSite<'_> {
        CallSite {
            target: TARGET,
            name: "custom-call.3",
            attributes,
            device_ordinal: 0,
        }
    }

    fn attrs(barrier: bool, collective: Option<bool>, module: &[u8]) -> xla_vmm::FfiAttrs {
        let mut v = vec![
            ("kernel_hash".to_string(), FfiAttr::Str(vec![7; 32])),
            ("module".to_string(), FfiAttr::Str(module.to_vec())),
            (
                "use_custom_barrier".to_string(),
                FfiAttr::Scalar(FfiScalar::Pred(barrier)),
            ),
        ];
        if let Some(c) = collective {
            v.push((
                "uses_xla_collective_metadata".to_string(),
                FfiAttr::Scalar(FfiScalar::Pred(c)),
            ));
        }
        v
    }

    #[test]
    fn kernels_we_cannot_launch_are_refused_naming_why() {
        let a = attrs(true, None, b"ML\xefR");
        assert!(bind(&site(&a)).unwrap_err().contains("use_custom_barrier"));
        let a = attrs(false, Some(true), b"ML\xefR");
        assert!(bind(&site(&a)).unwrap_err().contains("collective metadata"));
        let a = attrs(false, Some(false), b"");
        assert!(bind(&site(&a)).unwrap_err().contains("`module`"));
        let mut a = attrs(false, None, b"ML\xefR");
        a[2].1 = FfiAttr::Scalar(FfiScalar::S32(1));
        assert!(bind(&site(&a)).unwrap_err().contains("not a bool"));
    }

    #[test]
    fn without_the_vendor_compiler_the_call_is_not_ours() {
        // No vendor plugin is loaded in this test process.
        let a = attrs(false, Some(false), b"ML\xefR");
        assert!(kernel_module(&site(&a)).is_ok());
        assert!(bind(&site(&a)).unwrap().is_none());
    }
}

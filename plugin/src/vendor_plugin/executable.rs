//! A program compiled (or deserialized) by the vendor plugin.
//!
//! Normally used for two queries only, then dropped: the serialized bytes
//! (decoded and loaded into our runtime) and the optimized program (what
//! jaxlib reads parameter and output layouts from).
//!
//! When our runtime rejects a program and the client is not `strict`, the
//! vendor executable is kept and runs the program *on our buffers*: each
//! argument becomes a vendor view (`PJRT_Client_CreateViewOfDeviceBuffer`)
//! of our device memory, the vendor's outputs are copied into fresh buffers
//! of our allocator and then released. The vendor never donates a view: all
//! arguments are passed as non-donatable.
#![allow(unsafe_code)]

use std::sync::Arc;

use xla_vmm_device::DevicePtr;
use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{self, CPtr};
use crate::cabi::error::{Error, Result};
use crate::vendor_plugin::compiler::VendorClient;

pub struct VendorExecutable {
    client: Arc<VendorClient>,
    exe: CPtr<PJRT_LoadedExecutable>,
}

/// One argument for a vendor run: our memory, its array type, and whether
/// it is in pinned host memory (a host-offloaded parameter).
pub struct ViewArg<'a> {
    pub ptr: DevicePtr,
    pub dtype: PJRT_Buffer_Type,
    pub dims: &'a [i64],
    pub on_host: bool,
    /// The vendor may donate this view (write an aliased output into its
    /// memory): only memory of ours that nothing else reads afterwards.
    /// Every other view is non-donatable.
    pub donatable: bool,
}

/// One vendor output: its device address and size, valid until the
/// `VendorOutputs` is dropped.
pub struct VendorOutput {
    pub ptr: DevicePtr,
    pub bytes: u64,
}

/// Vendor buffers that must be destroyed after their contents are copied.
pub struct VendorOutputs<'a> {
    client: &'a VendorClient,
    buffers: Vec<*mut PJRT_Buffer>,
    pub outputs: Vec<VendorOutput>,
}

fn zeroed<T>() -> T {
    // SAFETY: only used for the plain-data PJRT args structs below, for
    // which all-zero (null pointers, zero sizes) is a valid value.
    unsafe { std::mem::zeroed() }
}

fn destroy_buffer(client: &VendorClient, b: *mut PJRT_Buffer) {
    let mut d: PJRT_Buffer_Destroy_Args = zeroed();
    d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE as usize;
    d.buffer = b;
    if let Err(e) = client
        .plugin
        .call("PJRT_Buffer_Destroy", |t| t.PJRT_Buffer_Destroy, &mut d)
    {
        tracing::warn!("{e}");
    }
}

impl Drop for VendorOutputs<'_> {
    fn drop(&mut self) {
        for &b in &self.buffers {
            destroy_buffer(self.client, b);
        }
    }
}

/// `on_delete_callback` of a vendor view of our memory: nothing to free
/// (the memory is ours and outlives the view).
unsafe extern "C" fn view_released(
    _device_buffer: *mut std::ffi::c_void,
    _arg: *mut std::ffi::c_void,
) {
}

impl VendorExecutable {
    /// Compile `code` (format "mlir" or "hlo") with serialized
    /// `CompileOptionsProto` bytes.
    pub fn compile(
        client: &Arc<VendorClient>,
        code: &[u8],
        format: &str,
        options: &[u8],
    ) -> Result<Self> {
        let program = PJRT_Program {
            struct_size: PJRT_Program_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            code: code.as_ptr() as *mut std::ffi::c_char,
            code_size: code.len(),
            format: format.as_ptr().cast(),
            format_size: format.len(),
        };
        // SAFETY: all-zero is a valid value for this plain C struct.
        let mut c: PJRT_Client_Compile_Args = unsafe { std::mem::zeroed() };
        c.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE as usize;
        c.client = client.client.0;
        c.program = &program;
        c.compile_options = options.as_ptr().cast();
        c.compile_options_size = options.len();
        client
            .plugin
            .call("PJRT_Client_Compile", |t| t.PJRT_Client_Compile, &mut c)?;
        Ok(VendorExecutable::new(client.clone(), c.executable))
    }

    /// Load `PJRT_Executable_Serialize` bytes on the vendor client.
    /// Load serialized executable bytes on the vendor client.
    /// `overridden_options`: the caller's serialized `CompileOptionsProto`
    /// that replaces the one stored in the bytes (jax passes the device
    /// assignment it wants this way).
    pub fn deserialize(
        client: &Arc<VendorClient>,
        bytes: &[u8],
        overridden_options: Option<&[u8]>,
    ) -> Result<Self> {
        // SAFETY: all-zero is a valid value for this plain C struct.
        let mut a: PJRT_Executable_DeserializeAndLoad_Args = unsafe { std::mem::zeroed() };
        a.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE as usize;
        a.client = client.client.0;
        a.serialized_executable = bytes.as_ptr().cast();
        a.serialized_executable_size = bytes.len();
        if let Some(o) = overridden_options {
            a.overridden_serialized_compile_options = o.as_ptr().cast();
            a.overridden_serialized_compile_options_size = o.len();
        }
        client.plugin.call(
            "PJRT_Executable_DeserializeAndLoad",
            |t| t.PJRT_Executable_DeserializeAndLoad,
            &mut a,
        )?;
        Ok(VendorExecutable::new(client.clone(), a.loaded_executable))
    }

    pub(crate) fn new(client: Arc<VendorClient>, exe: *mut PJRT_LoadedExecutable) -> Self {
        VendorExecutable {
            client,
            exe: CPtr(exe),
        }
    }

    /// Run `f` on the `PJRT_Executable` view (destroyed afterwards).
    fn with_view<T>(&self, f: impl FnOnce(*mut PJRT_Executable) -> Result<T>) -> Result<T> {
        let p = &self.client.plugin;
        let mut g: PJRT_LoadedExecutable_GetExecutable_Args = zeroed();
        g.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE as usize;
        g.loaded_executable = self.exe.0;
        p.call(
            "PJRT_LoadedExecutable_GetExecutable",
            |t| t.PJRT_LoadedExecutable_GetExecutable,
            &mut g,
        )?;
        let r = f(g.executable);
        let mut d: PJRT_Executable_Destroy_Args = zeroed();
        d.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE as usize;
        d.executable = g.executable;
        let _ = p.call(
            "PJRT_Executable_Destroy",
            |t| t.PJRT_Executable_Destroy,
            &mut d,
        );
        r
    }

    /// The vendor's device assignment of the compiled program
    /// (`PJRT_LoadedExecutable_GetDeviceAssignment`).
    pub fn device_assignment(&self) -> Result<crate::cabi::assignment::DeviceAssignment> {
        let p = &self.client.plugin;
        if !p.has_slot(std::mem::offset_of!(
            PJRT_Api,
            PJRT_LoadedExecutable_GetDeviceAssignment
        )) {
            return Err(Error::unimplemented(format!(
                "vendor plugin {} predates PJRT_LoadedExecutable_GetDeviceAssignment",
                p.path
            )));
        }
        let mut a: PJRT_LoadedExecutable_GetDeviceAssignment_Args = zeroed();
        a.struct_size = PJRT_LoadedExecutable_GetDeviceAssignment_Args_STRUCT_SIZE as usize;
        a.executable = self.exe.0;
        p.call(
            "PJRT_LoadedExecutable_GetDeviceAssignment",
            |t| t.PJRT_LoadedExecutable_GetDeviceAssignment,
            &mut a,
        )?;
        let parsed = caller::slice(
            a.serialized_bytes.cast::<u8>(),
            a.serialized_bytes_size,
            "serialized device assignment",
        )
        .and_then(|b| {
            <crate::cabi::assignment::DeviceAssignment as crate::cabi::assignment::AssignmentProto>::from_proto(
                b,
            )
        });
        if let Some(del) = a.serialized_device_assignment_deleter {
            // SAFETY: frees the vendor's serialized assignment once, after
            // it was parsed.
            unsafe { del(a.serialized_device_assignment) };
        }
        parsed
    }

    /// `PJRT_Executable_Serialize` bytes.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let p = &self.client.plugin;
        self.with_view(|exe| {
            let mut s: PJRT_Executable_Serialize_Args = zeroed();
            s.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE as usize;
            s.executable = exe;
            p.call(
                "PJRT_Executable_Serialize",
                |t| t.PJRT_Executable_Serialize,
                &mut s,
            )?;
            let bytes = caller::slice(
                s.serialized_bytes.cast::<u8>(),
                s.serialized_bytes_size,
                "serialized bytes",
            )
            .map(<[u8]>::to_vec);
            if let Some(del) = s.serialized_executable_deleter {
                // SAFETY: frees the vendor's serialized blob once, after copying.
                unsafe { del(s.serialized_executable) };
            }
            bytes
        })
    }

    /// (code, format) of `PJRT_Executable_OptimizedProgram` (two calls:
    /// size, then bytes).
    pub fn optimized_program(&self) -> Result<(Vec<u8>, String)> {
        let p = &self.client.plugin;
        self.with_view(|exe| {
            let mut program: PJRT_Program = zeroed();
            program.struct_size = PJRT_Program_STRUCT_SIZE as usize;
            let mut a: PJRT_Executable_OptimizedProgram_Args = zeroed();
            a.struct_size = PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE as usize;
            a.executable = exe;
            a.program = &mut program;
            p.call(
                "PJRT_Executable_OptimizedProgram",
                |t| t.PJRT_Executable_OptimizedProgram,
                &mut a,
            )?;
            let mut code = vec![0u8; program.code_size];
            program.code = code.as_mut_ptr().cast();
            a.program = &mut program;
            p.call(
                "PJRT_Executable_OptimizedProgram",
                |t| t.PJRT_Executable_OptimizedProgram,
                &mut a,
            )?;
            let format =
                caller::str(program.format, program.format_size, "program format")?.to_string();
            Ok((code, format))
        })
    }

    /// The vendor's `PJRT_Executable_GetCostAnalysis` properties.
    pub fn cost_analysis(&self) -> Result<Vec<(String, crate::cabi::caller::Value)>> {
        let p = &self.client.plugin;
        self.with_view(|exe| {
            let mut a: PJRT_Executable_GetCostAnalysis_Args = zeroed();
            a.struct_size = PJRT_Executable_GetCostAnalysis_Args_STRUCT_SIZE as usize;
            a.executable = exe;
            p.call(
                "PJRT_Executable_GetCostAnalysis",
                |t| t.PJRT_Executable_GetCostAnalysis,
                &mut a,
            )?;
            caller::read_named_values(a.properties, a.num_properties)
        })
    }

    /// The vendor device the program runs on (its first addressable
    /// device; the client's first device if it does not say).
    fn run_device(&self) -> *mut PJRT_Device {
        let mut a: PJRT_LoadedExecutable_AddressableDevices_Args = zeroed();
        a.struct_size = PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE as usize;
        a.executable = self.exe.0;
        let first = self
            .client
            .plugin
            .call(
                "PJRT_LoadedExecutable_AddressableDevices",
                |t| t.PJRT_LoadedExecutable_AddressableDevices,
                &mut a,
            )
            .and_then(|()| {
                caller::slice(
                    a.addressable_devices,
                    a.num_addressable_devices,
                    "vendor executable devices",
                )
                .map(|d| d.first().copied())
            });
        match first {
            Ok(Some(d)) => d,
            _ => self.client.device.0,
        }
    }

    /// The vendor device's memory of `kind` (its `pinned_host` memory for
    /// views of host-offloaded arguments), if it has one.
    fn device_memory(&self, device: *mut PJRT_Device, kind: &str) -> Option<*mut PJRT_Memory> {
        let p = &self.client.plugin;
        let mut a: PJRT_Device_AddressableMemories_Args = zeroed();
        a.struct_size = PJRT_Device_AddressableMemories_Args_STRUCT_SIZE as usize;
        a.device = device;
        p.call(
            "PJRT_Device_AddressableMemories",
            |t| t.PJRT_Device_AddressableMemories,
            &mut a,
        )
        .ok()?;
        let memories = caller::slice(a.memories, a.num_memories, "vendor memories").ok()?;
        memories.iter().copied().find(|&m| {
            let mut k: PJRT_Memory_Kind_Args = zeroed();
            k.struct_size = PJRT_Memory_Kind_Args_STRUCT_SIZE as usize;
            k.memory = m;
            p.call("PJRT_Memory_Kind", |t| t.PJRT_Memory_Kind, &mut k)
                .is_ok()
                && caller::str(k.kind, k.kind_size, "vendor memory kind").ok() == Some(kind)
        })
    }

    /// Run on the vendor runtime with views of `args` (on the device the
    /// program was compiled for); wait for completion.
    pub fn execute(
        &self,
        args: &[ViewArg<'_>],
        num_outputs: usize,
        context: Option<&Arc<crate::cabi::ffi_state::ExecuteContext>>,
    ) -> Result<VendorOutputs<'_>> {
        let c = &*self.client;
        let p = &c.plugin;
        let device = self.run_device();
        let mut views = VendorOutputs {
            client: c,
            buffers: Vec::new(),
            outputs: Vec::new(),
        };
        for a in args {
            let mut v: PJRT_Client_CreateViewOfDeviceBuffer_Args = zeroed();
            v.struct_size = PJRT_Client_CreateViewOfDeviceBuffer_Args_STRUCT_SIZE as usize;
            v.client = c.client.0;
            v.device_buffer_ptr = a.ptr.0 as usize as *mut std::ffi::c_void;
            v.dims = a.dims.as_ptr();
            v.num_dims = a.dims.len();
            v.element_type = a.dtype;
            v.device = device;
            // A host-offloaded argument is a view in the device's pinned
            // host memory (named by the memory alone: the C API takes a
            // device or a memory).
            if a.on_host {
                if let Some(m) =
                    self.device_memory(device, crate::cabi::memory_kind::PINNED_HOST_MEMORY_KIND)
                {
                    v.device = std::ptr::null_mut();
                    v.memory = m;
                }
            }
            // The vendor calls this when the view goes; a null one is an
            // empty std::function there, and calling it aborts the process
            // (std::bad_function_call). Our memory outlives the view.
            v.on_delete_callback = Some(view_released);
            p.call(
                "PJRT_Client_CreateViewOfDeviceBuffer",
                |t| t.PJRT_Client_CreateViewOfDeviceBuffer,
                &mut v,
            )?;
            views.buffers.push(v.buffer);
        }
        let non_donatable: Vec<i64> = (0..args.len() as i64)
            .filter(|&i| !args[i as usize].donatable)
            .collect();
        let mut options: PJRT_ExecuteOptions = zeroed();
        options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE as usize;
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        // The caller's FFI user data (host callbacks' callables) in a vendor
        // context of this run; dropped after the run has completed.
        let user_data = context.map(|c| c.user_data()).unwrap_or_default();
        let vendor_context = if user_data.is_empty() {
            None
        } else {
            Some(p.execute_context(&user_data)?)
        };
        if let Some(vc) = &vendor_context {
            options.context = vc.context.0;
        }
        let arg_list: *const *mut PJRT_Buffer = views.buffers.as_ptr();
        let mut outs: Vec<*mut PJRT_Buffer> = vec![std::ptr::null_mut(); num_outputs];
        let out_list: *mut *mut PJRT_Buffer = outs.as_mut_ptr();
        let mut done: *mut PJRT_Event = std::ptr::null_mut();
        let mut e: PJRT_LoadedExecutable_Execute_Args = zeroed();
        e.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE as usize;
        e.executable = self.exe.0;
        e.options = &mut options;
        e.argument_lists = &arg_list;
        e.num_devices = 1;
        e.num_args = args.len();
        e.output_lists = &out_list;
        e.device_complete_events = &mut done;
        p.call(
            "PJRT_LoadedExecutable_Execute",
            |t| t.PJRT_LoadedExecutable_Execute,
            &mut e,
        )?;
        // The views are no longer needed once the run is queued; outputs are.
        let view_buffers = std::mem::take(&mut views.buffers);
        views.buffers = outs.iter().copied().filter(|b| !b.is_null()).collect();
        let waited = if done.is_null() {
            Ok(())
        } else {
            let mut w: PJRT_Event_Await_Args = zeroed();
            w.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE as usize;
            w.event = done;
            let r = p.call("PJRT_Event_Await", |t| t.PJRT_Event_Await, &mut w);
            let mut d: PJRT_Event_Destroy_Args = zeroed();
            d.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE as usize;
            d.event = done;
            let _ = p.call("PJRT_Event_Destroy", |t| t.PJRT_Event_Destroy, &mut d);
            r
        };
        for b in view_buffers {
            destroy_buffer(c, b);
        }
        drop(vendor_context);
        waited?;
        if views.buffers.len() != num_outputs {
            return Err(Error::internal(format!(
                "vendor run produced {} of {num_outputs} outputs",
                views.buffers.len()
            )));
        }
        for &b in &views.buffers {
            let mut u: PJRT_Buffer_UnsafePointer_Args = zeroed();
            u.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE as usize;
            u.buffer = b;
            p.call(
                "PJRT_Buffer_UnsafePointer",
                |t| t.PJRT_Buffer_UnsafePointer,
                &mut u,
            )?;
            let mut s: PJRT_Buffer_OnDeviceSizeInBytes_Args = zeroed();
            s.struct_size = PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE as usize;
            s.buffer = b;
            p.call(
                "PJRT_Buffer_OnDeviceSizeInBytes",
                |t| t.PJRT_Buffer_OnDeviceSizeInBytes,
                &mut s,
            )?;
            views.outputs.push(VendorOutput {
                ptr: DevicePtr(u.buffer_pointer as u64),
                bytes: s.on_device_size_in_bytes as u64,
            });
        }
        Ok(views)
    }
}

impl Drop for VendorExecutable {
    fn drop(&mut self) {
        let mut d: PJRT_LoadedExecutable_Destroy_Args = zeroed();
        d.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE as usize;
        d.executable = self.exe.0;
        if let Err(e) = self.client.plugin.call(
            "PJRT_LoadedExecutable_Destroy",
            |t| t.PJRT_LoadedExecutable_Destroy,
            &mut d,
        ) {
            tracing::warn!("{e}");
        }
    }
}

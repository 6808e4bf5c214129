//! The `result` layer over the HIP runtime: every call returns [`Result`],
//! grouped by area, each with a link to its HIP doc. Mirrors
//! `cuda/result.rs`; HIP has no cudarc, so streams, events and modules are
//! wrapped here too.
//!
//! Every function is `unsafe` because the runtime trusts its arguments; the
//! callers in [`super`] validate them first.

use std::ffi::{c_void, CStr};

use xla_vmm_ffi::hip::runtime as sys;

use crate::error::{DeviceError, Result};

/// Turn a HIP result into `Ok(())` or [`DeviceError::Driver`] naming `call`.
/// `hipErrorOutOfMemory` becomes [`DeviceError::OutOfMemory`].
pub(crate) fn check(call: &'static str, code: sys::hipError_t) -> Result<()> {
    check_alloc(call, code, 0)
}

/// [`check`] for allocating calls: an out-of-memory error carries `bytes`.
pub(crate) fn check_alloc(call: &'static str, code: sys::hipError_t, bytes: u64) -> Result<()> {
    match code {
        sys::hipError_t::hipSuccess => Ok(()),
        sys::hipError_t::hipErrorOutOfMemory => Err(DeviceError::OutOfMemory {
            what: call.to_string(),
            bytes,
        }),
        _ => Err(driver_error(call, code)),
    }
}

/// [`DeviceError::Driver`] with the name and text HIP gives `code`.
///
/// See [hipGetErrorName](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___error.html)
pub(crate) fn driver_error(call: &'static str, code: sys::hipError_t) -> DeviceError {
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: HIP returns static NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: pure lookups of static strings.
    let (name, message) = unsafe {
        (
            text(sys::hipGetErrorName(code)),
            text(sys::hipGetErrorString(code)),
        )
    };
    DeviceError::Driver {
        call,
        code: code as i64,
        name: if name.is_empty() {
            format!("{code:?}")
        } else {
            name
        },
        message,
    }
}

/// Device selection, attributes and memory info.
pub mod device {
    use super::*;

    /// See [hipInit](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___driver.html)
    ///
    /// # Safety
    /// None beyond linking libamdhip64.
    pub unsafe fn init() -> Result<()> {
        check("hipInit", sys::hipInit(0))
    }

    /// See [hipGetDeviceCount](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___device.html)
    ///
    /// # Safety
    /// HIP is initialized.
    pub unsafe fn count() -> Result<i32> {
        let mut n = 0;
        check("hipGetDeviceCount", sys::hipGetDeviceCount(&mut n))?;
        Ok(n)
    }

    /// Make `ordinal` the calling thread's device (HIP's "bind to thread").
    ///
    /// See [hipSetDevice](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___device.html)
    ///
    /// # Safety
    /// `ordinal` is a valid device.
    pub unsafe fn set(ordinal: i32) -> Result<()> {
        check("hipSetDevice", sys::hipSetDevice(ordinal))
    }

    /// See [hipDeviceGetAttribute](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___device.html)
    ///
    /// # Safety
    /// `ordinal` is a valid device.
    pub unsafe fn attribute(ordinal: i32, attr: sys::hipDeviceAttribute_t) -> Result<i32> {
        let mut v = 0;
        check(
            "hipDeviceGetAttribute",
            sys::hipDeviceGetAttribute(&mut v, attr, ordinal),
        )?;
        Ok(v)
    }

    /// See [hipDeviceGetName](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___device.html)
    ///
    /// # Safety
    /// `ordinal` is a valid device.
    pub unsafe fn name(ordinal: i32) -> Result<String> {
        let mut dev: sys::hipDevice_t = 0;
        check("hipDeviceGet", sys::hipDeviceGet(&mut dev, ordinal))?;
        let mut buf = [0 as std::ffi::c_char; 256];
        check(
            "hipDeviceGetName",
            sys::hipDeviceGetName(buf.as_mut_ptr(), buf.len() as i32 - 1, dev),
        )?;
        Ok(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
    }

    /// The device's `gcnArchName` (e.g. `gfx90a:sramecc+:xnack-`), if it
    /// reads as one.
    ///
    /// `hipDeviceProp_t` changed layout in ROCm 6 (`hipGetDeviceProperties`
    /// there may be the new `R0600` struct, larger than the ROCm 5 one our
    /// bindings describe). So the call writes into a buffer far larger than
    /// either, and the name read at the ROCm 5 offset is only returned if it
    /// looks like an ISA name (`gfx` + hex digits, or `sm_` + digits: what
    /// the test shim `integration/hipshim` reports on NVIDIA); otherwise `None`.
    ///
    /// # Safety
    /// `ordinal` is a valid device.
    pub unsafe fn gcn_arch_name(ordinal: i32) -> Option<String> {
        #[repr(C, align(16))]
        struct Props([u8; 16384]);
        let mut props = Box::new(Props([0; 16384]));
        let off = std::mem::offset_of!(sys::hipDeviceProp_t, gcnArchName);
        let len = std::mem::size_of::<[std::ffi::c_char; 256]>();
        if sys::hipGetDeviceProperties(props.0.as_mut_ptr().cast(), ordinal)
            != sys::hipError_t::hipSuccess
        {
            return None;
        }
        let field = props.0.get(off..off + len)?;
        let end = field.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&field[..end]).ok()?;
        let isa = name.split(':').next()?;
        let ok = (isa.len() > 3
            && isa.starts_with("gfx")
            && isa[3..].chars().all(|c| c.is_ascii_hexdigit()))
            || (isa.len() > 3
                && isa.starts_with("sm_")
                && isa[3..].chars().all(|c| c.is_ascii_digit()));
        ok.then(|| name.to_string())
    }

    /// See [hipDeviceTotalMem](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___device.html)
    ///
    /// # Safety
    /// `ordinal` is a valid device.
    pub unsafe fn total_mem(ordinal: i32) -> Result<u64> {
        let mut dev: sys::hipDevice_t = 0;
        check("hipDeviceGet", sys::hipDeviceGet(&mut dev, ordinal))?;
        let mut bytes = 0usize;
        check("hipDeviceTotalMem", sys::hipDeviceTotalMem(&mut bytes, dev))?;
        Ok(bytes as u64)
    }

    /// (free, total) bytes of the current device.
    ///
    /// See [hipMemGetInfo](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___memory.html)
    ///
    /// # Safety
    /// A device is current.
    pub unsafe fn mem_info() -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        check("hipMemGetInfo", sys::hipMemGetInfo(&mut free, &mut total))?;
        Ok((free as u64, total as u64))
    }
}

/// Virtual memory management (HIP mirrors the CUDA VMM API).
///
/// See [Virtual Memory Management](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
pub mod vmm {
    use super::*;

    fn pinned_device_prop(ordinal: i32) -> sys::hipMemAllocationProp {
        // SAFETY: plain C struct; all-zero is "no flags, no handle types".
        let mut prop: sys::hipMemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::hipMemAllocationType::hipMemAllocationTypePinned;
        prop.location.type_ = sys::hipMemLocationType::hipMemLocationTypeDevice;
        prop.location.id = ordinal;
        prop
    }

    /// `hipMemLocationTypeHostNuma` (3 in ROCm's hip_runtime_api.h since
    /// host-located `hipMemCreate` exists; the ROCm 5 headers CI compiles
    /// against stop at `hipMemLocationTypeDevice`).
    const LOCATION_HOST_NUMA: u32 = 3;

    /// Properties of a pinned allocation in host memory of NUMA node `numa`.
    fn pinned_host_prop(numa: i32) -> sys::hipMemAllocationProp {
        let mut prop = pinned_device_prop(0);
        // SAFETY: `type_` is a C enum (4 bytes, `#[repr(u32)]` in the
        // bindings); the value is written as its integer and never read back
        // as the Rust enum: the struct only travels to HIP by pointer.
        unsafe {
            std::ptr::addr_of_mut!(prop.location.type_)
                .cast::<u32>()
                .write(LOCATION_HOST_NUMA)
        };
        prop.location.id = numa;
        prop
    }

    /// Granularity of pinned host memory on NUMA node `numa` (an error where
    /// HIP cannot create host-located memory).
    ///
    /// # Safety
    /// HIP is initialized.
    pub unsafe fn host_granularity(numa: i32) -> Result<u64> {
        let prop = pinned_host_prop(numa);
        let mut g = 0usize;
        check(
            "hipMemGetAllocationGranularity",
            sys::hipMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum,
            ),
        )?;
        Ok(g as u64)
    }

    /// `hipMemCreate` of `bytes` of pinned host memory on NUMA node `numa`.
    ///
    /// # Safety
    /// HIP is initialized; `bytes` is a multiple of [`host_granularity`].
    pub unsafe fn create_host(
        numa: i32,
        bytes: u64,
    ) -> Result<sys::hipMemGenericAllocationHandle_t> {
        let prop = pinned_host_prop(numa);
        let mut handle: sys::hipMemGenericAllocationHandle_t = std::ptr::null_mut();
        check_alloc(
            "hipMemCreate (host NUMA)",
            sys::hipMemCreate(&mut handle, bytes as usize, &prop, 0),
            bytes,
        )?;
        Ok(handle)
    }

    /// See [hipMemGetAllocationGranularity](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// HIP is initialized.
    pub unsafe fn granularity(ordinal: i32) -> Result<u64> {
        let prop = pinned_device_prop(ordinal);
        let mut g = 0usize;
        check(
            "hipMemGetAllocationGranularity",
            sys::hipMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum,
            ),
        )?;
        Ok(g as u64)
    }

    /// See [hipMemCreate](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// The device is current; `bytes` is a multiple of the granularity.
    pub unsafe fn create(ordinal: i32, bytes: u64) -> Result<sys::hipMemGenericAllocationHandle_t> {
        let prop = pinned_device_prop(ordinal);
        let mut handle: sys::hipMemGenericAllocationHandle_t = std::ptr::null_mut();
        check_alloc(
            "hipMemCreate",
            sys::hipMemCreate(&mut handle, bytes as usize, &prop, 0),
            bytes,
        )?;
        Ok(handle)
    }

    /// See [hipMemRelease](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// `handle` came from [`create`] and is not released yet.
    pub unsafe fn release(handle: sys::hipMemGenericAllocationHandle_t) -> Result<()> {
        check("hipMemRelease", sys::hipMemRelease(handle))
    }

    /// See [hipMemAddressReserve](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// The device is current; `bytes` is a multiple of the granularity.
    pub unsafe fn address_reserve(bytes: u64, align: u64) -> Result<u64> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        check_alloc(
            "hipMemAddressReserve",
            sys::hipMemAddressReserve(
                &mut ptr,
                bytes as usize,
                align as usize,
                std::ptr::null_mut(),
                0,
            ),
            bytes,
        )?;
        Ok(ptr as u64)
    }

    /// See [hipMemAddressFree](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// `(ptr, bytes)` is exactly one live reservation.
    pub unsafe fn address_free(ptr: u64, bytes: u64) -> Result<()> {
        check(
            "hipMemAddressFree",
            sys::hipMemAddressFree(ptr as *mut c_void, bytes as usize),
        )
    }

    /// See [hipMemMap](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// `ptr..ptr+bytes` lies in a reservation; `offset + bytes` fits the allocation.
    pub unsafe fn map(
        ptr: u64,
        bytes: u64,
        offset: u64,
        handle: sys::hipMemGenericAllocationHandle_t,
    ) -> Result<()> {
        check(
            "hipMemMap",
            sys::hipMemMap(
                ptr as *mut c_void,
                bytes as usize,
                offset as usize,
                handle,
                0,
            ),
        )
    }

    /// See [hipMemUnmap](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// No queued work uses the range.
    pub unsafe fn unmap(ptr: u64, bytes: u64) -> Result<()> {
        check(
            "hipMemUnmap",
            sys::hipMemUnmap(ptr as *mut c_void, bytes as usize),
        )
    }

    /// See [hipMemSetAccess](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___virtual.html)
    ///
    /// # Safety
    /// The range is mapped.
    pub unsafe fn set_access(ptr: u64, bytes: u64, ordinal: i32) -> Result<()> {
        let mut desc: sys::hipMemAccessDesc = std::mem::zeroed();
        desc.location.type_ = sys::hipMemLocationType::hipMemLocationTypeDevice;
        desc.location.id = ordinal;
        desc.flags = sys::hipMemAccessFlags::hipMemAccessFlagsProtReadWrite;
        check(
            "hipMemSetAccess",
            sys::hipMemSetAccess(ptr as *mut c_void, bytes as usize, &desc, 1),
        )
    }
}

/// Streams and events.
///
/// See [Stream Management](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___stream.html)
/// and [Event Management](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___event.html)
pub mod stream {
    use super::*;

    /// A non-blocking stream.
    ///
    /// # Safety
    /// A device is current.
    pub unsafe fn create() -> Result<sys::hipStream_t> {
        let mut s: sys::hipStream_t = std::ptr::null_mut();
        check(
            "hipStreamCreateWithFlags",
            sys::hipStreamCreateWithFlags(&mut s, sys::hipStreamNonBlocking),
        )?;
        Ok(s)
    }

    /// # Safety
    /// `s` is live and destroyed once.
    pub unsafe fn destroy(s: sys::hipStream_t) -> Result<()> {
        check("hipStreamDestroy", sys::hipStreamDestroy(s))
    }

    /// # Safety
    /// `s` is live.
    pub unsafe fn synchronize(s: sys::hipStream_t) -> Result<()> {
        check("hipStreamSynchronize", sys::hipStreamSynchronize(s))
    }

    /// # Safety
    /// `s` and `e` are live.
    pub unsafe fn wait_event(s: sys::hipStream_t, e: sys::hipEvent_t) -> Result<()> {
        check("hipStreamWaitEvent", sys::hipStreamWaitEvent(s, e, 0))
    }

    /// An event, with timing enabled unless `untimed`.
    ///
    /// # Safety
    /// A device is current.
    pub unsafe fn event_create(untimed: bool) -> Result<sys::hipEvent_t> {
        let mut e: sys::hipEvent_t = std::ptr::null_mut();
        let flags = if untimed {
            sys::hipEventDisableTiming
        } else {
            sys::hipEventDefault
        };
        check(
            "hipEventCreateWithFlags",
            sys::hipEventCreateWithFlags(&mut e, flags),
        )?;
        Ok(e)
    }

    /// # Safety
    /// `e` is live and destroyed once.
    pub unsafe fn event_destroy(e: sys::hipEvent_t) -> Result<()> {
        check("hipEventDestroy", sys::hipEventDestroy(e))
    }

    /// # Safety
    /// `e` and `s` are live.
    pub unsafe fn event_record(e: sys::hipEvent_t, s: sys::hipStream_t) -> Result<()> {
        check("hipEventRecord", sys::hipEventRecord(e, s))
    }

    /// `Ok(true)` when complete, `Ok(false)` when pending.
    ///
    /// # Safety
    /// `e` is live.
    pub unsafe fn event_query(e: sys::hipEvent_t) -> Result<bool> {
        match sys::hipEventQuery(e) {
            sys::hipError_t::hipSuccess => Ok(true),
            sys::hipError_t::hipErrorNotReady => Ok(false),
            code => Err(driver_error("hipEventQuery", code)),
        }
    }

    /// # Safety
    /// `e` is live.
    pub unsafe fn event_synchronize(e: sys::hipEvent_t) -> Result<()> {
        check("hipEventSynchronize", sys::hipEventSynchronize(e))
    }

    /// # Safety
    /// Both events are live.
    pub unsafe fn event_elapsed_ms(start: sys::hipEvent_t, end: sys::hipEvent_t) -> Result<f32> {
        let mut ms = 0f32;
        check(
            "hipEventElapsedTime",
            sys::hipEventElapsedTime(&mut ms, start, end),
        )?;
        Ok(ms)
    }
}

/// Copies, fills and pinned host memory.
///
/// See [Memory Management](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___memory.html)
pub mod memory {
    use super::*;

    /// # Safety
    /// `stream` is live (device addresses fault the device, not the host).
    pub unsafe fn copy_d2d(
        dst: u64,
        src: u64,
        bytes: usize,
        stream: sys::hipStream_t,
    ) -> Result<()> {
        check(
            "hipMemcpyDtoDAsync",
            sys::hipMemcpyDtoDAsync(dst as *mut c_void, src as *mut c_void, bytes, stream),
        )
    }

    /// # Safety
    /// `src..src+bytes` is readable until the copy completes.
    pub unsafe fn copy_h2d(
        dst: u64,
        src: *const c_void,
        bytes: usize,
        stream: sys::hipStream_t,
    ) -> Result<()> {
        check(
            "hipMemcpyHtoDAsync",
            sys::hipMemcpyHtoDAsync(dst as *mut c_void, src as *mut c_void, bytes, stream),
        )
    }

    /// # Safety
    /// `dst..dst+bytes` is writable and unread until the copy completes.
    pub unsafe fn copy_d2h(
        dst: *mut c_void,
        src: u64,
        bytes: usize,
        stream: sys::hipStream_t,
    ) -> Result<()> {
        check(
            "hipMemcpyDtoHAsync",
            sys::hipMemcpyDtoHAsync(dst, src as *mut c_void, bytes, stream),
        )
    }

    /// # Safety
    /// As [`copy_d2d`].
    pub unsafe fn memset_d8(
        dst: u64,
        value: u8,
        count: usize,
        stream: sys::hipStream_t,
    ) -> Result<()> {
        check(
            "hipMemsetD8Async",
            sys::hipMemsetD8Async(dst as *mut c_void, value, count, stream),
        )
    }

    /// # Safety
    /// As [`copy_d2d`]; `dst` is 4-byte aligned.
    pub unsafe fn memset_d32(
        dst: u64,
        value: u32,
        count: usize,
        stream: sys::hipStream_t,
    ) -> Result<()> {
        check(
            "hipMemsetD32Async",
            sys::hipMemsetD32Async(dst as *mut c_void, value as i32, count, stream),
        )
    }

    /// Page-locked, portable host memory.
    ///
    /// # Safety
    /// A device is current.
    pub unsafe fn host_alloc(bytes: usize) -> Result<*mut c_void> {
        let mut p: *mut c_void = std::ptr::null_mut();
        check_alloc(
            "hipHostMalloc",
            sys::hipHostMalloc(&mut p, bytes, sys::hipHostMallocPortable),
            bytes as u64,
        )?;
        Ok(p)
    }

    /// # Safety
    /// `p` came from [`host_alloc`], is freed once and no copy uses it.
    pub unsafe fn host_free(p: *mut c_void) -> Result<()> {
        check("hipHostFree", sys::hipHostFree(p))
    }
}

/// Code objects and kernel launch.
///
/// See [Module Management](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___module.html)
pub mod module {
    use super::*;

    /// `hipModuleLaunchKernel`'s `extra` keys (hip_runtime_api.h macros).
    const LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
    const LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
    const LAUNCH_PARAM_END: usize = 0x03;

    /// # Safety
    /// `image` points to a complete code object that outlives the call.
    pub unsafe fn load_data(image: *const c_void) -> Result<sys::hipModule_t> {
        let mut m: sys::hipModule_t = std::ptr::null_mut();
        check("hipModuleLoadData", sys::hipModuleLoadData(&mut m, image))?;
        Ok(m)
    }

    /// # Safety
    /// `m` is loaded and unloaded once, with no function of it in use.
    pub unsafe fn unload(m: sys::hipModule_t) -> Result<()> {
        check("hipModuleUnload", sys::hipModuleUnload(m))
    }

    /// # Safety
    /// `m` is loaded.
    pub unsafe fn function(m: sys::hipModule_t, name: &CStr) -> Result<sys::hipFunction_t> {
        let mut f: sys::hipFunction_t = std::ptr::null_mut();
        check(
            "hipModuleGetFunction",
            sys::hipModuleGetFunction(&mut f, m, name.as_ptr()),
        )?;
        Ok(f)
    }

    /// Launch `f` with its arguments packed in one kernarg buffer (HIP has
    /// no parameter-size query, so the buffer form is used: the runtime
    /// copies exactly `args.len()` bytes, never more).
    ///
    /// See [hipModuleLaunchKernel](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___module.html)
    ///
    /// # Safety
    /// `f` and `stream` are live.
    pub unsafe fn launch(
        f: sys::hipFunction_t,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: sys::hipStream_t,
        args: &mut [u8],
    ) -> Result<()> {
        let mut size = args.len();
        let mut extra: [*mut c_void; 5] = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            args.as_mut_ptr().cast(),
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            LAUNCH_PARAM_END as *mut c_void,
        ];
        check(
            "hipModuleLaunchKernel",
            sys::hipModuleLaunchKernel(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem_bytes,
                stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            ),
        )
    }
}

/// Stream capture, graph instantiate / launch / update.
///
/// See [Graph Management](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___graph.html)
pub mod graph {
    use super::*;

    /// Every node of `g`.
    ///
    /// # Safety
    /// `g` is live and not mutated concurrently.
    pub unsafe fn nodes(g: sys::hipGraph_t) -> Result<Vec<sys::hipGraphNode_t>> {
        let mut n = 0usize;
        check(
            "hipGraphGetNodes",
            sys::hipGraphGetNodes(g, std::ptr::null_mut(), &mut n),
        )?;
        let mut nodes = vec![std::ptr::null_mut(); n];
        if n > 0 {
            check(
                "hipGraphGetNodes",
                sys::hipGraphGetNodes(g, nodes.as_mut_ptr(), &mut n),
            )?;
        }
        nodes.truncate(n);
        Ok(nodes)
    }

    /// The function a node launches, `None` when it is not a kernel node.
    ///
    /// # Safety
    /// `node` is a live node of a live graph.
    pub unsafe fn kernel_node_function(node: sys::hipGraphNode_t) -> Result<Option<*mut c_void>> {
        // Read back as a plain integer: the runtime may report a node type
        // the bindings' enum does not list.
        let mut ty: u32 = u32::MAX;
        check(
            "hipGraphNodeGetType",
            sys::hipGraphNodeGetType(node, (&mut ty as *mut u32).cast()),
        )?;
        if ty != sys::hipGraphNodeType::hipGraphNodeTypeKernel as u32 {
            return Ok(None);
        }
        // SAFETY (of the zeroed value): plain C struct the runtime fills.
        let mut p: sys::hipKernelNodeParams = std::mem::zeroed();
        check(
            "hipGraphKernelNodeGetParams",
            sys::hipGraphKernelNodeGetParams(node, &mut p),
        )?;
        Ok(Some(p.func))
    }

    /// Turn kernel node `node` of `e` on or off (off: an empty node).
    /// A runtime without the call answers [`DeviceError::Unsupported`].
    ///
    /// See [hipGraphNodeSetEnabled](https://rocm.docs.amd.com/projects/HIP/en/latest/doxygen/html/group___graph.html)
    ///
    /// # Safety
    /// `e` is live and `node` a node of the graph it was instantiated from.
    pub unsafe fn exec_node_set_enabled(
        e: sys::hipGraphExec_t,
        node: sys::hipGraphNode_t,
        enabled: bool,
    ) -> Result<()> {
        match sys::hipGraphNodeSetEnabled(e, node, u32::from(enabled)) {
            sys::hipError_t::hipErrorNotSupported => Err(DeviceError::Unsupported(
                "turning graph nodes off: this HIP runtime has no hipGraphNodeSetEnabled".into(),
            )),
            code => check("hipGraphNodeSetEnabled", code),
        }
    }

    /// New grid, block and arguments of kernel node `node` of `e` for the
    /// launches that follow.
    ///
    /// # Safety
    /// `e` is live, `node` a kernel node of the graph it came from launching
    /// `func`; `params[i]` points to kernel argument `i`'s bytes, which
    /// outlive the call.
    pub unsafe fn exec_kernel_node_set(
        e: sys::hipGraphExec_t,
        node: sys::hipGraphNode_t,
        func: sys::hipFunction_t,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let dim = |d: [u32; 3]| sys::dim3 {
            x: d[0],
            y: d[1],
            z: d[2],
        };
        let p = sys::hipKernelNodeParams {
            blockDim: dim(block),
            extra: std::ptr::null_mut(),
            func: func.cast(),
            gridDim: dim(grid),
            kernelParams: if params.is_empty() {
                std::ptr::null_mut()
            } else {
                params.as_mut_ptr()
            },
            sharedMemBytes: shared_mem_bytes,
        };
        check(
            "hipGraphExecKernelNodeSetParams",
            sys::hipGraphExecKernelNodeSetParams(e, node, &p),
        )
    }

    /// # Safety
    /// `s` is live and not capturing.
    pub unsafe fn begin_capture(s: sys::hipStream_t) -> Result<()> {
        check(
            "hipStreamBeginCapture",
            sys::hipStreamBeginCapture(s, sys::hipStreamCaptureMode::hipStreamCaptureModeRelaxed),
        )
    }

    /// Is `s` capturing (or in an invalidated capture)?
    ///
    /// # Safety
    /// `s` is live.
    pub unsafe fn is_capturing(s: sys::hipStream_t) -> Result<bool> {
        // Read back as a plain integer (see `exec_update`).
        let mut status: u32 = 0;
        check(
            "hipStreamIsCapturing",
            sys::hipStreamIsCapturing(
                s,
                (&mut status as *mut u32).cast::<sys::hipStreamCaptureStatus>(),
            ),
        )?;
        Ok(status != 0)
    }

    /// # Safety
    /// `s` is live.
    pub unsafe fn end_capture(s: sys::hipStream_t) -> Result<sys::hipGraph_t> {
        let mut g: sys::hipGraph_t = std::ptr::null_mut();
        check("hipStreamEndCapture", sys::hipStreamEndCapture(s, &mut g))?;
        Ok(g)
    }

    /// # Safety
    /// `g` is live.
    pub unsafe fn instantiate(g: sys::hipGraph_t) -> Result<sys::hipGraphExec_t> {
        let mut e: sys::hipGraphExec_t = std::ptr::null_mut();
        check(
            "hipGraphInstantiateWithFlags",
            sys::hipGraphInstantiateWithFlags(&mut e, g, 0),
        )?;
        Ok(e)
    }

    /// # Safety
    /// `e` and `s` are live.
    pub unsafe fn launch(e: sys::hipGraphExec_t, s: sys::hipStream_t) -> Result<()> {
        check("hipGraphLaunch", sys::hipGraphLaunch(e, s))
    }

    /// `Ok(false)` when the runtime refuses the in-place update.
    ///
    /// # Safety
    /// `e` and `g` are live and not used concurrently.
    pub unsafe fn exec_update(e: sys::hipGraphExec_t, g: sys::hipGraph_t) -> Result<bool> {
        let mut error_node: sys::hipGraphNode_t = std::ptr::null_mut();
        // Read back as a plain integer: the runtime may write a value the
        // bindings' Rust enum does not list.
        let mut result: u32 = 0;
        let r = sys::hipGraphExecUpdate(
            e,
            g,
            &mut error_node,
            (&mut result as *mut u32).cast::<sys::hipGraphExecUpdateResult>(),
        );
        if r == sys::hipError_t::hipErrorGraphExecUpdateFailure {
            tracing::debug!(result, "hipGraphExecUpdate refused");
            return Ok(false);
        }
        check("hipGraphExecUpdate", r)?;
        Ok(true)
    }

    /// # Safety
    /// `g` is live and owned by the caller.
    pub unsafe fn destroy(g: sys::hipGraph_t) -> Result<()> {
        check("hipGraphDestroy", sys::hipGraphDestroy(g))
    }

    /// # Safety
    /// `e` is live.
    pub unsafe fn exec_destroy(e: sys::hipGraphExec_t) -> Result<()> {
        check("hipGraphExecDestroy", sys::hipGraphExecDestroy(e))
    }
}

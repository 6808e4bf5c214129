//! The `result` layer for what cudarc leaves raw: every driver call returns
//! [`Result`], grouped by area, each with a link to its driver doc.
//!
//! cudarc's own `result` module covers contexts, streams, events, modules and
//! plain graph launch; this module adds VMM (`cuMem*` physical memory and VA
//! management), graph instantiate/update, conditional nodes and capture into
//! an existing graph, `cuLaunchKernelEx` with launch attributes, pinned host
//! memory, 32-bit memsets and raw-pointer copies.
//!
//! Every function here is `unsafe` because the driver trusts its arguments
//! (handles, pointers, sizes); the callers in [`super`] validate them first.

use std::ffi::{c_void, CStr};

use xla_vmm_ffi::cuda::driver as sys;

use crate::error::{DeviceError, Result};

/// Turn a driver result into `Ok(())` or [`DeviceError::Driver`] naming `call`.
/// `CUDA_ERROR_OUT_OF_MEMORY` becomes [`DeviceError::OutOfMemory`].
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> Result<()> {
    check_alloc(call, code, 0)
}

/// [`check`] for allocating calls: an out-of-memory error carries `bytes`.
pub(crate) fn check_alloc(call: &'static str, code: sys::CUresult, bytes: u64) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    if code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(DeviceError::OutOfMemory {
            what: call.to_string(),
            bytes,
        });
    }
    Err(driver_error(call, code))
}

/// Convert a cudarc error raised by `call` (cudarc's safe layer).
pub(crate) fn from_cudarc(call: &'static str, err: cudarc::driver::DriverError) -> DeviceError {
    match check(call, err.0) {
        Err(e) => e,
        Ok(()) => DeviceError::Driver {
            call,
            code: 0,
            name: "CUDA_SUCCESS".into(),
            message: "cudarc reported an error with a success code".into(),
        },
    }
}

/// [`DeviceError::Driver`] with the name and text the driver gives `code`.
///
/// See [cuGetErrorName](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__ERROR.html#group__CUDA__ERROR_1g2c4ac087113652bb3d1f95bf2513c468)
pub(crate) fn driver_error(call: &'static str, code: sys::CUresult) -> DeviceError {
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    let mut text_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both out-pointers are valid locals; the driver writes pointers
    // to static NUL-terminated strings (or leaves them null on an unknown code).
    let (rn, rt) = unsafe {
        (
            sys::cuGetErrorName(code, &mut name_ptr),
            sys::cuGetErrorString(code, &mut text_ptr),
        )
    };
    let to_string = |r: sys::CUresult, p: *const std::ffi::c_char| {
        if r == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            // SAFETY: the driver returned a static C string for this code.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            String::new()
        }
    };
    let mut name = to_string(rn, name_ptr);
    if name.is_empty() {
        name = format!("{code:?}");
    }
    DeviceError::Driver {
        call,
        code: code as i64,
        name,
        message: to_string(rt, text_ptr),
    }
}

/// Device attributes and memory info.
pub mod device {
    use super::*;

    /// See [cuDeviceGetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html#group__CUDA__DEVICE_1g9c3e1414f0ad901d3278a4d6645fc266)
    ///
    /// # Safety
    /// `dev` is a valid device.
    pub unsafe fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
        let mut v = 0i32;
        check(
            "cuDeviceGetAttribute",
            sys::cuDeviceGetAttribute(&mut v, attr, dev),
        )?;
        Ok(v)
    }

    /// (free, total) bytes of the current context's device.
    ///
    /// See [cuMemGetInfo](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g808f555540d0143a331cc42aec7b5da7)
    ///
    /// # Safety
    /// A context is current on this thread.
    pub unsafe fn mem_info() -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        check("cuMemGetInfo", sys::cuMemGetInfo_v2(&mut free, &mut total))?;
        Ok((free as u64, total as u64))
    }

    /// Driver version as 1000 × major + 10 × minor (e.g. 13000).
    ///
    /// See [cuDriverGetVersion](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VERSION.html)
    ///
    /// # Safety
    /// The driver library is loaded.
    pub unsafe fn driver_version() -> Result<i32> {
        let mut v = 0i32;
        check("cuDriverGetVersion", sys::cuDriverGetVersion(&mut v))?;
        Ok(v)
    }
}

/// Virtual memory management: physical allocations, VA reservations, mappings.
///
/// See [Virtual Memory Management](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html)
pub mod vmm {
    use super::*;

    /// Properties of a pinned allocation resident on device `ordinal`.
    fn pinned_device_prop(ordinal: i32) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a plain C struct; all-zero is its
        // documented "no flags, no handle types" value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ordinal;
        prop
    }

    /// Properties of a pinned allocation in host memory of NUMA node `numa`
    /// (mapped for the device with [`set_access`] like device memory).
    fn pinned_host_prop(numa: i32) -> sys::CUmemAllocationProp {
        // SAFETY: as in `pinned_device_prop`.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA;
        prop.location.id = numa;
        prop
    }

    /// Minimum granularity of pinned host allocations on NUMA node `numa`
    /// (an error where the driver cannot create host-located memory).
    ///
    /// # Safety
    /// The driver is initialized.
    pub unsafe fn host_granularity(numa: i32) -> Result<u64> {
        let prop = pinned_host_prop(numa);
        let mut g = 0usize;
        check(
            "cuMemGetAllocationGranularity",
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            ),
        )?;
        Ok(g as u64)
    }

    /// Create `bytes` of pinned host memory on NUMA node `numa`.
    ///
    /// See [cuMemCreate](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1g899d69a862bba36449789c64b430dc7c)
    ///
    /// # Safety
    /// The driver is initialized; `bytes` is a multiple of [`host_granularity`].
    pub unsafe fn create_host(numa: i32, bytes: u64) -> Result<sys::CUmemGenericAllocationHandle> {
        let prop = pinned_host_prop(numa);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check_alloc(
            "cuMemCreate (host NUMA)",
            sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0),
            bytes,
        )?;
        Ok(handle)
    }

    /// Minimum granularity of pinned device allocations on `ordinal`.
    ///
    /// See [cuMemGetAllocationGranularity](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1g30ee906c2cf66a0347b3dfec3d7eb31a)
    ///
    /// # Safety
    /// The driver is initialized.
    pub unsafe fn granularity(ordinal: i32) -> Result<u64> {
        let prop = pinned_device_prop(ordinal);
        let mut g = 0usize;
        check(
            "cuMemGetAllocationGranularity",
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            ),
        )?;
        Ok(g as u64)
    }

    /// Create `bytes` of physical memory on device `ordinal`.
    ///
    /// See [cuMemCreate](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1g899d69a862bba36449789c64b430dc7c)
    ///
    /// # Safety
    /// A context of that device is current; `bytes` is a multiple of the granularity.
    pub unsafe fn create(ordinal: i32, bytes: u64) -> Result<sys::CUmemGenericAllocationHandle> {
        let prop = pinned_device_prop(ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check_alloc(
            "cuMemCreate",
            sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0),
            bytes,
        )?;
        Ok(handle)
    }

    /// See [cuMemRelease](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1g3014f0759f43a8d82db951b8e4b91d68)
    ///
    /// # Safety
    /// `handle` came from [`create`] and is not released yet.
    pub unsafe fn release(handle: sys::CUmemGenericAllocationHandle) -> Result<()> {
        check("cuMemRelease", sys::cuMemRelease(handle))
    }

    /// Reserve `bytes` of VA space aligned to `align` (0 = default).
    ///
    /// See [cuMemAddressReserve](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1ge489256c107df2a07ddf96d80c86cd9b)
    ///
    /// # Safety
    /// A context is current; `bytes` is a multiple of the granularity.
    pub unsafe fn address_reserve(bytes: u64, align: u64) -> Result<sys::CUdeviceptr> {
        let mut ptr: sys::CUdeviceptr = 0;
        check_alloc(
            "cuMemAddressReserve",
            sys::cuMemAddressReserve(&mut ptr, bytes as usize, align as usize, 0, 0),
            bytes,
        )?;
        Ok(ptr)
    }

    /// See [cuMemAddressFree](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1g6993ecea2ea03e1b802b8255edc2da5b)
    ///
    /// # Safety
    /// `(ptr, bytes)` is exactly one live reservation.
    pub unsafe fn address_free(ptr: sys::CUdeviceptr, bytes: u64) -> Result<()> {
        check(
            "cuMemAddressFree",
            sys::cuMemAddressFree(ptr, bytes as usize),
        )
    }

    /// Map `bytes` of `handle` starting at `offset` at `ptr`.
    ///
    /// See [cuMemMap](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1gff1d395423af5c5c75375516959dae56)
    ///
    /// # Safety
    /// `ptr..ptr+bytes` lies in a reservation; `offset + bytes` fits in the allocation.
    pub unsafe fn map(
        ptr: sys::CUdeviceptr,
        bytes: u64,
        offset: u64,
        handle: sys::CUmemGenericAllocationHandle,
    ) -> Result<()> {
        check(
            "cuMemMap",
            sys::cuMemMap(ptr, bytes as usize, offset as usize, handle, 0),
        )
    }

    /// See [cuMemUnmap](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1gfb50aac00c848fd7087e858f59bf7e2a)
    ///
    /// # Safety
    /// No queued work uses the range (the call is not stream ordered).
    pub unsafe fn unmap(ptr: sys::CUdeviceptr, bytes: u64) -> Result<()> {
        check("cuMemUnmap", sys::cuMemUnmap(ptr, bytes as usize))
    }

    /// Grant device `ordinal` read/write access to a mapped range.
    ///
    /// See [cuMemSetAccess](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html#group__CUDA__VA_1g1b6b12b10e8324bf462ecab4e7ef30e1)
    ///
    /// # Safety
    /// The range is mapped.
    pub unsafe fn set_access(ptr: sys::CUdeviceptr, bytes: u64, ordinal: i32) -> Result<()> {
        // SAFETY (of the zeroed value): plain C struct, every field set below.
        let mut desc: sys::CUmemAccessDesc = std::mem::zeroed();
        desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = ordinal;
        desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        check(
            "cuMemSetAccess",
            sys::cuMemSetAccess(ptr, bytes as usize, &desc, 1),
        )
    }
}

/// Copies, fills and pinned host memory.
pub mod memory {
    use super::*;

    /// See [cuMemcpyDtoDAsync](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g39ea09ba682b8eccc9c3e0c04319b5c8)
    ///
    /// # Safety
    /// `stream` is live; device ranges are the caller's responsibility (a bad
    /// device address faults the context, it cannot corrupt host memory).
    pub unsafe fn copy_d2d(
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        check(
            "cuMemcpyDtoDAsync",
            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream),
        )
    }

    /// Batched device-to-device copies, one driver call.
    ///
    /// See [cuMemcpyBatchAsync](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
    /// (CUDA 13 symbol `cuMemcpyBatchAsync_v2`, without `failIdx`). One
    /// attribute set applies to every copy: the source is read in stream
    /// order, both operands live on device `ordinal`.
    ///
    /// # Safety
    /// The driver has the symbol (`symbols::MEMCPY_BATCH`); `stream` is
    /// live, not capturing (the call has no graph node) and not the legacy
    /// NULL stream (the driver rejects it); device ranges as [`copy_d2d`],
    /// no copy writing what another one of the batch touches.
    pub unsafe fn copy_d2d_batch(
        dsts: &mut [sys::CUdeviceptr],
        srcs: &mut [sys::CUdeviceptr],
        sizes: &mut [usize],
        ordinal: i32,
        stream: sys::CUstream,
    ) -> Result<()> {
        let n = dsts.len();
        if srcs.len() != n || sizes.len() != n {
            return Err(DeviceError::InvalidArgument(format!(
                "copy batch: {n} destinations, {} sources, {} sizes",
                srcs.len(),
                sizes.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY (of the zeroed value): plain C struct, every field set below.
        let mut attrs: sys::CUmemcpyAttributes = std::mem::zeroed();
        attrs.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        attrs.srcLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        attrs.srcLocHint.id = ordinal;
        attrs.dstLocHint = attrs.srcLocHint;
        attrs.flags = 0;
        // The attribute set applies from copy 0 on.
        let mut first = [0usize];
        check(
            "cuMemcpyBatchAsync",
            sys::cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                &mut attrs,
                first.as_mut_ptr(),
                1,
                stream,
            ),
        )
    }

    /// See [cuMemcpyHtoDAsync](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g1572263fe2597d7ba4f6964597a354a3)
    ///
    /// # Safety
    /// `src..src+bytes` is readable host memory until the copy completes.
    pub unsafe fn copy_h2d(
        dst: sys::CUdeviceptr,
        src: *const c_void,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        check(
            "cuMemcpyHtoDAsync",
            sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream),
        )
    }

    /// See [cuMemcpyDtoHAsync](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g56f30236c7c5247f8e061b59d3268362)
    ///
    /// # Safety
    /// `dst..dst+bytes` is writable host memory nobody reads until the copy completes.
    pub unsafe fn copy_d2h(
        dst: *mut c_void,
        src: sys::CUdeviceptr,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        check(
            "cuMemcpyDtoHAsync",
            sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream),
        )
    }

    /// See [cuMemsetD8Async](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1gaef08a7ccd61112f94e82f2b30d43627)
    ///
    /// # Safety
    /// As [`copy_d2d`].
    pub unsafe fn memset_d8(
        dst: sys::CUdeviceptr,
        value: u8,
        count: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        check(
            "cuMemsetD8Async",
            sys::cuMemsetD8Async(dst, value, count, stream),
        )
    }

    /// See [cuMemsetD32Async](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g58229da5d30f1c0cdf667b320ec2c0f5)
    ///
    /// # Safety
    /// As [`copy_d2d`]; `dst` is 4-byte aligned.
    pub unsafe fn memset_d32(
        dst: sys::CUdeviceptr,
        value: u32,
        count: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        check(
            "cuMemsetD32Async",
            sys::cuMemsetD32Async(dst, value, count, stream),
        )
    }

    /// Page-locked, portable host memory.
    ///
    /// See [cuMemHostAlloc](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g572ca4011bfcb25034888a14d4e035b9)
    ///
    /// # Safety
    /// A context is current.
    pub unsafe fn host_alloc(bytes: usize) -> Result<*mut c_void> {
        let mut p: *mut c_void = std::ptr::null_mut();
        check_alloc(
            "cuMemHostAlloc",
            sys::cuMemHostAlloc(
                &mut p,
                bytes,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            ),
            bytes as u64,
        )?;
        Ok(p)
    }

    /// See [cuMemFreeHost](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g62e0fdbe181dab6b1c90fa1a51c7b92c)
    ///
    /// # Safety
    /// `p` came from [`host_alloc`], is not freed yet and no copy uses it.
    pub unsafe fn host_free(p: *mut c_void) -> Result<()> {
        check("cuMemFreeHost", sys::cuMemFreeHost(p))
    }
}

/// Kernel launch with attributes and parameter introspection.
pub mod launch {
    use super::*;

    /// Size in bytes of every parameter of `f`, in order.
    ///
    /// See [cuFuncGetParamInfo](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html)
    ///
    /// # Safety
    /// `f` is a live function.
    pub unsafe fn param_sizes(f: sys::CUfunction) -> Result<Vec<usize>> {
        let mut sizes = Vec::new();
        // Kernel parameters are limited to 32 KiB, so at most 32764 / 1 of them.
        for index in 0..32_768usize {
            let (mut offset, mut size) = (0usize, 0usize);
            let r = sys::cuFuncGetParamInfo(f, index, &mut offset, &mut size);
            if r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
                break;
            }
            check("cuFuncGetParamInfo", r)?;
            sizes.push(size);
        }
        Ok(sizes)
    }

    /// Launch `f` with optional cluster dims and programmatic stream serialization.
    ///
    /// See [cuLaunchKernelEx](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html#group__CUDA__EXEC_1gb9c891eb6bb8f4089758e64c9c976db9)
    ///
    /// # Safety
    /// `f` and `stream` are live; `params[i]` points to at least as many
    /// readable bytes as parameter `i` of `f` has.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_ex(
        f: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        cluster: Option<[u32; 3]>,
        pdl: bool,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY (of the zeroed values): plain C structs/unions of integers.
        let mut attrs: [sys::CUlaunchAttribute; 2] = std::mem::zeroed();
        let mut n = 0usize;
        if let Some([x, y, z]) = cluster {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = x;
            attrs[n].value.clusterDim.y = y;
            attrs[n].value.clusterDim.z = z;
            n += 1;
        }
        if pdl {
            attrs[n].id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: block[0],
            blockDimY: block[1],
            blockDimZ: block[2],
            sharedMemBytes: shared_mem_bytes,
            hStream: stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        let params_ptr = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        check(
            "cuLaunchKernelEx",
            sys::cuLaunchKernelEx(&config, f, params_ptr, std::ptr::null_mut()),
        )
    }
}

/// Graph instantiate / update, capture into an existing graph, conditional nodes.
///
/// See [Graph Management](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
pub mod graph {
    use super::*;

    /// See [cuGraphInstantiateWithFlags](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1gb53b435e178cccfa37ac87285d2c3fa1)
    ///
    /// # Safety
    /// `graph` is live.
    pub unsafe fn instantiate(graph: sys::CUgraph) -> Result<sys::CUgraphExec> {
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        check(
            "cuGraphInstantiateWithFlags",
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
        )?;
        Ok(exec)
    }

    /// Update `exec` in place to `graph`. `Ok(false)` when the driver refuses
    /// (topology or node kinds changed).
    ///
    /// See [cuGraphExecUpdate](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1g34c8e1e6118aa68fc715250dfd93c1c4)
    ///
    /// # Safety
    /// `exec` and `graph` are live and not used by another thread.
    pub unsafe fn exec_update(exec: sys::CUgraphExec, graph: sys::CUgraph) -> Result<bool> {
        // SAFETY (of the zeroed value): plain C struct the driver fills.
        let mut info: sys::CUgraphExecUpdateResultInfo = std::mem::zeroed();
        let r = sys::cuGraphExecUpdate_v2(exec, graph, &mut info);
        if r == sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE {
            tracing::debug!(result = ?info.result, "cuGraphExecUpdate refused");
            return Ok(false);
        }
        check("cuGraphExecUpdate", r)?;
        Ok(true)
    }

    /// Every node of `graph`.
    ///
    /// See [cuGraphGetNodes](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
    ///
    /// # Safety
    /// `graph` is live and not mutated concurrently.
    pub unsafe fn nodes(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
        let mut n = 0usize;
        check(
            "cuGraphGetNodes",
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n),
        )?;
        let mut nodes = vec![std::ptr::null_mut(); n];
        if n > 0 {
            check(
                "cuGraphGetNodes",
                sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n),
            )?;
        }
        nodes.truncate(n);
        Ok(nodes)
    }

    /// The function a node launches, `None` when it is not a kernel node.
    ///
    /// See [cuGraphKernelNodeGetParams](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
    ///
    /// # Safety
    /// `node` is a live node of a live graph.
    pub unsafe fn kernel_node_function(node: sys::CUgraphNode) -> Result<Option<sys::CUfunction>> {
        let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check("cuGraphNodeGetType", sys::cuGraphNodeGetType(node, &mut ty))?;
        if ty != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            return Ok(None);
        }
        // SAFETY (of the zeroed value): plain C struct the driver fills.
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        check(
            "cuGraphKernelNodeGetParams",
            sys::cuGraphKernelNodeGetParams_v2(node, &mut p),
        )?;
        Ok(Some(p.func))
    }

    /// New grid, block and parameters for kernel node `node` of `exec`, for
    /// the launches that follow (enqueued ones are not affected).
    ///
    /// See [cuGraphExecKernelNodeSetParams](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
    ///
    /// # Safety
    /// `exec` is live, `node` a kernel node of the graph it was instantiated
    /// from launching `func`; `params[i]` points to as many readable bytes
    /// as parameter `i` of `func` has (the driver copies them).
    pub unsafe fn exec_kernel_node_set(
        exec: sys::CUgraphExec,
        node: sys::CUgraphNode,
        func: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY (of the zeroed value): plain C struct, the fields used set below.
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        p.func = func;
        [p.gridDimX, p.gridDimY, p.gridDimZ] = grid;
        [p.blockDimX, p.blockDimY, p.blockDimZ] = block;
        p.sharedMemBytes = shared_mem_bytes;
        p.kernelParams = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        check(
            "cuGraphExecKernelNodeSetParams",
            sys::cuGraphExecKernelNodeSetParams_v2(exec, node, &p),
        )
    }

    /// Turn kernel node `node` of `exec` on or off (off: an empty node).
    ///
    /// See [cuGraphNodeSetEnabled](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1g371b20eb0c0658731e38db7e68f12c78)
    ///
    /// # Safety
    /// `exec` is live and `node` a node of the graph it was instantiated from.
    pub unsafe fn exec_node_set_enabled(
        exec: sys::CUgraphExec,
        node: sys::CUgraphNode,
        enabled: bool,
    ) -> Result<()> {
        check(
            "cuGraphNodeSetEnabled",
            sys::cuGraphNodeSetEnabled(exec, node, u32::from(enabled)),
        )
    }

    /// See [cuGraphLaunch](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1g6b2dceb3901e71a390d2bd8b0491e471)
    ///
    /// # Safety
    /// `exec` and `stream` are live.
    pub unsafe fn launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
        check("cuGraphLaunch", sys::cuGraphLaunch(exec, stream))
    }

    /// The graph a stream is capturing into and its current dependency set.
    /// `None` when the stream is not capturing.
    ///
    /// See [cuStreamGetCaptureInfo](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html#group__CUDA__STREAM_1g9d0535d93a214cbf126835257b16ba85)
    ///
    /// # Safety
    /// `stream` is live. The returned nodes are copied out before any other
    /// call on the stream (the driver's array is only valid until then).
    pub unsafe fn capture_info(
        stream: sys::CUstream,
    ) -> Result<Option<(sys::CUgraph, Vec<sys::CUgraphNode>)>> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
        let mut n = 0usize;
        check(
            "cuStreamGetCaptureInfo",
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut n,
            ),
        )?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Ok(None);
        }
        let nodes = if n == 0 || deps.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(deps, n).to_vec()
        };
        Ok(Some((graph, nodes)))
    }

    /// Create a conditional handle owned by `graph`.
    ///
    /// See [cuGraphConditionalHandleCreate](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1gece6f3b9e85d0edb8484d625fe567376)
    ///
    /// # Safety
    /// `graph` and `ctx` are live.
    pub unsafe fn conditional_handle_create(
        graph: sys::CUgraph,
        ctx: sys::CUcontext,
        default_value: u32,
    ) -> Result<sys::CUgraphConditionalHandle> {
        let mut handle: sys::CUgraphConditionalHandle = 0;
        check(
            "cuGraphConditionalHandleCreate",
            sys::cuGraphConditionalHandleCreate(
                &mut handle,
                graph,
                ctx,
                default_value,
                sys::CU_GRAPH_COND_ASSIGN_DEFAULT,
            ),
        )?;
        Ok(handle)
    }

    /// The conditional nodes we add.
    #[derive(Copy, Clone, Debug, PartialEq, Eq)]
    pub enum ConditionalKind {
        /// Runs its body while the handle is non-zero.
        While,
        /// Runs its body once if the handle is non-zero.
        If,
    }

    /// Add a conditional node of `kind` with one body after `deps`; returns
    /// the node and its (driver-owned, initially empty) body graph.
    ///
    /// See [cuGraphAddNode](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1g4210c258cbba352040a26d1b4e658f9d)
    ///
    /// # Safety
    /// `graph`, `ctx`, `handle` and every node in `deps` are live and belong to `graph`.
    pub unsafe fn add_conditional_node(
        graph: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        handle: sys::CUgraphConditionalHandle,
        kind: ConditionalKind,
        ctx: sys::CUcontext,
    ) -> Result<(sys::CUgraphNode, sys::CUgraph)> {
        // SAFETY (of the zeroed value): plain C struct; the union member used
        // below is set in full, the rest must be zero.
        let mut params: sys::CUgraphNodeParams = std::mem::zeroed();
        params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        params.__bindgen_anon_1.conditional.handle = handle;
        params.__bindgen_anon_1.conditional.type_ = match kind {
            ConditionalKind::While => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            ConditionalKind::If => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
        };
        params.__bindgen_anon_1.conditional.size = 1;
        params.__bindgen_anon_1.conditional.ctx = ctx;
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        check(
            "cuGraphAddNode",
            sys::cuGraphAddNode_v2(
                &mut node,
                graph,
                if deps.is_empty() {
                    std::ptr::null()
                } else {
                    deps.as_ptr()
                },
                std::ptr::null(),
                deps.len(),
                &mut params,
            ),
        )?;
        let out = params.__bindgen_anon_1.conditional.phGraph_out;
        if out.is_null() || (*out).is_null() {
            return Err(DeviceError::Driver {
                call: "cuGraphAddNode",
                code: 0,
                name: "CUDA_SUCCESS".into(),
                message: "conditional node created without a body graph".into(),
            });
        }
        Ok((node, *out))
    }

    /// Replace the capture dependencies of `stream` with `nodes`.
    ///
    /// See [cuStreamUpdateCaptureDependencies](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html#group__CUDA__STREAM_1g2a4ed74d3e1e1d2e1e3b5c6a3b3e2b3c)
    ///
    /// # Safety
    /// `stream` is capturing into the graph that owns `nodes`.
    pub unsafe fn set_capture_dependencies(
        stream: sys::CUstream,
        nodes: &mut [sys::CUgraphNode],
    ) -> Result<()> {
        check(
            "cuStreamUpdateCaptureDependencies",
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream,
                nodes.as_mut_ptr(),
                std::ptr::null(),
                nodes.len(),
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES
                    as u32,
            ),
        )
    }

    /// Start capturing `stream` into the existing (empty) `graph`.
    ///
    /// See [cuStreamBeginCaptureToGraph](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html#group__CUDA__STREAM_1gac495e0527d1dd6437f95ee482f61865)
    ///
    /// # Safety
    /// `stream` and `graph` are live; `stream` is not capturing.
    pub unsafe fn begin_capture_to_graph(stream: sys::CUstream, graph: sys::CUgraph) -> Result<()> {
        check(
            "cuStreamBeginCaptureToGraph",
            sys::cuStreamBeginCaptureToGraph(
                stream,
                graph,
                std::ptr::null(),
                std::ptr::null(),
                0,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ),
        )
    }

    /// Is `stream` capturing (or in an invalidated capture)?
    ///
    /// See [cuStreamIsCapturing](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html#group__CUDA__STREAM_1g37823c49206e3704ae23c7ad78560bca)
    ///
    /// # Safety
    /// `stream` is live.
    pub unsafe fn is_capturing(stream: sys::CUstream) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        check(
            "cuStreamIsCapturing",
            sys::cuStreamIsCapturing(stream, &mut status),
        )?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// See [cuStreamBeginCapture](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html#group__CUDA__STREAM_1g767167da0bbf07157dc20b6c258a2143)
    ///
    /// # Safety
    /// `stream` is live and not capturing.
    pub unsafe fn begin_capture(stream: sys::CUstream) -> Result<()> {
        check(
            "cuStreamBeginCapture",
            sys::cuStreamBeginCapture_v2(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            ),
        )
    }

    /// See [cuStreamEndCapture](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html#group__CUDA__STREAM_1g03dab8b2ba76b00718955177a929970c)
    ///
    /// # Safety
    /// `stream` is live.
    pub unsafe fn end_capture(stream: sys::CUstream) -> Result<sys::CUgraph> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        check(
            "cuStreamEndCapture",
            sys::cuStreamEndCapture(stream, &mut graph),
        )?;
        Ok(graph)
    }

    /// See [cuGraphDestroy](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1g718cfd9681f078693d4be2426fd689c8)
    ///
    /// # Safety
    /// `graph` is live and owned by the caller (not a conditional node's body).
    pub unsafe fn destroy(graph: sys::CUgraph) -> Result<()> {
        check("cuGraphDestroy", sys::cuGraphDestroy(graph))
    }

    /// See [cuGraphExecDestroy](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html#group__CUDA__GRAPH_1ga32ad4944cc5d408158207c978bc43a7)
    ///
    /// # Safety
    /// `exec` is live and no launch of it is being enqueued concurrently.
    pub unsafe fn exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
        check("cuGraphExecDestroy", sys::cuGraphExecDestroy(exec))
    }
}

//! The HIP runtime entry points (the 56 of [`crate::HIP_ENTRY_POINTS`], plus
//! `hipGetDevicePropertiesR0000`), each on the CUDA driver API.
//!
//! Every export runs its body in [`entry`] (no libcuda: an error; a panic:
//! `hipErrorUnknown`). Pointers the caller passes are trusted as the HIP API
//! trusts them (that is the contract of each function); null out pointers
//! are `hipErrorInvalidValue`.

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void};
use std::panic::catch_unwind;
use std::ptr::{addr_of, null_mut};

use cudarc::driver::sys as cu;
use hip_runtime_sys::{
    dim3, hipDeviceAttribute_t, hipDeviceProp_t, hipDevice_t, hipDeviceptr_t, hipError_t,
    hipEvent_t, hipFunction_t, hipGraphExecUpdateResult, hipGraphExec_t, hipGraphNodeType,
    hipGraphNode_t, hipGraph_t, hipKernelNodeParams, hipMemAccessDesc, hipMemAccessFlags,
    hipMemAllocationGranularity_flags, hipMemAllocationHandleType, hipMemAllocationProp,
    hipMemAllocationType, hipMemGenericAllocationHandle_t, hipMemLocationType, hipModule_t,
    hipStreamCaptureMode, hipStreamCaptureStatus, hipStream_t,
};

use crate::driver::{self, bind, check, entry, enum_out, forward, put, raw_u32, HipResult};
use crate::errors;

const INVALID: hipError_t = hipError_t::hipErrorInvalidValue;
const UNSUPPORTED: hipError_t = hipError_t::hipErrorNotSupported;

// ---- conversions --------------------------------------------------------------

/// A HIP device pointer as a CUDA one.
fn dptr(p: *mut c_void) -> cu::CUdeviceptr {
    p as usize as cu::CUdeviceptr
}

/// A CUDA device pointer as a HIP one.
fn hptr(d: cu::CUdeviceptr) -> HipResult<*mut c_void> {
    usize::try_from(d)
        .map(|a| a as *mut c_void)
        .map_err(|_| hipError_t::hipErrorUnknown)
}

/// A HIP VMM handle (a pointer) as CUDA's (a u64).
fn cu_handle(h: hipMemGenericAllocationHandle_t) -> cu::CUmemGenericAllocationHandle {
    h as usize as cu::CUmemGenericAllocationHandle
}

/// Translate flag bits through `(hip, cuda)` pairs; a bit with no pair is
/// `hipErrorNotSupported`.
fn flags(hip: u32, table: &[(u32, u32)]) -> HipResult<u32> {
    let mut left = hip;
    let mut out = 0;
    for &(h, c) in table {
        if left & h == h && h != 0 {
            left &= !h;
            out |= c;
        }
    }
    if left == 0 {
        Ok(out)
    } else {
        Err(UNSUPPORTED)
    }
}

/// A 64-bit flags argument that must be 0 on both sides.
fn zero_flags(f: c_ulonglong) -> HipResult<()> {
    if f == 0 {
        Ok(())
    } else {
        Err(UNSUPPORTED)
    }
}

fn location(ty: u32, id: c_int) -> HipResult<cu::CUmemLocation> {
    let type_ = if ty == hipMemLocationType::hipMemLocationTypeDevice as u32 {
        cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
    } else if ty == hipMemLocationType::hipMemLocationTypeInvalid as u32 {
        return Err(INVALID);
    } else {
        return Err(UNSUPPORTED);
    };
    Ok(cu::CUmemLocation { type_, id })
}

/// `hipMemAllocationProp` -> `CUmemAllocationProp`, field by field.
///
/// # Safety
/// `p` is null or points to a `hipMemAllocationProp`.
unsafe fn alloc_prop(p: *const hipMemAllocationProp) -> HipResult<cu::CUmemAllocationProp> {
    if p.is_null() {
        return Err(INVALID);
    }
    // SAFETY (all reads): `p` points to a hipMemAllocationProp (the
    // caller's contract); enum fields are read as integers.
    let (ty, handles, loc_ty, id, win32, af) = unsafe {
        (
            raw_u32(addr_of!((*p).type_)),
            raw_u32(addr_of!((*p).requestedHandleType)),
            raw_u32(addr_of!((*p).location.type_)),
            addr_of!((*p).location.id).read(),
            addr_of!((*p).win32HandleMetaData).read(),
            addr_of!((*p).allocFlags).read(),
        )
    };
    let type_ = if ty == hipMemAllocationType::hipMemAllocationTypePinned as u32 {
        cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
    } else if ty == hipMemAllocationType::hipMemAllocationTypeInvalid as u32 {
        return Err(INVALID);
    } else {
        return Err(UNSUPPORTED);
    };
    let handle_types = if handles == hipMemAllocationHandleType::hipMemHandleTypeNone as u32 {
        cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    } else if handles == hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor as u32 {
        cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        return Err(UNSUPPORTED);
    };
    // Windows metadata, compression and usage hints: none of ours; HIP 5.2
    // defines no values for the last two, so only "none" is translated.
    if !win32.is_null() || af.compressionType != 0 || af.usage != 0 {
        return Err(UNSUPPORTED);
    }
    Ok(cu::CUmemAllocationProp {
        type_,
        requestedHandleTypes: handle_types,
        location: location(loc_ty, id)?,
        win32HandleMetaData: null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: af.gpuDirectRDMACapable,
            usage: 0,
            reserved: [0; 4],
        },
    })
}

/// HIP's `hipModuleLaunchKernel` `extra` keys (hip_runtime_api.h) and CUDA's.
const HIP_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
const HIP_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
const HIP_LAUNCH_PARAM_END: usize = 0x03;
/// Longest `extra` list read (key/value pairs) before calling it malformed.
const EXTRA_MAX_PAIRS: usize = 16;

/// A HIP `extra` list as CUDA's: the same pairs with CUDA's keys (HIP ends
/// the list with 0x03, CUDA with 0x00). `None` for a null list.
///
/// # Safety
/// `extra` is null or a HIP `extra` list.
unsafe fn cuda_extra(extra: *mut *mut c_void) -> HipResult<Option<Vec<*mut c_void>>> {
    if extra.is_null() {
        return Ok(None);
    }
    let key = |k: u32| k as usize as *mut c_void;
    let mut out = Vec::new();
    for i in 0..EXTRA_MAX_PAIRS {
        // SAFETY: the list continues up to its END key (the caller's contract).
        let k = unsafe { extra.add(2 * i).read() } as usize;
        let c = match k {
            HIP_LAUNCH_PARAM_END => {
                out.push(key(cu::CU_LAUNCH_PARAM_END_AS_INT));
                return Ok(Some(out));
            }
            HIP_LAUNCH_PARAM_BUFFER_POINTER => cu::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT,
            HIP_LAUNCH_PARAM_BUFFER_SIZE => cu::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT,
            _ => return Err(INVALID),
        };
        out.push(key(c));
        // SAFETY: a key other than END is followed by its value.
        out.push(unsafe { extra.add(2 * i + 1).read() });
    }
    Err(INVALID)
}

/// The device attributes our backend asks for, HIP's and CUDA's.
const ATTRIBUTES: [(hipDeviceAttribute_t, cu::CUdevice_attribute); 6] = {
    use cu::CUdevice_attribute as C;
    use hipDeviceAttribute_t as H;
    [
        (
            H::hipDeviceAttributeMemoryClockRate,
            C::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
        ),
        (
            H::hipDeviceAttributeMemoryBusWidth,
            C::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
        ),
        (
            H::hipDeviceAttributeVirtualMemoryManagementSupported,
            C::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        ),
        (
            H::hipDeviceAttributeComputeCapabilityMajor,
            C::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        ),
        (
            H::hipDeviceAttributeComputeCapabilityMinor,
            C::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        ),
        (
            H::hipDeviceAttributeMultiprocessorCount,
            C::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        ),
    ]
};

fn attribute(dev: cu::CUdevice, a: cu::CUdevice_attribute) -> HipResult<c_int> {
    let mut v: c_int = 0;
    // SAFETY: valid out pointer and device.
    check(unsafe { cu::cuDeviceGetAttribute(&mut v, a, dev) })?;
    Ok(v)
}

/// `sm_<major><minor>` of `dev`: the "gcnArchName" the shim reports.
pub(crate) fn arch_name(dev: cu::CUdevice) -> HipResult<String> {
    use cu::CUdevice_attribute as C;
    let major = attribute(dev, C::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(dev, C::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(format!("sm_{major}{minor}"))
}

/// Copy `s` into a C char array, NUL-terminated (cut to fit).
fn put_str(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// `hipDeviceProp_t` (ROCm 5 layout) from the device's attributes. Fields
/// with no CUDA twin (AMD-only: `gcnArch`, the HDP registers, `asicRevision`,
/// `isLargeBar`, ...) stay 0; the texture limits are not filled either (not
/// used by our backend).
fn properties(ordinal: c_int) -> HipResult<hipDeviceProp_t> {
    use cu::CUdevice_attribute as C;
    let dev = driver::device(ordinal)?;
    let a = |x: C| attribute(dev, x);
    // Informational fields: 0 when the driver does not answer.
    let o = |x: C| attribute(dev, x).unwrap_or(0);
    let size = |x: C| usize::try_from(o(x)).unwrap_or(0);
    let mut p = hipDeviceProp_t::default();
    // SAFETY: `p.name` has 256 chars; the driver writes at most 255 + NUL.
    check(unsafe { cu::cuDeviceGetName(p.name.as_mut_ptr(), 255, dev) })?;
    p.name[255] = 0;
    // SAFETY: valid out pointer and device.
    check(unsafe { cu::cuDeviceTotalMem_v2(&mut p.totalGlobalMem, dev) })?;
    p.sharedMemPerBlock = size(C::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    p.regsPerBlock = o(C::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    p.warpSize = a(C::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?;
    p.maxThreadsPerBlock = a(C::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
    p.maxThreadsDim = [
        o(C::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
        o(C::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
        o(C::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z),
    ];
    p.maxGridSize = [
        o(C::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
        o(C::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
        o(C::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z),
    ];
    p.clockRate = o(C::CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    p.memoryClockRate = o(C::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
    p.memoryBusWidth = o(C::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    p.totalConstMem = size(C::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
    p.major = a(C::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    p.minor = a(C::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    p.multiProcessorCount = a(C::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    p.l2CacheSize = o(C::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    p.maxThreadsPerMultiProcessor = o(C::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    p.concurrentKernels = o(C::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
    p.pciDomainID = o(C::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    p.pciBusID = o(C::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    p.pciDeviceID = o(C::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    p.maxSharedMemoryPerMultiProcessor =
        size(C::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    p.isMultiGpuBoard = o(C::CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD);
    p.canMapHostMemory = o(C::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
    put_str(&mut p.gcnArchName, &arch_name(dev)?);
    p.integrated = o(C::CU_DEVICE_ATTRIBUTE_INTEGRATED);
    p.cooperativeLaunch = o(C::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
    p.kernelExecTimeoutEnabled = o(C::CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT);
    p.ECCEnabled = o(C::CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
    p.managedMemory = o(C::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
    Ok(p)
}

// ---- devices ------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipInit(flags: c_uint) -> hipError_t {
    entry(|| {
        if flags != 0 {
            Err(INVALID)
        } else {
            driver::init()
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceCount(count: *mut c_int) -> hipError_t {
    // SAFETY: `count` is null or valid (HIP's contract).
    if unsafe { put(count, 0) }.is_err() {
        return INVALID;
    }
    if !driver::cuda_present() {
        return hipError_t::hipErrorNoDevice;
    }
    entry(|| {
        let n = driver::device_count()?;
        if n == 0 {
            return Err(hipError_t::hipErrorNoDevice);
        }
        // SAFETY: checked non-null above; valid by HIP's contract.
        unsafe { put(count, n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipSetDevice(device_id: c_int) -> hipError_t {
    entry(|| driver::set_current(device_id))
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGet(device: *mut hipDevice_t, ordinal: c_int) -> hipError_t {
    entry(|| {
        let d = driver::device(ordinal)?;
        // SAFETY: `device` is null or valid (HIP's contract).
        unsafe { put(device, d) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetAttribute(
    pi: *mut c_int,
    attr: u32,
    device_id: c_int,
) -> hipError_t {
    entry(|| {
        // Only the attributes our backend asks for; others (and AMD-only
        // ones such as hipDeviceAttributeGcnArch) are not mapped.
        let (_, a) = ATTRIBUTES
            .iter()
            .find(|(h, _)| *h as u32 == attr)
            .ok_or(UNSUPPORTED)?;
        let v = attribute(driver::device(device_id)?, *a)?;
        // SAFETY: `pi` is null or valid (HIP's contract).
        unsafe { put(pi, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetName(
    name: *mut c_char,
    len: c_int,
    device: hipDevice_t,
) -> hipError_t {
    entry(|| {
        if name.is_null() || len <= 0 {
            return Err(INVALID);
        }
        // SAFETY: `name` has `len` chars (HIP's contract); the HIP device
        // value is the CUDA device (hipDeviceGet returns cuDeviceGet's).
        check(unsafe { cu::cuDeviceGetName(name, len, device) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceTotalMem(bytes: *mut usize, device: hipDevice_t) -> hipError_t {
    entry(|| {
        if bytes.is_null() {
            return Err(INVALID);
        }
        // SAFETY: non-null out pointer, valid by HIP's contract.
        check(unsafe { cu::cuDeviceTotalMem_v2(bytes, device) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDevicePropertiesR0000(
    prop: *mut hipDeviceProp_t,
    device_id: c_int,
) -> hipError_t {
    entry(|| {
        let p = properties(device_id)?;
        // SAFETY: `prop` is null or has room for a (ROCm 5 layout)
        // hipDeviceProp_t (HIP's contract).
        unsafe { put(prop, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceProperties(
    prop: *mut hipDeviceProp_t,
    device_id: c_int,
) -> hipError_t {
    // SAFETY: forwarded (same contract).
    unsafe { hipGetDevicePropertiesR0000(prop, device_id) }
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceCanAccessPeer(
    can_access: *mut c_int,
    device_id: c_int,
    peer: c_int,
) -> hipError_t {
    entry(|| {
        let (d, p) = (driver::device(device_id)?, driver::device(peer)?);
        let mut can: c_int = 0;
        // SAFETY: valid out pointer and devices.
        check(unsafe { cu::cuDeviceCanAccessPeer(&mut can, d, p) })?;
        // SAFETY: `can_access` is null or valid (HIP's contract).
        unsafe { put(can_access, can) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> hipError_t {
    entry(|| {
        if flags != 0 {
            return Err(INVALID);
        }
        bind()?;
        let peer_ctx = driver::primary_context(peer)?;
        // SAFETY: a retained primary context; our device's context is current.
        check(unsafe { cu::cuCtxEnablePeerAccess(peer_ctx, 0) })
    })
}

// ---- errors ---------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipGetErrorName(e: u32) -> *const c_char {
    catch_unwind(|| errors::name(e)).unwrap_or(std::ptr::null())
}

#[no_mangle]
pub unsafe extern "C" fn hipGetErrorString(e: u32) -> *const c_char {
    catch_unwind(|| errors::message(e)).unwrap_or(std::ptr::null())
}

// ---- memory ---------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError_t {
    entry(|| {
        if free.is_null() || total.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: non-null out pointers, valid by HIP's contract.
        check(unsafe { cu::cuMemGetInfo_v2(free, total) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemCreate(
    handle: *mut hipMemGenericAllocationHandle_t,
    size: usize,
    prop: *const hipMemAllocationProp,
    flags: c_ulonglong,
) -> hipError_t {
    entry(|| {
        zero_flags(flags)?;
        // SAFETY: `prop` is null or a hipMemAllocationProp (HIP's contract).
        let p = unsafe { alloc_prop(prop) }?;
        if handle.is_null() {
            return Err(INVALID);
        }
        bind()?;
        let mut h: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out pointer and properties.
        check(unsafe { cu::cuMemCreate(&mut h, size, &p, 0) })?;
        let as_ptr = usize::try_from(h).map_err(|_| hipError_t::hipErrorUnknown)?;
        // SAFETY: non-null, valid by HIP's contract.
        unsafe { put(handle, as_ptr as hipMemGenericAllocationHandle_t) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemRelease(handle: hipMemGenericAllocationHandle_t) -> hipError_t {
    // SAFETY: a handle from hipMemCreate (HIP's contract).
    forward(|| unsafe { cu::cuMemRelease(cu_handle(handle)) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemAddressReserve(
    ptr: *mut *mut c_void,
    size: usize,
    alignment: usize,
    addr: *mut c_void,
    flags: c_ulonglong,
) -> hipError_t {
    entry(|| {
        zero_flags(flags)?;
        if ptr.is_null() {
            return Err(INVALID);
        }
        bind()?;
        let mut base: cu::CUdeviceptr = 0;
        // SAFETY: valid out pointer; `addr` is only a hint.
        check(unsafe { cu::cuMemAddressReserve(&mut base, size, alignment, dptr(addr), 0) })?;
        // SAFETY: non-null, valid by HIP's contract.
        unsafe { put(ptr, hptr(base)?) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemAddressFree(ptr: *mut c_void, size: usize) -> hipError_t {
    // SAFETY: a reservation from hipMemAddressReserve (HIP's contract).
    forward(|| unsafe { cu::cuMemAddressFree(dptr(ptr), size) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemMap(
    ptr: *mut c_void,
    size: usize,
    offset: usize,
    handle: hipMemGenericAllocationHandle_t,
    flags: c_ulonglong,
) -> hipError_t {
    entry(|| {
        zero_flags(flags)?;
        bind()?;
        // SAFETY: reserved range and live handle (HIP's contract).
        check(unsafe { cu::cuMemMap(dptr(ptr), size, offset, cu_handle(handle), 0) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError_t {
    // SAFETY: a mapped range (HIP's contract).
    forward(|| unsafe { cu::cuMemUnmap(dptr(ptr), size) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemSetAccess(
    ptr: *mut c_void,
    size: usize,
    desc: *const hipMemAccessDesc,
    count: usize,
) -> hipError_t {
    entry(|| {
        if desc.is_null() || count == 0 {
            return Err(INVALID);
        }
        let mut descs = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `desc` has `count` entries (HIP's contract); enum
            // fields read as integers.
            let (loc_ty, id, fl) = unsafe {
                let d = desc.add(i);
                (
                    raw_u32(addr_of!((*d).location.type_)),
                    addr_of!((*d).location.id).read(),
                    raw_u32(addr_of!((*d).flags)),
                )
            };
            use cu::CUmemAccess_flags as C;
            use hipMemAccessFlags as H;
            let flags = if fl == H::hipMemAccessFlagsProtNone as u32 {
                C::CU_MEM_ACCESS_FLAGS_PROT_NONE
            } else if fl == H::hipMemAccessFlagsProtRead as u32 {
                C::CU_MEM_ACCESS_FLAGS_PROT_READ
            } else if fl == H::hipMemAccessFlagsProtReadWrite as u32 {
                C::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            } else {
                return Err(UNSUPPORTED);
            };
            descs.push(cu::CUmemAccessDesc {
                location: location(loc_ty, id)?,
                flags,
            });
        }
        bind()?;
        // SAFETY: `descs` holds `count` translated descriptors.
        check(unsafe { cu::cuMemSetAccess(dptr(ptr), size, descs.as_ptr(), count) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const hipMemAllocationProp,
    option: u32,
) -> hipError_t {
    entry(|| {
        use cu::CUmemAllocationGranularity_flags as C;
        use hipMemAllocationGranularity_flags as H;
        let opt = if option == H::hipMemAllocationGranularityMinimum as u32 {
            C::CU_MEM_ALLOC_GRANULARITY_MINIMUM
        } else if option == H::hipMemAllocationGranularityRecommended as u32 {
            C::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        } else {
            return Err(INVALID);
        };
        // SAFETY: `prop` is null or a hipMemAllocationProp (HIP's contract).
        let p = unsafe { alloc_prop(prop) }?;
        if granularity.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: non-null out pointer (valid by HIP's contract), translated properties.
        check(unsafe { cu::cuMemGetAllocationGranularity(granularity, &p, opt) })
    })
}

/// hipHostMalloc flags with a CUDA twin (same meaning; HIP's coherence and
/// NUMA flags are AMD memory-model controls and have none).
const HOST_MALLOC_FLAGS: [(u32, u32); 3] = [
    (
        hip_runtime_sys::hipHostMallocPortable,
        cu::CU_MEMHOSTALLOC_PORTABLE,
    ),
    (
        hip_runtime_sys::hipHostMallocMapped,
        cu::CU_MEMHOSTALLOC_DEVICEMAP,
    ),
    (
        hip_runtime_sys::hipHostMallocWriteCombined,
        cu::CU_MEMHOSTALLOC_WRITECOMBINED,
    ),
];

#[no_mangle]
pub unsafe extern "C" fn hipHostMalloc(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> hipError_t {
    entry(|| {
        let f = self::flags(flags, &HOST_MALLOC_FLAGS)?;
        if ptr.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: non-null out pointer, valid by HIP's contract.
        check(unsafe { cu::cuMemHostAlloc(ptr, size, f) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipHostFree(ptr: *mut c_void) -> hipError_t {
    // SAFETY: memory from hipHostMalloc (HIP's contract).
    forward(|| unsafe { cu::cuMemFreeHost(ptr) })
}

#[no_mangle]
pub unsafe extern "C" fn hipHostGetDevicePointer(
    dev: *mut *mut c_void,
    host: *mut c_void,
    flags: c_uint,
) -> hipError_t {
    entry(|| {
        if flags != 0 {
            return Err(INVALID);
        }
        bind()?;
        let mut d: cu::CUdeviceptr = 0;
        // SAFETY: valid out pointer; `host` from hipHostMalloc (HIP's contract).
        check(unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, host, 0) })?;
        // SAFETY: `dev` is null or valid (HIP's contract).
        unsafe { put(dev, hptr(d)?) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemcpyHtoDAsync(
    dst: hipDeviceptr_t,
    src: *mut c_void,
    bytes: usize,
    stream: hipStream_t,
) -> hipError_t {
    // SAFETY: HIP's contract (readable source until the copy is done).
    forward(|| unsafe { cu::cuMemcpyHtoDAsync_v2(dptr(dst), src, bytes, stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemcpyDtoHAsync(
    dst: *mut c_void,
    src: hipDeviceptr_t,
    bytes: usize,
    stream: hipStream_t,
) -> hipError_t {
    // SAFETY: HIP's contract (writable destination until the copy is done).
    forward(|| unsafe { cu::cuMemcpyDtoHAsync_v2(dst, dptr(src), bytes, stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemcpyDtoDAsync(
    dst: hipDeviceptr_t,
    src: hipDeviceptr_t,
    bytes: usize,
    stream: hipStream_t,
) -> hipError_t {
    // SAFETY: device addresses fault the device, not the host.
    forward(|| unsafe { cu::cuMemcpyDtoDAsync_v2(dptr(dst), dptr(src), bytes, stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemsetD8Async(
    dst: hipDeviceptr_t,
    value: c_uchar,
    count: usize,
    stream: hipStream_t,
) -> hipError_t {
    // SAFETY: as hipMemcpyDtoDAsync.
    forward(|| unsafe { cu::cuMemsetD8Async(dptr(dst), value, count, stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemsetD32Async(
    dst: hipDeviceptr_t,
    value: c_int,
    count: usize,
    stream: hipStream_t,
) -> hipError_t {
    entry(|| {
        bind()?;
        let bits = c_uint::from_ne_bytes(value.to_ne_bytes());
        // SAFETY: as hipMemcpyDtoDAsync.
        check(unsafe { cu::cuMemsetD32Async(dptr(dst), bits, count, stream.cast()) })
    })
}

// ---- streams and events -----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipStreamCreateWithFlags(
    stream: *mut hipStream_t,
    flags: c_uint,
) -> hipError_t {
    entry(|| {
        let f = self::flags(
            flags,
            &[(
                hip_runtime_sys::hipStreamNonBlocking,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )],
        )?;
        if stream.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: non-null out pointer (a stream handle is a pointer on both sides).
        check(unsafe { cu::cuStreamCreate(stream.cast(), f) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamDestroy(stream: hipStream_t) -> hipError_t {
    // SAFETY: a live stream (HIP's contract).
    forward(|| unsafe { cu::cuStreamDestroy_v2(stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamSynchronize(stream: hipStream_t) -> hipError_t {
    // SAFETY: a live stream or null (HIP's contract).
    forward(|| unsafe { cu::cuStreamSynchronize(stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamWaitEvent(
    stream: hipStream_t,
    event: hipEvent_t,
    flags: c_uint,
) -> hipError_t {
    entry(|| {
        if flags != 0 {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: live stream and event (HIP's contract).
        check(unsafe { cu::cuStreamWaitEvent(stream.cast(), event.cast(), 0) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamBeginCapture(stream: hipStream_t, mode: u32) -> hipError_t {
    entry(|| {
        use cu::CUstreamCaptureMode as C;
        use hipStreamCaptureMode as H;
        let m = if mode == H::hipStreamCaptureModeGlobal as u32 {
            C::CU_STREAM_CAPTURE_MODE_GLOBAL
        } else if mode == H::hipStreamCaptureModeThreadLocal as u32 {
            C::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        } else if mode == H::hipStreamCaptureModeRelaxed as u32 {
            C::CU_STREAM_CAPTURE_MODE_RELAXED
        } else {
            return Err(INVALID);
        };
        bind()?;
        // SAFETY: a live stream (HIP's contract).
        check(unsafe { cu::cuStreamBeginCapture_v2(stream.cast(), m) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamEndCapture(
    stream: hipStream_t,
    graph: *mut hipGraph_t,
) -> hipError_t {
    entry(|| {
        if graph.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: live stream; non-null out pointer (graphs are pointers on both sides).
        check(unsafe { cu::cuStreamEndCapture(stream.cast(), graph.cast()) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamIsCapturing(
    stream: hipStream_t,
    status: *mut hipStreamCaptureStatus,
) -> hipError_t {
    entry(|| {
        if status.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: live stream; `out` is a 4-byte out value (the enum's size).
        let raw = enum_out(|out| unsafe { cu::cuStreamIsCapturing(stream.cast(), out) })?;
        use cu::CUstreamCaptureStatus as C;
        use hipStreamCaptureStatus as H;
        let s = if raw == C::CU_STREAM_CAPTURE_STATUS_NONE as u32 {
            H::hipStreamCaptureStatusNone
        } else if raw == C::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 {
            H::hipStreamCaptureStatusActive
        } else if raw == C::CU_STREAM_CAPTURE_STATUS_INVALIDATED as u32 {
            H::hipStreamCaptureStatusInvalidated
        } else {
            return Err(hipError_t::hipErrorUnknown);
        };
        // SAFETY: non-null, valid by HIP's contract.
        unsafe { put(status, s) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventCreateWithFlags(
    event: *mut hipEvent_t,
    flags: c_uint,
) -> hipError_t {
    entry(|| {
        use cu::CUevent_flags as C;
        // hipEventReleaseToDevice / ToSystem (AMD cache scopes) have no twin.
        let f = self::flags(
            flags,
            &[
                (
                    hip_runtime_sys::hipEventBlockingSync,
                    C::CU_EVENT_BLOCKING_SYNC as u32,
                ),
                (
                    hip_runtime_sys::hipEventDisableTiming,
                    C::CU_EVENT_DISABLE_TIMING as u32,
                ),
                (
                    hip_runtime_sys::hipEventInterprocess,
                    C::CU_EVENT_INTERPROCESS as u32,
                ),
            ],
        )?;
        if event.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: non-null out pointer (events are pointers on both sides).
        check(unsafe { cu::cuEventCreate(event.cast(), f) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventDestroy(event: hipEvent_t) -> hipError_t {
    // SAFETY: a live event (HIP's contract).
    forward(|| unsafe { cu::cuEventDestroy_v2(event.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> hipError_t {
    // SAFETY: live event and stream (HIP's contract).
    forward(|| unsafe { cu::cuEventRecord(event.cast(), stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventQuery(event: hipEvent_t) -> hipError_t {
    // SAFETY: a live event (HIP's contract). NOT_READY maps to hipErrorNotReady.
    forward(|| unsafe { cu::cuEventQuery(event.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventSynchronize(event: hipEvent_t) -> hipError_t {
    // SAFETY: a live event (HIP's contract).
    forward(|| unsafe { cu::cuEventSynchronize(event.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventElapsedTime(
    ms: *mut f32,
    start: hipEvent_t,
    stop: hipEvent_t,
) -> hipError_t {
    entry(|| {
        if ms.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: non-null out pointer; live events (HIP's contract).
        check(unsafe { cu::cuEventElapsedTime_v2(ms, start.cast(), stop.cast()) })
    })
}

// ---- modules and launch -----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipModuleLoadData(
    module: *mut hipModule_t,
    image: *const c_void,
) -> hipError_t {
    entry(|| {
        if module.is_null() || image.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: a complete image (HIP's contract; here a CUBIN/PTX/fatbin:
        // an AMD code object is rejected by the driver); non-null out pointer.
        check(unsafe { cu::cuModuleLoadData(module.cast(), image) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleUnload(module: hipModule_t) -> hipError_t {
    // SAFETY: a loaded module (HIP's contract).
    forward(|| unsafe { cu::cuModuleUnload(module.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleGetFunction(
    function: *mut hipFunction_t,
    module: hipModule_t,
    name: *const c_char,
) -> hipError_t {
    entry(|| {
        if function.is_null() || name.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: loaded module, NUL-terminated name, non-null out pointer.
        check(unsafe { cu::cuModuleGetFunction(function.cast(), module.cast(), name) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleLaunchKernel(
    f: hipFunction_t,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: hipStream_t,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> hipError_t {
    entry(|| {
        // SAFETY: `extra` is null or a HIP extra list (HIP's contract).
        let mut extra = unsafe { cuda_extra(extra) }?;
        let extra_ptr = extra.as_mut().map_or(null_mut(), |e| e.as_mut_ptr());
        bind()?;
        // SAFETY: live function and stream; `params` per the kernel's
        // parameters or null; `extra_ptr` a CUDA list (or null) that
        // outlives the call.
        check(unsafe {
            cu::cuLaunchKernel(
                f.cast(),
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                shared,
                stream.cast(),
                params,
                extra_ptr,
            )
        })
    })
}

// ---- graphs -------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipGraphInstantiateWithFlags(
    exec: *mut hipGraphExec_t,
    graph: hipGraph_t,
    flags: c_ulonglong,
) -> hipError_t {
    entry(|| {
        let f = match flags {
            0 => 0,
            f if f
                == hip_runtime_sys::hipGraphInstantiateFlags::hipGraphInstantiateFlagAutoFreeOnLaunch
                    as c_ulonglong =>
            {
                cu::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0
                    as c_ulonglong
            }
            _ => return Err(UNSUPPORTED),
        };
        if exec.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: a live graph; non-null out pointer (pointers on both sides).
        check(unsafe { cu::cuGraphInstantiateWithFlags(exec.cast(), graph.cast(), f) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) -> hipError_t {
    // SAFETY: live exec and stream (HIP's contract).
    forward(|| unsafe { cu::cuGraphLaunch(exec.cast(), stream.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphNodeSetEnabled(
    exec: hipGraphExec_t,
    node: hipGraphNode_t,
    enabled: c_uint,
) -> hipError_t {
    // SAFETY: a live exec and a node of its graph (HIP's contract).
    forward(|| unsafe { cu::cuGraphNodeSetEnabled(exec.cast(), node.cast(), enabled) })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphDestroy(graph: hipGraph_t) -> hipError_t {
    // SAFETY: a live graph (HIP's contract).
    forward(|| unsafe { cu::cuGraphDestroy(graph.cast()) })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphExecDestroy(exec: hipGraphExec_t) -> hipError_t {
    // SAFETY: a live exec (HIP's contract).
    forward(|| unsafe { cu::cuGraphExecDestroy(exec.cast()) })
}

/// CUDA's update result as HIP's (HIP 5.2 has no "attributes changed":
/// that one, and any newer code, reads as the generic error).
fn update_result(raw: u32) -> hipGraphExecUpdateResult {
    use cu::CUgraphExecUpdateResult as C;
    use hipGraphExecUpdateResult as H;
    let table = [
        (
            C::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            H::hipGraphExecUpdateSuccess,
        ),
        (C::CU_GRAPH_EXEC_UPDATE_ERROR, H::hipGraphExecUpdateError),
        (
            C::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
            H::hipGraphExecUpdateErrorTopologyChanged,
        ),
        (
            C::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED,
            H::hipGraphExecUpdateErrorNodeTypeChanged,
        ),
        (
            C::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED,
            H::hipGraphExecUpdateErrorFunctionChanged,
        ),
        (
            C::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED,
            H::hipGraphExecUpdateErrorParametersChanged,
        ),
        (
            C::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED,
            H::hipGraphExecUpdateErrorNotSupported,
        ),
        (
            C::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE,
            H::hipGraphExecUpdateErrorUnsupportedFunctionChange,
        ),
    ];
    table
        .iter()
        .find(|(c, _)| *c as u32 == raw)
        .map_or(H::hipGraphExecUpdateError, |(_, h)| *h)
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphExecUpdate(
    exec: hipGraphExec_t,
    graph: hipGraph_t,
    error_node: *mut hipGraphNode_t,
    result: *mut hipGraphExecUpdateResult,
) -> hipError_t {
    entry(|| {
        bind()?;
        // CUDA 12+: one result struct instead of HIP's two out pointers.
        let mut info = cu::CUgraphExecUpdateResultInfo {
            result: cu::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: null_mut(),
            errorFromNode: null_mut(),
        };
        // SAFETY: live exec and graph; valid out struct.
        let r = check(unsafe { cu::cuGraphExecUpdate_v2(exec.cast(), graph.cast(), &mut info) });
        // The result field is read as an integer (the driver may write a
        // value newer than the bindings' enum).
        // SAFETY: `info.result` is a 4-byte field we own.
        let raw = unsafe { raw_u32(addr_of!(info.result)) };
        if !error_node.is_null() {
            // SAFETY: non-null, valid by HIP's contract.
            unsafe { error_node.write(info.errorNode.cast()) };
        }
        if !result.is_null() {
            // SAFETY: non-null, valid by HIP's contract.
            unsafe { result.write(update_result(raw)) };
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphGetNodes(
    graph: hipGraph_t,
    nodes: *mut hipGraphNode_t,
    count: *mut usize,
) -> hipError_t {
    entry(|| {
        if count.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: live graph; `nodes` null or with room for `*count` nodes
        // (HIP's contract; nodes are pointers on both sides).
        check(unsafe { cu::cuGraphGetNodes(graph.cast(), nodes.cast(), count) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphNodeGetType(
    node: hipGraphNode_t,
    kind: *mut hipGraphNodeType,
) -> hipError_t {
    entry(|| {
        if kind.is_null() {
            return Err(INVALID);
        }
        bind()?;
        // SAFETY: a live node; `out` is a 4-byte out value (the enum's size).
        let raw = enum_out(|out| unsafe { cu::cuGraphNodeGetType(node.cast(), out) })?;
        use cu::CUgraphNodeType as C;
        use hipGraphNodeType as H;
        // Memory alloc / free, batch memory op and conditional nodes have no
        // HIP 5.2 value (its 10 and 11 are the symbol copies): not supported.
        let table = [
            (C::CU_GRAPH_NODE_TYPE_KERNEL, H::hipGraphNodeTypeKernel),
            (C::CU_GRAPH_NODE_TYPE_MEMCPY, H::hipGraphNodeTypeMemcpy),
            (C::CU_GRAPH_NODE_TYPE_MEMSET, H::hipGraphNodeTypeMemset),
            (C::CU_GRAPH_NODE_TYPE_HOST, H::hipGraphNodeTypeHost),
            (C::CU_GRAPH_NODE_TYPE_GRAPH, H::hipGraphNodeTypeGraph),
            (C::CU_GRAPH_NODE_TYPE_EMPTY, H::hipGraphNodeTypeEmpty),
            (
                C::CU_GRAPH_NODE_TYPE_WAIT_EVENT,
                H::hipGraphNodeTypeWaitEvent,
            ),
            (
                C::CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                H::hipGraphNodeTypeEventRecord,
            ),
            (
                C::CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL,
                H::hipGraphNodeTypeExtSemaphoreSignal,
            ),
            (
                C::CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT,
                H::hipGraphNodeTypeExtSemaphoreWait,
            ),
        ];
        let (_, h) = table
            .iter()
            .find(|(c, _)| *c as u32 == raw)
            .ok_or(UNSUPPORTED)?;
        // SAFETY: non-null, valid by HIP's contract.
        unsafe { put(kind, *h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphKernelNodeGetParams(
    node: hipGraphNode_t,
    params: *mut hipKernelNodeParams,
) -> hipError_t {
    entry(|| {
        if params.is_null() {
            return Err(INVALID);
        }
        bind()?;
        let mut p = cu::CUDA_KERNEL_NODE_PARAMS {
            func: null_mut(),
            gridDimX: 0,
            gridDimY: 0,
            gridDimZ: 0,
            blockDimX: 0,
            blockDimY: 0,
            blockDimZ: 0,
            sharedMemBytes: 0,
            kernelParams: null_mut(),
            extra: null_mut(),
            kern: null_mut(),
            ctx: null_mut(),
        };
        // SAFETY: a live kernel node; valid out struct.
        check(unsafe { cu::cuGraphKernelNodeGetParams_v2(node.cast(), &mut p) })?;
        // `extra`, when the driver reports one, is passed on as it is: a
        // CUDA list (END is 0x00, not HIP's 0x03). Uncertain: whether CUDA
        // keeps the `extra` form of a captured launch at all; our backend
        // reads only `func`. A node made from a CUkernel (func null, kern
        // set) reads as func null.
        let h = hipKernelNodeParams {
            blockDim: dim3 {
                x: p.blockDimX,
                y: p.blockDimY,
                z: p.blockDimZ,
            },
            extra: p.extra,
            func: p.func.cast(),
            gridDim: dim3 {
                x: p.gridDimX,
                y: p.gridDimY,
                z: p.gridDimZ,
            },
            kernelParams: p.kernelParams,
            sharedMemBytes: p.sharedMemBytes,
        };
        // SAFETY: non-null, valid by HIP's contract.
        unsafe { put(params, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphExecKernelNodeSetParams(
    exec: hipGraphExec_t,
    node: hipGraphNode_t,
    params: *const hipKernelNodeParams,
) -> hipError_t {
    entry(|| {
        if params.is_null() {
            return Err(INVALID);
        }
        // SAFETY: non-null, a hipKernelNodeParams by HIP's contract (plain
        // integers and pointers: any bit pattern is valid).
        let h = unsafe { params.read() };
        // SAFETY: `h.extra` is null or a HIP extra list (HIP's contract).
        let mut extra = unsafe { cuda_extra(h.extra) }?;
        let p = cu::CUDA_KERNEL_NODE_PARAMS {
            func: h.func.cast(),
            gridDimX: h.gridDim.x,
            gridDimY: h.gridDim.y,
            gridDimZ: h.gridDim.z,
            blockDimX: h.blockDim.x,
            blockDimY: h.blockDim.y,
            blockDimZ: h.blockDim.z,
            sharedMemBytes: h.sharedMemBytes,
            kernelParams: h.kernelParams,
            extra: extra.as_mut().map_or(null_mut(), |e| e.as_mut_ptr()),
            // A CUfunction launch, in the node's own context.
            kern: null_mut(),
            ctx: null_mut(),
        };
        bind()?;
        // SAFETY: live exec and node; the parameter arrays outlive the call
        // (the driver copies them).
        check(unsafe { cu::cuGraphExecKernelNodeSetParams_v2(exec.cast(), node.cast(), &p) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_bits_translate_or_are_refused() {
        assert_eq!(flags(0, &HOST_MALLOC_FLAGS), Ok(0));
        assert_eq!(
            flags(hip_runtime_sys::hipHostMallocPortable, &HOST_MALLOC_FLAGS),
            Ok(cu::CU_MEMHOSTALLOC_PORTABLE)
        );
        assert_eq!(
            flags(hip_runtime_sys::hipHostMallocCoherent, &HOST_MALLOC_FLAGS),
            Err(UNSUPPORTED)
        );
    }

    #[test]
    fn hip_extra_lists_get_cuda_keys() {
        let mut size = 16usize;
        let mut buf = [0u8; 16];
        let mut extra: [*mut c_void; 5] = [
            HIP_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buf.as_mut_ptr().cast(),
            HIP_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            HIP_LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: a well-formed list.
        let cuda = unsafe { cuda_extra(extra.as_mut_ptr()) }.unwrap().unwrap();
        assert_eq!(cuda.len(), 5);
        assert_eq!(
            cuda[0] as usize,
            cu::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize
        );
        assert_eq!(cuda[1], extra[1]);
        assert_eq!(
            cuda[2] as usize,
            cu::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize
        );
        assert_eq!(cuda[3], extra[3]);
        assert_eq!(cuda[4] as usize, cu::CU_LAUNCH_PARAM_END_AS_INT as usize);
        // SAFETY: null is "no list".
        assert_eq!(unsafe { cuda_extra(null_mut()) }, Ok(None));
        extra[0] = 0x7 as *mut c_void;
        // SAFETY: readable; an unknown key stops the walk.
        assert_eq!(unsafe { cuda_extra(extra.as_mut_ptr()) }, Err(INVALID));
    }

    #[test]
    fn allocation_properties_translate_field_by_field() {
        // SAFETY: all-zero is a valid hipMemAllocationProp (plain C struct).
        let mut p: hipMemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = hipMemAllocationType::hipMemAllocationTypePinned;
        p.location.type_ = hipMemLocationType::hipMemLocationTypeDevice;
        p.location.id = 3;
        // SAFETY: a valid struct.
        let c = unsafe { alloc_prop(&p) }.unwrap();
        assert_eq!(
            c.type_,
            cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        );
        assert_eq!(
            c.location.type_,
            cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        assert_eq!(c.location.id, 3);
        assert_eq!(
            c.requestedHandleTypes,
            cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        );
        p.allocFlags.compressionType = 1;
        // SAFETY: a valid struct.
        assert_eq!(unsafe { alloc_prop(&p) }.err(), Some(UNSUPPORTED));
        // SAFETY: null is refused before any read.
        assert_eq!(unsafe { alloc_prop(std::ptr::null()) }.err(), Some(INVALID));
    }

    #[test]
    fn update_results_keep_their_meaning() {
        use cu::CUgraphExecUpdateResult as C;
        use hipGraphExecUpdateResult as H;
        assert_eq!(
            update_result(C::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED as u32),
            H::hipGraphExecUpdateErrorTopologyChanged
        );
        assert_eq!(
            update_result(C::CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED as u32),
            H::hipGraphExecUpdateError
        );
        assert_eq!(update_result(1234), H::hipGraphExecUpdateError);
    }

    #[test]
    fn arch_names_fit_with_their_nul() {
        let mut buf = [1 as c_char; 8];
        put_str(&mut buf, "sm_90");
        assert_eq!(
            &buf[..6],
            &[
                b's' as c_char,
                b'm' as c_char,
                b'_' as c_char,
                b'9' as c_char,
                b'0' as c_char,
                0
            ]
        );
        put_str(&mut buf, "0123456789");
        assert_eq!(buf[7], 0);
    }
}

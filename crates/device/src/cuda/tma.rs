//! TMA descriptors (`cuTensorMapEncodeTiled`) and the dynamic shared memory
//! limit of a kernel, as XLA's CUDA executor sets them
//! (stream_executor/cuda/cuda_executor.cc `CreateTensorMap`, tma_util.cc).

use xla_vmm_ffi::cuda::driver as sys;

use super::result::check;
use crate::backend::{DevicePtr, TensorMapDesc};
use crate::error::{DeviceError, Result};

fn bad(m: String) -> DeviceError {
    DeviceError::InvalidArgument(format!("TMA descriptor: {m}"))
}

/// Encode `desc` for the tensor at `base` (XLA's `CreateTensorMap`: data
/// type from the element size, enums passed through).
pub(super) fn encode(desc: &TensorMapDesc, base: DevicePtr) -> Result<[u8; 128]> {
    use sys::CUtensorMapDataType_enum as T;
    let data_type = match desc.element_size {
        1 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2 => T::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        4 => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT64,
        n => return Err(bad(format!("element size {n}"))),
    };
    let rank = desc.global_dims.len();
    if rank == 0
        || rank > 5
        || desc.global_strides.len() + 1 != rank
        || desc.box_dims.len() != rank
        || desc.element_strides.len() != rank
    {
        return Err(bad(format!(
            "rank {rank} with {} strides, {} box dims, {} element strides",
            desc.global_strides.len(),
            desc.box_dims.len(),
            desc.element_strides.len()
        )));
    }
    use sys::CUtensorMapFloatOOBfill_enum as O;
    use sys::CUtensorMapInterleave_enum as I;
    use sys::CUtensorMapL2promotion_enum as L;
    use sys::CUtensorMapSwizzle_enum as S;
    let interleave = match desc.interleave {
        0 => I::CU_TENSOR_MAP_INTERLEAVE_NONE,
        1 => I::CU_TENSOR_MAP_INTERLEAVE_16B,
        2 => I::CU_TENSOR_MAP_INTERLEAVE_32B,
        v => return Err(bad(format!("interleave {v}"))),
    };
    let swizzle = match desc.swizzle {
        0 => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        1 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        2 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        3 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        v => return Err(bad(format!("swizzle {v}"))),
    };
    let l2 = match desc.l2_promotion {
        0 => L::CU_TENSOR_MAP_L2_PROMOTION_NONE,
        1 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        2 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        3 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        v => return Err(bad(format!("L2 promotion {v}"))),
    };
    let oob = match desc.float_oob_fill {
        0 => O::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        1 => O::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
        v => return Err(bad(format!("float OOB fill {v}"))),
    };
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every array has the length cuTensorMapEncodeTiled reads for
    // `rank` (checked above); `map` is a valid out pointer. The call only
    // encodes on the host; `base` is not dereferenced.
    check("cuTensorMapEncodeTiled", unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            rank as u32,
            base.0 as *mut std::ffi::c_void,
            desc.global_dims.as_ptr(),
            desc.global_strides.as_ptr(),
            desc.box_dims.as_ptr(),
            desc.element_strides.as_ptr(),
            interleave,
            swizzle,
            l2,
            oob,
        )
    })?;
    let mut out = [0u8; 128];
    for (chunk, w) in out.chunks_exact_mut(8).zip(map.opaque.iter()) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    Ok(out)
}

/// Allow `bytes` of dynamic shared memory for `func` (needed above 48 KiB;
/// XLA sets it for every launch with dynamic shared memory).
pub(super) fn set_max_dynamic_shared(func: sys::CUfunction, bytes: u32) -> Result<()> {
    // SAFETY: `func` is a live function handle of the current context.
    check("cuFuncSetAttribute", unsafe {
        sys::cuFuncSetAttribute(
            func,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    })
}

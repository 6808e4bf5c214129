//! Kernel launch data: launch dimensions, kernel arguments, kernel code, the
//! argument packing spec and TMA descriptors (xla/service/gpu/launch_dimensions.proto,
//! xla/stream_executor/{launch_dim,kernel_spec,kernel_args_packing_spec}.proto,
//! xla/stream_executor/gpu/tma_metadata.proto).

use serde::Serialize;

use super::{Blob, Shape, Slice};

/// `stream_executor.Dim3DProto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Dim3 {
    pub x: u64,
    pub y: u64,
    pub z: u64,
}

impl Dim3 {
    /// `x * y * z` (saturating).
    pub fn volume(&self) -> u64 {
        self.x.saturating_mul(self.y).saturating_mul(self.z)
    }
}

/// Grid, block and cluster dimensions plus dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LaunchDims {
    /// Number of thread blocks in the grid (`block_counts` / `block_dims`).
    pub blocks: Dim3,
    /// Threads per block (`thread_counts_per_block` / `thread_dims`).
    pub threads: Dim3,
    /// Thread-block cluster shape (`cluster_dim`, Hopper+), if set.
    pub cluster: Option<Dim3>,
    /// Dynamic shared memory per block in bytes (`shmem_bytes` /
    /// `shared_memory_bytes`).
    pub shared_memory_bytes: u64,
}

/// One kernel argument: a device buffer slice, in launch order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelArg {
    pub slice: Slice,
    /// Shape of the array in the slice (`args_shape` / shaped slice), if
    /// recorded.
    pub shape: Option<Shape>,
    /// XLA's `written` flag: the kernel may write this argument (it may
    /// also read it).
    pub written: bool,
    /// The argument is passed as a 128-byte TMA descriptor built from this
    /// slice's address instead of as a plain pointer (`tma_metadata`).
    pub tma: Option<TmaDescriptor>,
}

/// Where a custom kernel's device code is (`KernelLoaderSpecProto.payload`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelCode {
    /// A CUDA cubin (or, on ROCm, a hsaco) holding the kernel.
    Cubin { data: Blob },
    /// PTX text to JIT-compile.
    Ptx { text: String },
    /// A symbol compiled into XLA itself (`in_process_symbol`): not
    /// loadable by us.
    InProcessSymbol { persistent_name: String },
    /// No payload was present.
    None,
}

/// `KernelLoaderSpecProto` of a custom kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelSpec {
    pub code: KernelCode,
    /// Symbol name of the kernel function inside `code` (`kernel_name`).
    pub kernel_name: String,
    /// Number of kernel parameters (`arity`).
    pub arity: u32,
    /// How to build the parameter buffer from the argument pointers; when
    /// `None` the kernel takes one pointer per [`KernelArg`], in order.
    pub packing: Option<Vec<KernelParam>>,
}

/// One packed kernel parameter (`KernelArgPackingSpecProto`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelParam {
    /// `KIND_BITS64_ABSOLUTE` relocation: the parameter is the 8-byte device
    /// address of kernel argument `arg_index` (index into the thunk's `args`;
    /// when that argument has a TMA descriptor, its 128-byte descriptor).
    ArgAddress { arg_index: u32 },
    /// A constant parameter: these bytes verbatim.
    Bytes { data: Blob },
}

/// `TmaDescriptorProto`: parameters of `cuTensorMapEncodeTiled`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TmaDescriptor {
    /// Bytes per element.
    pub element_size: u64,
    /// Global tensor dimensions, innermost first (elements).
    pub global_dims: Vec<u64>,
    /// Global strides in bytes (one fewer than dims, as cuTensorMap wants).
    pub global_strides: Vec<u64>,
    /// Box (tile) size per dimension, in elements.
    pub box_dims: Vec<u32>,
    /// Element strides per dimension.
    pub element_strides: Vec<u32>,
    /// `TmaInterleave`: 0 none, 1 16 B, 2 32 B.
    pub interleave: i32,
    /// `TmaSwizzle`: 0 none, 1 32 B, 2 64 B, 3 128 B.
    pub swizzle: i32,
    /// `TmaL2Promotion`: 0 none, 1 64 B, 2 128 B, 3 256 B.
    pub l2_promotion: i32,
    /// `TmaFloatOobFill`: 0 none, 1 NaN-request-zero-FMA.
    pub float_oob_fill: i32,
}

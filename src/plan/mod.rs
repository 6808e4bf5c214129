//! The decoded, owned execution plan of one XLA GPU executable.
//!
//! Names mirror XLA (`BufferAllocation`, `Slice`, thunk kinds) so this code
//! can be read side by side with upstream (xla/service/buffer_assignment.h,
//! xla/backends/gpu/runtime/thunk.h). Everything is owned, `Clone`, and
//! `serde::Serialize` (large byte payloads serialize as their length only).
//!
//! Where to start: [`Plan`] holds the allocation table and the top-level
//! thunk sequence; [`Thunk::walk`] visits the tree; [`Thunk::uses`] lists
//! the slices a thunk reads and writes.

mod allocation;
mod collective;
mod conv;
mod ffi_attr;
mod fft;
mod gemm;
mod kernel;
mod kinds;
mod shape;
mod thunk;
mod walk;

pub use allocation::{
    Access, AllocationIndex, AllocationRole, BufferAllocation, OutputAlias, OutputInfo,
    ShapedSlice, Slice,
};
pub use collective::{CollectiveBuffer, CollectiveOp, CollectiveThunk, GroupMode, ReductionKind};
pub use conv::{ConvAlgorithm, ConvDims, ConvKind, ConvolutionThunk, WindowDim};
pub use ffi_attr::{dtype as ffi_dtype, FfiArray, FfiAttr, FfiAttrs, FfiScalar};
pub use fft::{FftThunk, FftType};
pub use gemm::{GemmConfig, MatrixLayout, BLAS_LT_EPILOGUE_NAMES};
pub use kernel::{Dim3, KernelArg, KernelCode, KernelParam, KernelSpec, LaunchDims, TmaDescriptor};
pub use kinds::{thunk_kind_name, THUNK_KINDS};
pub use shape::{ElementType, ProgramShape, Shape, HOST_MEMORY_SPACE};
pub use thunk::{
    AsyncStartThunk, ConditionalThunk, CopyThunk, CublasLtMatmulThunk, CustomCallThunk,
    CustomKernelThunk, DsfOffset, DsfParameter, DsfResult, DynamicSliceConfig,
    DynamicSliceFusionThunk, ExecutionStream, GemmThunk, HostExecuteStartThunk, KernelThunk,
    OffsetExpr, SelectKThunk, SolveTranspose, Thunk, ThunkInfo, ThunkKind, TriangularSolveThunk,
    WhileThunk,
};
pub use walk::Nested;

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

/// Owned bytes (cubins, constants) that serialize to JSON as
/// `{"len": N}` instead of N numbers.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Blob(pub Vec<u8>);

impl std::ops::Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Blob", 1)?;
        st.serialize_field("len", &self.0.len())?;
        st.end()
    }
}

impl From<Vec<u8>> for Blob {
    fn from(v: Vec<u8>) -> Self {
        Blob(v)
    }
}

/// `GpuExecutableProto.gpu_compute_capability`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ComputeCapability {
    /// CUDA `major.minor` (9.0 = H100/H200).
    Cuda { major: i32, minor: i32 },
    /// ROCm `gcn_arch_name` (e.g. `gfx942:sramecc+:xnack-`).
    Rocm { gcn_arch_name: String },
    /// Not set, or a platform we do not read.
    Unknown,
}

/// The executable's module code (`GpuExecutableProto` fields 3 and 4).
/// Per-kernel binaries of custom kernels live in their thunks
/// ([`CustomKernelThunk::spec`]); [`Plan::custom_kernel_binaries`] lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelBinaries {
    /// `binary`: the module's cubin (CUDA) or hsaco (ROCm) holding the
    /// kernels of `kernel` thunks and the constants' globals. May be empty
    /// when every kernel is a custom kernel.
    pub binary: Blob,
    /// `asm_text`: the module's PTX (CUDA only; may be empty).
    #[serde(serialize_with = "ser_text_len")]
    pub asm_text: String,
    /// `dnn_compiled_graphs`: cuDNN graph name → serialized graph (JSON).
    pub dnn_compiled_graphs: BTreeMap<String, Blob>,
}

fn ser_text_len<S: Serializer>(t: &str, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("Text", 1)?;
    st.serialize_field("len", &t.len())?;
    st.end()
}

/// The decoded executable.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// `module_name`: the HLO module name (e.g. `jit_step`).
    pub module_name: String,
    /// `ExecutableAndOptionsProto.pjrt_client_name` (e.g. `"PjRtStreamExecutorClient"`).
    pub pjrt_client_name: String,
    pub compute_capability: ComputeCapability,
    /// The allocation table; `allocations[i].index == i`.
    pub allocations: Vec<BufferAllocation>,
    /// Entry computation signature.
    pub program_shape: ProgramShape,
    /// `output_info_map`: where each result leaf lives, in proto order.
    pub outputs: Vec<OutputInfo>,
    /// Module binary and PTX.
    pub kernels: KernelBinaries,
    /// The top-level thunk sequence (`thunks`, the ENTRY computation).
    pub thunks: Vec<Thunk>,
}

impl Plan {
    /// Calls `f(thunk, depth)` for every thunk, depth first in execution
    /// order (top level = depth 0), including nested sequences and
    /// dynamic-slice-fusion embedded thunks.
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&'a Thunk, usize)) {
        for t in &self.thunks {
            t.walk(0, f);
        }
    }

    /// Number of thunks of each kind name, counted recursively (what
    /// `inspect --json` prints as `kinds`).
    pub fn kind_counts(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        self.walk(&mut |t, _| *m.entry(t.kind_name().to_string()).or_insert(0) += 1);
        m
    }

    /// Thunks of kinds we do not execute, anywhere in the tree.
    pub fn unsupported(&self) -> Vec<&Thunk> {
        let mut v = Vec::new();
        self.walk(&mut |t, _| {
            if matches!(t.kind, ThunkKind::Unsupported { .. }) {
                v.push(t)
            }
        });
        v
    }

    /// The (kernel name, cubin bytes) of every custom kernel with a cubin
    /// payload, in walk order (duplicates kept).
    pub fn custom_kernel_binaries(&self) -> Vec<(&str, &[u8])> {
        let mut v = Vec::new();
        self.walk(&mut |t, _| {
            if let ThunkKind::CustomKernel(k) = &t.kind {
                if let KernelCode::Cubin { data } = &k.spec.code {
                    v.push((k.spec.kernel_name.as_str(), &data[..]));
                }
            }
        });
        v
    }

    /// Sum of all allocation sizes in bytes.
    pub fn total_allocation_bytes(&self) -> u64 {
        self.allocations
            .iter()
            .map(|a| a.size)
            .fold(0, u64::saturating_add)
    }
}

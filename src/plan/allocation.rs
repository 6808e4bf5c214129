//! Buffer allocations and slices, mirroring `xla.BufferAllocationProto`
//! (xla/service/hlo.proto) and `BufferAllocationSliceProto`
//! (xla/service/buffer_assignment.proto).
//!
//! XLA's buffer assignment packs every buffer of the program into a few
//! *allocations* (one contiguous device memory block each). Thunks never hold
//! pointers: they hold [`Slice`]s (allocation index, byte offset, byte size),
//! so running the executable against new memory only swaps the table of
//! allocation base addresses.

use serde::Serialize;

use super::{Blob, Shape};

/// Index of a [`BufferAllocation`] in [`crate::Plan::allocations`]
/// (equal to `BufferAllocation::index`; the decoder checks that
/// `allocations[i].index == i`).
pub type AllocationIndex = usize;

/// One buffer allocation (`BufferAllocationProto`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BufferAllocation {
    /// Position in the allocation table; slices refer to it.
    pub index: AllocationIndex,
    /// Size in bytes of the whole allocation.
    pub size: u64,
    /// What the allocation holds; see [`AllocationRole`].
    pub role: AllocationRole,
    /// `maybe_live_out`: the allocation may hold (part of) the program
    /// result. True for `Output`s, and for parameters XLA aliases with an
    /// output (donated buffers).
    pub maybe_live_out: bool,
    /// `is_tuple`: the allocation holds a tuple index table (pointers), not
    /// array data.
    pub is_tuple: bool,
    /// `is_thread_local`: not backed by device memory (XLA GPU never sets it
    /// for allocations thunks use).
    pub is_thread_local: bool,
    /// `color`: XLA memory space (0 = default device memory; other values
    /// e.g. collective or host memory spaces).
    pub color: i64,
}

/// What a buffer allocation holds. The role is derived from the proto flags
/// exactly as issue 2 defines it, in this order: `is_entry_computation_parameter`
/// → `Parameter`; else `is_constant` → `Constant`; else `maybe_live_out` →
/// `Output`; else `Temp`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AllocationRole {
    /// An entry computation parameter, bound to a user buffer each run.
    Parameter {
        /// `parameter_number`: which entry parameter (0-based, HLO order =
        /// jax's `tree.leaves` order of the jit arguments).
        number: u64,
        /// `parameter_shape_index`: the path into a tuple-shaped parameter
        /// (empty for an array parameter, the usual case with jax).
        shape_index: Vec<i64>,
        /// `is_parameter_aliased_with_output`: the parameter buffer is also
        /// (part of) an output (a donated buffer updated in place). The
        /// output entries that use it are in `Plan::outputs`.
        aliased_with_output: bool,
    },
    /// A constant: its bytes must be in the allocation before the first run
    /// and never change.
    Constant {
        /// `ConstantInfoProto.symbol_name`: the constant's global symbol in
        /// the module binary (empty if none was recorded).
        symbol_name: String,
        /// `ConstantInfoProto.content`: the initial bytes. When XLA
        /// serialized the constant without content, the decoder takes the
        /// value from the executable's HLO module (as XLA does when loading
        /// it); empty only if neither had it.
        bytes: Blob,
    },
    /// A live-out output that is not a parameter: the runtime binds a fresh
    /// result buffer to it each run.
    Output {
        /// The entries of `GpuExecutableProto.output_info_map` whose
        /// `allocation_index` is this allocation (which parts of the result
        /// live here, and whether they pass through / alias a parameter).
        outputs: Vec<OutputInfo>,
    },
    /// Scratch memory owned by the executable (XLA packs many temporaries
    /// into few large temp allocations).
    Temp,
}

impl BufferAllocation {
    /// An allocation of `size` bytes in device memory (color 0, not a tuple,
    /// not thread-local), live out when it is an output or a donated
    /// parameter, as XLA marks them. For plans built in code (tests, tools).
    pub fn new(index: AllocationIndex, size: u64, role: AllocationRole) -> Self {
        let maybe_live_out = matches!(
            role,
            AllocationRole::Output { .. }
                | AllocationRole::Parameter {
                    aliased_with_output: true,
                    ..
                }
        );
        BufferAllocation {
            index,
            size,
            role,
            maybe_live_out,
            is_tuple: false,
            is_thread_local: false,
            color: 0,
        }
    }
}

impl AllocationRole {
    /// Lower-case role name as used in `inspect --json`: `parameter`,
    /// `constant`, `output` or `temp`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Parameter { .. } => "parameter",
            Self::Constant { .. } => "constant",
            Self::Output { .. } => "output",
            Self::Temp => "temp",
        }
    }
}

/// One entry of `GpuExecutableProto.output_info_map`: where one leaf of the
/// result lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OutputInfo {
    /// `shape_index`: the path of this leaf in the result shape (`[i]` = the
    /// i-th element of a result tuple; `[]` = a non-tuple result).
    pub shape_index: Vec<i64>,
    /// The allocation that holds this leaf.
    pub allocation: AllocationIndex,
    /// `passthrough`: the output is an input parameter returned unchanged.
    pub passthrough: bool,
    /// `alias_config`: the output aliases an input parameter (donation).
    pub alias: Option<OutputAlias>,
}

/// `HloInputOutputAliasProto.AliasEntryProto`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OutputAlias {
    /// `output_shape_index`: path of the output leaf in the result.
    pub output_shape_index: Vec<i64>,
    /// `parameter_number`: the aliased entry parameter.
    pub parameter_number: i64,
    /// `parameter_shape_index`: path inside that parameter.
    pub parameter_shape_index: Vec<i64>,
    /// `kind`: 0 = undefined, 1 = may alias, 2 = must alias (xla.Kind).
    pub kind: i32,
}

/// `BufferAllocationSliceProto` / `BufferAllocation::Slice`: a byte range of
/// one allocation. Every address a thunk uses is
/// `base(allocation) + offset`, `size` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Slice {
    /// `buffer_allocation_index`.
    pub allocation: AllocationIndex,
    /// Byte offset from the start of the allocation.
    pub offset: u64,
    /// Length in bytes (the decoder checks `offset + size <= allocation size`
    /// for top-level allocations).
    pub size: u64,
}

impl Slice {
    /// One past the last byte (`offset + size`, saturating).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.size)
    }
    /// Do the two slices share at least one byte?
    pub fn overlaps(&self, other: &Slice) -> bool {
        self.allocation == other.allocation
            && self.offset < other.end()
            && other.offset < self.end()
            && self.size > 0
            && other.size > 0
    }
}

/// `ShapedSliceProto`: a slice plus the shape of the array stored in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShapedSlice {
    pub slice: Slice,
    /// `None` when the proto carried no shape.
    pub shape: Option<Shape>,
}

/// How a thunk accesses a slice (for copy-in / copy-back decisions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Only read.
    Read,
    /// May be written; XLA does not say whether it is also read first or
    /// fully overwritten (e.g. a kernel argument with `written = true`, an
    /// in-place update). Treat as read + write.
    Write,
    /// Every byte is written and none is read first (memzero, memset, the
    /// destination of a copy): the old contents do not matter.
    Overwrite,
}

impl Access {
    /// Does the access observe the slice's previous contents?
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::Write)
    }
    /// Does the access change the slice?
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::Overwrite)
    }
}

//! Collective thunks (`AllGatherThunkProto`, `AllReduceThunkProto`, ...,
//! xla/backends/gpu/runtime/thunk.proto and collective_thunk.proto). They
//! are decoded so that tools can show them and the runtime can run them
//! over a communicator per clique (crates/runtime/src/collective.rs).

use serde::Serialize;

use super::{ElementType, ShapedSlice};

/// Which collective operation, one per `ThunkProto` oneof field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    /// `all_gather_thunk` (38).
    AllGather,
    /// `all_reduce_thunk` (39).
    AllReduce,
    /// `reduce_scatter_thunk` (40).
    ReduceScatter,
    /// `all_to_all_thunk` (41).
    AllToAll,
    /// `collective_permute_thunk` (43).
    CollectivePermute,
    /// `collective_broadcast_thunk` (46).
    CollectiveBroadcast,
}

impl CollectiveOp {
    /// The `ThunkProto` oneof field name without `_thunk`.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::AllToAll => "all_to_all",
            CollectiveOp::CollectivePermute => "collective_permute",
            CollectiveOp::CollectiveBroadcast => "collective_broadcast",
        }
    }
}

/// `xla.ReductionKindProto` (all-reduce, reduce-scatter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReductionKind {
    Sum,
    Product,
    Min,
    Max,
}

impl ReductionKind {
    /// From the proto number; `None` for 0 (unspecified) and unknown values.
    pub fn from_proto(v: i32) -> Option<Self> {
        Some(match v {
            1 => ReductionKind::Sum,
            2 => ReductionKind::Product,
            3 => ReductionKind::Min,
            4 => ReductionKind::Max,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ReductionKind::Sum => "sum",
            ReductionKind::Product => "product",
            ReductionKind::Min => "min",
            ReductionKind::Max => "max",
        }
    }
}

/// `xla.CollectiveOpGroupMode`: what the ids in the replica groups mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupMode {
    CrossReplica,
    CrossPartition,
    CrossReplicaAndPartition,
    FlattenedId,
}

impl GroupMode {
    /// From the proto number; `None` for values this build does not know.
    pub fn from_proto(v: i32) -> Option<Self> {
        Some(match v {
            0 => GroupMode::CrossReplica,
            1 => GroupMode::CrossPartition,
            2 => GroupMode::CrossReplicaAndPartition,
            3 => GroupMode::FlattenedId,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            GroupMode::CrossReplica => "cross_replica",
            GroupMode::CrossPartition => "cross_partition",
            GroupMode::CrossReplicaAndPartition => "cross_replica_and_partition",
            GroupMode::FlattenedId => "flattened_id",
        }
    }
}

/// `CollectiveBufferProto`: one operand (`source`, read) and its result
/// (`destination`, written).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CollectiveBuffer {
    /// Number of elements of the operand.
    pub element_count: u64,
    /// The operand's element type (`operand_element_type[i]` of the config),
    /// when the config lists one for this buffer.
    pub element_type: Option<ElementType>,
    pub source: ShapedSlice,
    pub destination: ShapedSlice,
    /// Memory spaces (0 = default device memory).
    pub source_memory_space: i64,
    pub destination_memory_space: i64,
}

/// A collective thunk of any [`CollectiveOp`]. Run asynchronously when the
/// enclosing thunk is an `AsyncStart` on a communication stream (XLA has no
/// per-collective start/done thunks in this version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CollectiveThunk {
    pub op: CollectiveOp,
    /// `replica_groups`: the ids that communicate together, one list per
    /// group (empty = all participants form one group).
    pub replica_groups: Vec<Vec<i64>>,
    pub group_mode: GroupMode,
    /// `operand_element_type`, one per operand.
    pub operand_element_types: Vec<ElementType>,
    pub use_symmetric_buffer: bool,
    /// For all-reduce and reduce-scatter (`None` for the other ops).
    pub reduction: Option<ReductionKind>,
    pub buffers: Vec<CollectiveBuffer>,
    /// Collective permute: (source, target) id pairs.
    pub source_target_pairs: Vec<(i64, i64)>,
    /// All-to-all: `has_split_dimension`.
    pub has_split_dimension: bool,
    /// Collective broadcast: the last buffer holds the root rank per
    /// broadcast and is only read.
    pub has_dynamic_root: bool,
    /// `xla.DebugOptions.CollectivesMode` number (all-gather, permute;
    /// 0 otherwise).
    pub collectives_mode: i32,
    /// Decoded from a `collective_kernel` thunk (XLA's one-shot all-reduce
    /// kernel over peer memory, field 59): `op` is then
    /// [`CollectiveOp::AllReduce`] and `reduction` comes from the
    /// executable's HLO module (the kernel bakes it in). Run as a library
    /// all-reduce: bit-identical for 2 participants (one addition, which
    /// commutes); with more participants the summation order may differ.
    pub from_collective_kernel: bool,
}

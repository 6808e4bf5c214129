//! Collective thunk payloads (`AllReduceThunkProto`, ...,
//! `ReplicaIdThunkProto`, `PartitionIdThunkProto`,
//! `CollectiveKernelThunkProto`) → typed [`ThunkKind`]s.

use super::convert::decode_msg;
use super::convert::{invalid, non_negative, Allocs};
use super::DecodeError;
use crate::plan::{
    CollectiveBuffer, CollectiveOp, CollectiveThunk, ElementType, GroupMode, ReductionKind,
    ThunkKind,
};
use crate::proto::xla::gpu as pg;

/// The `ThunkProto` field numbers decoded here.
pub(crate) fn is_collective_field(number: u32) -> bool {
    matches!(number, 12 | 14 | 38 | 39 | 40 | 41 | 43 | 46 | 59)
}

/// What every collective payload carries, and what some of them add.
#[derive(Default)]
struct Payload {
    config: Option<pg::CollectiveConfigProto>,
    buffers: Vec<pg::CollectiveBufferProto>,
    reduction: Option<ReductionKind>,
    pairs: Vec<(i64, i64)>,
    has_split_dimension: bool,
    has_dynamic_root: bool,
    collectives_mode: i32,
    from_collective_kernel: bool,
}

/// Decodes the payload of collective kind `number` (see
/// [`is_collective_field`]); `None` for other numbers.
#[inline(never)]
pub(crate) fn collective_kind(
    number: u32,
    data: &[u8],
    p: &str,
    allocs: Allocs<'_>,
) -> Result<Option<ThunkKind>, DecodeError> {
    if let 12 | 14 = number {
        return logical_id(number, data, p, allocs).map(Some);
    }
    match payload(number, data, p)? {
        Some((op, payload)) => collective(op, payload, p, allocs).map(Some),
        None => Ok(None),
    }
}

/// `replica_id` (12) / `partition_id` (14): where the id goes.
fn logical_id(
    number: u32,
    data: &[u8],
    p: &str,
    allocs: Allocs<'_>,
) -> Result<ThunkKind, DecodeError> {
    let dest = if number == 12 {
        let m: pg::ReplicaIdThunkProto = decode_msg(data, "ReplicaIdThunkProto", p)?;
        m.dest_buffer
    } else {
        let m: pg::PartitionIdThunkProto = decode_msg(data, "PartitionIdThunkProto", p)?;
        m.dest_buffer
    };
    let dest = allocs.req_slice(&dest, &|| format!("{p}: dest"))?;
    Ok(if number == 12 {
        ThunkKind::ReplicaId { dest }
    } else {
        ThunkKind::PartitionId { dest }
    })
}

/// The op and its payload's fields, by kind number.
fn payload(
    number: u32,
    data: &[u8],
    p: &str,
) -> Result<Option<(CollectiveOp, Payload)>, DecodeError> {
    let common = |config, buffers| Payload {
        config,
        buffers,
        ..Payload::default()
    };
    Ok(Some(match number {
        38 => {
            let m: pg::AllGatherThunkProto = decode_msg(data, "AllGatherThunkProto", p)?;
            let mode = m.collectives_mode;
            let pl = common(m.collective_config, m.buffers);
            (
                CollectiveOp::AllGather,
                Payload {
                    collectives_mode: mode,
                    ..pl
                },
            )
        }
        39 => {
            let m: pg::AllReduceThunkProto = decode_msg(data, "AllReduceThunkProto", p)?;
            let reduction = Some(reduction_kind(m.reduction_kind, p)?);
            let pl = common(m.collective_config, m.buffers);
            (CollectiveOp::AllReduce, Payload { reduction, ..pl })
        }
        40 => {
            let m: pg::ReduceScatterThunkProto = decode_msg(data, "ReduceScatterThunkProto", p)?;
            let reduction = Some(reduction_kind(m.reduction_kind, p)?);
            let pl = common(m.collective_config, m.buffers);
            (CollectiveOp::ReduceScatter, Payload { reduction, ..pl })
        }
        41 => {
            let m: pg::AllToAllThunkProto = decode_msg(data, "AllToAllThunkProto", p)?;
            let split = m.has_split_dimension;
            let pl = common(m.collective_config, m.buffers);
            (
                CollectiveOp::AllToAll,
                Payload {
                    has_split_dimension: split,
                    ..pl
                },
            )
        }
        43 => {
            let m: pg::CollectivePermuteThunkProto =
                decode_msg(data, "CollectivePermuteThunkProto", p)?;
            let (mode, pairs) = (
                m.collectives_mode,
                source_target_pairs(&m.source_target_pairs, p)?,
            );
            let pl = common(m.collective_config, m.buffers);
            let pl = Payload {
                collectives_mode: mode,
                pairs,
                ..pl
            };
            (CollectiveOp::CollectivePermute, pl)
        }
        46 => {
            let m: pg::CollectiveBroadcastThunkProto =
                decode_msg(data, "CollectiveBroadcastThunkProto", p)?;
            let root = m.has_dynamic_root;
            if root && m.buffers.is_empty() {
                return Err(invalid(format!(
                    "{p}: has_dynamic_root without a root buffer"
                )));
            }
            let pl = common(m.collective_config, m.buffers);
            (
                CollectiveOp::CollectiveBroadcast,
                Payload {
                    has_dynamic_root: root,
                    ..pl
                },
            )
        }
        59 => {
            // The one-shot all-reduce kernel; its reduction is filled in
            // from the HLO module afterwards (hlo_reduction.rs).
            let m: pg::CollectiveKernelThunkProto =
                decode_msg(data, "CollectiveKernelThunkProto", p)?;
            let pl = common(m.collective_config, m.buffers);
            (
                CollectiveOp::AllReduce,
                Payload {
                    from_collective_kernel: true,
                    ..pl
                },
            )
        }
        _ => return Ok(None),
    }))
}

/// A collective permute's (source, target) pairs; a negative id is an error.
fn source_target_pairs(
    v: &[crate::proto::xla::SourceTarget],
    p: &str,
) -> Result<Vec<(i64, i64)>, DecodeError> {
    v.iter()
        .map(|st| {
            if st.source < 0 || st.target < 0 {
                Err(invalid(format!(
                    "{p}: negative id in source-target pair ({}, {})",
                    st.source, st.target
                )))
            } else {
                Ok((st.source, st.target))
            }
        })
        .collect()
}

/// The thunk from its op and payload: config, groups, buffers checked.
fn collective(
    op: CollectiveOp,
    pl: Payload,
    p: &str,
    allocs: Allocs<'_>,
) -> Result<ThunkKind, DecodeError> {
    let config = pl
        .config
        .ok_or_else(|| invalid(format!("{p}: missing collective_config")))?;
    let group_mode = GroupMode::from_proto(config.group_mode)
        .ok_or_else(|| invalid(format!("{p}: unknown group mode {}", config.group_mode)))?;
    let replica_groups = config
        .replica_groups
        .iter()
        .map(|g| {
            if let Some(id) = g.replica_ids.iter().find(|&&id| id < 0) {
                return Err(invalid(format!("{p}: negative replica id {id}")));
            }
            Ok(g.replica_ids.clone())
        })
        .collect::<Result<_, _>>()?;
    let operand_element_types: Vec<ElementType> = config
        .operand_element_type
        .iter()
        .map(|&t| ElementType(t))
        .collect();
    let buffers = pl
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let ctx = |what: &'static str| move || format!("{p}: buffer {i} {what}");
            Ok(CollectiveBuffer {
                element_count: non_negative(b.element_count, &ctx("element count"))?,
                element_type: operand_element_types.get(i).copied(),
                source: allocs.req_shaped(&b.source_buffer, &ctx("source"))?,
                destination: allocs.req_shaped(&b.destination_buffer, &ctx("destination"))?,
                source_memory_space: b.source_memory_space,
                destination_memory_space: b.destination_memory_space,
            })
        })
        .collect::<Result<_, DecodeError>>()?;
    Ok(ThunkKind::Collective(Box::new(CollectiveThunk {
        op,
        replica_groups,
        group_mode,
        operand_element_types,
        use_symmetric_buffer: config.use_symmetric_buffer,
        reduction: pl.reduction,
        buffers,
        source_target_pairs: pl.pairs,
        has_split_dimension: pl.has_split_dimension,
        has_dynamic_root: pl.has_dynamic_root,
        collectives_mode: pl.collectives_mode,
        from_collective_kernel: pl.from_collective_kernel,
    })))
}

fn reduction_kind(v: i32, p: &str) -> Result<ReductionKind, DecodeError> {
    ReductionKind::from_proto(v)
        .ok_or_else(|| invalid(format!("{p}: unknown or unspecified reduction kind {v}")))
}

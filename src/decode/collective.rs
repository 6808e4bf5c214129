//! Collective thunk payloads (`AllReduceThunkProto`, ...,
//! `ReplicaIdThunkProto`, `PartitionIdThunkProto`,
//! `CollectiveKernelThunkProto`) → typed [`ThunkKind`]s.

use super::convert::{invalid, non_negative, Allocs};
use super::thunk::decode_msg;
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

/// What every collective payload carries, before the per-op fields.
struct Common {
    config: Option<pg::CollectiveConfigProto>,
    buffers: Vec<pg::CollectiveBufferProto>,
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
    let mut reduction = None;
    let mut pairs = Vec::new();
    let mut has_split_dimension = false;
    let mut has_dynamic_root = false;
    let mut collectives_mode = 0;
    let mut from_collective_kernel = false;
    let (op, common) = match number {
        12 | 14 => {
            let dest = if number == 12 {
                let m: pg::ReplicaIdThunkProto = decode_msg(data, "ReplicaIdThunkProto", p)?;
                m.dest_buffer
            } else {
                let m: pg::PartitionIdThunkProto = decode_msg(data, "PartitionIdThunkProto", p)?;
                m.dest_buffer
            };
            let dest = allocs.req_slice(&dest, &|| format!("{p}: dest"))?;
            return Ok(Some(if number == 12 {
                ThunkKind::ReplicaId { dest }
            } else {
                ThunkKind::PartitionId { dest }
            }));
        }
        38 => {
            let m: pg::AllGatherThunkProto = decode_msg(data, "AllGatherThunkProto", p)?;
            collectives_mode = m.collectives_mode;
            (
                CollectiveOp::AllGather,
                Common::of(m.collective_config, m.buffers),
            )
        }
        39 => {
            let m: pg::AllReduceThunkProto = decode_msg(data, "AllReduceThunkProto", p)?;
            reduction = Some(reduction_kind(m.reduction_kind, p)?);
            (
                CollectiveOp::AllReduce,
                Common::of(m.collective_config, m.buffers),
            )
        }
        40 => {
            let m: pg::ReduceScatterThunkProto = decode_msg(data, "ReduceScatterThunkProto", p)?;
            reduction = Some(reduction_kind(m.reduction_kind, p)?);
            (
                CollectiveOp::ReduceScatter,
                Common::of(m.collective_config, m.buffers),
            )
        }
        41 => {
            let m: pg::AllToAllThunkProto = decode_msg(data, "AllToAllThunkProto", p)?;
            has_split_dimension = m.has_split_dimension;
            (
                CollectiveOp::AllToAll,
                Common::of(m.collective_config, m.buffers),
            )
        }
        43 => {
            let m: pg::CollectivePermuteThunkProto =
                decode_msg(data, "CollectivePermuteThunkProto", p)?;
            collectives_mode = m.collectives_mode;
            pairs = m
                .source_target_pairs
                .iter()
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
                .collect::<Result<_, _>>()?;
            (
                CollectiveOp::CollectivePermute,
                Common::of(m.collective_config, m.buffers),
            )
        }
        46 => {
            let m: pg::CollectiveBroadcastThunkProto =
                decode_msg(data, "CollectiveBroadcastThunkProto", p)?;
            has_dynamic_root = m.has_dynamic_root;
            if has_dynamic_root && m.buffers.is_empty() {
                return Err(invalid(format!(
                    "{p}: has_dynamic_root without a root buffer"
                )));
            }
            (
                CollectiveOp::CollectiveBroadcast,
                Common::of(m.collective_config, m.buffers),
            )
        }
        59 => {
            // The one-shot all-reduce kernel; its reduction is filled in
            // from the HLO module afterwards (hlo_reduction.rs).
            let m: pg::CollectiveKernelThunkProto =
                decode_msg(data, "CollectiveKernelThunkProto", p)?;
            from_collective_kernel = true;
            (
                CollectiveOp::AllReduce,
                Common::of(m.collective_config, m.buffers),
            )
        }
        _ => return Ok(None),
    };
    let config = common
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
    let buffers = common
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
    Ok(Some(ThunkKind::Collective(Box::new(CollectiveThunk {
        op,
        replica_groups,
        group_mode,
        operand_element_types,
        use_symmetric_buffer: config.use_symmetric_buffer,
        reduction,
        buffers,
        source_target_pairs: pairs,
        has_split_dimension,
        has_dynamic_root,
        collectives_mode,
        from_collective_kernel,
    }))))
}

impl Common {
    fn of(
        config: Option<pg::CollectiveConfigProto>,
        buffers: Vec<pg::CollectiveBufferProto>,
    ) -> Self {
        Common { config, buffers }
    }
}

fn reduction_kind(v: i32, p: &str) -> Result<ReductionKind, DecodeError> {
    ReductionKind::from_proto(v)
        .ok_or_else(|| invalid(format!("{p}: unknown or unspecified reduction kind {v}")))
}

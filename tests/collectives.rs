//! Collective thunks (all-reduce, all-gather, ..., replica / partition id)
//! decode into typed kinds with their groups, reduction and buffers; their
//! uses are the sources (read) and destinations (written); malformed
//! payloads are decode errors. No fixture has collectives: the executables
//! here are synthetic.

mod common;

use common::{exe_with_thunks, executable, thunk_bytes};
use prost::Message;
use xla_vmm::proto::xla::{self as px, buffer_assignment::BufferAllocationSliceProto};
use xla_vmm::{
    decode, Access, CollectiveOp, DecodeError, ElementType, ExecutionStream, GroupMode, Plan,
    ReductionKind, Slice, ThunkKind,
};

use px::gpu as pg;

const F32: i32 = 11;
const BF16: i32 = 16;

fn slice(offset: i64, size: i64) -> BufferAllocationSliceProto {
    BufferAllocationSliceProto {
        offset,
        size,
        buffer_allocation_index: 0,
        element_type: 0,
    }
}

fn shaped(offset: i64, size: i64) -> Option<px::ShapedSliceProto> {
    Some(px::ShapedSliceProto {
        slice: Some(slice(offset, size)),
        shape: None,
    })
}

fn buffer(count: i64, src: (i64, i64), dst: (i64, i64)) -> pg::CollectiveBufferProto {
    pg::CollectiveBufferProto {
        element_count: count,
        source_buffer: shaped(src.0, src.1),
        destination_buffer: shaped(dst.0, dst.1),
        source_memory_space: 0,
        destination_memory_space: 0,
    }
}

fn config(types: &[i32], groups: &[&[i64]], mode: i32) -> Option<pg::CollectiveConfigProto> {
    Some(pg::CollectiveConfigProto {
        operand_element_type: types.to_vec(),
        replica_groups: groups
            .iter()
            .map(|g| px::ReplicaGroup {
                replica_ids: g.to_vec(),
            })
            .collect(),
        group_mode: mode,
        use_symmetric_buffer: false,
    })
}

fn plan_of(thunks: Vec<Vec<u8>>) -> Plan {
    decode(&executable(&exe_with_thunks(thunks))).expect("decodes")
}

fn decode_err(thunk: Vec<u8>) -> DecodeError {
    match decode(&executable(&exe_with_thunks(vec![thunk]))) {
        Ok(p) => panic!("malformed collective decoded: {:?}", p.thunks),
        Err(e) => e,
    }
}

fn s(offset: u64, size: u64) -> Slice {
    Slice {
        allocation: 0,
        offset,
        size,
    }
}

fn all_reduce_bytes(annotation: &str, reduction: i32) -> Vec<u8> {
    let m = pg::AllReduceThunkProto {
        collective_config: config(&[F32, BF16], &[&[0, 1], &[2, 3]], 1),
        buffers: vec![
            buffer(16, (0, 64), (64, 64)),
            buffer(8, (128, 16), (128, 16)),
        ],
        reduction_kind: reduction,
    };
    thunk_bytes(annotation, 39, &m.encode_to_vec())
}

#[test]
fn all_reduce_is_typed() {
    let plan = plan_of(vec![all_reduce_bytes("all-reduce.1", 1)]);
    let t = &plan.thunks[0];
    assert_eq!(t.kind_name(), "all_reduce");
    assert_eq!(t.info.profile_annotation, "all-reduce.1");
    let ThunkKind::Collective(c) = &t.kind else {
        panic!("not a collective: {:?}", t.kind)
    };
    assert_eq!(c.op, CollectiveOp::AllReduce);
    assert_eq!(c.reduction, Some(ReductionKind::Sum));
    assert_eq!(c.group_mode, GroupMode::CrossPartition);
    assert_eq!(c.replica_groups, vec![vec![0, 1], vec![2, 3]]);
    assert_eq!(c.buffers.len(), 2);
    assert_eq!(c.buffers[0].element_count, 16);
    assert_eq!(c.buffers[0].element_type, Some(ElementType(F32)));
    assert_eq!(c.buffers[1].element_type, Some(ElementType(BF16)));
    assert_eq!(c.buffers[0].source.slice, s(0, 64));
    assert_eq!(c.buffers[0].destination.slice, s(64, 64));
    // Sources read; a separate destination is overwritten, an in-place one
    // (buffer 1) is read and written.
    assert_eq!(
        t.uses(),
        vec![
            (s(0, 64), Access::Read),
            (s(128, 16), Access::Read),
            (s(64, 64), Access::Overwrite),
            (s(128, 16), Access::Write),
        ]
    );
    assert_eq!(plan.kind_counts()["all_reduce"], 1);
    assert!(plan.unsupported().is_empty());
}

#[test]
fn every_collective_kind_decodes_and_counts() {
    let b = || vec![buffer(4, (0, 16), (512, 64))];
    let gather = pg::AllGatherThunkProto {
        collective_config: config(&[F32], &[&[0, 1, 2, 3]], 0),
        buffers: b(),
        collectives_mode: 2,
    };
    let scatter = pg::ReduceScatterThunkProto {
        collective_config: config(&[F32], &[], 3),
        buffers: b(),
        reduction_kind: 4,
    };
    let a2a = pg::AllToAllThunkProto {
        collective_config: config(&[F32], &[&[1, 0]], 0),
        buffers: b(),
        has_split_dimension: true,
        p2p_memcpy_enabled: false,
    };
    let permute = pg::CollectivePermuteThunkProto {
        buffers: b(),
        collective_config: config(&[F32], &[], 1),
        source_target_pairs: vec![
            px::SourceTarget {
                source: 0,
                target: 1,
            },
            px::SourceTarget {
                source: 1,
                target: 0,
            },
        ],
        connected_components_enabled: false,
        collectives_mode: 0,
    };
    let bcast = pg::CollectiveBroadcastThunkProto {
        buffers: vec![buffer(4, (0, 16), (512, 16)), buffer(1, (32, 4), (600, 4))],
        collective_config: config(&[F32, 4], &[&[0, 1]], 2),
        has_dynamic_root: true,
    };
    let rid = pg::ReplicaIdThunkProto {
        dest_buffer: Some(slice(1000, 4)),
    };
    let pid = pg::PartitionIdThunkProto {
        dest_buffer: Some(slice(1004, 4)),
    };
    let plan = plan_of(vec![
        thunk_bytes("ag", 38, &gather.encode_to_vec()),
        thunk_bytes("rs", 40, &scatter.encode_to_vec()),
        thunk_bytes("a2a", 41, &a2a.encode_to_vec()),
        thunk_bytes("cp", 43, &permute.encode_to_vec()),
        thunk_bytes("cb", 46, &bcast.encode_to_vec()),
        thunk_bytes("rid", 12, &rid.encode_to_vec()),
        thunk_bytes("pid", 14, &pid.encode_to_vec()),
    ]);
    let names: Vec<_> = plan.thunks.iter().map(|t| t.kind_name()).collect();
    assert_eq!(
        names,
        [
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "collective_permute",
            "collective_broadcast",
            "replica_id",
            "partition_id"
        ]
    );
    for n in &names {
        assert_eq!(plan.kind_counts()[*n], 1, "{n}");
    }
    let c = |i: usize| match &plan.thunks[i].kind {
        ThunkKind::Collective(c) => c.clone(),
        k => panic!("thunk {i}: {k:?}"),
    };
    assert_eq!(c(0).op, CollectiveOp::AllGather);
    assert_eq!(c(0).reduction, None);
    assert_eq!(c(0).collectives_mode, 2);
    assert_eq!(c(0).replica_groups, vec![vec![0, 1, 2, 3]]);
    assert_eq!(c(1).reduction, Some(ReductionKind::Max));
    assert_eq!(c(1).group_mode, GroupMode::FlattenedId);
    assert!(c(1).replica_groups.is_empty());
    assert!(c(2).has_split_dimension);
    assert_eq!(c(3).source_target_pairs, vec![(0, 1), (1, 0)]);
    assert_eq!(c(4).group_mode, GroupMode::CrossReplicaAndPartition);
    assert!(c(4).has_dynamic_root);
    // A permute may leave its destination partly unchanged: read + write.
    assert_eq!(
        plan.thunks[3].uses(),
        vec![(s(0, 16), Access::Read), (s(512, 64), Access::Write)]
    );
    // The dynamic-root buffer of a broadcast is only read.
    assert_eq!(
        plan.thunks[4].uses(),
        vec![
            (s(0, 16), Access::Read),
            (s(32, 4), Access::Read),
            (s(512, 16), Access::Overwrite)
        ]
    );
    assert_eq!(
        plan.thunks[5].kind,
        ThunkKind::ReplicaId { dest: s(1000, 4) }
    );
    assert_eq!(plan.thunks[5].writes(), vec![s(1000, 4)]);
    assert_eq!(plan.thunks[6].uses(), vec![(s(1004, 4), Access::Overwrite)]);
}

#[test]
fn async_collective_on_communication_stream() {
    let start = pg::AsyncStartThunkProto {
        async_execution_id: 5,
        thunks: Some(pg::ThunkSequenceProto {
            thunks: vec![all_reduce_bytes("all-reduce-start", 2)],
        }),
        execution_stream_id: Some(
            pg::async_start_thunk_proto::ExecutionStreamId::CommunicationStreamId(1),
        ),
    };
    let done = pg::AsyncDoneThunkProto {
        async_execution_id: 5,
    };
    let plan = plan_of(vec![
        thunk_bytes("all-reduce-start", 57, &start.encode_to_vec()),
        thunk_bytes("all-reduce-done", 58, &done.encode_to_vec()),
    ]);
    let ThunkKind::AsyncStart(a) = &plan.thunks[0].kind else {
        panic!("{:?}", plan.thunks[0].kind)
    };
    assert_eq!(a.stream, ExecutionStream::Communication(1));
    let ThunkKind::Collective(c) = &a.thunks[0].kind else {
        panic!("{:?}", a.thunks[0].kind)
    };
    assert_eq!(c.reduction, Some(ReductionKind::Product));
    // The async start reports its collective's uses.
    assert_eq!(plan.thunks[0].uses(), a.thunks[0].uses());
    assert_eq!(plan.kind_counts()["all_reduce"], 1);
    assert_eq!(plan.kind_counts()["async_start"], 1);
}

#[test]
fn malformed_collectives_are_errors() {
    let named = |e: DecodeError, what: &str| {
        let m = e.to_string();
        assert!(m.contains("bad-ar") && m.contains(what), "{m}");
    };
    // Not a message at all.
    named(
        decode_err(thunk_bytes("bad-ar", 39, &[0x12, 0xff, 0xff, 0xff, 0x0f])),
        "AllReduceThunkProto",
    );
    // No config.
    let m = pg::AllReduceThunkProto {
        collective_config: None,
        buffers: vec![],
        reduction_kind: 1,
    };
    named(
        decode_err(thunk_bytes("bad-ar", 39, &m.encode_to_vec())),
        "collective_config",
    );
    // Unspecified reduction.
    named(decode_err(all_reduce_bytes("bad-ar", 0)), "reduction");
    // Unknown group mode, negative replica id, negative element count,
    // missing and out-of-bounds buffers.
    let with = |f: &dyn Fn(&mut pg::AllReduceThunkProto)| {
        let mut m = pg::AllReduceThunkProto {
            collective_config: config(&[F32], &[&[0, 1]], 0),
            buffers: vec![buffer(4, (0, 16), (16, 16))],
            reduction_kind: 1,
        };
        f(&mut m);
        decode_err(thunk_bytes("bad-ar", 39, &m.encode_to_vec()))
    };
    named(
        with(&|m| m.collective_config.as_mut().unwrap().group_mode = 9),
        "group mode",
    );
    named(
        with(&|m| m.collective_config = config(&[F32], &[&[0, -1]], 0)),
        "replica id",
    );
    named(with(&|m| m.buffers[0].element_count = -4), "element count");
    named(
        with(&|m| m.buffers[0].destination_buffer = None),
        "destination",
    );
    named(
        with(&|m| m.buffers[0].source_buffer = shaped(1020, 16)),
        "out of bounds",
    );
    // Negative permute pair, dynamic root without buffers, replica id
    // without a destination.
    let p = pg::CollectivePermuteThunkProto {
        collective_config: config(&[], &[], 0),
        source_target_pairs: vec![px::SourceTarget {
            source: -1,
            target: 0,
        }],
        ..Default::default()
    };
    let e = decode_err(thunk_bytes("bad-cp", 43, &p.encode_to_vec()));
    assert!(e.to_string().contains("source-target"), "{e}");
    let b = pg::CollectiveBroadcastThunkProto {
        collective_config: config(&[], &[], 0),
        has_dynamic_root: true,
        ..Default::default()
    };
    let e = decode_err(thunk_bytes("bad-cb", 46, &b.encode_to_vec()));
    assert!(e.to_string().contains("dynamic_root"), "{e}");
    let e = decode_err(thunk_bytes("bad-rid", 12, &[]));
    assert!(
        e.to_string().contains("bad-rid") && e.to_string().contains("dest"),
        "{e}"
    );
}

#[test]
fn collectives_serialize_with_their_kind() {
    let plan = plan_of(vec![all_reduce_bytes("ar", 3)]);
    let v = serde_json::to_value(&plan.thunks[0]).expect("serializes");
    assert_eq!(v["kind"]["kind"], "collective");
    assert_eq!(v["kind"]["op"], "all_reduce");
    assert_eq!(v["kind"]["reduction"], "min");
}

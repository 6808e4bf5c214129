//! Collective, replica-id and partition-id thunks are typed by the decoder
//! but not executed by this single-device runtime: both the device-free
//! support check and `Executable::load` reject them, naming the kind and
//! the profile annotation (they must never load silently).

#[allow(dead_code)] // shared helpers; this file uses a few
mod common;

use common::*;
use xla_vmm::*;
use xla_vmm_device::Backend;
use xla_vmm_runtime::{ops::check_support, Executable, RuntimeError};

fn all_reduce(dst_offset: u64) -> CollectiveThunk {
    let shaped = |slice| ShapedSlice { slice, shape: None };
    CollectiveThunk {
        op: CollectiveOp::AllReduce,
        replica_groups: vec![vec![0, 1]],
        group_mode: GroupMode::CrossReplica,
        operand_element_types: vec![ElementType::F32],
        use_symmetric_buffer: false,
        reduction: Some(ReductionKind::Sum),
        buffers: vec![CollectiveBuffer {
            element_count: 4,
            element_type: Some(ElementType::F32),
            source: shaped(sl(0, 0, 16)),
            destination: shaped(sl(0, dst_offset, 16)),
            source_memory_space: 0,
            destination_memory_space: 0,
        }],
        source_target_pairs: vec![],
        has_split_dimension: false,
        has_dynamic_root: false,
        collectives_mode: 0,
    }
}

fn plan_with(t: Thunk) -> Plan {
    plan(
        vec![alloc(0, 64, AllocationRole::Temp)],
        vec![],
        vec![],
        vec![t],
    )
}

/// Every multi-device kind, alone and inside an async start on a
/// communication stream, with the kind name and annotation it must report.
fn cases() -> Vec<(Plan, &'static str, &'static str)> {
    let async_ar = thunk(
        "all-reduce-start.2",
        ThunkKind::AsyncStart(AsyncStartThunk {
            async_execution_id: 1,
            stream: ExecutionStream::Communication(1),
            thunks: vec![thunk(
                "all-reduce.2",
                ThunkKind::Collective(Box::new(all_reduce(32))),
            )],
        }),
    );
    vec![
        (
            plan_with(thunk(
                "all-reduce.1",
                ThunkKind::Collective(Box::new(all_reduce(16))),
            )),
            "all_reduce",
            "all-reduce.1",
        ),
        (plan_with(async_ar), "all_reduce", "all-reduce.2"),
        (
            plan_with(thunk(
                "replica-id.1",
                ThunkKind::ReplicaId { dest: sl(0, 48, 4) },
            )),
            "replica_id",
            "replica-id.1",
        ),
        (
            plan_with(thunk(
                "partition-id.1",
                ThunkKind::PartitionId { dest: sl(0, 52, 4) },
            )),
            "partition_id",
            "partition-id.1",
        ),
    ]
}

#[test]
fn support_check_rejects_multi_device_thunks() {
    for (p, kind, annotation) in cases() {
        let e = check_support(&p).expect_err(annotation);
        assert!(matches!(e, RuntimeError::Unsupported(_)), "{e}");
        let m = e.to_string();
        assert!(
            m.contains(&format!("{kind} thunk '{annotation}'")) && m.contains("single-device"),
            "{m}"
        );
    }
    let (p, ..) = cases().swap_remove(0);
    let m = check_support(&p).unwrap_err().to_string();
    assert!(m.contains("reduction sum"), "{m}");
}

#[test]
fn load_rejects_multi_device_thunks() {
    let b = backend();
    let stream = b.stream_create().unwrap();
    for (p, kind, annotation) in cases() {
        let e = Executable::load(b.clone(), p, None, &stream)
            .err()
            .expect("must fail")
            .to_string();
        assert!(
            e.contains(kind) && e.contains(annotation) && e.contains("single-device"),
            "{e}"
        );
    }
}

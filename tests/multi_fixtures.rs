//! The multi-device fixtures (integration/multi/fixtures, jax 0.11.2 on
//! 2 x H200) decode completely: every collective typed, no unsupported
//! thunk, the `collective_kernel` thunks resolved to all-reduces whose
//! reduction comes from the HLO module, counts as the fixture README lists.

use std::path::PathBuf;

use xla_vmm::{decode, CollectiveOp, ExecutionStream, GroupMode, Plan, ReductionKind, ThunkKind};

fn dir() -> PathBuf {
    xla_vmm::testdata::multi_fixtures_dir().expect("integration/multi/fixtures")
}

fn load(name: &str) -> Plan {
    let bytes = std::fs::read(dir().join(format!("{name}.pjrt"))).unwrap();
    decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn kernels(p: &Plan) -> Vec<(String, Option<ReductionKind>)> {
    let mut out = Vec::new();
    p.walk(&mut |t, _| {
        if let ThunkKind::Collective(c) = &t.kind {
            if c.from_collective_kernel {
                assert_eq!(c.op, CollectiveOp::AllReduce);
                out.push((t.info.profile_annotation.clone(), c.reduction));
            }
        }
    });
    out
}

#[test]
fn all_multi_device_fixtures_decode_without_unsupported_thunks() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".pjrt").map(str::to_string)
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 9, "{names:?}");
    for n in &names {
        let p = load(n);
        let bad: Vec<_> = p
            .unsupported()
            .iter()
            .map(|t| t.info.profile_annotation.clone())
            .collect();
        assert!(bad.is_empty(), "{n}: unsupported {bad:?}");
    }
}

#[test]
fn collective_kernels_take_their_reduction_from_the_hlo_module() {
    for name in ["coll_all_reduce", "coll_all_reduce_bf16"] {
        let p = load(name);
        assert_eq!(
            kernels(&p),
            vec![(
                "psum_invariant.7.0-fusion.1".to_string(),
                Some(ReductionKind::Sum)
            )],
            "{name}"
        );
        assert_eq!(p.kind_counts()["collective_kernel"], 1);
        assert!(!p.kind_counts().contains_key("all_reduce"));
        // It runs inside an async start on a computation stream.
        let mut on_computation = false;
        p.walk(&mut |t, _| {
            if let ThunkKind::AsyncStart(a) = &t.kind {
                on_computation |= matches!(a.stream, ExecutionStream::Computation(_))
                    && a.thunks
                        .iter()
                        .any(|c| c.kind_name() == "collective_kernel");
            }
        });
        assert!(on_computation, "{name}");
    }
    let small = kernels(&load("fsdp_llama_small_f32"));
    assert_eq!(small.len(), 1);
    assert_eq!(small[0].1, Some(ReductionKind::Sum));
    let scan = kernels(&load("fsdp_llama_scan_bf16"));
    assert_eq!(scan.len(), 2);
    assert!(scan.iter().all(|(_, r)| r.is_some()), "{scan:?}");
}

#[test]
fn fixture_counts_match_the_readme() {
    let counts = |n: &str| load(n).kind_counts();
    let c = counts("fsdp_llama_scan_bf16");
    for (k, v) in [
        ("all_gather", 7),
        ("reduce_scatter", 7),
        ("all_to_all", 1),
        ("collective_kernel", 2),
        ("async_start", 46),
        ("while", 2),
    ] {
        assert_eq!(c.get(k), Some(&v), "scan_bf16 {k}");
    }
    let c = counts("fsdp_llama_small_f32");
    for (k, v) in [
        ("all_gather", 3),
        ("reduce_scatter", 2),
        ("collective_kernel", 1),
    ] {
        assert_eq!(c.get(k), Some(&v), "small_f32 {k}");
    }
    for (n, kind) in [
        ("coll_all_gather", "all_gather"),
        ("coll_reduce_scatter", "reduce_scatter"),
        ("coll_permute", "collective_permute"),
        ("coll_all_to_all", "all_to_all"),
        ("coll_partition_id", "partition_id"),
    ] {
        assert_eq!(counts(n).get(kind), Some(&1), "{n}");
    }
}

#[test]
fn collective_modes_and_sizes_of_the_small_fixtures() {
    let only = |n: &str| {
        let p = load(n);
        let mut found = None;
        p.walk(&mut |t, _| {
            if let ThunkKind::Collective(c) = &t.kind {
                found = Some((**c).clone());
            }
        });
        found.unwrap_or_else(|| panic!("{n}: no collective"))
    };
    let rs = only("coll_reduce_scatter");
    assert_eq!(rs.group_mode, GroupMode::FlattenedId);
    assert_eq!(rs.reduction, Some(ReductionKind::Sum));
    // element_count is the source's: f32[1,1024] in, f32[1,512] out.
    assert_eq!(rs.buffers[0].element_count, 1024);
    assert_eq!(rs.buffers[0].destination.slice.size, 512 * 4);
    let ag = only("coll_all_gather");
    assert_eq!(ag.group_mode, GroupMode::FlattenedId);
    assert_eq!(
        ag.buffers[0].destination.slice.size,
        2 * ag.buffers[0].source.slice.size
    );
    let pm = only("coll_permute");
    assert_eq!(pm.group_mode, GroupMode::CrossPartition);
    let mut pairs = pm.source_target_pairs.clone();
    pairs.sort();
    assert_eq!(pairs, vec![(0, 1), (1, 0)]);
    let a2a = only("coll_all_to_all");
    assert_eq!(a2a.group_mode, GroupMode::CrossPartition);
    assert!(a2a.has_split_dimension);
}

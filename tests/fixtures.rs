//! The decoder on the real executables in ../shared/fixtures: counts match
//! the README table, and the decoded plans are internally consistent.

mod common;

use std::collections::BTreeMap;

use common::{expected_counts, fixture, FIXTURES};
use xla_vmm::{AllocationRole, Plan, ThunkKind};

fn decode(name: &str) -> Plan {
    xla_vmm::decode(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn counts_match_fixture_readme() {
    let expected = expected_counts();
    assert_eq!(
        expected.keys().collect::<Vec<_>>().len(),
        FIXTURES.len(),
        "README table rows: {:?}",
        expected.keys()
    );
    for name in FIXTURES {
        let plan = decode(name);
        let want = &expected[name];
        let mut roles = [0usize; 4];
        for a in &plan.allocations {
            let i = ["parameter", "constant", "output", "temp"]
                .iter()
                .position(|r| *r == a.role.name())
                .expect("known role");
            roles[i] += 1;
        }
        assert_eq!(
            plan.allocations.len(),
            want.allocations,
            "{name} allocations"
        );
        assert_eq!(roles, want.roles, "{name} roles (param/const/output/temp)");
        assert_eq!(plan.thunks.len(), want.top_level, "{name} top-level thunks");
        assert_eq!(plan.kind_counts(), want.kinds, "{name} kinds");
        assert!(
            plan.unsupported().is_empty(),
            "{name} has unsupported thunks"
        );
    }
}

#[test]
fn ifrt_wrapped_bytes_decode_to_the_same_plan() {
    let bytes = fixture("loop");
    let header = b"ifrt header metadata".to_vec();
    let mut wrapped = vec![header.len() as u8];
    wrapped.extend_from_slice(&header);
    wrapped.extend_from_slice(&bytes);
    assert_eq!(xla_vmm::decode(&wrapped).unwrap(), decode("loop"));
}

#[test]
fn every_use_is_inside_its_allocation() {
    for name in FIXTURES {
        let plan = decode(name);
        let mut uses = 0;
        for t in &plan.thunks {
            for (s, _) in t.uses() {
                let a = &plan.allocations[s.allocation];
                assert!(
                    s.end() <= a.size,
                    "{name}: {s:?} beyond allocation {}",
                    a.size
                );
                uses += 1;
            }
        }
        assert!(uses > 0, "{name}: no slice uses found");
    }
}

#[test]
fn parameters_and_outputs_are_consistent() {
    for name in FIXTURES {
        let plan = decode(name);
        // Each entry parameter number appears on exactly one allocation
        // (jax passes arrays, never tuples).
        let mut numbers: Vec<u64> = plan
            .allocations
            .iter()
            .filter_map(|a| match &a.role {
                AllocationRole::Parameter { number, .. } => Some(*number),
                _ => None,
            })
            .collect();
        numbers.sort();
        let n = plan.program_shape.parameters.len() as u64;
        assert_eq!(
            numbers,
            (0..n).collect::<Vec<_>>(),
            "{name} parameter numbers"
        );
        // An output that aliases a parameter lives in that parameter's
        // allocation, which is marked aliased and live-out.
        for o in &plan.outputs {
            let a = &plan.allocations[o.allocation];
            if let Some(alias) = &o.alias {
                match &a.role {
                    AllocationRole::Parameter {
                        number,
                        aliased_with_output,
                        ..
                    } => {
                        assert_eq!(*number as i64, alias.parameter_number, "{name}");
                        assert!(*aliased_with_output && a.maybe_live_out, "{name}");
                    }
                    other => panic!("{name}: aliased output in a {} allocation", other.name()),
                }
            }
        }
    }
    // mlp_adam_donated donates its state: some outputs alias parameters.
    let plan = decode("mlp_adam_donated");
    assert!(plan.outputs.iter().any(|o| o.alias.is_some()));
}

#[test]
fn loop_fixture_has_a_counted_while_and_kernel_code() {
    let plan = decode("loop");
    let w = plan
        .thunks
        .iter()
        .find_map(|t| match &t.kind {
            ThunkKind::While(w) => Some(w),
            _ => None,
        })
        .expect("a while thunk");
    assert_eq!(w.trip_count, Some(8), "fori_loop of 8 steps");
    assert!(!w.condition.is_empty() && !w.body.is_empty());
    // The condition writes its predicate (1 byte) into the condition slice.
    assert_eq!(w.condition_result.size, 1);
    assert!(w
        .condition
        .iter()
        .any(|t| t.writes().iter().any(|s| s.overlaps(&w.condition_result))));
    // Every custom kernel carries its cubin (an ELF file).
    let bins = plan.custom_kernel_binaries();
    assert_eq!(bins.len(), 3);
    for (name, cubin) in bins {
        assert!(cubin.starts_with(b"\x7fELF"), "{name} is not an ELF cubin");
    }
    // The constant allocation is named after its HLO constant.
    assert!(plan.allocations.iter().any(|a| matches!(&a.role,
        AllocationRole::Constant { symbol_name, .. } if symbol_name.contains("constant"))));
}

#[test]
fn dynamic_slice_fusions_use_their_own_allocation_namespace() {
    let plan = decode("llama_scan_bf16");
    let mut fusions = 0;
    plan.walk(&mut |t, _| {
        if let ThunkKind::DynamicSliceFusion(d) = &t.kind {
            fusions += 1;
            assert!(!d.embedded.is_empty());
            for e in &d.embedded {
                e.walk(0, &mut |inner, _| {
                    for (s, _) in inner.own_uses() {
                        let a = &d.embedded_allocations[s.allocation];
                        assert!(s.end() <= a.size);
                    }
                });
            }
            // The fusion's own uses are its real parameter/result buffers.
            let uses = t.own_uses();
            assert_eq!(uses.len(), d.parameters.len() + d.results.len());
        }
    });
    assert_eq!(fusions, 28);
}

#[test]
fn async_starts_and_dones_pair_up() {
    let plan = decode("llama_scan_bf16");
    let mut starts = BTreeMap::new();
    let mut dones = BTreeMap::new();
    plan.walk(&mut |t, _| match &t.kind {
        ThunkKind::AsyncStart(a) => *starts.entry(a.async_execution_id).or_insert(0) += 1,
        ThunkKind::AsyncDone { async_execution_id } => {
            *dones.entry(*async_execution_id).or_insert(0) += 1
        }
        _ => {}
    });
    assert!(!starts.is_empty());
    assert_eq!(starts, dones);
}

#[test]
fn cublas_lt_matmuls_have_configs_and_valid_slices() {
    let plan = decode("llama_sgd_f32");
    let mut n = 0;
    plan.walk(&mut |t, _| {
        if let ThunkKind::CublasLtMatmul(m) = &t.kind {
            n += 1;
            let g = m.gemm_config.as_ref().expect("gemm config");
            assert!(g.lhs_layout.num_rows > 0 && g.rhs_layout.num_cols > 0);
            assert!(m.d.slice.size > 0);
            assert!(t.writes().contains(&m.d.slice));
        }
    });
    assert_eq!(n, 46);
}

#[test]
fn plans_serialize_to_json() {
    for name in FIXTURES {
        let plan = decode(name);
        let v = serde_json::to_value(&plan).expect("serialize");
        assert_eq!(
            v["allocations"].as_array().map(Vec::len),
            Some(plan.allocations.len())
        );
        assert_eq!(
            v["thunks"].as_array().map(Vec::len),
            Some(plan.thunks.len())
        );
    }
}

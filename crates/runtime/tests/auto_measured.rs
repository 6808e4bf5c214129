//! Auto with measured inputs on the host backend: the in-process probe feeds
//! the costs (the host backend's emulated ones: `XLA_VMM_PROBE=1`, set for
//! this whole test binary), the copy kernel's per-direction cost replaces
//! the launch cost, the plan is re-made exactly once after warm-up from the
//! observed churn, the data stays bit-identical to eager across the
//! transition, and the shadow cap holds.

mod common;

use std::sync::Arc;

use common::*;
use xla_vmm::*;
use xla_vmm_device::vmm::Buffer;
use xla_vmm_device::{Backend, HostBackend, VmmAllocator, VmmConfig};
use xla_vmm_policy::tracker::DEFAULT_REPLAN_AFTER_STEPS;
use xla_vmm_policy::Threshold;
use xla_vmm_runtime::binding::{measured_costs, KERNEL_COPY_DIRECTION_US};
use xla_vmm_runtime::copykernel::register_host_copy_kernel;
use xla_vmm_runtime::{BindingConfig, BindingStats, Executable, Mode, Probe};

const N: usize = 4;
const BIG: u64 = 4 << 20;

/// `w += 1` (param 0, donated); `y = 2·a` (param 1, 16 B, a new buffer
/// every step); `z = c` (param 2, 16 B, the same buffer every step, but not
/// donated: prior churn 1); `t = d[last 16 B]` (param 3, 4 MiB, a new
/// buffer every step).
fn mix_plan() -> Plan {
    let v = (N * 4) as u64;
    let mut p = plan(
        vec![
            alloc(0, v, param(0, true)),
            alloc(1, v, param(1, false)),
            alloc(2, v, param(2, false)),
            alloc(3, BIG, param(3, false)),
            alloc(4, v, AllocationRole::Output { outputs: vec![] }),
            alloc(5, v, AllocationRole::Output { outputs: vec![] }),
            alloc(6, v, AllocationRole::Output { outputs: vec![] }),
        ],
        vec![f32s(N), f32s(N), f32s(N), f32s((BIG / 4) as usize)],
        vec![(0, f32s(N)), (4, f32s(N)), (5, f32s(N)), (6, f32s(N))],
        vec![thunk(
            "seq",
            ThunkKind::Sequential {
                thunks: vec![
                    kernel("inc", vec![(sl(0, 0, v), true)], None, N as u64),
                    kernel(
                        "scale2",
                        vec![(sl(1, 0, v), false), (sl(4, 0, v), true)],
                        Some(N as u32),
                        1,
                    ),
                    copy("c", sl(2, 0, v), sl(5, 0, v)),
                    copy("d", sl(3, BIG - v, v), sl(6, 0, v)),
                ],
            },
        )],
    );
    p.module_name = "mix".into();
    p
}

fn floats(d: &[u8]) -> Vec<f32> {
    d.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Every output of every step, and the stats after each step.
type Run = (Vec<Vec<Vec<f32>>>, Vec<Option<BindingStats>>);

/// `steps` steps in `mode`: fresh `a` and `d` buffers every step (all kept
/// alive, so each is a new allocation), the same `c` and `w`.
fn run_loop(b: &Arc<HostBackend>, mode: Mode, threshold: Option<u64>, steps: usize) -> Run {
    let alloc = VmmAllocator::new(
        b.clone(),
        VmmConfig {
            small_threshold: 0,
            small_min: 16,
        },
    )
    .unwrap();
    let s = b.stream_create().unwrap();
    let mut exe = Executable::load(b.clone(), mix_plan(), None, &s).unwrap();
    if let Some(t) = threshold {
        exe.set_binding_config(BindingConfig {
            threshold: Threshold::from(t),
            costs: None,
            immutable_buffers: false,
            probe: Probe::Always,
            ..Default::default()
        })
        .unwrap();
    }
    let v = (N * 4) as u64;
    let w = alloc.alloc(v).unwrap();
    b.write_sync(w.ptr(), &bytes(&[0.5; N]), &s).unwrap();
    let c = alloc.alloc(v).unwrap();
    let mut kept: Vec<Buffer<HostBackend>> = Vec::new();
    let (mut outs, mut stats) = (Vec::new(), Vec::new());
    for k in 0..steps {
        let kf = k as f32;
        let a = alloc.alloc(v).unwrap();
        b.write_sync(a.ptr(), &bytes(&[kf, kf + 1.0, -kf, 7.0]), &s)
            .unwrap();
        // c keeps its allocation; its content changes every step.
        b.write_sync(c.ptr(), &bytes(&[kf * 3.0; N]), &s).unwrap();
        let d = alloc.alloc(BIG).unwrap();
        b.write_sync(d.ptr().offset(BIG - v), &bytes(&[kf + 0.25; N]), &s)
            .unwrap();
        exe.bind_buffer(0, &w).unwrap();
        exe.bind_buffer(1, &a).unwrap();
        exe.bind_buffer(2, &c).unwrap();
        exe.bind_buffer(3, &d).unwrap();
        let o = exe.run(&s, mode).unwrap();
        b.stream_synchronize(&s).unwrap();
        let mut step = Vec::new();
        for out in &o {
            let mut buf = vec![0u8; out.bytes as usize];
            b.read_sync(&mut buf, out.ptr, &s).unwrap();
            step.push(floats(&buf));
        }
        outs.push(step);
        stats.push(exe.stats().cloned());
        kept.push(a);
        kept.push(d);
    }
    drop(exe);
    for x in kept {
        alloc.free(x, &s).unwrap();
    }
    alloc.free(w, &s).unwrap();
    alloc.free(c, &s).unwrap();
    b.stream_synchronize(&s).unwrap();
    drop(alloc);
    b.stream_destroy(s).unwrap();
    (outs, stats)
}

const STEPS: usize = 14;

#[test]
fn probe_feeds_auto_and_replan_keeps_results_identical() {
    let b = backend();
    let (reference, _) = run_loop(&b, Mode::Eager, None, STEPS);
    assert_eq!(reference[3][1], vec![6.0, 8.0, -6.0, 14.0], "y = 2a");
    let (got, stats) = run_loop(&b, Mode::Graph, Some(1), STEPS);
    assert_eq!(got, reference, "bit-identical to eager across the re-plan");

    let warm = DEFAULT_REPLAN_AFTER_STEPS as usize;
    let st: Vec<BindingStats> = stats.into_iter().map(Option::unwrap).collect();
    // The probe's numbers (cached per device: the same on a second ask).
    let q = measured_costs(&*b, Probe::Always).expect("probe on the host backend");
    let first = &st[0];
    assert_eq!(first.costs_source, "probe", "{first:?}");
    assert_eq!(first.remap_us, q.remap_us);
    assert_eq!(first.copy_gbps, q.copy_bw_bytes_per_s / 1e9);
    assert_eq!(first.copy_path, "batch");
    assert_eq!(first.copy_launch_us, q.copy_launch_us);
    assert!(!first.replanned);
    // The first plan: w skip (donated), the others by their priors.
    assert_eq!(first.plan_skip, 1, "{first:?}");
    // Re-planned at the warm-up's end, exactly once, then unchanged.
    for (k, s) in st.iter().enumerate() {
        assert_eq!(s.replanned, k >= warm, "step {k}: {s:?}");
        assert!(s.shadow_bytes <= s.shadow_cap_bytes, "step {k}: {s:?}");
        // Both reservations are recorded at initialize, before step 0.
        assert_eq!(
            s.captures, 2,
            "step {k}: recorded at initialize, never re-captured"
        );
    }
    let last = &st[STEPS - 1];
    for s in &st[warm..] {
        assert_eq!(
            (s.plan_skip, s.plan_remap, s.plan_copy, s.threshold_bytes),
            (
                last.plan_skip,
                last.plan_remap,
                last.plan_copy,
                last.threshold_bytes
            )
        );
    }
    // c never changed allocation: skip after the re-plan, like w.
    assert_eq!(last.plan_skip, 2, "{last:?}");
    assert_eq!(last.plan_skip + last.plan_remap + last.plan_copy, 4);
    // The host backend finishes every step before `run` returns: the GPU
    // was idle whenever the host came back.
    assert_eq!(last.bound, "host", "{last:?}");
    assert!(last.line().contains("bound=host replanned=true"));
    assert_eq!(last.counters.fallbacks, 0);
    let o = b.outstanding();
    assert_eq!(o.mappings, 0, "{o:?}");
    assert_eq!(o.events, 0, "timing events destroyed: {o:?}");
}

#[test]
fn kernel_path_charges_the_kernel_node_per_direction() {
    let b = backend();
    register_host_copy_kernel(&b);
    let (reference, _) = run_loop(&b, Mode::Eager, None, 8);
    let (got, stats) = run_loop(&b, Mode::Graph, Some(1), 8);
    assert_eq!(got, reference);
    let st = stats.last().cloned().flatten().unwrap();
    assert_eq!(st.copy_path, "kernel");
    assert_eq!(st.costs_source, "probe");
    assert_eq!(st.copy_launch_us, KERNEL_COPY_DIRECTION_US);
    assert!(st.replanned);
}

#[test]
fn fixed_thresholds_neither_warm_up_nor_replan() {
    let b = backend();
    let (reference, _) = run_loop(&b, Mode::Eager, None, 8);
    for t in [0u64, 4096] {
        let (got, stats) = run_loop(&b, Mode::Graph, Some(t), 8);
        assert_eq!(got, reference, "threshold {t}");
        let st = stats.last().cloned().flatten().unwrap();
        assert!(!st.replanned, "threshold {t}");
        assert_eq!(st.bound, "unknown", "threshold {t}");
        assert_eq!(st.plan_skip, 1, "only the donated w: threshold {t}");
    }
}

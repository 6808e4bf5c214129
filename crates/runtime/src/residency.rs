//! A decoded program as the residency planner sees it
//! ([`xla_vmm_policy::residency`]): its buffers, and its thunks in the order
//! they run with the slices each reads and writes. A buffer is an
//! allocation, or a segment of one: the byte ranges its slices cover, joined
//! where they overlap (XLA packs every temporary of a program into one
//! allocation; its regions are different values at different times, and
//! each is planned on its own). Loops with a
//! known trip count are unrolled (a scan over layers is one thunk sequence
//! per layer); a loop without one counts once (its condition and body), a
//! conditional's branches all count (what any of them touches may be
//! needed), async work runs where it starts. GEMMs carry their arithmetic
//! (`2·m·n·k` per batch); other kernels none (their time is their memory
//! traffic's: for Triton GEMM fusions an underestimate, which only makes
//! prefetches start earlier).

use xla_vmm::{AllocationRole, GemmConfig, Plan, Slice, Thunk, ThunkKind};
use xla_vmm_policy::residency::{
    gemm_reuse, plan_residency, Buffer, Home, Rates, ResidencyInput, ResidencyPlan, ThunkStep, Use,
};

use crate::error::{Result, RuntimeError};

/// Most thunk executions a step is unrolled into (a loop of more is cut
/// there and said in the input's last thunk name).
pub const MAX_STEPS: usize = 200_000;

/// `2·m·n·k·batch` of a GEMM (0 when its layouts say nothing).
fn gemm_flops(c: &GemmConfig) -> f64 {
    let out = &c.output_layout;
    let lhs = &c.lhs_layout;
    // The contracted dimension of lhs: its columns unless transposed.
    let k = if lhs.transpose == 0 {
        lhs.num_cols
    } else {
        lhs.num_rows
    };
    let batch = out.batch_size.max(1);
    let v = 2.0 * out.num_rows.max(0) as f64 * out.num_cols.max(0) as f64 * k.max(0) as f64;
    v * batch as f64
}

fn flops(t: &Thunk) -> f64 {
    match &t.kind {
        ThunkKind::CublasLtMatmul(m) => m.gemm_config.as_ref().map_or(0.0, gemm_flops),
        ThunkKind::Gemm(g) => gemm_flops(&g.config),
        _ => 0.0,
    }
}

pub(crate) fn flatten(
    thunks: &[Thunk],
    segs: &[(usize, u64, u64)],
    out: &mut Vec<ThunkStep>,
    cut: &mut bool,
) {
    for t in thunks {
        if out.len() >= MAX_STEPS {
            *cut = true;
            return;
        }
        match &t.kind {
            ThunkKind::Sequential { thunks } => flatten(thunks, segs, out, cut),
            ThunkKind::While(w) => match w.trip_count {
                Some(n) if n > 0 => {
                    for _ in 0..n {
                        flatten(&w.body, segs, out, cut);
                        if *cut {
                            return;
                        }
                    }
                }
                _ => {
                    flatten(&w.condition, segs, out, cut);
                    flatten(&w.body, segs, out, cut);
                }
            },
            ThunkKind::Conditional(c) => {
                for b in &c.branches {
                    flatten(b, segs, out, cut);
                }
            }
            ThunkKind::AsyncStart(a) => flatten(&a.thunks, segs, out, cut),
            // One thunk: its real slices (the embedded thunks address
            // windows of synthetic allocations), the embedded GEMMs' work.
            ThunkKind::DynamicSliceFusion(d) => {
                out.push(leaf(t, d.embedded.iter().map(flops).sum(), segs));
            }
            _ => out.push(leaf(t, flops(t), segs)),
        }
    }
}

/// (allocation, start, end) of each segment, sorted.
pub(crate) type Segments = Vec<(usize, u64, u64)>;

/// The segments of every allocation: (allocation, start, end) sorted, from
/// the slices the thunks use (an allocation no thunk uses is one segment).
pub(crate) fn segments(plan: &Plan) -> Segments {
    let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); plan.allocations.len()];
    plan.walk(&mut |t, _| {
        // Embedded thunks address synthetic allocations: their parent's own
        // uses cover the real ones.
        for (s, _) in t.own_uses() {
            if let Some(r) = ranges.get_mut(s.allocation) {
                if s.size > 0 {
                    r.push((s.offset, s.offset.saturating_add(s.size)));
                }
            }
        }
    });
    let mut out = Vec::new();
    for (a, mut r) in ranges.into_iter().enumerate() {
        let size = plan.allocations[a].size;
        if r.is_empty() {
            out.push((a, 0, size));
            continue;
        }
        r.sort_unstable();
        let mut cur = r[0];
        for &(s, e) in &r[1..] {
            if s < cur.1 {
                cur.1 = cur.1.max(e);
            } else {
                out.push((a, cur.0, cur.1));
                cur = (s, e);
            }
        }
        out.push((a, cur.0, cur.1));
    }
    out
}

/// A GEMM's operands and how often it reads each when it lies in host
/// memory ([`gemm_reuse`]): cuBLAS GEMMs from their output's rows and
/// columns; XLA's Triton GEMM fusions (`gemm_fusion*`) from their two
/// largest inputs and their output, taken as 2-byte elements
/// (`|A| = 2mk`, `|B| = 2kn`, `|C| = 2mn`: `n = sqrt(|B||C| / 2|A|)`).
fn operand_reuse(t: &Thunk) -> Vec<(Slice, f64)> {
    let dims = |c: &GemmConfig| {
        let o = &c.output_layout;
        (o.num_rows.max(0) as f64, o.num_cols.max(0) as f64)
    };
    let pair = |a: Slice, b: Slice, (m, n): (f64, f64)| {
        vec![(a, gemm_reuse(a.size, n)), (b, gemm_reuse(b.size, m))]
    };
    match &t.kind {
        ThunkKind::CublasLtMatmul(g) => g
            .gemm_config
            .as_ref()
            .map(|c| pair(g.a.slice, g.b.slice, dims(c)))
            .unwrap_or_default(),
        ThunkKind::Gemm(g) => pair(g.lhs, g.rhs, dims(&g.config)),
        _ if t.info.profile_annotation.starts_with("gemm_fusion") => {
            let uses = t.own_uses();
            let mut reads: Vec<Slice> = uses.iter().filter(|u| u.1.reads()).map(|u| u.0).collect();
            reads.sort_by_key(|s| std::cmp::Reverse(s.size));
            let out = uses.iter().filter(|u| u.1.writes()).map(|u| u.0.size).max();
            match (reads.as_slice(), out) {
                ([a, b, ..], Some(c)) if a.size > 0 && b.size > 0 => {
                    let other = |x: &Slice, y: &Slice| {
                        (y.size as f64 * c as f64 / (2.0 * x.size as f64)).sqrt()
                    };
                    vec![
                        (*a, gemm_reuse(a.size, other(a, b))),
                        (*b, gemm_reuse(b.size, other(b, a))),
                    ]
                }
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

fn leaf(t: &Thunk, flops: f64, segs: &[(usize, u64, u64)]) -> ThunkStep {
    // A slice lies in one segment (segments join overlapping slices).
    let seg = |a: usize, off: u64| {
        segs.partition_point(|&(sa, ss, _)| (sa, ss) <= (a, off))
            .checked_sub(1)
            .filter(|&i| segs[i].0 == a)
    };
    let reuse = operand_reuse(t);
    ThunkStep {
        name: format!("{} '{}'", t.kind_name(), t.info.profile_annotation),
        uses: t
            .own_uses()
            .into_iter()
            .filter(|(s, _)| s.size > 0)
            .filter_map(|(s, a)| {
                Some(Use {
                    buffer: seg(s.allocation, s.offset)?,
                    bytes: s.size,
                    read: a.reads(),
                    write: a.writes(),
                    reuse: reuse.iter().find(|x| x.0 == s).map_or(1.0, |x| x.1),
                })
            })
            .collect(),
        flops,
    }
}

/// The program's buffers (one per segment of [`segments`]), anywhere;
/// an allocation index that is not its position is an error.
pub(crate) fn buffers(plan: &Plan, segs: &Segments) -> Result<Vec<Buffer>> {
    for (i, a) in plan.allocations.iter().enumerate() {
        if a.index != i {
            return Err(RuntimeError::invalid(format!(
                "allocation {i} has index {}",
                a.index
            )));
        }
    }
    Ok(segs
        .iter()
        .map(|&(a, start, end)| {
            let alloc = &plan.allocations[a];
            let (name, persistent) = match &alloc.role {
                AllocationRole::Parameter { number, .. } => (format!("parameter {number}"), true),
                AllocationRole::Constant { .. } => ("constant".to_string(), true),
                AllocationRole::Output { .. } => ("output".to_string(), true),
                AllocationRole::Temp => ("temp".to_string(), false),
            };
            Buffer {
                id: a,
                offset: start,
                name,
                bytes: end - start,
                persistent,
                home: Home::Movable,
            }
        })
        .collect())
}

/// The planner's input for `plan` under `budget_bytes` with `rates`.
pub fn residency_input(plan: &Plan, budget_bytes: u64, rates: Rates) -> Result<ResidencyInput> {
    let segs = segments(plan);
    let buffers = buffers(plan, &segs)?;
    let mut steps = Vec::new();
    let mut cut = false;
    flatten(&plan.thunks, &segs, &mut steps, &mut cut);
    if cut {
        tracing::warn!(
            limit = MAX_STEPS,
            "residency: the program unrolls into more thunk executions than this; planned on the first"
        );
    }
    Ok(ResidencyInput {
        buffers,
        steps,
        rates,
        budget_bytes,
    })
}

/// The residency plan of `plan` under `budget_bytes`.
pub fn plan_for(plan: &Plan, budget_bytes: u64, rates: Rates) -> Result<ResidencyPlan> {
    let input = residency_input(plan, budget_bytes, rates)?;
    plan_residency(&input).map_err(|e| RuntimeError::invalid(format!("residency: {e}")))
}

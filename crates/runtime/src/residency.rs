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

use xla_vmm::{Access, AllocationRole, GemmConfig, Plan, Slice, Thunk, ThunkKind};
use xla_vmm_policy::residency::{gemm_reuse, Buffer, Home, Rates, ResidencyInput, ThunkStep, Use};

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
pub(crate) fn operand_reuse(t: &Thunk) -> Vec<(Slice, f64)> {
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

/// Bytes one run of `t` touches in each of its own slices:
/// [`Thunk::own_uses_touched`] (a dynamic-slice fusion's windows), and for
/// XLA's dynamic-slice and in-place dynamic-update-slice kernels (their
/// fusion named so; XLA launches them one thread per element of the window)
/// the window of their stacked operand, at most the launch's threads times
/// its element size: the slice a scan reads out of a stacked buffer, the
/// update it writes into one, not the whole buffer.
pub(crate) fn touched_uses(t: &Thunk) -> Vec<(Slice, Access, u64)> {
    once_per_slice(windowed_uses(t))
}

/// A slice a thunk takes more than once is touched once: XLA passes an
/// operand a fusion updates in place both as its input and as the output
/// aliased with it (an optimizer's update of a weight and its moments), and
/// the kernel reads and writes each element once, not once per argument.
fn once_per_slice(uses: Vec<(Slice, Access, u64)>) -> Vec<(Slice, Access, u64)> {
    let mut out: Vec<(Slice, Access, u64)> = Vec::with_capacity(uses.len());
    for (s, a, bytes) in uses {
        match out.iter_mut().find(|u| u.0 == s) {
            Some(u) => {
                u.1 = match (u.1, a) {
                    (Access::Read, Access::Read) => Access::Read,
                    (Access::Overwrite, Access::Overwrite) => Access::Overwrite,
                    _ => Access::Write,
                };
                u.2 = u.2.max(bytes);
            }
            None => out.push((s, a, bytes)),
        }
    }
    out
}

fn windowed_uses(t: &Thunk) -> Vec<(Slice, Access, u64)> {
    let mut uses = t.own_uses_touched();
    let (args, launch) = match &t.kind {
        ThunkKind::CustomKernel(k) => (&k.args, &k.launch),
        ThunkKind::Kernel(k) => (&k.args, &k.launch),
        _ => return uses,
    };
    let name = &t.info.profile_annotation;
    let update = name.contains("dynamic_update_slice");
    if !update && !name.contains("dynamic_slice") {
        return uses;
    }
    let threads = launch
        .blocks
        .volume()
        .saturating_mul(launch.threads.volume());
    // A kernel's uses are its arguments, in order.
    for ((_, access, bytes), arg) in uses.iter_mut().zip(args) {
        let stacked = if update {
            *access == Access::Write
        } else {
            !access.writes()
        };
        let bits = arg.shape.as_ref().and_then(|s| s.element_type.bit_width());
        if let (true, Some(bits)) = (stacked, bits) {
            let window = threads.saturating_mul(u64::from(bits)).div_ceil(8);
            *bytes = (*bytes).min(window.max(1));
        }
    }
    uses
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
        uses: touched_uses(t)
            .into_iter()
            .filter(|(s, _, _)| s.size > 0)
            .filter_map(|(s, a, bytes)| {
                Some(Use {
                    buffer: seg(s.allocation, s.offset)?,
                    bytes,
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

/// One use of a value of a temporary allocation by a unit: (value, bytes,
/// read, write, reuse).
pub(crate) type ValueUse = (usize, u64, bool, bool, f64);

/// The values of a program's temporary allocations, unit by unit. XLA packs
/// the step's temporaries into one allocation whose slices hold different
/// values over the step (buffer assignment gives each logical buffer one
/// slice for its whole life, and two whose slices overlap are never live at
/// once), so its byte ranges joined over the whole step (its [`segments`])
/// are one large buffer for staging. By value instead:
/// - a unit's slices of a temporary allocation that overlap are one range;
/// - a range the unit only reads joins the live values it overlaps into one;
/// - a range the unit writes starts a new value: the live values it
///   overlaps are dead (their bytes are overwritten; a kernel's output
///   argument is marked read and written, so the read does not count here;
///   buffer assignment places a new buffer over dead ones only), unless it is
///   exactly one of them and read (an update in place), or overlaps a value
///   the unit reads: then it joins them.
///
/// Live values are disjoint, so a unit's values can each be staged on their
/// own. If a unit reads bytes no live value holds (the rules above do not
/// fit how the program uses the allocation), the allocation is planned by
/// its segments instead ([`TempValues::finish`] says which).
#[derive(Default)]
pub(crate) struct TempValues {
    /// Union-find parent of each value; a root's range is the value's.
    parent: Vec<usize>,
    range: Vec<(usize, u64, u64)>,
    /// Live values (roots) of each allocation.
    live: Vec<Vec<usize>>,
    /// Allocations the rules do not fit.
    unfit: Vec<bool>,
    /// Per unit, its values' uses (values as created; resolved at the end).
    units: Vec<Vec<ValueUse>>,
}

impl TempValues {
    pub(crate) fn new(allocations: usize) -> Self {
        TempValues {
            live: vec![Vec::new(); allocations],
            unfit: vec![false; allocations],
            ..Default::default()
        }
    }

    fn find(&mut self, mut v: usize) -> usize {
        while self.parent[v] != v {
            self.parent[v] = self.parent[self.parent[v]];
            v = self.parent[v];
        }
        v
    }

    /// The next unit's slices of temporary allocations: (slice, read,
    /// write, reuse). Its reads first (they join what they read), then its
    /// writes (a write over a value this unit reads joins it too).
    pub(crate) fn unit(&mut self, slices: &[(Slice, bool, bool, f64)]) {
        let mut uses = Vec::new();
        let mut read_here = Vec::new();
        for writes in [false, true] {
            for (a, lo, hi, read, write, reuse, bytes) in ranges(slices, writes) {
                let Some(live) = self.live.get(a).cloned() else {
                    continue;
                };
                let over: Vec<usize> = live
                    .into_iter()
                    .filter(|&v| {
                        let (_, vl, vh) = self.range[v];
                        vl < hi && lo < vh
                    })
                    .collect();
                if !write && !self.covered(&over, lo, hi) {
                    self.unfit[a] = true;
                }
                // Exactly a live value and read: an update in place. Over a
                // value this unit reads: part of the same computation.
                let joins = !write
                    || over.iter().any(|&v| {
                        let (_, vl, vh) = self.range[v];
                        read_here.contains(&v) || (read && vl == lo && vh == hi)
                    });
                let id = self.parent.len();
                self.parent.push(id);
                let (mut nl, mut nh) = (lo, hi);
                if joins {
                    for &v in &over {
                        self.parent[v] = id;
                        nl = nl.min(self.range[v].1);
                        nh = nh.max(self.range[v].2);
                    }
                }
                // Otherwise the values it overlaps are dead: written over.
                self.range.push((a, nl, nh));
                self.live[a].retain(|v| !over.contains(v));
                self.live[a].push(id);
                if !write {
                    read_here.push(id);
                }
                uses.push((id, bytes, read, write, reuse));
            }
        }
        self.units.push(uses);
    }

    /// Live values `over` hold every byte of `[lo, hi)`.
    fn covered(&self, over: &[usize], lo: u64, hi: u64) -> bool {
        let mut spans: Vec<(u64, u64)> = over
            .iter()
            .map(|&v| (self.range[v].1, self.range[v].2))
            .collect();
        spans.sort_unstable();
        let mut at = lo;
        for (vl, vh) in spans {
            if vl > at {
                break;
            }
            at = at.max(vh);
        }
        at >= hi
    }

    /// The values, (allocation, start, end) each, each unit's uses of them
    /// (indices into the values), and per allocation whether the rules do
    /// not fit it (its values are then not to be used).
    #[allow(clippy::type_complexity)]
    pub(crate) fn finish(mut self) -> (Vec<(usize, u64, u64)>, Vec<Vec<ValueUse>>, Vec<bool>) {
        let n = self.parent.len();
        let mut index = vec![usize::MAX; n];
        let mut values = Vec::new();
        for v in 0..n {
            let root = self.find(v);
            if index[root] == usize::MAX && !self.unfit[self.range[root].0] {
                index[root] = values.len();
                values.push(self.range[root]);
            }
        }
        let units = std::mem::take(&mut self.units);
        let units = units
            .into_iter()
            .map(|us| {
                us.into_iter()
                    .filter_map(|(v, b, r, w, x)| {
                        let i = index[self.find(v)];
                        (i != usize::MAX).then_some((i, b, r, w, x))
                    })
                    .collect()
            })
            .collect();
        (values, units, self.unfit)
    }
}

/// A unit's ranges of temporary allocations, overlapping slices joined:
/// those it writes (`writes`), or those it only reads. (allocation, start,
/// end, read, write, reuse, largest slice bytes).
#[allow(clippy::type_complexity)]
fn ranges(
    slices: &[(Slice, bool, bool, f64)],
    writes: bool,
) -> Vec<(usize, u64, u64, bool, bool, f64, u64)> {
    let mut sorted: Vec<&(Slice, bool, bool, f64)> = slices
        .iter()
        .filter(|s| s.0.size > 0 && s.2 == writes)
        .collect();
    sorted.sort_by_key(|s| (s.0.allocation, s.0.offset));
    let mut groups: Vec<(usize, u64, u64, bool, bool, f64, u64)> = Vec::new();
    for (s, r, w, reuse) in sorted {
        let (lo, hi) = (s.offset, s.offset.saturating_add(s.size));
        match groups.last_mut() {
            Some(g) if g.0 == s.allocation && lo < g.2 => {
                g.2 = g.2.max(hi);
                g.3 |= *r;
                g.4 |= *w;
                g.5 = g.5.max(*reuse);
                g.6 = g.6.max(s.size);
            }
            _ => groups.push((s.allocation, lo, hi, *r, *w, *reuse, s.size)),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(offset: u64, size: u64) -> Slice {
        Slice {
            allocation: 0,
            offset,
            size,
        }
    }

    #[test]
    fn bytes_reused_by_a_later_value_make_two_values() {
        let mut t = TempValues::new(1);
        t.unit(&[(s(0, 100), false, true, 1.0)]); // v0 = ..
        t.unit(&[
            (s(0, 100), true, false, 1.0),
            (s(200, 100), false, true, 1.0),
        ]); // v1 = f(v0)
        t.unit(&[(s(0, 100), false, true, 1.0)]); // v2 over v0's bytes
        t.unit(&[
            (s(0, 100), true, false, 1.0),
            (s(200, 100), true, false, 1.0),
        ]);
        let (values, units, unfit) = t.finish();
        assert_eq!(unfit, vec![false]);
        assert_eq!(values, vec![(0, 0, 100), (0, 200, 300), (0, 0, 100)]);
        let ids = |k: usize| units[k].iter().map(|u| u.0).collect::<Vec<_>>();
        assert_eq!(
            (ids(0), ids(1), ids(2), ids(3)),
            (vec![0], vec![0, 1], vec![2], vec![2, 1])
        );
    }

    #[test]
    fn updates_in_place_and_reads_join_values_and_an_overlapping_write_starts_one() {
        let mut t = TempValues::new(1);
        t.unit(&[(s(0, 100), false, true, 1.0)]);
        // Read and written whole: an update in place, the same value.
        t.unit(&[(s(0, 100), true, true, 1.0)]);
        t.unit(&[(s(100, 10), false, true, 1.0)]);
        // Read across both: one value.
        t.unit(&[(s(50, 60), true, false, 1.0)]);
        // Written over part of it: it is dead, a new value.
        t.unit(&[(s(90, 100), false, true, 1.0)]);
        t.unit(&[(s(90, 100), true, false, 1.0)]);
        // Overlapping slices of one unit are one range.
        t.unit(&[
            (s(500, 20), false, true, 1.0),
            (s(510, 20), false, true, 1.0),
        ]);
        // Written over a value the same unit reads: one value.
        t.unit(&[(s(600, 100), false, true, 1.0)]);
        t.unit(&[
            (s(600, 100), true, false, 1.0),
            (s(650, 100), false, true, 1.0),
        ]);
        let (values, units, unfit) = t.finish();
        assert_eq!(unfit, vec![false]);
        assert_eq!(
            values,
            vec![(0, 0, 110), (0, 90, 190), (0, 500, 530), (0, 600, 750)]
        );
        assert!(units[..4].iter().flatten().all(|u| u.0 == 0));
        assert!(units[4..6].iter().flatten().all(|u| u.0 == 1));
        assert_eq!(units[6].len(), 1);
        assert!(units[7..].iter().flatten().all(|u| u.0 == 3), "{units:?}");
    }

    #[test]
    fn a_read_of_bytes_no_live_value_holds_gives_the_allocation_up() {
        let mut t = TempValues::new(2);
        t.unit(&[(s(0, 100), false, true, 1.0)]);
        t.unit(&[(s(50, 100), false, true, 1.0)]); // the first is dead
        t.unit(&[(s(0, 40), true, false, 1.0)]); // yet read: the rules do not fit
        let (values, units, unfit) = t.finish();
        assert_eq!(unfit, vec![true, false]);
        assert!(values.is_empty());
        assert!(units.iter().all(|u| u.is_empty()));
    }
}

//! # What any residency must move: a lower bound on a step's link traffic
//!
//! [`plan_residency`](crate::residency::plan_residency) and the staging say
//! what *their* plan moves. How far is that from the least any plan could
//! move? At each instant of the step (before each thunk), some bytes hold
//! content the step still needs:
//! - read: content a later thunk reads before anything overwrites it whole
//!   (a buffer living across steps: a later thunk of this step or the next);
//! - dirty: content the host does not have: a buffer living across steps
//!   since the step (or the one before) wrote it, unless the next thing to
//!   touch it overwrites it whole (until then it is dead); a temporary the
//!   step wrote and still reads.
//!
//! Of those, at most the budget can be in device memory at that instant.
//! Whatever is off the device then crosses the link: in before it is read,
//! out since it was written (a copy, or a kernel reading or writing it in
//! place). So with `R`, `W` and `U` the read, dirty and needed bytes at an
//! instant and `I` the bytes both read and dirty, every plan moves per step
//! at least `R - B` in, `W - B` out, and `(U - B) + (I - B)` both ways
//! together (each needed byte off the device crosses once, each byte both
//! read and dirty twice), for the instant where each is largest. That is a
//! bound, not a plan: no plan need reach it (the step's order, the area's
//! fragmentation and the link's overlap with compute all cost more).
//!
//! Byte counts are those of the thunks' slices; where a buffer's read and
//! written slices may differ, the least union and overlap are taken, so the
//! bound stays a bound.

use serde::Serialize;

use crate::residency::{Home, ResidencyInput};

/// The least any plan moves per step, at the instants that force it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MustCross {
    /// Host to device per step, at the least.
    pub bytes_in: u64,
    /// Device to host per step, at the least.
    pub bytes_out: u64,
    /// Both directions together per step, at the least.
    pub bytes_both: u64,
    /// The least time the link needs for them, µs (each direction at its
    /// rate, both at the rate of both at once).
    pub link_us: f64,
    /// The thunk before which the bound on `link_us` is reached.
    pub at_thunk: usize,
    /// Bytes the step needs at that instant (against the budget).
    pub needed_bytes: u64,
}

/// One thunk's uses of one buffer, merged.
#[derive(Clone, Copy)]
struct Touch {
    thunk: usize,
    read: u64,
    write: u64,
    /// It writes the whole buffer without reading it: what was there is dead.
    overwrites: bool,
}

/// Per-instant sums, kept as differences (`add` over ranges, then a prefix sum).
struct Sums {
    diff: Vec<[i128; 4]>,
}

impl Sums {
    /// Add `v` (read, dirty, needed, both) to instants `from..=to`.
    fn add(&mut self, from: usize, to: usize, v: [u64; 4]) {
        if from > to || v == [0; 4] {
            return;
        }
        for (k, x) in v.iter().enumerate() {
            self.diff[from][k] += i128::from(*x);
            self.diff[to + 1][k] -= i128::from(*x);
        }
    }
}

/// The lower bound of this module's docs for `input` under its budget
/// (buffers already in device memory, [`Home::Device`], are outside it).
pub fn must_cross(input: &ResidencyInput) -> MustCross {
    let m = input.steps.len();
    if m == 0 {
        return MustCross::default();
    }
    let mut touches: Vec<Vec<Touch>> = vec![Vec::new(); input.buffers.len()];
    for (k, t) in input.steps.iter().enumerate() {
        for u in &t.uses {
            let Some(b) = input.buffers.get(u.buffer) else {
                continue;
            };
            if b.home == Home::Device {
                continue;
            }
            let list = &mut touches[u.buffer];
            if list.last().is_none_or(|x| x.thunk != k) {
                list.push(Touch {
                    thunk: k,
                    read: 0,
                    write: 0,
                    overwrites: false,
                });
            }
            let x = list.last_mut().expect("pushed");
            if u.read {
                x.read = x.read.max(u.bytes);
            }
            if u.write {
                x.write = x.write.max(u.bytes);
            }
        }
    }
    let mut sums = Sums {
        diff: vec![[0; 4]; m + 1],
    };
    for (b, list) in touches.iter_mut().enumerate() {
        if list.is_empty() {
            continue;
        }
        let size = input.buffers[b].bytes;
        // Known once the thunk's uses are merged.
        for x in list.iter_mut() {
            x.overwrites = x.read == 0 && x.write == size;
        }
        add_buffer(&mut sums, list, size, input.buffers[b].persistent, m);
    }
    let budget = i128::from(input.budget_bytes);
    let past = |x: i128| u64::try_from((x - budget).max(0)).unwrap_or(u64::MAX);
    let r = &input.rates;
    let mut best = MustCross::default();
    let mut acc = [0i128; 4];
    for (k, d) in sums.diff.iter().take(m).enumerate() {
        for (a, x) in acc.iter_mut().zip(d) {
            *a += x;
        }
        let (bytes_in, bytes_out) = (past(acc[0]), past(acc[1]));
        let bytes_both = past(acc[2]).saturating_add(past(acc[3]));
        best.bytes_in = best.bytes_in.max(bytes_in);
        best.bytes_out = best.bytes_out.max(bytes_out);
        best.bytes_both = best.bytes_both.max(bytes_both);
        let us = r.link_us_of(bytes_in as f64, bytes_out as f64, bytes_both as f64);
        if us > best.link_us {
            best.link_us = us;
            best.at_thunk = k;
            best.needed_bytes = u64::try_from(acc[2].max(0)).unwrap_or(u64::MAX);
        }
    }
    best
}

/// Add one buffer's read, dirty, needed and both bytes at every instant
/// (`list`: its touches in thunk order, at least one).
fn add_buffer(sums: &mut Sums, list: &[Touch], size: u64, persistent: bool, m: usize) {
    let n = list.len();
    // need[j]: bytes read before an overwrite, from touch j on (at the
    // instant before its thunk). A buffer living across steps wraps around
    // to the next step's touches: one pass from nothing gives the need at
    // the step's start, the second the rest with it.
    let mut need = vec![0u64; n + 1];
    let passes = if persistent { 2 } else { 1 };
    for _ in 0..passes {
        need[n] = if persistent { need[0] } else { 0 };
        for j in (0..n).rev() {
            let x = list[j];
            let later = if x.overwrites {
                0
            } else {
                need[j + 1].saturating_sub(x.write)
            };
            need[j] = x.read.max(later);
        }
    }
    // The last write at or before each touch (a buffer living across steps:
    // the step before's last write before its first).
    let last_write_in_step = list.iter().rev().find(|x| x.write > 0).map(|x| x.write);
    let mut dirty_after = vec![0u64; n];
    let mut written: Option<u64> = if persistent { last_write_in_step } else { None };
    // Content overwritten whole before anything reads it is dead until then
    // (a donated input the step rewrites; an output the plugin has copied
    // out): it need be nowhere.
    let head_dirty = if list[0].overwrites {
        0
    } else {
        written.unwrap_or(0)
    };
    for (j, x) in list.iter().enumerate() {
        if x.write > 0 {
            written = Some(x.write);
        }
        dirty_after[j] = written.unwrap_or(0);
    }
    let parts = |read: u64, dirty: u64| {
        let needed = read.max(dirty);
        let both = (read + dirty).saturating_sub(size);
        [read, dirty, needed, both]
    };
    let first = list[0].thunk;
    if persistent {
        sums.add(0, first, parts(need[0], head_dirty));
    }
    for j in 0..n {
        let from = list[j].thunk + 1;
        let to = list.get(j + 1).map_or(m - 1, |x| x.thunk);
        let read = if j + 1 < n || persistent {
            need[j + 1]
        } else {
            0
        };
        if persistent {
            let dead = list.get(j + 1).is_some_and(|x| x.overwrites);
            let dirty = if dead { 0 } else { dirty_after[j] };
            sums.add(from, to, parts(read, dirty));
        } else if dirty_after[j] > 0 && read > 0 {
            // A temporary: content the step made and still reads, dirty.
            let dirty = dirty_after[j].min(read);
            sums.add(from, to, parts(read, dirty));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::residency::testing::{buf, input, thunk, MB};

    #[test]
    fn everything_fits_nothing_must_cross() {
        let i = input(
            vec![buf(0, 100, true), buf(1, 100, false)],
            vec![
                thunk("a", &[(0, 100, true, false), (1, 100, false, true)], 0.0),
                thunk("b", &[(1, 100, true, false)], 0.0),
            ],
            300,
        );
        assert_eq!(must_cross(&i), MustCross::default());
    }

    #[test]
    fn state_read_and_written_past_the_budget_crosses_both_ways() {
        // Two 100 MB weights read and updated every step, a 60 MB budget:
        // at every instant 200 MB are needed and dirty, 140 MB of it off the
        // device, crossing in and out.
        let i = input(
            vec![buf(0, 100, true), buf(1, 100, true)],
            vec![
                thunk("fwd", &[(0, 100, true, false), (1, 100, true, false)], 0.0),
                thunk("upd0", &[(0, 100, true, true)], 0.0),
                thunk("upd1", &[(1, 100, true, true)], 0.0),
            ],
            60,
        );
        let c = must_cross(&i);
        assert_eq!(c.bytes_in, 140 * MB);
        assert_eq!(c.bytes_out, 140 * MB);
        assert_eq!(c.bytes_both, 280 * MB);
        assert_eq!(c.needed_bytes, 200 * MB);
        let r = &i.rates;
        let want = (140 * MB) as f64 / r.link_bytes_per_s * 1e6;
        assert!((c.link_us - want.max((280 * MB) as f64 / r.link_both() * 1e6)).abs() < 1e-6);
    }

    #[test]
    fn read_only_weights_cross_in_only() {
        let i = input(
            vec![buf(0, 100, true), buf(1, 100, true)],
            vec![
                thunk("a", &[(0, 100, true, false)], 0.0),
                thunk("b", &[(1, 100, true, false)], 0.0),
            ],
            50,
        );
        let c = must_cross(&i);
        assert_eq!((c.bytes_in, c.bytes_out), (150 * MB, 0));
        assert_eq!(c.bytes_both, 150 * MB);
    }

    #[test]
    fn a_temporary_counts_only_between_its_write_and_its_last_read() {
        // Temporary 1 (80 MB) is written by thunk 1 and read by thunk 2; a
        // read-only weight of 50 MB beside it; budget 100 MB. Before thunk 2
        // 130 MB are needed; before thunk 1 only the weight.
        let i = input(
            vec![buf(0, 50, true), buf(1, 80, false)],
            vec![
                thunk("w", &[(0, 50, true, false)], 0.0),
                thunk("make", &[(1, 80, false, true)], 0.0),
                thunk("use", &[(1, 80, true, false), (0, 50, true, false)], 0.0),
                thunk("after", &[], 0.0),
            ],
            100,
        );
        let c = must_cross(&i);
        assert_eq!(c.at_thunk, 2);
        assert_eq!(c.needed_bytes, 130 * MB);
        assert_eq!(c.bytes_in, 30 * MB);
        // Dirty at that instant: the temporary only (80 MB, under the budget).
        assert_eq!(c.bytes_out, 0);
        // Both: 30 MB off the device, none of it need be read and dirty.
        assert_eq!(c.bytes_both, 30 * MB);
    }

    #[test]
    fn content_overwritten_whole_before_a_read_is_not_needed() {
        // An output written whole each step and read after: between steps
        // its content is dirty (the user's result) but not read again.
        let i = input(
            vec![buf(0, 100, true)],
            vec![
                thunk("write", &[(0, 100, false, true)], 0.0),
                thunk("read", &[(0, 100, true, false)], 0.0),
            ],
            40,
        );
        let c = must_cross(&i);
        assert_eq!(c.bytes_in, 60 * MB);
        assert_eq!(c.bytes_out, 60 * MB);
        // Before `write`: dead (nothing reads it before it is rewritten, the
        // last result was copied out); before `read`: read and dirty.
        assert_eq!(c.bytes_both, 120 * MB);
        assert_eq!(c.at_thunk, 1);
        // With a 100 MB weight read only before `write`, the output's dead
        // stretch leaves the weight alone against the budget there.
        let i = input(
            vec![buf(0, 100, true), buf(1, 100, true)],
            vec![
                thunk("w", &[(1, 100, true, false)], 0.0),
                thunk("write", &[(0, 100, false, true)], 0.0),
                thunk("read", &[(0, 100, true, false)], 0.0),
            ],
            40,
        );
        let c = must_cross(&i);
        // Before `w` and `write`: the weight (read) and nothing of the
        // output; after `write`: both, the output dirty.
        assert_eq!(c.bytes_in, 160 * MB);
        assert_eq!(c.bytes_out, 60 * MB);
        assert_eq!(c.at_thunk, 2);
    }

    #[test]
    fn buffers_already_on_the_device_are_outside_the_budget() {
        let mut bufs = vec![buf(0, 100, true), buf(1, 100, true)];
        bufs[1].home = Home::Device;
        let i = input(
            bufs,
            vec![thunk(
                "a",
                &[(0, 100, true, false), (1, 100, true, false)],
                0.0,
            )],
            50,
        );
        assert_eq!(must_cross(&i).bytes_in, 50 * MB);
    }

    #[test]
    fn every_plan_moves_at_least_the_bound() {
        // The planner's own traffic (copies and in-place bytes) on small
        // programs is never below what must cross.
        for budget in [60, 120, 200, 260] {
            let i = input(
                vec![
                    buf(0, 100, true),
                    buf(1, 100, true),
                    buf(2, 80, false),
                    buf(3, 40, false),
                ],
                vec![
                    thunk("f0", &[(0, 100, true, false), (2, 80, false, true)], 1e9),
                    thunk(
                        "f1",
                        &[
                            (1, 100, true, false),
                            (2, 80, true, false),
                            (3, 40, false, true),
                        ],
                        1e9,
                    ),
                    thunk("b", &[(3, 40, true, false), (0, 100, true, true)], 1e9),
                    thunk("u", &[(1, 100, true, true)], 1e9),
                ],
                budget,
            );
            let c = must_cross(&i);
            let p = crate::residency::plan_residency(&i).unwrap();
            let moved_in = p.bytes_in_per_step + p.bytes_in_place_per_step;
            let moved_out = p.bytes_out_per_step + p.bytes_in_place_per_step;
            assert!(moved_in >= c.bytes_in, "budget {budget}: {c:?} {p:?}");
            assert!(moved_out >= c.bytes_out, "budget {budget}: {c:?} {p:?}");
            assert!(
                p.step_us >= c.link_us * 0.999,
                "budget {budget}: {c:?} {p:?}"
            );
        }
    }

    #[test]
    fn no_plan_of_random_programs_moves_less_than_the_bound() {
        // Random programs (weights, moments, temporaries read and written
        // in random orders) under random budgets: the planner's traffic and
        // estimate never undercut the bound.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for case in 0..300 {
            let nbuf = 2 + next(6) as usize;
            let bufs: Vec<_> = (0..nbuf)
                .map(|b| buf(b, 10 + next(90), next(2) == 0))
                .collect();
            let mut steps = Vec::new();
            for k in 0..(2 + next(8)) {
                let mut uses = Vec::new();
                for _ in 0..(1 + next(3)) {
                    let b = next(nbuf as u64) as usize;
                    if uses.iter().any(|&(x, _, _, _)| x == b) {
                        continue;
                    }
                    let mb = bufs[b].bytes / MB;
                    let (read, write) = match next(3) {
                        0 => (true, false),
                        1 => (false, true),
                        _ => (true, true),
                    };
                    uses.push((b, mb, read, write));
                }
                steps.push(thunk(&format!("t{k}"), &uses, 1e9 * next(4) as f64));
            }
            let total: u64 = bufs.iter().map(|b| b.bytes / MB).sum();
            let i = input(bufs, steps, 20 + next(total));
            let c = must_cross(&i);
            let p = crate::residency::plan_residency(&i).unwrap();
            let moved = |copies: u64| copies + p.bytes_in_place_per_step;
            assert!(
                moved(p.bytes_in_per_step) >= c.bytes_in,
                "case {case}: {c:?}\n{i:?}\n{p:?}"
            );
            assert!(
                moved(p.bytes_out_per_step) >= c.bytes_out,
                "case {case}: {c:?}\n{i:?}\n{p:?}"
            );
            assert!(
                moved(p.bytes_in_per_step + p.bytes_out_per_step) >= c.bytes_both,
                "case {case}: {c:?}\n{i:?}\n{p:?}"
            );
            assert!(
                p.step_us >= c.link_us * 0.999,
                "case {case}: {c:?}\n{i:?}\n{p:?}"
            );
        }
    }
}

//! # Rebalance: moving a program's memory between device and host once its
//! plan is known
//!
//! Under a device memory budget, buffers are placed when they are
//! allocated: device memory while ordinary allocations stay under the
//! budget less the staging reserve, host memory past it. A JAX program's
//! weights are usually put on the device before any program that uses them
//! is known, so that first come, first served decides what is resident, and
//! the program's own temporaries, allocated last, may land in host memory
//! while weights read once per step sit on the device. The staging area is
//! then what the reserve leaves: too small to hold a layer's weights and
//! its live temporaries, temporaries go home and come back (measured on
//! the H200: a llama prefill at 2x moved 3482 MiB in and 688 MiB out per
//! step for 2664 MiB of weights past the budget).
//!
//! The allocator can move a whole physical allocation between device and
//! host memory under its virtual address (`vmm::Buffer::relocate`). So at
//! a program's first run, with every thunk's reads and writes known,
//! [`rebalance`] plans the program as if the buffers it may move were
//! anywhere ([`Home::Movable`]) within the device memory they hold now plus
//! the room left, and says where each should live: on the device those the
//! plan makes resident, in host memory those it stages or reads in place.
//! An allocation split into several planned buffers (XLA's packed
//! temporaries) moves only when the plan places all its parts alike. The
//! plan is made with the whole room and with less of it
//! ([`PLANNED_SHARES`]: less resident, a larger staging area), a proposal
//! each; the fastest is kept. From there, one allocation at a time moves
//! (the largest first, [`REFINE_CANDIDATES`]) while a move shortens the
//! estimate by [`REFINE_GAIN`]: the planner's layouts count bytes, and can
//! miss that one weight read three times a step is worth a smaller area. The
//! moves are made only when the estimate of the step gains at least
//! [`MIN_GAIN`] (the planner's own schedule's in [`rebalance`], the
//! caller's in [`rebalance_with`]: the runtime estimates the staging each
//! layout would run): a relocation copies the buffer once, and another
//! program that planned for the old homes plans again.
//!
//! Pure planning: the caller (the runtime) maps buffers to allocations,
//! makes the moves (device memory freed first) and plans its staging for
//! the new homes.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::residency::{plan_residency, Home, Placement, ResidencyInput};

/// The least gain of the step's estimate worth moving memory for.
pub const MIN_GAIN: f64 = 0.05;

/// Shares of the room the planner's ideal layouts may keep resident, one
/// proposal each ([`rebalance_with`]): less resident leaves a larger
/// staging area.
pub const PLANNED_SHARES: [f64; 6] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5];

/// Allocations [`rebalance_with`]'s search moves one at a time after the
/// proposals: the largest movable ones.
pub const REFINE_CANDIDATES: usize = 16;

/// Layouts that search estimates at most (programs of more than
/// [`crate::staging::EXPLORE_MAX_STEPS`] steps: none).
pub const REFINE_MAX_ESTIMATES: usize = 48;

/// The least gain of the step's estimate one move of the search must make.
pub const REFINE_GAIN: f64 = 0.01;

/// What [`rebalance`] decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebalance {
    /// Per allocation id that moves, where it goes ([`Home::Device`] or
    /// [`Home::Host`]), those leaving the device first.
    pub moves: Vec<(usize, Home)>,
    /// Per buffer of the input, its home after the moves.
    pub homes: Vec<Home>,
    /// Device bytes the moves to the host free, by the buffers' sizes.
    pub freed_bytes: u64,
    /// Device bytes the moves to the device take.
    pub taken_bytes: u64,
    /// The plan's step estimate with the buffers where they are, µs.
    pub before_us: f64,
    /// The plan's step estimate with the buffers where the moves put them.
    pub after_us: f64,
}

/// Where the buffers of `input` should live, given its homes (what is in
/// device memory is outside `budget_bytes`, the room left), when the
/// allocations in `movable` may move: (id, the bytes of memory it holds,
/// which its planned parts may not fill: a temporary allocation's values,
/// the granularity). `None` when no move gains [`MIN_GAIN`] of the step.
/// Buffers the program does not touch never move (another program may
/// need them where they are).
pub fn rebalance(input: &ResidencyInput, movable: &[(usize, u64)]) -> Result<Option<Rebalance>> {
    rebalance_with(input, movable, |moved| {
        Ok(plan_residency(moved.map_or(input, |m| &m.input))?.step_us)
    })
}

/// A proposal [`rebalance_with`] estimates: the input with the moved
/// allocations' buffers at their new homes and the room the moves leave.
pub struct Moved<'a> {
    /// Per allocation id that moves, where it goes.
    pub moves: &'a [(usize, Home)],
    /// `input` with the buffers' new homes and budget.
    pub input: ResidencyInput,
}

/// [`rebalance`], the step of each layout estimated by `estimate`: `None`
/// for the buffers where they are, else the proposed moves (µs; the
/// runtime's estimate is the staging it would run, [`crate::staging`]'s,
/// where the planner's own schedule counts bytes, not addresses in the
/// area).
pub fn rebalance_with(
    input: &ResidencyInput,
    movable: &[(usize, u64)],
    mut estimate: impl FnMut(Option<&Moved<'_>>) -> Result<f64>,
) -> Result<Option<Rebalance>> {
    input.validate()?;
    let size: BTreeMap<usize, u64> = movable.iter().copied().collect();
    let mut used = vec![false; input.buffers.len()];
    for t in &input.steps {
        for x in &t.uses {
            used[x.buffer] = true;
        }
    }
    // The buffers that may move: placed already, used, of a movable
    // allocation; and each allocation's parts.
    let candidate: Vec<bool> = input
        .buffers
        .iter()
        .zip(&used)
        .map(|(b, &u)| u && b.home != Home::Movable && size.contains_key(&b.id))
        .collect();
    if !candidate.contains(&true) {
        return Ok(None);
    }
    let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, b) in input.buffers.iter().enumerate() {
        parts.entry(b.id).or_default().push(i);
    }
    // Only an allocation whose every part may move can move.
    parts.retain(|_, ps| ps.iter().all(|&i| candidate[i]));
    if parts.is_empty() {
        return Ok(None);
    }
    // Anywhere, within the device memory the movable allocations hold now
    // and the room.
    let mut free = input.clone();
    for (id, ps) in &parts {
        if ps.iter().any(|&i| input.buffers[i].home == Home::Device) {
            free.budget_bytes += size[id];
        }
        for &i in ps {
            free.buffers[i].home = Home::Movable;
        }
    }
    // The planner's ideal layout counts the area's bytes, not how its
    // copies overlap: keeping less resident leaves a larger area, which may
    // stage faster (a llama prefill at 2x on an H100's rates: 69.98 ms as
    // staged after the whole share's proposal, 59.81 after the 60% one's). A
    // proposal per share of the room, each judged by the caller's estimate.
    let mut proposals: Vec<Vec<(usize, Home)>> = Vec::new();
    let shares = if input.steps.len() > crate::staging::EXPLORE_MAX_STEPS {
        &PLANNED_SHARES[..1]
    } else {
        &PLANNED_SHARES[..]
    };
    for &share in shares {
        let mut variant = free.clone();
        variant.budget_bytes = (free.budget_bytes as f64 * share) as u64;
        let moves = proposed_moves(input, &parts, &plan_residency(&variant)?.placements);
        if !moves.is_empty() && !proposals.contains(&moves) {
            proposals.push(moves);
        }
    }
    // `moves` applied: the input with the buffers at their new homes and the
    // room left, the bytes freed and taken; `None` when they do not fit.
    let apply = |moves: &[(usize, Home)]| -> Option<(ResidencyInput, u64, u64)> {
        let (mut after, mut freed, mut taken) = (input.clone(), 0u64, 0u64);
        for &(id, to) in moves {
            match to {
                Home::Device => taken += size[&id],
                _ => freed += size[&id],
            }
            for &i in &parts[&id] {
                after.buffers[i].home = to;
            }
        }
        let room = (input.budget_bytes + freed).checked_sub(taken)?;
        after.budget_bytes = room;
        Some((after, freed, taken))
    };
    let before = estimate(None)?;
    // Each layout estimated once (a move may lead back to one seen): its
    // estimate, and whether it was new.
    let mut seen: Vec<(Vec<(usize, Home)>, f64)> = vec![(Vec::new(), before)];
    let mut judge = |moves: &[(usize, Home)]| -> Result<Option<(f64, bool)>> {
        if let Some((_, us)) = seen.iter().find(|(m, _)| m == moves) {
            return Ok(Some((*us, false)));
        }
        let Some((after, ..)) = apply(moves) else {
            return Ok(None);
        };
        let us = estimate(Some(&Moved {
            moves,
            input: after,
        }))?;
        seen.push((moves.to_vec(), us));
        Ok(Some((us, true)))
    };
    // The fastest proposal that gains (the first among equals), else where
    // they are.
    let (mut moves, mut us) = (Vec::new(), before);
    for m in proposals {
        if let Some((t, _)) = judge(&m)? {
            if t < us {
                (moves, us) = (m, t);
            }
        }
    }
    // Then single moves from there, the largest allocations first: each round
    // makes the one that shortens the step the most, while one shortens it by
    // REFINE_GAIN (the planner's layouts keep nothing resident where keeping a
    // weight read three times a step on the device gains most: a JAX llama
    // training step at 2x, 103.3 -> 89.0 ms by the staging's estimate).
    let mut order: Vec<usize> = parts.keys().copied().collect();
    order.sort_by_key(|id| (std::cmp::Reverse(size[id]), *id));
    order.truncate(REFINE_CANDIDATES);
    let mut left = if input.steps.len() > crate::staging::EXPLORE_MAX_STEPS {
        0
    } else {
        REFINE_MAX_ESTIMATES
    };
    while left > 0 {
        let mut pick: Option<(Vec<(usize, Home)>, f64)> = None;
        for &id in &order {
            if left == 0 {
                break;
            }
            let home = input.buffers[parts[&id][0]].home;
            let now = moves.iter().find(|m| m.0 == id).map_or(home, |m| m.1);
            let to = if now == Home::Device {
                Home::Host
            } else {
                Home::Device
            };
            let mut flipped: Vec<(usize, Home)> =
                moves.iter().filter(|m| m.0 != id).copied().collect();
            if to != home {
                flipped.push((id, to));
            }
            sort_moves(&mut flipped);
            let Some((t, fresh)) = judge(&flipped)? else {
                continue;
            };
            left -= usize::from(fresh);
            if t < us * (1.0 - REFINE_GAIN) && pick.as_ref().is_none_or(|p| t < p.1) {
                pick = Some((flipped, t));
            }
        }
        let Some((m, t)) = pick else { break };
        (moves, us) = (m, t);
    }
    if moves.is_empty() || before <= 0.0 || us > before * (1.0 - MIN_GAIN) {
        return Ok(None);
    }
    let (after, freed_bytes, taken_bytes) = apply(&moves).expect("judged: it fits");
    Ok(Some(Rebalance {
        homes: after.buffers.iter().map(|b| b.home).collect(),
        moves,
        freed_bytes,
        taken_bytes,
        before_us: before,
        after_us: us,
    }))
}

/// The moves `placements` (a plan of the buffers anywhere) asks of the
/// allocations in `parts`: to the device when the plan keeps all their
/// parts resident, to host memory when it keeps none (those leaving the
/// device first).
fn proposed_moves(
    input: &ResidencyInput,
    parts: &BTreeMap<usize, Vec<usize>>,
    placements: &[Placement],
) -> Vec<(usize, Home)> {
    let mut moves = Vec::new();
    for (&id, ps) in parts {
        let on_device = |i: &usize| placements[*i] == Placement::Device;
        let to = if ps.iter().all(on_device) {
            Home::Device
        } else if !ps.iter().any(on_device) {
            Home::Host
        } else {
            continue;
        };
        if ps.iter().all(|&i| input.buffers[i].home == to) {
            continue;
        }
        moves.push((id, to));
    }
    sort_moves(&mut moves);
    moves
}

/// Moves in the order they are made: those leaving the device first.
fn sort_moves(moves: &mut [(usize, Home)]) {
    moves.sort_by_key(|&(id, to)| (to == Home::Device, id));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::residency::testing::*;

    /// The allocations `ids` of `x` with the bytes of their parts.
    fn sized(ids: &[usize], x: &ResidencyInput) -> Vec<(usize, u64)> {
        ids.iter()
            .map(|&id| {
                (
                    id,
                    x.buffers
                        .iter()
                        .filter(|b| b.id == id)
                        .map(|b| b.bytes)
                        .sum(),
                )
            })
            .collect()
    }

    /// A layer-like program: four weights of 100 MiB each read once by a
    /// GEMM-like thunk, and a 150 MiB temporary every thunk reads and
    /// writes (an activation), then an output written.
    fn layers() -> ResidencyInput {
        let mut buffers: Vec<_> = (0..4).map(|i| buf(i, 100, true)).collect();
        buffers.push(buf(4, 150, false));
        buffers.push(buf(5, 10, true));
        let mut steps: Vec<_> = (0..4)
            .map(|i| thunk("gemm", &[(i, 100, true, false), (4, 150, true, true)], 4e11))
            .collect();
        steps.push(thunk(
            "out",
            &[(4, 150, true, false), (5, 10, false, true)],
            0.0,
        ));
        input(buffers, steps, 0)
    }

    /// Homes as first come, first served gives them: weights 0-2 on the
    /// device, weight 3, the temporary and the output in host memory, with
    /// `room` MiB left.
    fn first_come(room: u64) -> ResidencyInput {
        let mut x = layers();
        for (i, b) in x.buffers.iter_mut().enumerate() {
            b.home = if i < 3 { Home::Device } else { Home::Host };
        }
        x.budget_bytes = room * MB;
        x
    }

    #[test]
    fn a_temporary_in_host_memory_trades_places_with_a_weight_read_once() {
        let x = first_come(100);
        let r = rebalance(&x, &sized(&[0, 1, 2, 3, 4, 5], &x))
            .unwrap()
            .expect("moving pays");
        // The temporary and the output come to the device; weights leave it
        // to make the room (those leaving first).
        assert!(r.moves.contains(&(4, Home::Device)), "{r:?}");
        let first_in = r.moves.iter().position(|m| m.1 == Home::Device).unwrap();
        assert!(r.moves[..first_in].iter().all(|m| m.1 == Home::Host));
        assert!(r.moves[first_in..].iter().all(|m| m.1 == Home::Device));
        assert!(r.after_us <= r.before_us * (1.0 - MIN_GAIN), "{r:?}");
        assert!(r.taken_bytes <= x.budget_bytes + r.freed_bytes);
        // The homes are the moves applied.
        for (i, b) in x.buffers.iter().enumerate() {
            let moved = r.moves.iter().find(|m| m.0 == b.id).map(|m| m.1);
            assert_eq!(r.homes[i], moved.unwrap_or(b.home), "buffer {i}");
        }
    }

    #[test]
    fn the_caller_estimates_each_layout_and_its_verdict_decides() {
        let x = first_come(100);
        let movable = sized(&[0, 1, 2, 3, 4, 5], &x);
        let proposed = rebalance(&x, &movable).unwrap().expect("moving pays");
        // The layout where the buffers are, then the proposal with its moves
        // applied and the room they leave.
        let verdict = |before: f64, after: f64| {
            let mut seen = Vec::new();
            let r = rebalance_with(&x, &movable, |m| {
                seen.push(m.map(|m| (m.moves.to_vec(), m.input.budget_bytes)));
                Ok(if m.is_some() { after } else { before })
            })
            .unwrap();
            (r, seen)
        };
        let (r, seen) = verdict(100.0, 80.0);
        let r = r.expect("20% faster by the caller's estimate");
        assert_eq!(
            (r.moves.clone(), r.homes.clone()),
            (proposed.moves.clone(), proposed.homes)
        );
        assert_eq!((r.before_us, r.after_us), (100.0, 80.0));
        let room = x.budget_bytes + r.freed_bytes - r.taken_bytes;
        // The layout as it is, then a proposal per share of the device
        // memory kept resident (distinct ones only); among equal estimates
        // the first (the whole share) wins.
        assert_eq!(seen[..2], [None, Some((r.moves.clone(), room))]);
        assert!(seen[1..].iter().all(|p| p.is_some()));
        for (i, p) in seen.iter().enumerate() {
            assert!(!seen[..i].contains(p), "proposal {i} twice: {seen:?}");
        }
        // Less than MIN_GAIN by the caller's estimate, whatever the planner's
        // schedule says: nothing moves.
        assert_eq!(verdict(100.0, 96.0).0, None);
        // An estimate that fails fails the rebalance.
        let e = rebalance_with(&x, &movable, |m| match m {
            None => Ok(1.0),
            Some(_) => Err(crate::error::PolicyError::InvalidResidency(
                "no area".into(),
            )),
        })
        .unwrap_err();
        assert!(e.to_string().contains("no area"), "{e}");
    }

    #[test]
    fn a_proposal_that_keeps_less_resident_wins_when_the_caller_says_so() {
        // The caller's estimate favours a larger staging area (what a layer's
        // prefetch needs): the proposal that leaves the most room wins,
        // though the whole share's proposal keeps more on the device.
        let x = first_come(100);
        let movable = sized(&[0, 1, 2, 3, 4, 5], &x);
        let mut rooms = Vec::new();
        let r = rebalance_with(&x, &movable, |m| {
            Ok(match m {
                None => 1000.0,
                Some(m) => {
                    rooms.push(m.input.budget_bytes);
                    1000.0 - (m.input.budget_bytes / MB) as f64
                }
            })
        })
        .unwrap()
        .expect("a proposal pays");
        assert!(rooms.len() > 1, "several proposals: {rooms:?}");
        let most = *rooms.iter().max().unwrap();
        assert_eq!(x.budget_bytes + r.freed_bytes - r.taken_bytes, most);
        assert!(most > rooms[0], "{rooms:?}");
        assert_eq!(r.after_us, 1000.0 - (most / MB) as f64);
    }

    #[test]
    fn nothing_moves_when_it_fits_when_nothing_may_move_or_when_it_gains_little() {
        // Room for everything: the plan has nothing to gain.
        assert_eq!(
            rebalance(
                &first_come(10_000),
                &sized(&[0, 1, 2, 3, 4, 5], &first_come(10_000))
            )
            .unwrap(),
            None
        );
        // Nothing may move.
        assert_eq!(rebalance(&first_come(100), &[]).unwrap(), None);
        // Only the weights may move: they leave the device, and the area
        // they free holds the temporary.
        let r = rebalance(&first_come(100), &sized(&[0, 1, 2], &first_come(100)))
            .unwrap()
            .unwrap();
        assert!(
            r.moves.iter().all(|m| m.1 == Home::Host && m.0 < 3),
            "{r:?}"
        );
        // Already rebalanced: no second move.
        let x = first_come(100);
        let r = rebalance(&x, &sized(&[0, 1, 2, 3, 4, 5], &x))
            .unwrap()
            .unwrap();
        let mut again = x.clone();
        for (b, h) in again.buffers.iter_mut().zip(&r.homes) {
            b.home = *h;
        }
        again.budget_bytes = x.budget_bytes + r.freed_bytes - r.taken_bytes;
        assert_eq!(
            rebalance(&again, &sized(&[0, 1, 2, 3, 4, 5], &x)).unwrap(),
            None
        );
    }

    #[test]
    fn an_allocation_moves_whole_or_not_at_all_and_untouched_buffers_stay() {
        let mut x = first_come(100);
        // The temporary is two parts of one allocation (id 4), one of them
        // on the device already (it may not be split).
        let mut part = x.buffers[4].clone();
        part.offset = 150 * MB;
        part.home = Home::Device;
        x.buffers.push(part);
        // A weight of the device the program never touches.
        let mut idle = buf(7, 300, true);
        idle.home = Home::Device;
        x.buffers.push(idle);
        let r = rebalance(&x, &sized(&[0, 1, 2, 3, 4, 5, 7], &x))
            .unwrap()
            .expect("the weights still make room for the staging area");
        // The temporary's second part is not used by the program, so the
        // allocation cannot move whole: it stays, as does the idle weight;
        // the weights on the device leave it.
        assert!(
            !r.moves.iter().any(|m| m.0 == 4 || m.0 == 7),
            "moved what may not move: {r:?}"
        );
        assert!(
            r.moves.iter().any(|m| m.1 == Home::Host && m.0 < 3),
            "{r:?}"
        );
        for (i, b) in x.buffers.iter().enumerate() {
            if b.id == 4 || b.id == 7 {
                assert_eq!(r.homes[i], b.home, "buffer {i}");
            }
        }
    }

    #[test]
    fn single_moves_after_the_proposals_find_what_the_planner_misses() {
        // The caller's estimate: each buffer on the device costs 10 (a smaller
        // area), except weight 1, which gains 30 there (read again and again).
        // The best layout keeps weight 1 alone on the device.
        let x = first_come(100);
        let movable = sized(&[0, 1, 2, 3, 4, 5], &x);
        let (mut n, mut seen) = (0, Vec::new());
        let r = rebalance_with(&x, &movable, |m| {
            n += 1;
            let homes: Vec<Home> = match m {
                None => x.buffers.iter().map(|b| b.home).collect(),
                Some(m) => m.input.buffers.iter().map(|b| b.home).collect(),
            };
            assert!(
                !seen.contains(&homes),
                "a layout estimated twice: {homes:?}"
            );
            seen.push(homes.clone());
            let cost = |(i, h): (usize, &Home)| match (i, h) {
                (1, Home::Device) => -30.0,
                (_, Home::Device) => 10.0,
                _ => 0.0,
            };
            Ok(100.0 + homes.iter().enumerate().map(cost).sum::<f64>())
        })
        .unwrap()
        .expect("moving pays");
        let on_device: Vec<usize> = (0..r.homes.len())
            .filter(|&i| r.homes[i] == Home::Device)
            .collect();
        assert_eq!(on_device, [1], "{r:?}");
        assert_eq!((r.before_us, r.after_us), (90.0, 70.0));
        assert!(r.moves.contains(&(0, Home::Host)) && r.moves.contains(&(2, Home::Host)));
        assert!(!r.moves.iter().any(|m| m.0 == 1), "weight 1 stays: {r:?}");
        assert!(
            n <= 1 + PLANNED_SHARES.len() + REFINE_MAX_ESTIMATES,
            "{n} estimates"
        );
    }
}

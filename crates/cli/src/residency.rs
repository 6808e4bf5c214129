//! `xla-vmm inspect FILE --memory-budget BYTES`: the residency plan of a
//! program under a device memory budget (which buffers stay in device
//! memory, which are staged ahead of the thunks that use them, which are
//! read in place from host memory; what crosses the link per step and which
//! thunks are expected to wait), as text or as part of `--json`. No GPU.

use std::fmt::Write as _;

use serde_json::{json, Value};
use xla_vmm::Plan;
use xla_vmm_policy::must_cross::MustCross;
use xla_vmm_policy::residency::{Home, Placement, Rates, ResidencyPlan};

/// The device's rates for the plan (the H200's measured ones by default).
#[derive(clap::Args, Clone, Debug)]
pub struct RateArgs {
    /// Host link bandwidth, GB/s, host to device (and the other way unless
    /// --link-out-gbps says).
    #[arg(long, value_name = "GB/S", default_value_t = Rates::H200.link_bytes_per_s / 1e9)]
    pub link_gbps: f64,
    /// Host link bandwidth device to host, GB/s (`xla-vmm probe`'s "to
    /// host"); default: --link-gbps.
    #[arg(long, value_name = "GB/S")]
    pub link_out_gbps: Option<f64>,
    /// Both directions at once, GB/s of both together (`xla-vmm probe`'s
    /// "both ways"); default: one way's, the directions taking turns.
    #[arg(long, value_name = "GB/S")]
    pub link_both_gbps: Option<f64>,
    /// Device memory bandwidth, GB/s.
    #[arg(long, value_name = "GB/S", default_value_t = Rates::H200.hbm_bytes_per_s / 1e9)]
    pub hbm_gbps: f64,
    /// Arithmetic, TFLOP/s.
    #[arg(long, value_name = "TFLOP/S", default_value_t = Rates::H200.flops_per_s / 1e12)]
    pub tflops: f64,
}

impl RateArgs {
    fn rates(&self) -> Rates {
        Rates {
            link_bytes_per_s: self.link_gbps * 1e9,
            hbm_bytes_per_s: self.hbm_gbps * 1e9,
            flops_per_s: self.tflops * 1e12,
            link_out_bytes_per_s: self.link_out_gbps.map_or(0.0, |g| g * 1e9),
            link_both_bytes_per_s: self.link_both_gbps.map_or(0.0, |g| g * 1e9),
        }
    }
}

/// `--memory-budget`'s text (`16G`, `512M`, bytes).
pub fn parse_budget(text: &str) -> Result<u64, String> {
    xla_vmm_device::budget::parse_bytes(text)
        .ok_or_else(|| format!("{text:?}: expected bytes, e.g. 16G, 512M or 1048576"))
}

/// The plan of `plan` under `budget`.
pub fn plan(
    plan: &Plan,
    budget: u64,
    rates: &RateArgs,
) -> anyhow::Result<(ResidencyPlan, MustCross)> {
    let input = xla_vmm_runtime::residency::residency_input(plan, budget, rates.rates())?;
    let r = xla_vmm_policy::residency::plan_residency(&input)?;
    Ok((r, xla_vmm_policy::must_cross::must_cross(&input)))
}

fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn name(plan: &Plan, r: &ResidencyPlan, i: usize) -> String {
    let b = &r.buffers[i];
    let whole = plan
        .allocations
        .get(b.id)
        .is_some_and(|a| a.size == b.bytes);
    if whole {
        format!("allocation {} ({}, {})", b.id, b.name, gib(b.bytes))
    } else {
        region(b)
    }
}

/// A buffer as the text names it: its allocation, offset, role and size.
fn region(b: &xla_vmm_policy::residency::Buffer) -> String {
    format!(
        "allocation {} at {} ({}, {})",
        b.id,
        b.offset,
        b.name,
        gib(b.bytes)
    )
}

/// A buffer's fields in the JSON lists (allocation, offset, bytes) with
/// `more`.
fn region_json(b: &xla_vmm_policy::residency::Buffer, more: Value) -> Value {
    let mut v = json!({"allocation": b.id, "offset": b.offset, "bytes": b.bytes});
    if let (Value::Object(o), Value::Object(m)) = (&mut v, more) {
        o.extend(m);
    }
    v
}

/// Rows of a list shown in the text (the JSON has them all).
const SHOWN: usize = 8;

/// The readable summary.
pub fn text(plan: &Plan, r: &ResidencyPlan, c: &MustCross) -> String {
    let mut s = String::new();
    let count = |p: Placement| {
        let (n, b) = r
            .placements
            .iter()
            .zip(&r.buffers)
            .filter(|(x, b)| **x == p && b.bytes > 0)
            .fold((0, 0u64), |(n, b), (_, x)| (n + 1, b + x.bytes));
        format!("{n} ({})", gib(b))
    };
    let _ = writeln!(
        s,
        "residency under a {} device budget (the program's buffers: {}):",
        gib(r.budget_bytes),
        gib(r.total_bytes)
    );
    let _ = writeln!(
        s,
        "  buffers (allocations, or their regions the thunks use): device {}, staged {}, in place {}",
        count(Placement::Device),
        count(Placement::Staged),
        count(Placement::InPlace)
    );
    let _ = writeln!(
        s,
        "  peak device bytes: {} (resident {} + staging {})",
        gib(r.peak_device_bytes),
        gib(r.resident_bytes),
        gib(r.staging_bytes)
    );
    let _ = writeln!(
        s,
        "  per step over the link: {} in, {} out, {} read or written in place",
        gib(r.bytes_in_per_step),
        gib(r.bytes_out_per_step),
        gib(r.bytes_in_place_per_step)
    );
    let _ = writeln!(
        s,
        "  estimated step: {:.3} ms (every buffer on the device: {:.3} ms; its bytes over the link: {:.3} ms)",
        r.step_us / 1e3,
        r.unbudgeted_step_us / 1e3,
        r.link_bound_us / 1e3
    );
    if c.bytes_both > 0 {
        let _ = writeln!(
            s,
            "  any plan moves at least {} in, {} out, {} both ways a step (before thunk {}, {} needed): {:.3} ms of link",
            gib(c.bytes_in),
            gib(c.bytes_out),
            gib(c.bytes_both),
            c.at_thunk,
            gib(c.needed_bytes),
            c.link_us / 1e3
        );
    }
    let _ = writeln!(s, "  prefetches: {}", r.prefetches.len());
    for p in r.prefetches.iter().take(SHOWN) {
        let _ = writeln!(
            s,
            "    {} before thunk {}{} for thunk {}",
            name(plan, r, p.buffer),
            p.issue_before,
            if p.from_previous_step {
                " of the previous step"
            } else {
                ""
            },
            p.needed_by
        );
    }
    let waited: f64 = r.waits.iter().fold(0.0, |a, w| a + w.wait_us);
    let _ = writeln!(
        s,
        "  thunks expected to wait: {} ({:.3} ms in all)",
        r.waits.len(),
        waited / 1e3
    );
    let mut waits = r.waits.clone();
    waits.sort_by(|a, b| b.wait_us.total_cmp(&a.wait_us));
    for w in waits.iter().take(SHOWN) {
        let _ = writeln!(
            s,
            "    thunk {} waits {:.3} ms for {}",
            w.thunk,
            w.wait_us / 1e3,
            name(plan, r, w.buffer)
        );
    }
    s
}

/// The `residency` member of `inspect --json`.
pub fn json(r: &ResidencyPlan, c: &MustCross) -> Value {
    let placements: Vec<Value> = r
        .placements
        .iter()
        .zip(&r.buffers)
        .map(|(p, b)| {
            json!({"allocation": b.id, "offset": b.offset, "bytes": b.bytes, "role": b.name,
                   "placement": p})
        })
        .collect();
    json!({
        "budget_bytes": r.budget_bytes,
        "total_bytes": r.total_bytes,
        "peak_device_bytes": r.peak_device_bytes,
        "resident_bytes": r.resident_bytes,
        "staging_bytes": r.staging_bytes,
        "bytes_in_per_step": r.bytes_in_per_step,
        "bytes_out_per_step": r.bytes_out_per_step,
        "bytes_in_place_per_step": r.bytes_in_place_per_step,
        "step_us": r.step_us,
        "unbudgeted_step_us": r.unbudgeted_step_us,
        "link_bound_us": r.link_bound_us,
        "must_cross": c,
        "placements": placements,
        "prefetches": r.prefetches,
        "evictions": r.evictions,
        "waits": r.waits,
    })
}

/// The VMM granularity the emulation rounds allocations to (CUDA's, 2 MiB).
const GRANULE: u64 = 2 << 20;

/// `--as-run`: the program planned as the plugin runs it under a device
/// memory limit: its parameters allocated first (in parameter order), its
/// own buffers at load after them (its small allocations packed in one,
/// `xla_vmm_runtime::program::own_layout`), each in device memory while
/// ordinary allocations stay under the limit less the staging reserve and
/// in host memory past it; then the staging its first run plans (what
/// `report()` shows on the GPU). An emulation of the allocation order a
/// JAX program usually has (`device_put` of the parameters, then the
/// executable's load).
pub struct AsRun {
    pub limit: u64,
    pub reserve_percent: u64,
    /// Device memory other programs hold (`--device-held`).
    pub held: u64,
    pub device_bytes: u64,
    pub host_bytes: u64,
    /// Parameters in device memory (the first N).
    pub device_params: usize,
    pub staging: Option<xla_vmm_runtime::staging::StagingPlan>,
    /// What its first run moves between device and host memory for its
    /// plan (`xla_vmm_policy::rebalance`), and the staging then.
    pub moved: Option<Moved>,
    /// Each allocation's home after the first run's moves, and the device
    /// room left then (the staging area every later program of the device
    /// plans in).
    pub homes_after: Vec<Home>,
    pub room_after: u64,
}

/// `--as-run`'s first-run moves.
pub struct Moved {
    pub moves: xla_vmm_policy::rebalance::Rebalance,
    pub staging: Option<xla_vmm_runtime::staging::StagingPlan>,
}

/// See [`AsRun`].
pub fn as_run(
    plan: &Plan,
    limit: u64,
    reserve_percent: u64,
    others: u64,
    rebalance: bool,
    rates: &RateArgs,
) -> anyhow::Result<AsRun> {
    use xla_vmm::AllocationRole;
    anyhow::ensure!(
        reserve_percent <= 90,
        "--staging-reserve {reserve_percent}: at most 90 (percent)"
    );
    let ceiling = limit / 100 * (100 - reserve_percent);
    // The allocator's small buffers share granules: counted by their bytes.
    let small = xla_vmm_device::vmm::VmmConfig::default().small_threshold;
    let held = |size: u64| {
        if size <= small {
            size
        } else {
            size.div_ceil(GRANULE) * GRANULE
        }
    };
    // The parameters first, in order, then the program's own buffers as it
    // lays them out: (allocations, bytes held, one that can move).
    let mut params: Vec<&xla_vmm::BufferAllocation> = plan
        .allocations
        .iter()
        .filter(|a| matches!(a.role, AllocationRole::Parameter { .. }))
        .collect();
    params.sort_by_key(|a| match a.role {
        AllocationRole::Parameter { number, .. } => number,
        _ => 0,
    });
    let mut order: Vec<(Vec<usize>, u64, bool, bool)> = params
        .iter()
        .map(|a| (vec![a.index], held(a.size), a.size > small, true))
        .collect();
    order.extend(
        xla_vmm_runtime::program::own_layout(plan, true)
            .into_iter()
            .map(|b| {
                // Shared temporaries never move (as the runtime keeps them).
                let alone = b.parts.len() == 1 && !b.temps;
                let parts = b.parts.iter().map(|p| p.0).collect();
                (parts, b.bytes.div_ceil(GRANULE) * GRANULE, alone, false)
            }),
    );
    let mut homes = vec![Home::Device; plan.allocations.len()];
    // What other programs hold is device memory first, never moved.
    let others = others.div_ceil(GRANULE) * GRANULE;
    let (mut device, mut host, mut device_params) = (others, 0u64, 0usize);
    let mut movable: Vec<(usize, u64)> = Vec::new();
    for (parts, bytes, can_move, param) in order {
        if bytes == 0 {
            continue;
        }
        let home = if device + bytes <= ceiling {
            device += bytes;
            device_params += usize::from(param);
            Home::Device
        } else {
            host += bytes;
            Home::Host
        };
        for &a in &parts {
            homes[a] = home;
        }
        // A parameter either way; the program's own buffer to host memory
        // only (as the runtime moves them).
        if can_move && (param || home == Home::Device) {
            movable.push((parts[0], bytes));
        }
    }
    let room = limit.saturating_sub(device) / GRANULE * GRANULE;
    // The plugin's buffers are immutable: its read-only parameters may stay
    // in the area from step to step.
    let staging = xla_vmm_runtime::staging::plan_staging(plan, &homes, room, rates.rates(), true)?;
    // At the first run its memory moves where its plan wants it: the
    // parameters above the allocator's small size and the program's own
    // buffers that hold one allocation.
    let (mut homes_after, mut room_after) = (homes.clone(), room);
    let moves = if rebalance {
        xla_vmm_runtime::staging::plan_moves(plan, &homes, room, rates.rates(), &movable, true)?
    } else {
        None
    };
    let moved = match moves {
        None => None,
        Some(moves) => {
            for &(a, h) in &moves.moves {
                homes_after[a] = h;
            }
            room_after = room + moves.freed_bytes - moves.taken_bytes;
            let staging = xla_vmm_runtime::staging::plan_staging(
                plan,
                &homes_after,
                room_after,
                rates.rates(),
                true,
            )?;
            Some(Moved { moves, staging })
        }
    };
    Ok(AsRun {
        limit,
        reserve_percent,
        held: others,
        device_bytes: device - others,
        host_bytes: host,
        device_params,
        staging,
        moved,
        homes_after,
        room_after,
    })
}

/// `--then`: a second program taking the first's parameters (by number, of
/// the same size: the same weights), loaded after the first ran, as the
/// plugin runs it: its parameters where the first's moves left them, its own
/// buffers in host memory (the first program's staging area took the room
/// the limit left), staged in that area (the device's programs share it; a
/// program moves memory only when its step is estimated longer than every
/// program's that did, and this emulation takes the second program for the
/// lighter). The inference bench's decode after its prefill, for one.
pub fn then_staging(
    first: &Plan,
    a: &AsRun,
    second: &Plan,
    rates: &RateArgs,
) -> anyhow::Result<Option<xla_vmm_runtime::staging::StagingPlan>> {
    use xla_vmm::AllocationRole;
    let params = |p: &Plan| -> std::collections::BTreeMap<u64, (usize, u64)> {
        p.allocations
            .iter()
            .filter_map(|x| match x.role {
                AllocationRole::Parameter { number, .. } => Some((number, (x.index, x.size))),
                _ => None,
            })
            .collect()
    };
    let (mine, theirs) = (params(second), params(first));
    let mut homes = vec![Home::Host; second.allocations.len()];
    for (number, &(index, size)) in &mine {
        match theirs.get(number) {
            Some(&(at, s)) if s == size => homes[index] = a.homes_after[at],
            // A parameter of its own: allocated when it is passed, after the
            // area took the room.
            _ => {}
        }
    }
    Ok(xla_vmm_runtime::staging::plan_staging(
        second,
        &homes,
        a.room_after,
        rates.rates(),
        true,
    )?)
}

/// `--then`'s readable lines.
pub fn then_text(file: &str, p: Option<&xla_vmm_runtime::staging::StagingPlan>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "then {file}, with the same parameters, in the staging area the first made:"
    );
    staging_text(&mut s, p);
    s
}

/// `--as-run`'s readable summary.
pub fn as_run_text(a: &AsRun) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "as run under a {} device memory limit (staging reserve {}%{}): {} in device memory ({} parameters first), {} in host memory",
        gib(a.limit),
        a.reserve_percent,
        if a.held > 0 {
            format!(", {} held by other programs", gib(a.held))
        } else {
            String::new()
        },
        gib(a.device_bytes),
        a.device_params,
        gib(a.host_bytes)
    );
    staging_text(&mut s, a.staging.as_ref());
    if let Some(m) = &a.moved {
        let r = &m.moves;
        let count = |h: Home| r.moves.iter().filter(|x| x.1 == h).count();
        let _ = writeln!(
            s,
            "its first run moves {} allocations ({}) to host memory and {} ({}) to the device (estimated step {:.2} -> {:.2} ms); then:",
            count(Home::Host),
            gib(r.freed_bytes),
            count(Home::Device),
            gib(r.taken_bytes),
            r.before_us / 1e3,
            r.after_us / 1e3
        );
        staging_text(&mut s, m.staging.as_ref());
    }
    s
}

/// The staging lines of `--as-run`'s summary.
fn staging_text(s: &mut String, p: Option<&xla_vmm_runtime::staging::StagingPlan>) {
    let Some(p) = p else {
        let _ = writeln!(
            s,
            "  nothing staged (nothing in host memory, or nothing pays to stage)"
        );
        return;
    };
    let m = p.summary();
    let _ = writeln!(
        s,
        "  staging area {}: {} buffers ({}) staged ({} of them, {}, kept from step to step; {}, {}, fetched by the step before), {} ({}) read in place; per step {} in, {} out",
        gib(m.area_bytes),
        m.staged,
        gib(m.staged_bytes),
        m.kept,
        gib(m.kept_bytes),
        m.carried,
        gib(m.carried_bytes),
        m.in_place,
        gib(m.in_place_bytes),
        gib(m.bytes_in_per_step),
        gib(m.bytes_out_per_step)
    );
    let touched = xla_vmm_policy::residency::touched_bytes(&p.input);
    let in_place = read_in_place(p, &touched);
    // What the link must carry: the copies, and what is read in place.
    let in_place_bytes: u64 = in_place.iter().map(|&i| touched[i]).sum();
    let bound_us = p
        .input
        .rates
        .link_us(m.bytes_in_per_step + in_place_bytes, m.bytes_out_per_step);
    let _ = writeln!(
        s,
        "  estimated step {:.2} ms as these copies run (every buffer on the device: {:.2} ms; the link's bytes: {:.2} ms; what any staging must move, {} in and {} out: {:.2} ms)",
        m.estimated_step_us / 1e3,
        m.unbudgeted_step_us / 1e3,
        bound_us / 1e3,
        gib(m.must_cross_in),
        gib(m.must_cross_out),
        m.must_cross_us / 1e3
    );
    let t = xla_vmm_policy::staging::timeline(&p.input, &p.placements, &p.copies);
    let [kernels, ins, homes] = tenths(&t).map(|row| {
        row.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    });
    let _ = writeln!(
        s,
        "  busy in each tenth of the step ({:.2} ms each), percent: kernels {kernels}; copies in {ins}; copies home {homes}",
        t.step_us / 1e4
    );
    let waits = longest_first(t.waits);
    let waited: f64 = waits.iter().map(|w| w.wait_us).sum();
    let _ = writeln!(
        s,
        "  thunks waiting for their copies in: {} ({:.2} ms in all), the longest:",
        waits.len(),
        waited / 1e3
    );
    for w in waits.iter().take(SHOWN) {
        let _ = writeln!(
            s,
            "    thunk {} {} waits {:.3} ms, the last copy to land {}: issued before thunk {}, {:.3} ms before it was needed; then {:.3} ms behind a copy home, {:.3} ms behind other copies in, {:.3} ms crossing",
            w.thunk,
            p.input.steps[w.thunk].name,
            w.wait_us / 1e3,
            region(&p.input.buffers[w.buffer]),
            w.issued_before,
            (w.landed_us - w.wait_us - w.ready_us) / 1e3,
            (w.free_us - w.ready_us) / 1e3,
            (w.started_us - w.free_us) / 1e3,
            (w.landed_us - w.started_us) / 1e3
        );
    }
    let crossed = crossings(p);
    if !crossed.is_empty() {
        let _ = writeln!(s, "  copied over the link, by bytes per step (in + out):");
        for c in crossed.iter().take(SHOWN) {
            let _ = writeln!(
                s,
                "    {}: {} in ({}x), {} out ({}x)",
                region(&p.input.buffers[c.buffer]),
                gib(c.bytes_in),
                c.copies_in,
                gib(c.bytes_out),
                c.copies_out
            );
        }
    }
    if in_place.is_empty() {
        return;
    }
    let _ = writeln!(s, "  read in place, by bytes over the link per step:");
    for &i in in_place.iter().take(SHOWN) {
        let by: Vec<String> = in_place_readers(&p.input, i)
            .iter()
            .take(READERS_SHOWN)
            .map(|&(t, bytes)| format!("thunk {t} {} ({})", p.input.steps[t].name, gib(bytes)))
            .collect();
        let _ = writeln!(
            s,
            "    {}: {}, by {}",
            region(&p.input.buffers[i]),
            gib(touched[i]),
            by.join(", ")
        );
    }
}

/// Thunks named per buffer read in place.
const READERS_SHOWN: usize = 4;

/// The buffers a staging reads in place (`touched`: their link bytes per
/// step), the most bytes first.
fn read_in_place(p: &xla_vmm_runtime::staging::StagingPlan, touched: &[u64]) -> Vec<usize> {
    let mut v: Vec<usize> = (0..p.placements.len())
        .filter(|&i| p.placements[i] == Placement::InPlace && touched[i] > 0)
        .collect();
    v.sort_by_key(|&i| (std::cmp::Reverse(touched[i]), i));
    v
}

/// The thunks that use buffer `b` of `input`, with the bytes each moves
/// over the link when `b` is read in place, the most first.
fn in_place_readers(
    input: &xla_vmm_policy::residency::ResidencyInput,
    b: usize,
) -> Vec<(usize, u64)> {
    let mut by: Vec<(usize, u64)> = input
        .steps
        .iter()
        .enumerate()
        .filter_map(|(t, step)| {
            let bytes: u64 = step
                .uses
                .iter()
                .filter(|u| u.buffer == b)
                .map(xla_vmm_policy::residency::in_place_traffic)
                .sum();
            (bytes > 0).then_some((t, bytes))
        })
        .collect();
    by.sort_by_key(|&(t, bytes)| (std::cmp::Reverse(bytes), t));
    by
}

/// What a staged buffer's copies carry over the link in one step.
struct Crossing {
    /// Index into the plan's buffers.
    buffer: usize,
    copies_in: u64,
    bytes_in: u64,
    copies_out: u64,
    bytes_out: u64,
}

/// Each staged buffer's copies per step (the ones the step before fetches
/// for it counted as its own), the most bytes first.
fn crossings(p: &xla_vmm_runtime::staging::StagingPlan) -> Vec<Crossing> {
    let n = p.input.buffers.len();
    let (mut ins, mut outs) = (vec![0u64; n], vec![0u64; n]);
    let c = &p.copies;
    let fetched = c.carried.iter().filter(|x| x.fetch).map(|x| x.buffer);
    for b in c.copies_in.iter().map(|x| x.buffer).chain(fetched) {
        ins[b] += 1;
    }
    for x in &c.copies_out {
        outs[x.buffer] += 1;
    }
    let mut all: Vec<Crossing> = (0..n)
        .filter(|&b| ins[b] + outs[b] > 0)
        .map(|b| {
            let bytes = p.input.buffers[b].bytes;
            Crossing {
                buffer: b,
                copies_in: ins[b],
                bytes_in: ins[b] * bytes,
                copies_out: outs[b],
                bytes_out: outs[b] * bytes,
            }
        })
        .collect();
    all.sort_by_key(|x| (std::cmp::Reverse(x.bytes_in + x.bytes_out), x.buffer));
    all
}

/// How busy the kernels, the copies in and the copies home of `t` keep
/// each tenth of its step, percent: where the step's time goes at a glance.
fn tenths(t: &xla_vmm_policy::staging::Timeline) -> [[u32; 10]; 3] {
    let tenth = t.step_us / 10.0;
    let mut busy = [[0.0f64; 10]; 3];
    let spans = t.thunks.iter().map(|x| (0, x.start_us, x.end_us)).chain(
        t.copies
            .iter()
            .map(|c| (1 + usize::from(c.home), c.started_us, c.done_us)),
    );
    for (row, a, b) in spans {
        for (i, cell) in busy[row].iter_mut().enumerate() {
            let (lo, hi) = (i as f64 * tenth, (i + 1) as f64 * tenth);
            *cell += (b.min(hi) - a.max(lo)).max(0.0);
        }
    }
    busy.map(|row| {
        row.map(|x| {
            if tenth > 0.0 {
                (100.0 * x / tenth).round().min(100.0) as u32
            } else {
                0
            }
        })
    })
}

/// A staging's waits (its [`xla_vmm_policy::staging::Timeline`]'s), the
/// longest first.
fn longest_first(
    mut w: Vec<xla_vmm_policy::staging::CopyWait>,
) -> Vec<xla_vmm_policy::staging::CopyWait> {
    w.sort_by(|a, b| b.wait_us.total_cmp(&a.wait_us).then(a.thunk.cmp(&b.thunk)));
    w
}

/// The `staging` member of `--as-run`'s JSON: the summary, the buffers
/// whose copies carry the most bytes per step, the waits longest first and
/// the buffers read in place: every one (the text shows the first few);
/// the estimate's `timeline`, every thunk's and copy's span (µs from the
/// step's start), to set beside a profiler's trace of the step
/// (`integration/diag/staging_vs_trace.py`).
fn staging_json(p: &xla_vmm_runtime::staging::StagingPlan) -> Value {
    let mut v = serde_json::to_value(p.summary()).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut v {
        let t = xla_vmm_policy::staging::timeline(&p.input, &p.placements, &p.copies);
        let thunks: Vec<Value> = t
            .thunks
            .iter()
            .zip(&p.input.steps)
            .map(|(x, step)| json!({"name": step.name, "start_us": x.start_us, "end_us": x.end_us}))
            .collect();
        let copies: Vec<Value> = t
            .copies
            .iter()
            .map(|c| {
                region_json(
                    &p.input.buffers[c.buffer],
                    json!({"home": c.home, "started_us": c.started_us, "done_us": c.done_us}),
                )
            })
            .collect();
        o.insert(
            "timeline".into(),
            json!({"step_us": t.step_us, "thunks": thunks, "copies": copies}),
        );
        let waits = longest_first(t.waits);
        o.insert(
            "copy_waits_us".into(),
            json!(waits.iter().map(|w| w.wait_us).sum::<f64>()),
        );
        let longest: Vec<Value> = waits
            .iter()
            .map(|w| {
                region_json(
                    &p.input.buffers[w.buffer],
                    json!({"thunk": w.thunk, "name": p.input.steps[w.thunk].name, "wait_us": w.wait_us,
                           "issued_before": w.issued_before, "ready_us": w.ready_us, "free_us": w.free_us,
                           "started_us": w.started_us, "landed_us": w.landed_us}),
                )
            })
            .collect();
        o.insert("longest_waits".into(), Value::Array(longest));
        let top: Vec<Value> = crossings(p)
            .iter()
            .map(|c| {
                region_json(
                    &p.input.buffers[c.buffer],
                    json!({
                    "copies_in": c.copies_in,
                    "bytes_in": c.bytes_in,
                    "copies_out": c.copies_out,
                    "bytes_out": c.bytes_out,
                    }),
                )
            })
            .collect();
        o.insert("most_copied".into(), Value::Array(top));
        let touched = xla_vmm_policy::residency::touched_bytes(&p.input);
        let in_place: Vec<Value> = read_in_place(p, &touched)
            .iter()
            .map(|&i| {
                let by: Vec<Value> = in_place_readers(&p.input, i)
                    .iter()
                    .map(|&(t, bytes)| json!({"thunk": t, "name": p.input.steps[t].name, "bytes": bytes}))
                    .collect();
                region_json(
                    &p.input.buffers[i],
                    json!({"link_bytes": touched[i], "by": by}),
                )
            })
            .collect();
        o.insert("read_in_place".into(), Value::Array(in_place));
    }
    v
}

/// The `as_run` member of `inspect --json`.
pub fn as_run_json(a: &AsRun) -> Value {
    json!({
        "limit_bytes": a.limit,
        "staging_reserve_percent": a.reserve_percent,
        "device_held_bytes": a.held,
        "device_bytes": a.device_bytes,
        "host_bytes": a.host_bytes,
        "device_parameters": a.device_params,
        "staging": a.staging.as_ref().map(staging_json),
        "first_run_moves": a.moved.as_ref().map(|m| json!({
            "to_host": m.moves.moves.iter().filter(|x| x.1 == Home::Host).map(|x| x.0).collect::<Vec<_>>(),
            "to_device": m.moves.moves.iter().filter(|x| x.1 == Home::Device).map(|x| x.0).collect::<Vec<_>>(),
            "to_host_bytes": m.moves.freed_bytes,
            "to_device_bytes": m.moves.taken_bytes,
            "estimated_step_us": m.moves.before_us,
            "estimated_step_us_after": m.moves.after_us,
            "staging": m.staging.as_ref().map(staging_json),
        })),
    })
}

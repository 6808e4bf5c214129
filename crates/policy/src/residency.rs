//! # Residency: which buffers live in device memory when a program does not fit
//!
//! The runtime knows, before the first step, every thunk of a program in
//! order and every buffer each thunk reads and writes. With a device memory
//! budget smaller than the program's buffers, this module decides from that
//! plain data ([`ResidencyInput`]) where each buffer lives and what moves over
//! the host link each step ([`ResidencyPlan`]), without a device and without
//! a profiling pass (AutoUVM guesses the same from a profile).
//!
//! ## The model
//!
//! A step is the program's thunks in order, loops unrolled by their trip
//! count (`steps`). A thunk's time is a roofline: the larger of its compute
//! (`flops / flops_per_s`) and its memory time, where bytes of buffers in
//! device memory move at HBM bandwidth and bytes read in place from host
//! memory at the link's. Transfers (prefetches, write-backs) use the link,
//! one at a time, overlapped with compute; copies in are laid out on the
//! link's timeline at its rate to the device, and the step can be no
//! shorter than the link needs for all of its traffic ([`Rates::link_us`]:
//! each direction at its own rate, both together at the rate of both at
//! once, which a full-duplex link makes more than one way's).
//!
//! A buffer is, for the whole step:
//! - [`Placement::Device`]: resident in device memory;
//! - [`Placement::Staged`]: at home in host memory, copied into a staging
//!   area of device memory ahead of the thunks that use it, dropped (or
//!   written back when dirty) when the area needs the room;
//! - [`Placement::InPlace`]: in host memory, read and written there by the
//!   kernels over the link.
//!
//! ## The rule
//!
//! 1. Everything fits: everything on the device, nothing moves.
//! 2. Per buffer, what it costs off the device per step: staged, its bytes
//!    over the link once in if it lives across steps and its first thunk
//!    needs them (not a whole overwrite), once out if the step writes it and
//!    it lives across steps (a temporary crosses nothing: it is born and
//!    dies in the area); in place, every byte its thunks touch. A buffer whose
//!    thunks touch fewer bytes than staging would move (an embedding row
//!    lookup) is read in place: its kernel's stall is small. Otherwise it is
//!    staged: its copy overlaps other thunks' compute, where reading it in
//!    place would stall its own thunk at the link's speed (the roofline
//!    gate).
//! 3. Resident set: buffers by off-device cost per byte, highest first, while
//!    they fit next to the staging area the rest needs: twice the largest
//!    thunk's staged bytes, so that one thunk's operands arrive while the
//!    previous one computes.
//! 4. Staging, per step in order, with the next use of every buffer known
//!    (Belady's choice is available): a staged buffer is fetched before its
//!    first use in a window, unless that use overwrites it whole or it is a
//!    temporary's first use in the step (it holds nothing yet); when the
//!    area is full the buffer used farthest in the future is evicted,
//!    written back only if dirty and read again. Steps repeat, so
//!    the schedule is computed over two steps and the second is kept: a
//!    weight used first thing in step i+1 is fetched at the end of step i.
//! 5. Each fetch is issued as early as the link and the area allow, so that
//!    it lands before its thunk; a thunk whose bytes are late waits
//!    ([`Wait`]).
//!
//! Everything is checked by [`ResidencyInput::validate`]; bad input is a
//! [`PolicyError`], never a panic.

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// One buffer of the program: an XLA buffer allocation, or a segment of one
/// (XLA packs a program's temporaries into one allocation whose regions
/// hold different values over the step: each region its slices use is
/// planned on its own).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// Its allocation index.
    pub id: usize,
    /// Where the segment starts in the allocation (0: the whole allocation).
    #[serde(default)]
    pub offset: u64,
    /// What it is (for people: `param 3`, `temp`, ...).
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// It lives across steps (a parameter, a constant, a live-out output):
    /// its bytes must be at home after the step when it is not resident.
    pub persistent: bool,
    /// Where its bytes are now, when the caller cannot move them (the
    /// runtime plans a bound program: its memory is allocated already).
    #[serde(default)]
    pub home: Home,
}

/// Where a buffer's bytes live, as far as the plan may choose.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Home {
    /// Anywhere: the plan places it (what `inspect` plans).
    #[default]
    Movable,
    /// In device memory already: resident, outside the budget.
    Device,
    /// In host memory: staged or read in place, never resident.
    Host,
}

/// One use of a buffer by a thunk.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Use {
    /// Index into [`ResidencyInput::buffers`].
    pub buffer: usize,
    /// Bytes the thunk touches (its slice).
    pub bytes: u64,
    /// The thunk reads them.
    pub read: bool,
    /// The thunk writes them.
    pub write: bool,
    /// Times the thunk reads the bytes when they lie in host memory: a GEMM
    /// reads an operand larger than the device's cache once per tile of the
    /// other side ([`gemm_reuse`]); 1 for everything else.
    #[serde(default = "one")]
    pub reuse: f64,
}

fn one() -> f64 {
    1.0
}

/// Operand bytes a GEMM's re-reads of host memory stay in the device's
/// cache below (half of the H200's 50 MB L2).
pub const CACHE_BYTES: u64 = 24 << 20;

/// The output tile of a GEMM kernel along each side, elements.
pub const GEMM_TILE: f64 = 128.0;

/// How often a GEMM reads an operand of `bytes` that lies in host memory
/// when the output has `other` rows (or columns) the operand does not
/// span: once per output tile along them, unless the operand fits the
/// cache.
pub fn gemm_reuse(bytes: u64, other: f64) -> f64 {
    if bytes <= CACHE_BYTES || !other.is_finite() {
        1.0
    } else {
        (other / GEMM_TILE).ceil().max(1.0)
    }
}

/// One thunk execution, in program order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThunkStep {
    /// Kind and `profile_annotation`.
    pub name: String,
    /// The buffers it reads and writes.
    pub uses: Vec<Use>,
    /// Arithmetic of the thunk when known (GEMMs), else 0 (then its time
    /// is its memory traffic's).
    pub flops: f64,
}

/// The device's rates.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Host link, bytes/s, host to device (H200: 55e9 measured): the rate
    /// of every copy in, of reads in place, and of the link's timeline.
    pub link_bytes_per_s: f64,
    /// Device memory, bytes/s (H200: 4.2e12 measured reads).
    pub hbm_bytes_per_s: f64,
    /// Arithmetic, flop/s (H200 dense bf16: ~7.9e14).
    pub flops_per_s: f64,
    /// Host link, device to host, bytes/s (write-backs). `0`: not known,
    /// the rate of `link_bytes_per_s`.
    #[serde(default)]
    pub link_out_bytes_per_s: f64,
    /// Host link, both directions at once: the bytes of both per second
    /// (twice one way's where the link is full duplex; an H100 measured 67e9
    /// against 47e9 in and 44e9 out). `0`: not known, one way's rate (the
    /// directions take turns: the cautious bound).
    #[serde(default)]
    pub link_both_bytes_per_s: f64,
}

impl Rates {
    /// The H200 figures measured on the GPU machine (host_vmm_probe).
    pub const H200: Rates = Rates {
        link_bytes_per_s: 55e9,
        hbm_bytes_per_s: 4.2e12,
        flops_per_s: 7.9e14,
        link_out_bytes_per_s: 0.0,
        link_both_bytes_per_s: 0.0,
    };

    /// The link's rate from device to host (`link_bytes_per_s` when not known).
    pub fn link_out(&self) -> f64 {
        if self.link_out_bytes_per_s > 0.0 {
            self.link_out_bytes_per_s
        } else {
            self.link_bytes_per_s
        }
    }

    /// Both directions' bytes per second when both run at once (one way's
    /// rate when not known).
    pub fn link_both(&self) -> f64 {
        if self.link_both_bytes_per_s > 0.0 {
            self.link_both_bytes_per_s
        } else {
            self.link_bytes_per_s.min(self.link_out())
        }
    }

    /// The least time, µs, in which the link carries `bytes_in` to the device
    /// and `bytes_out` to the host in one step: each direction at its own
    /// rate, both together at the rate of both at once.
    pub fn link_us(&self, bytes_in: u64, bytes_out: u64) -> f64 {
        let (i, o) = (bytes_in as f64, bytes_out as f64);
        self.link_us_of(i, o, i + o)
    }

    /// [`Rates::link_us`] where the bytes of both directions together are
    /// counted apart (a bound may know more of them than of each way).
    pub fn link_us_of(&self, bytes_in: f64, bytes_out: f64, bytes_both: f64) -> f64 {
        (bytes_in / self.link_bytes_per_s)
            .max(bytes_out / self.link_out())
            .max(bytes_both / self.link_both())
            * 1e6
    }
}

/// What the plan is made from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResidencyInput {
    /// The program's buffers.
    pub buffers: Vec<Buffer>,
    /// Its thunks in execution order (loops unrolled).
    pub steps: Vec<ThunkStep>,
    /// The device's rates.
    pub rates: Rates,
    /// Device memory the program's buffers may hold (resident + staging).
    pub budget_bytes: u64,
}

/// Where a buffer lives during the step.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Resident in device memory.
    Device,
    /// At home in host memory, staged into device memory ahead of its uses.
    Staged,
    /// In host memory, read and written there over the link.
    InPlace,
}

/// A copy from host memory into the staging area.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Prefetch {
    /// The buffer (index into the input's buffers).
    pub buffer: usize,
    /// Its size.
    pub bytes: u64,
    /// Issued before this thunk (index into the step), on the copy stream.
    pub issue_before: usize,
    /// First thunk that needs it.
    pub needed_by: usize,
    /// Issued during the previous step (the step's end, for its start).
    pub from_previous_step: bool,
}

/// A buffer leaving the staging area.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Eviction {
    /// The buffer (index into the input's buffers).
    pub buffer: usize,
    /// After this thunk (index into the step).
    pub after: usize,
    /// Written back to its home first (it was written since its fetch).
    pub write_back: bool,
}

/// A thunk expected to wait for its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Wait {
    /// The thunk (index into the step).
    pub thunk: usize,
    /// The buffer it waits for.
    pub buffer: usize,
    /// How long, µs.
    pub wait_us: f64,
}

/// The plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResidencyPlan {
    /// The budget the plan was made for.
    pub budget_bytes: u64,
    /// Bytes of every buffer: what the program would hold with no budget.
    pub total_bytes: u64,
    /// The input's buffers (what the indices below name).
    pub buffers: Vec<Buffer>,
    /// Per buffer, in order.
    pub placements: Vec<Placement>,
    /// Bytes of the buffers the plan makes resident (those already in
    /// device memory, [`Home::Device`], not counted: they are outside the
    /// budget).
    pub resident_bytes: u64,
    /// The staging area (the most staged bytes held at once).
    pub staging_bytes: u64,
    /// Resident + staging: never above the budget.
    pub peak_device_bytes: u64,
    /// Host to device per step (prefetches).
    pub bytes_in_per_step: u64,
    /// Device to host per step (write-backs of dirty staged buffers).
    pub bytes_out_per_step: u64,
    /// Bytes kernels read or write in host memory per step.
    pub bytes_in_place_per_step: u64,
    /// The copies into the staging area, in order.
    pub prefetches: Vec<Prefetch>,
    /// The buffers leaving it, in order.
    pub evictions: Vec<Eviction>,
    /// The thunks expected to wait for their bytes.
    pub waits: Vec<Wait>,
    /// Estimated step time with this plan, µs.
    pub step_us: f64,
    /// Estimated step time with every buffer on the device (the ceiling), µs.
    pub unbudgeted_step_us: f64,
    /// The link time of this plan's own traffic (copies and in-place
    /// bytes), µs.
    pub link_bound_us: f64,
}

impl ResidencyInput {
    /// Check every number and index.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(PolicyError::InvalidResidency(m));
        let r = &self.rates;
        for (name, v) in [
            ("link_bytes_per_s", r.link_bytes_per_s),
            ("hbm_bytes_per_s", r.hbm_bytes_per_s),
            ("flops_per_s", r.flops_per_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("rates.{name} = {v}: must be finite and positive"));
            }
        }
        for (name, v) in [
            ("link_out_bytes_per_s", r.link_out_bytes_per_s),
            ("link_both_bytes_per_s", r.link_both_bytes_per_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!(
                    "rates.{name} = {v}: must be finite and positive (0: not known)"
                ));
            }
        }
        for (i, t) in self.steps.iter().enumerate() {
            if !(t.flops.is_finite() && t.flops >= 0.0) {
                return bad(format!("thunk {i} ({}): flops = {}", t.name, t.flops));
            }
            for u in &t.uses {
                let Some(b) = self.buffers.get(u.buffer) else {
                    return bad(format!(
                        "thunk {i} ({}): buffer {} of {}",
                        t.name,
                        u.buffer,
                        self.buffers.len()
                    ));
                };
                if u.bytes > b.bytes {
                    return bad(format!(
                        "thunk {i} ({}): touches {} bytes of buffer {} ({} bytes)",
                        t.name, u.bytes, b.id, b.bytes
                    ));
                }
                if !(u.reuse.is_finite() && u.reuse >= 1.0) {
                    return bad(format!(
                        "thunk {i} ({}): reads buffer {} {} times",
                        t.name, b.id, u.reuse
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Per-buffer facts of one step.
struct Facts {
    /// Bytes its thunks move per step when it is read in place.
    touched: u64,
    written: bool,
    used: bool,
    /// Its first thunk in the step needs its bytes (reads them, or writes
    /// only part of them).
    first_needs: bool,
}

fn facts(input: &ResidencyInput) -> Vec<Facts> {
    let mut f: Vec<Facts> = input
        .buffers
        .iter()
        .map(|_| Facts {
            touched: 0,
            written: false,
            used: false,
            first_needs: false,
        })
        .collect();
    for t in &input.steps {
        // The first thunk using a buffer: does it need what is there?
        let mut first: Vec<(usize, bool, bool)> = Vec::new(); // buffer, reads, wholly written
        for u in t.uses.iter().filter(|u| !f[u.buffer].used) {
            let whole = u.write && u.bytes == input.buffers[u.buffer].bytes;
            match first.iter_mut().find(|x| x.0 == u.buffer) {
                Some(x) => {
                    x.1 |= u.read;
                    x.2 |= whole;
                }
                None => first.push((u.buffer, u.read, whole)),
            }
        }
        for (b, reads, whole) in first {
            f[b].first_needs = reads || !whole;
        }
        for u in &t.uses {
            let x = &mut f[u.buffer];
            x.touched = x.touched.saturating_add(in_place_traffic(u));
            x.written |= u.write;
            x.used = true;
        }
    }
    f
}

/// Bytes a use moves over the link when its buffer is read and written in
/// host memory: its reads (with a GEMM's re-reads) and its writes.
pub fn in_place_traffic(u: &Use) -> u64 {
    let reads = if u.read {
        (u.bytes as f64 * u.reuse.max(1.0)).min(u64::MAX as f64) as u64
    } else {
        0
    };
    reads
        .saturating_add(if u.write { u.bytes } else { 0 })
        .max(u.bytes)
}

/// Bytes a use moves in device memory: its slice read, written, or both.
fn traffic(u: &Use) -> u64 {
    u.bytes * (u64::from(u.read) + u64::from(u.write)).max(1)
}

/// µs of one thunk: compute against memory traffic (device at HBM speed,
/// host bytes at the link's).
pub(crate) fn thunk_us(t: &ThunkStep, placements: &[Placement], r: &Rates) -> f64 {
    let (mut dev, mut host) = (0.0, 0.0);
    for u in &t.uses {
        match placements[u.buffer] {
            Placement::InPlace => host += in_place_traffic(u) as f64,
            _ => dev += traffic(u) as f64,
        }
    }
    let mem = dev / r.hbm_bytes_per_s + host / r.link_bytes_per_s;
    (t.flops / r.flops_per_s).max(mem) * 1e6
}

/// Decide where each buffer lives (see the module docs).
pub fn plan_residency(input: &ResidencyInput) -> Result<ResidencyPlan> {
    plan_residency_with(input, Ties::Staged)
}

/// Where a buffer goes whose bytes in place equal what staging it moves
/// per step (a buffer one thunk reads and writes once: an optimizer's state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ties {
    /// Staged: its copies may overlap other thunks' compute.
    Staged,
    /// In place: it takes no room in the staging area, which goes to the
    /// buffers staging serves better (the JAX train step at 2x: 94.7 ms
    /// planned against 99.3; llama_scan_bf16 under 20 MiB: 0.87 against
    /// 0.66: neither rule is the better everywhere).
    InPlace,
}

/// [`plan_residency`] with ties broken as `ties` says.
pub fn plan_residency_with(input: &ResidencyInput, ties: Ties) -> Result<ResidencyPlan> {
    input.validate()?;
    let n = input.buffers.len();
    let total: u64 = input.buffers.iter().map(|b| b.bytes).sum();
    let f = facts(input);
    let link = input.rates.link_bytes_per_s;
    let all_device = vec![Placement::Device; n];
    let unbudgeted: f64 = input
        .steps
        .iter()
        .map(|t| thunk_us(t, &all_device, &input.rates))
        .sum();
    let fixed = |h: Home| input.buffers.iter().filter(move |b| b.home == h);
    let movable: u64 = total - fixed(Home::Device).map(|b| b.bytes).sum::<u64>();
    if fixed(Home::Host).next().is_none() && movable <= input.budget_bytes {
        return Ok(ResidencyPlan {
            budget_bytes: input.budget_bytes,
            total_bytes: total,
            buffers: input.buffers.clone(),
            placements: all_device,
            resident_bytes: movable,
            staging_bytes: 0,
            peak_device_bytes: movable,
            bytes_in_per_step: 0,
            bytes_out_per_step: 0,
            bytes_in_place_per_step: 0,
            prefetches: Vec::new(),
            evictions: Vec::new(),
            waits: Vec::new(),
            step_us: unbudgeted,
            unbudgeted_step_us: unbudgeted,
            link_bound_us: 0.0,
        });
    }
    // Off the device, each buffer's way and the link bytes it costs per
    // step: read in place when that moves fewer bytes than staging (a light
    // touch, whose stall is small), else staged (its copies overlap other
    // thunks' compute, where in-place reads would stall its own).
    let off: Vec<(Placement, f64)> = input
        .buffers
        .iter()
        .zip(&f)
        .map(|(b, x)| {
            // Staged, what crosses per step: its bytes in when its first
            // thunk needs them and they live across steps (a temporary
            // holds nothing at the step's start), out when the step writes
            // them and they live across steps.
            let crossing = |yes: bool| if yes && b.persistent { b.bytes } else { 0 };
            let staged = crossing(x.first_needs) + crossing(x.written);
            if !x.used {
                (Placement::InPlace, 0.0)
            } else if x.touched < staged || (ties == Ties::InPlace && x.touched == staged) {
                (Placement::InPlace, x.touched as f64 / link)
            } else {
                (Placement::Staged, staged as f64 / link)
            }
        })
        .collect();
    // The staging area the staged rest needs at the least: the largest
    // thunk's staged bytes (its operands are present at once).
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        let d = |i: usize| off[i].1 / input.buffers[i].bytes.max(1) as f64;
        d(b).total_cmp(&d(a)).then(a.cmp(&b))
    });
    // Two ways to leave room for the staging area: the staged rest's
    // largest thunk once, or twice (double buffering: the next thunk's bytes
    // arrive while this one computes); the faster plan wins.
    let mut best: Option<ResidencyPlan> = None;
    for buffering in [1u64, 2] {
        let p = plan_with(input, &f, &off, &order, buffering, total, unbudgeted);
        if best.as_ref().is_none_or(|b| p.step_us < b.step_us) {
            best = Some(p);
        }
    }
    Ok(best.expect("two plans"))
}

/// [`plan_residency`] with room for `buffering` times the staged rest's
/// largest thunk.
fn plan_with(
    input: &ResidencyInput,
    f: &[Facts],
    off: &[(Placement, f64)],
    order: &[usize],
    buffering: u64,
    total: u64,
    unbudgeted: f64,
) -> ResidencyPlan {
    let n = input.buffers.len();
    let mut placements: Vec<Placement> = off
        .iter()
        .zip(&input.buffers)
        .map(|(o, b)| match b.home {
            Home::Device => Placement::Device,
            _ => o.0,
        })
        .collect();
    let mut resident = 0u64;
    // Each thunk's staged bytes ([`staged_bytes`], align 1) as buffers go
    // resident, and the thunks that use each buffer: a buffer made resident
    // takes its bytes off its thunks only.
    let mut staged: Vec<u64> = input
        .steps
        .iter()
        .map(|t| staged_bytes(t, &placements, &input.buffers, 1))
        .collect();
    let users = Users::new(input);
    for &i in order {
        let b = input.buffers[i].bytes;
        if !f[i].used || input.buffers[i].home != Home::Movable {
            continue;
        }
        // The largest thunk's staged bytes with `i` resident.
        let was_staged = placements[i] == Placement::Staged;
        let mut largest = 0u64;
        let mut mine = users.of(i).iter().peekable();
        for (k, &bytes) in staged.iter().enumerate() {
            let uses_it = mine.next_if_eq(&&k).is_some();
            largest = largest.max(if uses_it && was_staged {
                bytes - b
            } else {
                bytes
            });
        }
        if resident + b + buffering * largest <= input.budget_bytes {
            if was_staged {
                for &k in users.of(i) {
                    staged[k] -= b;
                }
            }
            placements[i] = Placement::Device;
            resident += b;
        }
    }
    // A staged buffer bigger than the area can never be staged: in place.
    let touched: Vec<u64> = f.iter().map(|x| x.touched).collect();
    let cap = input.budget_bytes - resident;
    // While the thunk with the most staged bytes needs more than the area,
    // its staged buffer that loses the least in place goes there.
    while let Some((worst, _)) = staged
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(_, bytes)| bytes)
        .filter(|&(_, need)| need > cap)
    {
        let gone = demote(input, &touched, &mut placements, Some(worst)).expect("a staged use");
        for &k in users.of(gone) {
            staged[k] -= input.buffers[gone].bytes;
        }
    }
    let in_place_bytes = |placements: &[Placement]| -> u64 {
        (0..n)
            .filter(|&i| placements[i] == Placement::InPlace)
            .map(|i| f[i].touched)
            .sum()
    };
    // Belady's choice moves the fewest bytes; choosing victims idle for a
    // copy's whole lead lets copies start early. The faster schedule wins.
    // A buffer the area is too small for (fetched again and again: more
    // bytes over the link than its thunks touch) is read in place instead,
    // and the staging planned again.
    let sched = loop {
        let inplace = in_place_bytes(&placements);
        let sched = [false, true]
            .into_iter()
            .map(|early| schedule(input, &placements, cap, early, inplace))
            .min_by(|a, b| a.step_us.total_cmp(&b.step_us))
            .expect("two schedules");
        let mut moved = vec![0u64; n];
        for p in &sched.prefetches {
            moved[p.buffer] += p.bytes;
        }
        for e in sched.evictions.iter().filter(|e| e.write_back) {
            moved[e.buffer] += input.buffers[e.buffer].bytes;
        }
        let thrashing = (0..n)
            .filter(|&i| placements[i] == Placement::Staged && moved[i] > f[i].touched)
            .max_by_key(|&i| moved[i] - f[i].touched);
        match thrashing {
            Some(i) => placements[i] = Placement::InPlace,
            None => break sched,
        }
    };
    let in_place = in_place_bytes(&placements);
    // In-place traffic counted with the copies in (mostly reads).
    let link_bound = input
        .rates
        .link_us(sched.bytes_in + in_place, sched.bytes_out);
    ResidencyPlan {
        budget_bytes: input.budget_bytes,
        total_bytes: total,
        buffers: input.buffers.clone(),
        resident_bytes: resident,
        staging_bytes: sched.peak,
        peak_device_bytes: resident + sched.peak,
        bytes_in_per_step: sched.bytes_in,
        bytes_out_per_step: sched.bytes_out,
        bytes_in_place_per_step: in_place,
        prefetches: sched.prefetches,
        evictions: sched.evictions,
        waits: sched.waits,
        step_us: sched.step_us,
        unbudgeted_step_us: unbudgeted,
        link_bound_us: link_bound,
        placements,
    }
}

/// Bytes each buffer's thunks touch per step (reads and writes of their
/// slices), what reading it in place would move over the link.
pub fn touched_bytes(input: &ResidencyInput) -> Vec<u64> {
    facts(input).iter().map(|x| x.touched).collect()
}

/// Read one staged buffer in place instead, to leave the staging area more
/// room: among those thunk `among` uses (any, when `None`), the one that
/// loses the least there, i.e. touches the fewest bytes per step per byte of
/// area it frees (`touched`: [`touched_bytes`]); among equals the largest.
/// A weight read once per step moves its bytes over the link either way;
/// a temporary that thunk after thunk reads and writes would move its bytes
/// many times. Returns the buffer, `None` when nothing is staged there.
pub fn demote(
    input: &ResidencyInput,
    touched: &[u64],
    placements: &mut [Placement],
    among: Option<usize>,
) -> Option<usize> {
    let staged = |i: &usize| placements.get(*i) == Some(&Placement::Staged);
    let loss = |i: usize| {
        let b = input.buffers[i].bytes.max(1);
        (touched.get(i).copied().unwrap_or(0) as f64 / b as f64, b)
    };
    let pick = |cands: &mut dyn Iterator<Item = usize>| {
        cands.filter(staged).min_by(|&a, &b| {
            let ((la, ba), (lb, bb)) = (loss(a), loss(b));
            la.total_cmp(&lb).then(bb.cmp(&ba)).then(a.cmp(&b))
        })
    };
    let victim = match among.and_then(|k| input.steps.get(k)) {
        Some(t) => pick(&mut t.uses.iter().map(|u| u.buffer)),
        None => pick(&mut (0..input.buffers.len())),
    }?;
    placements[victim] = Placement::InPlace;
    Some(victim)
}

/// Per buffer, the thunks that use it, in order, each once.
struct Users {
    of: Vec<Vec<usize>>,
    /// The step's thunks.
    m: usize,
}

impl Users {
    fn new(input: &ResidencyInput) -> Self {
        let mut of: Vec<Vec<usize>> = vec![Vec::new(); input.buffers.len()];
        for (k, t) in input.steps.iter().enumerate() {
            for u in &t.uses {
                if of[u.buffer].last() != Some(&k) {
                    of[u.buffer].push(k);
                }
            }
        }
        Users {
            of,
            m: input.steps.len(),
        }
    }

    fn of(&self, b: usize) -> &[usize] {
        &self.of[b]
    }

    /// In the step repeated `rounds` times (position `p` is thunk `p % m`),
    /// the first position after `after` whose thunk uses `b`; `usize::MAX`
    /// for none.
    fn next_use(&self, b: usize, after: usize, rounds: usize) -> usize {
        let (ks, m) = (&self.of[b], self.m);
        let Some(from) = after.checked_add(1).filter(|_| m > 0) else {
            return usize::MAX;
        };
        let (round, at) = (from / m, from % m);
        let p = match ks.get(ks.partition_point(|&k| k < at)) {
            Some(&k) => round * m + k,
            None => ks.first().map_or(usize::MAX, |&k| (round + 1) * m + k),
        };
        if p < rounds * m {
            p
        } else {
            usize::MAX
        }
    }
}

/// `t`'s distinct staged buffers.
fn staged_ids(t: &ThunkStep, placements: &[Placement]) -> Vec<usize> {
    let mut ids: Vec<usize> = t
        .uses
        .iter()
        .filter(|u| placements[u.buffer] == Placement::Staged)
        .map(|u| u.buffer)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Bytes of `t`'s distinct staged buffers, each as the area places it:
/// from its offset modulo `align` to a multiple of `align` (1: its bytes).
fn staged_bytes(t: &ThunkStep, placements: &[Placement], buffers: &[Buffer], align: u64) -> u64 {
    let align = align.max(1);
    staged_ids(t, placements)
        .iter()
        .map(|&i| (buffers[i].bytes + buffers[i].offset % align).div_ceil(align) * align)
        .sum()
}

/// The most staged bytes one thunk holds at once ([`staged_bytes`] with
/// `align`).
pub(crate) fn largest_staged_thunk(
    input: &ResidencyInput,
    placements: &[Placement],
    align: u64,
) -> u64 {
    input
        .steps
        .iter()
        .map(|t| staged_bytes(t, placements, &input.buffers, align))
        .max()
        .unwrap_or(0)
}

struct Schedule {
    peak: u64,
    bytes_in: u64,
    bytes_out: u64,
    prefetches: Vec<Prefetch>,
    evictions: Vec<Eviction>,
    waits: Vec<Wait>,
    step_us: f64,
}

/// One staged buffer in the area.
struct Held {
    buffer: usize,
    dirty: bool,
}

/// Belady staging over two repetitions of the step; the second is reported
/// (see the module docs). `early`: victims are taken among the buffers idle
/// for the fetch's whole lead when there are such (Belady among them), so
/// that its copy can start early; else Belady among all.
/// A fetch: (position needed, buffer, first position the area has room).
type Fetch = (usize, usize, usize);
/// An eviction: (after position, buffer, written back).
type Evict = (usize, usize, bool);
/// An issued fetch: (issue position, needed position, buffer).
type Issued = (usize, usize, usize);
/// A wait: (position, buffer, µs late).
type Late = (usize, usize, f64);

/// Belady over two repetitions of the step: the fetches (position needed,
/// buffer, first position the area has room for it), the evictions (after
/// position, buffer, written back) and the peak bytes held. `dur`: each
/// thunk's µs.
fn belady(
    input: &ResidencyInput,
    placements: &[Placement],
    cap: u64,
    early: bool,
    dur: &[f64],
) -> (Vec<Fetch>, Vec<Evict>, u64) {
    let steps = &input.steps;
    let m = steps.len();
    let buffers = &input.buffers;
    let link = input.rates.link_bytes_per_s;
    // Uses of staged buffers at each position of the doubled sequence.
    let at = |k: usize| &steps[k % m];
    // Per staged buffer of thunk k: (buffer, written, its old bytes are
    // needed: read, or not wholly overwritten).
    // A temporary holds nothing at the start of a step: its first use in a
    // step needs no bytes, whatever the access says.
    let mut first_use = vec![usize::MAX; buffers.len()];
    for (k, t) in steps.iter().enumerate() {
        for u in &t.uses {
            first_use[u.buffer] = first_use[u.buffer].min(k);
        }
    }
    let needs_bytes = |k: usize, b: usize| -> bool {
        if !buffers[b].persistent && first_use[b] == k % m {
            return false;
        }
        let uses = at(k).uses.iter().filter(|u| u.buffer == b);
        let (mut read, mut whole) = (false, false);
        for u in uses {
            read |= u.read;
            whole |= u.write && u.bytes == buffers[b].bytes;
        }
        read || !whole
    };
    let staged_at = |k: usize| -> Vec<(usize, bool, bool)> {
        let mut v: Vec<(usize, bool, bool)> = Vec::new();
        for u in &at(k).uses {
            if placements[u.buffer] != Placement::Staged {
                continue;
            }
            match v.iter_mut().find(|x| x.0 == u.buffer) {
                Some(x) => x.1 |= u.write,
                None => v.push((u.buffer, u.write, needs_bytes(k, u.buffer))),
            }
        }
        v
    };
    let users = Users::new(input);
    let next_use = |b: usize, after: usize| -> usize { users.next_use(b, after, 3) };
    // Belady over positions 0..2m: fetches (position needed, and the first
    // position the area has room for them) and evictions. A victim leaves
    // right after its last use before the fetch that needs its room, so
    // the fetch can start there.
    let mut held: Vec<Held> = Vec::new();
    let mut used = 0u64;
    let mut peak = 0u64;
    let mut last_use = vec![0usize; buffers.len()];
    let mut fetches: Vec<Fetch> = Vec::new();
    let mut evictions: Vec<Evict> = Vec::new();
    for k in 0..2 * m {
        let need = staged_at(k);
        for &(b, _, wants_bytes) in &need {
            if held.iter().any(|h| h.buffer == b) {
                continue;
            }
            let bytes = buffers[b].bytes;
            // Where its copy should start to land in time, and the victims:
            // Belady's (farthest next use) among the buffers idle since
            // then, else since later, so that the copy can start early.
            let lead_us = bytes as f64 / link * 1e6;
            let mut want = k;
            let mut ahead = 0.0;
            while want > 0 && ahead < lead_us {
                want -= 1;
                ahead += dur[want % m];
            }
            let mut room_from = 0;
            let mut idle_since = if early { want } else { k };
            while used + bytes > cap {
                let victim = held
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| !need.iter().any(|x| x.0 == h.buffer))
                    .filter(|(_, h)| last_use[h.buffer] < idle_since.max(1) || idle_since >= k)
                    .map(|(i, h)| (i, next_use(h.buffer, k)))
                    .max_by_key(|&(_, nu)| nu);
                let Some((vi, _)) = victim else {
                    if idle_since >= k {
                        // Only this thunk's own buffers are held: they fit
                        // (the area holds the largest thunk), so never here.
                        break;
                    }
                    // On to the first later start at which a buffer is idle
                    // (or to `k`: any buffer not this thunk's).
                    let idle_from = held
                        .iter()
                        .filter(|h| !need.iter().any(|x| x.0 == h.buffer))
                        .map(|h| last_use[h.buffer] + 1)
                        .min()
                        .map_or(k, |s| s.min(k));
                    idle_since = (idle_since + 1).max(idle_from);
                    continue;
                };
                let h = held.remove(vi);
                used -= buffers[h.buffer].bytes;
                let after = last_use[h.buffer];
                room_from = room_from.max(after + 1);
                // Dirty bytes go home if anyone reads them again: the step
                // after (a persistent buffer), or its next use.
                let next = next_use(h.buffer, k);
                let wanted = buffers[h.buffer].persistent
                    || (next != usize::MAX && needs_bytes(next, h.buffer));
                evictions.push((after, h.buffer, h.dirty && wanted));
            }
            held.push(Held {
                buffer: b,
                dirty: false,
            });
            used += bytes;
            // Wholly overwritten before any read: room, no copy.
            if wants_bytes {
                fetches.push((k, b, room_from));
            }
        }
        for &(b, w, _) in &need {
            last_use[b] = k;
            if w {
                if let Some(h) = held.iter_mut().find(|h| h.buffer == b) {
                    h.dirty = true;
                }
            }
        }
        peak = peak.max(used);
        // A persistent buffer written this step goes home at the step's end
        // (it stays staged, clean, for the next step's use).
        if k % m == m - 1 {
            for h in held.iter_mut() {
                if h.dirty && buffers[h.buffer].persistent {
                    evictions.push((k, h.buffer, true));
                    h.dirty = false;
                }
            }
        }
    }
    (fetches, evictions, peak)
}

/// The link's timeline over the doubled sequence: each fetch's issue
/// position, (issue position, needed position, buffer), and the waits
/// (position, buffer, µs late).
fn link_timeline(
    input: &ResidencyInput,
    fetches: &[Fetch],
    dur: &[f64],
) -> (Vec<Issued>, Vec<Late>) {
    let m = input.steps.len();
    let buffers = &input.buffers;
    let link = input.rates.link_bytes_per_s;
    // Link timeline over the doubled sequence: each fetch in need order, as
    // early as its room and the previous fetch allow, but no earlier than
    // it takes to land in time (an early fetch holds the area longer).
    let mut start_us = vec![0.0; 2 * m + 1];
    for k in 0..2 * m {
        start_us[k + 1] = start_us[k] + dur[k % m];
    }
    let mut link_free = 0.0f64;
    let mut waits_all: Vec<Late> = Vec::new();
    let mut delay = 0.0f64; // accumulated waits shift later thunks
    let mut issue: Vec<Issued> = Vec::new();
    let mut prev_issue = 0usize;
    for &(k, b, room_from) in fetches {
        let earliest = room_from.max(prev_issue).min(k);
        let dur_us = buffers[b].bytes as f64 / link * 1e6;
        let mut p = k;
        while p > earliest && start_us[k] - start_us[p] < dur_us {
            p -= 1;
        }
        let t0 = (start_us[p] + delay).max(link_free);
        let t1 = t0 + dur_us;
        link_free = t1;
        let late = t1 - (start_us[k] + delay);
        if late > 0.0 {
            delay += late;
            waits_all.push((k, b, late));
        }
        prev_issue = p;
        issue.push((p, k, b));
    }
    (issue, waits_all)
}

fn schedule(
    input: &ResidencyInput,
    placements: &[Placement],
    cap: u64,
    early: bool,
    in_place_bytes: u64,
) -> Schedule {
    let m = input.steps.len();
    let buffers = &input.buffers;
    let dur: Vec<f64> = (0..m)
        .map(|k| thunk_us(&input.steps[k], placements, &input.rates))
        .collect();
    let (fetches, evictions, peak) = belady(input, placements, cap, early, &dur);
    let (issue, waits_all) = link_timeline(input, &fetches, &dur);
    // Report the second repetition (steady state).
    let second = |k: usize| k >= m && k < 2 * m;
    let bytes_in: u64 = issue
        .iter()
        .filter(|x| second(x.1))
        .map(|x| buffers[x.2].bytes)
        .sum();
    let bytes_out: u64 = evictions
        .iter()
        .filter(|e| e.2 && second(e.0))
        .map(|e| buffers[e.1].bytes)
        .sum();
    let prefetches = issue
        .iter()
        .filter(|x| second(x.1))
        .map(|&(p, k, b)| Prefetch {
            buffer: b,
            bytes: buffers[b].bytes,
            issue_before: p % m,
            needed_by: k % m,
            from_previous_step: p < m,
        })
        .collect();
    let evictions = evictions
        .iter()
        .filter(|e| second(e.0))
        .map(|&(after, buffer, write_back)| Eviction {
            buffer,
            after: after % m,
            write_back,
        })
        .collect();
    let waits: Vec<Wait> = waits_all
        .iter()
        .filter(|w| second(w.0))
        .map(|&(k, buffer, wait_us)| Wait {
            thunk: k % m,
            buffer,
            wait_us,
        })
        .collect();
    let compute: f64 = dur.iter().sum();
    let waited: f64 = waits.iter().map(|w| w.wait_us).sum();
    // The link carries the step's transfers and in-place traffic: it
    // bounds the step too.
    let link_us = input.rates.link_us(bytes_in + in_place_bytes, bytes_out);
    Schedule {
        peak,
        bytes_in,
        bytes_out,
        prefetches,
        evictions,
        waits,
        step_us: (compute + waited).max(link_us),
    }
}

/// Small builders for the planner's tests (here and in `crate::staging`).
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub const MB: u64 = 1 << 20;

    /// Buffer `id` of `mb` MiB, anywhere.
    pub fn buf(id: usize, mb: u64, persistent: bool) -> Buffer {
        Buffer {
            id,
            offset: 0,
            name: format!("b{id}"),
            bytes: mb * MB,
            persistent,
            home: Home::Movable,
        }
    }

    /// A thunk using `(buffer, MiB, read, write)`.
    pub fn thunk(name: &str, list: &[(usize, u64, bool, bool)], flops: f64) -> ThunkStep {
        ThunkStep {
            name: name.into(),
            uses: list
                .iter()
                .map(|&(buffer, mb, read, write)| Use {
                    buffer,
                    bytes: mb * MB,
                    read,
                    write,
                    reuse: 1.0,
                })
                .collect(),
            flops,
        }
    }

    pub fn input(buffers: Vec<Buffer>, steps: Vec<ThunkStep>, budget_mb: u64) -> ResidencyInput {
        ResidencyInput {
            buffers,
            steps,
            rates: Rates::H200,
            budget_bytes: budget_mb * MB,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    /// A thunk using `(buffer, MiB, written)`: read when not written.
    fn step(name: &str, list: &[(usize, u64, bool)], flops: f64) -> ThunkStep {
        let four: Vec<_> = list.iter().map(|&(b, mb, w)| (b, mb, !w, w)).collect();
        thunk(name, &four, flops)
    }

    #[test]
    fn next_use_is_the_first_later_position_whose_thunk_uses_the_buffer() {
        // Five thunks; buffer 0 used by thunks 1 and 3 (3 twice), buffer 1
        // by thunk 0, buffer 2 by none.
        let buffers = (0..3).map(|i| buf(i, 1, true)).collect();
        let uses: [&[(usize, u64, bool)]; 5] = [
            &[(1, 1, false)],
            &[(0, 1, false)],
            &[],
            &[(0, 1, false), (0, 1, true)],
            &[],
        ];
        let steps = uses.iter().map(|u| step("t", u, 1e6)).collect();
        let x = input(buffers, steps, 1);
        let users = Users::new(&x);
        assert_eq!(users.of(0), &[1, 3]);
        let m = x.steps.len();
        for rounds in 1..=3 {
            for b in 0..3 {
                for after in 0..rounds * m + 2 {
                    let scan = (after + 1..rounds * m)
                        .find(|&p| x.steps[p % m].uses.iter().any(|u| u.buffer == b))
                        .unwrap_or(usize::MAX);
                    assert_eq!(
                        users.next_use(b, after, rounds),
                        scan,
                        "b{b} after {after}, {rounds} rounds"
                    );
                }
            }
        }
        assert_eq!(users.next_use(0, usize::MAX, 3), usize::MAX);
    }

    /// Optimizer state: three 300 MB buffers living across steps, each read
    /// and written by one thunk of `flops` each step.
    fn optimizer_state(flops: f64) -> (Vec<Buffer>, Vec<ThunkStep>) {
        let buffers = (0..3).map(|i| buf(i, 300, true)).collect();
        let steps = (0..3)
            .map(|i| {
                step(
                    &format!("adam{i}"),
                    &[(i, 300, false), (i, 300, true)],
                    flops,
                )
            })
            .collect();
        (buffers, steps)
    }

    /// A layered model: 8 weights of 100 MB read once each by a matmul that
    /// computes 1 ms; an activation of 10 MB read and written by every layer.
    fn layers(budget_mb: u64) -> ResidencyInput {
        let mut buffers: Vec<Buffer> = (0..8).map(|i| buf(i, 100, true)).collect();
        buffers.push(buf(8, 10, false));
        let steps = (0..8)
            .map(|i| {
                step(
                    &format!("layer{i}"),
                    &[(i, 100, false), (8, 10, true)],
                    7.9e11,
                )
            })
            .collect();
        ResidencyInput {
            buffers,
            steps,
            rates: Rates::H200,
            budget_bytes: budget_mb * MB,
        }
    }

    #[test]
    fn everything_fits_nothing_moves() {
        let p = plan_residency(&layers(1000)).unwrap();
        assert!(p.placements.iter().all(|x| *x == Placement::Device));
        assert_eq!((p.bytes_in_per_step, p.bytes_out_per_step), (0, 0));
        assert_eq!(p.peak_device_bytes, 810 * MB);
        assert!(p.waits.is_empty());
    }

    #[test]
    fn at_twice_the_budget_weights_are_staged_under_the_budget_with_belady() {
        let input = layers(405);
        let p = plan_residency(&input).unwrap();
        assert!(p.peak_device_bytes <= input.budget_bytes, "{p:?}");
        // The activation is reused by every layer: resident.
        assert_eq!(p.placements[8], Placement::Device);
        let staged = p
            .placements
            .iter()
            .filter(|x| **x == Placement::Staged)
            .count();
        let resident = p
            .placements
            .iter()
            .filter(|x| **x == Placement::Device)
            .count();
        assert!(staged >= 4 && resident >= 2, "{:?}", p.placements);
        // Read-only weights are dropped, never written back.
        assert_eq!(p.bytes_out_per_step, 0, "{:?}", p.evictions);
        // A staged weight crosses at most once per step; what the area
        // keeps across the step boundary (Belady) does not cross at all.
        assert!(p.bytes_in_per_step <= staged as u64 * 100 * MB, "{p:?}");
        assert!(
            p.bytes_in_per_step + p.staging_bytes >= staged as u64 * 100 * MB,
            "{p:?}"
        );
        assert!(p.evictions.iter().all(|e| !e.write_back));
        // 100 MB at 55 GB/s is 1.8 ms against 1 ms of compute per layer:
        // the step is link bound, within the bytes that must cross.
        assert!(p.step_us >= p.link_bound_us * 0.99, "{p:?}");
        assert!(p.step_us > p.unbudgeted_step_us);
        // Double buffered: each weight is fetched while the thunk before its
        // own computes (or in the previous step, for the step's first).
        for f in &p.prefetches {
            assert!(
                f.issue_before < f.needed_by || f.from_previous_step,
                "{f:?}"
            );
        }
        assert!(p.staging_bytes >= 200 * MB, "{p:?}");
    }

    #[test]
    fn a_tie_between_in_place_and_staged_goes_as_asked() {
        // Optimizer state read and written once a step: in place moves what
        // staging moves (in and out once). Staged by default; in place when
        // asked, and then no area is needed: more of it stays on the device.
        let (buffers, steps) = optimizer_state(1e9);
        let input = input(buffers, steps, 700);
        let staged = plan_residency(&input).unwrap();
        let ties = plan_residency_with(&input, Ties::InPlace).unwrap();
        let count =
            |p: &ResidencyPlan, x: Placement| p.placements.iter().filter(|&&y| y == x).count();
        assert!(
            count(&staged, Placement::Staged) > 0,
            "{:?}",
            staged.placements
        );
        assert_eq!(
            count(&staged, Placement::InPlace),
            0,
            "{:?}",
            staged.placements
        );
        assert_eq!(count(&ties, Placement::Staged), 0, "{:?}", ties.placements);
        let in_place = count(&ties, Placement::InPlace);
        assert!(in_place > 0, "{:?}", ties.placements);
        assert!(count(&ties, Placement::Device) >= count(&staged, Placement::Device));
        assert!(ties.peak_device_bytes <= input.budget_bytes);
        assert_eq!(
            ties.bytes_in_place_per_step,
            in_place as u64 * 600 * MB,
            "read and written in place"
        );
    }

    #[test]
    fn a_lightly_touched_buffer_is_read_in_place() {
        // An embedding table of 400 MB of which a step reads 1 MB of rows.
        let mut input = layers(500);
        input.buffers.push(buf(9, 400, true));
        input
            .steps
            .insert(0, step("gather", &[(9, 1, false), (8, 10, true)], 0.0));
        let p = plan_residency(&input).unwrap();
        assert_eq!(p.placements[9], Placement::InPlace);
        assert_eq!(p.bytes_in_place_per_step, MB);
        assert!(p.peak_device_bytes <= input.budget_bytes);
    }

    #[test]
    fn fixed_homes_stay_where_they_are() {
        // Everything would fit; but buffer 0 is in host memory (never made
        // resident) and buffer 1 on the device already (outside the budget).
        let mut input = layers(1000);
        input.buffers[0].home = Home::Host;
        input.buffers[1].home = Home::Device;
        let p = plan_residency(&input).unwrap();
        assert_eq!(p.placements[0], Placement::Staged);
        assert_eq!(p.placements[1], Placement::Device);
        assert!(p.staging_bytes >= input.buffers[0].bytes);
        // Resident: the movable rest; the fixed buffer is not counted.
        let total: u64 = input.buffers.iter().map(|b| b.bytes).sum();
        let (b0, b1) = (input.buffers[0].bytes, input.buffers[1].bytes);
        assert_eq!(p.resident_bytes, total - b0 - b1);
        assert!(p.peak_device_bytes <= input.budget_bytes);
        // Only device homes: everything resident, none counted.
        let mut all = layers(1);
        all.buffers.iter_mut().for_each(|b| b.home = Home::Device);
        let p = plan_residency(&all).unwrap();
        assert!(p.placements.iter().all(|&x| x == Placement::Device));
        assert_eq!((p.resident_bytes, p.bytes_in_per_step), (0, 0));
    }

    #[test]
    fn in_host_memory_temporaries_and_whole_overwrites_are_staged_not_read_in_place() {
        // All in host memory: a weight read once (b0), a temporary written
        // then read twice (b1), an output written whole once (b2).
        let mut input = ResidencyInput {
            buffers: vec![buf(0, 100, true), buf(1, 100, false), buf(2, 100, true)],
            steps: vec![
                step("a", &[(0, 100, false), (1, 100, true)], 1e9),
                step("b", &[(1, 100, false), (2, 100, true)], 1e9),
                step("c", &[(1, 100, false)], 1e9),
            ],
            rates: Rates::H200,
            budget_bytes: 300 * MB,
        };
        input.buffers.iter_mut().for_each(|b| b.home = Home::Host);
        let p = plan_residency(&input).unwrap();
        assert_eq!(p.placements, vec![Placement::Staged; 3]);
        // In: the weight at most (the area may keep it across steps); out:
        // the output; the temporary never crosses.
        assert!(p.bytes_in_per_step <= 100 * MB);
        assert_eq!(p.bytes_out_per_step, 100 * MB);
        assert_eq!(p.bytes_in_place_per_step, 0);
    }

    #[test]
    fn written_persistent_buffers_go_home_once_per_step() {
        let (buffers, steps) = optimizer_state(1e9);
        let input = input(buffers, steps, 700);
        let p = plan_residency(&input).unwrap();
        assert!(p.peak_device_bytes <= input.budget_bytes);
        let staged: Vec<usize> = (0..3)
            .filter(|&i| p.placements[i] == Placement::Staged)
            .collect();
        assert!(!staged.is_empty(), "{:?}", p.placements);
        // Each is written every step and goes home at its end; what stays
        // in the area across the step boundary is not fetched again.
        assert_eq!(
            p.bytes_out_per_step,
            staged.len() as u64 * 300 * MB,
            "{:?}",
            p.evictions
        );
        assert!(
            p.bytes_in_per_step + p.staging_bytes >= p.bytes_out_per_step,
            "{p:?}"
        );
        assert!(p.bytes_in_per_step <= p.bytes_out_per_step, "{p:?}");
    }

    #[test]
    fn the_link_carries_both_directions_at_their_rates() {
        let gb = 1_000_000_000u64;
        // Unknown out and both-ways rates: one way's, the directions in turn.
        let half = Rates::H200;
        assert!((half.link_us(55 * gb, 55 * gb) - 2e6).abs() < 1e-6);
        // A full-duplex link: each direction at its own rate.
        let full = Rates {
            link_out_bytes_per_s: 50e9,
            link_both_bytes_per_s: 105e9,
            ..Rates::H200
        };
        assert!((full.link_us(55 * gb, 0) - 1e6).abs() < 1e-6);
        assert!((full.link_us(0, 50 * gb) - 1e6).abs() < 1e-6);
        assert!((full.link_us(55 * gb, 50 * gb) - 1e6).abs() < 1e-6);
        // One that shares (the H100 measured 47 in, 44 out, 67 both): both
        // at once bound it.
        let shared = Rates {
            link_bytes_per_s: 47e9,
            link_out_bytes_per_s: 44e9,
            link_both_bytes_per_s: 67e9,
            ..Rates::H200
        };
        assert!((shared.link_us(47 * gb, 44 * gb) - 91e9 / 67e9 * 1e6).abs() < 1e-3);
        assert!((shared.link_us(47 * gb, 0) - 1e6).abs() < 1e-6);
        // A negative or non-finite rate is bad input; 0 is "not known".
        let mut bad = layers(400);
        bad.rates.link_both_bytes_per_s = -1.0;
        assert!(plan_residency(&bad).is_err());
        bad.rates.link_both_bytes_per_s = f64::NAN;
        assert!(plan_residency(&bad).is_err());
        bad.rates.link_both_bytes_per_s = 0.0;
        assert!(plan_residency(&bad).is_ok());
    }

    #[test]
    fn a_step_that_writes_back_is_bound_by_the_link_both_ways() {
        // Optimizer state past the budget: read and written each step.
        let (buffers, steps) = optimizer_state(1e6);
        let half = plan_residency(&input(buffers.clone(), steps.clone(), 700)).unwrap();
        assert!(
            half.bytes_in_per_step > 0 && half.bytes_out_per_step > 0,
            "{half:?}"
        );
        let mut full_input = input(buffers, steps, 700);
        full_input.rates.link_both_bytes_per_s = 2.0 * Rates::H200.link_bytes_per_s;
        let full = plan_residency(&full_input).unwrap();
        // The same copies; the bound adds the directions only where they
        // take turns.
        assert_eq!(
            (full.bytes_in_per_step, full.bytes_out_per_step),
            (half.bytes_in_per_step, half.bytes_out_per_step)
        );
        let (i, o) = (
            half.bytes_in_per_step as f64,
            half.bytes_out_per_step as f64,
        );
        let link = Rates::H200.link_bytes_per_s;
        assert!(
            (half.link_bound_us - (i + o) / link * 1e6).abs() < 1e-3,
            "{half:?}"
        );
        assert!(
            (full.link_bound_us - i.max(o) / link * 1e6).abs() < 1e-3,
            "{full:?}"
        );
        assert!(
            full.step_us <= half.step_us,
            "{} > {}",
            full.step_us,
            half.step_us
        );
    }

    #[test]
    fn a_wholly_overwritten_buffer_takes_room_but_no_copy() {
        // Two big temporaries, each written whole by one thunk, then read.
        let buffers = vec![buf(0, 200, false), buf(1, 200, false), buf(2, 200, false)];
        let w = |b: usize| Use {
            buffer: b,
            bytes: 200 * MB,
            read: false,
            write: true,
            reuse: 1.0,
        };
        let r = |b: usize| Use {
            buffer: b,
            bytes: 200 * MB,
            read: true,
            write: false,
            reuse: 1.0,
        };
        let steps = vec![
            ThunkStep {
                name: "make0".into(),
                uses: vec![w(0)],
                flops: 0.0,
            },
            ThunkStep {
                name: "use0".into(),
                uses: vec![r(0), w(1)],
                flops: 0.0,
            },
            ThunkStep {
                name: "use1".into(),
                uses: vec![r(1), w(2)],
                flops: 0.0,
            },
            ThunkStep {
                name: "use2".into(),
                uses: vec![r(2)],
                flops: 0.0,
            },
        ];
        let input = input(buffers, steps, 420);
        let p = plan_residency(&input).unwrap();
        assert!(p.peak_device_bytes <= input.budget_bytes, "{p:?}");
        // Not persistent, overwritten before read: nothing crosses for the
        // staged ones.
        assert_eq!((p.bytes_in_per_step, p.bytes_out_per_step), (0, 0), "{p:?}");
    }

    #[test]
    fn random_programs_stay_under_their_budgets() {
        // A small xorshift: deterministic, no dependency.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        for case in 0..300 {
            let nb = 1 + rnd(12) as usize;
            let buffers: Vec<Buffer> = (0..nb).map(|i| buf(i, 1 + rnd(200), rnd(2) == 0)).collect();
            let steps: Vec<ThunkStep> = (0..1 + rnd(20))
                .map(|t| {
                    let list: Vec<(usize, u64, bool)> = (0..1 + rnd(4))
                        .map(|_| {
                            let b = rnd(nb as u64) as usize;
                            (b, 1 + rnd(buffers[b].bytes / MB), rnd(3) == 0)
                        })
                        .collect();
                    step(&format!("t{t}"), &list, rnd(1_000_000_000_000) as f64)
                })
                .collect();
            let total: u64 = buffers.iter().map(|b| b.bytes).sum();
            let budget = 1 + rnd(total + total / 4);
            let input = ResidencyInput {
                buffers,
                steps,
                rates: Rates::H200,
                budget_bytes: budget,
            };
            let p = plan_residency(&input).unwrap();
            assert!(p.peak_device_bytes <= budget, "case {case}: {p:?}");
            assert!(p.step_us.is_finite() && p.step_us >= 0.0, "case {case}");
            let staged: u64 = (0..input.buffers.len())
                .filter(|&i| p.placements[i] == Placement::Staged)
                .map(|i| input.buffers[i].bytes)
                .sum();
            // No staged buffer moves more bytes than its thunks touch (else
            // it is read in place); the step is no faster than its link.
            let touched: u64 = input
                .steps
                .iter()
                .flat_map(|t| &t.uses)
                .filter(|u| p.placements[u.buffer] == Placement::Staged)
                .map(|u| u.bytes)
                .sum();
            assert!(
                p.bytes_in_per_step + p.bytes_out_per_step <= touched.max(2 * staged),
                "case {case}: {p:?}"
            );
            assert!(p.step_us >= p.link_bound_us * 0.999, "case {case}: {p:?}");
        }
    }

    /// In host memory: two 40 MB weights read once per step, a 60 MB
    /// temporary that five thunks read and write. The last thunk needs a
    /// weight (read `reuse` times in place) and the temporary at once
    /// (100 MB) in a 90 MB area.
    fn weights_and_a_temporary(reuse: f64) -> ResidencyInput {
        let host = |id, mb, persistent| Buffer {
            home: Home::Host,
            ..buf(id, mb, persistent)
        };
        let mut steps = vec![thunk(
            "w0",
            &[(0, 40, true, false), (2, 60, false, true)],
            1e9,
        )];
        for k in 0..4 {
            steps.push(thunk(&format!("t{k}"), &[(2, 60, true, true)], 1e9));
        }
        let mut last = thunk("w1", &[(1, 40, true, false), (2, 60, true, false)], 1e12);
        last.uses[0].reuse = reuse;
        steps.push(last);
        input(
            vec![host(0, 40, true), host(1, 40, true), host(2, 60, false)],
            steps,
            90,
        )
    }

    #[test]
    fn an_area_too_small_reads_in_place_what_loses_least_there_a_weight_not_a_temporary() {
        // The weight, read once either way, goes in place; the temporary
        // stays staged.
        let input = weights_and_a_temporary(1.0);
        let p = plan_residency(&input).unwrap();
        assert_eq!(p.placements[2], Placement::Staged, "{:?}", p.placements);
        assert_eq!(p.placements[1], Placement::InPlace, "{:?}", p.placements);
        assert!(p.peak_device_bytes <= input.budget_bytes);
        // `demote` alone: among the last thunk's buffers, then among all.
        let touched = touched_bytes(&input);
        assert_eq!(touched, vec![40 * MB, 40 * MB, 60 * MB * 10]);
        let mut pl = vec![Placement::Staged; 3];
        assert_eq!(demote(&input, &touched, &mut pl, Some(5)), Some(1));
        assert_eq!(demote(&input, &touched, &mut pl, Some(5)), Some(2));
        assert_eq!(demote(&input, &touched, &mut pl, Some(5)), None);
        assert_eq!(demote(&input, &touched, &mut pl, None), Some(0));
        assert_eq!(pl, vec![Placement::InPlace; 3]);
    }

    #[test]
    fn a_gemm_that_rereads_its_weight_keeps_it_staged_over_a_temporary() {
        // A prefill GEMM reads its 40 MB weight once per 128 rows of a
        // 4096-row output (32 times) in place: the temporary (10 touches
        // per byte) is what goes in place now.
        assert_eq!(gemm_reuse(40 * MB, 4096.0), 32.0);
        assert_eq!(gemm_reuse(40 * MB, 8.0), 1.0, "decode: one tile");
        assert_eq!(gemm_reuse(CACHE_BYTES, 4096.0), 1.0, "in the cache");
        assert_eq!(gemm_reuse(40 * MB, f64::NAN), 1.0);
        let input = weights_and_a_temporary(gemm_reuse(40 * MB, 4096.0));
        assert_eq!(touched_bytes(&input)[1], 32 * 40 * MB);
        let p = plan_residency(&input).unwrap();
        assert_eq!(p.placements[1], Placement::Staged, "{:?}", p.placements);
        assert_eq!(p.placements[2], Placement::InPlace, "{:?}", p.placements);
        let mut bad = input;
        bad.steps[5].uses[0].reuse = 0.5;
        assert!(plan_residency(&bad).is_err());
    }

    #[test]
    fn a_thunk_larger_than_the_area_reads_in_place_and_bad_input_is_an_error() {
        // One thunk needs 500 MB at once under a 300 MB budget.
        let input = input(
            vec![buf(0, 250, true), buf(1, 250, true)],
            vec![step("big", &[(0, 250, false), (1, 250, false)], 1e12)],
            300,
        );
        let p = plan_residency(&input).unwrap();
        assert!(p.peak_device_bytes <= input.budget_bytes, "{p:?}");
        assert!(p.placements.contains(&Placement::InPlace));
        let mut bad = input.clone();
        bad.steps[0].uses[0].buffer = 7;
        assert!(plan_residency(&bad).is_err());
        let mut bad = input.clone();
        bad.rates.link_bytes_per_s = 0.0;
        assert!(plan_residency(&bad).is_err());
        let mut bad = input;
        bad.steps[0].uses[0].bytes = 251 * MB;
        assert!(plan_residency(&bad).is_err());
    }
}

//! # Staging: running a program whose memory is partly in host memory
//!
//! Past the device memory budget, allocations are host-located VMM memory
//! (`xla_vmm_device::budget`): kernels can read them in place, over the host
//! link, which is right for a light touch and ruinous for a GEMM that reads
//! its weights once per tile. At a program's first run, if any of its
//! memory (parameters as bound, its own temporaries and outputs) is in host
//! memory, the residency planner ([`xla_vmm_policy::residency`]) decides per
//! buffer: staged into a device staging area ahead of the thunks that use
//! it, or read in place; [`xla_vmm_policy::staging::stage`] turns that into
//! copies at area offsets. This module runs them.
//!
//! ## How a step runs
//!
//! The thunks are the program's top-level ops (sequences flattened; a loop
//! or a conditional is one unit, what any of its thunks touches staged
//! for all of it). Two copy streams, forked from the compute stream at the
//! step's start, carry the copies in and the copies home (the link runs
//! both ways at once). Before thunk `k`, the copies in issued there, after
//! an event on the compute stream (every earlier thunk is done with the
//! range) and after the copy home each must follow (its own bytes on their
//! way home, or the last occupant of its range on its way out); the compute
//! stream waits for each copy's event just before the thunk that needs it;
//! that thunk resolves the staged slices to the area (a redirect of the
//! slot table). A thunk that fills area bytes without a copy in (a whole
//! overwrite, a temporary's first use) waits for the copies home out of
//! that range. After thunk `k`, the copies home issued there (dirty bytes
//! read again, this step or the next). At the end the compute stream joins
//! both copy streams. The same calls are captured into a graph in the
//! graph modes (the copy streams join the capture through the fork event),
//! so every mode runs the same copies; with nothing in host memory nothing
//! here runs.
//!
//! The plan is made for the memory bound at the first run. A later run
//! whose buffers sit elsewhere is still correct (a staged buffer already in
//! device memory is copied device to device, one in host memory the plan
//! did not stage is read in place); only its speed is the plan's for the
//! first binding.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use xla_vmm::{AllocationRole, Plan, Slice, Thunk, ThunkKind};
use xla_vmm_device::vmm::{Phys, VaReservation, VmmContext};
use xla_vmm_device::{Backend, DevicePtr, EventStatus, MemLocation};
use xla_vmm_policy::rebalance::{rebalance_with, Moved, Rebalance};
use xla_vmm_policy::residency::{
    demote, plan_residency, plan_residency_with, touched_bytes, Home, Placement, Rates,
    ResidencyInput, ResidencyPlan, Ties, Use,
};
use xla_vmm_policy::staging::{carry, estimate_us, fastest_stage, keep, Staging as StagedSteps};
use xla_vmm_policy::PolicyError;

use crate::error::{Result, RuntimeError, Teardown};
use crate::exec::{run_op, ExecEnv, StagedRun};
use crate::ops::Op;
use crate::per_device::PerDevice;
use crate::slots::{DeviceBuffer, Redirect, SlotTable};

/// Device memory left free next to the area when the device has no
/// configured limit (the vendor libraries' workspaces, other programs).
const HEADROOM_BYTES: u64 = 1 << 30;

/// Area offsets are aligned to this (every kernel's operand alignment).
const ALIGN: u64 = 512;

/// What staging does for one program, per step (`report()`, the CLI).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StagingSummary {
    /// The device staging area.
    pub area_bytes: u64,
    /// Buffers (allocation segments) staged, and their bytes.
    pub staged: usize,
    pub staged_bytes: u64,
    /// Of the staged, those kept in the area from step to step (copied in
    /// only when the area lost them: `refills` steps so far), and their
    /// bytes.
    pub kept: usize,
    pub kept_bytes: u64,
    pub refills: u64,
    /// Of the staged, those the step before fetches for their first stay
    /// (its first ops do not wait for them; copied in before the step when
    /// the step before did not leave them there, a refill), and their bytes.
    pub carried: usize,
    pub carried_bytes: u64,
    /// Buffers read and written in host memory in place, and their bytes.
    pub in_place: usize,
    pub in_place_bytes: u64,
    /// Bytes of the program already in device memory.
    pub device_bytes: u64,
    /// Host to device and device to host per step.
    pub bytes_in_per_step: u64,
    pub bytes_out_per_step: u64,
    /// The planner's step estimate, and with everything on the device, µs.
    pub estimated_step_us: f64,
    pub unbudgeted_step_us: f64,
    /// What any staging of the program, its memory where it is, must move
    /// per step at the least, and the link's time for it, µs
    /// (`xla_vmm_policy::must_cross`).
    pub must_cross_in: u64,
    pub must_cross_out: u64,
    pub must_cross_us: f64,
    /// The host link it planned with, bytes/s: to the device, to the host,
    /// both at once (the device's measured link, else the H200's 55e9
    /// with the directions taking turns: the runtime's `device_rates`).
    pub link_bytes_per_s: f64,
    pub link_out_bytes_per_s: f64,
    pub link_both_bytes_per_s: f64,
    /// Measured on the device, the last step timed (`timed_steps` read
    /// back so far; 0: none yet): its time on the compute stream, µs; the
    /// link busy with its copies in, µs, and the rate they ran at, GB/s; the
    /// compute stream waiting for copies in, µs; its bytes in and out at
    /// the link's rate over its time. Eager runs time one step in
    /// [`CLOCK_EVERY`]; in the graph modes every replay records the clock
    /// (where the backend can: `DeviceInfo::graph_event_records`, not HIP)
    /// and one step in [`CLOCK_EVERY`] reads it (a read that finds two
    /// replays' events is dropped). Read back when the device has passed
    /// it, never waited for: at the next run, or when the summary is asked
    /// for.
    pub timed_steps: u64,
    pub gpu_step_us: f64,
    pub copy_in_us: f64,
    pub copy_in_gbps: f64,
    pub waited_us: f64,
    pub link_utilisation: f64,
}

impl StagingSummary {
    /// The link it planned with, as [`Rates`] (its link fields; the H200's
    /// device memory and arithmetic).
    pub fn link(&self) -> Rates {
        Rates {
            link_bytes_per_s: self.link_bytes_per_s,
            link_out_bytes_per_s: self.link_out_bytes_per_s,
            link_both_bytes_per_s: self.link_both_bytes_per_s,
            ..Rates::H200
        }
    }
}

/// One step in this many is timed and read back (the read-back makes one
/// driver call per copy in and per waiting op).
pub const CLOCK_EVERY: u64 = 8;

/// The events that time a step (all on the device's clock, recorded only on
/// timed steps, apart from the events the step itself needs) and what the
/// last one measured.
struct Clock<B: Backend> {
    /// On the compute stream at the step's start, and after the joins.
    start: B::Event,
    end: B::Event,
    /// Per copy in, on the stream of copies in, around it.
    started: Vec<B::Event>,
    done: Vec<B::Event>,
    /// Per op that waits for copies in: (op, before its waits, after them).
    waits: Vec<(usize, B::Event, B::Event)>,
    state: std::sync::Mutex<ClockState>,
}

#[derive(Default)]
struct ClockState {
    /// Eager runs so far.
    runs: u64,
    /// A timed step's events are recorded and not read back yet.
    unread: bool,
    /// A graph that runs records the events at every replay (captured with
    /// [`Backend::event_record_in_graph`]); steps since the last read.
    in_graph: bool,
    graph_steps: u64,
    /// A step was read back since [`Staging::take_fresh`] last asked.
    fresh: bool,
    reads: u64,
    /// The last step read back: (step, copying in, waited), µs.
    last: (f64, f64, f64),
}

/// One copy: the buffer's bytes at home, its place in the area.
struct Copy {
    home: Slice,
    area: u64,
    /// The copy home it follows (a copy in; index into `outs`).
    after_out: Option<usize>,
}

/// What happens around one top-level op.
#[derive(Default)]
struct Around {
    /// Copies in issued before it (indices into `ins`), after the compute
    /// stream's mark `issue`.
    ins: Vec<usize>,
    issue: Option<usize>,
    /// Copies in it waits for.
    waits: Vec<usize>,
    /// Copies home it waits for (it fills area bytes they read).
    waits_home: Vec<usize>,
    /// Copies home issued after it, after the mark `after`.
    outs: Vec<usize>,
    after: Option<usize>,
    /// The next step's carried copies issued before it (indices into
    /// `tails`), behind its copies in: their range is free since the op
    /// before.
    tails: Vec<usize>,
    /// Its staged bytes, in the area.
    redirects: Vec<Redirect>,
}

/// A program's staging: the area, the copy stream, the events and the
/// per-op actions.
pub(crate) struct Staging<B: Backend> {
    area: Area<B>,
    /// Copies in and copies home run on streams of their own (the link
    /// carries both ways at once).
    in_stream: B::Stream,
    out_stream: B::Stream,
    /// Fork (compute → copy streams) at the start; joins (copy streams →
    /// compute) at the end.
    fork: B::Event,
    joins: [B::Event; 2],
    ins: Vec<Copy>,
    outs: Vec<Copy>,
    /// One per copy in: it has landed; one per copy home: it is home.
    landed: Vec<B::Event>,
    homed: Vec<B::Event>,
    /// Recorded on the compute stream before issuing copies in / home.
    marks: Vec<B::Event>,
    around: Vec<Around>,
    /// The buffers kept in the area from step to step, what names the
    /// content each holds there (`None`: nothing yet), and this staging's
    /// token on the area.
    kept: Vec<Copy>,
    filled: std::sync::Mutex<Vec<Option<Content>>>,
    /// Buffers the step before fetches for their first stay
    /// ([`xla_vmm_policy::staging::carry`]): each one's copy (made before
    /// the step when the step before did not leave it there), the copies the
    /// step issues for the next one (`tails`; those after the last op:
    /// `tails_at_end`, after the mark `tail_mark`), and what names the
    /// content the last step that ran to its end carried, and the one this
    /// step carries.
    heads: Vec<Copy>,
    tails: Vec<Copy>,
    tails_at_end: Vec<usize>,
    tail_mark: Option<usize>,
    carried: std::sync::Mutex<Carried>,
    token: u64,
    /// Steps that copied kept buffers in.
    refills: AtomicU64,
    clock: Clock<B>,
    summary: StagingSummary,
}

/// What the carried buffers hold: at the start of the next step (the last
/// step that ran to its end carried them), and what this step carries.
#[derive(Default)]
struct Carried {
    ready: Vec<Option<Content>>,
    pending: Vec<Option<Content>>,
}

/// What [`Staging::plan`] made of a program.
pub(crate) enum Planned<B: Backend> {
    /// Staged through a device area.
    Staged(Box<Staging<B>>),
    /// Nothing of it is in host memory.
    AllOnDevice,
    /// Part of it is in host memory and its kernels read it in place: why.
    InPlace(&'static str),
}

/// What names a kept buffer's content: its allocation's id and generation
/// (a parameter under immutable buffers), or the program's own constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    Allocation { id: u64, generation: u64 },
    Constant,
}

/// The top-level thunks, sequences flattened.
fn thunk_units<'a>(thunks: &'a [Thunk], out: &mut Vec<&'a Thunk>) {
    for t in thunks {
        match &t.kind {
            ThunkKind::Sequential { thunks } => thunk_units(thunks, out),
            _ => out.push(t),
        }
    }
}

/// The top-level ops, sequences flattened (one per [`thunk_units`] entry:
/// a thunk loads into one op).
fn op_units<'a, B: Backend>(ops: &'a [Op<B>], out: &mut Vec<&'a Op<B>>) {
    for op in ops {
        match op {
            Op::Sequential(ops) => op_units(ops, out),
            _ => out.push(op),
        }
    }
}

fn has_async<B: Backend>(ops: &[&Op<B>]) -> bool {
    ops.iter()
        .any(|o| matches!(o, Op::AsyncStart { .. } | Op::AsyncDone { .. }))
}

/// The slices of temporary allocations `t` and its nested thunks use
/// (not a dynamic-slice fusion's embedded thunks: they address synthetic
/// allocations, their parent's own uses are the real ones), with their
/// access and a GEMM's re-reads.
fn temp_slices(
    t: &Thunk,
    is_temp: &dyn Fn(usize) -> bool,
    out: &mut Vec<(Slice, bool, bool, f64)>,
) {
    let reuse = crate::residency::operand_reuse(t);
    for (s, a) in t.own_uses() {
        if is_temp(s.allocation) {
            let x = reuse.iter().find(|r| r.0 == s).map_or(1.0, |r| r.1);
            out.push((s, a.reads(), a.writes(), x));
        }
    }
    for n in t.nested() {
        if !matches!(n, xla_vmm::Nested::Embedded(_)) {
            for c in n.thunks() {
                temp_slices(c, is_temp, out);
            }
        }
    }
}

/// The planner's input with one step per top-level unit, its uses the
/// union over the unit's thunks (loops unrolled for the arithmetic), the
/// buffers' homes as given per allocation. Temporary allocations are
/// planned by value ([`crate::residency::TempValues`]), every other
/// allocation by the segments its slices use.
fn unit_input(
    plan: &Plan,
    homes: &[Home],
    budget_bytes: u64,
    rates: Rates,
) -> Result<(ResidencyInput, crate::residency::Segments)> {
    let all = crate::residency::segments(plan);
    let temp: Vec<bool> = plan
        .allocations
        .iter()
        .map(|a| matches!(a.role, AllocationRole::Temp))
        .collect();
    let is_temp = |a: usize| temp.get(a).copied().unwrap_or(false);
    let mut units = Vec::new();
    thunk_units(&plan.thunks, &mut units);
    // The temporaries' values, unit by unit.
    let mut values = crate::residency::TempValues::new(plan.allocations.len());
    for t in &units {
        let mut slices = Vec::new();
        temp_slices(t, &is_temp, &mut slices);
        values.unit(&slices);
    }
    let (values, value_uses, unfit) = values.finish();
    // The buffers: the other allocations' segments (and those of temporary
    // allocations the values do not fit), then the values.
    let by_value = |a: usize| is_temp(a) && !unfit.get(a).copied().unwrap_or(true);
    let kept: Vec<usize> = (0..all.len()).filter(|&i| !by_value(all[i].0)).collect();
    let mut new_index = vec![usize::MAX; all.len()];
    for (n, &i) in kept.iter().enumerate() {
        new_index[i] = n;
    }
    let mut segs: crate::residency::Segments = kept.iter().map(|&i| all[i]).collect();
    segs.extend(values.iter().copied());
    let mut buffers = crate::residency::buffers(plan, &segs)?;
    let mut steps = Vec::with_capacity(units.len());
    for (t, vuses) in units.iter().zip(value_uses) {
        let mut inner = Vec::new();
        let mut cut = false;
        crate::residency::flatten(std::slice::from_ref(*t), &all, &mut inner, &mut cut);
        let segment_uses = inner
            .iter()
            .flat_map(|s| &s.uses)
            .filter(|u| new_index[u.buffer] != usize::MAX)
            .map(|u| Use {
                buffer: new_index[u.buffer],
                ..*u
            });
        let value_uses = vuses.into_iter().map(|(v, bytes, read, write, reuse)| Use {
            buffer: kept.len() + v,
            bytes,
            read,
            write,
            reuse,
        });
        // A buffer's uses in the unit joined: the bytes its runs touch (a
        // loop's runs add up: a scan reads one window of a stacked weight
        // per iteration, the whole of it per step), at most the buffer; the
        // reads over the link in place (re-reads included) as its reuse.
        let mut uses: Vec<(Use, f64)> = Vec::new();
        for u in segment_uses.chain(value_uses) {
            let reads = if u.read {
                u.bytes as f64 * u.reuse.max(1.0)
            } else {
                0.0
            };
            match uses.iter_mut().find(|x| x.0.buffer == u.buffer) {
                Some((x, r)) => {
                    x.bytes = x.bytes.saturating_add(u.bytes);
                    x.read |= u.read;
                    x.write |= u.write;
                    *r += reads;
                }
                None => uses.push((u, reads)),
            }
        }
        let uses = uses
            .into_iter()
            .map(|(mut u, reads)| {
                u.bytes = u.bytes.min(buffers[u.buffer].bytes);
                u.reuse = (reads / u.bytes.max(1) as f64).max(1.0);
                u
            })
            .collect();
        steps.push(xla_vmm_policy::residency::ThunkStep {
            name: format!("{} '{}'", t.kind_name(), t.info.profile_annotation),
            uses,
            flops: inner.iter().map(|s| s.flops).sum(),
        });
    }
    for b in &mut buffers {
        b.home = homes.get(b.id).copied().unwrap_or(Home::Host);
    }
    Ok((
        ResidencyInput {
            buffers,
            steps,
            rates,
            budget_bytes,
        },
        segs,
    ))
}

/// A device's staging area shared by its programs
/// ([`crate::RunConfig::one_stream`]): as large as the largest of their
/// stagings, each planned with the area and the room the budget leaves.
/// Its addresses are reserved for the whole device once; it grows by
/// mapping more device memory after what it has (when a later program's
/// staging uses more), so that every staging planned for its smaller size
/// stays valid. Freed with the last program using it.
struct SharedArea<B: Backend> {
    base: DevicePtr,
    mem: std::sync::Mutex<AreaMemory<B>>,
    /// Held while a staged step is enqueued: one program's copies and ops at
    /// a time on the device's stream.
    busy: std::sync::Mutex<()>,
    /// The staging whose step ran on it last ([`Staging::begin_step`]).
    owner: AtomicU64,
    /// The longest step estimate (µs) of the programs that placed the
    /// device's memory for their plans: only a program planned longer may
    /// move memory again ([`heaviest_plan`]), so that the device's memory
    /// stays where its heaviest program wants it.
    heaviest_us: std::sync::Mutex<f64>,
}

/// The shared area's reservation and the device memory mapped at its start.
struct AreaMemory<B: Backend> {
    va: Option<VaReservation<B>>,
    bytes: u64,
}

impl<B: Backend> SharedArea<B> {
    fn bytes(&self) -> u64 {
        self.mem.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// At least `bytes` of device memory mapped (granule multiples); more
    /// memory than the device has left keeps the size it has (said).
    /// Whether it has `bytes` now.
    fn grow(&self, ctx: &VmmContext<B>, bytes: u64) -> bool {
        let mut m = self.mem.lock().unwrap_or_else(|e| e.into_inner());
        let at = m.bytes;
        let Some(va) = m.va.as_mut() else {
            return false;
        };
        if bytes <= at {
            return true;
        }
        if bytes > va.size() {
            return false;
        }
        let more = bytes - at;
        let grown = Phys::create_at(ctx, more, MemLocation::Device)
            .and_then(|p| va.map_rw(at, &std::sync::Arc::new(p), 0, more));
        match grown {
            Ok(()) => {
                m.bytes = bytes;
                true
            }
            Err(e) => {
                tracing::warn!(bytes, error = %e,
                    "the shared staging area could not grow; it keeps its size");
                false
            }
        }
    }
}

impl<B: Backend> Drop for SharedArea<B> {
    fn drop(&mut self) {
        let m = self.mem.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(va) = m.va.take() {
            Teardown::new("a shared staging area").check("free", va.release());
        }
    }
}

/// The shared areas, one per device (backend) at most.
static SHARED_AREAS: std::sync::Mutex<
    Vec<(usize, std::sync::Weak<dyn std::any::Any + Send + Sync>)>,
> = std::sync::Mutex::new(Vec::new());

/// The shared area of `ctx`'s device, if a program made one.
fn shared_area<B: Backend + 'static>(ctx: &VmmContext<B>) -> Option<std::sync::Arc<SharedArea<B>>> {
    let key = std::sync::Arc::as_ptr(ctx.backend()) as *const () as usize;
    let mut areas = SHARED_AREAS.lock().unwrap_or_else(|e| e.into_inner());
    areas.retain(|(_, w)| w.strong_count() > 0);
    let any = areas.iter().find(|(k, _)| *k == key)?.1.upgrade()?;
    any.downcast::<SharedArea<B>>().ok()
}

/// The device memory `ctx`'s shared area holds (0 when no program made
/// one): room a program planning its moves stages through.
pub(crate) fn shared_area_bytes<B: Backend + 'static>(ctx: &VmmContext<B>) -> u64 {
    shared_area(ctx).map_or(0, |a| a.bytes())
}

/// May a program whose step is estimated at `step_us` with its memory where
/// it is place the device's memory for its plan? Yes when no program of
/// the device's shared area was estimated longer; it is then the heaviest.
pub(crate) fn heaviest_plan<B: Backend + 'static>(ctx: &VmmContext<B>, step_us: f64) -> bool {
    let Some(a) = shared_area(ctx) else {
        return true;
    };
    let mut h = a.heaviest_us.lock().unwrap_or_else(|e| e.into_inner());
    if step_us < *h {
        return false;
    }
    *h = step_us;
    true
}

/// A shared area of `bytes` for `ctx`'s device, its addresses reserved for
/// all the device's memory (it grows into them); `step_us`: its maker's
/// step estimate.
fn make_shared_area<B: Backend + 'static>(
    ctx: &VmmContext<B>,
    bytes: u64,
    step_us: f64,
) -> Result<std::sync::Arc<SharedArea<B>>> {
    let be = ctx.backend();
    let gran = be.info().vmm_granularity.max(1);
    let total = be.mem_info().map_or(0, |(_, total)| total);
    let limit = be.budget().usage().limits.device.unwrap_or(0);
    let most = total.max(limit).max(bytes).max(1).div_ceil(gran) * gran;
    let mut va = VaReservation::reserve(ctx, most, 0)?;
    let phys = std::sync::Arc::new(Phys::create_at(
        ctx,
        bytes.max(1).div_ceil(gran) * gran,
        MemLocation::Device,
    )?);
    va.map_rw(0, &phys, 0, phys.size())?;
    let key = std::sync::Arc::as_ptr(be) as *const () as usize;
    let area = std::sync::Arc::new(SharedArea {
        base: va.base(),
        mem: std::sync::Mutex::new(AreaMemory {
            bytes: phys.size(),
            va: Some(va),
        }),
        busy: std::sync::Mutex::new(()),
        owner: AtomicU64::new(0),
        heaviest_us: std::sync::Mutex::new(step_us),
    });
    let any: std::sync::Arc<dyn std::any::Any + Send + Sync> = area.clone();
    SHARED_AREAS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((key, std::sync::Arc::downgrade(&any)));
    Ok(area)
}

/// The staging area a program uses.
enum Area<B: Backend> {
    Own(DeviceBuffer<B>),
    Shared(std::sync::Arc<SharedArea<B>>),
}

/// Tokens of stagings ([`Area::claim`]); 0 is no one.
static TOKENS: AtomicU64 = AtomicU64::new(1);

impl<B: Backend> Area<B> {
    /// Its bytes (a shared area's now: it only grows).
    fn bytes(&self) -> u64 {
        match self {
            Area::Own(b) => b.mapped(),
            Area::Shared(s) => s.bytes(),
        }
    }

    /// The staging of `token` runs a step on it: did the area's last step
    /// belong to the same staging? (An own area has no other user.)
    fn claim(&self, token: u64) -> bool {
        match self {
            Area::Own(_) => true,
            Area::Shared(s) => s.owner.swap(token, Ordering::AcqRel) == token,
        }
    }

    fn ptr(&self) -> xla_vmm_device::DevicePtr {
        match self {
            Area::Own(b) => b.ptr(),
            Area::Shared(s) => s.base,
        }
    }

    /// Held while a step is enqueued (a shared area only).
    fn hold(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        match self {
            Area::Own(_) => None,
            Area::Shared(s) => Some(s.busy.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    fn free(self) -> Result<()> {
        match self {
            Area::Own(b) => b.free(),
            Area::Shared(_) => Ok(()),
        }
    }
}

/// A program's staging planned without a device: what the program's staging
/// runs at its first step.
pub struct StagingPlan {
    /// The planner's input: one step per top-level op.
    pub input: ResidencyInput,
    /// Where each buffer is: staged or read in place (after the area's
    /// fit), or on the device.
    pub placements: Vec<Placement>,
    pub residency: ResidencyPlan,
    /// The copies and area offsets.
    pub copies: StagedSteps,
    /// The step as these copies would run it, µs
    /// ([`xla_vmm_policy::staging::estimate_us`]).
    pub estimated_us: f64,
    /// (allocation, start, end) of each buffer.
    pub segments: crate::residency::Segments,
}

impl StagingPlan {
    /// What it does per step, with an area of its size.
    pub fn summary(&self) -> StagingSummary {
        summarize(
            &self.input,
            &self.placements,
            &self.residency,
            &self.copies,
            self.estimated_us,
            self.copies.area_bytes,
        )
    }
}

/// The staging of `plan` whose allocations live at `homes` with `room`
/// device bytes for its area (no device: what a program's first run
/// plans). `None`: nothing is in host memory, or nothing pays to stage.
///
/// Staged buffers that live across steps and that no thunk writes are kept
/// in the area from step to step where that pays ([`keep`]): constants,
/// and parameters when `keep_parameters` (the caller names a parameter's
/// content by its allocation id and generation: immutable buffers).
pub fn plan_staging(
    plan: &Plan,
    homes: &[Home],
    room: u64,
    rates: Rates,
    keep_parameters: bool,
) -> Result<Option<StagingPlan>> {
    if !homes.contains(&Home::Host) {
        return Ok(None);
    }
    let (input, segments) = unit_input(plan, homes, room, rates)?;
    // Ties staged, then in place: the faster staging (the first among
    // equals); neither rule is the better for every program.
    let mut best: Option<StagingPlan> = None;
    for ties in [Ties::Staged, Ties::InPlace] {
        let residency = plan_residency_with(&input, ties)
            .map_err(|e| RuntimeError::invalid(format!("residency: {e}")))?;
        if ties == Ties::InPlace
            && best
                .as_ref()
                .is_some_and(|b| b.residency.placements == residency.placements)
        {
            break;
        }
        let s = stage_residency(
            plan,
            input.clone(),
            segments.clone(),
            residency,
            room,
            keep_parameters,
        )?;
        if let Some(s) = s {
            if best
                .as_ref()
                .is_none_or(|b| s.estimated_us < b.estimated_us)
            {
                best = Some(s);
            }
        }
    }
    Ok(best)
}

/// [`plan_staging`]'s staging of one residency plan.
fn stage_residency(
    plan: &Plan,
    input: ResidencyInput,
    segments: crate::residency::Segments,
    residency: ResidencyPlan,
    room: u64,
    keep_parameters: bool,
) -> Result<Option<StagingPlan>> {
    let mut placements = residency.placements.clone();
    // An area too fragmented for a thunk's buffers: that thunk's buffer
    // that loses the least in place is read there.
    let touched = touched_bytes(&input);
    let copies = loop {
        match fastest_stage(&input, &placements, room, ALIGN) {
            Ok(s) => break s,
            Err(PolicyError::AreaTooSmall { thunk, .. })
                if demote(&input, &touched, &mut placements, Some(thunk)).is_some() => {}
            Err(e) => return Err(RuntimeError::invalid(format!("staging: {e}"))),
        }
    };
    let keepable: Vec<bool> = input
        .buffers
        .iter()
        .map(|b| match plan.allocations.get(b.id).map(|a| &a.role) {
            Some(AllocationRole::Constant { .. }) => true,
            Some(AllocationRole::Parameter { .. }) => keep_parameters,
            _ => false,
        })
        .collect();
    let copies = keep(&input, &placements, room, ALIGN, &keepable, copies)
        .and_then(|s| carry(&input, &placements, &keepable, s))
        .map_err(|e| RuntimeError::invalid(format!("staging: {e}")))?;
    if copies.stays.is_empty() {
        return Ok(None);
    }
    let estimated_us = estimate_us(&input, &placements, &copies);
    Ok(Some(StagingPlan {
        input,
        placements,
        residency,
        copies,
        estimated_us,
        segments,
    }))
}

/// `plan`'s step estimate with its allocations at `homes` and `room` device
/// bytes: the staging's ([`plan_staging`]), or the planner's step where
/// nothing is staged (all on the device, or read in place).
pub fn estimate_at(
    plan: &Plan,
    homes: &[Home],
    room: u64,
    rates: Rates,
    keep_parameters: bool,
) -> Result<f64> {
    let (input, _) = unit_input(plan, homes, room, rates)?;
    estimate_with(plan, homes, room, rates, keep_parameters, &input)
}

/// [`estimate_at`] with the planner's input for `homes` and `room` made
/// already (its step is the estimate where nothing is staged).
fn estimate_with(
    plan: &Plan,
    homes: &[Home],
    room: u64,
    rates: Rates,
    keep_parameters: bool,
    input: &ResidencyInput,
) -> Result<f64> {
    Ok(
        match plan_staging(plan, homes, room, rates, keep_parameters)? {
            Some(p) => p.estimated_us,
            // Nothing in host memory, or nothing staged: the planner's step
            // (all on the device, or read in place).
            None => {
                plan_residency(input)
                    .map_err(|e| RuntimeError::invalid(format!("residency: {e}")))?
                    .step_us
            }
        },
    )
}

/// Where `plan`'s allocations should live before its first run
/// ([`rebalance_with`]): it planned with its allocations at `homes` and `room`
/// device bytes left, the allocations in `movable` (index, bytes of memory
/// it holds) free to move between device and host memory. Each layout is
/// judged by the staging it would run ([`plan_staging`]'s estimate, with
/// `keep_parameters` as it will stage), not by the planner's own schedule:
/// that one counts the area's bytes, not its addresses, and can miss a
/// larger area's gain (a llama prefill at 2x: 75.5 ms as staged, 62.0 ms
/// with ten weights off the device and its embedding on it, where the
/// schedule said 72.2 and 72.5). `None`: nothing is in host memory, or no
/// move pays.
pub fn plan_moves(
    plan: &Plan,
    homes: &[Home],
    room: u64,
    rates: Rates,
    movable: &[(usize, u64)],
    keep_parameters: bool,
) -> Result<Option<Rebalance>> {
    if !homes.contains(&Home::Host) || movable.is_empty() {
        return Ok(None);
    }
    let (input, _) = unit_input(plan, homes, room, rates)?;
    let staged = |moved: Option<&Moved<'_>>| -> Result<f64> {
        let (room, input) = moved.map_or((room, &input), |m| (m.input.budget_bytes, &m.input));
        let mut at = homes.to_vec();
        for &(a, to) in moved.map_or(&[][..], |m| m.moves) {
            if let Some(h) = at.get_mut(a) {
                *h = to;
            }
        }
        estimate_with(plan, &at, room, rates, keep_parameters, input)
    };
    rebalance_with(&input, movable, |moved| {
        staged(moved).map_err(|e| PolicyError::InvalidResidency(e.to_string()))
    })
    .map_err(|e| RuntimeError::invalid(format!("rebalance: {e}")))
}

/// A staging's copy streams and events.
type StreamsAndEvents<B> = (Vec<<B as Backend>::Stream>, Vec<<B as Backend>::Event>);

/// Two streams and `n` events; on an error, what was made is released.
fn streams_and_events<B: Backend>(be: &B, n: usize) -> Result<StreamsAndEvents<B>> {
    let mut streams = Vec::new();
    let mut events = Vec::new();
    let made = (|| -> Result<()> {
        for _ in 0..2 {
            streams.push(be.stream_create()?);
        }
        for _ in 0..n {
            events.push(be.event_create()?);
        }
        Ok(())
    })();
    if let Err(e) = made {
        let mut t = Teardown::new("a staging that failed to set up");
        for ev in events {
            t.check("event_destroy", be.event_destroy(ev));
        }
        for st in streams {
            t.check("stream_destroy", be.stream_destroy(st));
        }
        return Err(e);
    }
    Ok((streams, events))
}

/// Bytes of each copy of the link probe staging plans with (two ranges of
/// device memory and two of host memory this size while it runs, a few ms).
const LINK_PROBE_BYTES: u64 = 16 << 20;
const LINK_PROBE_REPS: usize = 4;

/// The link measured per device of this process (`None`: it could not be).
static LINK_RATES: PerDevice<Option<Rates>> = PerDevice::new();

/// The share of its peak bandwidth (memory clock and bus width) that device
/// memory reads reach: the H200's 4.2 TB/s measured of 4.8.
const HBM_SHARE_OF_PEAK: f64 = 4.2 / 4.8;

/// The H200's multiprocessors (its arithmetic rate is [`Rates::H200`]'s).
const H200_MULTIPROCESSORS: f64 = 132.0;

/// The device's own rates for device memory and arithmetic, the H200's link:
/// device memory at [`HBM_SHARE_OF_PEAK`] of the peak its attributes give
/// (an H100 80GB: 3.35 TB/s peak, 2.93 planned); arithmetic at the H200's
/// per multiprocessor on its architecture (CUDA compute capability 9: the
/// H100s and the H200), the H200's elsewhere (another architecture's
/// per-multiprocessor rate is not known here); the H200's figures where an
/// attribute is missing.
pub(crate) fn device_model(info: &xla_vmm_device::DeviceInfo) -> Rates {
    let mut r = Rates::H200;
    if info.memory_bandwidth.is_finite() && info.memory_bandwidth > 0.0 {
        r.hbm_bytes_per_s = info.memory_bandwidth * HBM_SHARE_OF_PEAK;
    }
    if info.backend == "cuda" && info.compute_capability.0 == 9 && info.multiprocessor_count > 0 {
        r.flops_per_s *= f64::from(info.multiprocessor_count) / H200_MULTIPROCESSORS;
    }
    r
}

/// The rates staging plans with on `be`'s device: its memory and arithmetic
/// as [`device_model`] gives them, and its host link measured once per
/// device per process, the first time a program of it has memory in host
/// memory (to the device, to the host and both at once:
/// [`xla_vmm_device::probe::probe_link_quick`]), the H200's where it is not
/// (the host backend, whose copies are not a link, and whose memory and
/// arithmetic are the H200's too; too little device room; a failed probe,
/// said once at info level).
pub(crate) fn device_rates<B: Backend>(be: &B) -> Rates {
    let info = be.info();
    if info.backend == "host" {
        return Rates::H200;
    }
    let model = device_model(info);
    let link = LINK_RATES.get_or_measure(be, || {
        let measured = if room(be) < 2 * LINK_PROBE_BYTES {
            Err("too little device room to measure it".to_string())
        } else {
            // Its synchronizations must not meet another thread's capture.
            let _gate = xla_vmm_device::capture_gate::foreign();
            xla_vmm_device::probe::probe_link_quick(be, LINK_PROBE_BYTES, LINK_PROBE_REPS)
                .map_err(|e| e.to_string())
                .and_then(|l| link_rates(&l, model))
        };
        match measured {
            Ok(r) => {
                tracing::info!(backend = info.backend, device = %info.name,
                    to_device_bytes_per_s = r.link_bytes_per_s, to_host_bytes_per_s = r.link_out_bytes_per_s,
                    both_ways_bytes_per_s = r.link_both_bytes_per_s, hbm_bytes_per_s = model.hbm_bytes_per_s,
                    flops_per_s = model.flops_per_s, "host link measured for staging");
                Some(r)
            }
            Err(e) => {
                tracing::info!(backend = info.backend, device = %info.name, error = %e,
                    hbm_bytes_per_s = model.hbm_bytes_per_s, flops_per_s = model.flops_per_s,
                    "host link not measured; staging plans with the H200's 55 GB/s");
                None
            }
        }
    });
    link.unwrap_or(model)
}

/// Staging's rates: `model`'s with the measured link (an implausible one is an error).
fn link_rates(
    l: &xla_vmm_device::probe::LinkCosts,
    model: Rates,
) -> std::result::Result<Rates, String> {
    let rates = [
        l.to_device_bytes_per_s,
        l.to_host_bytes_per_s,
        l.both_ways_bytes_per_s,
    ];
    if rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err(format!("implausible link rates {rates:?}"));
    }
    Ok(Rates {
        link_bytes_per_s: l.to_device_bytes_per_s,
        link_out_bytes_per_s: l.to_host_bytes_per_s,
        link_both_bytes_per_s: l.both_ways_bytes_per_s,
        ..model
    })
}

/// Device bytes a staging area may take now: what the configured limit
/// leaves, else the device's free memory less a headroom.
pub(crate) fn room<B: Backend>(be: &B) -> u64 {
    let usage = be.budget().usage();
    let free = be.mem_info().map(|(free, _)| free).unwrap_or(0);
    match usage.limits.device {
        Some(limit) => limit.saturating_sub(usage.device_bytes).min(free),
        None => free.saturating_sub(HEADROOM_BYTES),
    }
}

/// The step's copies arranged around its units ([`arrange`]).
struct Arranged {
    around: Vec<Around>,
    ins: Vec<Copy>,
    outs: Vec<Copy>,
    /// Every carried buffer's copy, and those the step fetches for the
    /// next (indices of the latter issued after the last unit).
    heads: Vec<Copy>,
    tails: Vec<Copy>,
    tails_at_end: Vec<usize>,
    tail_mark: Option<usize>,
    /// Marks: events recorded on the compute stream where copies are
    /// issued or follow.
    n_marks: usize,
}

/// Around each unit: the copies in issued before it and waited for by it,
/// the copies home after it, the next step's carried copies issued before
/// it, the redirects of its staged segments into the area at `base`.
fn arrange(
    n_units: usize,
    steps: &StagedSteps,
    segs: &crate::residency::Segments,
    base: DevicePtr,
) -> Arranged {
    let slice = |b: usize| {
        let (allocation, start, end) = segs[b];
        Slice {
            allocation,
            offset: start,
            size: end - start,
        }
    };
    let copy = |b: usize, area: u64, after_out: Option<usize>| Copy {
        home: slice(b),
        area,
        after_out,
    };
    let mut around: Vec<Around> = (0..n_units).map(|_| Around::default()).collect();
    let (mut n_marks, mut ins, mut outs) = (0, Vec::new(), Vec::new());
    let mut mark = |m: &mut Option<usize>| {
        if m.is_none() {
            *m = Some(n_marks);
            n_marks += 1;
        }
    };
    for (i, c) in steps.copies_in.iter().enumerate() {
        let a = &mut around[c.issue_before];
        a.ins.push(i);
        mark(&mut a.issue);
        around[c.needed_by].waits.push(i);
        ins.push(copy(c.buffer, c.offset, c.after_out));
    }
    for (i, c) in steps.copies_out.iter().enumerate() {
        let a = &mut around[c.after];
        a.outs.push(i);
        mark(&mut a.after);
        outs.push(copy(c.buffer, c.offset, None));
    }
    let (mut heads, mut tails, mut tails_at_end, mut tail_mark) =
        (Vec::new(), Vec::new(), Vec::new(), None);
    for c in &steps.carried {
        heads.push(copy(c.buffer, c.offset, None));
        if !c.fetch {
            continue;
        }
        let t = tails.len();
        tails.push(copy(c.buffer, c.offset, c.after_out));
        match around.get_mut(c.after + 1) {
            Some(a) => {
                a.tails.push(t);
                mark(&mut a.issue);
            }
            None => {
                tails_at_end.push(t);
                mark(&mut tail_mark);
            }
        }
    }
    for s in &steps.stays {
        if let Some(j) = s.after_out {
            around[s.first].waits_home.push(j);
        }
        let h = slice(s.buffer);
        let r = Redirect {
            allocation: h.allocation,
            start: h.offset,
            end: h.end(),
            to: base.offset(s.offset),
        };
        for a in &mut around[s.first..=s.last] {
            a.redirects.push(r);
        }
    }
    Arranged {
        around,
        ins,
        outs,
        heads,
        tails,
        tails_at_end,
        tail_mark,
        n_marks,
    }
}

impl<B: Backend> Staging<B> {
    /// The staging of `plan` whose allocations live at `homes`, or why there
    /// is none (said at info level). `ops` are the loaded ops of `plan`.
    pub(crate) fn plan(
        ctx: &VmmContext<B>,
        plan: &Plan,
        ops: &[Op<B>],
        homes: &[Home],
        shared: bool,
        keep_parameters: bool,
    ) -> Result<Planned<B>>
    where
        B: 'static,
    {
        if !homes.contains(&Home::Host) {
            return Ok(Planned::AllOnDevice);
        }
        let be = ctx.backend();
        let name = &plan.module_name;
        let mut units = Vec::new();
        op_units(ops, &mut units);
        let mut thunks = Vec::new();
        thunk_units(&plan.thunks, &mut thunks);
        if units.len() != thunks.len() || has_async(&units) {
            tracing::info!(executable = %name,
                "part of it is in host memory; not staged (async work), read in place");
            return Ok(Planned::InPlace(
                "async work: its staged bytes would have to outlive an op",
            ));
        }
        let gran = be.info().vmm_granularity.max(1);
        // A shared area the device has: its room; else what the budget leaves.
        let existing = shared.then(|| shared_area(ctx)).flatten();
        let free = room(&**be) / gran * gran;
        // The area's room: what it has and what the budget leaves. It takes
        // only what the staging uses (the area grows to it; a new one is made
        // of that size), so that the rest stays free for what moves to the
        // device later (a training step keeping a weight there that the
        // programs initialising the model never could).
        let rates = device_rates(&**be);
        let room = existing.as_ref().map_or(0, |a| a.bytes()) + free;
        let mut planned = plan_staging(plan, homes, room, rates, keep_parameters)?;
        if let (Some(a), Some(p)) = (&existing, &planned) {
            if !a.grow(ctx, p.copies.area_bytes.div_ceil(gran) * gran) {
                // Someone took the room meanwhile: the area as it is.
                planned = plan_staging(plan, homes, a.bytes(), rates, keep_parameters)?;
            }
        }
        let Some(planned) = planned else {
            tracing::info!(executable = %name, room,
                "part of it is in host memory; nothing pays to stage, read in place");
            return Ok(Planned::InPlace(if room == 0 {
                "no device room for a staging area"
            } else {
                "nothing pays to stage"
            }));
        };
        let StagingPlan {
            input,
            placements,
            residency,
            copies: steps,
            estimated_us,
            segments: segs,
        } = planned;
        let area = match (shared, existing) {
            (true, Some(a)) => Area::Shared(a),
            (true, None) => Area::Shared(make_shared_area(ctx, steps.area_bytes, estimated_us)?),
            (false, _) => Area::Own(DeviceBuffer::alloc_at(
                ctx,
                steps.area_bytes,
                MemLocation::Device,
            )?),
        };
        let summary = summarize(
            &input,
            &placements,
            &residency,
            &steps,
            estimated_us,
            area.bytes(),
        );
        tracing::info!(executable = %name, area = summary.area_bytes, staged = summary.staged,
            staged_bytes = summary.staged_bytes, in_place = summary.in_place,
            in_place_bytes = summary.in_place_bytes, device_bytes = summary.device_bytes,
            bytes_in = summary.bytes_in_per_step, bytes_out = summary.bytes_out_per_step,
            "part of it is in host memory: staged through a device area");
        let Arranged {
            around,
            ins,
            outs,
            heads,
            tails,
            tails_at_end,
            tail_mark,
            n_marks,
        } = arrange(units.len(), &steps, &segs, area.ptr());
        let kept: Vec<Copy> = steps
            .kept
            .iter()
            .map(|k| {
                let (allocation, start, end) = segs[k.buffer];
                Copy {
                    home: Slice {
                        allocation,
                        offset: start,
                        size: end - start,
                    },
                    area: k.offset,
                    after_out: None,
                }
            })
            .collect();
        let n_waiting = around.iter().filter(|a| !a.waits.is_empty()).count();
        let n_events = 5 + 3 * ins.len() + outs.len() + n_marks + 2 * n_waiting;
        let (streams, events) = streams_and_events(&**be, n_events)?;
        let mut events = events.into_iter();
        let mut next = || events.next().expect("made above");
        let (fork, joins) = (next(), [next(), next()]);
        let landed = (0..ins.len()).map(|_| next()).collect();
        let homed = (0..outs.len()).map(|_| next()).collect();
        let marks = (0..n_marks).map(|_| next()).collect();
        let clock = Clock {
            start: next(),
            end: next(),
            started: (0..ins.len()).map(|_| next()).collect(),
            done: (0..ins.len()).map(|_| next()).collect(),
            waits: (0..around.len())
                .filter(|&k| !around[k].waits.is_empty())
                .map(|k| (k, next(), next()))
                .collect(),
            state: Default::default(),
        };
        let mut streams = streams.into_iter();
        let (in_stream, out_stream) = (
            streams.next().expect("made above"),
            streams.next().expect("made above"),
        );
        Ok(Planned::Staged(Box::new(Staging {
            area,
            in_stream,
            out_stream,
            fork,
            joins,
            ins,
            outs,
            landed,
            homed,
            marks,
            around,
            filled: std::sync::Mutex::new(vec![None; kept.len()]),
            kept,
            carried: std::sync::Mutex::new(Carried {
                ready: vec![None; heads.len()],
                pending: vec![None; heads.len()],
            }),
            heads,
            tails,
            tails_at_end,
            tail_mark,
            token: TOKENS.fetch_add(1, Ordering::Relaxed),
            refills: AtomicU64::new(0),
            clock,
            summary,
        })))
    }

    /// The plan's figures and the measured ones.
    pub(crate) fn summary(&self, be: &B) -> StagingSummary {
        {
            // Asked from any thread: not while a stream captures (a query
            // of an event a capture is recording).
            let _gate = xla_vmm_device::capture_gate::foreign();
            self.read_clock(be);
        }
        let mut s = self.summary.clone();
        s.refills = self.refills.load(Ordering::Relaxed);
        let c = self.clock.state.lock().unwrap_or_else(|e| e.into_inner());
        let (step, copying, waited) = c.last;
        s.timed_steps = c.reads;
        if c.reads > 0 {
            s.gpu_step_us = step;
            s.copy_in_us = copying;
            s.waited_us = waited;
            if copying > 0.0 {
                s.copy_in_gbps = s.bytes_in_per_step as f64 / (copying * 1e3);
            }
            if step > 0.0 {
                s.link_utilisation =
                    s.link().link_us(s.bytes_in_per_step, s.bytes_out_per_step) / step;
            }
        }
        s
    }

    /// Read the timed step's events back if there is one and the device
    /// has passed it (never waits).
    fn read_clock(&self, be: &B) {
        let mut c = self.clock.state.lock().unwrap_or_else(|e| e.into_inner());
        let k = &self.clock;
        if !c.unread || !matches!(be.event_query(&k.end), Ok(EventStatus::Complete)) {
            return;
        }
        // A graph's replays record the events again: the next read reads
        // a later step.
        c.unread = c.in_graph;
        let us =
            |a: &B::Event, b: &B::Event| be.event_elapsed_ms(a, b).map(|ms| f64::from(ms) * 1e3);
        // Each interval within the step's, else the events are of two
        // replays (one recorded again while the other was read): no read.
        let read =
            (|| -> std::result::Result<Option<(f64, f64, f64)>, xla_vmm_device::DeviceError> {
                let step = us(&k.start, &k.end)?;
                // Start and end of two replays (nothing nested to tell).
                if step < 0.0 {
                    return Ok(None);
                }
                let mut sums = [0.0f64; 2];
                let copies = k.started.iter().zip(&k.done).map(|p| (0, p));
                let waits = k.waits.iter().map(|(_, a, b)| (1, (a, b)));
                for (i, (a, b)) in copies.chain(waits) {
                    let (from, to) = (us(&k.start, a)?, us(&k.start, b)?);
                    if !(0.0 <= from && from <= to && to <= step) {
                        return Ok(None);
                    }
                    sums[i] += to - from;
                }
                Ok(Some((step, sums[0], sums[1])))
            })();
        if let Ok(Some(last)) = read {
            c.reads += 1;
            c.last = last;
            c.fresh = true;
            tracing::debug!(
                step_us = last.0,
                copy_in_us = last.1,
                waited_us = last.2,
                "staged step timed"
            );
        }
    }

    /// A step was read back since the last call.
    pub(crate) fn take_fresh(&self) -> bool {
        let mut c = self.clock.state.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut c.fresh)
    }

    /// Whether this run records the timing events: an eager run, one in
    /// [`CLOCK_EVERY`] once the last is read back; a capture where the
    /// backend records events at every replay of the graph
    /// ([`xla_vmm_device::DeviceInfo::graph_event_records`]; an ordinary
    /// record in a capture only orders the capture's streams).
    fn clock_tick(&self, be: &B, capturing: bool) -> bool {
        if capturing {
            let timed = be.info().graph_event_records;
            let mut c = self.clock.state.lock().unwrap_or_else(|e| e.into_inner());
            c.unread |= timed;
            return timed;
        }
        self.read_clock(be);
        let mut c = self.clock.state.lock().unwrap_or_else(|e| e.into_inner());
        let timed = !c.unread && c.runs.is_multiple_of(CLOCK_EVERY);
        c.runs += 1;
        c.unread |= timed;
        timed
    }

    /// A step: in a graph mode where the graph's replays record the clock,
    /// read it once in [`CLOCK_EVERY`] steps (queries only, never a wait).
    fn graph_clock_tick(&self, be: &B, graph: bool) {
        let due = {
            let mut c = self.clock.state.lock().unwrap_or_else(|e| e.into_inner());
            c.in_graph = graph && be.info().graph_event_records;
            c.graph_steps += 1;
            c.in_graph && c.graph_steps.is_multiple_of(CLOCK_EVERY)
        };
        if due {
            let _gate = xla_vmm_device::capture_gate::foreign();
            self.read_clock(be);
        }
    }

    /// Before a step's work is enqueued on `stream` (every mode, every
    /// step; the device's steps are enqueued one at a time; `graph`: it runs
    /// as a graph): claim the area,
    /// and copy in, on `stream`, each kept buffer the area does not hold
    /// now: the area's last step was another staging's, or the buffer's
    /// home holds other content (`content` of its allocation; `None`:
    /// unknown, always copied), or nothing was copied yet. `slots`: the
    /// step's bound addresses.
    pub(crate) fn begin_step(
        &self,
        be: &B,
        content: &dyn Fn(usize) -> Option<Content>,
        slots: &SlotTable,
        stream: &B::Stream,
        graph: bool,
    ) -> Result<()> {
        let ours = self.area.claim(self.token);
        self.graph_clock_tick(be, graph);
        let copy_in = |c: &Copy| -> Result<()> {
            let to = self.area.ptr().offset(c.area);
            be.copy_d2d(to, slots.resolve(&c.home)?, c.home.size, stream)?;
            Ok(())
        };
        let mut copied = false;
        if !self.kept.is_empty() {
            let mut filled = self.filled.lock().unwrap_or_else(|e| e.into_inner());
            for (k, f) in self.kept.iter().zip(filled.iter_mut()) {
                let now = content(k.home.allocation);
                if ours && now.is_some() && *f == now {
                    continue;
                }
                *f = None;
                copy_in(k)?;
                *f = now;
                copied = true;
            }
        }
        if !self.heads.is_empty() {
            // What the step before carried counts once, and only when it
            // ran to its end ([`Staging::end_step`]).
            let mut c = self.carried.lock().unwrap_or_else(|e| e.into_inner());
            let Carried { ready, pending } = &mut *c;
            for ((h, r), p) in self.heads.iter().zip(ready).zip(pending) {
                let now = content(h.home.allocation);
                let there = ours && now.is_some() && *r == now;
                *r = None;
                *p = now;
                if !there {
                    copy_in(h)?;
                    copied = true;
                }
            }
        }
        if copied {
            self.refills.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Issue the next step's carried copy `t` on the stream of copies in
    /// (after the copy home out of its range it follows).
    fn fetch_tail(&self, be: &B, t: usize, slots: &SlotTable) -> Result<()> {
        let c = &self.tails[t];
        if let Some(j) = c.after_out {
            be.stream_wait_event(&self.in_stream, &self.homed[j])?;
        }
        let to = self.area.ptr().offset(c.area);
        be.copy_d2d(to, slots.resolve(&c.home)?, c.home.size, &self.in_stream)?;
        Ok(())
    }

    /// After a step's work was enqueued whole: what it carries is in the
    /// area for the next step.
    pub(crate) fn end_step(&self) {
        if self.heads.is_empty() {
            return;
        }
        let mut c = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        let Carried { ready, pending } = &mut *c;
        ready.clone_from(pending);
    }

    /// Wait for the copy streams, release everything (failures in `t`).
    pub(crate) fn release(self, be: &B, t: &mut Teardown) {
        for s in [&self.in_stream, &self.out_stream] {
            t.check("stream_synchronize", be.stream_synchronize(s));
        }
        let [j0, j1] = self.joins;
        let clock = self.clock;
        for e in [self.fork, j0, j1, clock.start, clock.end]
            .into_iter()
            .chain(self.landed)
            .chain(self.homed)
            .chain(self.marks)
            .chain(clock.started)
            .chain(clock.done)
            .chain(clock.waits.into_iter().flat_map(|(_, a, b)| [a, b]))
        {
            t.check("event_destroy", be.event_destroy(e));
        }
        for s in [self.in_stream, self.out_stream] {
            t.check("stream_destroy", be.stream_destroy(s));
        }
        t.check("freeing the staging area", self.area.free());
    }
}

impl<B: Backend> StagedRun<B> for Staging<B> {
    /// Run `ops` (the program's) on `stream` with their staging.
    fn run(
        &self,
        env: &ExecEnv<'_, B>,
        ops: &[Op<B>],
        slots: &SlotTable,
        stream: &B::Stream,
    ) -> Result<()> {
        let be = env.backend;
        let _span = crate::trace::span("staged ops");
        let mut units = Vec::with_capacity(self.around.len());
        op_units(ops, &mut units);
        if units.len() != self.around.len() {
            return Err(RuntimeError::invalid(format!(
                "staging planned for {} ops, the program has {}",
                self.around.len(),
                units.len()
            )));
        }
        let (cin, cout) = (&self.in_stream, &self.out_stream);
        let _area = self.area.hold();
        let timed = self.clock_tick(be, env.capturing);
        // The clock's events: recorded by the graph at each replay when
        // captured.
        let clock = |e: &B::Event, s: &B::Stream| match env.capturing {
            true => be.event_record_in_graph(e, s),
            false => be.event_record(e, s),
        };
        let mut waits = self.clock.waits.iter().peekable();
        if timed {
            clock(&self.clock.start, stream)?;
        }
        be.event_record(&self.fork, stream)?;
        be.stream_wait_event(cin, &self.fork)?;
        be.stream_wait_event(cout, &self.fork)?;
        let mut table = slots.clone();
        let mut nest = Vec::new();
        for (n, (op, a)) in units.iter().zip(&self.around).enumerate() {
            if let Some(m) = a.issue {
                be.event_record(&self.marks[m], stream)?;
                be.stream_wait_event(cin, &self.marks[m])?;
                for &i in &a.ins {
                    let c = &self.ins[i];
                    if let Some(j) = c.after_out {
                        be.stream_wait_event(cin, &self.homed[j])?;
                    }
                    let to = self.area.ptr().offset(c.area);
                    if timed {
                        clock(&self.clock.started[i], cin)?;
                    }
                    be.copy_d2d(to, slots.resolve(&c.home)?, c.home.size, cin)?;
                    if timed {
                        clock(&self.clock.done[i], cin)?;
                    }
                    be.event_record(&self.landed[i], cin)?;
                }
                for &t in &a.tails {
                    self.fetch_tail(be, t, slots)?;
                }
            }
            let pair = match waits.peek() {
                Some((k, ..)) if *k == n => waits.next(),
                _ => None,
            };
            if let (true, Some((_, before, _))) = (timed, pair) {
                clock(before, stream)?;
            }
            for &i in &a.waits {
                be.stream_wait_event(stream, &self.landed[i])?;
            }
            if let (true, Some((_, _, after))) = (timed, pair) {
                clock(after, stream)?;
            }
            for &j in &a.waits_home {
                be.stream_wait_event(stream, &self.homed[j])?;
            }
            table.set_redirects(&a.redirects);
            run_op(env, op, &table, stream, &mut nest)?;
            if let Some(m) = a.after {
                be.event_record(&self.marks[m], stream)?;
                be.stream_wait_event(cout, &self.marks[m])?;
                for &j in &a.outs {
                    let c = &self.outs[j];
                    let from = self.area.ptr().offset(c.area);
                    be.copy_d2d(slots.resolve(&c.home)?, from, c.home.size, cout)?;
                    be.event_record(&self.homed[j], cout)?;
                }
            }
        }
        if let Some(m) = self.tail_mark {
            be.event_record(&self.marks[m], stream)?;
            be.stream_wait_event(cin, &self.marks[m])?;
            for &t in &self.tails_at_end {
                self.fetch_tail(be, t, slots)?;
            }
        }
        for (e, s) in self.joins.iter().zip([cin, cout]) {
            be.event_record(e, s)?;
            be.stream_wait_event(stream, e)?;
        }
        if timed {
            clock(&self.clock.end, stream)?;
        }
        Ok(())
    }
}

fn summarize(
    input: &ResidencyInput,
    placements: &[Placement],
    residency: &ResidencyPlan,
    steps: &StagedSteps,
    estimated_us: f64,
    area_bytes: u64,
) -> StagingSummary {
    // Asked once per staging (the runtime keeps the summary), never per step.
    let bound = xla_vmm_policy::must_cross::must_cross(input);
    let mut s = StagingSummary {
        area_bytes,
        bytes_in_per_step: steps.bytes_in,
        bytes_out_per_step: steps.bytes_out,
        estimated_step_us: estimated_us,
        unbudgeted_step_us: residency.unbudgeted_step_us,
        must_cross_in: bound.bytes_in,
        must_cross_out: bound.bytes_out,
        must_cross_us: bound.link_us,
        link_bytes_per_s: input.rates.link_bytes_per_s,
        link_out_bytes_per_s: input.rates.link_out(),
        link_both_bytes_per_s: input.rates.link_both(),
        ..Default::default()
    };
    s.kept = steps.kept.len();
    s.kept_bytes = steps.kept_bytes;
    s.carried = steps.carried.len();
    s.carried_bytes = steps
        .carried
        .iter()
        .map(|c| input.buffers[c.buffer].bytes)
        .sum();
    for (b, p) in input.buffers.iter().zip(placements) {
        match (b.home, p) {
            (Home::Device, _) => s.device_bytes += b.bytes,
            (_, Placement::Staged) => {
                s.staged += 1;
                s.staged_bytes += b.bytes;
            }
            _ => {
                s.in_place += 1;
                s.in_place_bytes += b.bytes;
            }
        }
    }
    s
}

/// Where each of a program's `n` allocations lives: its own buffers'
/// locations, its parameters' (per allocation; `None`: raw memory, taken
/// for device memory); an allocation of neither (size 0) counts as on the
/// device.
pub(crate) fn homes(
    n: usize,
    owned: impl Iterator<Item = (usize, MemLocation)>,
    params: impl Iterator<Item = (usize, Option<MemLocation>)>,
) -> Vec<Home> {
    let mut homes = vec![Home::Device; n];
    let home = |l: Option<MemLocation>| match l {
        Some(MemLocation::Host) => Home::Host,
        // Raw memory (not our allocator's) is device memory.
        _ => Home::Device,
    };
    for (a, l) in owned {
        if let Some(h) = homes.get_mut(a) {
            *h = home(Some(l));
        }
    }
    for (a, l) in params {
        if let Some(h) = homes.get_mut(a) {
            *h = home(l);
        }
    }
    homes
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm_device::probe::LinkCosts;

    #[test]
    fn staging_plans_with_the_measured_link_and_the_h200_elsewhere() {
        let l = LinkCosts {
            bytes: 16 << 20,
            to_device_bytes_per_s: 47e9,
            to_host_bytes_per_s: 44e9,
            both_ways_bytes_per_s: 67e9,
        };
        let r = link_rates(&l, Rates::H200).unwrap();
        assert_eq!(
            (
                r.link_bytes_per_s,
                r.link_out_bytes_per_s,
                r.link_both_bytes_per_s
            ),
            (47e9, 44e9, 67e9)
        );
        for bad in [0.0, f64::NAN, -1.0, f64::INFINITY] {
            let e = link_rates(
                &LinkCosts {
                    both_ways_bytes_per_s: bad,
                    ..l.clone()
                },
                Rates::H200,
            )
            .unwrap_err();
            assert!(e.contains("implausible"), "{e}");
        }
        // The host backend's copies are not a link: the H200's figures.
        let be = xla_vmm_device::host::HostBackend::new(Default::default()).unwrap();
        assert_eq!(device_rates(&be), Rates::H200);
    }

    #[test]
    fn device_memory_and_arithmetic_are_the_devices_own() {
        let be = xla_vmm_device::host::HostBackend::new(Default::default()).unwrap();
        let card = |backend, cc, sms, peak| xla_vmm_device::DeviceInfo {
            backend,
            compute_capability: cc,
            multiprocessor_count: sms,
            memory_bandwidth: peak,
            ..be.info().clone()
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
        // An H100 80GB HBM3 (its attributes as `xla-vmm probe` read them).
        let h100 = device_model(&card("cuda", (9, 0), 132, 3.35232e12));
        assert!(close(h100.hbm_bytes_per_s, 3.35232e12 * 4.2 / 4.8));
        assert_eq!(h100.flops_per_s, Rates::H200.flops_per_s);
        assert_eq!(h100.link_bytes_per_s, Rates::H200.link_bytes_per_s);
        // Fewer multiprocessors of the same architecture: less arithmetic.
        let pcie = device_model(&card("cuda", (9, 0), 114, 2.0e12));
        assert!(close(
            pcie.flops_per_s,
            Rates::H200.flops_per_s * 114.0 / 132.0
        ));
        assert!(close(pcie.hbm_bytes_per_s, 2.0e12 * 4.2 / 4.8));
        // Another architecture (a ROCm gfx9 too): the H200's arithmetic; no
        // peak reported: the H200's device memory.
        for other in [
            card("cuda", (8, 0), 108, 0.0),
            card("hip", (9, 4), 304, f64::NAN),
        ] {
            let r = device_model(&other);
            assert_eq!(
                (r.hbm_bytes_per_s, r.flops_per_s),
                (Rates::H200.hbm_bytes_per_s, Rates::H200.flops_per_s)
            );
        }
    }
}

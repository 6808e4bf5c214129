//! What the caller binds to a parameter, and how VA-stable graph mode is
//! configured and reported: [`UserBuffer`], [`BindingConfig`],
//! [`BindingStats`], and the process-wide stats registry read by the plugin.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use xla_vmm_device::probe::{probe_quick, QuickCosts};
use xla_vmm_device::vmm::{Buffer, Phys};
use xla_vmm_device::{Backend, DevicePtr, MemLocation};
use xla_vmm_policy::{DeviceCosts, Stats, Threshold};

use crate::error::{Result, RuntimeError};
use crate::per_device::PerDevice;

/// Physical memory the runtime may map into its own reservation.
pub struct RemapSource<B: Backend> {
    pub phys: Arc<Phys<B>>,
    /// Offset of the buffer inside `phys`.
    pub offset: u64,
    /// Bytes of `phys` from `offset` that belong to the buffer (a
    /// granularity multiple).
    pub capacity: u64,
}

impl<B: Backend> Clone for RemapSource<B> {
    fn clone(&self) -> Self {
        RemapSource {
            phys: self.phys.clone(),
            offset: self.offset,
            capacity: self.capacity,
        }
    }
}

/// A caller's buffer bound to an entry parameter.
///
/// Identity is the allocation id (never the address: an address can be
/// reused by a new allocation). A buffer without an id (raw memory) or
/// without a [`RemapSource`] (sub-allocated) is served by copies in
/// VA-stable mode.
pub struct UserBuffer<B: Backend> {
    pub ptr: DevicePtr,
    pub bytes: u64,
    pub id: Option<u64>,
    /// Lifetime of the allocation block (`vmm::Buffer::generation`): with
    /// the id it names the buffer's content under immutable semantics.
    pub generation: u64,
    pub remap: Option<RemapSource<B>>,
    /// Where its bytes live (`None`: unknown, raw memory).
    pub location: Option<MemLocation>,
}

impl<B: Backend> Clone for UserBuffer<B> {
    fn clone(&self) -> Self {
        UserBuffer {
            ptr: self.ptr,
            bytes: self.bytes,
            id: self.id,
            generation: self.generation,
            remap: self.remap.clone(),
            location: self.location,
        }
    }
}

impl<B: Backend> std::fmt::Debug for UserBuffer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr.0))
            .field("bytes", &self.bytes)
            .field("id", &self.id)
            .field("remappable", &self.remap.is_some())
            .finish()
    }
}

impl<B: Backend> UserBuffer<B> {
    /// Raw device memory: copy-only in VA-stable mode.
    pub fn raw(ptr: DevicePtr, bytes: u64) -> Self {
        UserBuffer {
            ptr,
            bytes,
            id: None,
            generation: 0,
            remap: None,
            location: None,
        }
    }

    /// A buffer of the project's VMM allocator (remappable unless it is
    /// sub-allocated).
    pub fn from_vmm(buf: &Buffer<B>) -> Self {
        UserBuffer {
            ptr: buf.ptr(),
            bytes: buf.size(),
            id: Some(buf.allocation_id().0),
            generation: buf.generation(),
            remap: buf.remappable().then(|| RemapSource {
                phys: buf.phys().clone(),
                offset: buf.phys_offset(),
                capacity: buf.capacity(),
            }),
            location: Some(buf.phys().location()),
        }
    }
}

/// Settings of VA-stable graph mode, fixed at an executable's first
/// VA-stable run.
#[derive(Clone, Debug, PartialEq)]
pub struct BindingConfig {
    /// `0` remap all, `1` auto, `N` copy slots of at most N bytes.
    pub threshold: Threshold,
    /// Costs for auto, used as given. `None`: measured at the first
    /// VA-stable step by the in-process probe ([`measured_costs`]: once per
    /// device per process, see [`BindingConfig::probe`]), else the H200 figures of
    /// DESIGN §4 (remap 46 µs, copy 2.4 TB/s, 4 µs per copy launch); free and
    /// total memory are read at the first step, and with the copy kernel the
    /// per-direction launch is [`KERNEL_COPY_DIRECTION_US`]. Either way the
    /// runtime sets `granularity_bytes` to its backend's VMM granularity
    /// (what each shadow is rounded up to when allocated).
    pub costs: Option<DeviceCosts>,
    /// Buffers bound by allocation id never change content while bound,
    /// except when this executable writes them (PJRT buffer semantics). Then
    /// a copy slot bound to the same buffer (id and generation) as the
    /// shadow's last content skips the copy in. Off by default: a raw API
    /// caller may write its buffers between steps.
    pub immutable_buffers: bool,
    /// How a step's copies run (`XLA_VMM_COPY_PATH`).
    pub copy_path: CopyPath,
    /// VA reservations (graphs) used in turn, 1 or 2 (`reservations`,
    /// `XLA_VMM_RESERVATIONS`; default [`DEFAULT_RESERVATIONS`]): with two, buffers that alternate
    /// between steps (state not donated) are all skips; with one, they remap.
    pub reservations: usize,
    /// Time every VA-stable step on the GPU (`XLA_VMM_STEP_TIMING=1`, a
    /// diagnostic: logged at debug level as `step timed`).
    pub step_timing: bool,
    /// Whether auto measures the device's costs ([`measured_costs`]).
    pub probe: Probe,
}

/// VA reservations per executable unless the configuration says otherwise.
pub const DEFAULT_RESERVATIONS: usize = 2;

impl Default for BindingConfig {
    fn default() -> Self {
        BindingConfig {
            threshold: Threshold::Auto,
            costs: None,
            immutable_buffers: false,
            copy_path: CopyPath::Auto,
            reservations: DEFAULT_RESERVATIONS,
            step_timing: false,
            probe: Probe::GpuOnly,
        }
    }
}

/// Whether auto measures the device's binding costs (`probe`,
/// `XLA_VMM_PROBE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Probe {
    /// On GPU backends (CUDA, HIP) only: the host backend's costs are its
    /// emulation's (`auto`, the default).
    #[default]
    GpuOnly,
    /// On every backend, the host backend included (`1`).
    Always,
    /// Never: the DESIGN §4 constants (`0`).
    Never,
}

/// How VA-stable mode runs a step's copies (`copy_path`, `XLA_VMM_COPY_PATH`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyPath {
    /// The runtime's choice (`auto`, the default).
    #[default]
    Auto,
    /// The copy kernel inside the step's graph (`kernel`), where the
    /// backend can load it; batched driver copies elsewhere.
    Kernel,
    /// Batched driver copies before and after the graph launch (`batch`).
    Batch,
}

impl CopyPath {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "" | "auto" => Ok(CopyPath::Auto),
            "kernel" => Ok(CopyPath::Kernel),
            "batch" => Ok(CopyPath::Batch),
            other => Err(RuntimeError::arg(format!(
                "copy path {other:?}: expected auto, kernel or batch"
            ))),
        }
    }

    /// Whether the copy kernel is tried.
    pub fn wants_kernel(self) -> bool {
        !matches!(self, CopyPath::Batch)
    }
}

/// Defaults used when no probe result is given (DESIGN §4, H200).
pub const DEFAULT_REMAP_US: f64 = 46.0;
pub const DEFAULT_COPY_BW: f64 = 2.4e12;
pub const DEFAULT_COPY_LAUNCH_US: f64 = 4.0;

/// GPU cost of one direction of copies on the copy-kernel path, µs: the
/// kernel is a node of the step's graph (no launch call, no host work per
/// copy; the host rewrites the node's table only when it changes), so a
/// direction costs one small kernel node: about a kernel node's
/// launch-to-start inside a graph (the copy-path diagnostic measured ~1 µs
/// per node on the H200, `integration/results/perf_baseline_a14eaf4.md`).
pub const KERNEL_COPY_DIRECTION_US: f64 = 2.0;

/// Bytes of the probe's large copy (bandwidth).
pub const PROBE_COPY_BYTES: u64 = 64 << 20;

/// Where the costs auto uses came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostSource {
    /// [`BindingConfig::costs`].
    Given,
    /// The in-process probe.
    Probe,
    /// DESIGN §4 constants (probe off or failed).
    Default,
}

impl CostSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CostSource::Given => "given",
            CostSource::Probe => "probe",
            CostSource::Default => "default",
        }
    }
}

/// Probe results per device of this process (`None`: it failed; not retried).
static PROBES: PerDevice<Option<QuickCosts>> = PerDevice::new();

fn probe_enabled(probe: Probe, backend: &str) -> bool {
    match probe {
        Probe::Never => false,
        Probe::Always => true,
        Probe::GpuOnly => backend != "host",
    }
}

/// The in-process probe's result for `backend`'s device: measured once per
/// device per process ([`probe_quick`]: three remaps of one granule, one
/// copy of [`PROBE_COPY_BYTES`], eight tiny copies; a few ms) and cached;
/// `None` when `probe` rules it out for this backend or it failed (said
/// once at info level either way, with the values when it worked).
pub fn measured_costs<B: Backend>(backend: &B, probe: Probe) -> Option<QuickCosts> {
    let info = backend.info();
    if !probe_enabled(probe, info.backend) {
        return None;
    }
    PROBES.get_or_measure(backend, || match probe_quick(backend, PROBE_COPY_BYTES) {
        Ok(q) => {
            tracing::info!(backend = info.backend, device = %info.name, ordinal = info.ordinal,
                remap_us = q.remap_us, copy_bw_bytes_per_s = q.copy_bw_bytes_per_s,
                copy_launch_us = q.copy_launch_us, copy_bytes = q.copy_bytes,
                free_bytes = q.free_bytes, total_bytes = q.total_bytes,
                probe_us = q.elapsed_us, "binding cost probe");
            Some(q)
        }
        Err(e) => {
            tracing::info!(backend = info.backend, device = %info.name, error = %e,
                "binding cost probe failed: DESIGN §4 constants used");
            None
        }
    })
}

impl BindingConfig {
    /// `threshold`, nothing else set (no costs, buffers may change between
    /// steps, the runtime's copy path): what an executable has until its
    /// caller sets the configuration it resolved (from the environment or a
    /// client's options).
    pub fn with_threshold(threshold: Threshold) -> Self {
        BindingConfig {
            threshold,
            costs: None,
            immutable_buffers: false,
            copy_path: CopyPath::Auto,
            reservations: DEFAULT_RESERVATIONS,
            step_timing: false,
            probe: Probe::GpuOnly,
        }
    }

    /// The given costs, else the DESIGN §4 constants with the device's
    /// memory read now (no probe): its free bytes no more than the room its
    /// budget leaves ordinary allocations, where shadows are made (a shadow
    /// past it would land in host memory, and the graph's kernels would
    /// read that slot over the link every step).
    pub(crate) fn costs_without_probe<B: Backend>(&self, backend: &B) -> Result<DeviceCosts> {
        if let Some(c) = &self.costs {
            return Ok(c.clone());
        }
        let (free, total_bytes) = backend.mem_info()?;
        let free_bytes = free.min(backend.budget().ordinary_device_room(total_bytes));
        Ok(DeviceCosts {
            remap_us: DEFAULT_REMAP_US,
            copy_bw_bytes_per_s: DEFAULT_COPY_BW,
            copy_launch_us: DEFAULT_COPY_LAUNCH_US,
            free_bytes,
            total_bytes,
            granularity_bytes: backend.info().vmm_granularity.max(1),
        })
    }

    /// The costs auto plans with: given, else probed, else the constants;
    /// with `kernel_path` (copies run by the copy kernel inside the graph)
    /// the per-direction launch is [`KERNEL_COPY_DIRECTION_US`] unless the
    /// costs were given.
    pub(crate) fn costs_for<B: Backend>(
        &self,
        backend: &B,
        kernel_path: bool,
    ) -> Result<(DeviceCosts, CostSource)> {
        if let Some(c) = &self.costs {
            return Ok((c.clone(), CostSource::Given));
        }
        let mut costs = self.costs_without_probe(backend)?;
        let mut source = CostSource::Default;
        // Only measured numbers the policy accepts replace the constants.
        if let Some(q) = measured_costs(backend, self.probe) {
            let ok = |v: f64| v.is_finite() && v > 0.0;
            if ok(q.remap_us) && ok(q.copy_bw_bytes_per_s) && q.copy_launch_us.is_finite() {
                costs.remap_us = q.remap_us;
                costs.copy_bw_bytes_per_s = q.copy_bw_bytes_per_s;
                costs.copy_launch_us = q.copy_launch_us.max(0.0);
                source = CostSource::Probe;
            }
        }
        if kernel_path {
            costs.copy_launch_us = KERNEL_COPY_DIRECTION_US;
        }
        Ok((costs, source))
    }
}

/// Binding counters of one executable (VA-stable mode).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct BindingStats {
    pub executable: String,
    /// Threshold setting (0, 1, N) and the cutoff in force.
    pub threshold: u64,
    pub threshold_bytes: u64,
    /// Parameter slots bound per step and those served by shadows.
    pub slots: usize,
    pub copy_slots: usize,
    /// Of `copy_slots`, those planned as copies because their buffers
    /// cannot be mapped (sub-allocated or raw): not fallbacks.
    pub copy_only_slots: usize,
    /// Shadow memory held (shared by the reservations), bytes.
    pub shadow_bytes: u64,
    /// The policy's shadow cap. The policy counts shadows as they are
    /// allocated here (one per copy slot, whole VMM granules), so
    /// `shadow_bytes` stays at or under it unless a fallback adds a shadow
    /// or copy-only slots alone exceed it.
    pub shadow_cap_bytes: u64,
    /// Copies in elided because the shadow already held the buffer.
    pub copies_elided: u64,
    pub bytes_elided: u64,
    /// Graph captures (one per reservation, never repeated).
    pub captures: u64,
    /// VMM driver calls made while binding (unmap, map, set access).
    pub vmm_calls: u64,
    /// Copy operations: one batch (or one copy-kernel run with entries)
    /// per direction per step at most (a batch of one copy is a plain
    /// copy).
    pub copy_ops: u64,
    /// How copies run: `"kernel"` (copy-kernel nodes inside the graph, their
    /// tables rewritten only when the copies change) or `"batch"`
    /// (one batched copy per direction around the launch); empty before
    /// the first step.
    pub copy_path: &'static str,
    /// Where auto's costs came from: `"probe"`, `"given"` or `"default"`
    /// (DESIGN §4 constants); empty before the first step.
    pub costs_source: &'static str,
    /// The costs the plan was made with: remap µs, copy bandwidth (GB/s),
    /// per-direction copy launch µs.
    pub remap_us: f64,
    pub copy_gbps: f64,
    pub copy_launch_us: f64,
    /// What bounds the step, as measured during auto's warm-up: `"gpu"`
    /// (the GPU was still busy when the host came back: remaps overlap it),
    /// `"host"` (the GPU was idle: binding is on the critical path, costs
    /// add) or `"unknown"` (not measured: fixed thresholds, or before the
    /// re-plan).
    pub bound: &'static str,
    /// Warm-up medians: host time between steps and GPU time of a step
    /// (binding copies excluded), µs; 0 when not measured.
    pub step_host_us: f64,
    pub step_gpu_us: f64,
    /// Auto re-planned after warm-up (the plan in force is final).
    pub replanned: bool,
    /// Decisions of the plan in force (copy-only slots counted in `plan_copy`).
    pub plan_skip: usize,
    pub plan_remap: usize,
    pub plan_copy: usize,
    /// The slots whose caller's memory was mapped (remapped) at some step:
    /// (entry parameter, slot bytes, maps), most mapped first, at most
    /// [`REMAPPED_LISTED`]. Two maps per slot are the first binding of each
    /// reservation; more mean the caller's buffer keeps changing.
    pub remapped: Vec<(usize, u64, u64)>,
    /// Host time of the steps by phase (setup and captures excluded).
    pub phases: PhaseNs,
    /// What the never-slower guard decided for this program (`None`: not
    /// yet, or no guard): after it, the steps may run as another runner and
    /// these counters stop.
    pub guard: Option<crate::guard::GuardReport>,
    #[serde(flatten)]
    pub counters: Stats,
}

/// Slots listed in [`BindingStats::remapped`].
pub const REMAPPED_LISTED: usize = 8;

/// Host time of VA-stable steps by phase, cumulative ns: where a step's
/// binding time goes (setup, the probe and graph captures are left out).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PhaseNs {
    /// The policy: the bindings, the tracker's actions, shadows and copy
    /// lists (auto's warm-up measurement included).
    pub plan: u64,
    /// Unmap, map and set-access calls (waits excluded).
    pub vmm: u64,
    /// Waiting for a reservation's previous step (before an unmap).
    pub wait: u64,
    /// Copy nodes rewritten in the graph exec (kernel path).
    pub tables: u64,
    /// Batched copies enqueued, both directions.
    pub copies: u64,
    /// The graph launch call.
    pub launch: u64,
    /// The step's event record and the stats.
    pub record: u64,
}

impl PhaseNs {
    /// What was added since `earlier` (a copy taken before).
    pub fn minus(&self, earlier: &PhaseNs) -> PhaseNs {
        PhaseNs {
            plan: self.plan.saturating_sub(earlier.plan),
            vmm: self.vmm.saturating_sub(earlier.vmm),
            wait: self.wait.saturating_sub(earlier.wait),
            tables: self.tables.saturating_sub(earlier.tables),
            copies: self.copies.saturating_sub(earlier.copies),
            launch: self.launch.saturating_sub(earlier.launch),
            record: self.record.saturating_sub(earlier.record),
        }
    }

    pub fn total(&self) -> u64 {
        self.plan + self.vmm + self.wait + self.tables + self.copies + self.launch + self.record
    }
}

/// Adds the time since the last lap to a phase.
pub(crate) struct Lap(std::time::Instant);

impl Lap {
    pub(crate) fn start() -> Self {
        Lap(std::time::Instant::now())
    }

    /// Add the time since the last lap, less `excluded` ns (counted
    /// elsewhere), to `phase`.
    pub(crate) fn to(&mut self, phase: &mut u64, excluded: u64) {
        let now = std::time::Instant::now();
        *phase += ((now - self.0).as_nanos() as u64).saturating_sub(excluded);
        self.0 = now;
    }
}

impl BindingStats {
    /// One line: `phases: us/step plan=.. vmm=.. ...` (means per step).
    pub fn phases_line(&self) -> String {
        let p = &self.phases;
        let n = self.counters.steps.max(1) as f64 * 1e3;
        format!(
            "phases: us/step plan={:.2} vmm={:.2} wait={:.2} tables={:.2} copies={:.2} \
             launch={:.2} record={:.2} total={:.2} (steps={})",
            p.plan as f64 / n,
            p.vmm as f64 / n,
            p.wait as f64 / n,
            p.tables as f64 / n,
            p.copies as f64 / n,
            p.launch as f64 / n,
            p.record as f64 / n,
            p.total() as f64 / n,
            self.counters.steps
        )
    }

    /// Mean host binding time per step, µs.
    pub fn host_us_per_step(&self) -> f64 {
        self.counters.host_binding_ns_mean() as f64 / 1e3
    }

    /// One line: `binding: steps=.. skips=.. ...`.
    pub fn line(&self) -> String {
        let c = &self.counters;
        format!(
            "binding: steps={} skips={} remaps={} copies={} bytes_copied={} unmap_errors={} \
             fallbacks={} mode_switches={} copies_elided={} vmm_calls={} copy_ops={} captures={} \
             threshold={} threshold_bytes={} shadow_bytes={} host_us_per_step={:.2} host_us_max={:.1} \
             copy_slots={} copy_only_slots={} copy_path={} plan=skip:{}/remap:{}/copy:{} \
             bound={} replanned={} step_host_us={:.1} step_gpu_us={:.1} costs={} remap_us={:.1} \
             copy_gbps={:.1} copy_launch_us={:.2}",
            c.steps,
            c.skips,
            c.remaps,
            c.copies,
            c.bytes_copied,
            c.unmap_errors,
            c.fallbacks,
            c.mode_switches,
            self.copies_elided,
            self.vmm_calls,
            self.copy_ops,
            self.captures,
            self.threshold,
            self.threshold_bytes,
            self.shadow_bytes,
            self.host_us_per_step(),
            c.host_binding_ns_max as f64 / 1e3,
            self.copy_slots,
            self.copy_only_slots,
            self.copy_path,
            self.plan_skip,
            self.plan_remap,
            self.plan_copy,
            self.bound,
            self.replanned,
            self.step_host_us,
            self.step_gpu_us,
            self.costs_source,
            self.remap_us,
            self.copy_gbps,
            self.copy_launch_us
        )
    }
}

/// One executable's published stats: the executable writes its own slot
/// (uncontended lock, no allocation), readers copy it when asked.
pub(crate) type StatsSlot = Arc<Mutex<BindingStats>>;

static REGISTRY: Mutex<BTreeMap<String, StatsSlot>> = Mutex::new(BTreeMap::new());

/// Keys in the order they were registered (to drop the oldest first).
static ORDER: Mutex<std::collections::VecDeque<String>> =
    Mutex::new(std::collections::VecDeque::new());

/// Stats of dropped executables kept (the newest): a process that compiles
/// and drops programs for hours keeps a bounded registry.
pub const KEPT_DROPPED: usize = 256;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Register executable `key`'s stats slot (once, when it is created).
pub(crate) fn register(key: &str, stats: &BindingStats) -> StatsSlot {
    let slot = Arc::new(Mutex::new(stats.clone()));
    let mut reg = lock(&REGISTRY);
    let mut order = lock(&ORDER);
    reg.insert(key.to_string(), slot.clone());
    order.push_back(key.to_string());
    trim(&mut reg, &mut order);
    slot
}

/// An executable's stats slot is let go: past the bound, the oldest dropped
/// executables' stats go.
pub(crate) fn release(slot: StatsSlot) {
    drop(slot);
    trim(&mut lock(&REGISTRY), &mut lock(&ORDER));
}

/// Keep the newest [`KEPT_DROPPED`] dropped executables' stats (a slot only
/// the registry holds is a dropped executable's).
fn trim(reg: &mut BTreeMap<String, StatsSlot>, order: &mut std::collections::VecDeque<String>) {
    let dropped = |reg: &BTreeMap<String, StatsSlot>, k: &String| {
        reg.get(k).is_some_and(|s| Arc::strong_count(s) == 1)
    };
    let mut n = order.iter().filter(|k| dropped(reg, k)).count();
    let mut i = 0;
    while n > KEPT_DROPPED && i < order.len() {
        if dropped(reg, &order[i]) {
            let k = order.remove(i).expect("in range");
            reg.remove(&k);
            n -= 1;
        } else {
            i += 1;
        }
    }
}

/// Copy `stats` into its slot (every step: cheap).
pub(crate) fn publish(slot: &StatsSlot, stats: &BindingStats) {
    lock(slot).clone_from(stats);
}

/// Stats of every executable of this process that ran in VA-stable mode
/// (kept after the executable is dropped, the newest [`KEPT_DROPPED`] of
/// those), keyed `name#n`: the numbers as of each executable's last step.
pub fn all_stats() -> BTreeMap<String, BindingStats> {
    let slots: Vec<(String, StatsSlot)> = lock(&REGISTRY)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    slots
        .into_iter()
        .map(|(k, v)| {
            let s = lock(&v).clone();
            (k, s)
        })
        .collect()
}

/// The keys of [`all_stats`] (no stats copied).
pub fn stats_keys() -> std::collections::BTreeSet<String> {
    lock(&REGISTRY).keys().cloned().collect()
}

/// [`all_stats`] as a JSON object.
pub fn all_stats_json() -> String {
    serde_json::to_string(&all_stats()).unwrap_or_else(|_| "{}".into())
}

//! The never-slower guard of [`Mode::Graph`]: a program's first steps are
//! measured as a VA-stable graph, as graph-recapture and eager, on the
//! program itself, and from then on it runs as the fastest.
//!
//! What is measured is the step's *period on the stream*: an event is
//! recorded at the start of every trial step, before any of its work, and a
//! step's time is the elapsed time from its event to the next step's. When
//! the GPU is the bottleneck that is the step's GPU time; when the host is
//! (a launch-bound step), the GPU waits for the next step's work, so the
//! period is the host's time per step. Either way it is what a training loop
//! sees, whatever the caller does between steps (the same for every runner).
//! Events are read with queries, so the trial adds no synchronization,
//! except once: when every trial step is on the stream, the guard waits for
//! the step after the last counted one to start (a host far ahead of the
//! GPU, as under JAX's asynchronous dispatch, would otherwise leave the
//! samples unread and the program undecided). A sample that could not be
//! read does not hold the decision back: it is taken on the samples there
//! are.
//!
//! The schedule ([`Trial`]): graph-recapture first ([`RECAPTURE_WARM_STEPS`]
//! uncounted steps, one per graph it keeps, then [`SAMPLES`] counted). Where it replayed one graph
//! through its counted steps and none of the program's memory is in host
//! memory, it keeps the program and nothing else is tried: it launches the
//! program's kernels at their own addresses with nothing to bind, and the
//! VA-stable graph runs the same kernels plus its binding. The gate's A/B
//! rows showed more: a process's steps ran ~0.1 ms slower from about the
//! VA-stable graph's eighth step on, graph-recapture's later steps in that
//! process included, and never in a process that ran graph-recapture alone
//! (`integration/results/check_0efb68b/step8`). Otherwise the VA-stable
//! runner (its own warm-up: capture, and auto's re-plan after
//! [`xla_vmm_policy::tracker::DEFAULT_REPLAN_AFTER_STEPS`] steps, then
//! [`SAMPLES`] counted steps), then [`SAMPLES`] of eager, only where
//! graph-recapture captured again in most of its counted steps (the
//! program's addresses change from step to step, so its median is a
//! capture's) or part of the program's memory is in host memory (a staged
//! prefill ran 84 ms a step eager against 140 as a VA-stable graph on the
//! H200). Otherwise recapture replayed one graph, eager runs the same
//! kernels launched one by one and cannot be faster, and eager steps cost
//! the steps after them (in `xla-vmm run --schedule`, three eager steps
//! left every later graph step of llama_scan_bf16 ~0.1 ms slower on an
//! H100). A program with memory in host memory runs the VA-stable graph
//! first (the staging is built on it). A runner that a first sample shows
//! [`DROP_RATIO`] times slower than the best so far is not run again.
//!
//! **The decision.** Graph-recapture keeps the program unless the VA-stable
//! graph or eager stands more than [`SWITCH_MARGIN`] below it, a runner's
//! standing being its median plus, for those two, [`UNSEEN_COST_US`]: what
//! their steps cost the process's other steps, which their own periods do
//! not show. Eager steps left every later graph step of llama_scan_bf16
//! ~0.1 ms slower (above); VA-stable graphs slowed a process's later steps,
//! graph-recapture's included, by ~0.1 ms (above); and in MaxText tiny,
//! whose ~20 programs a step are mostly scalar arithmetic whose periods are
//! the whole step's, the runners' medians differ by less than their noise:
//! four of them kept eager ran the default 2.82 ms a step against 2.51 for
//! graph-recapture mode, on an H100 (`integration/results/perf_gate_8ce05e1.md`),
//! and seventeen kept by the VA-stable graph 4.46 against 3.02 on an H200
//! (`perf_gate_ebae679.md`). A program whose steps are long does not notice
//! the handicap; one whose graph-recapture captures a large graph at every
//! step loses more than it to the capture and goes to the VA-stable graph.
//! The decision is logged once at info level and kept in [`GuardReport`].
//!
//! **The watch.** Graph-recapture, chosen on samples that were replays,
//! gives the program to the VA-stable graph for good when it captures again
//! in [`WATCH_CAPTURES`] of [`WATCH_STEPS`] consecutive steps (the
//! program's addresses began to change, and each capture costs the host a
//! recording its samples did not have). Chosen on samples that captured, it
//! already paid for them, and is not watched.
//!
//! **The second look.** A program that another runner keeps after
//! graph-recapture was sampled is measured once more, [`SECOND_LOOK_AFTER`]
//! steps after the decision: [`SAMPLES`] counted steps of the runner that
//! keeps it, [`RECAPTURE_WARM_STEPS`] uncounted of graph-recapture (its
//! captures again: its graphs were released) and [`SAMPLES`] counted; the
//! decision's rule keeps the program for good. The first trial sees each
//! runner a few steps after its start, graph-recapture first, while the
//! process warms up: the gate's A/B rows
//! showed a process's VA-stable steps 4-5% slower from about step 20 on than
//! in the trial, and graph-recapture in a process of its own faster than its
//! trial samples. In MaxText tiny on an H200 every small program of the
//! step's learning-rate arithmetic had graph-recapture periods of 8.1-8.8 ms
//! in its trial (the whole process's steps ran that long then) against
//! 4.6 ms for the VA-stable graph and eager ten steps later, so recapture was
//! dropped; the default ran 4.46 ms a step to graph-recapture mode's 3.02
//! (`integration/results/perf_gate_ebae679.md`). The second look compares
//! the two in the program's steady state, whatever the first samples said.
//!
//! The plan of what to run next is a pure value ([`Trial`]); the events and
//! the decision are the executable's guard's.

use std::collections::VecDeque;

use serde::Serialize;
use xla_vmm_device::{Backend, EventStatus};

use crate::error::{Result, Teardown};
use crate::mode::Mode;

/// Counted steps per runner.
pub const SAMPLES: usize = 3;
/// Steps the VA-stable runner gets before its samples count: the first
/// step's capture and auto's warm-up (re-plan after 4 steps).
pub const VA_WARM_STEPS: usize = 6;
/// Steps graph-recapture gets before its samples count: one per graph it
/// keeps, so that a loop whose arguments take turns among that many buffer
/// sets has captured each of them and its counted steps replay (with one
/// uncounted step, such a loop captured in its counted steps too and was
/// tried as a program whose addresses change every step).
pub const RECAPTURE_WARM_STEPS: usize = crate::recapture::GRAPHS;
/// A runner whose first sample is this many times the best median so far is
/// not sampled again.
pub const DROP_RATIO: f64 = 1.25;
/// A runner must stand this much below the one it displaces (a fraction of
/// the displaced one's standing), so that noise does not move a program.
pub const SWITCH_MARGIN: f64 = 0.01;
/// What a step of the VA-stable graph or of eager costs the process's other
/// steps that its own period does not show, µs: added to their medians
/// against graph-recapture (see the module's docs).
pub const UNSEEN_COST_US: f64 = 100.0;
/// Steps between the first decision and the second look.
pub const SECOND_LOOK_AFTER: u64 = 10;
/// Graph-recapture, once chosen, that captures in this many steps of
/// [`WATCH_STEPS`] consecutive ones gives way to the VA-stable graph.
pub const WATCH_CAPTURES: usize = 3;
pub const WATCH_STEPS: u64 = 16;

/// Which runner executes a step.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runner {
    VaStable,
    Recapture,
    Eager,
}

impl Runner {
    pub const ALL: [Runner; 3] = [Runner::VaStable, Runner::Recapture, Runner::Eager];

    pub fn mode(self) -> Mode {
        match self {
            Runner::VaStable => Mode::Graph,
            Runner::Recapture => Mode::GraphRecapture,
            Runner::Eager => Mode::Eager,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Runner::VaStable => "va-stable graph",
            Runner::Recapture => "graph-recapture",
            Runner::Eager => "eager",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the guard decided, and on what.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GuardReport {
    /// The runner the program uses from `decided_at_step` on.
    pub runner: Runner,
    /// The program's step (0-based) at which the decision was taken.
    pub decided_at_step: u64,
    /// Median step period per runner, µs (`None`: not measured, or dropped
    /// after one sample: then its one sample).
    pub va_stable_us: Option<f64>,
    pub recapture_us: Option<f64>,
    pub eager_us: Option<f64>,
    /// Samples taken per runner (VA-stable, recapture, eager).
    pub samples: [usize; 3],
    /// Eager was not sampled: graph-recapture replayed one graph through
    /// its counted steps, and none of the program's memory is in host
    /// memory (see the module's docs).
    pub eager_skipped: bool,
    /// The VA-stable graph was not tried: graph-recapture replayed one graph
    /// through its counted steps, and none of the program's memory is in
    /// host memory (see the module's docs).
    pub va_stable_skipped: bool,
    /// The second look, once taken (`runner` is its decision then).
    pub second_look: Option<SecondLook>,
    /// Graph-recapture, chosen, captured again in [`WATCH_CAPTURES`] of
    /// [`WATCH_STEPS`] steps: the VA-stable graph took the program at this
    /// step (`runner` says so).
    pub recapture_gave_way_at_step: Option<u64>,
}

/// The second look's figures: the VA-stable graph against graph-recapture
/// in the program's steady state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SecondLook {
    pub decided_at_step: u64,
    /// The medians of the runner that kept the program (one of these two)
    /// and of graph-recapture.
    pub va_stable_us: Option<f64>,
    pub eager_us: Option<f64>,
    pub recapture_us: Option<f64>,
}

/// One step of the trial: which runner, and whether its period counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub runner: Runner,
    pub counted: bool,
}

/// The trial's schedule and its samples: pure (no device), see the module
/// docs.
#[derive(Clone, Debug, Default)]
pub struct Trial {
    /// The second look's schedule: the runner the first trial chose, then
    /// graph-recapture (nothing else).
    second: Option<Runner>,
    /// The VA-stable graph first (part of the program's memory is in host
    /// memory); set at the first step handed out.
    va_first: Option<bool>,
    /// Steps handed out so far.
    issued: usize,
    /// Counted periods per runner, µs.
    samples: [Vec<f64>; 3],
    /// Runners not to sample any more (dropped after one slow sample).
    dropped: [bool; 3],
    /// Graph-recapture's captures so far when its first counted step was
    /// handed out, and its counted steps handed out.
    recapture_captures: Option<u64>,
    recapture_counted: u64,
    /// Eager / the VA-stable graph were left out (graph-recapture did not
    /// capture again, nothing in host memory).
    eager_skipped: bool,
    va_stable_skipped: bool,
}

impl Trial {
    /// The second look's trial: `kept` (the first trial's choice) against
    /// graph-recapture.
    pub fn second_look(kept: Runner) -> Self {
        Trial {
            second: Some(kept),
            ..Default::default()
        }
    }

    /// The fixed schedule, step by step: its runs of (runner, steps,
    /// counted) in order.
    fn schedule(&self, i: usize) -> Option<Planned> {
        use Runner::{Eager, Recapture, VaStable};
        const W: usize = RECAPTURE_WARM_STEPS;
        // (runner, steps, counted).
        let second;
        let runs: &[(Runner, usize, bool)] = match (self.second, self.va_first) {
            // The second look: the kept runner is warm (VA-stable's graphs
            // and binding are there; eager needs none); no third runner.
            (Some(kept), _) => {
                second = [
                    (kept, SAMPLES, true),
                    (Recapture, W, false),
                    (Recapture, SAMPLES, true),
                ];
                &second
            }
            (None, Some(true)) => &[
                (VaStable, VA_WARM_STEPS, false),
                (VaStable, SAMPLES, true),
                (Recapture, W, false),
                (Recapture, SAMPLES, true),
                (Eager, SAMPLES, true),
            ],
            (None, _) => &[
                (Recapture, W, false),
                (Recapture, SAMPLES, true),
                (VaStable, VA_WARM_STEPS, false),
                (VaStable, SAMPLES, true),
                (Eager, SAMPLES, true),
            ],
        };
        let mut i = i;
        for &(runner, steps, counted) in runs {
            if i < steps {
                return Some(Planned { runner, counted });
            }
            i -= steps;
        }
        None
    }

    /// The runner of the next trial step (`None`: every step was handed out;
    /// the default runs until the decision). `captures`: graph-recapture's
    /// captures so far; `host_memory`: part of the program's memory is in
    /// host memory (the VA-stable graph and eager are sampled only then or
    /// if recapture captured in most of its counted steps: a loop whose
    /// buffers take turns captures once per buffer set, then replays).
    pub fn next_step(&mut self, captures: u64, host_memory: bool) -> Option<Planned> {
        self.va_first.get_or_insert(host_memory);
        loop {
            let planned = self.schedule(self.issued)?;
            self.issued += 1;
            let i = planned.runner.index();
            match planned.runner {
                Runner::Recapture if planned.counted && !self.dropped[i] => {
                    self.recapture_captures.get_or_insert(captures);
                    self.recapture_counted += 1;
                }
                Runner::Eager
                    if self.second.is_none()
                        && !self.dropped[i]
                        && !host_memory
                        && !self.recaptured(captures) =>
                {
                    self.dropped[i] = true;
                    self.eager_skipped = true;
                }
                Runner::VaStable
                    if self.second.is_none()
                        && !self.dropped[i]
                        && !host_memory
                        && self.recapture_counted > 0
                        && !self.recaptured(captures) =>
                {
                    self.dropped[i] = true;
                    self.va_stable_skipped = true;
                }
                _ => {}
            }
            if !self.dropped[i] {
                return Some(planned);
            }
        }
    }

    /// Did graph-recapture capture in most of its counted steps (`captures`:
    /// its captures so far, all of them run)?
    fn recaptured(&self, captures: u64) -> bool {
        self.recapture_captures
            .is_some_and(|at| 2 * captures.saturating_sub(at) > self.recapture_counted)
    }

    /// Graph-recapture's counted steps replayed its graph (`captures`: its
    /// captures so far): its samples are a replay's, and a capture later is
    /// a cost they did not see.
    fn recapture_replayed(&self, captures: u64) -> bool {
        self.recapture_captures.is_some() && !self.recaptured(captures)
    }

    /// The watch over a decision `d` taken with `captures` so far: where
    /// graph-recapture won on a replay's samples.
    fn watch_for(&self, d: &GuardReport, captures: u64) -> Option<Watch> {
        (d.runner == Runner::Recapture && self.recapture_replayed(captures))
            .then(|| Watch::new(captures))
    }

    /// Add a counted period of `runner`.
    pub fn sample(&mut self, runner: Runner, us: f64) {
        if !us.is_finite() || us < 0.0 {
            return;
        }
        let i = runner.index();
        self.samples[i].push(us);
        // One sample far behind the best so far: not worth more steps.
        if self.samples[i].len() == 1 {
            if let Some(best) = self.best_median() {
                if us > best * DROP_RATIO {
                    self.dropped[i] = true;
                }
            }
        }
    }

    fn best_median(&self) -> Option<f64> {
        Runner::ALL
            .iter()
            .filter_map(|r| median(&self.samples[r.index()]))
            .min_by(f64::total_cmp)
    }

    /// The runner of a step after the schedule, before the decision: the
    /// fastest median so far among the runners not dropped (`None`: nothing
    /// sampled yet). Without it such a step ran the VA-stable graph, which a
    /// program whose graph-recapture replayed then made (its probe, its
    /// reservations and captures) just before deciding against it.
    pub fn leading(&self) -> Option<Runner> {
        Runner::ALL
            .iter()
            .filter(|r| !self.dropped[r.index()])
            .filter_map(|&r| median(&self.samples[r.index()]).map(|m| (r, m)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(r, _)| r)
    }

    /// Every step of the schedule was handed out.
    pub fn exhausted(&self) -> bool {
        self.schedule(self.issued).is_none()
    }

    /// Every planned sample is in (a dropped runner needs no more).
    pub fn complete(&self) -> bool {
        let second = self.second.map(|kept| [kept, Runner::Recapture]);
        let sampled: &[Runner] = match &second {
            Some(two) => two,
            None => &Runner::ALL,
        };
        self.schedule(self.issued).is_none()
            && sampled.iter().all(|r| {
                let i = r.index();
                self.dropped[i] || self.samples[i].len() >= SAMPLES
            })
    }

    /// The decision (once [`Trial::complete`]): graph-recapture keeps the
    /// program unless another runner's median plus [`UNSEEN_COST_US`] is
    /// more than [`SWITCH_MARGIN`] below the best so far, tried in the order
    /// graph-recapture, the VA-stable graph, eager (see the module's docs).
    pub fn decide(&self, step: u64) -> GuardReport {
        let m = |r: Runner| median(&self.samples[r.index()]);
        let mut kept: Option<(Runner, f64)> = None;
        for r in [Runner::Recapture, Runner::VaStable, Runner::Eager] {
            if self.dropped[r.index()] {
                continue;
            }
            let Some(t) = m(r) else { continue };
            let standing = if r == Runner::Recapture {
                t
            } else {
                t + UNSEEN_COST_US
            };
            if kept.is_none_or(|(_, best)| standing < best * (1.0 - SWITCH_MARGIN)) {
                kept = Some((r, standing));
            }
        }
        let runner = kept.map_or(Runner::VaStable, |(r, _)| r);
        GuardReport {
            runner,
            decided_at_step: step,
            va_stable_us: m(Runner::VaStable),
            recapture_us: m(Runner::Recapture),
            eager_us: m(Runner::Eager),
            samples: [0, 1, 2].map(|i| self.samples[i].len()),
            eager_skipped: self.eager_skipped,
            va_stable_skipped: self.va_stable_skipped,
            second_look: None,
            recapture_gave_way_at_step: None,
        }
    }

    /// After the first trial's decision `d`: does the program get a second
    /// look (another runner kept it, graph-recapture's samples were taken)?
    /// Its samples were the trial's first, taken while the process warmed
    /// up, however far behind they came out (see the module's docs).
    pub fn wants_second_look(&self, d: &GuardReport) -> bool {
        self.second.is_none() && d.runner != Runner::Recapture && d.recapture_us.is_some()
    }
}

/// Graph-recapture's captures after it was chosen: the steps that captured
/// within the last [`WATCH_STEPS`] (see the module's docs).
#[derive(Clone, Debug, Default)]
pub struct Watch {
    captures: u64,
    at: VecDeque<u64>,
}

impl Watch {
    /// From the decision, with graph-recapture's `captures` so far.
    pub fn new(captures: u64) -> Self {
        Watch {
            captures,
            at: VecDeque::with_capacity(WATCH_CAPTURES),
        }
    }

    /// After program step `step`, with `captures` so far: give way to the
    /// VA-stable graph?
    pub fn observe(&mut self, step: u64, captures: u64) -> bool {
        if captures > self.captures {
            self.captures = captures;
            self.at.push_back(step);
        }
        while self.at.front().is_some_and(|&s| s + WATCH_STEPS <= step) {
            self.at.pop_front();
        }
        self.at.len() >= WATCH_CAPTURES
    }
}

/// Where the guard is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// A trial is running (the first, or the second look).
    Trial,
    /// Decided; the second look starts at this step.
    Waiting(u64),
    /// Decided for good.
    Done,
}

/// The median of `v` (`None`: empty); the guard's and the VA-stable
/// warm-up's.
pub(crate) fn median(v: &[f64]) -> Option<f64> {
    let mut w = v.to_vec();
    w.sort_by(f64::total_cmp);
    match w.len() {
        0 => None,
        n if n % 2 == 1 => Some(w[n / 2]),
        n => Some((w[n / 2 - 1] + w[n / 2]) / 2.0),
    }
}

/// A step whose start event is on the stream.
struct Mark<B: Backend> {
    event: B::Event,
    planned: Planned,
}

/// The guard of one executable: the trial, its events, the decision.
pub(crate) struct Guard<B: Backend> {
    trial: Trial,
    phase: Phase,
    marks: VecDeque<Mark<B>>,
    /// Program steps run under the guard.
    step: u64,
    decided: Option<GuardReport>,
    /// While graph-recapture keeps the program.
    watch: Option<Watch>,
}

impl<B: Backend> Guard<B> {
    pub(crate) fn new() -> Self {
        Guard {
            trial: Trial::default(),
            phase: Phase::Trial,
            marks: VecDeque::new(),
            step: 0,
            decided: None,
            watch: None,
        }
    }

    pub(crate) fn report(&self) -> Option<&GuardReport> {
        self.decided.as_ref()
    }

    /// The runner of the next step, with its start event recorded on
    /// `stream` while the trial lasts. `captures`, `host_memory`: as
    /// [`Trial::next_step`] takes them.
    pub(crate) fn begin_step(
        &mut self,
        be: &B,
        stream: &B::Stream,
        captures: u64,
        host_memory: bool,
    ) -> Result<Runner> {
        let current = self.decided.as_ref().map_or(Runner::VaStable, |d| d.runner);
        match self.phase {
            Phase::Done => return Ok(current),
            Phase::Waiting(at) if self.step < at => return Ok(current),
            Phase::Waiting(_) => {
                self.trial = Trial::second_look(current);
                self.phase = Phase::Trial;
            }
            Phase::Trial => {}
        }
        let planned = self
            .trial
            .next_step(captures, host_memory)
            .unwrap_or(Planned {
                runner: self.trial.leading().unwrap_or(current),
                counted: false,
            });
        let event = be.event_create()?;
        if let Err(e) = be.event_record(&event, stream) {
            Teardown::new("a guard event").check("event_destroy", be.event_destroy(event));
            return Err(e.into());
        }
        self.marks.push_back(Mark { event, planned });
        Ok(planned.runner)
    }

    /// After a step: read the periods the device has finished (queries
    /// only), and decide once the trial is complete; once graph-recapture
    /// keeps the program, watch its captures (`captures`: so far). `true`: a
    /// decision was taken at this step ([`Guard::report`] has it).
    pub(crate) fn end_step(&mut self, be: &B, executable: &str, captures: u64) -> bool {
        self.step += 1;
        if self.phase != Phase::Trial {
            return self.watch_recapture(executable, captures);
        }
        let mut t = Teardown::new("the guard's events");
        let exhausted = self.trial.exhausted();
        if exhausted && self.marks.iter().any(|m| m.planned.counted) {
            if let Some(last) = self.marks.back().filter(|m| !m.planned.counted) {
                // Once per program: every counted period is closed by an
                // event on the stream; wait for the last one.
                let _ = be.event_synchronize(&last.event);
            }
        }
        // A period needs the next step's start event to have completed.
        while self.marks.len() >= 2 {
            let done = matches!(
                be.event_query(&self.marks[1].event),
                Ok(EventStatus::Complete)
            );
            if !done {
                break;
            }
            let m = self.marks.pop_front().expect("two marks");
            if m.planned.counted {
                if let Ok(ms) = be.event_elapsed_ms(&m.event, &self.marks[0].event) {
                    self.trial.sample(m.planned.runner, f64::from(ms) * 1e3);
                }
            }
            t.check("event_destroy", be.event_destroy(m.event));
        }
        let unread = self.marks.iter().any(|m| m.planned.counted);
        if !(self.trial.complete() || (exhausted && !unread)) {
            return false;
        }
        let d = self.trial.decide(self.step);
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |u| format!("{:.3}", u / 1e3));
        match self.decided.as_mut() {
            Some(first) => {
                tracing::info!(executable, runner = d.runner.name(), step = d.decided_at_step,
                    va_stable_ms = %ms(d.va_stable_us), recapture_ms = %ms(d.recapture_us),
                    eager_ms = %ms(d.eager_us),
                    "never-slower guard, second look: the program runs as {} from here on",
                    d.runner.name());
                first.runner = d.runner;
                self.watch = self.trial.watch_for(&d, captures);
                first.second_look = Some(SecondLook {
                    decided_at_step: d.decided_at_step,
                    va_stable_us: d.va_stable_us,
                    eager_us: d.eager_us,
                    recapture_us: d.recapture_us,
                });
                self.phase = Phase::Done;
            }
            None => {
                tracing::info!(executable, runner = d.runner.name(), step = d.decided_at_step,
                    va_stable_ms = %ms(d.va_stable_us), recapture_ms = %ms(d.recapture_us),
                    eager_ms = %ms(d.eager_us),
                    "never-slower guard: the program runs as {} from here on (median step periods)",
                    d.runner.name());
                self.phase = if self.trial.wants_second_look(&d) {
                    Phase::Waiting(self.step + SECOND_LOOK_AFTER)
                } else {
                    Phase::Done
                };
                self.watch = self.trial.watch_for(&d, captures);
                self.decided = Some(d);
            }
        }
        self.release(be);
        true
    }

    /// Graph-recapture keeps the program: after its [`WATCH_CAPTURES`]th
    /// capture in [`WATCH_STEPS`] steps the VA-stable graph takes it for
    /// good (`true`).
    fn watch_recapture(&mut self, executable: &str, captures: u64) -> bool {
        let Some(w) = self.watch.as_mut() else {
            return false;
        };
        if !w.observe(self.step - 1, captures) {
            return false;
        }
        self.watch = None;
        let Some(d) = self.decided.as_mut() else {
            return false;
        };
        d.runner = Runner::VaStable;
        d.recapture_gave_way_at_step = Some(self.step);
        self.phase = Phase::Done;
        tracing::info!(executable, step = self.step, captures,
            "never-slower guard: graph-recapture captured again in {WATCH_CAPTURES} of {WATCH_STEPS} steps; \
             the program runs as the VA-stable graph from here on");
        true
    }

    /// Destroy the events (an event the device has not reached yet is
    /// released by the driver once it has).
    pub(crate) fn release(&mut self, be: &B) {
        let mut t = Teardown::new("the guard's events");
        for m in self.marks.drain(..) {
            t.check("event_destroy", be.event_destroy(m.event));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step of `t`'s schedule, its counted ones sampled at `times`:
    /// the trial and the steps it ran. `recaptures`: every graph-recapture
    /// step captures (the program's addresses change every step).
    fn sample_all(
        mut t: Trial,
        times: impl Fn(Runner) -> f64,
        recaptures: bool,
    ) -> (Trial, Vec<Planned>) {
        let (mut ran, mut captures) = (Vec::new(), 0);
        while let Some(p) = t.next_step(captures, false) {
            if p.runner == Runner::Recapture && (recaptures || captures == 0) {
                captures += 1;
            }
            ran.push(p);
            if p.counted {
                t.sample(p.runner, times(p.runner));
            }
        }
        assert!(t.complete());
        (t, ran)
    }

    fn run_trial(times: impl Fn(Runner) -> f64) -> (GuardReport, Vec<Runner>) {
        let (t, ran) = sample_all(Trial::default(), times, true);
        (
            t.decide(ran.len() as u64),
            ran.iter().map(|p| p.runner).collect(),
        )
    }

    #[test]
    fn the_fastest_runner_wins_and_a_slow_one_is_dropped_after_one_sample() {
        let (d, ran) = run_trial(|r| match r {
            Runner::VaStable => 3200.0,
            Runner::Recapture => 3100.0,
            Runner::Eager => 5000.0,
        });
        assert_eq!(d.runner, Runner::Recapture);
        assert_eq!(
            d.samples,
            [SAMPLES, SAMPLES, 1],
            "eager dropped after one sample"
        );
        assert_eq!(ran.iter().filter(|r| **r == Runner::Eager).count(), 1);
        assert_eq!(
            ran.len(),
            RECAPTURE_WARM_STEPS + SAMPLES + VA_WARM_STEPS + SAMPLES + 1
        );
        assert_eq!(d.va_stable_us, Some(3200.0));
    }

    #[test]
    fn eager_is_sampled_only_where_graph_recapture_captured_during_its_counted_steps() {
        let times = |r| match r {
            Runner::VaStable => 1000.0,
            Runner::Recapture => 1050.0,
            Runner::Eager => 900.0,
        };
        // One capture (its uncounted first step), then replays: neither
        // eager nor the VA-stable graph is tried, recapture keeps it.
        let (t, ran) = sample_all(Trial::default(), times, false);
        assert!(ran.iter().all(|p| p.runner == Runner::Recapture), "{ran:?}");
        let d = t.decide(ran.len() as u64);
        assert_eq!(
            (d.runner, d.samples, d.eager_us, d.va_stable_us),
            (Runner::Recapture, [0, SAMPLES, 0], None, None)
        );
        assert!(d.eager_skipped && d.va_stable_skipped);
        assert!(!t.wants_second_look(&d));
        assert_eq!(t.leading(), Some(Runner::Recapture), "until the decision");
        assert_eq!(ran.len(), RECAPTURE_WARM_STEPS + SAMPLES);
        // Captured at every step: eager is measured, and wins here.
        let (t, _) = sample_all(Trial::default(), times, true);
        let d = t.decide(20);
        assert_eq!((d.runner, d.samples), (Runner::Eager, [SAMPLES; 3]));
        assert!(!d.eager_skipped);
        // Buffer sets taking turns, as many as graph-recapture keeps
        // graphs: captured in its uncounted steps, replayed in its counted
        // ones: neither eager nor the VA-stable graph. One set more: it
        // captures at every step, and both are tried.
        for (sets, tried) in [
            (2, false),
            (crate::recapture::GRAPHS, false),
            (crate::recapture::GRAPHS + 1, true),
        ] {
            let mut t = Trial::default();
            let mut captures = 0;
            let mut others = 0;
            let mut turn = 0;
            while let Some(p) = t.next_step(captures, false) {
                if p.runner == Runner::Recapture {
                    // Least recently used graphs: a new set every step past
                    // GRAPHS sets, else each set once.
                    if sets > crate::recapture::GRAPHS || turn < sets {
                        captures += 1;
                    }
                    turn += 1;
                }
                others += usize::from(p.runner != Runner::Recapture);
                if p.counted {
                    t.sample(p.runner, times(p.runner));
                }
            }
            let d = t.decide(20);
            assert_eq!(others > 0, tried, "{sets} sets: {d:?}");
            assert_eq!(d.eager_skipped, !tried);
        }
        // Replays, but part of its memory is in host memory: the VA-stable
        // graph first, as before, and eager too.
        let mut t = Trial::default();
        let mut ran = Vec::new();
        while let Some(p) = t.next_step(1, true) {
            ran.push(p.runner);
            if p.counted {
                t.sample(p.runner, times(p.runner));
            }
        }
        assert_eq!(ran[0], Runner::VaStable);
        let d = t.decide(20);
        assert_eq!((d.runner, d.samples), (Runner::Eager, [SAMPLES; 3]));
        assert!(!d.va_stable_skipped && !d.eager_skipped);
    }

    #[test]
    fn recapture_keeps_the_program_unless_beaten_by_what_the_others_cost_unseen() {
        // The VA-stable graph 5% faster at 1 ms a step: less than its
        // unseen cost, recapture keeps the program.
        let (d, _) = run_trial(|r| match r {
            Runner::VaStable => 1000.0,
            Runner::Recapture => 1050.0,
            Runner::Eager => 1150.0,
        });
        assert_eq!(d.runner, Runner::Recapture);
        // 20% faster: the VA-stable graph takes it; eager, with the same
        // unseen cost, takes it from the VA-stable graph only when faster.
        for (eager, runner) in [(900.0, Runner::VaStable), (760.0, Runner::Eager)] {
            let (d, _) = run_trial(|r| match r {
                Runner::VaStable => 840.0,
                Runner::Recapture => 1050.0,
                Runner::Eager => eager,
            });
            assert_eq!(d.runner, runner);
        }
        // At 100 ms a step the unseen cost is 0.1%: 2% is a win.
        let (d, _) = run_trial(|r| match r {
            Runner::VaStable => 100_000.0,
            Runner::Recapture => 102_000.0,
            Runner::Eager => 130_000.0,
        });
        assert_eq!(d.runner, Runner::VaStable);
        let (d, _) = run_trial(|r| match r {
            Runner::VaStable => 1000.0,
            Runner::Recapture => 1100.0,
            Runner::Eager => 900.0,
        });
        assert_eq!(d.runner, Runner::Eager);
        assert_eq!(d.samples, [SAMPLES; 3]);
    }

    #[test]
    fn a_va_stable_decision_gets_a_second_look_against_recapture_alone() {
        // Kept VA-stable, recapture 25% slower in the trial: a second look.
        let (first, _) = sample_all(
            Trial::default(),
            |r| match r {
                Runner::VaStable => 1000.0,
                Runner::Recapture => 1240.0,
                Runner::Eager => 2000.0,
            },
            true,
        );
        let d = first.decide(17);
        assert_eq!(d.runner, Runner::VaStable);
        assert!(first.wants_second_look(&d));
        // In the steady state recapture is 4% faster: it takes the program.
        let (second, ran) = sample_all(
            Trial::second_look(Runner::VaStable),
            |r| {
                if r == Runner::VaStable {
                    1000.0
                } else {
                    960.0
                }
            },
            true,
        );
        let ran: Vec<_> = ran.iter().map(|p| (p.runner, p.counted)).collect();
        let mut want = vec![(Runner::VaStable, true); SAMPLES];
        want.extend(vec![(Runner::Recapture, false); RECAPTURE_WARM_STEPS]);
        want.extend(vec![(Runner::Recapture, true); SAMPLES]);
        assert_eq!(ran, want, "no eager, recapture captured again first");
        let s = second.decide(40);
        assert_eq!((s.runner, s.eager_us), (Runner::Recapture, None));
        assert!(!second.wants_second_look(&s), "one second look");
    }

    /// [`second_look_run`] until its first decision keeps `kept`, three
    /// tries at most: sleeps only overshoot, but on a loaded machine by
    /// milliseconds, and a first trial that kept another runner has not the
    /// second look the callers test. The guard and its decisions.
    fn second_look_scenario(
        be: &xla_vmm_device::host::HostBackend,
        stream: &<xla_vmm_device::host::HostBackend as Backend>::Stream,
        eager_ms: f64,
        kept: Runner,
    ) -> (
        Guard<xla_vmm_device::host::HostBackend>,
        Vec<(u64, GuardReport)>,
    ) {
        let mut tries = 0;
        loop {
            tries += 1;
            let (mut g, d) = second_look_run(be, stream, eager_ms);
            let other = d.first().is_some_and(|(_, r)| r.runner != kept);
            if !other || tries == 3 {
                return (g, d);
            }
            g.release(be);
        }
    }

    /// 60 steps of a guard on `be`'s `stream` whose runners take: VA-stable
    /// 6 ms; recapture 6.6 ms until the first decision, 4.2 ms after it.
    /// The guard and its decisions (step, report).
    fn second_look_run(
        be: &xla_vmm_device::host::HostBackend,
        stream: &<xla_vmm_device::host::HostBackend as Backend>::Stream,
        eager_ms: f64,
    ) -> (
        Guard<xla_vmm_device::host::HostBackend>,
        Vec<(u64, GuardReport)>,
    ) {
        let mut g = Guard::new();
        let mut decisions = Vec::new();
        let mut captures = 0;
        for step in 0..60u64 {
            // Graph-recapture captures at every step of the first trial (so
            // the VA-stable graph and eager are tried), then replays.
            let runner = g.begin_step(be, stream, captures, false).unwrap();
            let ms = match runner {
                Runner::VaStable => 6.0,
                Runner::Recapture if g.report().is_none() => {
                    captures += 1;
                    6.6
                }
                Runner::Recapture => 4.2,
                Runner::Eager => eager_ms,
            };
            std::thread::sleep(std::time::Duration::from_secs_f64(ms / 1e3));
            if g.end_step(be, "second_look_test", captures) {
                decisions.push((step, g.report().unwrap().clone()));
            }
        }
        (g, decisions)
    }

    #[test]
    fn the_guard_switches_at_its_second_look_when_recapture_is_faster_then() {
        // Step periods on the host backend's stream: the wall time between
        // steps (`second_look_run`): kept VA-stable, then recapture.
        use xla_vmm_device::host::HostBackend;
        let be = HostBackend::new(Default::default()).unwrap();
        let stream = be.stream_create().unwrap();
        // Eager's first sample drops it.
        let (mut g, decisions) = second_look_scenario(&be, &stream, 9.0, Runner::VaStable);
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        let (first, last) = (&decisions[0].1, &decisions[1].1);
        assert_eq!(first.runner, Runner::VaStable, "{first:?}");
        assert!(first.second_look.is_none());
        assert_eq!(last.runner, Runner::Recapture, "{last:?}");
        let s = last.second_look.as_ref().unwrap();
        assert!(s.decided_at_step >= first.decided_at_step + SECOND_LOOK_AFTER);
        assert!(s.recapture_us.unwrap() < s.va_stable_us.unwrap());
        assert_eq!(
            g.begin_step(&be, &stream, 1, false).unwrap(),
            Runner::Recapture
        );
        g.release(&be);
        be.stream_synchronize(&stream).unwrap();
        be.stream_destroy(stream).unwrap();
        assert_eq!(be.outstanding().events, 0, "the guard's events destroyed");
    }

    #[test]
    fn an_eager_kept_programs_second_look_records_eagers_median() {
        // Eager at 4.8 ms keeps the program (the VA-stable graph 6.0,
        // recapture capturing 6.6); at the second look recapture (4.2) takes
        // it, and the look says what eager measured.
        use xla_vmm_device::host::HostBackend;
        let be = HostBackend::new(Default::default()).unwrap();
        let stream = be.stream_create().unwrap();
        let (mut g, decisions) = second_look_scenario(&be, &stream, 4.8, Runner::Eager);
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        assert_eq!(decisions[0].1.runner, Runner::Eager, "{decisions:?}");
        let last = &decisions[1].1;
        assert_eq!(last.runner, Runner::Recapture, "{last:?}");
        let s = last.second_look.as_ref().unwrap();
        assert_eq!(s.va_stable_us, None, "the VA-stable graph not run again");
        assert!(s.recapture_us.unwrap() < s.eager_us.unwrap(), "{s:?}");
        g.release(&be);
        be.stream_synchronize(&stream).unwrap();
        be.stream_destroy(stream).unwrap();
        assert_eq!(be.outstanding().events, 0);
    }

    #[test]
    fn a_second_look_wherever_another_runner_than_recapture_keeps_the_program() {
        // However far behind graph-recapture's trial samples came out.
        for (rec, eager, runner, second) in [
            (1400.0, 1500.0, Runner::VaStable, true),
            (1100.0, 800.0, Runner::Eager, true),
            (900.0, 1500.0, Runner::Recapture, false),
        ] {
            let (t, _) = sample_all(
                Trial::default(),
                |r| match r {
                    Runner::VaStable => 1000.0,
                    Runner::Recapture => rec,
                    Runner::Eager => eager,
                },
                true,
            );
            let d = t.decide(20);
            assert_eq!(d.runner, runner);
            assert_eq!(t.wants_second_look(&d), second, "{runner:?}");
        }
        // Eager kept: the second look runs eager (nothing of the VA-stable
        // graph), then graph-recapture; the faster keeps the program.
        for (rec, runner) in [(900.0, Runner::Recapture), (1000.0, Runner::Eager)] {
            let (t, ran) = sample_all(
                Trial::second_look(Runner::Eager),
                |r| match r {
                    Runner::Eager => 800.0,
                    Runner::Recapture => rec,
                    Runner::VaStable => unreachable!("no VA-stable step"),
                },
                true,
            );
            let mut want = vec![(Runner::Eager, true); SAMPLES];
            want.extend(vec![(Runner::Recapture, false); RECAPTURE_WARM_STEPS]);
            want.extend(vec![(Runner::Recapture, true); SAMPLES]);
            let ran: Vec<_> = ran.iter().map(|p| (p.runner, p.counted)).collect();
            assert_eq!(ran, want);
            let d = t.decide(40);
            assert_eq!(d.runner, runner);
            assert!(!t.wants_second_look(&d), "one second look");
        }
    }

    #[test]
    fn chosen_graph_recapture_gives_way_when_it_keeps_capturing() {
        // Captures far apart: it keeps the program.
        let mut w = Watch::new(5);
        for (step, caps) in [(20, 6), (40, 7), (60, 8), (61, 8), (90, 9)] {
            assert!(!w.observe(step, caps), "step {step}");
        }
        // Three captures within WATCH_STEPS steps: it gives way.
        let mut w = Watch::new(1);
        assert!(!w.observe(30, 2));
        assert!(!w.observe(31, 2), "no new capture");
        assert!(!w.observe(30 + WATCH_STEPS - 2, 3));
        assert!(w.observe(30 + WATCH_STEPS - 1, 4));
        // Only a decision on a replay's samples is watched: one on samples
        // that captured already paid for its captures.
        let (t, _) = sample_all(
            Trial::default(),
            |r| {
                if r == Runner::Recapture {
                    900.0
                } else {
                    1000.0
                }
            },
            true,
        );
        let d = t.decide(20);
        assert_eq!(d.runner, Runner::Recapture);
        let captures = (RECAPTURE_WARM_STEPS + SAMPLES) as u64;
        assert!(t.watch_for(&d, captures).is_none());
        let (t, _) = sample_all(Trial::default(), |_| 1000.0, false);
        assert!(t.watch_for(&t.decide(5), 1).is_some());
        // On the guard: recapture replays through its trial and keeps the
        // program; then the addresses change at every step.
        use xla_vmm_device::host::HostBackend;
        let be = HostBackend::new(Default::default()).unwrap();
        let stream = be.stream_create().unwrap();
        let mut g = Guard::new();
        let mut captures = 0;
        let mut decisions = Vec::new();
        let mut ran = Vec::new();
        for step in 0..40u64 {
            let runner = g.begin_step(&be, &stream, captures, false).unwrap();
            ran.push(runner);
            if runner == Runner::Recapture && (step == 0 || step >= 20) {
                captures += 1;
            }
            be.stream_synchronize(&stream).unwrap();
            if g.end_step(&be, "watch_test", captures) {
                decisions.push((step, g.report().unwrap().clone()));
            }
        }
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        assert!(
            ran[..=decisions[1].0 as usize]
                .iter()
                .all(|&r| r == Runner::Recapture),
            "no other runner before the watch: {ran:?}"
        );
        let first = &decisions[0].1;
        assert_eq!(first.runner, Runner::Recapture, "{first:?}");
        assert!(first.va_stable_skipped && first.recapture_gave_way_at_step.is_none());
        let (at, last) = (decisions[1].0, &decisions[1].1);
        assert_eq!(at, 20 + WATCH_CAPTURES as u64 - 1, "{last:?}");
        assert_eq!(last.runner, Runner::VaStable);
        assert_eq!(last.recapture_gave_way_at_step, Some(at + 1));
        assert_eq!(
            g.begin_step(&be, &stream, captures + 5, false).unwrap(),
            Runner::VaStable
        );
        assert!(!g.end_step(&be, "watch_test", captures + 9), "for good");
        g.release(&be);
        be.stream_destroy(stream).unwrap();
        assert_eq!(be.outstanding().events, 0);
    }

    #[test]
    fn medians_resist_one_outlier_and_bad_samples_are_ignored() {
        let mut t = Trial::default();
        let mut k = [0; 3];
        let mut captures = 0;
        while let Some(p) = t.next_step(captures, false) {
            captures += u64::from(p.runner == Runner::Recapture);
            if p.counted {
                k[p.runner.index()] += 1;
                let us = match (p.runner, k[p.runner.index()]) {
                    (Runner::VaStable, 2) => 90_000.0, // a pause between steps
                    (Runner::VaStable, _) => 800.0,
                    (Runner::Recapture, 2) => f64::NAN,
                    (Runner::Recapture, _) => 1050.0,
                    (Runner::Eager, _) => 1040.0,
                };
                t.sample(p.runner, us);
            }
        }
        // The NaN was not a sample: recapture is short of one.
        assert!(!t.complete());
        t.sample(Runner::Recapture, 1050.0);
        assert!(t.complete());
        let d = t.decide(20);
        assert_eq!((d.runner, d.va_stable_us), (Runner::VaStable, Some(800.0)));
    }
}

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
//! The schedule ([`Trial`]): the VA-stable runner first (its own warm-up:
//! capture, and auto's re-plan after
//! [`xla_vmm_policy::tracker::DEFAULT_REPLAN_AFTER_STEPS`] steps), then
//! [`SAMPLES`] counted steps of it; one uncounted step of graph-recapture
//! (its capture), then [`SAMPLES`] counted; then [`SAMPLES`] of eager. A
//! runner that a first sample shows [`DROP_RATIO`] times slower than the best
//! so far is not run again. The fastest median wins; the VA-stable graph
//! keeps the program unless another runner is more than [`SWITCH_MARGIN`]
//! faster (it is the default, and noise must not move a program). The
//! decision is logged once at info level and kept in [`GuardReport`].
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
/// A runner whose first sample is this many times the best median so far is
/// not sampled again.
pub const DROP_RATIO: f64 = 1.25;
/// Another runner must be this much faster than the VA-stable graph to take
/// its place (a fraction of the VA-stable median).
pub const SWITCH_MARGIN: f64 = 0.01;

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
    /// Steps handed out so far.
    issued: usize,
    /// Counted periods per runner, µs.
    samples: [Vec<f64>; 3],
    /// Runners not to sample any more (dropped after one slow sample).
    dropped: [bool; 3],
}

impl Trial {
    /// The fixed schedule, step by step (runner, counted).
    fn schedule(i: usize) -> Option<Planned> {
        let p = |runner, counted| Some(Planned { runner, counted });
        let va = VA_WARM_STEPS + SAMPLES;
        match i {
            i if i < VA_WARM_STEPS => p(Runner::VaStable, false),
            i if i < va => p(Runner::VaStable, true),
            i if i == va => p(Runner::Recapture, false),
            i if i <= va + SAMPLES => p(Runner::Recapture, true),
            i if i <= va + 2 * SAMPLES => p(Runner::Eager, true),
            _ => None,
        }
    }

    /// The runner of the next trial step (`None`: every step was handed out;
    /// the default runs until the decision).
    pub fn next_step(&mut self) -> Option<Planned> {
        loop {
            let planned = Self::schedule(self.issued)?;
            self.issued += 1;
            if !self.dropped[planned.runner.index()] {
                return Some(planned);
            }
        }
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

    /// Every step of the schedule was handed out.
    pub fn exhausted(&self) -> bool {
        Self::schedule(self.issued).is_none()
    }

    /// Every planned sample is in (a dropped runner needs no more).
    pub fn complete(&self) -> bool {
        Self::schedule(self.issued).is_none()
            && Runner::ALL.iter().all(|r| {
                let i = r.index();
                self.dropped[i] || self.samples[i].len() >= SAMPLES
            })
    }

    /// The decision (once [`Trial::complete`]).
    pub fn decide(&self, step: u64) -> GuardReport {
        let m = |r: Runner| median(&self.samples[r.index()]);
        let va = m(Runner::VaStable);
        let mut runner = Runner::VaStable;
        let mut best = va.unwrap_or(f64::INFINITY);
        for r in [Runner::Recapture, Runner::Eager] {
            if self.dropped[r.index()] {
                continue;
            }
            if let Some(t) = m(r) {
                let beats_va = va.is_none_or(|v| t < v * (1.0 - SWITCH_MARGIN));
                if beats_va && t < best {
                    best = t;
                    runner = r;
                }
            }
        }
        GuardReport {
            runner,
            decided_at_step: step,
            va_stable_us: va,
            recapture_us: m(Runner::Recapture),
            eager_us: m(Runner::Eager),
            samples: [0, 1, 2].map(|i| self.samples[i].len()),
        }
    }
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
    marks: VecDeque<Mark<B>>,
    /// Program steps run under the guard.
    step: u64,
    decided: Option<GuardReport>,
}

impl<B: Backend> Guard<B> {
    pub(crate) fn new() -> Self {
        Guard {
            trial: Trial::default(),
            marks: VecDeque::new(),
            step: 0,
            decided: None,
        }
    }

    pub(crate) fn report(&self) -> Option<&GuardReport> {
        self.decided.as_ref()
    }

    /// The runner of the next step, with its start event recorded on
    /// `stream` while the trial lasts.
    pub(crate) fn begin_step(&mut self, be: &B, stream: &B::Stream) -> Result<Runner> {
        if let Some(d) = &self.decided {
            return Ok(d.runner);
        }
        let planned = self.trial.next_step().unwrap_or(Planned {
            runner: Runner::VaStable,
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
    /// only), and decide once the trial is complete.
    pub(crate) fn end_step(&mut self, be: &B, executable: &str) {
        self.step += 1;
        if self.decided.is_some() {
            return;
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
        if self.trial.complete() || (exhausted && !unread) {
            let d = self.trial.decide(self.step);
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |u| format!("{:.3}", u / 1e3));
            tracing::info!(executable, runner = d.runner.name(), step = d.decided_at_step,
                va_stable_ms = %ms(d.va_stable_us), recapture_ms = %ms(d.recapture_us),
                eager_ms = %ms(d.eager_us),
                "never-slower guard: the program runs as {} from here on (median step periods)",
                d.runner.name());
            self.decided = Some(d);
            self.release(be);
        }
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

    fn run_trial(times: impl Fn(Runner) -> f64) -> (GuardReport, Vec<Runner>) {
        let mut t = Trial::default();
        let mut ran = Vec::new();
        while let Some(p) = t.next_step() {
            ran.push(p.runner);
            if p.counted {
                t.sample(p.runner, times(p.runner));
            }
        }
        assert!(t.complete());
        (t.decide(ran.len() as u64), ran)
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
        assert_eq!(ran.len(), VA_WARM_STEPS + SAMPLES + 1 + SAMPLES + 1);
        assert_eq!(d.va_stable_us, Some(3200.0));
    }

    #[test]
    fn va_stable_keeps_the_program_unless_beaten_by_the_margin() {
        let (d, _) = run_trial(|r| match r {
            Runner::VaStable => 1000.0,
            Runner::Recapture => 995.0,
            Runner::Eager => 1150.0,
        });
        assert_eq!(d.runner, Runner::VaStable, "0.5% is noise");
        let (d, _) = run_trial(|r| match r {
            Runner::VaStable => 1000.0,
            Runner::Recapture => 1100.0,
            Runner::Eager => 900.0,
        });
        assert_eq!(d.runner, Runner::Eager);
        assert_eq!(d.samples, [SAMPLES; 3]);
    }

    #[test]
    fn medians_resist_one_outlier_and_bad_samples_are_ignored() {
        let mut t = Trial::default();
        let mut k = 0;
        while let Some(p) = t.next_step() {
            if p.counted {
                k += 1;
                let us = match (p.runner, k) {
                    (Runner::VaStable, 2) => 90_000.0, // a pause between steps
                    (Runner::VaStable, _) => 1000.0,
                    (Runner::Recapture, 5) => f64::NAN,
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
        assert_eq!((d.runner, d.va_stable_us), (Runner::VaStable, Some(1000.0)));
    }
}

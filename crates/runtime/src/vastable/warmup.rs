//! Auto's warm-up measurement in VA-stable mode: what bounds the step, the
//! host time between steps and the GPU time of a step (see the parent
//! module's docs). Only event queries: nothing here waits for the GPU.

use std::time::Instant;

use xla_vmm_device::{Backend, EventStatus};
use xla_vmm_policy::StepTimes;

use super::Reservation;

/// Most samples kept per warm-up series.
pub(super) const WARMUP_SAMPLES: usize = 32;

/// What auto's warm-up measures (see the module docs).
#[derive(Default)]
pub(super) struct Warmup {
    /// Host µs between the end of a `run` and the start of the next.
    pub(super) gaps: Vec<f64>,
    /// Host µs of the graph launch call.
    pub(super) launches: Vec<f64>,
    /// GPU µs of a step, binding copies excluded.
    pub(super) gpu: Vec<f64>,
    /// The previous step's `done` was pending / complete at `run`.
    pending: u32,
    complete: u32,
    pub(super) last_end: Option<Instant>,
}

/// The median of `v`, 0 when empty.
fn median(v: &[f64]) -> f64 {
    crate::guard::median(v).unwrap_or(0.0)
}

pub(super) fn push_sample(v: &mut Vec<f64>, x: f64) {
    if v.len() < WARMUP_SAMPLES && x.is_finite() {
        v.push(x.max(0.0));
    }
}

impl Warmup {
    pub(super) fn new() -> Self {
        Warmup {
            gaps: Vec::with_capacity(WARMUP_SAMPLES),
            launches: Vec::with_capacity(WARMUP_SAMPLES),
            gpu: Vec::with_capacity(WARMUP_SAMPLES),
            ..Default::default()
        }
    }

    pub(super) fn bound(&self) -> &'static str {
        match (self.pending, self.complete) {
            (0, 0) => "unknown",
            (p, c) if p > c => "gpu",
            _ => "host",
        }
    }

    /// The measurement for the re-plan, once there is one: GPU-bound steps
    /// give their times (remaps overlap the GPU); host-bound ones `None`
    /// (serial: the runtime cannot tell a host-bound loop from a caller
    /// that waits for every step, so it does not assume copies hide).
    pub(super) fn measurement(&self) -> Option<Option<StepTimes>> {
        match self.bound() {
            "gpu" if !self.gpu.is_empty() && !self.gaps.is_empty() => Some(Some(StepTimes {
                host_us: median(&self.gaps) + median(&self.launches),
                gpu_us: median(&self.gpu),
            })),
            "host" => Some(None),
            _ => None,
        }
    }
}

impl Warmup {
    /// Warm-up samples at the start of a step (no waiting: event queries).
    pub(super) fn observe<B: Backend>(
        &mut self,
        be: &B,
        step: u64,
        res: &mut [Reservation<B>],
        now: Instant,
    ) {
        if let Some(end) = self.last_end {
            push_sample(
                &mut self.gaps,
                now.saturating_duration_since(end).as_secs_f64() * 1e6,
            );
        }
        if step > 0 {
            let prev = ((step - 1) % res.len().max(1) as u64) as usize;
            if let Some(done) = res.get(prev).and_then(|r| r.done.as_ref()) {
                match be.event_query(done) {
                    Ok(EventStatus::Complete) => self.complete += 1,
                    Ok(_) => self.pending += 1,
                    Err(_) => {}
                }
            }
        }
        for res in res.iter_mut() {
            let (Some(model), Some(start), Some(done)) =
                (res.timed, res.start.as_ref(), res.done.as_ref())
            else {
                continue;
            };
            if !matches!(be.event_query(done), Ok(EventStatus::Complete)) {
                continue;
            }
            res.timed = None;
            if let Ok(ms) = be.event_elapsed_ms(start, done) {
                push_sample(&mut self.gpu, f64::from(ms) * 1e3 - model);
            }
        }
    }

    /// Median host µs per step (between steps, plus the launch call).
    pub(super) fn host_us(&self) -> f64 {
        median(&self.gaps) + median(&self.launches)
    }

    /// Median GPU µs per step, binding copies excluded.
    pub(super) fn gpu_us(&self) -> f64 {
        median(&self.gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_and_measurement_follow_the_votes() {
        let mut w = Warmup::new();
        assert_eq!((w.bound(), w.measurement()), ("unknown", None));
        // GPU busy when the host came back, but no GPU time read yet: wait.
        w.pending = 3;
        w.complete = 1;
        push_sample(&mut w.gaps, 40.0);
        push_sample(&mut w.launches, 10.0);
        assert_eq!((w.bound(), w.measurement()), ("gpu", None));
        push_sample(&mut w.gpu, 900.0);
        push_sample(&mut w.gpu, 1100.0);
        push_sample(&mut w.gpu, f64::NAN);
        assert_eq!(
            w.measurement(),
            Some(Some(StepTimes {
                host_us: 50.0,
                gpu_us: 1000.0
            }))
        );
        // GPU idle at most steps: serial (costs add).
        w.complete = 5;
        assert_eq!((w.bound(), w.measurement()), ("host", Some(None)));
        for _ in 0..100 {
            push_sample(&mut w.gaps, -1.0);
        }
        assert_eq!(w.gaps.len(), WARMUP_SAMPLES, "bounded, no growth");
        assert_eq!(w.gaps[1], 0.0, "negative samples clamp to 0");
    }
}

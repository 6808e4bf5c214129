//! `XLA_VMM_STEP_TIMING=1` (a diagnostic, off by default): every VA-stable
//! step's GPU time (from its first binding copy to its last copy-back) and
//! the stream time between the previous step's end and this step's start
//! (whatever the caller enqueued in between, or idle), from an event pair
//! around each step. Pairs are read back in step order once the device has
//! passed them, never waited for, and logged at debug level as
//! `step timed` (`xla_vmm_runtime=debug`). A pair the device has not passed
//! when its ring slot comes round again is dropped (counted in the log).
//!
//! What it is for: the plugin's default-mode step is ~4% slower on the GPU
//! than graph-recapture's while the CLI's is not
//! (`integration/results/perf_gate_362e97b.md`); these two numbers say
//! whether the graph itself is slower or what runs between graphs.

use xla_vmm_device::{Backend, EventStatus};

use crate::error::{Result, Teardown};

/// Event pairs in flight: more than the plugin's executions in flight
/// (32), so that a pipelined loop loses none.
const RING: usize = 64;

struct Pair<B: Backend> {
    start: B::Event,
    end: B::Event,
    /// The step recorded in this pair and not read back yet.
    step: Option<u64>,
}

/// One step's figures, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timed {
    pub(crate) step: u64,
    pub(crate) gpu_us: f64,
    /// From the previous step's end; `None` for the first step read back
    /// after a gap in the record (a dropped pair).
    pub(crate) since_previous_us: Option<f64>,
}

pub(super) struct StepTiming<B: Backend> {
    pairs: Vec<Pair<B>>,
    /// The last pair read back: (its step, its slot).
    last: Option<(u64, usize)>,
    dropped: u64,
}

impl<B: Backend> StepTiming<B> {
    pub(super) fn new(be: &B) -> Result<Self> {
        let mut t = StepTiming {
            pairs: Vec::with_capacity(RING),
            last: None,
            dropped: 0,
        };
        for _ in 0..RING {
            let pair = be.event_create().and_then(|start| match be.event_create() {
                Ok(end) => Ok(Pair {
                    start,
                    end,
                    step: None,
                }),
                Err(e) => {
                    Teardown::new("VA-stable step timing")
                        .check("event_destroy", be.event_destroy(start));
                    Err(e)
                }
            });
            match pair {
                Ok(p) => t.pairs.push(p),
                Err(e) => {
                    t.teardown(be);
                    return Err(e.into());
                }
            }
        }
        Ok(t)
    }

    fn slot(step: u64) -> usize {
        (step % RING as u64) as usize
    }

    /// Before step `step`'s first GPU work: read back what the device has
    /// passed, then record the step's start.
    pub(super) fn start(&mut self, be: &B, step: u64, stream: &B::Stream) -> Result<Vec<Timed>> {
        let got = self.read_back(be);
        let i = Self::slot(step);
        if self.pairs[i].step.take().is_some() {
            // Still in flight a whole ring later: its figures are lost.
            self.dropped += 1;
            self.last = None;
        }
        be.event_record(&self.pairs[i].start, stream)?;
        Ok(got)
    }

    /// After step `step`'s last GPU work.
    pub(super) fn end(&mut self, be: &B, step: u64, stream: &B::Stream) -> Result<()> {
        let p = &mut self.pairs[Self::slot(step)];
        be.event_record(&p.end, stream)?;
        p.step = Some(step);
        Ok(())
    }

    /// The pairs the device has passed, oldest first (stops at the first
    /// one it has not).
    fn read_back(&mut self, be: &B) -> Vec<Timed> {
        let mut out = Vec::new();
        // The oldest recorded pair, while the device has passed it.
        while let Some((i, step)) = self
            .pairs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.step.map(|s| (i, s)))
            .min_by_key(|&(_, s)| s)
        {
            let p = &self.pairs[i];
            if !matches!(be.event_query(&p.end), Ok(EventStatus::Complete)) {
                break;
            }
            let gpu = be.event_elapsed_ms(&p.start, &p.end);
            let since = match self.last {
                Some((s, j)) if s + 1 == step => {
                    be.event_elapsed_ms(&self.pairs[j].end, &p.start).ok()
                }
                _ => None,
            };
            self.pairs[i].step = None;
            self.last = Some((step, i));
            if let Ok(ms) = gpu {
                out.push(Timed {
                    step,
                    gpu_us: f64::from(ms) * 1e3,
                    since_previous_us: since.map(|ms| f64::from(ms) * 1e3),
                });
            }
        }
        out
    }

    /// Pairs dropped so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(super) fn teardown(&mut self, be: &B) {
        let mut t = Teardown::new("VA-stable step timing");
        for p in self.pairs.drain(..) {
            t.check("event_destroy", be.event_destroy(p.start));
            t.check("event_destroy", be.event_destroy(p.end));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm_device::HostBackend;

    #[test]
    fn steps_are_read_back_in_order_with_the_time_between_them() {
        let be = HostBackend::default();
        let stream = be.stream_create().unwrap();
        let mut t = StepTiming::new(&be).unwrap();
        assert!(t.start(&be, 0, &stream).unwrap().is_empty());
        t.end(&be, 0, &stream).unwrap();
        let mut got = Vec::new();
        for step in 1..5 {
            got.extend(t.start(&be, step, &stream).unwrap());
            t.end(&be, step, &stream).unwrap();
        }
        be.stream_synchronize(&stream).unwrap();
        got.extend(t.start(&be, 5, &stream).unwrap());
        let steps: Vec<u64> = got.iter().map(|x| x.step).collect();
        assert_eq!(steps, vec![0, 1, 2, 3, 4], "each step once, in order");
        assert_eq!(got[0].since_previous_us, None, "nothing before step 0");
        for x in &got {
            assert!(x.gpu_us >= 0.0 && x.gpu_us.is_finite(), "{x:?}");
        }
        assert!(
            got[1..].iter().all(|x| x.since_previous_us.is_some()),
            "{got:?}"
        );
        assert_eq!(t.dropped(), 0);
        t.teardown(&be);
        be.stream_destroy(stream).unwrap();
        assert_eq!(be.outstanding().events, 0, "every event destroyed");
    }
}

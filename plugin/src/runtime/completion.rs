//! The client's completion thread: device events recorded on the client's
//! stream after asynchronous work (an execution, a device copy), polled with
//! `Backend::event_query`; each one completes its PJRT [`Event`] (and runs
//! the `OnReady` callbacks, on this thread) once the device has done the
//! work, or fails it with the device's error.
//!
//! Events of one stream complete in order, so only the oldest pending one is
//! queried. How long to wait between queries decides how late a waiting
//! `block_until_ready` wakes: the thread keeps a running estimate of how long
//! the oldest event takes to complete, sleeps through most of that, then
//! polls every few µs (its timer slack is set to 1 µs: Linux otherwise adds
//! 50 µs to every sleep), backing off to 100 µs once the work runs well past
//! the estimate. With nothing pending it sleeps on a condition variable.
//! `shutdown` stops and joins it: events still pending then fail (the caller
//! synchronizes the stream first, so normally none are).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xla_vmm_device::{Backend, EventStatus};

use crate::cabi::error::{Error, Result};
use crate::runtime::event::Event;

/// Polling interval near the expected completion.
const FINE: Duration = Duration::from_micros(5);
/// Longest polling interval (work running far past the estimate).
const MAX_BACKOFF: Duration = Duration::from_micros(100);
/// Longest single sleep towards the expected completion.
const MAX_SLEEP: Duration = Duration::from_millis(5);

struct PollState<B: Backend> {
    /// Device event, the PJRT event it completes, and when it was pushed.
    pending: VecDeque<(B::Event, Arc<Event>, Instant)>,
    stop: bool,
}

/// When to query the oldest pending event next.
#[derive(Debug, Default)]
struct Pacer {
    /// `XLA_VMM_COMPLETION_POLL=backoff`: the earlier scheme (10 µs doubling
    /// to 100 µs, the default timer slack), kept for A/B benchmarks.
    plain_backoff: bool,
    /// Running estimate of how long the oldest event takes (from becoming
    /// the oldest, or being pushed, to completing): `None` until one is seen.
    typical: Option<Duration>,
    backoff: Duration,
}

impl Pacer {
    /// How long to wait before the next query, `waited` after the oldest
    /// event started.
    fn next_wait(&mut self, waited: Duration) -> Duration {
        if self.plain_backoff {
            self.backoff = (self.backoff * 2).clamp(FINE * 2, MAX_BACKOFF);
            return self.backoff;
        }
        let Some(typical) = self.typical else {
            // No estimate yet: a short exponential backoff.
            self.backoff = (self.backoff * 2).clamp(FINE, MAX_BACKOFF);
            return self.backoff;
        };
        let early = typical.mul_f64(0.75);
        if waited < early {
            // Sleep through most of the expected time in one go.
            return (early - waited).min(MAX_SLEEP);
        }
        if waited < typical * 2 {
            return FINE;
        }
        // Running long: back off.
        self.backoff = (self.backoff * 2).clamp(FINE, MAX_BACKOFF);
        self.backoff
    }

    /// The oldest event completed after `took`.
    fn completed(&mut self, took: Duration) {
        self.typical = Some(match self.typical {
            None => took,
            // An exponential moving average (weight 1/4 to the newest).
            Some(t) => (t * 3 + took) / 4,
        });
        self.backoff = Duration::ZERO;
    }
}

/// Sleeps of this thread end within about 1 µs of their deadline (Linux's
/// default timer slack adds up to 50 µs to each).
fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_timerslack(1_000) {
        tracing::debug!("PR_SET_TIMERSLACK: {e}");
    }
}

struct Shared<B: Backend> {
    backend: Arc<B>,
    state: Mutex<PollState<B>>,
    /// Wakes the thread (new work, stop).
    cv: Condvar,
    /// Wakes throttled callers (events popped, stop).
    popped: Condvar,
}

impl<B: Backend> Shared<B> {
    fn lock(&self) -> MutexGuard<'_, PollState<B>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Completions<B: Backend> {
    shared: Arc<Shared<B>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<B: Backend> Completions<B> {
    /// `plain_backoff`: poll with the earlier fixed 10-100 µs backoff
    /// instead of pacing by the step time (`ExecOptions::plain_backoff`).
    pub fn new(backend: Arc<B>, plain_backoff: bool) -> Result<Self> {
        let shared = Arc::new(Shared {
            backend,
            state: Mutex::new(PollState {
                pending: VecDeque::new(),
                stop: false,
            }),
            cv: Condvar::new(),
            popped: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("xla-vmm-events".into())
            .spawn(move || {
                let plain = plain_backoff;
                if !plain {
                    tighten_timer_slack();
                }
                poll_loop(&s, plain)
            })
            .map_err(|e| Error::internal(format!("starting the completion thread: {e}")))?;
        Ok(Completions {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Complete `done` when `event` (recorded on the stream) completes.
    /// After `shutdown`, hands both back.
    pub fn push(
        &self,
        event: B::Event,
        done: Arc<Event>,
    ) -> std::result::Result<(), (B::Event, Arc<Event>)> {
        let mut st = self.shared.lock();
        if st.stop {
            return Err((event, done));
        }
        st.pending.push_back((event, done, Instant::now()));
        drop(st);
        self.shared.cv.notify_all();
        Ok(())
    }

    /// Events not yet seen complete.
    pub fn outstanding(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Block until fewer than `limit` events are pending (bounds how far the
    /// host runs ahead of the device, and so the memory whose stream-ordered
    /// free waits on it). Returns at once after `shutdown`.
    pub fn wait_below(&self, limit: usize) {
        let mut st = self.shared.lock();
        while st.pending.len() >= limit.max(1) && !st.stop {
            st = self
                .shared
                .popped
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Stop the thread (after a last pass over the pending events) and join
    /// it; idempotent.
    pub fn shutdown(&self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        self.shared.popped.notify_all();
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if h.thread().id() == std::thread::current().id() {
                // Called from a callback on the thread itself: it exits after
                // this pass; it cannot join itself.
                return;
            }
            if h.join().is_err() {
                tracing::warn!("the completion thread panicked");
            }
        }
    }
}

impl<B: Backend> Drop for Completions<B> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn poll_loop<B: Backend>(shared: &Shared<B>, plain_backoff: bool) {
    let mut pacer = Pacer {
        plain_backoff,
        ..Pacer::default()
    };
    // When the current oldest event became the oldest (or was pushed).
    let mut front_since: Option<Instant> = None;
    loop {
        let mut finished = Vec::new();
        let stop;
        {
            let mut st = shared.lock();
            while st.pending.is_empty() && !st.stop {
                front_since = None;
                st = shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            stop = st.stop;
            while let Some((e, _, pushed)) = st.pending.front() {
                let since = *front_since.get_or_insert(*pushed);
                let r = match shared.backend.event_query(e) {
                    Ok(EventStatus::Complete) => Ok(()),
                    Ok(EventStatus::Pending) if !stop => break,
                    Ok(EventStatus::Pending) => Err(Error::failed_precondition(
                        "the client was destroyed before the device finished this work",
                    )),
                    Err(err) => Err(Error::from(err)),
                };
                let now = Instant::now();
                pacer.completed(now.saturating_duration_since(since));
                // The next one started no earlier than now or its push.
                front_since = Some(now);
                let (e, done, _) = st.pending.pop_front().expect("front exists");
                finished.push((e, done, r));
            }
            if let Some((_, _, pushed)) = st.pending.front() {
                // A later push than our last completion starts its own clock.
                let since = front_since.get_or_insert(*pushed);
                *since = (*since).max(*pushed);
            }
            if !finished.is_empty() {
                shared.popped.notify_all();
            }
            if finished.is_empty() && !stop {
                // The oldest is still running: wait until it is likely done
                // (a stop or a push wakes us early; the latter changes
                // nothing, fine).
                let waited = front_since.map_or(Duration::ZERO, |t| t.elapsed());
                let wait = pacer.next_wait(waited);
                let (g, _) = shared
                    .cv
                    .wait_timeout(st, wait)
                    .unwrap_or_else(|p| p.into_inner());
                drop(g);
                continue;
            }
        }
        // Outside the lock: callbacks may call back into the plugin.
        for (e, done, r) in finished {
            if let Err(err) = shared.backend.event_destroy(e) {
                tracing::warn!("event_destroy: {err}");
            }
            if let Err(err) = &r {
                tracing::warn!("asynchronous device work failed: {}", err.message);
            }
            done.set(r);
        }
        if stop && shared.lock().pending.is_empty() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_sleeps_through_the_expected_time_then_polls_finely_then_backs_off() {
        let mut p = Pacer::default();
        // No estimate: a growing backoff from 5 µs, capped.
        assert_eq!(p.next_wait(Duration::ZERO), FINE);
        assert_eq!(p.next_wait(Duration::ZERO), FINE * 2);
        for _ in 0..10 {
            p.next_wait(Duration::ZERO);
        }
        assert_eq!(p.next_wait(Duration::ZERO), MAX_BACKOFF);
        // Steps of 2 ms: sleep to 1.5 ms in one go, then poll every 5 µs.
        p.completed(Duration::from_millis(2));
        assert_eq!(p.typical, Some(Duration::from_millis(2)));
        assert_eq!(
            p.next_wait(Duration::from_micros(100)),
            Duration::from_micros(1400)
        );
        assert_eq!(p.next_wait(Duration::from_micros(1600)), FINE);
        assert_eq!(p.next_wait(Duration::from_micros(3900)), FINE);
        // Far past the estimate: back off again (5, 10, 20 µs ...).
        assert_eq!(p.next_wait(Duration::from_millis(5)), FINE);
        assert_eq!(p.next_wait(Duration::from_millis(5)), FINE * 2);
        // Long work: one sleep is capped.
        p.completed(Duration::from_millis(100));
        assert!(p.next_wait(Duration::ZERO) <= MAX_SLEEP);
        // The estimate moves a quarter of the way to each new observation.
        let mut q = Pacer::default();
        q.completed(Duration::from_millis(4));
        q.completed(Duration::from_millis(8));
        assert_eq!(q.typical, Some(Duration::from_millis(5)));
    }
}

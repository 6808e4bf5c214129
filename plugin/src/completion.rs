//! The client's completion thread: device events recorded on the client's
//! stream after asynchronous work (an execution, a device copy), polled with
//! `Backend::event_query`; each one completes its PJRT [`Event`] (and runs
//! the `OnReady` callbacks, on this thread) once the device has done the
//! work, or fails it with the device's error.
//!
//! Events of one stream complete in order, so only the oldest pending one is
//! queried. While work is pending the thread polls with a short backoff
//! (10 µs doubling to 100 µs); with nothing pending it sleeps on a condition
//! variable. `shutdown` stops and joins it: events still pending then fail
//! (the caller synchronizes the stream first, so normally none are).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use xla_vmm_device::{Backend, EventStatus};

use crate::error::{Error, Result};
use crate::event::Event;

const MIN_BACKOFF: Duration = Duration::from_micros(10);
const MAX_BACKOFF: Duration = Duration::from_micros(100);

struct PollState<B: Backend> {
    pending: VecDeque<(B::Event, Arc<Event>)>,
    stop: bool,
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
    pub fn new(backend: Arc<B>) -> Result<Self> {
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
            .spawn(move || poll_loop(&s))
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
        st.pending.push_back((event, done));
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

fn poll_loop<B: Backend>(shared: &Shared<B>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let mut finished = Vec::new();
        let stop;
        {
            let mut st = shared.lock();
            while st.pending.is_empty() && !st.stop {
                st = shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            stop = st.stop;
            while let Some((e, _)) = st.pending.front() {
                let r = match shared.backend.event_query(e) {
                    Ok(EventStatus::Complete) => Ok(()),
                    Ok(EventStatus::Pending) if !stop => break,
                    Ok(EventStatus::Pending) => Err(Error::failed_precondition(
                        "the client was destroyed before the device finished this work",
                    )),
                    Err(err) => Err(Error::from(err)),
                };
                let (e, done) = st.pending.pop_front().expect("front exists");
                finished.push((e, done, r));
            }
            if !finished.is_empty() {
                shared.popped.notify_all();
            }
            if finished.is_empty() && !stop {
                // The oldest is still running: wait a little (a stop or a
                // push wakes us early; the latter changes nothing, fine).
                let (g, _) = shared
                    .cv
                    .wait_timeout(st, backoff)
                    .unwrap_or_else(|p| p.into_inner());
                drop(g);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        }
        backoff = MIN_BACKOFF;
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

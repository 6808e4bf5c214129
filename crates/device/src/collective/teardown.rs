//! Destroying a communicator without letting a peer hang the process.
//!
//! `ncclCommDestroy` (and RCCL's) is not a local operation. Reading NCCL
//! 2.28's `init.cc` / `proxy.cc`:
//! - it waits until every CUDA graph that captured one of the
//!   communicator's operations has been destroyed (`localPersistentRefs`);
//! - it joins NCCL's proxy service thread, which leaves only once every
//!   peer process has closed its connection to it, i.e. once each peer has
//!   destroyed its own communicator or exited.
//!
//! So a process whose peer is waiting for *it* somewhere else (the usual
//! case: `jax.distributed`'s shutdown barrier, which the peer entered first)
//! deadlocks in the destroy until that barrier times out (minutes). XLA never
//! meets this because it never destroys its communicators (its clique cache
//! lives until exit).
//!
//! We do destroy them (clients come and go in one process, and single-process
//! cliques finish at once), but on a thread of its own, waiting at most
//! [`destroy_timeout`]. A destroy that does not finish in time is logged
//! with what it waits for and left running; the thread keeps what it needs
//! (the context) alive, and the OS reclaims the rest at exit. After one such
//! timeout the process stops waiting for later destroys: their peers are
//! gone or busy in the same way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// `XLA_VMM_COMM_DESTROY_TIMEOUT_MS`: how long a communicator's teardown may
/// wait for its peers (default 10 s; 0 = do not wait).
pub fn destroy_timeout() -> Duration {
    let ms = xla_vmm_ffi::settings::get()
        .comm_destroy_timeout_ms
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(10_000);
    Duration::from_millis(ms)
}

/// How a bounded destroy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destroyed {
    /// The destroy returned within the time allowed.
    Done,
    /// It is still running on its thread (left to finish or to process exit).
    Detached,
}

/// The destroys of one process (a static one serves the backends; tests make
/// their own): remembers whether a peer has already failed to answer.
#[derive(Debug, Default)]
pub struct Reaper {
    gave_up: AtomicBool,
}

static PROCESS: Reaper = Reaper {
    gave_up: AtomicBool::new(false),
};

impl Reaper {
    pub const fn new() -> Reaper {
        Reaper {
            gave_up: AtomicBool::new(false),
        }
    }

    /// The process-wide reaper the NCCL and RCCL communicators use.
    pub fn process() -> &'static Reaper {
        &PROCESS
    }

    /// Whether a destroy has already run past its time in this process.
    pub fn gave_up(&self) -> bool {
        self.gave_up.load(Ordering::Acquire)
    }

    /// Run `destroy` (which owns everything it needs) on its own thread and
    /// wait for it at most `timeout` (not at all once a destroy has timed out
    /// before). `what` names the communicator in the log.
    pub fn destroy(
        &self,
        what: &str,
        timeout: Duration,
        destroy: impl FnOnce() + Send + 'static,
    ) -> Destroyed {
        let (tx, rx) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("xla-vmm-comm-destroy".into())
            .spawn(move || {
                destroy();
                let _ = tx.send(());
            });
        if let Err(e) = spawned {
            // No thread (resource exhaustion at exit): the closure is gone
            // with the failed spawn, so the communicator is leaked, never
            // destroyed twice.
            tracing::warn!(%what, error = %e, "no thread to destroy the communicator; leaked");
            return Destroyed::Detached;
        }
        let wait = if self.gave_up() {
            Duration::ZERO
        } else {
            timeout
        };
        match rx.recv_timeout(wait) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => Destroyed::Done,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !self.gave_up.swap(true, Ordering::AcqRel) {
                    tracing::warn!(%what, waited_ms = wait.as_millis() as u64,
                        "communicator destroy is waiting for its peers (a peer process has neither \
                         destroyed its communicator nor exited, or a graph that captured it is \
                         alive); it goes on in the background and later destroys in this \
                         process are not waited for (XLA_VMM_COMM_DESTROY_TIMEOUT_MS)");
                } else {
                    tracing::debug!(%what, "communicator destroy left to the background");
                }
                Destroyed::Detached
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_quick_destroy_is_waited_for() {
        let r = Reaper::new();
        let ran = Arc::new(AtomicBool::new(false));
        let r2 = ran.clone();
        let d = r.destroy("quick", Duration::from_secs(10), move || {
            r2.store(true, Ordering::SeqCst)
        });
        assert_eq!(d, Destroyed::Done);
        assert!(ran.load(Ordering::SeqCst), "Done must mean the destroy ran");
        assert!(!r.gave_up());
    }

    #[test]
    fn a_destroy_blocked_on_a_peer_is_detached_and_later_ones_are_not_waited_for() {
        let r = Reaper::new();
        // A destroy that waits for a "peer" that answers only when the test
        // says so.
        let (peer_tx, peer_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let t = Instant::now();
        let d = r.destroy("blocked", Duration::from_millis(100), move || {
            let _ = peer_rx.recv();
            let _ = done_tx.send(());
        });
        assert_eq!(d, Destroyed::Detached);
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert!(r.gave_up());
        // The next destroy does not wait, even for a long timeout, if it is
        // slow; it still runs.
        let (slow_tx, slow_rx) = mpsc::channel::<()>();
        let t = Instant::now();
        let d2 = r.destroy("second", Duration::from_secs(60), move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = slow_tx.send(());
        });
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(d2, Destroyed::Detached);
        slow_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the detached destroy still runs");
        // The peer answers: the first destroy finishes in the background.
        peer_tx.send(()).unwrap();
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the detached destroy finishes once its peer answers");
    }

    #[test]
    fn timeout_comes_from_the_settings_with_a_default() {
        // Only reads: the variable is not set by the test suite.
        if xla_vmm_ffi::settings::get()
            .comm_destroy_timeout_ms
            .is_none()
        {
            assert_eq!(destroy_timeout(), Duration::from_secs(10));
        }
    }
}

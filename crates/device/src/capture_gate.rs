//! A process-wide gate between graph captures and driver work this crate
//! does not control (the vendor PJRT plugin's compiles, loads and runs).
//!
//! Captures use `CU_STREAM_CAPTURE_MODE_RELAXED` (our own capture sequence
//! makes calls the stricter modes refuse), and in that mode the driver does
//! not guard other threads either: a `cuCtxSynchronize` from the vendor's
//! compile threads while one of our streams was capturing crashed inside
//! libcuda (JAX's `test_cache_miss_explanations_are_thread_safe`: ten threads
//! compiling and running at once; the native stack from
//! `XLA_VMM_CRASH_REPORT` ended in `cuCtxSynchronize` under the vendor's
//! thread pool). So a capture holds the gate exclusively, and each call into
//! the vendor holds it shared: captures wait for vendor calls in flight,
//! vendor calls wait for a capture in flight (a few ms), and vendor calls
//! never wait for each other, nor for a capture that only waits: a capture
//! goes when no vendor call is in flight (under an unbroken stream of them
//! it waits; in training, vendor calls are compiles and fallback runs).
//!
//! Re-entrancy: a thread already inside foreign work (a vendor run calling
//! back into JAX, which calls us) neither takes the shared side again nor
//! waits for the exclusive side, which it would never get.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Vendor calls in flight, and whether a capture is: new vendor calls wait
/// only for a capture *in flight*, never for one that waits (unlike a
/// writer-preferring RwLock, under which a waiting capture blocks new vendor
/// calls, and a vendor call that waits for another thread's vendor call
/// would hang). A capture waits for a moment with no vendor call in flight.
struct Gate {
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

static GATE: Gate = Gate {
    state: Mutex::new((0, false)),
    changed: Condvar::new(),
};

impl Gate {
    fn lock(&self) -> MutexGuard<'_, (usize, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, (usize, bool)>) -> MutexGuard<'a, (usize, bool)> {
        self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    fn release(&self, f: impl FnOnce(&mut (usize, bool))) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

thread_local! {
    /// Foreign-work guards this thread holds (nested calls take one once).
    static FOREIGN_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Held while a stream captures (from `stream_begin_capture` until
/// `stream_end_capture`).
pub struct CaptureGuard {
    exclusive: bool,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if self.exclusive {
            GATE.release(|s| s.1 = false);
        }
    }
}

/// Held while the vendor plugin works (one `PJRT_*` call into it).
pub struct ForeignGuard {
    shared: bool,
}

impl Drop for ForeignGuard {
    fn drop(&mut self) {
        FOREIGN_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        if self.shared {
            GATE.release(|s| s.0 -= 1);
        }
    }
}

/// Exclusive side: no foreign work runs until the guard drops. On a thread
/// inside foreign work, nothing is taken (see the module docs).
pub fn capture() -> CaptureGuard {
    if FOREIGN_DEPTH.with(Cell::get) > 0 {
        return CaptureGuard { exclusive: false };
    }
    let mut s = GATE.lock();
    while s.0 > 0 || s.1 {
        s = GATE.wait(s);
    }
    s.1 = true;
    CaptureGuard { exclusive: true }
}

/// Shared side, for one call into driver code that is not ours.
pub fn foreign() -> ForeignGuard {
    let depth = FOREIGN_DEPTH.with(|d| {
        let v = d.get();
        d.set(v + 1);
        v
    });
    if depth > 0 {
        return ForeignGuard { shared: false };
    }
    let mut s = GATE.lock();
    while s.1 {
        s = GATE.wait(s);
    }
    s.0 += 1;
    ForeignGuard { shared: true }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The gate is process-wide: these tests take turns, so that one test's
    /// timing does not depend on another's guards.
    static TURN: Mutex<()> = Mutex::new(());

    fn turn() -> std::sync::MutexGuard<'static, ()> {
        TURN.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn a_capture_waits_for_foreign_work_and_foreign_work_for_a_capture() {
        let _turn = turn();
        let f = foreign();
        let captured = Arc::new(AtomicBool::new(false));
        let c = captured.clone();
        let t = std::thread::spawn(move || {
            let _g = capture();
            c.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !captured.load(Ordering::SeqCst),
            "captured during foreign work"
        );
        drop(f);
        while !captured.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // The capture holds the gate: foreign work on another thread waits for it.
        let t0 = std::time::Instant::now();
        std::thread::spawn(|| drop(foreign())).join().unwrap();
        t.join().unwrap();
        assert!(
            t0.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn nested_foreign_work_and_a_capture_inside_it_do_not_deadlock() {
        let _turn = turn();
        let outer = foreign();
        let inner = foreign();
        let c = capture();
        drop(c);
        drop(inner);
        drop(outer);
        // Released: a capture on this thread takes the gate for real again.
        assert!(capture().exclusive);
        FOREIGN_DEPTH.with(|d| assert_eq!(d.get(), 0));
    }

    #[test]
    fn a_new_foreign_call_passes_a_waiting_capture() {
        let _turn = turn();
        let first = foreign();
        let waiting = std::thread::spawn(|| drop(capture()));
        std::thread::sleep(Duration::from_millis(30));
        // With the capture waiting, another thread's vendor call (one the
        // first might wait for) still gets through.
        std::thread::spawn(|| drop(foreign())).join().unwrap();
        drop(first);
        waiting.join().unwrap();
    }

    #[test]
    fn foreign_calls_do_not_wait_for_each_other() {
        let _turn = turn();
        let _a = foreign();
        std::thread::spawn(|| drop(foreign())).join().unwrap();
    }
}

//! A watchdog for steps that can block for good (waiting for a device
//! stream whose collective waits for a peer process that is gone): while
//! it lives, it logs the step being waited in after `first`, then every
//! `period`.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

struct State {
    stage: String,
    done: bool,
}

pub struct Watchdog {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Start watching `what`; [`Watchdog::stage`] names the current step.
    pub fn start(what: &'static str, first: Duration, period: Duration) -> Watchdog {
        let shared = Arc::new((
            Mutex::new(State {
                stage: String::from("start"),
                done: false,
            }),
            Condvar::new(),
        ));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("xla-vmm-watchdog".into())
            .spawn(move || {
                let t0 = Instant::now();
                let (lock, cv) = &*s;
                let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
                let mut wait = first;
                loop {
                    if st.done {
                        return;
                    }
                    let (g, timeout) = cv.wait_timeout(st, wait).unwrap_or_else(|p| p.into_inner());
                    wait = period;
                    st = g;
                    if st.done {
                        return;
                    }
                    if timeout.timed_out() {
                        tracing::warn!(
                            waiting_s = t0.elapsed().as_secs(),
                            stage = %st.stage,
                            "{what} is still waiting"
                        );
                    }
                }
            })
            .ok();
        Watchdog { shared, thread }
    }

    pub fn stage(&self, stage: String) {
        self.shared
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stage = stage;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).done = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_promptly_when_dropped() {
        let t = Instant::now();
        let w = Watchdog::start("test", Duration::from_secs(30), Duration::from_secs(30));
        w.stage("one".into());
        drop(w);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn keeps_the_current_stage() {
        let w = Watchdog::start("test", Duration::from_millis(5), Duration::from_millis(5));
        w.stage("waiting for x".into());
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(w.shared.0.lock().unwrap().stage, "waiting for x");
    }
}

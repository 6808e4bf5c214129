//! One persistent thread per device for multi-device `Execute`: each
//! device's step must be enqueued from a thread of its own (the devices'
//! programs meet inside their collectives), and spawning threads every step
//! costs more than handing a job to a waiting one.
//!
//! The thread starts at the first job and ends when the device is torn
//! down (or dropped). Jobs of one `Execute` are submitted to all its
//! devices under one process-wide lock, so every worker sees the steps of
//! concurrent `Execute` calls in the same order (no worker can wait in a
//! collective for a peer that is busy with a later step).

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::cabi::error::{Error, Result};

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
pub struct Worker {
    state: Mutex<Option<(Sender<Job>, JoinHandle<()>)>>,
    stopped: Mutex<bool>,
}

/// Held while the jobs of one multi-device step are handed out.
static SUBMIT: Mutex<()> = Mutex::new(());

/// Lock for handing out the jobs of one step to several workers.
pub fn submission() -> MutexGuard<'static, ()> {
    SUBMIT.lock().unwrap_or_else(|p| p.into_inner())
}

impl Worker {
    /// Run `job` on this worker's thread (started on first use).
    pub fn submit(&self, name: &str, job: Job) -> Result<()> {
        if *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(Error::failed_precondition(format!(
                "{name}: the device's client was destroyed"
            )));
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            let (tx, rx) = channel::<Job>();
            let handle = std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // A job reports its own result; a panic must not
                        // end the thread (the job's sender then reports it).
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|e| Error::internal(format!("starting thread {name}: {e}")))?;
            *state = Some((tx, handle));
        }
        let (tx, _) = state
            .as_ref()
            .ok_or_else(|| Error::internal("worker state"))?;
        tx.send(job)
            .map_err(|_| Error::internal(format!("{name}: the worker thread is gone")))
    }

    /// Stop the thread after its queued jobs (client destroy).
    pub fn shutdown(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((tx, handle)) = state {
            drop(tx);
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn jobs_run_in_order_and_shutdown_joins() {
        let w = Worker::default();
        let (tx, rx) = channel();
        for i in 0..5 {
            let tx = tx.clone();
            w.submit("test-worker", Box::new(move || tx.send(i).unwrap()))
                .unwrap();
        }
        // A panicking job does not end the thread.
        w.submit("test-worker", Box::new(|| panic!("job panics")))
            .unwrap();
        let tx2 = tx.clone();
        w.submit("test-worker", Box::new(move || tx2.send(5).unwrap()))
            .unwrap();
        let got: Vec<i32> = (0..6).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5]);
        w.shutdown();
        let e = w.submit("test-worker", Box::new(|| {})).unwrap_err();
        assert!(e.message.contains("destroyed"), "{}", e.message);
    }
}

//! What every loaded program is doing, for people: its mode, the runner it
//! uses now (and why not the fast one), its steps, the guard's decision.
//! Every [`crate::Executable`] holds a [`ReportSlot`] from load to drop (so
//! the list is the programs alive: it does not grow with programs dropped);
//! the plugin adds the programs it runs on the vendor runtime. Read with
//! [`all_reports`] (the plugin's `xla_vmm_report_json`, Python's
//! `jax_plugins.xla_vmm.report()`). The last [`DROPPED_KEPT`] programs
//! dropped keep their final line ([`dropped_reports`]): a training loop's
//! step is often dropped before the process writes its report at exit
//! (MaxText's `train_step` is a local of its loop).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::guard::GuardReport;

/// One program's line of the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProgramReport {
    /// Unique in the process (set by [`ReportSlot::register`]): tells two
    /// programs of one name apart across reads.
    pub id: u64,
    /// The HLO module's name.
    pub program: String,
    /// The mode it was configured with (`graph`, `graph-recapture`, `eager`).
    pub mode: &'static str,
    /// How its steps run now: `va-stable graph`, `graph-recapture`, `eager`,
    /// `guard trial` (the guard is still measuring) or `vendor fallback`.
    pub runner: &'static str,
    /// Why it does not run as a graph (a capture blocker), or why it runs on
    /// the vendor runtime.
    pub reason: Option<String>,
    pub steps: u64,
    /// Graph-recapture's captures so far: about one per step when its
    /// parameters' addresses change from step to step (each capture costs
    /// host time), a few when they repeat.
    pub graph_captures: u64,
    /// The never-slower guard's decision, once taken.
    pub guard: Option<GuardReport>,
    /// Its entry in the binding stats (`stats()`), once it ran VA-stable.
    pub binding_stats: Option<String>,
    /// What staging through device memory does per step, when part of its
    /// memory is in host memory ([`crate::staging`]).
    pub staging: Option<crate::staging::StagingSummary>,
    /// Part of its memory is in host memory and it is not staged: why (its
    /// kernels read that memory in place, over the link).
    pub staging_note: Option<String>,
    /// Its own memory (temporaries, outputs, constants, scratch): where it
    /// is, once loaded, and again once placed for its plan.
    pub memory: Option<OwnMemory>,
}

/// A program's own memory by where it lives, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OwnMemory {
    /// Device memory of its own.
    pub device_bytes: u64,
    /// Host memory of its own (past the device budget).
    pub host_bytes: u64,
    /// Device memory it maps with other programs (the device's shared
    /// temporaries): held while any of them is loaded.
    pub shared_bytes: u64,
}

type Slot = Arc<Mutex<ProgramReport>>;

static PROGRAMS: Mutex<BTreeMap<u64, Slot>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// How many dropped programs' final lines are kept.
pub const DROPPED_KEPT: usize = 64;

/// The last [`DROPPED_KEPT`] programs dropped, oldest first, and how many
/// were dropped in all.
static DROPPED: Mutex<(VecDeque<ProgramReport>, u64)> = Mutex::new((VecDeque::new(), 0));

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The memories for temporaries that `backend`'s loaded programs share:
/// (how many, their bytes). Each is held while a program maps it: a new
/// one is made for each larger temporary size, the smaller stay with the
/// programs that map them.
pub fn shared_temporaries<B: xla_vmm_device::Backend + 'static>(backend: &Arc<B>) -> (usize, u64) {
    crate::temps::held(backend)
}

/// A program's place in the report, removed when it is dropped.
pub struct ReportSlot {
    id: u64,
    slot: Slot,
}

impl ReportSlot {
    /// Add `report` to the report.
    pub fn register(report: ProgramReport) -> Self {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Mutex::new(ProgramReport { id, ..report }));
        lock(&PROGRAMS).insert(id, slot.clone());
        ReportSlot { id, slot }
    }

    /// Change the line (an uncontended lock: cheap enough for every step).
    pub fn update(&self, f: impl FnOnce(&mut ProgramReport)) {
        f(&mut lock(&self.slot));
    }

    /// Read from the line.
    pub fn get<T>(&self, f: impl FnOnce(&ProgramReport) -> T) -> T {
        f(&lock(&self.slot))
    }
}

impl Drop for ReportSlot {
    fn drop(&mut self) {
        lock(&PROGRAMS).remove(&self.id);
        let last = lock(&self.slot).clone();
        let mut d = lock(&DROPPED);
        if d.0.len() == DROPPED_KEPT {
            d.0.pop_front();
        }
        d.0.push_back(last);
        d.1 += 1;
    }
}

/// The lines of every program alive, in load order.
pub fn all_reports() -> Vec<ProgramReport> {
    let slots: Vec<Slot> = lock(&PROGRAMS).values().cloned().collect();
    slots.iter().map(|s| lock(s).clone()).collect()
}

/// The final lines of the last [`DROPPED_KEPT`] programs dropped, in the
/// order they were dropped, and how many were dropped in all.
pub fn dropped_reports() -> (Vec<ProgramReport>, u64) {
    let d = lock(&DROPPED);
    (d.0.iter().cloned().collect(), d.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_live_as_long_as_their_programs() {
        let a = ReportSlot::register(ProgramReport {
            program: "report_test_a".into(),
            ..Default::default()
        });
        let b = ReportSlot::register(ProgramReport {
            program: "report_test_b".into(),
            ..Default::default()
        });
        a.update(|r| r.steps += 3);
        let mine = |name: &str| all_reports().into_iter().find(|r| r.program == name);
        assert_eq!(mine("report_test_a").map(|r| r.steps), Some(3));
        let ids = (
            mine("report_test_a").unwrap().id,
            mine("report_test_b").unwrap().id,
        );
        assert_ne!(ids.0, ids.1);
        drop(a);
        assert!(mine("report_test_a").is_none());
        assert!(mine("report_test_b").is_some());
        drop(b);
        assert!(mine("report_test_b").is_none());
    }

    #[test]
    fn dropped_programs_keep_their_last_line_up_to_a_bound() {
        let gone = |name: &str| {
            let (lines, total) = dropped_reports();
            (lines.into_iter().find(|r| r.program == name), total)
        };
        let a = ReportSlot::register(ProgramReport {
            program: "report_test_dropped".into(),
            ..Default::default()
        });
        a.update(|r| r.steps = 7);
        let id = a.get(|r| r.id);
        assert!(gone("report_test_dropped").0.is_none());
        let before = gone("").1;
        drop(a);
        let (line, total) = gone("report_test_dropped");
        let line = line.expect("kept after its drop");
        assert_eq!((line.id, line.steps), (id, 7));
        assert!(total > before);
        // Many more dropped: the oldest go, the list stays bounded.
        for i in 0..DROPPED_KEPT {
            drop(ReportSlot::register(ProgramReport {
                program: format!("report_test_churn_{i}"),
                ..Default::default()
            }));
        }
        let (lines, total) = dropped_reports();
        assert_eq!(lines.len(), DROPPED_KEPT);
        assert!(gone("report_test_dropped").0.is_none());
        assert!(total >= before + 1 + DROPPED_KEPT as u64);
    }
}

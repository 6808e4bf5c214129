//! Spans of the runtime's work for one profiler session: what a user sees
//! next to the device's kernels in `jax.profiler.trace`, TensorBoard or
//! Perfetto (the plugin hands the spans to JAX as an XSpace through the PJRT
//! profiler extension, `plugin/src/api/profiler.rs`).
//!
//! Off (no session), a span costs one relaxed atomic load and records
//! nothing. On, a span records its name, what it is about (`detail`, e.g.
//! the program), its thread, start and duration, and a few numbers
//! (`stat`), into the session when it ends; a session holds at most
//! [`MAX_EVENTS`] spans (the rest are counted, not kept). One session at a
//! time, as one profiler session runs at a time in a process.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smallvec::SmallVec;

/// Spans kept per session at most.
pub const MAX_EVENTS: usize = 1 << 20;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static SESSION: Mutex<Option<Session>> = Mutex::new(None);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number in traces (0: not given one yet).
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

fn lock() -> std::sync::MutexGuard<'static, Option<Session>> {
    SESSION.lock().unwrap_or_else(|p| p.into_inner())
}

/// A number a span carries.
#[derive(Clone, Debug, PartialEq)]
pub enum StatValue {
    U64(u64),
    F64(f64),
    Str(String),
}

/// One recorded span.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: &'static str,
    /// What it is about (a program's name), when given.
    pub detail: Option<String>,
    /// The thread's number in this trace ([`Trace::threads`]).
    pub thread: u64,
    /// Wall time of the start, ns since the Unix epoch.
    pub start_ns: u64,
    pub duration_ns: u64,
    pub stats: SmallVec<[(&'static str, StatValue); 4]>,
}

/// What a session recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub events: Vec<Event>,
    /// (number, name) of every thread with an event.
    pub threads: Vec<(u64, String)>,
    /// Spans not kept (past [`MAX_EVENTS`]).
    pub dropped: u64,
}

struct Session {
    wall_ns: u64,
    base: Instant,
    trace: Trace,
}

/// Is a session recording?
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Start a session; `Err` when one is already recording.
pub fn start() -> Result<(), &'static str> {
    let mut s = lock();
    if s.is_some() {
        return Err("a profiler session of xla-vmm is already recording");
    }
    let wall_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64;
    *s = Some(Session {
        wall_ns,
        base: Instant::now(),
        trace: Trace::default(),
    });
    ACTIVE.store(true, Ordering::Relaxed);
    Ok(())
}

/// End the session and return what it recorded (`None` without one).
/// Spans still open then are not recorded.
pub fn stop() -> Option<Trace> {
    let mut s = lock();
    ACTIVE.store(false, Ordering::Relaxed);
    s.take().map(|s| s.trace)
}

/// A span, recorded when dropped (when a session is recording).
#[must_use = "a span records when it is dropped"]
pub struct Span {
    start: Option<Instant>,
    name: &'static str,
    detail: Option<String>,
    stats: SmallVec<[(&'static str, StatValue); 4]>,
}

/// Begin span `name` (a constant: the kind of work).
#[inline]
pub fn span(name: &'static str) -> Span {
    Span {
        start: active().then(Instant::now),
        name,
        detail: None,
        stats: SmallVec::new(),
    }
}

impl Span {
    /// Is this span recording (a session was on when it began)?
    pub fn recording(&self) -> bool {
        self.start.is_some()
    }

    /// What the span is about, computed only when it records.
    pub fn detail(mut self, f: impl FnOnce() -> String) -> Self {
        if self.recording() {
            self.detail = Some(f());
        }
        self
    }

    /// Add a number (only kept when recording).
    pub fn stat(&mut self, key: &'static str, value: StatValue) {
        if self.recording() {
            self.stats.push((key, value));
        }
    }
}

fn thread_number(trace: &mut Trace) -> u64 {
    let n = THREAD.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    });
    if !trace.threads.iter().any(|(k, _)| *k == n) {
        let cur = std::thread::current();
        let name = cur
            .name()
            .map_or_else(|| format!("thread {n}"), str::to_string);
        trace.threads.push((n, name));
    }
    n
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(start) = self.start else {
            return;
        };
        let end = Instant::now();
        let mut s = lock();
        let Some(session) = s.as_mut() else {
            return;
        };
        if session.trace.events.len() >= MAX_EVENTS {
            session.trace.dropped += 1;
            return;
        }
        let thread = thread_number(&mut session.trace);
        let since = start.saturating_duration_since(session.base).as_nanos() as u64;
        session.trace.events.push(Event {
            name: self.name,
            detail: self.detail.take(),
            thread,
            start_ns: session.wall_ns + since,
            duration_ns: end.saturating_duration_since(start).as_nanos() as u64,
            stats: std::mem::take(&mut self.stats),
        });
    }
}

/// One session at a time in a process: tests that start one hold this.
#[doc(hidden)]
pub static TEST_SESSION: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_record_only_while_a_session_is_on() {
        let _one = TEST_SESSION.lock().unwrap_or_else(|p| p.into_inner());
        drop(span("before").detail(|| panic!("not computed when off")));
        start().unwrap();
        assert!(start().is_err(), "one session at a time");
        {
            let mut outer = span("step").detail(|| "jit_f".into());
            outer.stat("step", StatValue::U64(7));
            std::thread::sleep(Duration::from_millis(2));
            drop(span("bind"));
        }
        std::thread::spawn(|| drop(span("other thread")))
            .join()
            .unwrap();
        let open = span("open at stop");
        let t = stop().unwrap();
        drop(open);
        drop(span("after"));
        assert!(stop().is_none());
        let names: Vec<&str> = t.events.iter().map(|e| e.name).collect();
        assert_eq!(names, ["bind", "step", "other thread"]);
        let (bind, step, other) = (&t.events[0], &t.events[1], &t.events[2]);
        assert_eq!(step.detail.as_deref(), Some("jit_f"));
        assert_eq!(step.stats.as_slice(), &[("step", StatValue::U64(7))]);
        assert!(step.duration_ns >= 2_000_000);
        assert!(
            bind.start_ns >= step.start_ns
                && bind.start_ns + bind.duration_ns <= step.start_ns + step.duration_ns
        );
        assert_eq!(bind.thread, step.thread);
        assert_ne!(other.thread, step.thread);
        assert_eq!(t.threads.len(), 2);
        assert_eq!(t.dropped, 0);
    }
}

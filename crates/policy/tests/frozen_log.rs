//! The frozen-decision log line, in its own test binary: tracing's callsite
//! interest and max-level cache are process-global, and a scoped subscriber
//! (`with_default`) racing other test threads that create and drop their own
//! dispatchers can see the callsite cached as "never" (CI saw 0 events once).
//! One test per process removes the race.

mod common;

use common::rw;
use xla_vmm_policy::{Binding, SlotInfo, SlotTracker, Threshold, TrackerConfig};

fn tracker(slots: Vec<SlotInfo>, threshold: u64, reservations: usize) -> SlotTracker {
    let mut cfg = TrackerConfig::new(common::h200(), Threshold::from(threshold));
    cfg.reservations = reservations;
    SlotTracker::new("test", slots, cfg).unwrap()
}

fn b(id: u64, addr: u64) -> Binding {
    Binding { id, addr }
}

/// Counts info-level events whose message is the frozen-decision line.
struct FrozenLogCounter(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl tracing::Subscriber for FrozenLogCounter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Msg(bool, usize);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}").contains("decision frozen") {
                    self.0 = true;
                }
                self.1 += 1;
            }
        }
        let mut m = Msg(false, 0);
        event.record(&mut m);
        // The line carries its inputs (costs, memory, counts), not just text.
        if m.0 && *event.metadata().level() == tracing::Level::INFO && m.1 > 15 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn frozen_decision_is_logged_once_with_its_inputs() {
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sub = FrozenLogCounter(count.clone());
    tracing::subscriber::with_default(sub, || {
        let mut t = tracker(vec![rw(4), rw(1 << 30)], 1, 2);
        for step in 0..10u64 {
            t.bind_step(
                (step % 2) as usize,
                &[b(step + 1, 1), b(step + 100, 2)],
                None,
            )
            .unwrap();
        }
    });
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
}

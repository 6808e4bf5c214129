//! Events that order frees: one event per `free` / `free_all` call, shared
//! by every block freed in it, recycled through a pool once complete.

use std::collections::BTreeMap;

use super::raii::VmmContext;
use crate::backend::{Backend, EventStatus};
use crate::error::Result;

/// Key of a recorded free event.
pub(super) type EventKey = u64;

struct Shared<E> {
    event: E,
    /// Free-list entries still waiting on it.
    refs: u64,
    /// Seen complete (no need to ask the driver again).
    done: bool,
}

pub(super) struct FreeEvents<B: Backend> {
    live: BTreeMap<EventKey, Shared<B::Event>>,
    pool: Vec<B::Event>,
    next: EventKey,
}

impl<B: Backend> FreeEvents<B> {
    pub fn new() -> Self {
        FreeEvents {
            live: BTreeMap::new(),
            pool: Vec::new(),
            next: 0,
        }
    }

    /// Record an event on `stream` for `refs` freed entries.
    pub fn record(&mut self, b: &B, stream: &B::Stream, refs: u64) -> Result<EventKey> {
        let event = match self.pool.pop() {
            Some(e) => e,
            None => b.event_create()?,
        };
        if let Err(e) = b.event_record(&event, stream) {
            self.pool.push(event);
            return Err(e);
        }
        let key = self.next;
        self.next += 1;
        self.live.insert(
            key,
            Shared {
                event,
                refs,
                done: false,
            },
        );
        Ok(key)
    }

    /// Has the event completed? Asks the driver until it has seen it so.
    pub fn done(&mut self, b: &B, key: EventKey) -> Result<bool> {
        let Some(s) = self.live.get_mut(&key) else {
            return Ok(true);
        };
        if !s.done && b.event_query(&s.event)? == EventStatus::Complete {
            s.done = true;
        }
        Ok(s.done)
    }

    /// One entry no longer waits on `key`; the last one recycles the event.
    pub fn release(&mut self, key: EventKey) {
        if let Some(s) = self.live.get_mut(&key) {
            s.refs -= 1;
            if s.refs == 0 {
                let s = self.live.remove(&key).expect("present");
                self.pool.push(s.event);
            }
        }
    }

    /// Events owned (pending or pooled).
    pub fn handles(&self) -> usize {
        self.live.len() + self.pool.len()
    }

    /// Destroy pooled (idle) events.
    pub fn destroy_pool(&mut self, b: &B) -> Result<()> {
        let mut first = Ok(());
        for e in self.pool.drain(..) {
            if let Err(err) = b.event_destroy(e) {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
        first
    }

    /// Teardown: wait for every pending event (the GPU may still use the
    /// memory they guard), then destroy all. Errors are recorded in `ctx`.
    pub fn teardown(&mut self, ctx: &VmmContext<B>) {
        let b = ctx.backend().clone();
        for s in self.live.values().filter(|s| !s.done) {
            if let Err(e) = b.event_synchronize(&s.event) {
                ctx.record_deferred(e);
            }
        }
        let live = std::mem::take(&mut self.live);
        self.pool.extend(live.into_values().map(|s| s.event));
        if let Err(e) = self.destroy_pool(&b) {
            ctx.record_deferred(e);
        }
    }
}

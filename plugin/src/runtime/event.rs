//! `PJRT_Event`: completion of asynchronous work (a buffer becoming ready, a
//! host copy finishing, an execution), with `OnReady` callbacks.
//!
//! Work the plugin does synchronously hands out events that are already
//! complete; an execution's events complete when the device has finished
//! the step (the client's completion thread, `context.rs`, sets them). The
//! type is fully asynchronous: set from any thread, callbacks run by
//! whoever completes it (outside its lock), `Await` blocks on a condition
//! variable.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{self, OnReady};
use crate::cabi::error::{self, Error, Result};
use crate::cabi::handles::{Handle, Registry};

/// Run once the event completes (with its outcome).
type RustCallback = Box<dyn FnOnce(&Result<()>) + Send>;

enum Callback {
    C(OnReady),
    Rust(RustCallback),
}

impl Callback {
    fn call(self, result: &Result<()>) {
        match self {
            Callback::C(cb) => cb.call(
                result
                    .clone()
                    .err()
                    .map_or(std::ptr::null_mut(), error::into_c),
            ),
            Callback::Rust(f) => f(result),
        }
    }
}

#[derive(Default)]
struct State {
    /// `None` while pending.
    done: Option<Result<()>>,
    callbacks: Vec<Callback>,
}

pub struct Event {
    state: Mutex<State>,
    cv: Condvar,
    /// Made by `PJRT_Event_Create`: the caller's to set. The plugin's own
    /// events (buffers ready, executions done) are set by the plugin only.
    user: bool,
}

static EVENTS: Registry<Event> = Registry::new();

impl Handle for Event {
    type C = PJRT_Event;
    const KIND: &'static str = "PJRT_Event";
    fn registry() -> &'static Registry<Self> {
        &EVENTS
    }
}

impl Event {
    pub fn pending() -> Arc<Event> {
        Self::new(false)
    }

    /// A pending event; `user`: made for the caller (`PJRT_Event_Create`).
    fn new(user: bool) -> Arc<Event> {
        Arc::new(Event {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            user,
        })
    }

    pub fn ready(result: Result<()>) -> Arc<Event> {
        let e = Self::pending();
        e.set(result);
        e
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Complete the event (a second completion is ignored) and run the
    /// callbacks, outside the lock.
    pub fn set(&self, result: Result<()>) {
        let callbacks = {
            let mut s = self.lock();
            if s.done.is_some() {
                return;
            }
            s.done = Some(result.clone());
            std::mem::take(&mut s.callbacks)
        };
        self.cv.notify_all();
        for cb in callbacks {
            cb.call(&result);
        }
    }

    /// A new event that completes (with the same outcome) when `self` does:
    /// every C handle needs its own object (the caller destroys it).
    pub fn follower(self: &Arc<Self>) -> Arc<Event> {
        let f = Event::pending();
        let g = f.clone();
        self.then(Box::new(move |r| g.set(r.clone())));
        f
    }

    /// Run `f` once the event completes (now, on this thread, if it has).
    pub fn then(&self, f: RustCallback) {
        self.add(Callback::Rust(f));
    }

    pub fn is_ready(&self) -> bool {
        self.lock().done.is_some()
    }

    /// Block until complete; the event's outcome.
    pub fn wait(&self) -> Result<()> {
        let mut s = self.lock();
        loop {
            if let Some(r) = &s.done {
                return r.clone();
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn add(&self, cb: Callback) {
        let now = {
            let mut s = self.lock();
            match &s.done {
                Some(r) => r.clone(),
                None => {
                    s.callbacks.push(cb);
                    return;
                }
            }
        };
        cb.call(&now);
    }
}

/// Number of live `PJRT_Event`s (leak checks in tests).
pub fn live_events() -> usize {
    EVENTS.len()
}

// ---- entries ----------------------------------------------------------------

pub fn destroy(args: &mut PJRT_Event_Destroy_Args) -> Result<()> {
    Event::release(args.event)?;
    Ok(())
}

pub fn is_ready(args: &mut PJRT_Event_IsReady_Args) -> Result<()> {
    args.is_ready = Event::from_c(args.event)?.is_ready();
    Ok(())
}

pub fn error(args: &mut PJRT_Event_Error_Args) -> Result<()> {
    let event = Event::from_c(args.event)?;
    let s = event.lock();
    match &s.done {
        Some(r) => r.clone(),
        None => Err(Error::failed_precondition("the event is not ready yet")),
    }
}

pub fn wait(args: &mut PJRT_Event_Await_Args) -> Result<()> {
    Event::from_c(args.event)?.wait()
}

pub fn on_ready(args: &mut PJRT_Event_OnReady_Args) -> Result<()> {
    let cb = OnReady::new(args.callback, args.user_arg)?;
    Event::from_c(args.event)?.add(Callback::C(cb));
    Ok(())
}

pub fn create(args: &mut PJRT_Event_Create_Args) -> Result<()> {
    args.event = Event::new(true).into_c();
    Ok(())
}

pub fn set(args: &mut PJRT_Event_Set_Args) -> Result<()> {
    let event = Event::from_c(args.event)?;
    if !event.user {
        return Err(Error::invalid(
            "PJRT_Event_Set on an event the plugin made (only PJRT_Event_Create's events may be set)",
        ));
    }
    let result = if args.error_code == PJRT_Error_Code_OK {
        Ok(())
    } else {
        let msg = caller::str(args.error_message, args.error_message_size, "error_message")?;
        Err(Error::new(args.error_code, msg))
    };
    event.set(result);
    Ok(())
}

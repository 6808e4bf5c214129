//! The PJRT profiler extension: `jax.profiler.trace(...)` (and TensorBoard,
//! Perfetto) shows the runtime's work (program loads, steps and how they run,
//! the VA-stable binding's plan / apply / launch, staged steps) beside the
//! device's kernels.
//!
//! JAX finds the extension in the plugin's chain when it loads the plugin
//! (`register_plugin_profiler`) and drives the plugin profiler API around a
//! profiler session: create, start, stop, collect, destroy. Start and stop
//! switch the runtime's span recorder ([`xla_vmm_runtime::trace`]) on and
//! off; collect turns what it recorded into one XSpace plane,
//! `/device:CUSTOM:xla-vmm` (the trace viewer shows custom planes), a line
//! per host thread, an event per span with its numbers as stats.
//!
//! C ABI layer: the entries check their pointers (the profiler and error
//! objects are [`Handle`]s, looked up before use), catch panics, and return
//! errors as this API's own error objects. They do not read `struct_size`:
//! JAX's tracer leaves it unset.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use prost::Message;
use xla_vmm::proto::tensorflow::profiler::{
    x_event, x_stat, XEvent, XEventMetadata, XLine, XPlane, XSpace, XStat, XStatMetadata,
};
use xla_vmm_ffi::pjrt::*;
use xla_vmm_runtime::trace::{self, StatValue, Trace};

use crate::cabi::caller;
use crate::cabi::error::{Error, Result};
use crate::cabi::handles::{Handle, Registry};

/// The plane our spans go to.
pub const PLANE_NAME: &str = "/device:CUSTOM:xla-vmm";

/// One profiler (JAX makes one per session).
#[derive(Default)]
pub struct Profiler {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    recording: bool,
    trace: Option<Trace>,
    /// The serialized XSpace, made at the first collect (the caller reads it
    /// through the pointer collect hands out until the profiler goes).
    data: Option<Vec<u8>>,
}

static PROFILERS: Registry<Profiler> = Registry::new();

impl Handle for Profiler {
    type C = PLUGIN_Profiler;
    const KIND: &'static str = "PLUGIN_Profiler";
    fn registry() -> &'static Registry<Self> {
        &PROFILERS
    }
}

/// An error of this API.
pub struct ProfilerError {
    code: i32,
    message: String,
}

static ERRORS: Registry<ProfilerError> = Registry::new();

impl Handle for ProfilerError {
    type C = PLUGIN_Profiler_Error;
    const KIND: &'static str = "PLUGIN_Profiler_Error";
    fn registry() -> &'static Registry<Self> {
        &ERRORS
    }
}

impl Profiler {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(&self) -> Result<()> {
        let mut s = self.state();
        if s.recording {
            return Err(Error::failed_precondition(
                "the profiler is already started",
            ));
        }
        trace::start().map_err(Error::failed_precondition)?;
        *s = State {
            recording: true,
            ..State::default()
        };
        Ok(())
    }

    fn stop(&self) -> Result<()> {
        let mut s = self.state();
        if !s.recording {
            return Err(Error::failed_precondition("the profiler was not started"));
        }
        s.recording = false;
        s.trace = trace::stop();
        Ok(())
    }

    /// The serialized XSpace (made once).
    fn with_data<T>(&self, f: impl FnOnce(&[u8]) -> T) -> T {
        let mut s = self.state();
        let trace = s.trace.take().unwrap_or_default();
        let data = s.data.get_or_insert_with(|| xspace(&trace).encode_to_vec());
        f(data)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.state().recording {
            let _ = trace::stop();
        }
    }
}

/// The id of stat `name` in `plane`'s metadata (added the first time).
fn stat_id(plane: &mut XPlane, name: &str) -> i64 {
    if let Some((&id, _)) = plane.stat_metadata.iter().find(|(_, m)| m.name == name) {
        return id;
    }
    let id = plane.stat_metadata.len() as i64 + 1;
    plane.stat_metadata.insert(
        id,
        XStatMetadata {
            id,
            name: name.into(),
            description: String::new(),
        },
    );
    id
}

/// What a session recorded, as the profiler's data model has it.
pub fn xspace(t: &Trace) -> XSpace {
    let mut plane = XPlane {
        id: 0,
        name: PLANE_NAME.into(),
        ..Default::default()
    };
    let mut event_ids: BTreeMap<String, i64> = BTreeMap::new();
    let mut lines: BTreeMap<u64, XLine> = BTreeMap::new();
    let mut events: Vec<_> = t.events.iter().collect();
    events.sort_by_key(|e| (e.thread, e.start_ns));
    for e in events {
        let title = match &e.detail {
            Some(d) => format!("{} {d}", e.name),
            None => e.name.to_string(),
        };
        let next = event_ids.len() as i64 + 1;
        let meta = *event_ids.entry(title.clone()).or_insert(next);
        plane
            .event_metadata
            .entry(meta)
            .or_insert_with(|| XEventMetadata {
                id: meta,
                name: title,
                ..Default::default()
            });
        let mut stats = Vec::with_capacity(e.stats.len() + 1);
        if let Some(d) = &e.detail {
            stats.push(XStat {
                metadata_id: stat_id(&mut plane, "program"),
                value: Some(x_stat::Value::StrValue(d.clone())),
            });
        }
        for (k, v) in &e.stats {
            let value = match v {
                StatValue::U64(n) => x_stat::Value::Uint64Value(*n),
                StatValue::F64(x) => x_stat::Value::DoubleValue(*x),
                StatValue::Str(s) => x_stat::Value::StrValue(s.clone()),
            };
            stats.push(XStat {
                metadata_id: stat_id(&mut plane, k),
                value: Some(value),
            });
        }
        let name = t
            .threads
            .iter()
            .find(|(n, _)| *n == e.thread)
            .map_or_else(|| format!("thread {}", e.thread), |(_, s)| s.clone());
        let line = lines.entry(e.thread).or_insert_with(|| XLine {
            id: e.thread as i64,
            display_id: e.thread as i64,
            name,
            timestamp_ns: e.start_ns as i64,
            ..Default::default()
        });
        let offset = e.start_ns.saturating_sub(line.timestamp_ns as u64);
        line.events.push(XEvent {
            metadata_id: meta,
            data: Some(x_event::Data::OffsetPs(offset.saturating_mul(1000) as i64)),
            duration_ps: e.duration_ns.saturating_mul(1000) as i64,
            stats,
        });
    }
    if t.dropped > 0 {
        let id = stat_id(&mut plane, "spans dropped");
        plane.stats.push(XStat {
            metadata_id: id,
            value: Some(x_stat::Value::Uint64Value(t.dropped)),
        });
    }
    plane.lines = lines.into_values().collect();
    XSpace {
        planes: vec![plane],
        ..Default::default()
    }
}

/// Run `f` on `*args` (non-null and plausible, checked); an error or a
/// panic becomes this API's error object.
fn call<A>(
    what: &'static str,
    args: *mut A,
    f: impl FnOnce(&mut A) -> Result<()>,
) -> *mut PLUGIN_Profiler_Error {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if args.is_null() {
            return Err(Error::invalid("args is null"));
        }
        caller::plausible_args(args as usize, std::mem::size_of::<A>())?;
        // SAFETY: non-null and plausible (checked); per the API's contract it
        // points to the named args struct, ours for this call.
        #[allow(unsafe_code)]
        let a = unsafe { &mut *args };
        f(a)
    }));
    let e = match r {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(_) => Error::internal("panicked"),
    };
    Arc::new(ProfilerError {
        code: e.code as i32,
        message: format!("xla-vmm {what}: {}", e.message),
    })
    .into_c()
}

extern "C" fn error_destroy(args: *mut PLUGIN_Profiler_Error_Destroy_Args) {
    let _ = call("PLUGIN_Profiler_Error_Destroy", args, |a| {
        if !a.error.is_null() {
            ProfilerError::release(a.error)?;
        }
        Ok(())
    });
}

extern "C" fn error_message(args: *mut PLUGIN_Profiler_Error_Message_Args) {
    let _ = call("PLUGIN_Profiler_Error_Message", args, |a| {
        let e = ProfilerError::from_c(a.error)?;
        // The message lives in the registered error until it is destroyed.
        a.message = e.message.as_ptr().cast();
        a.message_size = e.message.len();
        Ok(())
    });
}

extern "C" fn error_get_code(
    args: *mut PLUGIN_Profiler_Error_GetCode_Args,
) -> *mut PLUGIN_Profiler_Error {
    call("PLUGIN_Profiler_Error_GetCode", args, |a| {
        a.code = ProfilerError::from_c(a.error)?.code;
        Ok(())
    })
}

extern "C" fn create(args: *mut PLUGIN_Profiler_Create_Args) -> *mut PLUGIN_Profiler_Error {
    call("PLUGIN_Profiler_Create", args, |a| {
        a.profiler = Arc::new(Profiler::default()).into_c();
        Ok(())
    })
}

extern "C" fn destroy(args: *mut PLUGIN_Profiler_Args) -> *mut PLUGIN_Profiler_Error {
    call("PLUGIN_Profiler_Destroy", args, |a| {
        Profiler::release(a.profiler)?;
        Ok(())
    })
}

extern "C" fn start(args: *mut PLUGIN_Profiler_Args) -> *mut PLUGIN_Profiler_Error {
    call("PLUGIN_Profiler_Start", args, |a| {
        Profiler::from_c(a.profiler)?.start()
    })
}

extern "C" fn stop(args: *mut PLUGIN_Profiler_Args) -> *mut PLUGIN_Profiler_Error {
    call("PLUGIN_Profiler_Stop", args, |a| {
        Profiler::from_c(a.profiler)?.stop()
    })
}

extern "C" fn collect_data(
    args: *mut PLUGIN_Profiler_CollectData_Args,
) -> *mut PLUGIN_Profiler_Error {
    call("PLUGIN_Profiler_CollectData", args, |a| {
        let p = Profiler::from_c(a.profiler)?;
        p.with_data(|data| {
            if a.buffer.is_null() {
                // The size, and (as newer callers read it) our copy, which
                // lives as long as the profiler.
                a.buffer = data.as_ptr().cast_mut();
                a.buffer_size_in_bytes = data.len();
                return Ok(());
            }
            if std::ptr::eq(a.buffer, data.as_ptr()) {
                return Ok(());
            }
            caller::slice_mut(a.buffer, data.len(), "buffer")?.copy_from_slice(data);
            a.buffer_size_in_bytes = data.len();
            Ok(())
        })
    })
}

/// The API the extension points to.
#[repr(transparent)]
pub struct SyncProfilerApi(pub PLUGIN_Profiler_Api);
// SAFETY: immutable; its only data pointer (`priv_`) is null, the rest are
// function pointers.
#[allow(unsafe_code)]
unsafe impl Sync for SyncProfilerApi {}

pub static PROFILER_API: SyncProfilerApi = SyncProfilerApi(PLUGIN_Profiler_Api {
    struct_size: PLUGIN_Profiler_Api_STRUCT_SIZE,
    priv_: std::ptr::null_mut(),
    error_destroy: Some(error_destroy),
    error_message: Some(error_message),
    error_get_code: Some(error_get_code),
    create: Some(create),
    destroy: Some(destroy),
    start: Some(start),
    stop: Some(stop),
    collect_data: Some(collect_data),
});

/// The extension chain's profiler entry.
#[repr(transparent)]
pub struct SyncProfilerExtension(pub PJRT_Profiler_Extension);
// SAFETY: immutable; `next` is null and `profiler_api` points to an
// immutable static.
#[allow(unsafe_code)]
unsafe impl Sync for SyncProfilerExtension {}

pub static PROFILER_EXTENSION: SyncProfilerExtension =
    SyncProfilerExtension(PJRT_Profiler_Extension {
        base: PJRT_Extension_Base {
            struct_size: PJRT_Profiler_Extension_STRUCT_SIZE,
            type_: PJRT_Extension_Type_Profiler,
            next: std::ptr::null_mut(),
        },
        profiler_api: &PROFILER_API.0 as *const PLUGIN_Profiler_Api as *mut PLUGIN_Profiler_Api,
        traceme_context_id: 0,
    });

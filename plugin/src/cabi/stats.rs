//! Binding stats of VA-stable graph mode, for Python (ctypes):
//! `xla_vmm_stats_json()` returns a JSON object `{executable: stats}` (see
//! `xla_vmm_runtime::BindingStats`) as a C string the caller frees with
//! `xla_vmm_stats_free()`. `jax_plugins.xla_vmm.stats` wraps both.
//! `xla_vmm_report_json()` returns `{"programs": [...], "dropped": [...],
//! "dropped_total": N, "devices": [...]}`: every loaded program's mode,
//! runner and reason (`xla_vmm_runtime::report`), the final lines of the
//! last programs dropped, each device's memory budget use and the
//! library plans (GEMM, convolution) its loaded programs hold, and its
//! buffer allocator's counters (`allocator`: live buffers, the blocks and
//! granules it keeps cached for reuse) (`jax_plugins.xla_vmm.report`).
//! `xla_vmm_trim()` releases every allocator's cache
//! (`jax_plugins.xla_vmm.trim`).
//!
//! Multi-device: each device's program has its own entry (`name#n`); the
//! entries of programs this plugin ran carry `"device"`, the global id of
//! their device, so per-device stats are the entries grouped by it.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::Mutex;

use xla_vmm_device::vmm::{VmmAllocator, VmmStats, WeakAllocator};

/// What a device's object says while it lives (None once it is gone).
type Probe<T> = Box<dyn Fn() -> Option<T> + Send + Sync>;
/// Probes by device.
type Probes<T> = Mutex<Vec<(Dev, Probe<T>)>>;

/// A device: its name, and its backend object's address (several backends
/// may share a name, the host backend's in tests).
#[derive(Clone, PartialEq)]
struct Dev {
    name: String,
    key: usize,
}

impl Dev {
    fn of<B: xla_vmm_device::Backend>(backend: &B) -> Dev {
        let info = backend.info();
        Dev {
            name: format!("{} {} ({})", info.backend, info.ordinal, info.name),
            key: backend as *const B as *const () as usize,
        }
    }
}

/// Each device's memory budget use, while its backend lives.
static MEMORY: Probes<xla_vmm_device::MemoryUsage> = Mutex::new(Vec::new());
/// Each device's (GEMM, convolution, FFT) plans kept by its engine, while it lives.
static PLANS: Probes<xla_vmm_device::blas::LivePlans> = Mutex::new(Vec::new());
/// Each device's memories for temporaries its programs share: (how many, bytes).
static TEMPS: Probes<(usize, u64)> = Mutex::new(Vec::new());
/// Each device's buffer allocator, while it lives.
static ALLOCATORS: Mutex<Vec<(Dev, Box<dyn Allocator>)>> = Mutex::new(Vec::new());

/// What the report reads of a device's buffer allocator, and what
/// [`xla_vmm_trim`] asks of it; `None` once the allocator is gone.
trait Allocator: Send + Sync {
    fn stats(&self) -> Option<VmmStats>;
    fn trim(&self) -> Option<Result<u64, String>>;
}

impl<B: xla_vmm_device::Backend> Allocator for WeakAllocator<B> {
    fn stats(&self) -> Option<VmmStats> {
        WeakAllocator::stats(self)
    }
    fn trim(&self) -> Option<Result<u64, String>> {
        WeakAllocator::trim(self).map(|r| r.map_err(|e| e.to_string()))
    }
}

/// Keep `f` under `name` in `list`, and drop the entries whose object is gone.
fn record<T>(list: &Probes<T>, dev: Dev, f: Probe<T>) {
    let mut l = list.lock().unwrap_or_else(|p| p.into_inner());
    l.retain(|(_, f)| f().is_some());
    l.push((dev, f));
}

/// Report `backend`'s memory budget (its device's) in `report_json`.
pub fn record_memory<B: xla_vmm_device::Backend + 'static>(backend: &std::sync::Arc<B>) {
    let weak = std::sync::Arc::downgrade(backend);
    let f: Probe<_> = Box::new(move || weak.upgrade().map(|b| b.budget().usage()));
    record(&MEMORY, Dev::of(&**backend), f);
    let weak = std::sync::Arc::downgrade(backend);
    let f: Probe<_> = Box::new(move || {
        weak.upgrade()
            .map(|b| xla_vmm_runtime::report::shared_temporaries(&b))
    });
    record(&TEMPS, Dev::of(&**backend), f);
}

/// Report `allocator`'s stats (its device's buffers, its cache) in
/// `report_json`, and trim it in [`xla_vmm_trim`], while it lives.
pub fn record_allocator<B: xla_vmm_device::Backend + 'static>(allocator: &VmmAllocator<B>) {
    let mut l = ALLOCATORS.lock().unwrap_or_else(|p| p.into_inner());
    l.retain(|(_, a)| a.stats().is_some());
    l.push((
        Dev::of(&**allocator.backend()),
        Box::new(allocator.downgrade()),
    ));
}

/// Report the plans `engine` keeps for `backend`'s programs in `report_json`.
pub fn record_plans<B: xla_vmm_device::Backend>(
    backend: &B,
    engine: &std::sync::Arc<dyn xla_vmm_device::blas::GemmEngine<B>>,
) {
    let weak = std::sync::Arc::downgrade(engine);
    let f: Probe<_> = Box::new(move || weak.upgrade().map(|e| e.live_plans()));
    record(&PLANS, Dev::of(backend), f);
}

/// `{"programs": [...], "dropped": [...], "dropped_total": N, "devices":
/// [...]}` (see the module docs).
pub fn report_json() -> String {
    let plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    let temps = TEMPS.lock().unwrap_or_else(|p| p.into_inner());
    let allocators = ALLOCATORS.lock().unwrap_or_else(|p| p.into_inner());
    let devices: Vec<serde_json::Value> = MEMORY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|(dev, f)| {
            let u = f()?;
            let mut d = serde_json::json!({"device": dev.name, "memory": u});
            if let Some(p) = plans.iter().find(|(d, _)| d == dev).and_then(|(_, f)| f()) {
                d["library_plans"] = serde_json::json!(p);
            }
            if let Some((n, bytes)) = temps.iter().find(|(d, _)| d == dev).and_then(|(_, f)| f()) {
                d["shared_temporaries"] = serde_json::json!({"memories": n, "bytes": bytes});
            }
            if let Some(a) = allocators
                .iter()
                .find(|(d, _)| d == dev)
                .and_then(|(_, a)| a.stats())
            {
                d["allocator"] = serde_json::json!(a);
            }
            Some(d)
        })
        .collect();
    let (dropped, dropped_total) = xla_vmm_runtime::report::dropped_reports();
    serde_json::json!({
        "programs": xla_vmm_runtime::report::all_reports(),
        "dropped": dropped,
        "dropped_total": dropped_total,
        "devices": devices,
    })
    .to_string()
}

/// [`report_json`] as a C string (never null; free it with
/// [`xla_vmm_stats_free`]).
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn xla_vmm_report_json() -> *mut c_char {
    CString::new(report_json())
        .unwrap_or_else(|_| CString::from(c"{}"))
        .into_raw()
}

/// Runtime stats key (`name#n`) -> global device id.
static DEVICES: Mutex<Option<HashMap<String, i32>>> = Mutex::new(None);

/// Tag the stats entry `key` with `device`. The tags of entries the
/// runtime no longer keeps go (a process that compiles and drops programs
/// for hours keeps a bounded map).
pub fn record_device(key: &str, device: i32) {
    let kept = xla_vmm_runtime::binding::stats_keys();
    let mut devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    let map = devices.get_or_insert_with(HashMap::new);
    map.retain(|k, _| kept.contains(k));
    map.insert(key.to_string(), device);
}

/// The runtime's stats JSON with `"device"` added to the entries whose
/// device is known (the old keys unchanged).
pub fn stats_json() -> String {
    let json = xla_vmm_runtime::binding::all_stats_json();
    let Ok(serde_json::Value::Object(mut map)) = serde_json::from_str(&json) else {
        return json;
    };
    let devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(devices) = devices.as_ref() {
        for (key, entry) in map.iter_mut() {
            if let (Some(&d), serde_json::Value::Object(o)) = (devices.get(key), entry) {
                o.insert("device".into(), d.into());
            }
        }
    }
    serde_json::Value::Object(map).to_string()
}

/// The stats of every executable of this process as a JSON C string
/// (never null; free it with [`xla_vmm_stats_free`]).
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn xla_vmm_stats_json() -> *mut c_char {
    let json = stats_json();
    // JSON from serde_json has no interior NUL.
    CString::new(json)
        .unwrap_or_else(|_| CString::from(c"{}"))
        .into_raw()
}

/// Release the memory every device's buffer allocator keeps cached for
/// reuse (freed blocks whose frees have completed, granules with no live
/// buffer), as `jax.clear_caches()` does for compiled programs: the
/// physical bytes released, or -1 when a release failed (logged; the rest
/// is released). Live buffers and programs are untouched.
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn xla_vmm_trim() -> i64 {
    std::panic::catch_unwind(|| {
        let l = ALLOCATORS.lock().unwrap_or_else(|p| p.into_inner());
        let mut released: i64 = 0;
        let mut failed = false;
        for (dev, a) in l.iter() {
            match a.trim() {
                Some(Ok(b)) => released = released.saturating_add(b.min(i64::MAX as u64) as i64),
                Some(Err(e)) => {
                    tracing::warn!(device = %dev.name, error = %e, "trimming the buffer cache failed");
                    failed = true;
                }
                None => {}
            }
        }
        if failed {
            -1
        } else {
            released
        }
    })
    .unwrap_or(-1)
}

/// Free a string returned by [`xla_vmm_stats_json`] (null is ignored).
///
/// # Safety
/// `s` is null or a pointer returned by [`xla_vmm_stats_json`], not freed
/// before.
// SAFETY (no_mangle): project-prefixed name, exported for ctypes only.
#[allow(unsafe_code)]
#[no_mangle]
pub unsafe extern "C" fn xla_vmm_stats_free(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    // SAFETY: `s` came from `CString::into_raw` in `xla_vmm_stats_json`
    // (the documented contract) and is freed once.
    drop(unsafe { CString::from_raw(s) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm_device::blas::{Epilogue, GemmConfig, GemmEngine, GemmPlanId, MatmulArgs};
    use xla_vmm_device::HostBackend;

    /// An engine that says it keeps 3 GEMM plans and 1 convolution plan.
    struct Plans;

    impl GemmEngine<HostBackend> for Plans {
        fn prepare(
            &self,
            _: &GemmConfig,
            _: Epilogue,
            _: usize,
            _: usize,
            _: u64,
        ) -> xla_vmm_device::error::Result<GemmPlanId> {
            unreachable!()
        }
        fn workspace_needed(&self, _: GemmPlanId) -> xla_vmm_device::error::Result<u64> {
            unreachable!()
        }
        fn run(
            &self,
            _: GemmPlanId,
            _: &MatmulArgs,
            _: &xla_vmm_device::host::HostStream,
        ) -> xla_vmm_device::error::Result<()> {
            unreachable!()
        }
        fn live_plans(&self) -> xla_vmm_device::blas::LivePlans {
            xla_vmm_device::blas::LivePlans {
                gemm: 3,
                conv: 1,
                fft: 2,
            }
        }
    }

    #[test]
    fn the_report_lists_live_devices_and_programs() {
        let b = std::sync::Arc::new(xla_vmm_device::HostBackend::default());
        record_memory(&b);
        let line =
            xla_vmm_runtime::report::ReportSlot::register(xla_vmm_runtime::report::ProgramReport {
                program: "stats_rs_report_test".into(),
                runner: "vendor fallback",
                ..Default::default()
            });
        let v: serde_json::Value = serde_json::from_str(&report_json()).unwrap();
        let programs = v["programs"].as_array().unwrap();
        assert!(programs
            .iter()
            .any(|p| p["program"] == "stats_rs_report_test" && p["runner"] == "vendor fallback"));
        let host = |v: &serde_json::Value| {
            v["devices"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["device"].as_str().is_some_and(|n| n.starts_with("host")))
        };
        assert!(host(&v), "{v}");
        assert!(v["devices"][0]["memory"]["device_bytes"].is_u64(), "{v}");
        assert!(
            v["devices"][0]["shared_temporaries"]["bytes"].is_u64(),
            "{v}"
        );
        // The plans an engine keeps for the device's programs, while it lives.
        let engine: std::sync::Arc<dyn GemmEngine<HostBackend>> = std::sync::Arc::new(Plans);
        record_plans(&*b, &engine);
        let held =
            |v: &serde_json::Value| {
                v["devices"].as_array().unwrap().iter().any(|d| {
                    d["library_plans"] == serde_json::json!({"gemm": 3, "conv": 1, "fft": 2})
                })
            };
        assert!(held(&serde_json::from_str(&report_json()).unwrap()));
        drop(engine);
        assert!(!held(&serde_json::from_str(&report_json()).unwrap()));
        drop((b, line));
        let v: serde_json::Value = serde_json::from_str(&report_json()).unwrap();
        let named = |key: &str| {
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["program"] == "stats_rs_report_test")
        };
        // Dropped: among the last programs dropped, not the live ones.
        assert!(!named("programs") && named("dropped"), "{v}");
        assert!(v["dropped_total"].as_u64().unwrap() >= 1);
    }

    #[test]
    fn the_report_shows_each_allocator_and_trim_releases_its_cache() {
        use xla_vmm_device::vmm::VmmConfig;
        let b = std::sync::Arc::new(HostBackend::default());
        let a = VmmAllocator::new(b.clone(), VmmConfig::default()).unwrap();
        record_memory(&b);
        record_allocator(&a);
        // A small buffer and a large one, freed: the allocator keeps the
        // small one's granule and the large one's block for reuse.
        drop(a.alloc(1000).unwrap());
        drop(a.alloc(4 << 20).unwrap());
        let s = a.stats();
        assert_eq!((s.buffers_live, s.cached_blocks, s.granules), (0, 1, 1));
        let mine = serde_json::json!(a.stats());
        let listed = |v: &serde_json::Value| {
            v["devices"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["allocator"] == mine)
        };
        assert!(listed(&serde_json::from_str(&report_json()).unwrap()));
        // Trimmed (every live allocator of the process: this test's among
        // them), nothing is cached and nothing is held.
        assert!(xla_vmm_trim() >= (4 << 20) + (2 << 20));
        let s = a.stats();
        assert_eq!((s.cached_blocks, s.granules, s.bytes_physical), (0, 0, 0));
        // Still usable.
        drop(a.alloc(1000).unwrap());
        assert_eq!(a.stats().granules, 1);
    }

    #[test]
    fn device_tags_of_stats_the_runtime_let_go_are_dropped() {
        record_device("stats_rs_no_such_program#0", 3);
        record_device("stats_rs_no_such_program#1", 4);
        let devices = DEVICES.lock().unwrap();
        let map = devices.as_ref().unwrap();
        // Neither is a runtime stats entry: the first went when the second came.
        assert!(!map.contains_key("stats_rs_no_such_program#0"));
        assert_eq!(map.get("stats_rs_no_such_program#1"), Some(&4));
    }

    #[test]
    #[allow(unsafe_code)]
    fn stats_json_round_trips_through_the_c_functions() {
        let p = xla_vmm_stats_json();
        assert!(!p.is_null());
        // SAFETY: a valid NUL-terminated string from the function above.
        let text = unsafe { std::ffi::CStr::from_ptr(p) }
            .to_str()
            .unwrap()
            .to_owned();
        // SAFETY: returned by xla_vmm_stats_json, freed once.
        unsafe { xla_vmm_stats_free(p) };
        assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
        // SAFETY: null is documented as ignored.
        unsafe { xla_vmm_stats_free(std::ptr::null_mut()) };
    }
}

//! Binding stats of VA-stable graph mode, for Python (ctypes):
//! `xla_vmm_stats_json()` returns a JSON object `{executable: stats}` (see
//! `xla_vmm_runtime::BindingStats`) as a C string the caller frees with
//! `xla_vmm_stats_free()`. `jax_plugins.xla_vmm.stats` wraps both.
//!
//! Multi-device: each device's program has its own entry (`name#n`); the
//! entries of programs this plugin ran carry `"device"`, the global id of
//! their device, so per-device stats are the entries grouped by it.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::Mutex;

/// Runtime stats key (`name#n`) -> global device id.
static DEVICES: Mutex<Option<HashMap<String, i32>>> = Mutex::new(None);

/// Tag the stats entry `key` with `device`.
pub fn record_device(key: &str, device: i32) {
    DEVICES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key.to_string(), device);
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

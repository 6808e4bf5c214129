//! Per-executable binding counters.

use serde::{Deserialize, Serialize};

/// What the binding of one executable has done so far. Counts are per slot
/// per step (a step with 3 skipped slots adds 3 to `skips`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Steps bound.
    pub steps: u64,
    /// Slot bindings that needed nothing (allocation id already mapped).
    pub skips: u64,
    /// Slot bindings that mapped a user allocation (first maps included).
    pub remaps: u64,
    /// Slot bindings served by a shadow copy.
    pub copies: u64,
    /// Bytes moved by copies (in + out).
    pub bytes_copied: u64,
    /// Unmap calls that failed (reported through `fallback_to_copy`).
    pub unmap_errors: u64,
    /// Slots that fell back to copy after a failed driver call.
    pub fallbacks: u64,
    /// Slots moved between direct mapping and shadow by churn history.
    pub mode_switches: u64,
    /// Host time spent binding, reported by the runtime, ns (sum).
    pub host_binding_ns: u64,
    /// Longest single step's host binding time, ns.
    pub host_binding_ns_max: u64,
}

impl Stats {
    /// Mean host binding time per step, ns (0 before the first step).
    pub fn host_binding_ns_mean(&self) -> u64 {
        self.host_binding_ns.checked_div(self.steps).unwrap_or(0)
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "steps={} skips={} remaps={} copies={} bytes_copied={} unmap_errors={} fallbacks={} \
             mode_switches={} host_binding_mean={}ns max={}ns",
            self.steps,
            self.skips,
            self.remaps,
            self.copies,
            self.bytes_copied,
            self.unmap_errors,
            self.fallbacks,
            self.mode_switches,
            self.host_binding_ns_mean(),
            self.host_binding_ns_max
        )
    }
}

//! ROCm's remap cost on a CUDA device, for A/B measurements of the copy
//! threshold where it matters (issue 15): `XLA_VMM_EMULATE_REMAP_MS=3` makes
//! every remap (unmap + map + set access) cost about 3 ms and synchronize
//! the device, as a remap does on ROCm (2-4 ms measured there, waiting for
//! every device that has access). Copies stay as fast as they are. Opt in,
//! never the default: it slows every remap on purpose.
//!
//! The time is paid in the two calls that synchronize on ROCm: `unmap` and
//! `set_access` each wait for the device, then last at least half the cost.
//! The binding-cost probe measures remaps through the same calls, so the
//! auto threshold sees the emulated cost as it would see ROCm's.

use std::time::{Duration, Instant};

use crate::error::{DeviceError, Result};

/// The environment variable: milliseconds per remap (0 or unset: off).
pub const ENV: &str = "XLA_VMM_EMULATE_REMAP_MS";

/// Longest emulated remap accepted (a larger value is a mistake).
const MAX_MS: f64 = 1000.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RemapCost {
    /// What each of `unmap` and `set_access` lasts at least.
    per_call: Duration,
}

impl RemapCost {
    /// From [`ENV`] (the process settings): `None` when unset, empty or 0.
    pub(crate) fn from_env() -> Result<Option<Self>> {
        Self::parse(xla_vmm_ffi::settings::get().emulate_remap_ms.as_deref())
    }

    fn parse(v: Option<&str>) -> Result<Option<Self>> {
        let Some(text) = v.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        match text.parse::<f64>() {
            Ok(0.0) => Ok(None),
            Ok(ms) if ms > 0.0 && ms <= MAX_MS => Ok(Some(RemapCost {
                per_call: Duration::from_secs_f64(ms / 2.0 / 1e3),
            })),
            _ => Err(DeviceError::InvalidArgument(format!(
                "{ENV}={text:?}: expected milliseconds per remap, 0 (off) to {MAX_MS}"
            ))),
        }
    }

    /// Milliseconds per remap (for the log).
    pub(crate) fn remap_ms(&self) -> f64 {
        self.per_call.as_secs_f64() * 2e3
    }

    /// After a call that started at `t0`: wait for the device (`sync`),
    /// then until the call has lasted its share of the remap.
    pub(crate) fn pay(&self, t0: Instant, sync: impl FnOnce() -> Result<()>) -> Result<()> {
        sync()?;
        let spent = t0.elapsed();
        if spent < self.per_call {
            std::thread::sleep(self.per_call - spent);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_a_positive_number_of_milliseconds() {
        for v in [None, Some(""), Some(" "), Some("0"), Some("0.0")] {
            assert_eq!(RemapCost::parse(v).unwrap(), None, "{v:?}");
        }
        let c = RemapCost::parse(Some("3")).unwrap().unwrap();
        assert_eq!(c.per_call, Duration::from_micros(1500));
        assert_eq!(c.remap_ms(), 3.0);
        for bad in ["-1", "abc", "1e9", "NaN", "inf"] {
            let e = RemapCost::parse(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(ENV) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_call_waits_for_the_device_then_lasts_its_share() {
        let c = RemapCost::parse(Some("20")).unwrap().unwrap();
        let mut synced = false;
        let t0 = Instant::now();
        c.pay(t0, || {
            synced = true;
            Ok(())
        })
        .unwrap();
        assert!(synced);
        assert!(
            t0.elapsed() >= Duration::from_millis(10),
            "{:?}",
            t0.elapsed()
        );
        // A failed wait is the call's error, and no time is padded.
        let t1 = Instant::now();
        let e = c
            .pay(t1, || Err(DeviceError::InvalidArgument("sync".into())))
            .unwrap_err();
        assert!(e.to_string().contains("sync"));
        assert!(t1.elapsed() < Duration::from_millis(10));
    }
}

//! The plain data the decision takes: the threshold setting, the device's
//! measured costs, the slots, optional step times and tuning knobs.
//!
//! Everything here is `serde` so `xla-vmm policy --input FILE.json` and the
//! tests can describe a device and a slot list in JSON. [`PolicyInput::validate`]
//! is the single place where the numbers are checked; the decision code after
//! it may assume finite, non-negative values.

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// The copy-vs-remap setting: `0`, `1` or a byte count `N > 1`.
///
/// In JSON, in the configuration and in the CLI it is the raw number, so the setting reads
/// the same everywhere: `0` = [`Threshold::RemapAll`], `1` = [`Threshold::Auto`],
/// anything larger = [`Threshold::Bytes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "u64", into = "u64")]
pub enum Threshold {
    /// `0`: every changing slot is remapped (the baseline of the A/B).
    RemapAll,
    #[default]
    /// `1` (the default): the cutoff is derived from measured costs and free
    /// memory, see the crate docs.
    Auto,
    /// `N > 1`: changing slots of at most `N` bytes are copied (within the
    /// shadow memory cap), larger ones remapped.
    Bytes(u64),
}

impl From<u64> for Threshold {
    fn from(raw: u64) -> Self {
        match raw {
            0 => Threshold::RemapAll,
            1 => Threshold::Auto,
            n => Threshold::Bytes(n),
        }
    }
}

impl From<Threshold> for u64 {
    fn from(t: Threshold) -> u64 {
        t.raw()
    }
}

impl Threshold {
    /// The raw setting (`0`, `1` or `N`).
    pub fn raw(self) -> u64 {
        match self {
            Threshold::RemapAll => 0,
            Threshold::Auto => 1,
            Threshold::Bytes(n) => n,
        }
    }

    /// Parses the text of the environment variable or client option: a
    /// decimal byte count, surrounding whitespace allowed.
    pub fn parse(text: &str) -> Result<Self> {
        text.trim()
            .parse::<u64>()
            .map(Threshold::from)
            .map_err(|_| PolicyError::InvalidThreshold {
                text: text.to_owned(),
            })
    }
}

/// Measured costs of one device (the probe's output) and its memory state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceCosts {
    /// Unmap + map + set access for one slot, in µs (H200: ~46 µs for 2 MiB).
    pub remap_us: f64,
    /// Device-to-device copy bandwidth of a large copy, bytes per second.
    pub copy_bw_bytes_per_s: f64,
    /// Fixed cost of one copy operation (launch bound; H200: ~4-5 µs).
    pub copy_launch_us: f64,
    /// Device memory free when the decision is made.
    pub free_bytes: u64,
    /// Device memory in total.
    pub total_bytes: u64,
    /// Allocation granularity of shadow memory, bytes: each shadow is whole
    /// granules, as the runtime allocates it (VMM physical memory: 2 MiB on
    /// H200), so a 4-byte slot's shadow costs a whole granule. `0` (the
    /// default, e.g. older JSON inputs) = not known: shadows are counted at
    /// their size rounded to [`Knobs::shadow_align_bytes`].
    #[serde(default)]
    pub granularity_bytes: u64,
}

/// One slot (buffer allocation bound per step: a parameter or an output).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotInfo {
    /// Bytes of the slot.
    pub size: u64,
    /// The graph reads the slot (a copy slot is copied in before the launch).
    pub read: bool,
    /// The graph writes the slot (a copy slot is copied out after the step).
    pub written: bool,
    /// Fraction of steps in which the buffer bound to the slot is a different
    /// allocation, in `[0, 1]`. `0` = never changes (e.g. donated and aliased),
    /// `1` = a new allocation every step (the safe prior when unknown).
    pub churn: f64,
    /// Optional per-step history, oldest first: `true` where the slot's
    /// allocation changed at that step. When present, the churn used is an
    /// exponentially weighted average of it, seeded with `churn`, so a slot
    /// that stopped churning is seen as (nearly) free to remap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<bool>>,
    /// The buffers bound to the slot can be mapped at the slot's address
    /// (each is a whole physical allocation). `false` for a copy-only slot,
    /// e.g. one bound to sub-allocated buffers: it is copied under every
    /// threshold (there is no other way to serve it), whatever its churn, and
    /// its shadow and copy time are counted against the cap and budget
    /// before any other slot is admitted. Default `true`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub remappable: bool,
    /// A shadow is already allocated for the slot (a re-plan after warm-up,
    /// see [`crate::tracker`]): its memory counts against the shadow cap
    /// whether the slot is copied or not, and copying the slot needs no new
    /// memory. Default `false` (first plans, older JSON inputs).
    #[serde(default, skip_serializing_if = "is_false")]
    pub has_shadow: bool,
}

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(v: &bool) -> bool {
    !*v
}

fn yes() -> bool {
    true
}

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_true(v: &bool) -> bool {
    *v
}

impl SlotInfo {
    /// A remappable slot without history.
    pub fn new(size: u64, read: bool, written: bool, churn: f64) -> Self {
        SlotInfo {
            size,
            read,
            written,
            churn,
            history: None,
            remappable: true,
            has_shadow: false,
        }
    }

    /// The same slot, copy-only (`remappable: false`).
    pub fn copy_only(mut self) -> Self {
        self.remappable = false;
        self
    }

    /// Number of copy directions a copy slot costs per step: one for copy-in
    /// if the graph reads it, one for copy-out if it writes it.
    pub fn directions(&self) -> u32 {
        u32::from(self.read) + u32::from(self.written)
    }
}

/// Where the step's time goes without any binding work, measured by the
/// runtime. With it the rule knows whether remaps (host time) can hide behind
/// a GPU-bound step; without it costs are simply added.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepTimes {
    /// Host time per step spent enqueueing work (excluding slot binding), µs.
    pub host_us: f64,
    /// GPU time per step (excluding binding copies), µs.
    pub gpu_us: f64,
}

impl StepTimes {
    /// True when the GPU side is the longer one.
    pub fn gpu_bound(&self) -> bool {
        self.gpu_us >= self.host_us
    }
}

/// Tuning knobs of the rule. The defaults are the documented product
/// behaviour; tests and the CLI may override them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Knobs {
    /// Shadow memory (all copies of all shadows) stays at or under this
    /// fraction of free device memory. Default 0.01 (1 %).
    pub shadow_free_fraction: f64,
    /// Hard cap on the expected GPU time of a step's copies, µs. `None` =
    /// derived, see [`Knobs::copy_budget_us`].
    pub copy_budget_us: Option<f64>,
    /// Shadows per copy slot: one per VA reservation (two reservations are
    /// used alternately). Default 2. The runtime shares one shadow between
    /// its reservations (its tracker sets 1: see
    /// [`crate::TrackerConfig::shared_shadows`]).
    pub shadow_copies: u32,
    /// Each shadow is rounded up to this alignment when the device's
    /// granularity ([`DeviceCosts::granularity_bytes`]) is not known
    /// (`0`); a known granularity replaces it. Default 256 bytes.
    pub shadow_align_bytes: u64,
    /// Weight of the newest step in the churn average. Default 0.25.
    pub churn_ewma_alpha: f64,
    /// Safety rail: a slot larger than this is never copied under auto,
    /// whatever the measurements say. Default 256 MiB.
    pub max_copy_slot_bytes: u64,
}

impl Knobs {
    /// Floor of the derived copy-time budget, µs (the reference rule's
    /// unmeasured budget is 15 µs; ours is larger because copies are batched).
    pub const MIN_COPY_BUDGET_US: f64 = 100.0;
    /// With the bound unknown: copies may cost up to this fraction of what
    /// remapping every changing slot would (bounded regret, see below).
    pub const COPY_BUDGET_REMAP_FRACTION: f64 = 0.1;
    /// With step times known: copies may take this fraction of the GPU time.
    pub const COPY_BUDGET_GPU_FRACTION: f64 = 0.05;

    /// The copy-time budget in force, µs, given the step times (if known)
    /// and `all_remap_us`, the expected cost of remapping every changing slot.
    ///
    /// Every admitted copy already pays for itself in the cost model; the
    /// budget bounds the damage when the model is wrong about the step.
    /// * Bound unknown: `max(100 µs, 10 % of all_remap_us)`. If the step is in
    ///   fact GPU-bound and every remap would have hidden behind it, the
    ///   copies cost at most a tenth of what they save when it is not.
    /// * Step times known (the objective then weighs host against GPU time
    ///   exactly): `max(100 µs, 5 % of the GPU time, host − GPU time)`; the
    ///   last term is the GPU idle time of a host-bound step, where copies
    ///   are free.
    pub fn copy_budget_us(&self, step: Option<&StepTimes>, all_remap_us: f64) -> f64 {
        if let Some(b) = self.copy_budget_us {
            return b;
        }
        let derived = match step {
            None => all_remap_us * Self::COPY_BUDGET_REMAP_FRACTION,
            Some(s) => (s.gpu_us * Self::COPY_BUDGET_GPU_FRACTION).max(s.host_us - s.gpu_us),
        };
        Self::MIN_COPY_BUDGET_US.max(derived)
    }

    /// Bytes of shadow memory one copy slot of `size` bytes costs on a
    /// device whose allocation granularity is `granularity` bytes
    /// ([`DeviceCosts::granularity_bytes`]): `size` rounded up to whole
    /// granules (to [`Knobs::shadow_align_bytes`] when `granularity` is 0),
    /// times [`Knobs::shadow_copies`]. This is what the runtime allocates,
    /// so it is what the shadow cap is checked against.
    pub fn shadow_bytes_for(&self, size: u64, granularity: u64) -> u64 {
        let unit = if granularity > 0 {
            granularity
        } else {
            self.shadow_align_bytes.max(1)
        };
        let rounded = size.div_ceil(unit).saturating_mul(unit);
        rounded.saturating_mul(u64::from(self.shadow_copies))
    }

    /// The shadow memory cap for `free_bytes` of free device memory.
    pub fn shadow_cap_bytes(&self, free_bytes: u64) -> u64 {
        // f64 -> u64 `as` saturates and maps NaN to 0; validate() rules NaN out.
        (self.shadow_free_fraction * free_bytes as f64).floor() as u64
    }
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            shadow_free_fraction: 0.01,
            copy_budget_us: None,
            shadow_copies: 2,
            shadow_align_bytes: 256,
            churn_ewma_alpha: 0.25,
            max_copy_slot_bytes: 256 << 20,
        }
    }
}

/// Everything the decision needs: the `xla-vmm policy` input file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyInput {
    /// Measured device costs.
    pub device: DeviceCosts,
    /// `0`, `1` or `N`.
    #[serde(default)]
    pub threshold: Threshold,
    /// The executable's per-step slots, in slot order.
    pub slots: Vec<SlotInfo>,
    /// Optional host and GPU time of a step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepTimes>,
    /// Optional knob overrides.
    #[serde(default)]
    pub knobs: Knobs,
}

fn check_finite_nonneg(what: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(PolicyError::InvalidDevice(format!(
            "{what} must be a finite number >= 0, got {v}"
        )))
    }
}

impl DeviceCosts {
    /// Checks the costs are usable.
    pub fn validate(&self) -> Result<()> {
        check_finite_nonneg("remap_us", self.remap_us)?;
        check_finite_nonneg("copy_launch_us", self.copy_launch_us)?;
        if !(self.copy_bw_bytes_per_s.is_finite() && self.copy_bw_bytes_per_s > 0.0) {
            return Err(PolicyError::InvalidDevice(format!(
                "copy_bw_bytes_per_s must be a finite number > 0, got {}",
                self.copy_bw_bytes_per_s
            )));
        }
        if self.free_bytes > self.total_bytes {
            return Err(PolicyError::InvalidDevice(format!(
                "free_bytes ({}) exceeds total_bytes ({})",
                self.free_bytes, self.total_bytes
            )));
        }
        Ok(())
    }
}

impl Knobs {
    /// Checks the knobs are in range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(PolicyError::InvalidKnob(m));
        if !(self.shadow_free_fraction.is_finite()
            && (0.0..=0.5).contains(&self.shadow_free_fraction))
        {
            return bad(format!(
                "shadow_free_fraction must be in [0, 0.5], got {}",
                self.shadow_free_fraction
            ));
        }
        if let Some(b) = self.copy_budget_us {
            if !(b.is_finite() && b >= 0.0) {
                return bad(format!(
                    "copy_budget_us must be a finite number >= 0, got {b}"
                ));
            }
        }
        if self.shadow_copies == 0 {
            return bad("shadow_copies must be >= 1".into());
        }
        if !(self.churn_ewma_alpha.is_finite()
            && self.churn_ewma_alpha > 0.0
            && self.churn_ewma_alpha <= 1.0)
        {
            return bad(format!(
                "churn_ewma_alpha must be in (0, 1], got {}",
                self.churn_ewma_alpha
            ));
        }
        Ok(())
    }
}

impl SlotInfo {
    /// Checks one slot; `index` is only for the message.
    pub fn validate(&self, index: usize) -> Result<()> {
        if !(self.churn.is_finite() && (0.0..=1.0).contains(&self.churn)) {
            return Err(PolicyError::InvalidSlot {
                index,
                reason: format!("churn must be in [0, 1], got {}", self.churn),
            });
        }
        Ok(())
    }

    /// The churn the rule uses: `churn`, or, with a history, the weighted
    /// average of the history seeded with `churn` (newest step weighs `alpha`).
    pub fn effective_churn(&self, alpha: f64) -> f64 {
        match &self.history {
            Some(h) => h.iter().fold(self.churn, |p, &changed| {
                p + alpha * (f64::from(u8::from(changed)) - p)
            }),
            None => self.churn,
        }
    }
}

impl StepTimes {
    /// Checks the times are usable.
    pub fn validate(&self) -> Result<()> {
        check_finite_nonneg("step.host_us", self.host_us)?;
        check_finite_nonneg("step.gpu_us", self.gpu_us)
    }
}

impl PolicyInput {
    /// Checks every number once, so the rule can assume sane values.
    pub fn validate(&self) -> Result<()> {
        self.device.validate()?;
        self.knobs.validate()?;
        if let Some(s) = &self.step {
            s.validate()?;
        }
        for (i, s) in self.slots.iter().enumerate() {
            s.validate(i)?;
            // A slot is one buffer on this device: it cannot be larger than
            // the device's memory.
            if self.device.total_bytes > 0 && s.size > self.device.total_bytes {
                return Err(PolicyError::InvalidSlot {
                    index: i,
                    reason: format!(
                        "size {} bytes exceeds the device's total memory ({} bytes)",
                        s.size, self.device.total_bytes
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_raw_round_trip() {
        assert_eq!(Threshold::from(0), Threshold::RemapAll);
        assert_eq!(Threshold::from(1), Threshold::Auto);
        assert_eq!(Threshold::from(4096), Threshold::Bytes(4096));
        for raw in [0u64, 1, 2, 65536] {
            assert_eq!(Threshold::from(raw).raw(), raw);
        }
    }

    #[test]
    fn threshold_parse_rejects_garbage() {
        assert_eq!(
            Threshold::parse(" 65536 ").unwrap(),
            Threshold::Bytes(65536)
        );
        assert!(matches!(
            Threshold::parse("64k"),
            Err(PolicyError::InvalidThreshold { .. })
        ));
        assert!(matches!(
            Threshold::parse("-1"),
            Err(PolicyError::InvalidThreshold { .. })
        ));
    }

    #[test]
    fn history_weights_recent_steps() {
        let mut s = SlotInfo::new(4, true, false, 1.0);
        s.history = Some(vec![false; 20]);
        let p = s.effective_churn(0.25);
        assert!(
            p < 0.01,
            "a slot stable for 20 steps should look nearly static, got {p}"
        );
        s.churn = 0.0;
        s.history = Some(vec![false, false, true]);
        assert!((s.effective_churn(0.25) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn shadow_bytes_round_and_double() {
        let k = Knobs::default();
        assert_eq!(k.shadow_bytes_for(4, 0), 512);
        assert_eq!(k.shadow_bytes_for(256, 0), 512);
        assert_eq!(k.shadow_bytes_for(257, 0), 1024);
        assert_eq!(k.shadow_bytes_for(0, 0), 0);
    }

    #[test]
    fn shadow_bytes_are_whole_granules_when_the_granularity_is_known() {
        let g = 2u64 << 20;
        let mut k = Knobs::default();
        assert_eq!(k.shadow_bytes_for(4, g), 2 * g);
        assert_eq!(k.shadow_bytes_for(g, g), 2 * g);
        assert_eq!(k.shadow_bytes_for(g + 1, g), 4 * g);
        assert_eq!(k.shadow_bytes_for(0, g), 0);
        // The granularity replaces the alignment (a granularity of 1: bytes
        // as allocated, no 256-byte rounding).
        assert_eq!(k.shadow_bytes_for(4, 1), 8);
        k.shadow_copies = 1;
        assert_eq!(k.shadow_bytes_for(3 << 10, g), g);
    }

    #[test]
    fn granularity_is_optional_in_json() {
        let old = r#"{"remap_us": 46, "copy_bw_bytes_per_s": 2.4e12, "copy_launch_us": 4,
            "free_bytes": 10, "total_bytes": 20}"#;
        let d: DeviceCosts = serde_json::from_str(old).unwrap();
        assert_eq!(d.granularity_bytes, 0);
        let new = old.replace(
            "\"total_bytes\"",
            "\"granularity_bytes\": 2097152, \"total_bytes\"",
        );
        let d: DeviceCosts = serde_json::from_str(&new).unwrap();
        assert_eq!(d.granularity_bytes, 2 << 20);
    }

    #[test]
    fn validation_catches_bad_numbers() {
        let dev = DeviceCosts {
            remap_us: 46.0,
            copy_bw_bytes_per_s: 2.4e12,
            copy_launch_us: 4.0,
            free_bytes: 10,
            total_bytes: 5,
            granularity_bytes: 0,
        };
        assert!(matches!(dev.validate(), Err(PolicyError::InvalidDevice(_))));
        let dev = DeviceCosts {
            free_bytes: 5,
            copy_bw_bytes_per_s: 0.0,
            ..dev
        };
        assert!(dev.validate().is_err());
        let dev = DeviceCosts {
            copy_bw_bytes_per_s: 1e12,
            remap_us: f64::NAN,
            ..dev
        };
        assert!(dev.validate().is_err());
        assert!(SlotInfo::new(4, true, true, 1.5).validate(3).is_err());
        assert!(SlotInfo::new(4, true, true, f64::NAN).validate(3).is_err());
    }
}

//! Shared helpers of the policy tests.
#![allow(dead_code)]

use xla_vmm_policy::{DeviceCosts, Knobs, PolicyInput, SlotInfo, Threshold};

/// docs/DESIGN.md §4's H200 numbers (remap 46 µs per 2 MiB slot, ~2.4 TB/s D2D,
/// ~4 µs per copy launch), 100 GiB free of 141 GiB.
pub fn h200() -> DeviceCosts {
    DeviceCosts {
        remap_us: 46.0,
        copy_bw_bytes_per_s: 2.4e12,
        copy_launch_us: 4.0,
        free_bytes: 100 << 30,
        total_bytes: 141 << 30,
        granularity_bytes: 0,
    }
}

pub fn input(threshold: u64, slots: Vec<SlotInfo>) -> PolicyInput {
    PolicyInput {
        device: h200(),
        threshold: Threshold::from(threshold),
        slots,
        step: None,
        knobs: Knobs::default(),
    }
}

/// A read+written slot changing every step.
pub fn rw(size: u64) -> SlotInfo {
    SlotInfo::new(size, true, true, 1.0)
}

/// splitmix64: a tiny deterministic PRNG, enough for property-style tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.f64()
    }
    /// Log-uniform integer in [lo, hi].
    pub fn log_u64(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi as f64).ln());
        (self.range(a, b).exp() as u64).clamp(lo, hi)
    }
    pub fn bool(&mut self, p: f64) -> bool {
        self.f64() < p
    }
}

//! Where physical memory lives, and a device's memory budget.
//!
//! Every physical allocation of a backend ([`crate::Backend::mem_create`])
//! goes through its [`MemoryBudget`]: device memory while the device budget
//! allows (the physical capacity, or a smaller limit: a 141 GB card can play
//! a 16 GB one), then *host-located* physical memory (`cuMemCreate` with a
//! host NUMA location, `hipMemCreate` likewise) up to the host limit, then
//! out of memory. Host-located memory is mapped at ordinary device virtual
//! addresses with device access: kernels read and write it in place over the
//! host link (about 51 GB/s on the H200 against 4.2 TB/s from HBM), so a
//! program whose buffers do not fit still runs, unchanged. Which buffers
//! should stay on the device and which may live on the host is the
//! residency plan's business (`xla_vmm_policy::residency`); this module
//! only places and counts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

/// Where a physical allocation lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemLocation {
    /// The device's own memory (HBM).
    Device,
    /// Pinned host memory, mapped for the device (read over the host link).
    Host,
}

/// Limits of a device's memory budget.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryLimits {
    /// Device memory this process may hold on the device
    /// (`XLA_VMM_DEVICE_MEMORY_LIMIT`): past it, allocations are
    /// host-located. `None`: the physical memory is the limit (an allocation
    /// the device cannot hold goes to the host).
    pub device: Option<u64>,
    /// Host-located memory this process may hold for the device
    /// (`XLA_VMM_HOST_MEMORY_LIMIT`): past it, out of memory. `Some(0)`: no
    /// host memory. `None`: half the host's physical memory
    /// ([`default_host_limit`]; pinned memory is not swappable).
    pub host: Option<u64>,
    /// Percent of the device memory (the limit, else the device's own)
    /// that ordinary allocations leave free for staging areas
    /// (`XLA_VMM_STAGING_RESERVE`): past the rest they are host-located,
    /// and the programs using them stage them through the reserve. `None`:
    /// [`DEFAULT_STAGING_RESERVE_PCT`].
    pub staging_reserve: Option<u32>,
}

/// The staging reserve by default: a quarter, which leaves ordinary
/// allocations the three quarters of the device a stock JAX process
/// preallocates.
pub const DEFAULT_STAGING_RESERVE_PCT: u32 = 25;

/// Half the host's physical memory (`MemTotal` of `/proc/meminfo`), the
/// host limit when none is given; unbounded where it cannot be read.
pub fn default_host_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024) / 2)
}

/// What the budget holds now.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryUsage {
    pub device_bytes: u64,
    pub host_bytes: u64,
    pub device_peak_bytes: u64,
    pub host_peak_bytes: u64,
    /// Allocations placed on the host because the device budget (or the
    /// device itself) was full.
    pub spilled: u64,
    /// Physical allocations alive (device and host).
    pub allocations: u64,
    /// Buffers moved between device and host memory under their addresses
    /// (a program's first run placing what it uses: see
    /// `xla_vmm_policy::residency::rebalance`).
    pub relocated: u64,
    /// Virtual address ranges reserved, and their bytes.
    pub va_ranges: u64,
    pub va_bytes: u64,
    /// Since the budget was made: physical allocations and VA ranges made,
    /// and map and unmap calls (each unmap changes the device's page
    /// tables: what a process does to them step by step shows here).
    pub allocations_made: u64,
    pub va_ranges_made: u64,
    pub maps: u64,
    pub unmaps: u64,
    pub limits: MemoryLimits,
}

const NONE: u64 = u64::MAX;

/// A device's budget: limits and the bytes held at each location, shared by
/// every allocation made on the backend (atomics: no lock on the allocation
/// path).
#[derive(Debug)]
pub struct MemoryBudget {
    device_limit: AtomicU64,
    host_limit: AtomicU64,
    device_used: AtomicU64,
    host_used: AtomicU64,
    device_peak: AtomicU64,
    host_peak: AtomicU64,
    spilled: AtomicU64,
    allocations: AtomicU64,
    relocated: AtomicU64,
    va_ranges: AtomicU64,
    va_bytes: AtomicU64,
    allocations_made: AtomicU64,
    va_ranges_made: AtomicU64,
    maps: AtomicU64,
    unmaps: AtomicU64,
    reserve_pct: AtomicU64,
    /// The first spill has been said (once per budget, at info level).
    said: AtomicBool,
}

impl Default for MemoryBudget {
    /// No device limit but the device's own memory; the default host limit.
    fn default() -> Self {
        MemoryBudget {
            device_limit: AtomicU64::new(NONE),
            host_limit: AtomicU64::new(default_host_limit().unwrap_or(NONE)),
            device_used: AtomicU64::new(0),
            host_used: AtomicU64::new(0),
            device_peak: AtomicU64::new(0),
            host_peak: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            relocated: AtomicU64::new(0),
            va_ranges: AtomicU64::new(0),
            va_bytes: AtomicU64::new(0),
            allocations_made: AtomicU64::new(0),
            va_ranges_made: AtomicU64::new(0),
            maps: AtomicU64::new(0),
            unmaps: AtomicU64::new(0),
            reserve_pct: AtomicU64::new(u64::from(DEFAULT_STAGING_RESERVE_PCT)),
            said: AtomicBool::new(false),
        }
    }
}

fn opt(v: u64) -> Option<u64> {
    (v != NONE).then_some(v)
}

impl MemoryBudget {
    /// Set the limits (the front door, when it creates the backend; see
    /// [`MemoryLimits`] for what `None` means).
    pub fn set_limits(&self, limits: MemoryLimits) {
        self.device_limit
            .store(limits.device.unwrap_or(NONE), Ordering::Relaxed);
        let host = limits.host.or_else(default_host_limit);
        self.host_limit
            .store(host.unwrap_or(NONE), Ordering::Relaxed);
        let pct = limits
            .staging_reserve
            .unwrap_or(DEFAULT_STAGING_RESERVE_PCT)
            .min(90);
        self.reserve_pct.store(u64::from(pct), Ordering::Relaxed);
    }

    pub fn limits(&self) -> MemoryLimits {
        MemoryLimits {
            device: opt(self.device_limit.load(Ordering::Relaxed)),
            host: opt(self.host_limit.load(Ordering::Relaxed)),
            staging_reserve: Some(self.reserve_pct.load(Ordering::Relaxed) as u32),
        }
    }

    pub fn usage(&self) -> MemoryUsage {
        MemoryUsage {
            device_bytes: self.device_used.load(Ordering::Relaxed),
            host_bytes: self.host_used.load(Ordering::Relaxed),
            device_peak_bytes: self.device_peak.load(Ordering::Relaxed),
            host_peak_bytes: self.host_peak.load(Ordering::Relaxed),
            spilled: self.spilled.load(Ordering::Relaxed),
            allocations: self.allocations.load(Ordering::Relaxed),
            relocated: self.relocated.load(Ordering::Relaxed),
            va_ranges: self.va_ranges.load(Ordering::Relaxed),
            va_bytes: self.va_bytes.load(Ordering::Relaxed),
            allocations_made: self.allocations_made.load(Ordering::Relaxed),
            va_ranges_made: self.va_ranges_made.load(Ordering::Relaxed),
            maps: self.maps.load(Ordering::Relaxed),
            unmaps: self.unmaps.load(Ordering::Relaxed),
            limits: self.limits(),
        }
    }

    fn counters(&self, at: MemLocation) -> (&AtomicU64, &AtomicU64, &AtomicU64) {
        match at {
            MemLocation::Device => (&self.device_used, &self.device_limit, &self.device_peak),
            MemLocation::Host => (&self.host_used, &self.host_limit, &self.host_peak),
        }
    }

    /// Device bytes ordinary allocations may hold: the limit (else
    /// `device_total`, the device's memory, when known) less the staging
    /// reserve.
    pub fn ordinary_device_ceiling(&self, device_total: u64) -> u64 {
        let full = match self.device_limit.load(Ordering::Relaxed) {
            NONE if device_total > 0 => device_total,
            NONE => return NONE,
            l if device_total > 0 => l.min(device_total),
            l => l,
        };
        let pct = self.reserve_pct.load(Ordering::Relaxed);
        full - (u128::from(full) * u128::from(pct) / 100) as u64
    }

    /// Device bytes ordinary allocations may still take: the ceiling
    /// ([`MemoryBudget::ordinary_device_ceiling`]) less what is held.
    pub fn ordinary_device_room(&self, device_total: u64) -> u64 {
        self.ordinary_device_ceiling(device_total)
            .saturating_sub(self.device_used.load(Ordering::Relaxed))
    }

    /// Take `bytes` at `at` if its limit allows (false: it does not).
    pub fn try_take(&self, at: MemLocation, bytes: u64) -> bool {
        self.try_take_below(at, bytes, NONE)
    }

    /// Take `bytes` at `at` if its limit and `ceiling` allow.
    pub fn try_take_below(&self, at: MemLocation, bytes: u64, ceiling: u64) -> bool {
        let (used, limit, peak) = self.counters(at);
        let limit = limit.load(Ordering::Relaxed).min(ceiling);
        let took = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            u.checked_add(bytes).filter(|&n| n <= limit)
        });
        match took {
            Ok(before) => {
                peak.fetch_max(before + bytes, Ordering::Relaxed);
                self.allocations.fetch_add(1, Ordering::Relaxed);
                self.allocations_made.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// Give back `bytes` taken at `at`.
    pub fn give(&self, at: MemLocation, bytes: u64) {
        let (used, _, _) = self.counters(at);
        let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            Some(u.saturating_sub(bytes))
        });
        let _ = self
            .allocations
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// A virtual address range of `bytes` was reserved (`true`) or freed.
    pub fn note_va(&self, reserved: bool, bytes: u64) {
        let step = |c: &AtomicU64, by: u64| {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(if reserved {
                    n.saturating_add(by)
                } else {
                    n.saturating_sub(by)
                })
            });
        };
        step(&self.va_ranges, 1);
        step(&self.va_bytes, bytes);
        if reserved {
            self.va_ranges_made.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A range was mapped (`true`) or unmapped.
    pub fn note_mapping(&self, mapped: bool) {
        let c = if mapped { &self.maps } else { &self.unmaps };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Count an allocation placed on the host for want of device memory;
    /// the first is said at info level.
    pub fn note_spill(&self, bytes: u64, why: &str) {
        self.spilled.fetch_add(1, Ordering::Relaxed);
        if !self.said.swap(true, Ordering::Relaxed) {
            tracing::info!(bytes, reason = why, limits = ?self.limits(),
                "device memory budget full: allocations now go to host memory (read over the host link)");
        }
    }

    /// Count a buffer moved between device and host memory.
    pub fn note_relocation(&self) {
        self.relocated.fetch_add(1, Ordering::Relaxed);
    }

    /// Buffers moved so far: a program that planned for where its buffers
    /// were plans again when this changes.
    pub fn relocations(&self) -> u64 {
        self.relocated.load(Ordering::Relaxed)
    }

    /// Why an allocation of `bytes` found room nowhere.
    pub fn exhausted(&self, bytes: u64) -> String {
        let u = self.usage();
        let lim = |v: Option<u64>| v.map_or("no limit".to_string(), |b| format!("{b} bytes"));
        format!(
            "no room for {bytes} bytes: device {} bytes held (limit {}), host {} bytes held \
             (limit {}; XLA_VMM_DEVICE_MEMORY_LIMIT / XLA_VMM_HOST_MEMORY_LIMIT)",
            u.device_bytes,
            lim(u.limits.device),
            u.host_bytes,
            lim(u.limits.host)
        )
    }
}

/// A byte count as users write it: `16G`, `512M`, `1.5GiB`, `1048576`
/// (K, M, G, T: powers of 1024; a trailing `B`/`iB` is allowed).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let up = text.trim().to_ascii_uppercase();
    let t = up
        .strip_suffix("IB")
        .or_else(|| up.strip_suffix('B'))
        .unwrap_or(&up);
    let (num, shift) = match t.chars().last()?.to_ascii_uppercase() {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let num = num.trim();
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * (1u64 << shift) as f64;
    (f.is_finite() && f >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_and_va_ranges_are_counted_while_alive() {
        let b = MemoryBudget::default();
        assert!(b.try_take(MemLocation::Device, 4096));
        assert!(b.try_take(MemLocation::Host, 4096));
        b.note_va(true, 1 << 21);
        let u = b.usage();
        assert_eq!((u.allocations, u.va_ranges, u.va_bytes), (2, 1, 1 << 21));
        b.give(MemLocation::Device, 4096);
        b.give(MemLocation::Host, 4096);
        b.note_va(false, 1 << 21);
        let u = b.usage();
        assert_eq!((u.allocations, u.va_ranges, u.va_bytes), (0, 0, 0));
        // A give without a take does not wrap.
        b.give(MemLocation::Device, 1);
        assert_eq!(b.usage().allocations, 0);
    }

    #[test]
    fn what_was_ever_made_mapped_and_unmapped_only_grows() {
        use crate::backend::Backend;
        let b = crate::host::HostBackend::new(crate::host::HostConfig::default()).unwrap();
        let before = b.budget().usage();
        let mem = b.mem_create_at(2 << 20, MemLocation::Device).unwrap();
        let va = b.va_reserve(2 << 20, 0).unwrap();
        for _ in 0..3 {
            b.map(&va, 0, &mem, 0, 2 << 20).unwrap();
            b.unmap(&va, 0, 2 << 20).unwrap();
        }
        // A failed map counts nothing.
        assert!(b.map(&va, 4 << 20, &mem, 0, 2 << 20).is_err());
        b.va_free(va).unwrap();
        b.mem_release(mem).unwrap();
        let u = b.budget().usage();
        let made = |u: &MemoryUsage| (u.allocations_made, u.va_ranges_made, u.maps, u.unmaps);
        let (a, v, m, n) = made(&before);
        assert_eq!(made(&u), (a + 1, v + 1, m + 3, n + 3));
        assert_eq!(
            (u.allocations, u.va_ranges),
            (before.allocations, before.va_ranges)
        );
    }

    #[test]
    fn limits_bound_each_location_and_peaks_are_kept() {
        let b = MemoryBudget::default();
        assert!(
            b.try_take(MemLocation::Device, u64::MAX / 2),
            "no device limit"
        );
        if let Some(h) = default_host_limit() {
            assert_eq!(b.limits().host, Some(h));
            assert!(!b.try_take(MemLocation::Host, h + 1));
        }
        b.give(MemLocation::Device, u64::MAX / 2);
        b.set_limits(MemoryLimits {
            device: Some(100),
            host: Some(50),
            staging_reserve: Some(20),
        });
        assert_eq!(b.ordinary_device_ceiling(0), 80);
        assert_eq!(b.ordinary_device_ceiling(90), 72, "the device is smaller");
        assert!(!b.try_take_below(MemLocation::Device, 81, 80));
        assert!(b.try_take(MemLocation::Device, 60));
        assert!(!b.try_take(MemLocation::Device, 41), "60 + 41 > 100");
        assert!(b.try_take(MemLocation::Device, 40));
        assert!(b.try_take(MemLocation::Host, 50));
        assert!(!b.try_take(MemLocation::Host, 1));
        b.give(MemLocation::Device, 100);
        let u = b.usage();
        assert_eq!((u.device_bytes, u.host_bytes), (0, 50));
        assert_eq!(u.device_peak_bytes, u64::MAX / 2);
        assert!(
            b.exhausted(7).contains("no room for 7 bytes"),
            "{}",
            b.exhausted(7)
        );
    }

    #[test]
    fn byte_counts_as_users_write_them() {
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes("16G"), Some(16 << 30));
        assert_eq!(parse_bytes("16GiB"), Some(16 << 30));
        assert_eq!(parse_bytes(" 512 M "), Some(512 << 20));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("2kb"), Some(2048));
        for bad in ["", "G", "-1G", "lots", "1e400", "99999999999T"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }
}

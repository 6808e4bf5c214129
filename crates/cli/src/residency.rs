//! `xla-vmm inspect FILE --memory-budget BYTES`: the residency plan of a
//! program under a device memory budget (which buffers stay in device
//! memory, which are staged ahead of the thunks that use them, which are
//! read in place from host memory; what crosses the link per step and which
//! thunks are expected to wait), as text or as part of `--json`. No GPU.

use std::fmt::Write as _;

use serde_json::{json, Value};
use xla_vmm::Plan;
use xla_vmm_policy::residency::{Placement, Rates, ResidencyPlan};

/// The device's rates for the plan (the H200's measured ones by default).
#[derive(clap::Args, Clone, Debug)]
pub struct RateArgs {
    /// Host link bandwidth, GB/s each way.
    #[arg(long, value_name = "GB/S", default_value_t = Rates::H200.link_bytes_per_s / 1e9)]
    pub link_gbps: f64,
    /// Device memory bandwidth, GB/s.
    #[arg(long, value_name = "GB/S", default_value_t = Rates::H200.hbm_bytes_per_s / 1e9)]
    pub hbm_gbps: f64,
    /// Arithmetic, TFLOP/s.
    #[arg(long, value_name = "TFLOP/S", default_value_t = Rates::H200.flops_per_s / 1e12)]
    pub tflops: f64,
}

impl RateArgs {
    fn rates(&self) -> Rates {
        Rates {
            link_bytes_per_s: self.link_gbps * 1e9,
            hbm_bytes_per_s: self.hbm_gbps * 1e9,
            flops_per_s: self.tflops * 1e12,
        }
    }
}

/// `--memory-budget`'s text (`16G`, `512M`, bytes).
pub fn parse_budget(text: &str) -> Result<u64, String> {
    xla_vmm_device::budget::parse_bytes(text)
        .ok_or_else(|| format!("{text:?}: expected bytes, e.g. 16G, 512M or 1048576"))
}

/// The plan of `plan` under `budget`.
pub fn plan(plan: &Plan, budget: u64, rates: &RateArgs) -> anyhow::Result<ResidencyPlan> {
    Ok(xla_vmm_runtime::residency::plan_for(
        plan,
        budget,
        rates.rates(),
    )?)
}

fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn name(plan: &Plan, r: &ResidencyPlan, i: usize) -> String {
    let b = &r.buffers[i];
    let whole = plan
        .allocations
        .get(b.id)
        .is_some_and(|a| a.size == b.bytes);
    if whole {
        format!("allocation {} ({}, {})", b.id, b.name, gib(b.bytes))
    } else {
        format!(
            "allocation {} at {} ({}, {})",
            b.id,
            b.offset,
            b.name,
            gib(b.bytes)
        )
    }
}

/// Rows of a list shown in the text (the JSON has them all).
const SHOWN: usize = 8;

/// The readable summary.
pub fn text(plan: &Plan, r: &ResidencyPlan) -> String {
    let mut s = String::new();
    let count = |p: Placement| {
        let (n, b) = r
            .placements
            .iter()
            .zip(&r.buffers)
            .filter(|(x, b)| **x == p && b.bytes > 0)
            .fold((0, 0u64), |(n, b), (_, x)| (n + 1, b + x.bytes));
        format!("{n} ({})", gib(b))
    };
    let _ = writeln!(
        s,
        "residency under a {} device budget (the program's buffers: {}):",
        gib(r.budget_bytes),
        gib(r.total_bytes)
    );
    let _ = writeln!(
        s,
        "  buffers (allocations, or their regions the thunks use): device {}, staged {}, in place {}",
        count(Placement::Device),
        count(Placement::Staged),
        count(Placement::InPlace)
    );
    let _ = writeln!(
        s,
        "  peak device bytes: {} (resident {} + staging {})",
        gib(r.peak_device_bytes),
        gib(r.resident_bytes),
        gib(r.staging_bytes)
    );
    let _ = writeln!(
        s,
        "  per step over the link: {} in, {} out, {} read or written in place",
        gib(r.bytes_in_per_step),
        gib(r.bytes_out_per_step),
        gib(r.bytes_in_place_per_step)
    );
    let _ = writeln!(
        s,
        "  estimated step: {:.3} ms (every buffer on the device: {:.3} ms; link bound: {:.3} ms)",
        r.step_us / 1e3,
        r.unbudgeted_step_us / 1e3,
        r.link_bound_us / 1e3
    );
    let _ = writeln!(s, "  prefetches: {}", r.prefetches.len());
    for p in r.prefetches.iter().take(SHOWN) {
        let _ = writeln!(
            s,
            "    {} before thunk {}{} for thunk {}",
            name(plan, r, p.buffer),
            p.issue_before,
            if p.from_previous_step {
                " of the previous step"
            } else {
                ""
            },
            p.needed_by
        );
    }
    let waited: f64 = r.waits.iter().fold(0.0, |a, w| a + w.wait_us);
    let _ = writeln!(
        s,
        "  thunks expected to wait: {} ({:.3} ms in all)",
        r.waits.len(),
        waited / 1e3
    );
    let mut waits = r.waits.clone();
    waits.sort_by(|a, b| b.wait_us.total_cmp(&a.wait_us));
    for w in waits.iter().take(SHOWN) {
        let _ = writeln!(
            s,
            "    thunk {} waits {:.3} ms for {}",
            w.thunk,
            w.wait_us / 1e3,
            name(plan, r, w.buffer)
        );
    }
    s
}

/// The `residency` member of `inspect --json`.
pub fn json(r: &ResidencyPlan) -> Value {
    let placements: Vec<Value> = r
        .placements
        .iter()
        .zip(&r.buffers)
        .map(|(p, b)| {
            json!({"allocation": b.id, "offset": b.offset, "bytes": b.bytes, "role": b.name,
                   "placement": p})
        })
        .collect();
    json!({
        "budget_bytes": r.budget_bytes,
        "total_bytes": r.total_bytes,
        "peak_device_bytes": r.peak_device_bytes,
        "resident_bytes": r.resident_bytes,
        "staging_bytes": r.staging_bytes,
        "bytes_in_per_step": r.bytes_in_per_step,
        "bytes_out_per_step": r.bytes_out_per_step,
        "bytes_in_place_per_step": r.bytes_in_place_per_step,
        "step_us": r.step_us,
        "unbudgeted_step_us": r.unbudgeted_step_us,
        "link_bound_us": r.link_bound_us,
        "placements": placements,
        "prefetches": r.prefetches,
        "evictions": r.evictions,
        "waits": r.waits,
    })
}

//! `xla-vmm policy --input FILE.json [--json]`: run the slot binding decision
//! on a described device and slot list and show what it would do.
//!
//! Input (see `crates/policy/examples/`):
//! `{"device": {"remap_us", "copy_bw_bytes_per_s", "copy_launch_us",
//! "free_bytes", "total_bytes"[, "granularity_bytes"]}, "threshold": 0|1|N,
//! "slots": [{"size", "read", "written", "churn"}]}` (`granularity_bytes`:
//! shadows are counted in whole granules of it), optionally `"step":
//! {"host_us", "gpu_us"}`, per-slot `"history": [bool]` and `"remappable": false` (a
//! copy-only slot, e.g. sub-allocated buffers: copied under every
//! threshold), `"has_shadow": true` (a re-plan: the slot's shadow is already
//! allocated, counted against the cap whatever is decided), and `"knobs"`.
//! Older inputs without the optional fields parse unchanged.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use xla_vmm_policy::{decide, BindingPlan, Decision, PolicyInput, Threshold};

/// Arguments of `xla-vmm policy`.
#[derive(clap::Args)]
pub struct Args {
    /// JSON file describing the device, the threshold and the slots (`-` = stdin).
    #[arg(long)]
    input: PathBuf,
    /// Print the plan as JSON (keys: threshold_bytes, decisions, shadow_bytes,
    /// copy_us_per_step, remap_us_per_step, ...) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text = if args.input.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the policy input from stdin")?;
        s
    } else {
        std::fs::read_to_string(&args.input)
            .with_context(|| format!("reading {}", args.input.display()))?
    };
    let input: PolicyInput = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as a policy input", args.input.display()))?;
    let plan = decide(&input).with_context(|| format!("deciding for {}", args.input.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", table(&input, &plan));
    }
    Ok(())
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn threshold_text(plan: &BindingPlan) -> String {
    match plan.threshold {
        Threshold::RemapAll => "0 (remap every changing slot)".to_owned(),
        Threshold::Auto => format!("1 (auto) -> cutoff {}", bytes(plan.threshold_bytes)),
        Threshold::Bytes(n) => format!("{n} (copy slots of at most {})", bytes(n)),
    }
}

/// The human-readable report.
fn table(input: &PolicyInput, plan: &BindingPlan) -> String {
    use std::fmt::Write;
    let d = &input.device;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "threshold  {}   rule: {:?}",
        threshold_text(plan),
        plan.rule
    );
    let _ = writeln!(
        out,
        "device     remap {:.1} us/slot, copy {:.2} TB/s + {:.1} us/launch, free {} of {}",
        d.remap_us,
        d.copy_bw_bytes_per_s / 1e12,
        d.copy_launch_us,
        bytes(d.free_bytes),
        bytes(d.total_bytes)
    );
    if d.granularity_bytes > 0 {
        let _ = writeln!(
            out,
            "           shadows in whole granules of {}",
            bytes(d.granularity_bytes)
        );
    }
    if let Some(s) = &input.step {
        let bound = if s.gpu_bound() {
            "GPU-bound"
        } else {
            "host-bound"
        };
        let _ = writeln!(
            out,
            "step       host {:.1} us, GPU {:.1} us ({bound})",
            s.host_us, s.gpu_us
        );
    }
    let _ = writeln!(
        out,
        "break-even (churn 1, batched)  read+write {}, one way {}",
        bytes(plan.break_even_bytes_read_write),
        bytes(plan.break_even_bytes_one_way)
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>5}  {:>12}  {:>3}  {:>5}  decision",
        "slot", "size", "dir", "churn"
    );
    for (i, (s, dec)) in input.slots.iter().zip(&plan.decisions).enumerate() {
        let dir = match (s.read, s.written) {
            (true, true) => "rw",
            (true, false) => "r",
            (false, true) => "w",
            (false, false) => "-",
        };
        let dec = match dec {
            Decision::Skip => "skip",
            Decision::Remap => "remap",
            Decision::Copy if !s.remappable => "copy (copy-only)",
            Decision::Copy => "copy",
        };
        let churn = s.effective_churn(input.knobs.churn_ewma_alpha);
        let _ = writeln!(
            out,
            "{i:>5}  {:>12}  {dir:>3}  {churn:>5.2}  {dec}",
            bytes(s.size)
        );
    }
    let c = &plan.counts;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "decisions  {} copy ({} copy-only), {} remap, {} skip ({} kept out by the shadow cap or copy budget)",
        c.copy, c.copy_only, c.remap, c.skip, c.budget_limited
    );
    let _ = writeln!(
        out,
        "shadow     {} (cap {})",
        bytes(plan.shadow_bytes),
        bytes(plan.shadow_cap_bytes)
    );
    let _ = writeln!(
        out,
        "per step   copy {:.2} us ({} batched ops: in {}, out {}), remap {:.2} us expected, total {:.2} us",
        plan.copy_us_per_step,
        plan.copy_launches_per_step,
        bytes(plan.copy_in_bytes_per_step),
        bytes(plan.copy_out_bytes_per_step),
        plan.remap_us_per_step,
        plan.binding_us_per_step()
    );
    if let Some(t) = plan.step_us {
        let _ = writeln!(out, "step time  {t:.1} us expected");
    }
    if let Some(r) = &plan.reference {
        let _ = writeln!(
            out,
            "reference  ROCm XLA rule: cutoff {}, copy {:.2} us as it runs them ({:.2} us batched), remap {:.2} us, \
             shadow {}{}",
            bytes(r.threshold_bytes),
            r.copy_us_per_step_unbatched,
            r.copy_us_per_step,
            r.remap_us_per_step,
            bytes(r.shadow_bytes),
            if r.feasible { "" } else { " (over our caps)" }
        );
    }
    out
}

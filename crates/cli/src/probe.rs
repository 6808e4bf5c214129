//! `xla-vmm probe`: measure the device costs the copy-vs-remap policy uses
//! (remap cost, D2D bandwidth, per-copy and graph launch overhead, memory).

use anyhow::Context;
use xla_vmm_device::probe::{probe, DeviceCosts, ProbeConfig};
use xla_vmm_device::Backend;

use crate::BackendKind;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: BackendKind,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Fewer, smaller measurements (seconds instead of tens of seconds).
    #[arg(long)]
    pub quick: bool,
}

fn measure<B: Backend>(b: &B, quick: bool) -> anyhow::Result<DeviceCosts> {
    let cfg = if quick {
        ProbeConfig::quick()
    } else {
        ProbeConfig::default()
    };
    probe(b, &cfg).context("probe failed")
}

fn costs(args: &Args) -> anyhow::Result<DeviceCosts> {
    match args.backend {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let b = xla_vmm_device::cuda::CudaBackend::new(args.device)
                .context("cannot open the CUDA device")?;
            measure(&b, args.quick)
        }
        #[cfg(feature = "hip")]
        BackendKind::Hip => {
            let b = xla_vmm_device::hip::HipBackend::new(args.device)
                .context("cannot open the HIP device")?;
            measure(&b, args.quick)
        }
        BackendKind::Host => {
            let b = xla_vmm_device::HostBackend::new(xla_vmm_device::HostConfig::default())?;
            // The host backend holds 1 GiB: always use the small sizes.
            measure(&b, true)
        }
        #[allow(unreachable_patterns)]
        other => anyhow::bail!("this xla-vmm was built without the {other:?} backend"),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    use std::io::Write;
    let c = costs(&args)?;
    let text = if args.json {
        serde_json::to_string_pretty(&c)? + "\n"
    } else {
        c.to_table()
    };
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // `xla-vmm probe | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

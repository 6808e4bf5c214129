//! `xla-vmm`: inspect, replay and benchmark XLA GPU executables on the
//! xla-vmm runtime. Each subcommand lives in its own module.

#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

mod inspect;
mod policy;
mod probe;
mod residency;
mod run;
mod run_multi;

/// Largest executable file the commands read (real ones are megabytes).
pub const MAX_EXECUTABLE_BYTES: u64 = 8 << 30;

/// Read an executable file once, refusing one larger than
/// [`MAX_EXECUTABLE_BYTES`] before reading it.
pub fn read_executable(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len > MAX_EXECUTABLE_BYTES {
        anyhow::bail!(
            "{} is {len} bytes: executables above {} GiB are refused",
            path.display(),
            MAX_EXECUTABLE_BYTES >> 30
        );
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// How programs run (mode, guard, binding, probe) as the environment says
/// (`XLA_VMM_EXEC_MODE`, `XLA_VMM_TMP_COPY_THRESHOLD`, ...: the table is
/// `xla_vmm_runtime::OPTIONS`). The CLI's one reader of those variables; a
/// command's flags win over what it returns.
pub fn run_config_from_env() -> anyhow::Result<xla_vmm_runtime::RunConfig> {
    Ok(xla_vmm_runtime::RunConfig::from_lookup(|v| {
        std::env::var(v).ok()
    })?)
}

/// Which device backend a command runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// NVIDIA (feature `cuda`).
    Cuda,
    /// AMD (feature `hip`; unverified on hardware).
    Hip,
    /// The host emulation backend, no GPU: host memory with emulated VMM; it runs
    /// no GPU kernel, so a real executable stops at load, saying which thunk.
    Host,
}

#[derive(Parser)]
#[command(
    name = "xla-vmm",
    version,
    about = "Inspect, replay and tune XLA GPU executables on the xla-vmm runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // One line per subcommand: `Name(module::Args)`.
    /// Decode a serialized XLA GPU executable and summarize it.
    Inspect(inspect::Args),
    /// Show what the skip/remap/copy rule decides for a described device and slot list.
    Policy(policy::Args),
    /// Replay an executable with .npz inputs; compare, write, time outputs.
    Run(run::Args),
    /// Measure device costs (remap, copy bandwidth, launch overheads) for the threshold policy.
    Probe(probe::Args),
}

fn main() -> std::process::ExitCode {
    // The lower layers' settings (library overrides, timeouts), read once.
    use xla_vmm_device::settings::{install, Settings};
    install(Settings::from_lookup(|k| std::env::var_os(k)));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XLA_VMM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal, and never under NO_COLOR (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        // One line per subcommand: `Command::Name(args) => module::run(args),`
        Command::Inspect(args) => inspect::run(args),
        Command::Policy(args) => policy::run(args),
        Command::Run(args) => run::run(args, run_multi::run),
        Command::Probe(args) => probe::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

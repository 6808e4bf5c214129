//! How programs run: one [`RunConfig`], resolved once at a front door (the
//! plugin's client options with the environment as fallback, or the CLI's
//! flags) and handed to [`crate::Executable::load_with`]. Nothing in the
//! runtime reads the environment: a front door calls
//! [`RunConfig::from_lookup`] with its own reader (`std::env::var`), then
//! [`RunConfig::set`] for what its caller gave explicitly.
//!
//! [`OPTIONS`] is the one table of these options (key, environment
//! variable, values, default, meaning); the README's table is checked
//! against it (`crates/runtime/tests/config_docs.rs`).

use crate::binding::{BindingConfig, CopyPath, Probe};
use crate::error::{Result, RuntimeError};
use crate::mode::Mode;
use xla_vmm_device::budget::parse_bytes;
use xla_vmm_device::MemoryLimits;
use xla_vmm_policy::Threshold;

/// One option of [`RunConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionSpec {
    /// Its name as a PJRT client option (`jax_pjrt_client_create_options`).
    pub key: &'static str,
    /// The environment variable the front doors fall back to.
    pub env: &'static str,
    /// What it takes.
    pub values: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

/// Every option of [`RunConfig`], in the order the docs list them.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        key: "exec_mode",
        env: "XLA_VMM_EXEC_MODE",
        values: "graph, graph-recapture, eager",
        default: "graph",
        doc: "how programs run: VA-stable graphs (recorded once, buffers bound per step), one graph \
              re-captured when addresses change, or thunk by thunk",
    },
    OptionSpec {
        key: "guard",
        env: "XLA_VMM_GUARD",
        values: "0, 1",
        default: "1",
        doc: "graph mode measures each program's first steps as graph-recapture and keeps it where it \
              replays one graph; otherwise it measures the VA-stable graph too (and eager where recapture \
              keeps capturing or memory is in host memory) and runs the fastest (said in stats() and one \
              log line); 0 keeps VA-stable graphs",
    },
    OptionSpec {
        key: "xla_vmm_tmp_copy_threshold",
        env: "XLA_VMM_TMP_COPY_THRESHOLD",
        values: "0, 1, N (bytes)",
        default: "1",
        doc: "VA-stable binding: 0 remaps every changed slot, 1 chooses copy or remap from measured \
              costs, N copies changed slots of at most N bytes",
    },
    OptionSpec {
        key: "copy_path",
        env: "XLA_VMM_COPY_PATH",
        values: "auto, kernel, batch",
        default: "auto",
        doc: "VA-stable copies: a copy kernel inside the step's graph, or batched driver copies \
              around it",
    },
    OptionSpec {
        key: "reservations",
        env: "XLA_VMM_RESERVATIONS",
        values: "1, 2",
        default: "2",
        doc: "VA reservations (graphs) per program, used in turn",
    },
    OptionSpec {
        key: "probe",
        env: "XLA_VMM_PROBE",
        values: "auto, 0, 1",
        default: "auto",
        doc: "measure remap and copy costs once per device for the auto threshold (auto: on GPUs \
              only)",
    },
    OptionSpec {
        key: "device_memory_limit",
        env: "XLA_VMM_DEVICE_MEMORY_LIMIT",
        values: "bytes (16G, 512M, ...)",
        default: "the device's memory",
        doc: "device memory this process may use; allocations past it live in host memory, \
              mapped for the device (a model larger than the GPU runs, over the host link)",
    },
    OptionSpec {
        key: "host_memory_limit",
        env: "XLA_VMM_HOST_MEMORY_LIMIT",
        values: "bytes (0: none)",
        default: "half the host's memory",
        doc: "pinned host memory allocations past the device may take; past it, RESOURCE_EXHAUSTED",
    },
    OptionSpec {
        key: "staging_reserve",
        env: "XLA_VMM_STAGING_RESERVE",
        values: "percent, 0 to 90",
        default: "25",
        doc: "share of the device memory (the limit, else the device's) that ordinary allocations \
              leave free: programs whose memory went to host memory stage it through there",
    },
    OptionSpec {
        key: "rebalance",
        env: "XLA_VMM_REBALANCE",
        values: "0, 1",
        default: "1",
        doc: "under a device budget, a program's first run moves its buffers between the device \
              and host memory where its plan gains (0: they stay where they were allocated)",
    },
    OptionSpec {
        key: "step_timing",
        env: "XLA_VMM_STEP_TIMING",
        values: "0, 1",
        default: "0",
        doc: "diagnostic: time every VA-stable step on the GPU (logged at debug level)",
    },
];

/// How the programs of a client (or a CLI run) execute.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    pub mode: Mode,
    /// The never-slower guard of [`Mode::Graph`] (see [`crate::guard`]).
    pub guard: bool,
    /// VA-stable binding: threshold, copy path, reservations, costs, probe.
    pub binding: BindingConfig,
    /// The device memory budget (set on each device's backend by the front
    /// door: `backend.budget().set_limits(config.memory)`).
    pub memory: MemoryLimits,
    /// Every program of a device runs on one stream, one step after the
    /// other (the plugin's front door sets it; not an option), so that they
    /// share memory no two steps use at once: one staging area per device
    /// (the first staged program allocates all the room the budget leaves;
    /// the others plan in it; a staged step holds the area while it is
    /// enqueued), and one memory for their temporaries (`crate::temps`).
    pub one_stream: bool,
    /// A program's first run moves its memory where its plan wants it
    /// (`xla_vmm_policy::rebalance`).
    pub rebalance: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            mode: Mode::Graph,
            guard: true,
            binding: BindingConfig::default(),
            memory: MemoryLimits::default(),
            one_stream: false,
            rebalance: true,
        }
    }
}

/// `0`/`1` (also `false`/`true`, `no`/`yes`, `off`/`on`).
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

impl RunConfig {
    /// The defaults, then every option whose environment variable `lookup`
    /// finds (the front door's reader: `|v| std::env::var(v).ok()`). An
    /// error names the variable and what it takes.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut cfg = RunConfig::default();
        for spec in OPTIONS {
            if let Some(text) = lookup(spec.env) {
                cfg.set(spec.key, &text).map_err(|e| {
                    RuntimeError::arg(format!("{}={text:?}: {}", spec.env, reason(&e)))
                })?;
            }
        }
        Ok(cfg)
    }

    /// Is `key` one of [`OPTIONS`]?
    pub fn knows(key: &str) -> bool {
        OPTIONS.iter().any(|s| s.key == key)
    }

    /// Set option `key` from its text (what the environment or a client
    /// option says).
    pub fn set(&mut self, key: &str, text: &str) -> Result<()> {
        let spec = OPTIONS
            .iter()
            .find(|s| s.key == key)
            .ok_or_else(|| RuntimeError::arg(format!("unknown run option {key:?}")))?;
        let bad = || RuntimeError::arg(format!("{key} = {text:?}: expected {}", spec.values));
        match key {
            "exec_mode" => self.mode = Mode::parse(text).map_err(|_| bad())?,
            "guard" => self.guard = parse_bool(text).ok_or_else(bad)?,
            "xla_vmm_tmp_copy_threshold" => {
                self.binding.threshold = Threshold::parse(text).map_err(|_| bad())?
            }
            "copy_path" => self.binding.copy_path = CopyPath::parse(text).map_err(|_| bad())?,
            "reservations" => {
                self.binding.reservations = match text.trim() {
                    "1" => 1,
                    "2" | "" => 2,
                    _ => return Err(bad()),
                }
            }
            "probe" => {
                self.binding.probe = match text.trim() {
                    "" | "auto" => Probe::GpuOnly,
                    "0" => Probe::Never,
                    "1" => Probe::Always,
                    _ => return Err(bad()),
                }
            }
            "step_timing" => self.binding.step_timing = parse_bool(text).ok_or_else(bad)?,
            "rebalance" => self.rebalance = parse_bool(text).ok_or_else(bad)?,
            "device_memory_limit" => self.memory.device = Some(parse_bytes(text).ok_or_else(bad)?),
            "host_memory_limit" => self.memory.host = Some(parse_bytes(text).ok_or_else(bad)?),
            "staging_reserve" => {
                let pct = text.trim().trim_end_matches('%').parse::<u32>();
                self.memory.staging_reserve = Some(pct.ok().filter(|&p| p <= 90).ok_or_else(bad)?)
            }
            _ => return Err(RuntimeError::arg(format!("unknown run option {key:?}"))),
        }
        Ok(())
    }
}

/// The message of an argument error without its kind's prefix.
fn reason(e: &RuntimeError) -> String {
    match e {
        RuntimeError::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn every_option_is_settable_and_the_lookup_names_the_variable() {
        let env: HashMap<&str, &str> = [
            ("XLA_VMM_EXEC_MODE", "eager"),
            ("XLA_VMM_GUARD", "0"),
            ("XLA_VMM_TMP_COPY_THRESHOLD", "4096"),
            ("XLA_VMM_COPY_PATH", "batch"),
            ("XLA_VMM_RESERVATIONS", "1"),
            ("XLA_VMM_PROBE", "0"),
            ("XLA_VMM_STEP_TIMING", "1"),
            ("XLA_VMM_DEVICE_MEMORY_LIMIT", "16G"),
            ("XLA_VMM_HOST_MEMORY_LIMIT", "0"),
            ("XLA_VMM_STAGING_RESERVE", "10"),
            ("XLA_VMM_REBALANCE", "0"),
        ]
        .into();
        assert_eq!(env.len(), OPTIONS.len(), "one case per option");
        let cfg = RunConfig::from_lookup(|v| env.get(v).map(|s| s.to_string())).unwrap();
        assert_eq!(cfg.mode, Mode::Eager);
        assert!(!cfg.guard);
        assert_eq!(cfg.binding.threshold, Threshold::Bytes(4096));
        assert_eq!(cfg.binding.copy_path, CopyPath::Batch);
        assert_eq!(cfg.binding.reservations, 1);
        assert_eq!(cfg.binding.probe, Probe::Never);
        assert!(cfg.binding.step_timing);
        assert_eq!(cfg.memory.device, Some(16 << 30));
        assert_eq!(cfg.memory.host, Some(0));
        assert_eq!(cfg.memory.staging_reserve, Some(10));
        assert!(!cfg.rebalance);
        assert_eq!(
            RunConfig::from_lookup(|_| None).unwrap(),
            RunConfig::default()
        );
        let err = RunConfig::from_lookup(|v| (v == "XLA_VMM_GUARD").then(|| "maybe".to_string()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("XLA_VMM_GUARD=\"maybe\"") && err.contains("expected 0, 1"),
            "{err}"
        );
    }

    #[test]
    fn explicit_settings_win_and_unknown_keys_are_errors() {
        let mut cfg = RunConfig::from_lookup(|v| {
            (v == "XLA_VMM_TMP_COPY_THRESHOLD").then(|| "0".to_string())
        })
        .unwrap();
        cfg.set("xla_vmm_tmp_copy_threshold", "65536").unwrap();
        assert_eq!(cfg.binding.threshold, Threshold::Bytes(65536));
        assert!(cfg.set("exec_mod", "eager").is_err());
        assert!(cfg.set("reservations", "3").is_err());
        assert!(cfg.set("staging_reserve", "95").is_err());
        assert!(RunConfig::knows("guard") && !RunConfig::knows("guards"));
    }
}

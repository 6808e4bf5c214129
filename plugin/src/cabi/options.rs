//! `PJRT_Client_Create` options (`jax_pjrt_client_create_options`).
//!
//! | option | type | meaning |
//! |---|---|---|
//! | `backend` | string | `cuda` (default) or `host` (CI / tests) |
//! | `strict` | bool/int | a program our runtime rejects is an error, not a fallback to the vendor runtime |
//! | the run options of `xla_vmm_runtime::OPTIONS` | string/int | `exec_mode`, `guard`, `xla_vmm_tmp_copy_threshold`, `copy_path`, `reservations`, `probe`, `step_timing` (each with its `XLA_VMM_*` variable as fallback) |
//! | `vendor_plugin_path` | string | the vendor XLA GPU plugin used as the compiler |
//! | `host_devices` | int | host backend: number of emulated devices (default 1) |
//! | `max_devices` | int | use at most this many local devices (default: all visible) |
//! | `node_id` / `num_nodes` | int | this process and the number of processes (`jax.distributed`) |
//! | `sync_execute` | bool | wait for every execution before returning (debugging, A/B) |
//!
//! Environment defaults: `XLA_VMM_BACKEND`, `XLA_VMM_STRICT`,
//! `XLA_VMM_VENDOR_PLUGIN`, `XLA_VMM_HOST_DEVICES`, `XLA_VMM_MAX_DEVICES`,
//! `XLA_VMM_SYNC_EXECUTE`, and the run options' variables
//! (`XLA_VMM_EXEC_MODE`, ...). Environment only: `XLA_VMM_COMPLETION_POLL`
//! (`backoff`: the completion thread's earlier fixed backoff, for A/B) and
//! `XLA_VMM_TOPOLOGY_TIMEOUT_S`; and before any client, at plugin
//! initialization ([`ProcessOptions`]): `XLA_VMM_LOG`, `NO_COLOR`,
//! `XLA_VMM_CRASH_REPORT`. This module is the plugin's only reader of the
//! environment (the vendor plugin's search, `vendor_locate`, gets a
//! [`SearchEnv`] read here). `node_id` / `num_nodes`
//! come from `jax.distributed` (with the key-value store through which the
//! processes exchange their device counts; `XLA_VMM_TOPOLOGY_TIMEOUT_S`,
//! default 300, bounds the wait for the other processes). Options JAX passes
//! to GPU plugins that do not apply to us are accepted and logged; any other
//! unknown option is an error (a typo must not be silently ignored). How
//! programs run is parsed here once and travels to every program as one
//! [`RunConfig`].

use crate::cabi::caller::Value;
use crate::cabi::error::{Error, Result};
use xla_vmm_runtime::RunConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cuda,
    /// ROCm (feature `hip`).
    Hip,
    Host,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClientOptions {
    pub backend: BackendKind,
    pub strict: bool,
    /// How programs run (mode, guard, binding: `xla_vmm_runtime::OPTIONS`).
    pub run: RunConfig,
    pub vendor_plugin_path: Option<String>,
    /// Host backend: how many devices to emulate.
    pub host_devices: usize,
    /// Cap on the local devices used (`None`: every visible one).
    pub max_devices: Option<usize>,
    /// This process (`jax.distributed` process id) and the process count.
    pub node_id: usize,
    pub num_nodes: usize,
    /// How executions complete (synchronous mode, the completion thread).
    pub exec: ExecOptions,
    /// How long client creation waits for the other processes.
    pub topology_timeout: std::time::Duration,
    /// Where the vendor plugin is looked for.
    pub search_env: SearchEnv,
}

/// How a client's executions complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// Wait for every execution before returning (`sync_execute`,
    /// `XLA_VMM_SYNC_EXECUTE=1`).
    pub sync: bool,
    /// The completion thread polls with the earlier fixed 10-100 µs backoff
    /// instead of pacing by the step time (`XLA_VMM_COMPLETION_POLL=backoff`).
    pub plain_backoff: bool,
}

/// Settings of the process, read once when the plugin is initialized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessOptions {
    /// `XLA_VMM_LOG` (a tracing filter), default `warn`.
    pub log_filter: String,
    /// Colour in the log: stderr is a terminal and `NO_COLOR` is unset.
    pub color: bool,
    /// `XLA_VMM_CRASH_REPORT` set to anything but empty or `0`.
    pub crash_report: bool,
}

impl ProcessOptions {
    pub fn from_env() -> Self {
        ProcessOptions {
            log_filter: std::env::var("XLA_VMM_LOG").unwrap_or_else(|_| "warn".into()),
            color: std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            crash_report: std::env::var("XLA_VMM_CRASH_REPORT")
                .is_ok_and(|v| !v.is_empty() && v != "0"),
        }
    }
}

/// What the search for the vendor XLA GPU plugin reads of the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchEnv {
    pub pythonpath: Option<String>,
    pub virtual_env: Option<String>,
    pub path: Option<std::ffi::OsString>,
    pub home: Option<String>,
}

impl SearchEnv {
    pub fn from_env() -> Self {
        SearchEnv {
            pythonpath: std::env::var("PYTHONPATH").ok(),
            virtual_env: std::env::var("VIRTUAL_ENV").ok(),
            path: std::env::var_os("PATH"),
            home: std::env::var("HOME").ok(),
        }
    }
}

/// Options of the vendor GPU plugin that JAX may pass along; accepted, unused.
const IGNORED: &[&str] = &[
    "platform_name",
    "visible_devices",
    "preallocate",
    "memory_fraction",
    "allocator",
    "collective_memory_size",
    "enable_mock_nccl",
    "mock_gpu_topology",
    "should_stage_host_to_device_transfers",
];

fn env_bool(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

impl ClientOptions {
    /// Defaults from the environment (and the process settings of the
    /// layers below, `xla_vmm_ffi::settings`, installed from it).
    pub fn from_env() -> Result<Self> {
        use xla_vmm_ffi::settings::{install, Settings};
        install(Settings::from_lookup(|k| std::env::var_os(k)));
        let backend = match std::env::var("XLA_VMM_BACKEND") {
            Ok(v) => parse_backend(&v)?,
            Err(_) => BackendKind::Cuda,
        };
        let mut run = RunConfig::from_lookup(|v| std::env::var(v).ok())
            .map_err(|e| Error::invalid(e.to_string()))?;
        // Every program of a device runs on the device's one stream.
        run.one_stream = true;
        Ok(ClientOptions {
            backend,
            strict: std::env::var("XLA_VMM_STRICT")
                .map(|v| env_bool(&v))
                .unwrap_or(false),
            run,
            vendor_plugin_path: std::env::var("XLA_VMM_VENDOR_PLUGIN").ok(),
            host_devices: host_devices(
                "XLA_VMM_HOST_DEVICES",
                env_count("XLA_VMM_HOST_DEVICES")?.unwrap_or(1),
            )?,
            max_devices: env_count("XLA_VMM_MAX_DEVICES")?,
            node_id: 0,
            num_nodes: 1,
            exec: ExecOptions {
                sync: std::env::var("XLA_VMM_SYNC_EXECUTE").is_ok_and(|v| env_bool(&v)),
                plain_backoff: std::env::var("XLA_VMM_COMPLETION_POLL").as_deref() == Ok("backoff"),
            },
            topology_timeout: std::time::Duration::from_secs(
                std::env::var("XLA_VMM_TOPOLOGY_TIMEOUT_S")
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(300),
            ),
            search_env: SearchEnv::from_env(),
        })
    }

    /// Environment defaults overridden by the caller's options.
    pub fn parse(items: &[(String, Value)]) -> Result<Self> {
        let mut o = Self::from_env()?;
        for (name, value) in items {
            match (name.as_str(), value) {
                ("backend", Value::Str(s)) => o.backend = parse_backend(s)?,
                ("strict", Value::Bool(b)) => o.strict = *b,
                ("strict", Value::Int(i)) => o.strict = *i != 0,
                ("strict", Value::Str(s)) => o.strict = env_bool(s),
                // jax passes `jax_pjrt_client_create_options` values as strings.
                (n, v) if RunConfig::knows(n) => {
                    let text = match v {
                        Value::Str(s) => s.clone(),
                        Value::Int(i) => i.to_string(),
                        Value::Bool(b) => u8::from(*b).to_string(),
                        other => {
                            return Err(Error::invalid(format!(
                                "client option {n} = {other:?}: expected a string or a number"
                            )))
                        }
                    };
                    o.run
                        .set(n, &text)
                        .map_err(|e| Error::invalid(format!("client option {e}")))?
                }
                ("vendor_plugin_path", Value::Str(s)) => o.vendor_plugin_path = Some(s.clone()),
                ("host_devices", v) => o.host_devices = host_devices(name, count(name, v)?)?,
                ("max_devices", v) => o.max_devices = Some(count(name, v)?),
                ("node_id", v) => o.node_id = int(name, v)?,
                ("sync_execute", Value::Bool(b)) => o.exec.sync = *b,
                ("sync_execute", Value::Int(i)) => o.exec.sync = *i != 0,
                ("sync_execute", Value::Str(s)) => o.exec.sync = env_bool(s),
                ("num_nodes", v) => o.num_nodes = int(name, v)?,
                (n, _) if IGNORED.contains(&n) => {
                    tracing::debug!("client option {n} ignored by xla-vmm")
                }
                (n, v) => {
                    return Err(Error::invalid(format!(
                        "unknown or mistyped client option {n} = {v:?} (known: backend, strict, \
                         vendor_plugin_path, host_devices, max_devices, node_id, num_nodes, \
                         sync_execute, {})",
                        xla_vmm_runtime::OPTIONS
                            .iter()
                            .map(|s| s.key)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )))
                }
            }
        }
        if o.num_nodes == 0 || o.node_id >= o.num_nodes {
            return Err(Error::invalid(format!(
                "node_id {} with num_nodes {}: need 0 <= node_id < num_nodes",
                o.node_id, o.num_nodes
            )));
        }
        Ok(o)
    }
}

/// A non-negative integer option (int, or a string holding one).
fn int(name: &str, v: &Value) -> Result<usize> {
    let n = match v {
        Value::Int(i) => usize::try_from(*i).ok(),
        Value::Str(s) => s.trim().parse::<usize>().ok(),
        _ => None,
    };
    n.ok_or_else(|| {
        Error::invalid(format!(
            "client option {name} = {v:?}: expected an integer >= 0"
        ))
    })
}

/// Most devices the host backend emulates (each is a thread, a stream and
/// an allocator: far more is a mistake, answered at once).
pub const MAX_HOST_DEVICES: usize = 256;

fn host_devices(name: &str, n: usize) -> Result<usize> {
    if n > MAX_HOST_DEVICES {
        return Err(Error::invalid(format!(
            "{name} = {n}: the host backend emulates at most {MAX_HOST_DEVICES} devices"
        )));
    }
    Ok(n)
}

/// A positive count option.
fn count(name: &str, v: &Value) -> Result<usize> {
    match int(name, v)? {
        0 => Err(Error::invalid(format!(
            "client option {name} = 0: expected at least 1"
        ))),
        n => Ok(n),
    }
}

/// A positive count from the environment variable `var`, if set.
fn env_count(var: &str) -> Result<Option<usize>> {
    match std::env::var(var) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(Error::invalid(format!(
                "{var}={v:?}: expected an integer >= 1"
            ))),
        },
        Err(_) => Ok(None),
    }
}

fn parse_backend(s: &str) -> Result<BackendKind> {
    match s.trim() {
        "cuda" | "gpu" => Ok(BackendKind::Cuda),
        "hip" | "rocm" => Ok(BackendKind::Hip),
        "host" => Ok(BackendKind::Host),
        other => Err(Error::invalid(format!(
            "backend {other:?}: expected \"cuda\", \"hip\" or \"host\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm_runtime::{Mode, Threshold};

    #[test]
    fn options_override_and_reject_typos() {
        let o = ClientOptions::parse(&[
            ("backend".into(), Value::Str("host".into())),
            ("strict".into(), Value::Bool(true)),
            ("xla_vmm_tmp_copy_threshold".into(), Value::Int(4096)),
            ("preallocate".into(), Value::Bool(false)),
        ])
        .unwrap();
        assert_eq!(o.backend, BackendKind::Host);
        assert!(o.strict);
        assert_eq!(o.run.binding.threshold, Threshold::Bytes(4096));
        let o = ClientOptions::parse(&[
            ("strict".into(), Value::Str("true".into())),
            ("xla_vmm_tmp_copy_threshold".into(), Value::Str("0".into())),
        ])
        .unwrap();
        assert!(o.strict);
        assert_eq!(o.run.binding.threshold, Threshold::RemapAll);
        let e = ClientOptions::parse(&[("stric".into(), Value::Bool(true))]).unwrap_err();
        assert!(e.message.contains("stric"), "{}", e.message);
        let e = ClientOptions::parse(&[("backend".into(), Value::Str("tpu".into()))]).unwrap_err();
        assert!(e.message.contains("tpu"));
        let o = ClientOptions::parse(&[("exec_mode".into(), Value::Str("graph-recapture".into()))])
            .unwrap();
        assert_eq!(o.run.mode, Mode::GraphRecapture);
        let o = ClientOptions::parse(&[("guard".into(), Value::Int(0))]).unwrap();
        assert!(!o.run.guard);
        let e =
            ClientOptions::parse(&[("exec_mode".into(), Value::Str("grpah".into()))]).unwrap_err();
        assert!(e.message.contains("grpah"), "{}", e.message);
        for name in ["hip", "rocm"] {
            let o = ClientOptions::parse(&[("backend".into(), Value::Str(name.into()))]).unwrap();
            assert_eq!(o.backend, BackendKind::Hip, "{name}");
        }
    }

    #[test]
    fn device_and_process_options() {
        let o = ClientOptions::parse(&[
            ("host_devices".into(), Value::Int(2)),
            ("max_devices".into(), Value::Str("4".into())),
            ("node_id".into(), Value::Int(1)),
            ("num_nodes".into(), Value::Int(2)),
        ])
        .unwrap();
        assert_eq!(
            (o.host_devices, o.max_devices, o.node_id, o.num_nodes),
            (2, Some(4), 1, 2)
        );
        let e = ClientOptions::parse(&[
            ("node_id".into(), Value::Int(2)),
            ("num_nodes".into(), Value::Int(2)),
        ])
        .unwrap_err();
        assert!(e.message.contains("node_id 2"), "{}", e.message);
        let e = ClientOptions::parse(&[("host_devices".into(), Value::Int(0))]).unwrap_err();
        assert!(e.message.contains("host_devices"), "{}", e.message);
        let e = ClientOptions::parse(&[("num_nodes".into(), Value::Int(-1))]).unwrap_err();
        assert!(e.message.contains("num_nodes"), "{}", e.message);
    }
}

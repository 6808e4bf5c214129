//! `PJRT_Client_Create` options (`jax_pjrt_client_create_options`).
//!
//! | option | type | meaning |
//! |---|---|---|
//! | `backend` | string | `cuda` (default) or `host` (CI / tests) |
//! | `strict` | bool/int | a program our runtime rejects is an error, not a fallback to the vendor runtime |
//! | `xla_vmm_tmp_copy_threshold` | int | 0 = remap every slot, 1 = auto (default), N = copy slots ≤ N bytes |
//! | `exec_mode` | string | `graph` (VA-stable, the default), `graph-recapture` or `eager` |
//! | `vendor_plugin_path` | string | the vendor XLA GPU plugin used as the compiler |
//! | `host_devices` | int | host backend: number of emulated devices (default 1) |
//! | `max_devices` | int | use at most this many local devices (default: all visible) |
//! | `node_id` / `num_nodes` | int | this process and the number of processes (`jax.distributed`) |
//!
//! Environment defaults: `XLA_VMM_BACKEND`, `XLA_VMM_STRICT`,
//! `XLA_VMM_TMP_COPY_THRESHOLD`, `XLA_VMM_EXEC_MODE`, `XLA_VMM_VENDOR_PLUGIN`,
//! `XLA_VMM_HOST_DEVICES`, `XLA_VMM_MAX_DEVICES`. `node_id` / `num_nodes`
//! come from `jax.distributed` (with the key-value store through which the
//! processes exchange their device counts; `XLA_VMM_TOPOLOGY_TIMEOUT_S`,
//! default 300, bounds the wait for the other processes). Options JAX passes
//! to GPU plugins that do not apply to us are accepted and logged; any other
//! unknown option is an error (a typo must not be silently ignored). How
//! programs run (mode and copy threshold) is parsed here once and travels to
//! every program as one [`RunOptions`].

use crate::cabi::Value;
use crate::error::{Error, Result};
use xla_vmm_runtime::{Mode, Threshold};

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
    pub tmp_copy_threshold: Threshold,
    /// How programs run (`exec_mode`, `XLA_VMM_EXEC_MODE`).
    pub exec_mode: Mode,
    pub vendor_plugin_path: Option<String>,
    /// Host backend: how many devices to emulate.
    pub host_devices: usize,
    /// Cap on the local devices used (`None`: every visible one).
    pub max_devices: Option<usize>,
    /// This process (`jax.distributed` process id) and the process count.
    pub node_id: usize,
    pub num_nodes: usize,
}

/// How the client's programs run: the execution mode and VA-stable's copy
/// threshold, from the client options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    pub mode: Mode,
    pub threshold: Threshold,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            mode: Mode::Graph,
            threshold: Threshold::Auto,
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
    /// Defaults from the environment.
    pub fn from_env() -> Result<Self> {
        let backend = match std::env::var("XLA_VMM_BACKEND") {
            Ok(v) => parse_backend(&v)?,
            Err(_) => BackendKind::Cuda,
        };
        let tmp_copy_threshold =
            Threshold::from_env().map_err(|e| Error::invalid(e.to_string()))?;
        let exec_mode = match std::env::var("XLA_VMM_EXEC_MODE") {
            Ok(v) => parse_mode("XLA_VMM_EXEC_MODE", &v)?,
            Err(_) => Mode::Graph,
        };
        Ok(ClientOptions {
            backend,
            strict: std::env::var("XLA_VMM_STRICT")
                .map(|v| env_bool(&v))
                .unwrap_or(false),
            tmp_copy_threshold,
            exec_mode,
            vendor_plugin_path: std::env::var("XLA_VMM_VENDOR_PLUGIN").ok(),
            host_devices: host_devices(
                "XLA_VMM_HOST_DEVICES",
                env_count("XLA_VMM_HOST_DEVICES")?.unwrap_or(1),
            )?,
            max_devices: env_count("XLA_VMM_MAX_DEVICES")?,
            node_id: 0,
            num_nodes: 1,
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
                ("xla_vmm_tmp_copy_threshold", Value::Int(i)) if *i >= 0 => {
                    o.tmp_copy_threshold = Threshold::from(*i as u64)
                }
                // jax passes `jax_pjrt_client_create_options` values as strings.
                ("xla_vmm_tmp_copy_threshold", Value::Str(s)) => {
                    o.tmp_copy_threshold = Threshold::parse(s)
                        .map_err(|e| Error::invalid(format!("xla_vmm_tmp_copy_threshold: {e}")))?
                }
                ("exec_mode", Value::Str(s)) => o.exec_mode = parse_mode(name, s)?,
                ("vendor_plugin_path", Value::Str(s)) => o.vendor_plugin_path = Some(s.clone()),
                ("host_devices", v) => o.host_devices = host_devices(name, count(name, v)?)?,
                ("max_devices", v) => o.max_devices = Some(count(name, v)?),
                ("node_id", v) => o.node_id = int(name, v)?,
                ("num_nodes", v) => o.num_nodes = int(name, v)?,
                (n, _) if IGNORED.contains(&n) => {
                    tracing::debug!("client option {n} ignored by xla-vmm")
                }
                (n, v) => {
                    return Err(Error::invalid(format!(
                        "unknown or mistyped client option {n} = {v:?} (known: backend, strict, \
                         xla_vmm_tmp_copy_threshold, exec_mode, vendor_plugin_path, host_devices, \
                         max_devices, node_id, num_nodes)"
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

    /// How the client's programs run.
    pub fn run_options(&self) -> RunOptions {
        RunOptions {
            mode: self.exec_mode,
            threshold: self.tmp_copy_threshold,
        }
    }
}

/// An execution mode as users name it ([`Mode::parse`]), for option or
/// variable `name`.
fn parse_mode(name: &str, v: &str) -> Result<Mode> {
    Mode::parse(v).map_err(|e| Error::invalid(format!("{name}: {e}")))
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
        assert_eq!(o.tmp_copy_threshold, Threshold::Bytes(4096));
        let o = ClientOptions::parse(&[
            ("strict".into(), Value::Str("true".into())),
            ("xla_vmm_tmp_copy_threshold".into(), Value::Str("0".into())),
        ])
        .unwrap();
        assert!(o.strict);
        assert_eq!(o.tmp_copy_threshold, Threshold::RemapAll);
        let e = ClientOptions::parse(&[("stric".into(), Value::Bool(true))]).unwrap_err();
        assert!(e.message.contains("stric"), "{}", e.message);
        let e = ClientOptions::parse(&[("backend".into(), Value::Str("tpu".into()))]).unwrap_err();
        assert!(e.message.contains("tpu"));
        let o = ClientOptions::parse(&[("exec_mode".into(), Value::Str("graph-recapture".into()))])
            .unwrap();
        assert_eq!(o.run_options().mode, Mode::GraphRecapture);
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

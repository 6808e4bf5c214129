//! # The process settings of the layers below the front doors
//!
//! Every environment variable the driver loaders and the device layer
//! honour, in one table ([`VARIABLES`]), read once into [`Settings`]. The
//! front doors (the plugin's client options, the `xla-vmm` command) read
//! the environment with their own reader and [`install`] the result before
//! anything below needs it; below, code asks [`get`]. A process without a
//! front door (a test binary, a benchmark) gets the environment read once,
//! here, at the first [`get`]. The run options (modes, binding, budget) are
//! not here: they travel in the runtime's `RunConfig`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// One variable of the table.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// What it sets.
    pub what: &'static str,
}

/// Every variable [`Settings`] is read from.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "LD_LIBRARY_PATH",
        what: "folders searched first for the vendor libraries loaded at run time",
    },
    Variable {
        name: "ROCM_PATH",
        what: "ROCm's prefix: its lib folder is searched for ROCm libraries",
    },
    Variable {
        name: "VIRTUAL_ENV",
        what: "a Python environment whose site-packages hold the nvidia-* wheels",
    },
    Variable {
        name: "CONDA_PREFIX",
        what: "a conda environment whose site-packages hold the nvidia-* wheels",
    },
    Variable {
        name: "HOME",
        what: "the user's site-packages (~/.local/lib)",
    },
    Variable {
        name: "XLA_VMM_HIP_LIBRARY",
        what: "the HIP runtime library, a path tried alone",
    },
    Variable {
        name: "XLA_VMM_HIPRTC_LIBRARY",
        what: "hiprtc (compiles the HIP backend's kernels), a path tried alone",
    },
    Variable {
        name: "XLA_VMM_HIPBLASLT_LIBRARY",
        what: "the hipBLASLt library, a path tried alone",
    },
    Variable {
        name: "XLA_VMM_NCCL_LIBRARY",
        what: "libnccl.so.2, a path tried alone",
    },
    Variable {
        name: "XLA_VMM_RCCL_LIBRARY",
        what: "librccl.so, a path tried alone",
    },
    Variable {
        name: "XLA_VMM_COMM_DESTROY_TIMEOUT_MS",
        what: "how long a communicator's teardown waits for its peers (default 10000; 0: no wait)",
    },
    Variable {
        name: "XLA_VMM_HOST_COLLECTIVE_TIMEOUT_MS",
        what: "host backend: how long an emulated collective waits for its peers",
    },
    Variable {
        name: "XLA_VMM_EMULATE_REMAP_MS",
        what: "CUDA backend, A/B only: milliseconds each remap lasts (ROCm's cost)",
    },
];

/// What the variables of [`VARIABLES`] say (unset or empty: `None` or
/// empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `LD_LIBRARY_PATH`'s folders.
    pub library_path: Vec<PathBuf>,
    /// `ROCM_PATH`.
    pub rocm_path: Option<PathBuf>,
    /// `VIRTUAL_ENV`, then `CONDA_PREFIX`.
    pub python_prefixes: Vec<PathBuf>,
    /// `HOME`.
    pub home: Option<PathBuf>,
    /// `XLA_VMM_HIP_LIBRARY`.
    pub hip_library: Option<PathBuf>,
    /// `XLA_VMM_HIPRTC_LIBRARY`.
    pub hiprtc_library: Option<PathBuf>,
    /// `XLA_VMM_HIPBLASLT_LIBRARY`.
    pub hipblaslt_library: Option<PathBuf>,
    /// `XLA_VMM_NCCL_LIBRARY`.
    pub nccl_library: Option<PathBuf>,
    /// `XLA_VMM_RCCL_LIBRARY`.
    pub rccl_library: Option<PathBuf>,
    /// `XLA_VMM_COMM_DESTROY_TIMEOUT_MS`, as given (checked where used).
    pub comm_destroy_timeout_ms: Option<String>,
    /// `XLA_VMM_HOST_COLLECTIVE_TIMEOUT_MS`, as given.
    pub host_collective_timeout_ms: Option<String>,
    /// `XLA_VMM_EMULATE_REMAP_MS`, as given.
    pub emulate_remap_ms: Option<String>,
}

impl Settings {
    /// Read with `lookup` (a front door's reader of the environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Self {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let path = |k: &str| get(k).map(PathBuf::from);
        let text = |k: &str| get(k).map(|v| v.to_string_lossy().trim().to_string());
        Settings {
            library_path: get("LD_LIBRARY_PATH")
                .map(|v| std::env::split_paths(&v).collect())
                .unwrap_or_default(),
            rocm_path: path("ROCM_PATH"),
            python_prefixes: ["VIRTUAL_ENV", "CONDA_PREFIX"]
                .into_iter()
                .filter_map(path)
                .collect(),
            home: path("HOME"),
            hip_library: path("XLA_VMM_HIP_LIBRARY"),
            hiprtc_library: path("XLA_VMM_HIPRTC_LIBRARY"),
            hipblaslt_library: path("XLA_VMM_HIPBLASLT_LIBRARY"),
            nccl_library: path("XLA_VMM_NCCL_LIBRARY"),
            rccl_library: path("XLA_VMM_RCCL_LIBRARY"),
            comm_destroy_timeout_ms: text("XLA_VMM_COMM_DESTROY_TIMEOUT_MS"),
            host_collective_timeout_ms: text("XLA_VMM_HOST_COLLECTIVE_TIMEOUT_MS"),
            emulate_remap_ms: text("XLA_VMM_EMULATE_REMAP_MS"),
        }
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Install the process's settings (a front door, before anything below
/// asks). False when settings were fixed already (installed, or read at a
/// first [`get`]) and differ: the first stay.
pub fn install(settings: Settings) -> bool {
    let first = SETTINGS.get_or_init(|| settings.clone());
    *first == settings
}

/// The process's settings: those installed, else the environment's, read
/// once.
pub fn get() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings::from_lookup(|k| std::env::var_os(k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_comes_from_a_variable_of_the_table_and_empty_is_unset() {
        let all = |v: &str| -> Option<OsString> {
            match v {
                "LD_LIBRARY_PATH" => Some("/a:/b".into()),
                "XLA_VMM_NCCL_LIBRARY" => Some("".into()),
                _ if VARIABLES.iter().any(|x| x.name == v) => Some(format!("/{v}").into()),
                _ => panic!("{v} is read but not in the table"),
            }
        };
        let s = Settings::from_lookup(all);
        assert_eq!(
            s.library_path,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(s.nccl_library, None);
        assert_eq!(s.python_prefixes.len(), 2);
        assert_eq!(s.hip_library, Some(PathBuf::from("/XLA_VMM_HIP_LIBRARY")));
        assert_eq!(
            s.emulate_remap_ms.as_deref(),
            Some("/XLA_VMM_EMULATE_REMAP_MS")
        );
        assert_eq!(Settings::from_lookup(|_| None), Settings::default());
    }

    #[test]
    fn the_first_settings_stay() {
        let first = get().clone();
        assert!(install(first.clone()));
        let mut other = first;
        other.home = Some("/elsewhere".into());
        assert!(!install(other));
        assert_ne!(
            get().home.as_deref(),
            Some(std::path::Path::new("/elsewhere"))
        );
    }
}

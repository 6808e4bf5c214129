//! Where the vendor XLA GPU plugin is: the client option
//! `vendor_plugin_path`, else `XLA_VMM_VENDOR_PLUGIN`, else the installed
//! `jax_plugins/xla_cuda13/xla_cuda_plugin.so` (or the CUDA 12 / ROCm
//! packages) in the Python library directories this process can see.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Plugin files, relative to a site-packages directory, in preference order.
pub const CANDIDATES: &[&str] = &[
    "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
    "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
    "jax_plugins/xla_rocm7/xla_rocm_plugin.so",
];

/// `dir/python3*/{site,dist}-packages` for every `python3*` entry of `dir`.
fn python_dirs(lib: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return;
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path())
        .collect();
    names.sort();
    names.reverse(); // newest python first
    for p in names {
        out.push(p.join("site-packages"));
        out.push(p.join("dist-packages"));
    }
}

/// Directories searched, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(pp) = std::env::var("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&pp));
    }
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        python_dirs(&Path::new(&venv).join("lib"), &mut dirs);
    }
    // The running python's prefix (jaxlib loads us into python: exe = PREFIX/bin/python3.x).
    if let Some(prefix) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().and_then(|b| b.parent()).map(Path::to_path_buf))
    {
        python_dirs(&prefix.join("lib"), &mut dirs);
    }
    if let Ok(home) = std::env::var("HOME") {
        python_dirs(&Path::new(&home).join(".local/lib"), &mut dirs);
    }
    python_dirs(Path::new("/usr/local/lib"), &mut dirs);
    python_dirs(Path::new("/usr/lib"), &mut dirs);
    dirs.dedup();
    dirs
}

/// The first candidate that exists under `dirs`.
pub fn find_in(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .flat_map(|d| CANDIDATES.iter().map(move |c| d.join(c)))
        .find(|p| p.is_file())
}

/// The vendor plugin path for a client (`explicit` = the client option).
pub fn locate(explicit: Option<&str>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return existing(p, "client option vendor_plugin_path");
    }
    if let Ok(p) = std::env::var("XLA_VMM_VENDOR_PLUGIN") {
        return existing(&p, "XLA_VMM_VENDOR_PLUGIN");
    }
    let dirs = search_dirs();
    find_in(&dirs).ok_or_else(|| {
        Error::not_found(format!(
            "no vendor XLA GPU plugin found (looked for {} under {} directories, e.g. {}); \
             install jax[cuda13] or set XLA_VMM_VENDOR_PLUGIN",
            CANDIDATES.join(", "),
            dirs.len(),
            dirs.first()
                .map(|d| d.display().to_string())
                .unwrap_or_default()
        ))
    })
}

fn existing(p: &str, from: &str) -> Result<PathBuf> {
    let path = PathBuf::from(p);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::not_found(format!("{from}: {p} is not a file")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cuda13_plugin_in_site_packages_first() {
        let root = std::env::temp_dir().join(format!("xla-vmm-locate-{}", std::process::id()));
        let lib = root.join("lib");
        for (py, cand) in [("python3.11", CANDIDATES[1]), ("python3.12", CANDIDATES[0])] {
            let f = lib.join(py).join("site-packages").join(cand);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, b"").unwrap();
        }
        let mut dirs = Vec::new();
        python_dirs(&lib, &mut dirs);
        let found = find_in(&dirs).unwrap();
        assert!(
            found.ends_with("python3.12/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so"),
            "{found:?}"
        );
        assert!(find_in(&[root.join("nowhere")]).is_none());
        let e = locate(Some("/nonexistent/plugin.so")).unwrap_err();
        assert!(e.message.contains("vendor_plugin_path"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! Where the vendor XLA GPU plugin is: the client option
//! `vendor_plugin_path` (the Python package `jax_plugins.xla_vmm` finds the
//! installed vendor package with importlib and passes it), else
//! `XLA_VMM_VENDOR_PLUGIN`, else a search for the installed
//! `jax_plugins/xla_cuda13/xla_cuda_plugin.so` (or the CUDA 12 / ROCm
//! packages) in the Python library directories of the process that loaded us
//! (the bare-library path, `PJRT_NAMES_AND_LIBRARY_PATHS`, has no Python
//! package to ask).
//!
//! Searched, in order: `PYTHONPATH`; every `site-packages` / `dist-packages`
//! directory a mapped file lives in (`/proc/self/maps`: jaxlib's own modules
//! are there, so this is the running interpreter's site-packages, venv or
//! not); `VIRTUAL_ENV`; the prefix of the interpreter as invoked
//! (`argv[0]`, not resolved: a venv's `bin/python3` is a symlink out of the
//! venv) and as resolved (`/proc/self/exe`); the prefix of a loaded
//! `libpython3*.so`; `~/.local`, `/usr/local`, `/usr`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::cabi::error::{Error, Result};
use crate::cabi::options::SearchEnv;

/// Plugin files, relative to a site-packages directory, in preference order.
pub const CANDIDATES: &[&str] = &[
    "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
    "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
    "jax_plugins/xla_rocm7/xla_rocm_plugin.so",
    "jax_plugins/xla_rocm6/xla_rocm_plugin.so",
];

/// `lib/python3*/{site,dist}-packages` for every `python3*` entry of `lib`
/// (newest python first).
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
    names.reverse();
    for p in names {
        out.push(p.join("site-packages"));
        out.push(p.join("dist-packages"));
    }
}

/// `PREFIX` of an interpreter at `PREFIX/bin/python3.x`.
fn exe_prefix(exe: &Path) -> Option<PathBuf> {
    exe.parent()?.parent().map(Path::to_path_buf)
}

/// Library directories named by `/proc/self/maps` text: each mapped file's
/// enclosing `site-packages` / `dist-packages` directory, and for a mapped
/// `PREFIX/lib/libpython3*.so*` the directory `PREFIX/lib`. The second list
/// holds `lib` directories to expand with [`python_dirs`].
fn dirs_from_maps(maps: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut site = Vec::new();
    let mut libs = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode pathname (the pathname may contain spaces)
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else {
            continue;
        };
        if !path.starts_with('/') {
            continue;
        }
        for marker in ["/site-packages/", "/dist-packages/"] {
            if let Some(i) = path.find(marker) {
                let d = PathBuf::from(&path[..i + marker.len() - 1]);
                if !site.contains(&d) {
                    site.push(d);
                }
            }
        }
        let p = Path::new(path);
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libpython3"))
        {
            if let Some(lib) = p.parent().map(Path::to_path_buf) {
                if !libs.contains(&lib) {
                    libs.push(lib);
                }
            }
        }
    }
    (site, libs)
}

/// The interpreter as invoked: `argv[0]` of `/proc/self/cmdline`, looked up
/// in `PATH` when it has no `/`. Not canonicalized (see the module docs).
fn invoked_exe(cmdline: &[u8], path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let argv0 = cmdline.split(|&b| b == 0).next()?;
    let argv0 = std::str::from_utf8(argv0).ok()?;
    if argv0.is_empty() {
        return None;
    }
    if argv0.contains('/') {
        let p = PathBuf::from(argv0);
        return Some(if p.is_absolute() {
            p
        } else {
            std::env::current_dir().ok()?.join(p)
        });
    }
    std::env::split_paths(path_var?)
        .map(|d| d.join(argv0))
        .find(|p| p.is_file())
}

/// Directories searched, in order, without duplicates (`env`: what the
/// front door read of the environment).
pub fn search_dirs(env: &SearchEnv) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(pp) = &env.pythonpath {
        dirs.extend(std::env::split_paths(pp));
    }
    let (site, libs) = std::fs::read_to_string("/proc/self/maps")
        .map(|m| dirs_from_maps(&m))
        .unwrap_or_default();
    dirs.extend(site);
    if let Some(venv) = &env.virtual_env {
        python_dirs(&Path::new(venv).join("lib"), &mut dirs);
    }
    let invoked = std::fs::read("/proc/self/cmdline")
        .ok()
        .and_then(|c| invoked_exe(&c, env.path.as_deref()));
    let resolved = std::env::current_exe().ok();
    for exe in invoked.iter().chain(resolved.iter()) {
        if let Some(prefix) = exe_prefix(exe) {
            python_dirs(&prefix.join("lib"), &mut dirs);
        }
    }
    for lib in &libs {
        python_dirs(lib, &mut dirs);
    }
    if let Some(home) = &env.home {
        python_dirs(&Path::new(home).join(".local/lib"), &mut dirs);
    }
    python_dirs(Path::new("/usr/local/lib"), &mut dirs);
    python_dirs(Path::new("/usr/lib"), &mut dirs);
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The first candidate that exists under `dirs`.
pub fn find_in(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .flat_map(|d| CANDIDATES.iter().map(move |c| d.join(c)))
        .find(|p| p.is_file())
}

/// The vendor plugin path for a client (`explicit` = the client option
/// `vendor_plugin_path`, or `XLA_VMM_VENDOR_PLUGIN`), else found under the
/// search directories of `env`.
pub fn locate(explicit: Option<&str>, env: &SearchEnv) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return existing(
            p,
            "vendor_plugin_path (client option or XLA_VMM_VENDOR_PLUGIN)",
        );
    }
    let dirs = search_dirs(env);
    find_in(&dirs).ok_or_else(|| not_found_message(&dirs))
}

fn not_found_message(dirs: &[PathBuf]) -> Error {
    const SHOWN: usize = 12;
    let mut listed: Vec<String> = dirs
        .iter()
        .filter(|d| d.is_dir())
        .map(|d| d.display().to_string())
        .collect();
    let existing = listed.len();
    if existing > SHOWN {
        listed.truncate(SHOWN);
        listed.push(format!("… {} more", existing - SHOWN));
    }
    Error::not_found(format!(
        "no vendor XLA GPU plugin found: looked for {} in {} directories ({} exist: {}). \
         Fix: install the vendor plugin into the python that runs jax \
         (`python -m pip install \"jax[cuda13]\"`), or point xla-vmm at it with \
         XLA_VMM_VENDOR_PLUGIN=/path/to/xla_cuda_plugin.so or the client option \
         vendor_plugin_path (jax_pjrt_client_create_options=\"vendor_plugin_path:/path/...\"); \
         the jax_plugins.xla_vmm package passes it automatically",
        CANDIDATES.join(", "),
        dirs.len(),
        existing,
        if listed.is_empty() {
            "none".to_string()
        } else {
            listed.join(", ")
        }
    ))
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

    fn temp_root(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("xla-vmm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        root
    }

    fn touch(f: &Path) {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"").unwrap();
    }

    #[test]
    fn finds_the_cuda13_plugin_in_site_packages_first() {
        let root = temp_root("locate");
        let lib = root.join("lib");
        for (py, cand) in [("python3.11", CANDIDATES[1]), ("python3.12", CANDIDATES[0])] {
            touch(&lib.join(py).join("site-packages").join(cand));
        }
        let mut dirs = Vec::new();
        python_dirs(&lib, &mut dirs);
        let found = find_in(&dirs).unwrap();
        assert!(
            found.ends_with("python3.12/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so"),
            "{found:?}"
        );
        assert!(find_in(&[root.join("nowhere")]).is_none());
        let e = locate(Some("/nonexistent/plugin.so"), &SearchEnv::default()).unwrap_err();
        assert!(e.message.contains("vendor_plugin_path"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn maps_name_the_interpreters_site_packages_and_libpython() {
        let maps = "\
7f00-7f01 r-xp 00000000 08:01 1 /opt/torch/.venv/lib/python3.12/site-packages/jaxlib/_jax.so
7f01-7f02 r--p 00000000 08:01 1 /opt/torch/.venv/lib/python3.12/site-packages/jaxlib/_jax.so
7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0
7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/python3/dist-packages/numpy/core/x.so
7f04-7f05 rw-p 00000000 00:00 0 [heap]
7f05-7f06 rw-p 00000000 00:00 0
7f06-7f07 r-xp 00000000 08:01 4 /home/a b/site-packages/m.so
";
        let (site, libs) = dirs_from_maps(maps);
        assert_eq!(
            site,
            [
                PathBuf::from("/opt/torch/.venv/lib/python3.12/site-packages"),
                PathBuf::from("/usr/lib/python3/dist-packages"),
                PathBuf::from("/home/a b/site-packages"),
            ]
        );
        assert_eq!(libs, [PathBuf::from("/usr/lib/x86_64-linux-gnu")]);
    }

    #[test]
    fn the_invoked_interpreter_is_not_resolved_through_symlinks() {
        // A venv: bin/python3 links to the system interpreter; the venv's
        // site-packages must come from the unresolved path.
        let root = temp_root("venv");
        let venv = root.join(".venv");
        touch(&root.join("usr/bin/python3.12"));
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::os::unix::fs::symlink(root.join("usr/bin/python3.12"), venv.join("bin/python3"))
            .unwrap();
        let plugin = venv
            .join("lib/python3.12/site-packages")
            .join(CANDIDATES[0]);
        touch(&plugin);

        let cmdline = format!("{}\0-c\0print(1)\0", venv.join("bin/python3").display());
        let exe = invoked_exe(cmdline.as_bytes(), None).unwrap();
        assert_eq!(exe, venv.join("bin/python3"));
        let mut dirs = Vec::new();
        python_dirs(&exe_prefix(&exe).unwrap().join("lib"), &mut dirs);
        assert_eq!(find_in(&dirs), Some(plugin));

        // A bare name is looked up in PATH.
        let path = std::env::join_paths([root.join("nowhere"), venv.join("bin")]).unwrap();
        assert_eq!(
            invoked_exe(b"python3\0x.py\0", Some(&path)),
            Some(venv.join("bin/python3"))
        );
        assert_eq!(invoked_exe(b"\0", Some(&path)), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_error_says_what_was_searched_and_how_to_fix_it() {
        let root = temp_root("notfound");
        std::fs::create_dir_all(root.join("site-packages")).unwrap();
        let e = not_found_message(&[root.join("site-packages"), root.join("absent")]);
        assert!(
            e.message.contains("in 2 directories (1 exist"),
            "{}",
            e.message
        );
        assert!(e
            .message
            .contains(&root.join("site-packages").display().to_string()));
        assert!(e.message.contains("XLA_VMM_VENDOR_PLUGIN"));
        assert!(e.message.contains("jax[cuda13]"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

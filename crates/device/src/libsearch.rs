//! Where the vendor libraries loaded at run time are looked for (cuBLASLt,
//! cuBLAS, cuDNN and cuFFT from the `nvidia-*` wheels; hipBLASLt and rocBLAS from
//! ROCm): the directories of `LD_LIBRARY_PATH` first, then the vendor's, each
//! with every name; existing files only, then the bare names for the system
//! loader.

use std::path::PathBuf;

use xla_vmm_ffi::settings::get as settings;

/// `names` in `dirs` (existing files), then the bare names.
fn search(names: &[&str], dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = settings().library_path.clone();
    all.extend(dirs);
    let mut out: Vec<PathBuf> = all
        .iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .filter(|p| p.is_file())
        .collect();
    out.extend(names.iter().map(PathBuf::from));
    out
}

/// Candidate paths of a CUDA library called one of `names`: in the Python
/// environments' `nvidia/cu13`, `nvidia/cublas`, `nvidia/cudnn` and
/// `nvidia/cufft` wheels.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn cuda(names: &[&str]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for sp in python_site_dirs() {
        dirs.push(sp.join("nvidia/cu13/lib"));
        dirs.push(sp.join("nvidia/cublas/lib"));
        dirs.push(sp.join("nvidia/cudnn/lib"));
        dirs.push(sp.join("nvidia/cufft/lib"));
    }
    search(names, dirs)
}

/// Candidate paths of a ROCm library called one of `names`: in
/// `$ROCM_PATH/lib`, then `/opt/rocm/lib`.
#[cfg_attr(not(feature = "hip"), allow(dead_code))]
pub(crate) fn rocm(names: &[&str]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(rocm) = &settings().rocm_path {
        dirs.push(rocm.join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    search(names, dirs)
}

/// What `python3` on PATH reports as its site-packages (covers virtualenvs
/// such as `/opt/<name>/.venv`); empty when there is no python3.
fn python_reported_site_dirs() -> Vec<PathBuf> {
    let script =
        "import site,sys; print(chr(10).join(site.getsitepackages()+[site.getusersitepackages()]))";
    match std::process::Command::new("python3")
        .args(["-c", script])
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| PathBuf::from(l.trim()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Python site-packages directories: the usual install locations, globbed
/// one level, plus the virtualenv's.
fn python_site_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = vec![
        PathBuf::from("/usr/local/lib"),
        PathBuf::from("/usr/lib"),
        PathBuf::from("/opt/conda/lib"),
    ];
    for (i, prefix) in settings().python_prefixes.iter().enumerate() {
        roots.insert(i, prefix.join("lib"));
    }
    if let Some(h) = &settings().home {
        roots.push(h.join(".local/lib"));
    }
    let mut out = python_reported_site_dirs();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        for py in pys.into_iter().rev() {
            out.push(py.join("site-packages"));
            out.push(py.join("dist-packages"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_end_with_the_bare_names_for_the_system_loader() {
        let names = ["libnothing-here.so.9", "libnothing-here.so"];
        for c in [cuda(&names), rocm(&names)] {
            assert_eq!(c, names.iter().map(PathBuf::from).collect::<Vec<_>>());
        }
    }
}

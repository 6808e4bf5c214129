//! Our PTX (the VA-stable copy kernels of `src/copykernel.rs`, at both table
//! sizes, and select_k's `src/selectk.ptx`) assembles for real NVIDIA targets. The driver JIT-compiles it on
//! the GPU, so a syntax or ISA error would otherwise show on a GPU only:
//! here `ptxas` (from pip's `nvidia-cuda-nvcc`, no GPU needed) assembles it
//! for Turing (the oldest target CUDA 13's ptxas knows; the 4 KiB table's
//! text declares sm_52, the 32 KiB one sm_70) and for Hopper, and the
//! kernels must keep their table in the parameter space.
//!
//! ptxas: `$XLA_VMM_PTXAS`, else `ptxas` on the PATH, else the one of
//! python3's `nvidia-cuda-nvcc` package. CI installs that package and sets
//! `XLA_VMM_REQUIRE_PTXAS=1`, so there a missing assembler fails the test.

mod tools;

use std::path::PathBuf;
use std::process::Command;

use xla_vmm_runtime::copykernel::{ptx, ROWS_LARGE, ROWS_SMALL};

/// ptxas candidates: `$XLA_VMM_PTXAS`, the PATH's, pip's CUDA 13 one.
fn ptxas_candidates() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::env::var("XLA_VMM_PTXAS")
        .ok()
        .map(PathBuf::from)
        .into_iter()
        .collect();
    found.push("ptxas".into());
    // python3 -c 'import nvidia, os; ...' finds pip's CUDA 13 layout.
    if let Ok(o) = Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))",
        ])
        .output()
    {
        if o.status.success() {
            found.push(String::from_utf8_lossy(&o.stdout).trim().into());
        }
    }
    found
}

#[test]
fn the_copy_kernels_assemble_for_nvidia_targets() {
    let Some(ptxas) = tools::find_or_skip(
        ptxas_candidates(),
        "XLA_VMM_REQUIRE_PTXAS",
        "ptxas to assemble the PTX kernels (pip install nvidia-cuda-nvcc, or set XLA_VMM_PTXAS)",
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("xla-vmm-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (rows, the target the text declares)
    for (rows, oldest) in [(ROWS_SMALL, "sm_52"), (ROWS_LARGE, "sm_70")] {
        let text = ptx(rows);
        assert!(
            text.contains(&format!(".target {oldest}")),
            "{rows} rows: target"
        );
        for entry in ["xla_vmm_copy_in", "xla_vmm_copy_out"] {
            assert!(
                text.contains(&format!(".entry {entry}(")),
                "{rows} rows: {entry}"
            );
        }
        // The rows are read from the kernel parameter, never from memory.
        assert!(
            text.contains("ld.param.u64"),
            "{rows} rows: no parameter loads"
        );
        assert!(
            !text.contains(".cv"),
            "{rows} rows: volatile (host memory) loads"
        );
        let src = dir.join(format!("copy_{rows}.ptx"));
        std::fs::write(&src, &text).unwrap();
        for arch in ["sm_75", "sm_90"] {
            tools::run_ok(
                Command::new(&ptxas)
                    .arg(format!("-arch={arch}"))
                    .arg("-o")
                    .arg(dir.join(format!("copy_{rows}_{arch}.cubin")))
                    .arg(&src),
                format_args!("ptxas -arch={arch} on the {rows}-row copy kernels"),
            );
        }
    }
    // select_k (src/selectk.ptx, clang's PTX of src/selectk.cu; its `.maxntid 1024` makes ptxas fit a
    // thread in 64 registers).
    let src = dir.join("selectk.ptx");
    std::fs::write(&src, xla_vmm_runtime::selectk::PTX).unwrap();
    for arch in ["sm_75", "sm_90"] {
        tools::run_ok(
            Command::new(&ptxas)
                .args([format!("-arch={arch}"), "-v".into(), "-o".into()])
                .arg(dir.join(format!("selectk_{arch}.cubin")))
                .arg(&src),
            format_args!("ptxas -arch={arch} on select_k"),
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

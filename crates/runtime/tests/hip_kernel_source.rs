//! Our HIP kernels (the copy kernel `src/copykernel.hip`, select_k
//! `src/selectk.cu` and the probe's `crates/device/src/probe_store.hip`,
//! all compiled by hiprtc on AMD GPUs)
//! compile for real AMD targets (and, for the HIP test shim on NVIDIA, for
//! NVPTX). No AMD GPU exists here, so this is the
//! check they get: clang's HIP front end (what hiprtc is), device code
//! only, without HIP headers or device libraries (the sources need
//! neither), for CDNA (MI100, MI200, MI300) and RDNA targets; the assembly
//! must hold the kernels, the copy kernels (one per direction) with their
//! 16-byte copies and the table read from the kernel arguments.
//!
//! clang: `$XLA_VMM_CLANG`, else `clang-19`.. `clang-15`, else `clang`. CI
//! installs clang-15 and sets `XLA_VMM_REQUIRE_CLANG=1`, so there a missing
//! compiler fails the test instead of skipping it.

mod tools;

use std::path::{Path, PathBuf};
use std::process::Command;

/// CDNA 1/2/3 (MI100, MI200, MI300) and RDNA 2/3.
const TARGETS: [&str; 5] = ["gfx908", "gfx90a", "gfx940", "gfx1030", "gfx1100"];

/// The clang to use, or `None` (saying so) to skip; under
/// `XLA_VMM_REQUIRE_CLANG=1` (CI) a missing clang fails instead.
fn clang_or_skip() -> Option<PathBuf> {
    tools::find_or_skip(
        tools::versioned("XLA_VMM_CLANG", "clang"),
        "XLA_VMM_REQUIRE_CLANG",
        "clang to compile the HIP kernels (install clang-15 or set XLA_VMM_CLANG)",
    )
}

/// Device-only assembly of `src` for `arch`.
fn compile(cc: &Path, src: &Path, arch: &str, defines: &[&str], out_dir: &Path) -> String {
    let stem = src.file_stem().unwrap().to_string_lossy();
    let asm = out_dir.join(format!("{stem}-{arch}.s"));
    tools::run_ok(
        Command::new(cc)
            .args([
                "-x",
                "hip",
                "--cuda-device-only",
                "-nogpulib",
                "-nogpuinc",
                "-O3",
                "-S",
            ])
            .arg(format!("--offload-arch={arch}"))
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg("-o")
            .arg(&asm)
            .arg(src),
        format_args!("{} on {} for {arch}", cc.display(), src.display()),
    );
    std::fs::read_to_string(&asm).unwrap()
}

#[test]
fn the_hip_kernels_compile_for_amd_targets() {
    let Some(cc) = clang_or_skip() else {
        return;
    };
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = std::env::temp_dir().join(format!("xla-vmm-hip-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let globl = |text: &str, name: &str| {
        text.contains(&format!(".globl\t{name}")) || text.contains(&format!(".globl {name}"))
    };
    for arch in TARGETS {
        let probe = compile(
            &cc,
            &here.join("../device/src/probe_store.hip"),
            arch,
            &[],
            &out_dir,
        );
        assert!(
            globl(&probe, "xla_vmm_probe_store") && probe.contains("global_store"),
            "{arch}: probe_store.hip has no store kernel"
        );

        // The table size copykernel.rs gives HIP (a 4 KiB parameter).
        let rows = format!("XLA_VMM_ROWS={}", xla_vmm_runtime::copykernel::ROWS_SMALL);
        let text = compile(
            &cc,
            &here.join("src/copykernel.hip"),
            arch,
            &[&rows],
            &out_dir,
        );
        for name in ["xla_vmm_copy_in", "xla_vmm_copy_out"] {
            assert!(globl(&text, name), "{arch}: no kernel symbol {name}");
        }
        assert!(
            text.contains("load_dwordx4") || text.contains("load_b128"),
            "{arch}: no 16-byte vector load in the copy loop"
        );
        // The rows come from the kernel arguments (scalar loads from the
        // kernarg segment), not from memory the host writes.
        assert!(
            text.contains("s_load_dwordx") || text.contains("s_load_b"),
            "{arch}: no scalar loads of the table"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.contains("global_load") && l.contains("sc0 sc1")),
            "{arch}: system-scope loads (a table in host memory?)"
        );

        // select_k (src/selectk.cu): one entry per element type, with the block's barriers.
        let text = compile(&cc, &here.join("src/selectk.cu"), arch, &[], &out_dir);
        for t in ["f32", "bf16", "u64"] {
            let name = format!("xla_vmm_select_k_{t}");
            assert!(globl(&text, &name), "{arch}: no kernel symbol {name}");
        }
        assert!(
            text.contains("s_barrier"),
            "{arch}: select_k without barriers"
        );
    }
    std::fs::remove_dir_all(&out_dir).ok();
}

/// The same sources through clang's CUDA front end for NVPTX (device code
/// only, clang's built-in variables header and nothing else): a stand-in
/// for NVRTC, which compiles them for the HIP test shim on NVIDIA
/// (`integration/hipshim`). Checks the non-AMDGPU branch of the copy kernel
/// parses and keeps its entry points.
#[test]
fn the_hip_kernels_compile_for_nvptx_too() {
    let Some(cc) = clang_or_skip() else {
        return;
    };
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = std::env::temp_dir().join(format!("xla-vmm-nvptx-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let rows = format!("-DXLA_VMM_ROWS={}", xla_vmm_runtime::copykernel::ROWS_SMALL);
    for (src, kernels) in [
        (
            here.join("../device/src/probe_store.hip"),
            &["xla_vmm_probe_store"][..],
        ),
        (
            here.join("src/copykernel.hip"),
            &["xla_vmm_copy_in", "xla_vmm_copy_out"][..],
        ),
    ] {
        let ptx = out_dir.join("k.ptx");
        tools::run_ok(
            Command::new(&cc)
                .args([
                    "-x",
                    "cuda",
                    "--cuda-device-only",
                    "-nocudainc",
                    "-nocudalib",
                    "--cuda-gpu-arch=sm_80",
                    "-include",
                    "__clang_cuda_builtin_vars.h",
                    "-O3",
                    "-S",
                ])
                .arg(&rows)
                .arg("-o")
                .arg(&ptx)
                .arg(&src),
            format_args!("{} on {} for sm_80", cc.display(), src.display()),
        );
        let text = std::fs::read_to_string(&ptx).unwrap();
        for k in kernels {
            assert!(
                text.contains(&format!(".entry {k}(")),
                "{}: no kernel {k}",
                src.display()
            );
        }
    }
    std::fs::remove_dir_all(&out_dir).ok();
}

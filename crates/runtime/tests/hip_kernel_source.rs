//! The HIP copy kernel (`src/copykernel.hip`, loaded through hiprtc on AMD
//! GPUs) compiles for real AMD targets. No AMD GPU exists here, so this is
//! the check it gets: clang's HIP front end (what hiprtc is), device code
//! only, without HIP headers or device libraries (the source needs
//! neither), for CDNA (MI100, MI200, MI300) and RDNA targets; the assembly
//! must hold the kernel with its 16-byte copies and system-scope table
//! loads.
//!
//! clang: `$XLA_VMM_CLANG`, else `clang-15`.. `clang-19`, else `clang`. CI
//! installs clang-15 and sets `XLA_VMM_REQUIRE_CLANG=1`, so there a missing
//! compiler fails the test instead of skipping it.

use std::path::PathBuf;
use std::process::Command;

fn clang() -> Option<PathBuf> {
    let mut names: Vec<String> = std::env::var("XLA_VMM_CLANG").ok().into_iter().collect();
    names.extend((15..=19).rev().map(|v| format!("clang-{v}")));
    names.push("clang".into());
    names.into_iter().map(PathBuf::from).find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_hip_copy_kernel_compiles_for_amd_targets() {
    let Some(cc) = clang() else {
        assert!(
            std::env::var("XLA_VMM_REQUIRE_CLANG").as_deref() != Ok("1"),
            "XLA_VMM_REQUIRE_CLANG=1 but no clang found (install clang-15 or set XLA_VMM_CLANG)"
        );
        eprintln!("SKIP: no clang to compile src/copykernel.hip (set XLA_VMM_CLANG)");
        return;
    };
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/copykernel.hip");
    let out_dir = std::env::temp_dir().join(format!("xla-vmm-hip-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    for arch in ["gfx908", "gfx90a", "gfx940", "gfx1030", "gfx1100"] {
        let asm = out_dir.join(format!("copykernel-{arch}.s"));
        let o = Command::new(&cc)
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
            .arg("-o")
            .arg(&asm)
            .arg(&src)
            .output()
            .expect("running clang");
        assert!(
            o.status.success(),
            "{} failed for {arch}:\n{}",
            cc.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let text = std::fs::read_to_string(&asm).unwrap();
        assert!(
            text.contains(".globl\txla_vmm_copy_table")
                || text.contains(".globl xla_vmm_copy_table"),
            "{arch}: no kernel symbol xla_vmm_copy_table"
        );
        assert!(
            text.contains("load_dwordx4") || text.contains("load_b128"),
            "{arch}: no 16-byte vector load in the copy loop"
        );
        assert!(text.contains("s_barrier"), "{arch}: no barrier");
        // The table is read with system-scope (uncached) loads: glc on
        // gfx9 / gfx10 / gfx11, sc0 sc1 on gfx940.
        assert!(
            text.lines().any(|l| l.contains("global_load")
                && (l.contains(" glc") || l.contains("sc0 sc1") || l.contains(" sc1"))),
            "{arch}: the table loads are not system scope"
        );
    }
    std::fs::remove_dir_all(&out_dir).ok();
}

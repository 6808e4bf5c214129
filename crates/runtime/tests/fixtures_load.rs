//! Every fixture (CUDA, and ROCm gfx942) decodes and passes the load check:
//! thunk support, and each kernel in a code image of its platform.

#[test]
fn all_fixtures_decode_and_are_supported() {
    let dir = xla_vmm::testdata::require_fixtures_dir();
    // With the kernels that take TMA descriptors (the llama programs' Triton
    // GEMMs, compiled on an H200).
    for (name, tma) in [
        ("small", 0),
        ("loop", 0),
        ("mlp_adam_donated", 0),
        ("llama_scan_bf16", 2),
        ("llama_sgd_f32", 8),
        ("fft_kinds", 0),
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.pjrt"))).unwrap();
        // Constants without content are filled from the HLO module by the decoder.
        let plan = xla_vmm::decode::decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Support, and every kernel in a cubin (a CUDA ELF defining it).
        let r = xla_vmm_runtime::ops::load_check(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.kernels > 0, "{name}: {r:?}");
        assert_eq!(r.tma_kernels, tma, "{name}: {r:?}");
        assert!(!plan.thunks.is_empty(), "{name}");
    }
}

fn rocm_plan(dir: &str, name: &str) -> xla_vmm::Plan {
    let p = xla_vmm::testdata::require_fixtures_dir()
        .join("rocm")
        .join(dir)
        .join(format!("{name}.pjrt"));
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    xla_vmm::decode::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const ROCM: [(&str, usize); 6] = [
    ("small", 3),
    ("loop", 3),
    ("mlp_adam_donated", 12),
    ("llama_scan_bf16", 140),
    ("llama_unrolled_f32", 134),
    ("llama_sgd_f32", 167),
];

/// The real gfx942 (MI300X) executables of `integration/fixtures/rocm`:
/// every one decodes; the Triton ones pass the load check with each kernel
/// found in its AMDGPU code object (function and `.kd` descriptor), and so
/// do the hipBLASLt ones (their GEMM thunks for the hipBLASLt engine).
#[test]
fn rocm_gfx942_executables_decode_and_load_check() {
    for (name, kernels) in ROCM {
        let plan = rocm_plan("gfx942", name);
        assert!(
            matches!(&plan.compute_capability, xla_vmm::ComputeCapability::Rocm { gcn_arch_name } if gcn_arch_name.starts_with("gfx942")),
            "{name}: {:?}",
            plan.compute_capability
        );
        let r = xla_vmm_runtime::ops::load_check(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.kernels, kernels, "{name}");
        // ROCm has no tensor maps; its compiles never take TMA descriptors.
        assert_eq!(r.tma_kernels, 0, "{name}");
    }
    // With Triton GEMMs off, the GEMMs are cublas_lt_matmul thunks, which
    // run through hipBLASLt on ROCm (`device::hip::blaslt`): they pass too.
    for name in ["small", "mlp_adam_donated", "llama_sgd_f32"] {
        let plan = rocm_plan("gfx942_hipblaslt", name);
        let mut gemms = 0;
        plan.walk(&mut |t, _| {
            gemms += matches!(t.kind, xla_vmm::ThunkKind::CublasLtMatmul(_)) as usize
        });
        assert!(gemms > 0, "{name}: no cublas_lt_matmul thunk");
        let r = xla_vmm_runtime::ops::load_check(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.kernels > 0, "{name}: {r:?}");
    }
}

/// A code object without the kernel's descriptor, and a cubin where a
/// code object belongs, are named at load.
#[test]
fn wrong_or_incomplete_code_images_are_named() {
    use xla_vmm::{KernelCode, ThunkKind};
    fn first_image(plan: &mut xla_vmm::Plan) -> &mut Vec<u8> {
        for t in &mut plan.thunks {
            if let ThunkKind::CustomKernel(k) = &mut t.kind {
                if let KernelCode::Cubin { data } = &mut k.spec.code {
                    return &mut data.0;
                }
            }
        }
        panic!("no custom kernel image");
    }
    let mut plan = rocm_plan("gfx942", "small");
    // Rename every `.kd` in the string tables: the descriptors are gone.
    let img = first_image(&mut plan);
    for i in 0..img.len().saturating_sub(3) {
        if &img[i..i + 4] == b".kd\0" {
            img[i + 1] = b'x';
        }
    }
    let e = xla_vmm_runtime::ops::load_check(&plan)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no kernel descriptor") && e.contains(".kd"),
        "{e}"
    );
    // A CUDA cubin in the ROCm program.
    let dir = xla_vmm::testdata::require_fixtures_dir();
    let mut cuda =
        xla_vmm::decode::decode(&std::fs::read(dir.join("small.pjrt")).unwrap()).unwrap();
    let cubin = first_image(&mut cuda).clone();
    let mut plan = rocm_plan("gfx942", "small");
    *first_image(&mut plan) = cubin;
    let e = xla_vmm_runtime::ops::load_check(&plan)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ELF machine 190"), "{e}");
}

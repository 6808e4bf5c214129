//! HIP backend on a real device. Every test is `#[ignore]`d (they need a
//! HIP device; that opening one without a device is an error, not a panic,
//! is the unit test in `src/hip/mod.rs`).
//!
//! No AMD GPU is available to this project: `integration/gpu_check.sh`
//! section `hip-shim` runs this binary on an NVIDIA GPU through the test
//! shim `integration/hipshim` (the HIP runtime forwarded to the CUDA driver,
//! hiprtc to NVRTC), which checks our HIP code, not AMD's runtime:
//! `XLA_VMM_HIP_LIBRARY=<shim dir>/libamdhip64.so
//! XLA_VMM_HIPRTC_LIBRARY=<shim dir>/libamdhip64.so <this binary>
//! --include-ignored --test-threads=1`. Both tests passed that way on an
//! H200 at 8520e27 (`integration/results/hip_shim_8520e27.md`).
#![cfg(feature = "hip")]

use std::sync::Arc;

use xla_vmm_device::backend::Backend;
use xla_vmm_device::conformance;
use xla_vmm_device::hip::HipBackend;

fn gpu() -> Arc<HipBackend> {
    // Which runtime the loader took, and the file it is (the shim, under gpu_check).
    eprintln!("HIP runtime: {:?}", xla_vmm_ffi::hip::runtime::load());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut files: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.find('/').map(|i| &l[i..]))
        .filter(|p| p.contains("libamdhip64"))
        .collect();
    files.dedup();
    eprintln!("mapped: {files:?}");
    Arc::new(HipBackend::new(0).expect("a HIP device (these tests are --ignored without one)"))
}

#[test]
#[ignore = "needs a HIP device"]
fn device_info_is_plausible() {
    let b = gpu();
    conformance::assert_plausible_info(&*b);
    assert_eq!(b.info().backend, "hip");
    assert!(!b.info().arch_name.is_empty());
}

#[test]
#[ignore = "needs a HIP device"]
fn conformance_suite() {
    conformance::assert_all_pass(&gpu());
}

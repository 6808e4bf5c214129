//! Every fixture decodes and passes the load-time support check.

use std::path::PathBuf;

fn fixtures() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures");
    d.join("small.pjrt").exists().then_some(d)
}

#[test]
fn all_fixtures_decode_and_are_supported() {
    let Some(dir) = fixtures() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs with ../shared/fixtures beside the clone: it is missing"
        );
        eprintln!("no ../shared/fixtures: skipped");
        return;
    };
    for name in [
        "small",
        "loop",
        "mlp_adam_donated",
        "llama_scan_bf16",
        "llama_sgd_f32",
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.pjrt"))).unwrap();
        // Constants without content are filled from the HLO module by the decoder.
        let plan = xla_vmm::decode::decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        xla_vmm_runtime::ops::check_support(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!plan.thunks.is_empty(), "{name}");
    }
}

//! Every fixture decodes and passes the load-time support check.

#[test]
fn all_fixtures_decode_and_are_supported() {
    let dir = xla_vmm::testdata::require_fixtures_dir();
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

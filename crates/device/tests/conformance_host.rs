//! The backend conformance suite on the host backend.

use std::sync::Arc;

use xla_vmm_device::conformance::run_all;
use xla_vmm_device::{HostBackend, HostConfig};

fn run(config: HostConfig) {
    let b = Arc::new(HostBackend::new(config).unwrap());
    let results = run_all(&b);
    assert!(results.len() >= 12);
    let failed: Vec<_> = results.iter().filter(|c| c.result.is_err()).collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}");
    assert_eq!(b.outstanding().total(), 0, "{:?}", b.outstanding());
}

#[test]
fn conformance_host_2mib_granularity() {
    run(HostConfig::default());
}

#[test]
fn conformance_host_64kib_granularity() {
    run(HostConfig {
        granularity: 64 << 10,
        capacity: 256 << 20,
        ..HostConfig::default()
    });
}

//! `xla-vmm probe`: runs the binary on the host backend (table and JSON) and
//! on the CUDA backend, which on a machine without a driver must fail
//! cleanly (an error message, no panic).

use std::process::{Command, Output};

fn probe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xla-vmm"))
        .arg("probe")
        .args(args)
        .output()
        .expect("spawn xla-vmm")
}

#[test]
fn host_backend_json_has_every_cost() {
    let out = probe(&["--backend", "host", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["backend"], "host");
    for key in [
        "remap_us",
        "copy_bw_bytes_per_s",
        "copy_launch_us",
        "eager_launch_us",
    ] {
        assert!(
            v[key].as_f64().is_some_and(|x| x > 0.0),
            "{key}: {}",
            v[key]
        );
    }
    assert!(v["free_bytes"].as_u64().is_some_and(|f| f > 0));
    assert!(v["total_bytes"].as_u64() >= v["free_bytes"].as_u64());
    let remap = v["remap"].as_array().expect("remap sizes");
    assert!(!remap.is_empty());
    assert_eq!(v["remap_us"], remap[0]["total_us"]);
}

#[test]
fn host_backend_table() {
    let out = probe(&["--backend", "host"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "remap (unmap + map + set-access)",
        "2 MiB",
        "D2D copy",
        "as one graph",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn cuda_backend_fails_cleanly_without_a_gpu() {
    let out = probe(&["--backend", "cuda", "--quick"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if !out.status.success() {
        assert!(stderr.contains("error:"), "{stderr}");
    }
}

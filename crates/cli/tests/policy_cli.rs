//! `xla-vmm policy`: runs the binary on the example inputs and on bad ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use xla_vmm_policy::{decide, Decision, PolicyInput};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/examples")
}

fn policy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xla-vmm"))
        .arg("policy")
        .args(args)
        .output()
        .expect("spawn xla-vmm")
}

/// Writes `text` to a fresh file under the target's temp dir.
fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn json_plan(path: &Path) -> serde_json::Value {
    let out = policy(&["--input", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints JSON")
}

fn read_input(path: &Path) -> PolicyInput {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn json_output_has_the_documented_keys_and_matches_the_library() {
    for name in ["small.json", "llama_h200.json"] {
        let path = examples().join(name);
        let v = json_plan(&path);
        let input = read_input(&path);
        let plan = decide(&input).unwrap();
        for key in [
            "threshold_bytes",
            "decisions",
            "shadow_bytes",
            "copy_us_per_step",
            "remap_us_per_step",
        ] {
            assert!(v.get(key).is_some(), "{name}: missing key {key}");
        }
        let decisions: Vec<&str> = v["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(decisions.len(), input.slots.len(), "{name}");
        for (i, (d, s)) in decisions.iter().zip(&input.slots).enumerate() {
            assert!(
                ["skip", "remap", "copy"].contains(d),
                "{name} slot {i}: {d}"
            );
            if s.churn == 0.0 {
                assert_eq!(*d, "skip", "{name} slot {i}: churn 0 must be skipped");
            }
        }
        let want: Vec<&str> = plan
            .decisions
            .iter()
            .map(|d| match d {
                Decision::Skip => "skip",
                Decision::Remap => "remap",
                Decision::Copy => "copy",
            })
            .collect();
        assert_eq!(decisions, want, "{name}");
        assert_eq!(
            v["threshold_bytes"].as_u64(),
            Some(plan.threshold_bytes),
            "{name}"
        );
        assert_eq!(
            v["shadow_bytes"].as_u64(),
            Some(plan.shadow_bytes),
            "{name}"
        );
        assert!(
            v["shadow_bytes"].as_u64().unwrap() <= v["shadow_cap_bytes"].as_u64().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn small_example_follows_threshold_n() {
    let path = examples().join("small.json");
    let input = read_input(&path);
    let n = input.threshold.raw();
    assert!(n > 1, "small.json uses an explicit threshold");
    let v = json_plan(&path);
    assert_eq!(v["threshold_bytes"].as_u64(), Some(n));
    for (i, (d, s)) in v["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&input.slots)
        .enumerate()
    {
        let want = if s.churn == 0.0 {
            "skip"
        } else if s.size <= n {
            "copy"
        } else {
            "remap"
        };
        assert_eq!(d.as_str(), Some(want), "slot {i}");
    }
}

#[test]
fn every_threshold_runs_on_the_llama_example() {
    let text = std::fs::read_to_string(examples().join("llama_h200.json")).unwrap();
    let mut copies = Vec::new();
    for t in [0u64, 1, 4096, 65536, 1 << 20] {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["threshold"] = t.into();
        let path = temp_file(&format!("llama_{t}.json"), &v.to_string());
        let plan = json_plan(&path);
        let n_copy = plan["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d.as_str() == Some("copy"))
            .count();
        if t == 0 {
            assert_eq!(n_copy, 0);
            assert_eq!(plan["copy_us_per_step"].as_f64(), Some(0.0));
        }
        copies.push(n_copy);
    }
    // Larger fixed cutoffs copy at least as many slots.
    assert!(
        copies[2] <= copies[3] && copies[3] <= copies[4],
        "{copies:?}"
    );
}

#[test]
fn table_output_lists_every_slot() {
    let path = examples().join("small.json");
    let out = policy(&["--input", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("decision"), "{text}");
    let rows = text.lines().filter(|l| {
        l.trim_end().ends_with(" copy") || l.ends_with(" remap") || l.ends_with(" skip")
    });
    assert_eq!(rows.count(), read_input(&path).slots.len(), "{text}");
}

fn assert_fails(path: &Path, needle: &str) {
    let out = policy(&["--input", path.to_str().unwrap(), "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{} should fail", path.display());
    assert!(out.stdout.is_empty(), "no plan on failure");
    assert!(err.contains("error"), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_inputs_fail_cleanly() {
    let dev = r#""device": {"remap_us": 46.0, "copy_bw_bytes_per_s": 2.4e12, "copy_launch_us": 4.0, "free_bytes": 100, "total_bytes": 200}"#;
    let cases = [
        ("not_json.json", "{ this is not json".to_owned(), "parsing"),
        ("churn.json", format!(r#"{{{dev}, "threshold": 1, "slots": [{{"size": 4, "read": true, "written": true, "churn": 1.5}}]}}"#), "churn"),
        ("typo.json", format!(r#"{{{dev}, "threshold": 1, "slots": [{{"size": 4, "read": true, "writen": true, "churn": 1}}]}}"#), "writen"),
        ("negative.json", format!(r#"{{{dev}, "threshold": -3, "slots": []}}"#), "parsing"),
        ("no_slots.json", format!(r#"{{{dev}, "threshold": 1}}"#), "slots"),
        (
            "huge_slot.json",
            format!(r#"{{{dev}, "threshold": 1, "slots": [{{"size": 18446744073709551615, "read": true, "written": true, "churn": 1}}]}}"#),
            "exceeds the device's total memory",
        ),
        (
            "free.json",
            r#"{"device": {"remap_us": 46.0, "copy_bw_bytes_per_s": 2.4e12, "copy_launch_us": 4.0, "free_bytes": 300, "total_bytes": 200}, "slots": []}"#.to_owned(),
            "free_bytes",
        ),
        (
            "bw.json",
            r#"{"device": {"remap_us": 46.0, "copy_bw_bytes_per_s": 0, "copy_launch_us": 4.0, "free_bytes": 1, "total_bytes": 2}, "slots": []}"#.to_owned(),
            "copy_bw_bytes_per_s",
        ),
    ];
    for (name, text, needle) in cases {
        assert_fails(&temp_file(name, &text), needle);
    }
    assert_fails(Path::new("/nonexistent/policy.json"), "reading");
}

#[test]
fn copy_only_slots_are_accepted_and_copied_under_threshold_zero() {
    let text = r#"{"device": {"remap_us": 46, "copy_bw_bytes_per_s": 2.4e12,
        "copy_launch_us": 4, "free_bytes": 107374182400, "total_bytes": 151397597184},
        "threshold": 0,
        "slots": [{"size": 4, "read": true, "written": true, "churn": 1},
                  {"size": 64, "read": true, "written": true, "churn": 0, "remappable": false}]}"#;
    let path = temp_file("copy_only.json", text);
    let v = json_plan(&path);
    let decisions: Vec<&str> = v["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(decisions, vec!["remap", "copy"]);
    assert_eq!(v["counts"]["copy_only"], 1);
    let out = policy(&["--input", path.to_str().unwrap()]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("copy (copy-only)"), "{table}");
}

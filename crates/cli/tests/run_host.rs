//! `xla-vmm run --backend host` (no GPU): inputs are read and checked
//! against the program's parameters before any device opens, and a real
//! executable then stops at load naming the thunk the host backend cannot
//! run. The fixtures' own inputs always pass the check.

use std::path::PathBuf;
use std::process::{Command, Output};

use xla_vmm_runtime::npz::{read_npz, write_npz, NpyArray};

fn fixtures() -> PathBuf {
    xla_vmm::testdata::require_fixtures_dir()
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xla-vmm"))
        .arg("run")
        .args(args)
        .args(["--backend", "host"])
        .output()
        .expect("spawn xla-vmm")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn pjrt(name: &str) -> String {
    fixtures()
        .join(format!("{name}.pjrt"))
        .display()
        .to_string()
}

/// `small`'s inputs, with `f` applied, written to a fresh file.
fn small_inputs_with(tag: &str, f: impl Fn(&mut Vec<(String, NpyArray)>)) -> PathBuf {
    let mut arrays = read_npz(&fixtures().join("small.npz")).unwrap();
    f(&mut arrays);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("run_host");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{tag}.npz"));
    write_npz(&path, &arrays).unwrap();
    path
}

#[test]
fn fixture_inputs_pass_and_the_load_names_what_the_host_cannot_run() {
    for name in ["small", "loop", "mlp_adam_donated"] {
        let npz = fixtures().join(format!("{name}.npz"));
        let o = run(&[&pjrt(name), "--inputs", npz.to_str().unwrap()]);
        let e = stderr(&o);
        assert!(!o.status.success(), "{name}: {e}");
        assert!(
            e.contains("custom_kernel thunk") && e.contains("runs no GPU code"),
            "{name}: {e}"
        );
    }
}

#[test]
fn bad_inputs_are_named_before_a_device_opens() {
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        (
            "wrong program's inputs",
            fixtures().join("loop.npz"),
            "in_0 does not fit parameter 0: shape [1024] where the parameter is [256, 256]",
        ),
        (
            "same size, other dtype",
            small_inputs_with("int", |a| a[0].1.descr = "<i4".into()),
            "in_0 does not fit parameter 0: dtype <i4 where the parameter is <f4",
        ),
        (
            "big-endian",
            small_inputs_with("be", |a| a[0].1.descr = ">f4".into()),
            "big-endian >f4",
        ),
        (
            "transposed shape, same bytes",
            small_inputs_with("shape", |a| a[0].1.shape = vec![128, 512]),
            "shape [128, 512] where the parameter is [256, 256]",
        ),
        (
            "a missing input",
            small_inputs_with("missing", |a| a.retain(|(n, _)| n != "in_1")),
            "has no in_1 (parameter 1)",
        ),
        (
            "an extra input",
            small_inputs_with("extra", |a| {
                let x = a[0].1.clone();
                a.push(("in_2".into(), x));
            }),
            "has 1 more in_* arrays than the 2 parameters",
        ),
    ];
    for (what, npz, want) in cases {
        let o = run(&[&pjrt("small"), "--inputs", npz.to_str().unwrap()]);
        let e = stderr(&o);
        assert!(!o.status.success(), "{what}: {e}");
        assert!(e.contains(want), "{what}: {e}");
        assert!(
            !e.contains("custom_kernel"),
            "{what}: checked before the load: {e}"
        );
    }
}

#[test]
fn an_absurd_device_count_is_answered_at_once() {
    let npz = fixtures().join("small.npz");
    let t = std::time::Instant::now();
    let o = run(&[
        &pjrt("small"),
        "--inputs",
        npz.to_str().unwrap(),
        "--devices",
        "1000000",
    ]);
    assert!(
        stderr(&o).contains("--devices 1000000: expected 1 to 1024"),
        "{}",
        stderr(&o)
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
}

#[test]
fn several_devices_need_the_cuda_backend() {
    let npz = fixtures().join("small.npz");
    let o = run(&[
        &pjrt("small"),
        "--inputs",
        npz.to_str().unwrap(),
        "--devices",
        "2",
    ]);
    assert!(
        stderr(&o).contains("--devices 2 needs --backend cuda"),
        "{}",
        stderr(&o)
    );
}

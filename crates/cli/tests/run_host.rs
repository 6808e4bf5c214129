//! `xla-vmm run --backend host` (no GPU): inputs are read and checked
//! against the program's parameters before any device opens, and a real
//! executable then stops at load: "inputs OK; this program needs a GPU
//! (the thunk the host backend cannot run)", exit status 3. Bad inputs are
//! errors (exit status 1). The fixtures' own inputs always pass the check.

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

/// `xla-vmm run`'s exit status when the inputs are fine and the program
/// needs a GPU (README's command table).
const EXIT_NEEDS_GPU: i32 = 3;

#[test]
fn fixture_inputs_pass_and_the_program_is_named_as_needing_a_gpu() {
    // The first GPU thunk of each fixture (loop's is in its while loop).
    for (name, first) in [
        ("small", "custom_kernel thunk 'gemm_fusion_dot'"),
        (
            "loop",
            "while thunk 'while.1': custom_kernel thunk 'loop_compare_fusion'",
        ),
        (
            "mlp_adam_donated",
            "custom_kernel thunk 'loop_select_fusion'",
        ),
    ] {
        let npz = fixtures().join(format!("{name}.npz"));
        // The default mode (graph) and eager stop at the same place: at load.
        for mode in [None, Some("eager")] {
            let mut args = vec![pjrt(name), "--inputs".into(), npz.display().to_string()];
            if let Some(m) = mode {
                args.extend(["--mode".into(), m.to_string()]);
            }
            let o = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
            let e = stderr(&o);
            assert_eq!(
                o.status.code(),
                Some(EXIT_NEEDS_GPU),
                "{name} {mode:?}: {e}"
            );
            let want = format!(
                "inputs OK; this program needs a GPU ({first}: unsupported: the host backend runs \
                 no GPU code, and this module is a GPU code object (ELF))"
            );
            assert_eq!(
                e.trim_end().lines().last(),
                Some(want.as_str()),
                "{name}: {e}"
            );
            assert!(!e.contains("invalid executable"), "{name}: {e}");
            assert!(!e.contains("error:"), "{name}: {e}");
        }
    }
}

#[test]
fn a_program_that_is_not_an_executable_is_still_an_error() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("run_host");
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.pjrt");
    std::fs::write(&junk, b"not a serialized executable").unwrap();
    let npz = fixtures().join("small.npz");
    let o = run(&[junk.to_str().unwrap(), "--inputs", npz.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("needs a GPU"), "{}", stderr(&o));
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
        assert_eq!(o.status.code(), Some(1), "{what}: {e}");
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

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let npz = fixtures().join("small.npz");
    let o = Command::new(env!("CARGO_BIN_EXE_xla-vmm"))
        .args(["run", &pjrt("small"), "--inputs", npz.to_str().unwrap()])
        .args(["--backend", "host"])
        .env("XLA_VMM_LOG", "debug")
        .env_remove("NO_COLOR")
        .output()
        .expect("spawn xla-vmm");
    let e = stderr(&o);
    assert!(e.contains(" DEBUG xla_vmm"), "debug logs expected: {e}");
    assert!(!e.contains('\u{1b}'), "an escape code on a pipe: {e:?}");
}

//! `XLA_VMM_CRASH_REPORT=1`: a fatal signal prints the native stack, then the
//! handler that was there before still runs (here: the default, death by
//! the signal). Run in a child process: the child dies.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const CHILD_ENV: &str = "XLA_VMM_CRASH_REPORT_CHILD";

#[inline(never)]
fn fault() {
    // SAFETY: none; this reads address 8 (dangling for u64) on purpose to raise SIGSEGV.
    let v = unsafe { std::ptr::read_volatile(std::ptr::dangling::<u64>()) };
    println!("read {v}");
}

#[test]
fn child() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let wanted = xla_vmm_plugin::cabi::options::ProcessOptions::from_env().crash_report;
    xla_vmm_plugin::cabi::crash::install_if(wanted);
    // A second install changes nothing.
    xla_vmm_plugin::cabi::crash::install_if(wanted);
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("abort") => std::process::abort(),
        _ => fault(),
    }
}

/// In the parent: the child's exit status and stderr; in a child: `None`
/// (its own `child` test does the work).
fn parent_runs_child(what: &str, report: bool) -> Option<(std::process::ExitStatus, String)> {
    if std::env::var(CHILD_ENV).is_ok() {
        return None;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, what)
        .env("XLA_VMM_CRASH_REPORT", if report { "1" } else { "0" })
        .output()
        .unwrap();
    Some((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn a_segfault_prints_the_native_stack_then_dies_by_its_signal() {
    let Some((status, stderr)) = parent_runs_child("segv", true) else {
        return;
    };
    assert_eq!(status.signal(), Some(11), "{status:?}\n{stderr}");
    assert!(
        stderr.contains("*** xla-vmm crash report: signal 11 at address 0x8, thread "),
        "{stderr}"
    );
    assert!(
        stderr.contains("*** end of xla-vmm crash report ***"),
        "{stderr}"
    );
    // At least the handler's frame and the faulting test's, with their module.
    let frames = stderr
        .lines()
        .skip_while(|l| !l.contains("crash report: signal"))
        .skip(1)
        .take_while(|l| !l.contains("end of xla-vmm crash report"))
        .filter(|l| l.contains("crash_report-") || l.contains("[0x"))
        .count();
    assert!(frames >= 3, "{frames} frames:\n{stderr}");
}

#[test]
fn an_abort_is_reported_and_still_aborts() {
    let Some((status, stderr)) = parent_runs_child("abort", true) else {
        return;
    };
    assert_eq!(status.signal(), Some(6), "{status:?}\n{stderr}");
    assert!(
        stderr.contains("xla-vmm crash report: signal 6"),
        "{stderr}"
    );
}

#[test]
fn off_by_default() {
    let Some((status, stderr)) = parent_runs_child("segv", false) else {
        return;
    };
    assert_eq!(status.signal(), Some(11), "{status:?}\n{stderr}");
    assert!(!stderr.contains("xla-vmm crash report"), "{stderr}");
}

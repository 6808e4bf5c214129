//! The external tools the kernel-source tests need (clang, clang++,
//! ptxas): found by trying each candidate's `--version`; missing ones skip
//! the test, saying so, except where CI's `XLA_VMM_REQUIRE_*=1` makes them
//! a failure.

#![allow(dead_code)] // each test file uses some of these

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Does `tool --version` run and succeed?
pub fn runs(tool: &Path) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `$env` if set, then `base-19` .. `base-15`, then `base`.
pub fn versioned(env: &str, base: &str) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = std::env::var(env)
        .ok()
        .map(PathBuf::from)
        .into_iter()
        .collect();
    names.extend(
        (15..=19)
            .rev()
            .map(|v| PathBuf::from(format!("{base}-{v}"))),
    );
    names.push(base.into());
    names
}

/// The first of `candidates` that runs, or `None` (printing `SKIP: no
/// {what}`); when `$require` is `1` a missing tool fails the test instead.
pub fn find_or_skip(
    candidates: impl IntoIterator<Item = PathBuf>,
    require: &str,
    what: &str,
) -> Option<PathBuf> {
    let found = candidates.into_iter().find(|c| runs(c));
    if found.is_none() {
        assert!(
            std::env::var(require).as_deref() != Ok("1"),
            "{require}=1 but no {what} found"
        );
        eprintln!("SKIP: no {what}");
    }
    found
}

/// Runs `cmd` and fails the test, with `what` and the tool's stderr, unless
/// it exits successfully.
pub fn run_ok(cmd: &mut Command, what: impl Display) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {:?}: {e}", cmd.get_program()));
    assert!(
        o.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

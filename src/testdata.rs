//! Where the repository's test data lives, found at run time rather than
//! baked in at build time, so that tests, benches and tools find it from the
//! checkout they run in: `cargo test` from any crate of the workspace, and
//! test binaries staged onto another machine (`integration/stage_gpu.sh`)
//! and run from the repository root there.
//!
//! The fixtures are `integration/fixtures` (real XLA GPU executables, see
//! its README) and `integration/multi/fixtures` (multi-device ones).

use std::path::{Path, PathBuf};

/// Overrides where [`fixtures_dir`] looks.
pub const FIXTURES_ENV: &str = "XLA_VMM_FIXTURES";

/// The checkout's folder of single-device fixtures: `$XLA_VMM_FIXTURES`,
/// else `integration/fixtures` of the first folder, walking up from the
/// current directory, then from the running executable, then from the
/// source tree this crate was built from, that has one.
pub fn fixtures_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(FIXTURES_ENV) {
        let d = PathBuf::from(d);
        return d.join("README.md").is_file().then_some(d);
    }
    find("integration/fixtures")
}

/// The checkout's `integration/multi/fixtures` (found as [`fixtures_dir`]
/// finds its folder, without the override).
pub fn multi_fixtures_dir() -> Option<PathBuf> {
    find("integration/multi/fixtures")
}

/// [`fixtures_dir`], or a panic that says where it looked (for tests).
pub fn require_fixtures_dir() -> PathBuf {
    fixtures_dir().unwrap_or_else(|| {
        panic!(
            "no integration/fixtures found above {:?} or the test executable (set {FIXTURES_ENV})",
            std::env::current_dir().ok()
        )
    })
}

/// `rel` (holding a README.md) under the first ancestor of the places
/// above that has it.
fn find(rel: &str) -> Option<PathBuf> {
    let starts = [
        std::env::current_dir().ok(),
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf)),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    starts.into_iter().flatten().find_map(|start| {
        start
            .ancestors()
            .map(|a| a.join(rel))
            .find(|d| d.join("README.md").is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkout_fixtures_are_found() {
        let d = fixtures_dir().expect("integration/fixtures");
        assert!(d.join("small.pjrt").is_file(), "{}", d.display());
        let m = multi_fixtures_dir().expect("integration/multi/fixtures");
        assert!(m.ends_with("integration/multi/fixtures"), "{}", m.display());
    }
}

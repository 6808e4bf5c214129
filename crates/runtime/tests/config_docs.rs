//! docs/DESIGN.md's configuration tables list exactly the run options of
//! `xla_vmm_runtime::OPTIONS`, with their variables, values and defaults,
//! and the process settings of `xla_vmm_device::settings::VARIABLES`.

use std::path::PathBuf;

/// The rows of the tables of DESIGN's configuration section: before its
/// "Process settings" part, or in it.
fn rows(process: bool) -> Vec<Vec<String>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).expect("docs/DESIGN.md");
    let section = design
        .split("## 6. Configuration")
        .nth(1)
        .expect("a Configuration section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut parts = section.split("### Process settings");
    let part = if process { parts.nth(1) } else { parts.next() };
    part.expect("a Process settings part")
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_process_settings_table_is_the_variables_table() {
    let want: Vec<Vec<String>> = xla_vmm_device::settings::VARIABLES
        .iter()
        .map(|v| vec![v.name.to_string(), v.what.to_string()])
        .collect();
    assert_eq!(
        rows(true),
        want,
        "docs/DESIGN.md's process settings against VARIABLES"
    );
}

#[test]
fn the_design_table_is_the_options_table() {
    let rows = rows(false);
    let want: Vec<Vec<String>> = xla_vmm_runtime::OPTIONS
        .iter()
        .map(|o| {
            vec![
                o.key.to_string(),
                o.env.to_string(),
                o.values.to_string(),
                o.default.to_string(),
            ]
        })
        .collect();
    assert_eq!(rows, want, "docs/DESIGN.md section 6 against OPTIONS");
}

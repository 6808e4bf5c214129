//! docs/DESIGN.md's configuration table lists exactly the run options of
//! `xla_vmm_runtime::OPTIONS`, with their variables, values and defaults.

use std::path::PathBuf;

#[test]
fn the_design_table_is_the_options_table() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).expect("docs/DESIGN.md");
    let section = design
        .split("## 6. Configuration")
        .nth(1)
        .expect("a Configuration section")
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<Vec<String>> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect();
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

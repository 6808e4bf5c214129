//! The docs cannot drift from the tools: the README's command table lists
//! exactly the subcommands and flags `xla-vmm --help` knows, and
//! integration/README.md names every `XLA_VMM_*` environment variable the
//! plugin, the runtime, the CLI and the Python package read.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    // integration/fixtures -> the checkout's root.
    let f = xla_vmm::testdata::require_fixtures_dir();
    f.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Long flags (`--name`) in `text`, without --help / --version.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at + 2;
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .map_or(text.len(), |n| start + n);
        let before_ok = i + at == 0 || !b[i + at - 1].is_ascii_alphanumeric();
        if before_ok && end > start && b[start].is_ascii_lowercase() {
            let name = &text[start..end];
            if name != "help" && name != "version" {
                out.insert(format!("--{name}"));
            }
        }
        i = end.max(start);
    }
    out
}

fn help(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_xla-vmm"))
        .args(args)
        .arg("--help")
        .output()
        .expect("spawn xla-vmm");
    assert!(o.status.success(), "xla-vmm {args:?} --help");
    String::from_utf8(o.stdout).unwrap()
}

/// The option lines of a `--help` text (after `Options:`).
fn help_flags(text: &str) -> BTreeSet<String> {
    let opts = text.split("Options:").nth(1).unwrap_or("");
    opts.lines()
        .filter_map(|l| {
            let t = l.trim_start();
            let t = t.strip_prefix("-h, ").unwrap_or(t);
            let t = if t.len() > 4 && t.as_bytes()[0] == b'-' && t.as_bytes()[2] == b',' {
                &t[4..]
            } else {
                t
            };
            t.starts_with("--")
                .then(|| flags(t.split_whitespace().next().unwrap()))
        })
        .flatten()
        .collect()
}

#[test]
fn readme_command_table_matches_help() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("## The `xla-vmm` command")
        .nth(1)
        .expect("README section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut documented = std::collections::BTreeMap::new();
    for line in section.lines() {
        let Some(rest) = line.strip_prefix("| `xla-vmm ") else {
            continue;
        };
        let cell = rest.split("` |").next().unwrap();
        let sub = cell.split_whitespace().next().unwrap().to_string();
        documented.insert(sub, flags(cell));
    }
    let top = help(&[]);
    let commands: BTreeSet<String> = top
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert_eq!(
        documented.keys().cloned().collect::<BTreeSet<_>>(),
        commands,
        "README command table vs `xla-vmm --help`"
    );
    for (sub, doc) in &documented {
        let real = help_flags(&help(&[sub]));
        assert_eq!(doc, &real, "`xla-vmm {sub}`: README flags vs --help");
    }
}

/// `XLA_VMM_*` string literals in the product's sources.
fn env_vars_read(dirs: &[PathBuf]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            continue;
        }
        if !p.extension().is_some_and(|x| x == "rs" || x == "py") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for (i, _) in text.match_indices("\"XLA_VMM_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

#[test]
fn every_environment_variable_read_is_documented() {
    let r = repo();
    let mut dirs = vec![
        r.join("src"),
        r.join("ffi/src"),
        r.join("plugin/src"),
        r.join("integration/jax_plugins"),
    ];
    for e in std::fs::read_dir(r.join("crates")).unwrap() {
        dirs.push(e.unwrap().path().join("src"));
    }
    let read = env_vars_read(&dirs);
    assert!(read.contains("XLA_VMM_TMP_COPY_THRESHOLD"), "{read:?}");
    let doc = std::fs::read_to_string(r.join("integration/README.md")).unwrap();
    let missing: Vec<_> = read.iter().filter(|v| !doc.contains(v.as_str())).collect();
    assert!(
        missing.is_empty(),
        "read by the code, not in integration/README.md: {missing:?}"
    );
}

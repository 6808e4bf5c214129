//! Runs the built `xla-vmm inspect --json` on the fixtures and checks the
//! counts against the table in integration/fixtures/README.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn fixtures() -> PathBuf {
    xla_vmm::testdata::require_fixtures_dir()
}

/// (allocations, [param, const, output, temp], top-level, kinds).
type Row = (u64, [u64; 4], u64, BTreeMap<String, u64>);

/// name → row, parsed from the README's counts table.
fn readme_counts() -> BTreeMap<String, Row> {
    let text = std::fs::read_to_string(fixtures().join("README.md")).expect("fixtures README");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        if cols.len() != 6 {
            continue;
        }
        let Some((total, roles)) = cols[2].split_once('(') else {
            continue;
        };
        let Ok(total) = total.trim().parse() else {
            continue;
        };
        let roles: Vec<u64> = roles
            .trim_end_matches(')')
            .split('/')
            .map(|r| r.trim().parse().unwrap())
            .collect();
        let kinds = cols[4]
            .split(',')
            .map(|k| {
                let (name, n) = k.trim().rsplit_once(' ').unwrap();
                (name.to_string(), n.parse().unwrap())
            })
            .collect();
        out.insert(
            cols[1].to_string(),
            (
                total,
                roles.try_into().unwrap(),
                cols[3].parse().unwrap(),
                kinds,
            ),
        );
    }
    out
}

/// `inspect FILE`'s readable summary (it must succeed).
fn readable(file: &std::path::Path) -> String {
    let out = inspect(&[file.to_str().unwrap()]);
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn inspect(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xla-vmm"))
        .arg("inspect")
        .args(args)
        .output()
        .expect("run xla-vmm")
}

/// `inspect FILE --json --memory-budget BUDGET EXTRA...`'s `key` (it must
/// succeed).
fn budget_json(file: &str, budget: &str, extra: &[&str], key: &str) -> serde_json::Value {
    let mut args = vec![file, "--json", "--memory-budget", budget];
    args.extend_from_slice(extra);
    let out = inspect(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[key].clone()
}

#[test]
fn json_counts_match_the_fixture_readme() {
    let table = readme_counts();
    assert_eq!(table.len(), 6, "rows parsed: {:?}", table.keys());
    for (name, (allocs, roles, top, kinds)) in &table {
        let path = fixtures().join(format!("{name}.pjrt"));
        let out = inspect(&[path.to_str().unwrap(), "--json"]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(v["allocations"], *allocs, "{name}");
        for (i, role) in ["parameter", "constant", "output", "temp"]
            .iter()
            .enumerate()
        {
            assert_eq!(v["roles"][role], roles[i], "{name} {role}");
        }
        assert_eq!(v["top_level_thunks"], *top, "{name}");
        let got: BTreeMap<String, u64> = serde_json::from_value(v["kinds"].clone()).unwrap();
        assert_eq!(&got, kinds, "{name}");
        // `bytes` is the sum of the per-role byte counts.
        let role_sum: u64 = v["role_bytes"]
            .as_object()
            .unwrap()
            .values()
            .map(|b| b.as_u64().unwrap())
            .sum();
        assert_eq!(v["bytes"].as_u64(), Some(role_sum), "{name}");
        assert!(role_sum > 0);
    }
}

#[test]
fn readable_summary_and_errors() {
    let path = fixtures().join("loop.pjrt");
    let text = readable(&path);
    assert!(text.contains("allocations: 4"), "{text}");
    assert!(text.contains("while `while.1` trip count 8"), "{text}");
    assert!(text.contains("unsupported: none"), "{text}");
    assert!(!text.contains("4.0 KiB overwrite"), "{text}");

    // --uses: each thunk's slices under it (the copy into #0 overwrites it; the
    // loop body's fusion takes #0 twice, as its input and its aliased output).
    let out = inspect(&[path.to_str().unwrap(), "--uses"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let copy = text.find("`copy.9` #1+0 -> #0+0 (4096 B)\n").expect(&text);
    assert!(
        text[copy..].contains("#1+0 4.0 KiB read\n        #0+0 4.0 KiB overwrite\n"),
        "{text}"
    );
    let body = text.find("`loop_add_fusion` loop_add_fusion").expect(&text);
    assert_eq!(
        text[body..]
            .split("[1]")
            .next()
            .unwrap()
            .matches("#0+0 4.0 KiB write")
            .count(),
        2,
        "{text}"
    );

    // Kernels that take TMA descriptors (the llama program's Triton GEMMs,
    // compiled on an H200): counted by the load check, marked in the tree.
    let sgd = fixtures().join("llama_sgd_f32.pjrt");
    let text = readable(&sgd);
    assert!(
        text.contains("code images; 8 take TMA descriptors, which HIP does not have)"),
        "{text}"
    );
    assert!(
        text.contains(" args 3 (3 as TMA descriptors) (cubin "),
        "{text}"
    );
    assert!(!readable(&path).contains("TMA"), "loop.pjrt");
    let v: serde_json::Value =
        serde_json::from_slice(&inspect(&[sgd.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(v["load_check"]["tma_kernels"], 8);

    // A file that is not an executable: non-zero exit and a clear message.
    let bad = std::env::temp_dir().join(format!("xla-vmm-inspect-{}.bin", std::process::id()));
    std::fs::write(&bad, b"definitely not riegeli").unwrap();
    let out = inspect(&[bad.to_str().unwrap(), "--json"]);
    let _ = std::fs::remove_file(&bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an XLA serialized executable"), "{err}");
}

#[test]
fn memory_budget_plans_stay_under_the_budget() {
    let file = fixtures().join("llama_scan_bf16.pjrt");
    let file = file.to_str().unwrap();
    let plan = |budget: &str| budget_json(file, budget, &[], "residency");
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    // Everything fits: nothing moves.
    let roomy = plan("1G");
    assert_eq!(n(&roomy, "bytes_in_per_step"), 0);
    assert_eq!(n(&roomy, "peak_device_bytes"), n(&roomy, "total_bytes"));
    // Half the program's bytes and a quarter: under the budget, bytes move.
    let total = n(&roomy, "total_bytes");
    let mut last_link = 0;
    for budget in [total / 2, total / 4] {
        let r = plan(&budget.to_string());
        assert!(n(&r, "peak_device_bytes") <= budget, "{r}");
        // Over the link, copied or read and written in place (a smaller
        // budget may read in place what a larger one staged).
        let link = n(&r, "bytes_in_per_step")
            + n(&r, "bytes_out_per_step")
            + n(&r, "bytes_in_place_per_step");
        assert!(
            link > last_link,
            "a smaller budget moves more: {link} after {last_link}"
        );
        last_link = link;
        assert!(r["placements"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["placement"] == "staged"));
    }
    // A budget that is no number is refused by the flag.
    let out = inspect(&[file, "--memory-budget", "lots"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected bytes"));
}

#[test]
fn as_run_plans_what_the_plugin_stages_at_the_first_run() {
    // llama_sgd_f32 (568 MiB) under a 384 MiB limit: the parameters first,
    // then its own buffers while three quarters of it last, the rest is in
    // host memory, and the first run stages part of it through the room
    // left.
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let file = file.to_str().unwrap();
    let run = |extra: &[&str]| {
        let args: Vec<&str> = ["--as-run"].iter().chain(extra).copied().collect();
        budget_json(file, "384M", &args, "as_run")
    };
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    let a = run(&[]);
    assert_eq!(n(&a, "staging_reserve_percent"), 25);
    assert!(n(&a, "device_bytes") <= 384 * (1 << 20) / 100 * 75, "{a}");
    assert!(n(&a, "host_bytes") > 0, "{a}");
    let s = &a["staging"];
    assert!(n(s, "staged") > 0, "{a}");
    assert!(
        n(s, "area_bytes") <= 384 * (1 << 20) - n(&a, "device_bytes"),
        "{a}"
    );
    // Every buffer copied, the most bytes per step first; together the
    // step's bytes each way (and the carried buffers the step before
    // fetches, those not already in place).
    let top = s["most_copied"].as_array().unwrap_or_else(|| panic!("{s}"));
    assert!(!top.is_empty(), "{s}");
    let moved = |c: &serde_json::Value| n(c, "bytes_in") + n(c, "bytes_out");
    assert!(top.windows(2).all(|w| moved(&w[0]) >= moved(&w[1])), "{s}");
    for c in top {
        assert_eq!(n(c, "bytes_in"), n(c, "copies_in") * n(c, "bytes"), "{c}");
        assert_eq!(n(c, "bytes_out"), n(c, "copies_out") * n(c, "bytes"), "{c}");
    }
    let sum = |k: &str| top.iter().map(|c| n(c, k)).sum::<u64>();
    assert!(sum("bytes_in") >= n(s, "bytes_in_per_step"), "{s}");
    assert!(
        sum("bytes_in") <= n(s, "bytes_in_per_step") + n(s, "carried_bytes"),
        "{s}"
    );
    assert_eq!(sum("bytes_out"), n(s, "bytes_out_per_step"), "{s}");
    // No reserve: as much in device memory or more (the next large
    // temporary may not fit either way), no more room to stage through.
    let b = run(&["--staging-reserve", "0"]);
    assert!(n(&b, "device_bytes") >= n(&a, "device_bytes"), "{b}");
    assert!(n(&b["staging"], "area_bytes") <= n(s, "area_bytes"), "{b}");
    // Memory other programs hold comes first: less of this program in
    // device memory, a smaller area, the held bytes said.
    let h = run(&["--device-held", "100M"]);
    assert_eq!(n(&h, "device_held_bytes"), 100 << 20, "{h}");
    assert!(
        n(&h, "device_bytes") + (100 << 20) <= 384 * (1 << 20) / 100 * 75,
        "{h}"
    );
    assert!(
        n(&h["staging"], "area_bytes") <= 384 * (1 << 20) - (100 << 20) - n(&h, "device_bytes"),
        "{h}"
    );
    // The reserve is checked; --as-run needs a budget.
    assert!(!inspect(&[
        file,
        "--memory-budget",
        "384M",
        "--as-run",
        "--staging-reserve",
        "95"
    ])
    .status
    .success());
    assert!(!inspect(&[file, "--as-run"]).status.success());
}

#[test]
fn as_run_names_the_thunks_that_wait_for_their_copies_longest_first() {
    // llama_sgd_f32 under 256 MiB: its staging's thunks wait for their
    // copies in; the longest waits come first, and all of them together
    // take less than the step (its thunks run too).
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let file = file.to_str().unwrap();
    let a = budget_json(file, "256M", &["--as-run"], "as_run");
    let s = &a["staging"];
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    // How long the planning took (a first run under the limit plans as much).
    assert!(a["planning_us"].as_u64().is_some_and(|us| us > 0), "{a}");
    let all = f(s, "copy_waits_us");
    let step = f(s, "estimated_step_us");
    assert!(all > 0.0 && all < step, "{s}");
    let w = s["longest_waits"]
        .as_array()
        .unwrap_or_else(|| panic!("{s}"));
    assert!(!w.is_empty(), "{s}");
    assert!(
        w.windows(2)
            .all(|p| f(&p[0], "wait_us") >= f(&p[1], "wait_us")),
        "{s}"
    );
    // Every wait: together the total.
    let listed: f64 = w.iter().map(|x| f(x, "wait_us")).sum();
    assert!((listed - all).abs() <= 1e-6 * all.max(1.0), "{s}");
    for x in w {
        assert!(x["name"].as_str().is_some_and(|n| !n.is_empty()), "{x}");
        assert!(x["bytes"].as_u64().unwrap() > 0, "{x}");
    }
    // The text says the same, its first wait the longest.
    let out = inspect(&[file, "--memory-budget", "256M", "--as-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let head = "thunks waiting for their copies in: ";
    assert!(text.contains(head), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("planned in ") && l.contains(" s (")),
        "{text}"
    );
    let first = text
        .lines()
        .skip_while(|l| !l.contains(head))
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let thunk = w[0]["thunk"].as_u64().unwrap();
    assert!(
        first.trim_start().starts_with(&format!("thunk {thunk} ")),
        "{first}"
    );
    // Where the step's time goes, by tenths: three rows of ten percents.
    let tenths = text
        .lines()
        .find(|l| l.contains("busy in each tenth of the step"))
        .unwrap_or_else(|| panic!("{text}"));
    let rows: Vec<Vec<u32>> = tenths
        .split(": ")
        .nth(1)
        .unwrap_or_else(|| panic!("{tenths}"))
        .split("; ")
        .map(|r| {
            r.split(' ')
                .filter_map(|x| x.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    assert_eq!(rows.len(), 3, "{tenths}");
    assert!(
        rows.iter()
            .all(|r| r.len() == 10 && r.iter().all(|&x| x <= 100)),
        "{tenths}"
    );
    assert!(
        rows[0].iter().any(|&x| x > 0) && rows[1].iter().any(|&x| x > 0),
        "{tenths}"
    );
    // The estimate span by span: thunks one after another, each waiting
    // thunk starting its wait after the one before; the step their end.
    let t = &s["timeline"];
    assert_eq!(f(t, "step_us"), step, "{t}");
    let thunks = t["thunks"].as_array().unwrap_or_else(|| panic!("{t}"));
    assert!(thunks
        .windows(2)
        .all(|p| f(&p[1], "start_us") >= f(&p[0], "end_us")));
    for x in w {
        let k = &thunks[x["thunk"].as_u64().unwrap() as usize];
        assert_eq!(k["name"], x["name"], "{k} {x}");
        assert!(
            (f(k, "start_us") - f(x, "landed_us")).abs() < 1e-6,
            "{k} {x}"
        );
    }
    let copies = t["copies"].as_array().unwrap_or_else(|| panic!("{t}"));
    assert!(copies.iter().any(|c| c["home"] == false), "{t}");
    for c in copies {
        assert!(
            f(c, "done_us") > f(c, "started_us") && f(c, "done_us") <= step + 1e-6,
            "{c}"
        );
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
    }
}

#[test]
fn as_run_text_lists_buffers_read_in_place_only_where_there_are_some() {
    // llama_sgd_f32 under 256 MiB: everything in host memory is staged.
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let out = inspect(&[
        file.to_str().unwrap(),
        "--memory-budget",
        "256M",
        "--as-run",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 (0.0 MiB) read in place;"), "{text}");
    assert!(!text.contains("read in place, by bytes"), "{text}");
    // What is staged crosses the link: its largest crossings are listed.
    assert!(
        text.contains("copied over the link, by bytes per step"),
        "{text}"
    );
}

#[test]
fn as_run_text_names_the_thunks_that_read_a_buffer_in_place() {
    // llama_sgd_f32 under 64 MiB: a temporary too large for the area is
    // read in place by several thunks; the line names them, the most bytes
    // first.
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let out = inspect(&[file.to_str().unwrap(), "--memory-budget", "64M", "--as-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .skip_while(|l| !l.contains("read in place, by bytes"))
        .nth(1)
        .unwrap_or_else(|| panic!("no buffer read in place: {text}"));
    let (_, by) = line.split_once(", by ").expect(line);
    let mib: Vec<f64> = by
        .split("thunk ")
        .skip(1)
        .map(|t| {
            let b = t.rsplit_once('(').expect(t).1;
            b.trim_end_matches([')', ',', ' '])
                .trim_end_matches(" MiB")
                .parse()
                .expect(b)
        })
        .collect();
    assert!(mib.len() >= 2, "{line}");
    assert!(mib.windows(2).all(|w| w[0] >= w[1]), "{line}");
    // The same in the JSON: each buffer's readers' bytes within its own.
    let out = inspect(&[
        file.to_str().unwrap(),
        "--json",
        "--memory-budget",
        "64M",
        "--as-run",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = v["as_run"]["staging"]["read_in_place"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!list.is_empty(), "{v}");
    for b in &list {
        let by = b["by"].as_array().unwrap();
        let sum: u64 = by.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
        assert!(
            !by.is_empty() && sum <= b["link_bytes"].as_u64().unwrap(),
            "{b}"
        );
    }
}

#[test]
fn as_run_shows_what_the_first_run_moves_for_its_plan() {
    // llama_sgd_f32 under a 150 MiB limit: the parameters put first hold
    // the device, the area left is too small for a step's temporaries, so
    // the first run sends parameters to host memory for a larger area.
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let file = file.to_str().unwrap();
    let out = inspect(&[file, "--json", "--memory-budget", "150M", "--as-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = &v["as_run"];
    let m = &a["first_run_moves"];
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    let ids = |k: &str| m[k].as_array().unwrap_or_else(|| panic!("{k}: {m}")).len();
    assert!(ids("to_host") > 0, "{m}");
    assert!(f(m, "to_host_bytes") >= f(m, "to_device_bytes"), "{m}");
    // The estimate gains at least the 5% a move must gain, and the area
    // grows by what left the device.
    assert!(
        f(m, "estimated_step_us_after") <= 0.95 * f(m, "estimated_step_us"),
        "{m}"
    );
    let area = |s: &serde_json::Value| f(s, "area_bytes");
    assert!(area(&m["staging"]) > area(&a["staging"]), "{a}");
    // Each layout is judged by the staging it runs: the estimates are those
    // stagings' own.
    assert_eq!(
        f(m, "estimated_step_us"),
        f(&a["staging"], "estimated_step_us"),
        "{a}"
    );
    assert_eq!(
        f(m, "estimated_step_us_after"),
        f(&m["staging"], "estimated_step_us"),
        "{a}"
    );
    // Where nothing gains, nothing moves.
    let out = inspect(&[file, "--json", "--memory-budget", "400M", "--as-run"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["as_run"]["first_run_moves"].is_null(), "{v}");
    // The readable summary says each staging's estimate beside the link's
    // time for its bytes, before and after the moves.
    let out = inspect(&[file, "--memory-budget", "150M", "--as-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let estimates: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("estimated step "))
        .collect();
    assert_eq!(estimates.len(), 2, "{text}");
    let before = format!(
        "estimated step {:.2} ms as these copies run",
        f(m, "estimated_step_us") / 1e3
    );
    assert!(estimates[0].contains(&before), "{text}");
    assert!(estimates[1].contains("; the link's bytes: "), "{text}");
}

#[test]
fn a_full_duplex_link_bounds_the_step_by_its_busier_direction() {
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let file = file.to_str().unwrap();
    let plan = |extra: &[&str]| budget_json(file, "256M", extra, "residency");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    // By default the directions take turns at 55 GB/s.
    let turns = plan(&[]);
    let (i, o) = (
        f(&turns, "bytes_in_per_step"),
        f(&turns, "bytes_out_per_step"),
    );
    assert!(i > 0.0 && o > 0.0, "{turns}");
    assert!((f(&turns, "link_bound_us") - (i + o) / 55e9 * 1e6).abs() < 1e-3);
    // Both at once at twice one way's rate: the busier direction bounds it.
    let duplex = plan(&["--link-out-gbps", "55", "--link-both-gbps", "110"]);
    assert_eq!(f(&duplex, "bytes_in_per_step"), i);
    assert!((f(&duplex, "link_bound_us") - i.max(o) / 55e9 * 1e6).abs() < 1e-3);
    assert!(f(&duplex, "step_us") < f(&turns, "step_us"));
    // A rate that is no rate is refused, naming it.
    let out = inspect(&[file, "--memory-budget", "256M", "--link-both-gbps=-3"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("link_both_bytes_per_s"));
}

#[test]
fn as_run_without_moves_and_a_second_program_in_the_first_ones_area() {
    let file = fixtures().join("llama_sgd_f32.pjrt");
    let file = file.to_str().unwrap();
    // 150M moves memory at the first run (above); --no-rebalance does not.
    let a = budget_json(file, "150M", &["--as-run", "--no-rebalance"], "as_run");
    assert!(a["first_run_moves"].is_null(), "{a}");
    // The program again, with the same parameters, after the first moved its
    // memory: it plans in the area the first made (as large as the room the
    // moves left), with no moves of its own.
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    let a = budget_json(file, "150M", &["--as-run", "--then", file], "as_run");
    let moved = &a["first_run_moves"]["staging"];
    let then = &a["then"]["staging"];
    assert!(
        f(then, "area_bytes") <= f(moved, "area_bytes") + 2.0 * 1048576.0,
        "{a}"
    );
    assert!(f(then, "estimated_step_us") > 0.0, "{a}");
    // The same program with the same parameters: only its own buffers
    // differ, in host memory now (the area took the room), so it moves no
    // fewer bytes (both ways: which way a window's eviction sends them may
    // differ).
    assert!(f(then, "device_bytes") < f(moved, "device_bytes"), "{a}");
    let both = |v: &serde_json::Value| f(v, "bytes_in_per_step") + f(v, "bytes_out_per_step");
    assert!(both(then) >= both(moved), "{a}");
    let out = inspect(&[file, "--memory-budget", "150M", "--as-run", "--then", file]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "then {file}, with the same parameters, in the staging area the first made:"
        )),
        "{text}"
    );
    // --then needs --as-run.
    assert!(!inspect(&[file, "--memory-budget", "150M", "--then", file])
        .status
        .success());
}

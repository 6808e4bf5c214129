//! Decode-time benchmark: `cargo bench -p xla-vmm --bench decode`.
//! Decodes every fixture (../shared/fixtures) repeatedly and prints the
//! minimum and median wall time per decode. No external harness: the numbers
//! are plain `Instant` measurements after one warm-up decode.

use std::time::{Duration, Instant};

fn main() {
    let dir = xla_vmm::testdata::require_fixtures_dir();
    let mut names: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "pjrt"))
            .collect(),
        Err(e) => {
            eprintln!("no fixtures at {}: {e}", dir.display());
            return;
        }
    };
    names.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
    println!(
        "{:<22} {:>10} {:>12} {:>12} {:>6}",
        "fixture", "bytes", "min ms", "median ms", "runs"
    );
    for path in names {
        let bytes = std::fs::read(&path).expect("read fixture");
        xla_vmm::decode(&bytes).expect("warm-up decode");
        let runs = 50;
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                let plan = xla_vmm::decode(&bytes).expect("decode");
                let e = t.elapsed();
                std::hint::black_box(plan);
                e
            })
            .collect();
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<22} {:>10} {:>12.3} {:>12.3} {:>6}",
            path.file_stem().unwrap_or_default().to_string_lossy(),
            bytes.len(),
            ms(times[0]),
            ms(times[runs / 2]),
            runs
        );
    }
}

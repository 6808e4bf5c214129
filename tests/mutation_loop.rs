//! An in-process mutation loop over the inner `GpuExecutableProto` message
//! of every fixture (issue 13, item 4): each mutant is decoded, and what
//! decodes is walked and serialized as the CLI does; nothing may panic,
//! hang or overflow. Time-bounded (XLA_VMM_MUTATION_SECS, default 8 s over
//! all fixtures) so that CI runs it on every change; the mutation counts
//! and how many still decoded are printed.

mod common;

use std::time::{Duration, Instant};

use common::{fixture, FIXTURES};
use xla_vmm::decode::mutate::{inner_message, wrap_inner, Mutator};
use xla_vmm::decode::{decode, decode_gpu_executable_message};

#[test]
fn mutated_inner_messages_decode_or_fail_cleanly() {
    let secs: u64 = std::env::var("XLA_VMM_MUTATION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let names: Vec<&str> = FIXTURES
        .iter()
        .copied()
        .filter(|f| common::fixtures_dir().join(format!("{f}.pjrt")).is_file())
        .collect();
    assert!(!names.is_empty(), "no fixtures");
    let per = Duration::from_secs(secs) / names.len() as u32;
    for (i, name) in names.iter().enumerate() {
        let message = inner_message(&fixture(name)).expect("the fixture decodes");
        let mut m = Mutator::new(0x9e37_79b9 + i as u64);
        let (mut tried, mut decoded) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < per || tried < 200 {
            let mutant = m.mutate(&message);
            tried += 1;
            if let Ok(plan) = decode_gpu_executable_message(&mutant) {
                decoded += 1;
                let mut n = 0usize;
                plan.walk(&mut |t, _| n += t.uses().len() + t.reads().len() + t.writes().len());
                let _ = plan.kind_counts();
                let _ = serde_json::to_string(&plan).expect("a plan serializes");
                std::hint::black_box(n);
            }
            // Every 64th mutant also through the whole-file path.
            if tried % 64 == 0 {
                let _ = decode(&wrap_inner(&mutant));
            }
        }
        println!("{name}: {tried} mutants, {decoded} decoded");
        // The loop reaches past the wire format: many mutants still decode.
        assert!(
            decoded * 20 >= tried,
            "{name}: only {decoded} of {tried} mutants decoded"
        );
    }
}

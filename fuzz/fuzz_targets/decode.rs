//! Feeds arbitrary bytes to the decoder: it must return Ok or Err, never
//! panic, overflow the stack or run away with memory. When a plan decodes,
//! walking it and listing its slice uses must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(plan) = xla_vmm::decode(data) {
        let mut n = 0usize;
        plan.walk(&mut |t, _| n += t.uses().len());
        let _ = plan.kind_counts();
        let _ = serde_json::to_string(&plan);
        std::hint::black_box(n);
    }
});

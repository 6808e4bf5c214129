//! Fuzzes the layers under the riegeli container: arbitrary bytes as a
//! reassembled `GpuExecutableProto` message (riegeli's chunk hashes would
//! reject almost every mutation of a whole file before reaching them).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(plan) = xla_vmm::decode::decode_gpu_executable_message(data) {
        let mut n = 0usize;
        plan.walk(&mut |t, _| n += t.uses().len() + t.reads().len() + t.writes().len());
        let _ = plan.kind_counts();
        let _ = serde_json::to_string(&plan);
        std::hint::black_box(n);
    }
});

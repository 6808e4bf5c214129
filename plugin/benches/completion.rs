//! Benchmark (not a test): how late a waiting `PJRT_Event_Await` wakes after
//! the device finishes a step, on the host backend. A step is held on the
//! client's stream, released after 2 ms by another thread (the work then
//! completes inside the release), and the latency is from the end of the
//! release to the return of `Await` on the step's completion event: what a
//! training loop that blocks on every step pays per step on top of the GPU
//! time. Both polling schemes of the completion thread, in one run:
//!
//!     cargo bench -p xla-vmm-plugin --bench completion
#![allow(unsafe_code)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::plans::*;
use common::*;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::runtime::context::VmmDevice;

/// Median and 90th percentile of the wake-up latency over `steps` steps (µs).
fn latency(steps: usize) -> (f64, f64) {
    let be = backend();
    let mem = Arc::new(VmmDevice::new(be.clone()).unwrap());
    let client = client::into_c(Client::with_memory(host_options(), mem.clone()).unwrap());
    let device = devices(client)[0];
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"lat".to_vec()).unwrap();
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let mut lats = Vec::with_capacity(steps);
    for _ in 0..steps {
        hold(&mem, true);
        let (out, done) = execute_async(exe, &[a], &[]).unwrap();
        let m = mem.clone();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            hold(&m, false);
            Instant::now()
        });
        assert_eq!(await_event(done), None);
        let woke = Instant::now();
        let released = releaser.join().unwrap();
        lats.push(woke.saturating_duration_since(released).as_secs_f64() * 1e6);
        destroy_event(done);
        destroy_buffer(out);
    }
    destroy_buffer(a);
    destroy_exe(exe);
    destroy_client(client);
    lats.sort_by(f64::total_cmp);
    (lats[lats.len() / 2], lats[lats.len() * 9 / 10])
}

fn main() {
    let steps = 300;
    // SAFETY (set_var): single-threaded here; each client reads the
    // variable when its completion thread starts.
    unsafe { std::env::set_var("XLA_VMM_COMPLETION_POLL", "backoff") };
    let (old_med, old_p90) = latency(steps);
    unsafe { std::env::remove_var("XLA_VMM_COMPLETION_POLL") };
    let (new_med, new_p90) = latency(steps);
    println!("completion wake-up latency after a 2 ms step, {steps} steps, host backend:");
    println!("| polling | median µs | p90 µs |");
    println!("|---|---|---|");
    println!("| backoff 10..100 µs, default timer slack | {old_med:.1} | {old_p90:.1} |");
    println!("| paced by the running estimate, 1 µs slack | {new_med:.1} | {new_p90:.1} |");
    println!("median ratio: {:.1}x", old_med / new_med.max(0.001));
}

//! Program churn leaves nothing behind (issue 34 item 2) on the host
//! backend, through the C API: two thousand distinct programs loaded, run
//! once and dropped. Its own test binary: the report registry and the live
//! object counts are process-wide.
#![allow(unsafe_code)]

mod common;

use common::plans::*;
use common::*;
use serde_json::Value;
use xla_vmm_plugin::pjrt::*;

/// What the plugin keeps, by count: stats() and report() name programs by
/// id, which churn changes, so their entries are counted, not shaped.
fn counted(client: *mut PJRT_Client, be: &xla_vmm_device::HostBackend) -> String {
    let (held, report, stats) = holdings(client, be);
    let len = |v: &Value| v.as_array().map_or(0, |a| a.len());
    format!(
        "{held} | report programs {} dropped {} | device {} | stats {}",
        len(&report["programs"]),
        len(&report["dropped"]),
        device_holds(&report["devices"][0]),
        stats.as_object().map_or(0, |o| o.len()),
    )
}

/// A device's entry in report() by what it holds now (not its running
/// totals): its allocator's live buffers, cache, granules and handles, its
/// memory's allocations and address ranges, the shared temporaries.
fn device_holds(d: &Value) -> String {
    let a = &d["allocator"];
    let m = &d["memory"];
    [
        &a["buffers_live"],
        &a["cached_blocks"],
        &a["granules"],
        &a["phys_handles"],
        &a["va_handles"],
        &a["bytes_physical"],
        &m["allocations"],
        &m["va_ranges"],
        &m["device_bytes"],
        &m["host_bytes"],
        &d["shared_temporaries"]["bytes"],
    ]
    .iter()
    .map(|v| v.to_string())
    .collect::<Vec<_>>()
    .join(" ")
}

#[test]
fn two_thousand_programs_loaded_run_and_dropped_leave_what_the_first_hundreds_left() {
    // Issue 34 item 2 on the host backend: distinct programs (out = a + 1
    // over n floats, n from 40,000 down in a scattered order: small
    // buffers of every size class and large ones), each loaded, run once and
    // dropped with its buffers; without a device memory limit and with one
    // that stages them. After the allocator's cache is released
    // (`xla_vmm_trim`, as a user calls `trim()`), what the plugin keeps is
    // the same at programs 300, 1,000 and 2,000 (past the 256 dropped
    // programs stats() keeps), and nothing is live.
    for (limit, reserve) in [(None, 0), (Some(8 << 20), 90)] {
        let (be, client) = limited_client(limit, reserve, false);
        let device = devices(client)[0];
        let mut samples = Vec::new();
        for k in 0..2000u64 {
            let n = 40_000 - (k * 997) % 39_999;
            let exe = xla_vmm_plugin::objects::executable::load_plan(
                client,
                add_one_n(n),
                format!("add_one_{k}").into_bytes(),
            )
            .unwrap();
            let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
            let input = put_f32(client, device, &x);
            let out = execute(exe, &[input], &[]).unwrap();
            let got = f32_values(&to_host(out).unwrap());
            let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
            assert!(
                got == want,
                "{limit:?}: program {k} (n = {n}) computed wrong"
            );
            if k == 0 && limit.is_some() {
                // The largest, past the device's room for ordinary buffers.
                let r = xla_vmm_plugin::cabi::stats::report_json();
                assert!(r.contains("\"staging\":{"), "staged under the limit: {r}");
            }
            destroy_buffer(out);
            destroy_buffer(input);
            destroy_exe(exe);
            if [300, 1000, 2000].contains(&(k + 1)) {
                assert!(xla_vmm_plugin::cabi::stats::xla_vmm_trim() >= 0);
                samples.push((k + 1, counted(client, &be)));
            }
        }
        assert!(
            samples[0]
                .1
                .starts_with("allocations 0 bytes 0 | live (0, 0, 0)"),
            "{limit:?}: {}",
            samples[0].1
        );
        for (k, s) in &samples[1..] {
            assert_eq!(
                s, &samples[0].1,
                "{limit:?}: what the plugin keeps after {k} programs, against after 300"
            );
        }
        destroy_client(client);
        assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
    }
}

//! A long run leaves nothing growing (issue 34 item 6): a training-like loop
//! through the C API on the host backend (the state donated to the step each
//! time, a second program reading it into a fresh output copied to the host
//! and destroyed, as a loss is), thousands of steps. After warm-up, what the
//! plugin keeps does not grow with the steps: the shapes of `report()`'s and
//! `stats()`'s JSON (every array's length, every object's keys), the live C
//! objects, the device's allocations and the host backend's handles. Its own
//! test binary: the report registry is process-wide.
#![allow(unsafe_code)]

mod common;

use common::plans::*;
use common::*;
use serde_json::Value;
use xla_vmm_plugin::pjrt::*;

/// The shape of a JSON value: arrays by length, objects by keys, each
/// member's shape in turn (numbers and strings are leaves, whatever they
/// hold: a step count or a time may change, a list may not grow).
fn shape(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(shape).collect::<Vec<_>>().join(",")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("{k}:{}", shape(v)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Value::Null => "null".into(),
        _ => "_".into(),
    }
}

/// What the plugin keeps, as one comparable line.
fn kept(client: *mut PJRT_Client, be: &xla_vmm_device::HostBackend) -> String {
    let (held, report, stats) = holdings(client, be);
    format!(
        "{held} | report {} | stats {}",
        shape(&report),
        shape(&stats)
    )
}

#[test]
fn thousands_of_steps_leave_nothing_growing() {
    // Without a device memory limit, then with one whose staging reserve is
    // nearly all of it: the buffers live in host memory and the programs
    // stage them through the device's area.
    for (limit, reserve) in [(None, 0), (Some(8 << 20), 90)] {
        let (be, client) = limited_client(limit, reserve, false);
        let device = devices(client)[0];
        let load = |plan, name: &[u8]| {
            xla_vmm_plugin::objects::executable::load_plan(client, plan, name.to_vec()).unwrap()
        };
        let (step, loss) = (load(add_one_donated(), b"step"), load(add_one(), b"loss"));
        let mut state = put_f32(client, device, &[0.0, 1.0, 2.0, 3.0]);
        let (warm, steps) = (300, 3000);
        let mut after_warmup = None;
        for i in 0..steps {
            // The donated handle is destroyed by its owner (JAX, once the
            // array is collected); its memory is the new state's.
            let next = execute(step, &[state], &[]).unwrap();
            destroy_buffer(state);
            state = next;
            let out = execute(loss, &[state], &[]).unwrap();
            let got = f32_values(&to_host(out).unwrap());
            let k = (i + 1) as f32;
            assert_eq!(
                got,
                vec![k + 1.0, k + 2.0, k + 3.0, k + 4.0],
                "{limit:?}, step {i}"
            );
            destroy_buffer(out);
            if i + 1 == warm {
                after_warmup = Some(kept(client, &be));
            }
        }
        let now = kept(client, &be);
        if limit.is_some() {
            let r = xla_vmm_plugin::cabi::stats::report_json();
            assert!(now.contains("staging:{"), "staged under the limit: {r}");
        }
        assert_eq!(
            after_warmup.as_deref(),
            Some(now.as_str()),
            "{limit:?}: what the plugin keeps grew between step {warm} and step {steps}"
        );
        destroy_buffer(state);
        destroy_exe(step);
        destroy_exe(loss);
        destroy_client(client);
        assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
    }
}

//! The PJRT profiler extension through the C API on the host backend: found
//! in the extension chain as JAX finds it, a session around three executes
//! gives one XSpace plane with the program's load, its steps (how each ran)
//! and the VA-stable binding's phases; both ways of collecting (JAX's two
//! tracers) give the same bytes; misuse is an error object with a message
//! and a code, never a crash.
#![allow(unsafe_code)]

mod common;

use common::plans::*;
use common::*;
use prost::Message;
use xla_vmm::proto::tensorflow::profiler::{x_stat, XPlane, XSpace};
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;

/// The plugin profiler API, found as JAX's `register_plugin_profiler` does.
fn profiler_api() -> &'static PLUGIN_Profiler_Api {
    let mut ext = api().extension_start as *const PJRT_Extension_Base;
    while !ext.is_null() {
        let base = unsafe { &*ext };
        if base.type_ == PJRT_Extension_Type_Profiler {
            let p = unsafe { &*(ext as *const PJRT_Profiler_Extension) };
            assert_eq!(p.base.struct_size, PJRT_Profiler_Extension_STRUCT_SIZE);
            return unsafe { &*p.profiler_api };
        }
        ext = base.next;
    }
    panic!("no profiler extension in the chain");
}

/// (message, code) of an error object, which is destroyed.
fn take(api: &PLUGIN_Profiler_Api, e: *mut PLUGIN_Profiler_Error) -> Option<(String, i32)> {
    if e.is_null() {
        return None;
    }
    let mut m: PLUGIN_Profiler_Error_Message_Args = unsafe { std::mem::zeroed() };
    m.error = e;
    unsafe { (api.error_message.unwrap())(&mut m) };
    let msg = unsafe { std::slice::from_raw_parts(m.message.cast::<u8>(), m.message_size) };
    let msg = String::from_utf8(msg.to_vec()).unwrap();
    let mut c: PLUGIN_Profiler_Error_GetCode_Args = unsafe { std::mem::zeroed() };
    c.error = e;
    assert!(unsafe { (api.error_get_code.unwrap())(&mut c) }.is_null());
    let mut d: PLUGIN_Profiler_Error_Destroy_Args = unsafe { std::mem::zeroed() };
    d.error = e;
    unsafe { (api.error_destroy.unwrap())(&mut d) };
    Some((msg, c.code))
}

fn on(
    api: &PLUGIN_Profiler_Api,
    f: Option<PLUGIN_Profiler_Call>,
    p: *mut PLUGIN_Profiler,
) -> Option<(String, i32)> {
    // As JAX's tracer: struct_size left unset (garbage here).
    let mut a = PLUGIN_Profiler_Args {
        struct_size: 0xdead,
        profiler: p,
    };
    take(api, unsafe { f.unwrap()(&mut a) })
}

fn stat_str<'a>(
    plane: &'a XPlane,
    stats: &'a [xla_vmm::proto::tensorflow::profiler::XStat],
    name: &str,
) -> Option<&'a x_stat::Value> {
    stats
        .iter()
        .find(|s| plane.stat_metadata[&s.metadata_id].name == name)
        .and_then(|s| s.value.as_ref())
}

#[test]
fn a_session_around_three_steps_is_one_plane_with_the_programs_work() {
    let _one = xla_vmm_runtime::trace::TEST_SESSION
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let api = profiler_api();
    assert_eq!(api.struct_size, PLUGIN_Profiler_Api_STRUCT_SIZE);
    let mut c: PLUGIN_Profiler_Create_Args = unsafe { std::mem::zeroed() };
    assert_eq!(take(api, unsafe { (api.create.unwrap())(&mut c) }), None);
    let p = c.profiler;
    assert!(!p.is_null());
    let e = on(api, api.stop, p).expect("stop before start");
    assert!(e.0.contains("was not started"), "{e:?}");
    assert_eq!(on(api, api.start, p), None);
    let e = on(api, api.start, p).expect("a second start");
    assert!(e.0.contains("already started"), "{e:?}");
    assert_eq!(e.1, PJRT_Error_Code_FAILED_PRECONDITION as i32);

    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be).unwrap());
    let device = devices(client)[0];
    let exe = xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"bytes".to_vec())
        .unwrap();
    let mut x = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    for _ in 0..3 {
        x = execute(exe, &[x], &[]).unwrap();
    }
    assert_eq!(f32_values(&to_host(x).unwrap()), vec![4.0, 5.0, 6.0, 7.0]);
    assert_eq!(on(api, api.stop, p), None);

    let mut a: PLUGIN_Profiler_CollectData_Args = unsafe { std::mem::zeroed() };
    a.profiler = p;
    assert_eq!(
        take(api, unsafe { (api.collect_data.unwrap())(&mut a) }),
        None
    );
    assert!(a.buffer_size_in_bytes > 0 && !a.buffer.is_null());
    let ours = unsafe { std::slice::from_raw_parts(a.buffer, a.buffer_size_in_bytes) }.to_vec();
    // The older tracer's second call, with its own buffer.
    let mut buf = vec![0u8; a.buffer_size_in_bytes];
    a.buffer = buf.as_mut_ptr();
    assert_eq!(
        take(api, unsafe { (api.collect_data.unwrap())(&mut a) }),
        None
    );
    assert_eq!(buf, ours);

    let space = XSpace::decode(ours.as_slice()).unwrap();
    assert_eq!(space.planes.len(), 1);
    let plane = &space.planes[0];
    assert_eq!(plane.name, "/device:CUSTOM:xla-vmm");
    let events: Vec<(&str, &[xla_vmm::proto::tensorflow::profiler::XStat])> = plane
        .lines
        .iter()
        .flat_map(|l| &l.events)
        .map(|e| {
            (
                plane.event_metadata[&e.metadata_id].name.as_str(),
                e.stats.as_slice(),
            )
        })
        .collect();
    let count = |name: &str| events.iter().filter(|(n, _)| *n == name).count();
    assert_eq!(count("load jit_test"), 1, "{events:?}");
    assert_eq!(count("step jit_test"), 3, "{events:?}");
    assert_eq!(count("launch"), count("bind: apply"), "{events:?}");
    let (_, stats) = events.iter().find(|(n, _)| *n == "step jit_test").unwrap();
    assert_eq!(
        stat_str(plane, stats, "program"),
        Some(&x_stat::Value::StrValue("jit_test".into()))
    );
    assert!(stat_str(plane, stats, "runs as").is_some());
    for l in &plane.lines {
        assert!(
            l.timestamp_ns > 1_600_000_000_000_000_000,
            "wall-clock ns: {}",
            l.timestamp_ns
        );
    }

    let mut d = PLUGIN_Profiler_Args {
        struct_size: 0,
        profiler: p,
    };
    assert_eq!(take(api, unsafe { (api.destroy.unwrap())(&mut d) }), None);
    // Destroyed: a stale pointer is an error naming it, not a read.
    let e = on(api, api.start, p).expect("a destroyed profiler");
    assert!(
        e.0.contains("PLUGIN_Profiler") && e.0.contains("not a live object"),
        "{e:?}"
    );
    assert!(take(api, unsafe { (api.start.unwrap())(std::ptr::null_mut()) }).is_some());
    destroy_buffer(x);
    destroy_exe(exe);
    destroy_client(client);
}

//! Asynchronous execution on the host backend: the client's stream is held
//! (`HostBackend::hold_stream`), so the work `Execute` enqueues stays
//! pending. Execute returns before the work runs; ready events and `OnReady`
//! callbacks fire only after release (callbacks on the completion thread);
//! chained and donating executions are ordered; deleting an in-flight
//! argument is safe; to-host returns the right data; no leaks.
#![allow(unsafe_code)]

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::plans::*;
use common::*;
use xla_vmm_device::HostBackend;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;
use xla_vmm_plugin::runtime::context::{DeviceContext, VmmDevice};

/// Callbacks seen (successes in the low 16 bits, errors above).
static CALLS: AtomicUsize = AtomicUsize::new(0);
static CALLBACK_THREAD_IS_TEST: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn on_ready(err: *mut PJRT_Error, user: *mut c_void) {
    let main = user as usize;
    let here = thread_tag();
    if here == main {
        CALLBACK_THREAD_IS_TEST.fetch_add(1, Ordering::SeqCst);
    }
    match take_error(err) {
        None => CALLS.fetch_add(1, Ordering::SeqCst),
        Some(_) => CALLS.fetch_add(1 << 16, Ordering::SeqCst),
    };
}

fn thread_tag() -> usize {
    thread_local!(static TAG: u8 = const { 0 });
    TAG.with(|t| t as *const u8 as usize)
}

fn on_ready_register(e: *mut PJRT_Event) {
    call_ok!(PJRT_Event_OnReady, PJRT_Event_OnReady_Args, |a| {
        a.event = e;
        a.callback = Some(on_ready);
        a.user_arg = thread_tag() as *mut c_void;
    });
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A client on `be` whose memory runs synchronously or not.
fn host_client(
    be: &Arc<HostBackend>,
    sync: bool,
) -> (
    Arc<VmmDevice<HostBackend>>,
    *mut PJRT_Client,
    *mut PJRT_Device,
) {
    let mem = Arc::new(VmmDevice::new(be.clone()).unwrap().with_sync(sync));
    let client = client::into_c(Client::with_memory(host_options(), mem.clone()).unwrap());
    let device = devices(client)[0];
    (mem, client, device)
}

/// The plugin's registries are per process: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn execute_is_asynchronous_and_ordered() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let be = backend();
    let (mem, client, device) = host_client(&be, false);
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"a1".to_vec()).unwrap();
    let exe_d =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one_donated(), b"a1d".to_vec())
            .unwrap();
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);

    hold(&mem, true);
    // out1 = a + 1, out2 = out1 + 1, out2 += 1 in place (donated): all queued.
    let (out1, done1) = execute_async(exe, &[a], &[]).unwrap();
    let (out2, done2) = execute_async(exe, &[out1], &[]).unwrap();
    let (out3, done3) = execute_async(exe_d, &[out2], &[]).unwrap();
    for e in [done1, done2, done3] {
        assert!(!is_ready(e), "Execute returned after the work completed");
    }
    let r1 = ready_event(out1);
    let r3 = ready_event(out3);
    assert!(!is_ready(r1) && !is_ready(r3));
    let before = CALLS.load(Ordering::SeqCst);
    on_ready_register(r1);
    on_ready_register(r3);
    on_ready_register(done3);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        before,
        "called back before release"
    );
    assert!(mem.pending_completions() >= 3);
    // Deleting an argument whose consumer is still queued: its memory is
    // accounted free at once, reused only after the queued work.
    let in_use = mem.stats().bytes_in_use;
    call_ok!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args, |x| {
        x.buffer = a;
    });
    assert!(mem.stats().bytes_in_use < in_use);
    // Still nothing ran.
    assert!(!is_ready(done1));

    hold(&mem, false);
    assert_eq!(await_event(done3), None);
    for e in [done1, done2, r1, r3] {
        assert_eq!(await_event(e), None);
    }
    wait_for("three callbacks", || {
        CALLS.load(Ordering::SeqCst) == before + 3
    });
    assert_eq!(
        CALLBACK_THREAD_IS_TEST.load(Ordering::SeqCst),
        0,
        "callbacks of device work run on the completion thread"
    );
    assert_eq!(
        f32_values(&to_host(out1).unwrap()),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(
        f32_values(&to_host(out3).unwrap()),
        vec![4.0, 5.0, 6.0, 7.0]
    );
    assert!(to_host(out2).unwrap_err().1.contains("donated"));
    assert!(to_host(a).unwrap_err().1.contains("deleted"));
    wait_for("no pending completions", || mem.pending_completions() == 0);

    // to-host right after an execute (not held): ordered on the stream.
    let (out4, done4) = execute_async(exe, &[out3], &[]).unwrap();
    assert_eq!(
        f32_values(&to_host(out4).unwrap()),
        vec![5.0, 6.0, 7.0, 8.0]
    );
    assert_eq!(await_event(done4), None);

    // Work still queued at client destroy: destroy waits for the stream
    // (here it cannot: the stream is held), stops the completion thread and
    // fails what is still pending instead of hanging.
    hold(&mem, true);
    let (out5, done5) = execute_async(exe, &[out4], &[]).unwrap();
    assert!(!is_ready(done5));
    destroy_client(client);
    let err = await_event(done5).expect("pending work fails at destroy");
    assert!(err.1.contains("destroyed"), "{err:?}");
    hold(&mem, false);

    for e in [done1, done2, done3, done4, done5, r1, r3] {
        destroy_event(e);
    }
    for b in [a, out1, out2, out3, out4, out5] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_exe(exe_d);
    drop(mem);
    let live = xla_vmm_plugin::live_objects();
    assert_eq!((live.buffers, live.events, live.errors), (0, 0, 0));
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn sync_mode_completes_before_returning() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let be = backend();
    let (mem, client, device) = host_client(&be, true);
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"s".to_vec()).unwrap();
    let (out, done) = execute_async(exe, &[a], &[]).unwrap();
    assert!(is_ready(done));
    let r = ready_event(out);
    assert!(is_ready(r));
    assert_eq!(mem.pending_completions(), 0);
    // A held stream cannot drain: synchronous Execute reports it.
    hold(&mem, true);
    assert!(execute_async(exe, &[a], &[]).is_err());
    hold(&mem, false);
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0, 3.0, 4.0, 5.0]);
    destroy_event(done);
    destroy_event(r);
    for b in [a, out] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
}

#[test]
fn host_runs_at_most_max_in_flight_ahead() {
    use xla_vmm_plugin::runtime::context::MAX_IN_FLIGHT;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let be = backend();
    let (mem, client, device) = host_client(&be, false);
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"t".to_vec()).unwrap();
    hold(&mem, true);
    let mut made = Vec::new();
    for _ in 0..MAX_IN_FLIGHT {
        made.push(execute_async(exe, &[a], &[]).unwrap());
    }
    // One more blocks until the device catches up.
    let finished = Arc::new(AtomicUsize::new(0));
    let (f, exe_p, a_p) = (finished.clone(), exe as usize, a as usize);
    let t = std::thread::spawn(move || {
        let r = execute_async(exe_p as *mut _, &[a_p as *mut _], &[]).unwrap();
        f.store(1, Ordering::SeqCst);
        (r.0 as usize, r.1 as usize)
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(finished.load(Ordering::SeqCst), 0, "Execute did not wait");
    hold(&mem, false);
    let (out, done) = t.join().unwrap();
    made.push((out as *mut _, done as *mut _));
    for (out, done) in made {
        assert_eq!(await_event(done), None);
        assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0, 3.0, 4.0, 5.0]);
        destroy_event(done);
        destroy_buffer(out);
    }
    destroy_buffer(a);
    destroy_exe(exe);
    destroy_client(client);
}

//! The generated abuse suite of the C API (issue 13): every entry of the
//! table (`xla_vmm_plugin::raw::ENTRIES`, generated from `api.rs`, so a new
//! entry is covered without a line here) is called with each argument
//! pattern below, each case in a child process of this test binary, so
//! that a crash or a hang is a failed case naming the entry and pattern,
//! not a dead test runner.
//!
//! Patterns: a null, a misaligned or a too-short args struct; zeroed args
//! (exact size, and a newer caller's longer struct); and every field after
//! the header filled with one value: garbage addresses (non-canonical, the
//! null page, all ones), handles destroyed before the call (buffer, event,
//! executable, execute context, a whole client with its devices), and live
//! handles of every kind (the wrong kind for most fields). Counts and
//! lengths then hold the same value: absurd, or a pointer. (A caller's
//! function pointer cannot be checked: see [`CALLS_CALLER_FUNCTION`].)
//!
//! Each call must return (no crash, no hang past [`CASE_TIMEOUT`]); an
//! error must name the entry and must not be INTERNAL (a caught panic).
//! Run one case by hand: `XLA_VMM_ABUSE_CASE=N cargo test -p
//! xla-vmm-plugin --test abuse_generated one_case -- --exact --nocapture`.
#![allow(unsafe_code)]

mod common;

use std::ffi::c_void;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::plans::*;
use common::*;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;
use xla_vmm_plugin::raw::ENTRIES;

const CASE_TIMEOUT: Duration = Duration::from_secs(30);
const CASE_ENV: &str = "XLA_VMM_ABUSE_CASE";

#[derive(Clone, Copy, Debug)]
enum Fill {
    Garbage(u64),
    Destroyed(Kind),
    Live(Kind),
}

/// The handle kinds, and [`Kind::ALL`] (every one, for the live-handle
/// patterns): one list, so a new kind is abused too.
macro_rules! kinds {
    ($($k:ident),*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Kind { $($k),* }
        impl Kind {
            const ALL: &'static [Kind] = &[$(Kind::$k),*];
        }
    };
}
kinds!(
    Client,
    Device,
    Description,
    Memory,
    Buffer,
    Event,
    LoadedExecutable,
    Executable,
    Topology,
    Context
);

#[derive(Clone, Copy, Debug)]
enum Pattern {
    NullArgs,
    Misaligned,
    StructSize(usize),
    Zeroed,
    ZeroedNewer,
    Every(Fill),
}

fn patterns() -> Vec<Pattern> {
    use Kind::*;
    let mut p = vec![
        Pattern::NullArgs,
        Pattern::Misaligned,
        Pattern::StructSize(0),
        Pattern::StructSize(8),
        Pattern::StructSize(15),
        Pattern::Zeroed,
        Pattern::ZeroedNewer,
    ];
    for g in [0xdead_beef_dead_beef, 0x8000_0000_0000_0000, u64::MAX, 0x10] {
        p.push(Pattern::Every(Fill::Garbage(g)));
    }
    for k in [Buffer, Event, LoadedExecutable, Context, Client] {
        p.push(Pattern::Every(Fill::Destroyed(k)));
    }
    for &k in Kind::ALL {
        p.push(Pattern::Every(Fill::Live(k)));
    }
    p
}

/// Entries that call a function the caller passes (its address is not
/// checkable: a ctypes or JIT callback lives in anonymous memory): with
/// live handles in every field they would call a handle. Their other
/// patterns run.
const CALLS_CALLER_FUNCTION: &[&str] = &["PJRT_Event_OnReady"];

fn applies(entry: usize, p: Pattern) -> bool {
    !(CALLS_CALLER_FUNCTION.contains(&ENTRIES[entry].name)
        && matches!(p, Pattern::Every(Fill::Live(_))))
}

/// Every (entry index, pattern) case, in order.
fn cases() -> Vec<(usize, Pattern)> {
    (0..ENTRIES.len())
        .flat_map(|e| patterns().into_iter().map(move |p| (e, p)))
        .filter(|&(e, p)| applies(e, p))
        .collect()
}

/// (entry index, pattern) of case `n`.
fn case(n: usize) -> (usize, Pattern) {
    cases()[n]
}

fn num_cases() -> usize {
    cases().len()
}

/// Handles of every kind on a host client, and some destroyed ones.
struct Objects {
    client: *mut PJRT_Client,
    device: *mut PJRT_Device,
    description: *mut PJRT_DeviceDescription,
    memory: *mut PJRT_Memory,
    buffer: *mut PJRT_Buffer,
    event: *mut PJRT_Event,
    loaded: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
    topology: *mut PJRT_TopologyDescription,
    context: *mut PJRT_ExecuteContext,
    dead: Vec<(Kind, usize)>,
}

fn context() -> *mut PJRT_ExecuteContext {
    let c = call_ok!(
        PJRT_ExecuteContext_Create,
        PJRT_ExecuteContext_Create_Args,
        |a| {}
    );
    c.context
}

fn objects() -> Objects {
    let client = client::into_c(Client::with_backend(host_options(), backend()).unwrap());
    let device = devices(client)[0];
    let (_, d) = call!(
        PJRT_Device_GetDescription,
        PJRT_Device_GetDescription_Args,
        |a| {
            a.device = device;
        }
    );
    let (_, m) = call!(
        PJRT_Device_DefaultMemory,
        PJRT_Device_DefaultMemory_Args,
        |a| {
            a.device = device;
        }
    );
    let buffer = put_f32(client, device, &[1.0; 4]);
    let event = ready_event(buffer);
    let loaded = xla_vmm_plugin::objects::executable::load_plan(client, add_one(), vec![]).unwrap();
    let executable = executable_of(loaded);
    let (_, t) = call!(
        PJRT_Client_TopologyDescription,
        PJRT_Client_TopologyDescription_Args,
        |a| {
            a.client = client;
        }
    );
    // Destroyed before use: each kind once.
    let dead_buffer = put_f32(client, device, &[2.0; 4]);
    destroy_buffer(dead_buffer);
    let dead_event = ready_event(buffer);
    destroy_event(dead_event);
    let dead_loaded =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), vec![]).unwrap();
    destroy_exe(dead_loaded);
    let dead_context = context();
    call_ok!(
        PJRT_ExecuteContext_Destroy,
        PJRT_ExecuteContext_Destroy_Args,
        |a| {
            a.context = dead_context;
        }
    );
    let gone = client::into_c(Client::with_backend(host_options(), backend()).unwrap());
    destroy_client(gone);
    Objects {
        client,
        device,
        description: d.device_description,
        memory: m.memory,
        buffer,
        event,
        loaded,
        executable,
        topology: t.topology,
        context: context(),
        dead: vec![
            (Kind::Buffer, dead_buffer as usize),
            (Kind::Event, dead_event as usize),
            (Kind::LoadedExecutable, dead_loaded as usize),
            (Kind::Context, dead_context as usize),
            (Kind::Client, gone as usize),
        ],
    }
}

impl Objects {
    fn live(&self, k: Kind) -> u64 {
        (match k {
            Kind::Client => self.client as usize,
            Kind::Device => self.device as usize,
            Kind::Description => self.description as usize,
            Kind::Memory => self.memory as usize,
            Kind::Buffer => self.buffer as usize,
            Kind::Event => self.event as usize,
            Kind::LoadedExecutable => self.loaded as usize,
            Kind::Executable => self.executable as usize,
            Kind::Topology => self.topology as usize,
            Kind::Context => self.context as usize,
        }) as u64
    }

    fn dead(&self, k: Kind) -> u64 {
        self.dead
            .iter()
            .find(|(d, _)| *d == k)
            .map(|(_, p)| *p as u64)
            .unwrap()
    }
}

/// Run case `n` in this process: the call, and the checks on its error.
fn run_case(n: usize) {
    let (entry, pattern) = case(n);
    let e = &ENTRIES[entry];
    let objs = objects();
    // Room for the struct and a newer caller's longer one, 8-aligned.
    let words = e.struct_size.div_ceil(8) * 2 + 16;
    let mut buf = vec![0u64; words + 1];
    let base = buf.as_mut_ptr();
    let mut size = e.struct_size;
    let fill = match pattern {
        Pattern::Every(Fill::Garbage(v)) => Some(v),
        Pattern::Every(Fill::Destroyed(k)) => Some(objs.dead(k)),
        Pattern::Every(Fill::Live(k)) => Some(objs.live(k)),
        _ => None,
    };
    match pattern {
        Pattern::StructSize(s) => size = s,
        Pattern::ZeroedNewer => size = e.struct_size * 2 + 64,
        _ => {}
    }
    if let Some(v) = fill {
        // Every field after struct_size and extension_start.
        for w in buf.iter_mut().take(e.struct_size.div_ceil(8)).skip(2) {
            *w = v;
        }
    }
    buf[0] = size as u64;
    let args: *mut c_void = match pattern {
        Pattern::NullArgs => std::ptr::null_mut(),
        Pattern::Misaligned => unsafe { base.cast::<u8>().add(1).cast() },
        _ => base.cast(),
    };
    println!("case {n}: {} {pattern:?}", e.name);
    let err = unsafe { (e.call)(args) };
    if let Some((code, msg)) = take_error(err) {
        assert!(
            msg.starts_with(e.name),
            "{} {pattern:?}: an error without the entry's name: {msg}",
            e.name
        );
        assert_ne!(
            code, PJRT_Error_Code_INTERNAL,
            "{} {pattern:?}: INTERNAL (a caught panic?): {msg}",
            e.name
        );
    }
    println!("ABUSE-CASE-DONE");
}

/// One case, when the parent names it (a no-op otherwise).
#[test]
fn one_case() {
    if let Ok(n) = std::env::var(CASE_ENV) {
        run_case(n.parse().expect("case number"));
    }
}

#[test]
fn every_entry_survives_every_abuse_pattern_in_its_own_process() {
    if std::env::var(CASE_ENV).is_ok() {
        return;
    }
    let n = num_cases();
    assert!(n >= 500, "{n} cases: the suite should have at least 500");
    let exe = std::env::current_exe().unwrap();
    let parallel = std::thread::available_parallelism().map_or(2, |p| p.get() * 2);
    let mut failures = Vec::new();
    let mut running: Vec<(usize, std::process::Child, Instant)> = Vec::new();
    let mut next = 0;
    while next < n || !running.is_empty() {
        while next < n && running.len() < parallel {
            let child = Command::new(&exe)
                .args(["one_case", "--exact", "--nocapture", "--test-threads=1"])
                .env(CASE_ENV, next.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a case");
            running.push((next, child, Instant::now()));
            next += 1;
        }
        let mut i = 0;
        while i < running.len() {
            let (k, child, start) = &mut running[i];
            match child.try_wait().unwrap() {
                Some(_) => {
                    let (k, child, _) = running.swap_remove(i);
                    let out = child.wait_with_output().unwrap();
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    if !out.status.success() || !stdout.contains("ABUSE-CASE-DONE") {
                        let (entry, pattern) = case(k);
                        let tail: String = String::from_utf8_lossy(&out.stderr)
                            .lines()
                            .chain(stdout.lines())
                            .filter(|l| {
                                l.contains("panicked") || l.contains("case ") || l.contains(':')
                            })
                            .take(4)
                            .collect::<Vec<_>>()
                            .join(" | ");
                        failures.push(format!(
                            "case {k}: {} {pattern:?}: {} {tail}",
                            ENTRIES[entry].name, out.status
                        ));
                    }
                }
                None if start.elapsed() > CASE_TIMEOUT => {
                    let _ = child.kill();
                    let (entry, pattern) = case(*k);
                    failures.push(format!(
                        "case {k}: {} {pattern:?}: hung (killed after {CASE_TIMEOUT:?})",
                        ENTRIES[entry].name
                    ));
                    let (_, mut child, _) = running.swap_remove(i);
                    let _ = child.wait();
                }
                None => i += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Handles destroyed by another thread while calls on them are in flight:
/// each call succeeds or names the dead handle; none crashes.
#[test]
fn handles_destroyed_concurrently_with_calls_on_them() {
    if std::env::var(CASE_ENV).is_ok() {
        return;
    }
    let client = client::into_c(Client::with_backend(host_options(), backend()).unwrap());
    let device = devices(client)[0];
    let exe = xla_vmm_plugin::objects::executable::load_plan(client, add_one(), vec![]).unwrap();
    for round in 0..50 {
        let b = put_f32(client, device, &[round as f32; 4]) as usize;
        let e = exe as usize;
        let user = std::thread::spawn(move || {
            let (b, e) = (b as *mut PJRT_Buffer, e as *mut PJRT_LoadedExecutable);
            let mut outcomes = Vec::new();
            for _ in 0..20 {
                outcomes.push(to_host(b).map(|_| ()));
                outcomes.push(execute(e, &[b], &[0]).map(destroy_buffer));
            }
            outcomes
        });
        std::thread::sleep(Duration::from_micros(50 * (round % 5)));
        destroy_buffer(b as *mut PJRT_Buffer);
        for r in user.join().expect("the calling thread died") {
            if let Err((_, msg)) = r {
                assert!(
                    msg.contains("not a live object") || msg.contains("deleted"),
                    "round {round}: {msg}"
                );
            }
        }
    }
    destroy_exe(exe);
    destroy_client(client);
}

/// What JAX's `test_cache_miss_explanations_are_thread_safe` does to a
/// plugin, on the host backend: ten threads at once loading programs,
/// uploading, executing with an execute context each (as jaxlib does for a
/// CUDA-named client), reading back and destroying. (That test died once
/// with SIGSEGV on the GPU at 51dfcbd; this does not reproduce it here.)
#[test]
fn ten_threads_load_execute_and_destroy_at_once() {
    if std::env::var(CASE_ENV).is_ok() {
        return;
    }
    let be = backend();
    let client = client::into_c(Client::with_backend(host_options(), be.clone()).unwrap());
    let device = devices(client)[0];
    let (c, d) = (client as usize, device as usize);
    let threads: Vec<_> = (0..10)
        .map(|t| {
            std::thread::spawn(move || {
                let (client, device) = (c as *mut PJRT_Client, d as *mut PJRT_Device);
                for i in 0..20 {
                    let exe =
                        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), vec![])
                            .unwrap();
                    let x = put_f32(client, device, &[(t * 100 + i) as f32; 4]);
                    let ctx = context();
                    let args = [x];
                    let mut out: *mut PJRT_Buffer = std::ptr::null_mut();
                    let done = RawExecute {
                        context: ctx,
                        ..RawExecute::new(&args)
                    }
                    .run(exe, &mut out)
                    .unwrap();
                    call_ok!(
                        PJRT_ExecuteContext_Destroy,
                        PJRT_ExecuteContext_Destroy_Args,
                        |a| {
                            a.context = ctx;
                        }
                    );
                    assert_eq!(await_event(done), None);
                    destroy_event(done);
                    let want = (t * 100 + i) as f32 + 1.0;
                    assert_eq!(f32_values(&to_host(out).unwrap()), vec![want; 4]);
                    destroy_buffer(x);
                    destroy_buffer(out);
                    destroy_exe(exe);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread died");
    }
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

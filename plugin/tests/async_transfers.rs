//! Transfers do not wait for the work queued on the client's stream (a
//! training step in flight).
//! - `BufferFromHostBuffer`: the bytes are staged in pinned memory, the
//!   device copy is enqueued behind the step, and the buffer is ready when
//!   it lands. On the host backend with the stream held: the call returns
//!   while nothing can run, the caller may overwrite its array at once, two
//!   uploads in flight get their own staging buffers, staging memory is
//!   reused once copies land, executions see the uploaded data, and nothing
//!   leaks.
//! - `ToHostBuffer` of a buffer whose producer has completed (the loss of
//!   step i while step i+1 runs) reads it on a transfer stream, without
//!   waiting for the queued step; one whose producer is still queued waits
//!   for it.
#![allow(unsafe_code)]

mod common;

use std::sync::Arc;

use common::plans::*;
use common::*;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;
use xla_vmm_plugin::runtime::context::VmmDevice;

/// Is `b`'s ready event complete?
fn buffer_ready(b: *mut PJRT_Buffer) -> bool {
    let e = ready_event(b);
    let r = is_ready(e);
    destroy_event(e);
    r
}

/// Wait for `b`'s ready event.
fn await_ready(b: *mut PJRT_Buffer) {
    let e = ready_event(b);
    assert_eq!(await_event(e), None);
    destroy_event(e);
}

fn f32_put(client: *mut PJRT_Client, device: *mut PJRT_Device, data: &[u8]) -> *mut PJRT_Buffer {
    from_host(
        client,
        device,
        PJRT_Buffer_Type_F32,
        &[(data.len() / 4) as i64],
        data,
        None,
    )
    .unwrap()
}

#[test]
fn uploads_do_not_wait_for_queued_work_and_keep_their_data() {
    let be = backend();
    let mem = Arc::new(VmmDevice::new(be.clone()).unwrap());
    let client = client::into_c(Client::with_memory(host_options(), mem.clone()).unwrap());
    let device = devices(client)[0];
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"up".to_vec()).unwrap();
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);

    // A step in flight that cannot finish (held stream): uploads still return.
    hold(&mem, true);
    let (out, done) = execute_async(exe, &[a], &[]).unwrap();
    let mut host1 = f32_bytes(&[10.0, 20.0, 30.0, 40.0]);
    let mut host2 = f32_bytes(&[5.0, 6.0, 7.0, 8.0]);
    let b1 = f32_put(client, device, &host1);
    let b2 = f32_put(client, device, &host2);
    // The arrays are the caller's again: overwrite them.
    host1.iter_mut().for_each(|x| *x = 0xee);
    host2.iter_mut().for_each(|x| *x = 0xdd);
    assert!(
        !buffer_ready(b1) && !buffer_ready(b2),
        "an upload completed under a held stream"
    );
    let staged = be.call_count("host_alloc");
    assert!(
        staged >= 2,
        "two uploads in flight need two staging buffers"
    );
    // The next step reads an upload still in flight: stream order.
    let (out2, done2) = execute_async(exe, &[b1], &[]).unwrap();
    hold(&mem, false);

    assert_eq!(await_event(done), None);
    assert_eq!(await_event(done2), None);
    assert_eq!(
        f32_values(&to_host(b1).unwrap()),
        vec![10.0, 20.0, 30.0, 40.0]
    );
    assert_eq!(f32_values(&to_host(b2).unwrap()), vec![5.0, 6.0, 7.0, 8.0]);
    assert_eq!(f32_values(&to_host(out).unwrap()), vec![2.0, 3.0, 4.0, 5.0]);
    assert_eq!(
        f32_values(&to_host(out2).unwrap()),
        vec![11.0, 21.0, 31.0, 41.0]
    );

    // Once a copy has landed its staging buffer is reused: a loop of
    // uploads, each awaited (its ready event completes after the buffer went
    // back to the pool), allocates no more pinned memory.
    for b in [b1, b2] {
        await_ready(b);
    }
    let before = be.call_count("host_alloc");
    for i in 0..20 {
        let v = [i as f32; 4];
        let b = put_f32(client, device, &v);
        await_ready(b);
        assert_eq!(f32_values(&to_host(b).unwrap()), v.to_vec());
        destroy_buffer(b);
    }
    assert!(
        be.call_count("host_alloc") <= before + 1,
        "staging memory not reused: {} host_alloc calls for 20 uploads",
        be.call_count("host_alloc") - before
    );

    for e in [done, done2] {
        destroy_event(e);
    }
    for b in [a, b1, b2, out, out2] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    drop(mem);
    // Staging buffers are freed with the client's memory.
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn synchronous_mode_uploads_synchronously() {
    let be = backend();
    let mem = Arc::new(VmmDevice::new(be.clone()).unwrap().with_sync(true));
    let client = client::into_c(Client::with_memory(host_options(), mem.clone()).unwrap());
    let device = devices(client)[0];
    let b = put_f32(client, device, &[1.5, 2.5]);
    assert!(buffer_ready(b));
    assert_eq!(
        be.call_count("host_alloc"),
        0,
        "no staging in synchronous mode"
    );
    assert_eq!(f32_values(&to_host(b).unwrap()), vec![1.5, 2.5]);
    destroy_buffer(b);
    destroy_client(client);
    drop(mem);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

#[test]
fn reading_a_finished_output_does_not_wait_for_the_next_step() {
    let be = backend();
    let mem = Arc::new(VmmDevice::new(be.clone()).unwrap());
    let client = client::into_c(Client::with_memory(host_options(), mem.clone()).unwrap());
    let device = devices(client)[0];
    let exe =
        xla_vmm_plugin::objects::executable::load_plan(client, add_one(), b"rd".to_vec()).unwrap();
    let a = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let (out1, done1) = execute_async(exe, &[a], &[]).unwrap();
    assert_eq!(await_event(done1), None);
    // Step 2 queued behind a held stream; step 1's output is read meanwhile.
    hold(&mem, true);
    let (out2, done2) = execute_async(exe, &[out1], &[]).unwrap();
    assert_eq!(
        f32_values(&to_host(out1).unwrap()),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    // Its producer still queued: a read of step 2's output waits for it
    // (on another thread, released below).
    let handle = out2 as usize;
    let reader =
        std::thread::spawn(move || f32_values(&to_host(handle as *mut PJRT_Buffer).unwrap()));
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(
        !reader.is_finished(),
        "read an output whose step had not run"
    );
    hold(&mem, false);
    assert_eq!(reader.join().unwrap(), vec![3.0, 4.0, 5.0, 6.0]);
    assert_eq!(await_event(done2), None);
    for e in [done1, done2] {
        destroy_event(e);
    }
    for b in [a, out1, out2] {
        destroy_buffer(b);
    }
    destroy_exe(exe);
    destroy_client(client);
    drop(mem);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

/// Issue 34's threads check on the host backend: 8 threads, each with its
/// own program and array size (small buffers of several size classes),
/// upload an array, run the program on it and read the result back, over
/// and over, at once on one device: every result is its own input plus
/// one (no staging buffer, slot or output shared by two threads at once),
/// and nothing leaks; then again with the stream held and let go in turns.
#[test]
fn eight_threads_uploading_running_and_reading_back_each_get_their_own_bytes() {
    for lagging in [false, true] {
        eight_threads(lagging);
    }
}

/// [`eight_threads_uploading_running_and_reading_back_each_get_their_own_bytes`],
/// `lagging`: with a ninth thread holding the client's stream and letting
/// it go in turns (a device behind the host: work queues up, uploads and
/// steps stay in flight while the threads go on).
fn eight_threads(lagging: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let be = backend();
    let mem = Arc::new(VmmDevice::new(be.clone()).unwrap());
    let client = client::into_c(Client::with_memory(host_options(), mem.clone()).unwrap());
    let device = devices(client)[0] as usize;
    let c = client as usize;
    let done = AtomicBool::new(false);
    // Loaded first: a load waits for the stream (the host backend's held
    // stream cannot be waited for).
    let exes: Vec<usize> = (0..8u64)
        .map(|w| {
            xla_vmm_plugin::objects::executable::load_plan(
                client,
                add_one_n(1024 + 768 * w),
                format!("threads-{w}").into_bytes(),
            )
            .unwrap() as usize
        })
        .collect();
    std::thread::scope(|s| {
        if lagging {
            let (mem, done) = (&mem, &done);
            s.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    hold(mem, true);
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    hold(mem, false);
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            });
        }
        let workers: Vec<_> = (0..8u64)
            .map(|w| {
                let exes = &exes;
                s.spawn(move || {
                    let (client, device) = (c as *mut PJRT_Client, device as *mut PJRT_Device);
                    let n = 1024 + 768 * w;
                    let exe = exes[w as usize] as *mut PJRT_LoadedExecutable;
                    for i in 0..1000u64 {
                        let v: Vec<f32> = (0..n).map(|j| ((w << 16) + i * 97 + j) as f32).collect();
                        let x = put_f32(client, device, &v);
                        let out = execute(exe, &[x], &[]).unwrap();
                        destroy_buffer(x);
                        let got = f32_values(&to_host(out).unwrap());
                        destroy_buffer(out);
                        let want: Vec<f32> = v.iter().map(|a| a + 1.0).collect();
                        assert!(got == want, "thread {w}, iteration {i}");
                    }
                })
            })
            .collect();
        for t in workers {
            if let Err(e) = t.join() {
                done.store(true, Ordering::Release);
                std::panic::resume_unwind(e);
            }
        }
        done.store(true, Ordering::Release);
    });
    for exe in exes {
        destroy_exe(exe as *mut PJRT_LoadedExecutable);
    }
    destroy_client(client);
    drop(mem);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

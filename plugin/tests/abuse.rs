//! Careless callers of the C API (issue 13's list): absurd lengths, bad
//! enums, unbalanced reference counts, events that are not the caller's,
//! wrong argument counts. Each call returns a PJRT error naming what is
//! wrong, promptly, and the process goes on (host backend).
#![allow(unsafe_code)]

mod common;

use std::time::{Duration, Instant};

use common::plans::*;
use common::*;
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;

fn host_client() -> *mut PJRT_Client {
    client::into_c(Client::with_backend(host_options(), backend()).unwrap())
}

fn code_and(e: Option<(u32, String)>, want: &str) -> u32 {
    let (code, msg) = e.expect("an error");
    assert!(msg.contains(want), "{msg:?} should mention {want:?}");
    code
}

#[test]
fn absurd_dims_and_unknown_semantics_are_errors_not_aborts() {
    let client = host_client();
    let device = devices(client)[0];
    let data = [0u8; 16];
    let dims = [4i64];
    for (what, num_dims, semantics, want) in [
        (
            "2^40 dims",
            1usize << 40,
            PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
            "dims: 1099511627776 elements",
        ),
        (
            "65 dims",
            65,
            PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
            "at most 64",
        ),
        ("semantics 99", 1, 99, "host_buffer_semantics = 99"),
    ] {
        let t = Instant::now();
        let (err, _) = call!(
            PJRT_Client_BufferFromHostBuffer,
            PJRT_Client_BufferFromHostBuffer_Args,
            |a| {
                a.client = client;
                a.data = data.as_ptr().cast();
                a.type_ = PJRT_Buffer_Type_F32;
                a.dims = dims.as_ptr();
                a.num_dims = num_dims;
                a.host_buffer_semantics = semantics;
                a.device = device;
            }
        );
        assert_eq!(
            code_and(err, want),
            PJRT_Error_Code_INVALID_ARGUMENT,
            "{what}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{what}: answered at once"
        );
    }
    destroy_client(client);
}

#[test]
fn default_assignment_needs_positive_counts() {
    let client = host_client();
    let mut out = [0i32; 4];
    for (r, p) in [(0, 1), (-1, 1), (1, 0), (2, -3)] {
        let (err, _) = call!(
            PJRT_Client_DefaultDeviceAssignment,
            PJRT_Client_DefaultDeviceAssignment_Args,
            |a| {
                a.client = client;
                a.num_replicas = r;
                a.num_partitions = p;
                a.default_assignment_size = out.len();
                a.default_assignment = out.as_mut_ptr();
            }
        );
        code_and(err, "must be at least 1");
    }
    call_ok!(
        PJRT_Client_DefaultDeviceAssignment,
        PJRT_Client_DefaultDeviceAssignment_Args,
        |a| {
            a.client = client;
            a.num_replicas = 1;
            a.num_partitions = 1;
            a.default_assignment_size = out.len();
            a.default_assignment = out.as_mut_ptr();
        }
    );
    destroy_client(client);
}

#[test]
fn external_references_cannot_go_below_zero() {
    let client = host_client();
    let b = put_f32(client, devices(client)[0], &[1.0, 2.0]);
    code_and(external_ref(b, false), "without a matching increase");
    assert_eq!(external_ref(b, true), None);
    assert_eq!(external_ref(b, true), None);
    assert_eq!(external_ref(b, false), None);
    assert_eq!(external_ref(b, false), None);
    code_and(external_ref(b, false), "the count is 0");
    destroy_buffer(b);
    destroy_client(client);
}

fn set_event(e: *mut PJRT_Event) -> Option<(u32, String)> {
    call!(PJRT_Event_Set, PJRT_Event_Set_Args, |a| {
        a.event = e;
        a.error_code = PJRT_Error_Code_OK;
    })
    .0
}

#[test]
fn only_the_callers_own_events_may_be_set() {
    let client = host_client();
    let b = put_f32(client, devices(client)[0], &[1.0]);
    let ours = ready_event(b);
    code_and(set_event(ours), "an event the plugin made");
    destroy_event(ours);
    let created = call_ok!(PJRT_Event_Create, PJRT_Event_Create_Args, |a| {});
    assert_eq!(set_event(created.event), None);
    assert!(is_ready(created.event));
    destroy_event(created.event);
    destroy_buffer(b);
    destroy_client(client);
}

#[test]
fn absurd_host_device_counts_are_refused_at_once() {
    use common::multi::{create, Opt};
    let t = Instant::now();
    let err = create(
        &[
            ("backend", Opt::Str("host")),
            ("host_devices", Opt::Int(100_000)),
        ],
        None,
    )
    .unwrap_err();
    code_and(Some(err), "at most 256 devices");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn execute_checks_its_counts_before_reading_the_lists() {
    let client = host_client();
    let device = devices(client)[0];
    let exe = xla_vmm_plugin::objects::executable::load_plan(client, add_one(), vec![]).unwrap();
    let x = put_f32(client, device, &[1.0, 2.0, 3.0, 4.0]);
    let args = [x];
    // A huge num_args over a one-element list: refused before it is read.
    let err = execute_async_claiming(exe, &args, &[], 1 << 40).err();
    code_and(err, "takes 1 arguments, 1099511627776 given (num_args)");
    // Non-donatable indices outside the argument list.
    for bad in [&[5i64][..], &[-1][..]] {
        let e = execute(exe, &args, bad).unwrap_err();
        assert!(e.1.contains("is not an argument index"), "{e:?}");
    }
    let y = execute(exe, &args, &[0]).unwrap();
    destroy_buffer(y);
    destroy_buffer(x);
    destroy_exe(exe);
    destroy_client(client);
}

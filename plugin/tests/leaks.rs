//! No leaks: after a client's buffers, events and errors are destroyed and
//! the client is destroyed, the host backend holds nothing and the plugin
//! registries are empty. Its own test binary (one test), so the process-wide
//! registries are not shared with other tests.
#![allow(unsafe_code)]

mod common;

use std::sync::Arc;

use common::*;
use xla_vmm_device::{HostBackend, HostConfig};
use xla_vmm_plugin::objects::client::{self, Client};
use xla_vmm_plugin::pjrt::*;

#[test]
fn client_teardown_releases_everything() {
    let backend = Arc::new(HostBackend::new(HostConfig::default()).unwrap());
    let client = client::into_c(Client::with_backend(host_options(), backend.clone()).unwrap());
    let device = devices(client)[0];
    let mut bufs = Vec::new();
    for (i, n) in [1usize, 100, 70_000, 3 << 20].into_iter().enumerate() {
        let data = vec![i as u8; n * 4];
        bufs.push(
            from_host(
                client,
                device,
                PJRT_Buffer_Type_F32,
                &[n as i64],
                &data,
                None,
            )
            .unwrap(),
        );
    }
    let stats = call_ok!(PJRT_Device_MemoryStats, PJRT_Device_MemoryStats_Args, |a| {
        a.device = device;
    });
    assert_eq!(stats.num_allocs, 4);
    assert!(stats.bytes_in_use >= (3 << 20) * 4);
    // An error object and a deleted buffer along the way.
    call_ok!(PJRT_Buffer_Delete, PJRT_Buffer_Delete_Args, |a| {
        a.buffer = bufs[0];
    });
    assert!(to_host(bufs[0]).is_err());
    let (err, stats) = call!(PJRT_Device_MemoryStats, PJRT_Device_MemoryStats_Args, |a| {
        a.device = device;
    });
    assert_eq!(
        (err, stats.num_allocs),
        (None, 3),
        "delete frees the memory"
    );
    for b in bufs {
        destroy_buffer(b);
    }
    let stats = call_ok!(PJRT_Device_MemoryStats, PJRT_Device_MemoryStats_Args, |a| {
        a.device = device;
    });
    assert_eq!((stats.num_allocs, stats.bytes_in_use), (0, 0));
    destroy_client(client);
    let live = xla_vmm_plugin::live_objects();
    assert_eq!((live.buffers, live.events, live.errors), (0, 0, 0));
    let out = backend.outstanding();
    assert_eq!(out.total(), 0, "host backend still holds {out:?}");
}

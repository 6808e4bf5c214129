//! Calls into the plugin through the table `GetPjrtApi` returns, the way
//! jaxlib does: fill an args struct with `struct_size`, call the slot, turn
//! a returned `PJRT_Error` into (code, message) and destroy it.
#![allow(dead_code, unsafe_code)]

use std::ffi::c_void;
use std::mem::zeroed;
use std::ptr::null_mut;

use xla_vmm_device::HostBackend;
use xla_vmm_plugin::cabi::options::{BackendKind, ClientOptions};
use xla_vmm_plugin::pjrt::*;
use xla_vmm_plugin::runtime::context::VmmDevice;

pub mod multi;
pub mod plans;

pub fn api() -> &'static PJRT_Api {
    // SAFETY: GetPjrtApi returns a pointer to a static table.
    unsafe { &*xla_vmm_plugin::GetPjrtApi() }
}

/// Turn a returned error into (code, message), destroying it.
pub fn take_error(err: *mut PJRT_Error) -> Option<(u32, String)> {
    if err.is_null() {
        return None;
    }
    let api = api();
    unsafe {
        let mut m: PJRT_Error_Message_Args = zeroed();
        m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE as usize;
        m.error = err;
        (api.PJRT_Error_Message.unwrap())(&mut m);
        let msg = String::from_utf8_lossy(std::slice::from_raw_parts(
            m.message.cast::<u8>(),
            m.message_size,
        ))
        .into_owned();
        let mut c: PJRT_Error_GetCode_Args = zeroed();
        c.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE as usize;
        c.error = err;
        assert!((api.PJRT_Error_GetCode.unwrap())(&mut c).is_null());
        let mut d: PJRT_Error_Destroy_Args = zeroed();
        d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE as usize;
        d.error = err;
        (api.PJRT_Error_Destroy.unwrap())(&mut d);
        Some((c.code, msg))
    }
}

/// Call `slot` with a zeroed args struct that `fill` completes.
macro_rules! call {
    ($slot:ident, $args:ident, |$a:ident| $fill:block) => {{
        #[allow(unused_unsafe)]
        unsafe {
            let mut $a: xla_vmm_plugin::pjrt::$args = std::mem::zeroed();
            $a.struct_size = paste_size!($args);
            $fill;
            let err = ($crate::common::api().$slot.unwrap())(&mut $a);
            ($crate::common::take_error(err), $a)
        }
    }};
}
pub(crate) use call;

/// [`call!`] for a call that must succeed: asserts it returned no error
/// (naming the entry) and gives back the args struct with its outputs.
macro_rules! call_ok {
    ($slot:ident, $args:ident, |$a:ident| $fill:block) => {{
        let (err, out) = $crate::common::call!($slot, $args, |$a| $fill);
        assert_eq!(err, None, "{}", stringify!($slot));
        out
    }};
}
pub(crate) use call_ok;

/// The header's STRUCT_SIZE of an args type (bindgen exposes it as a const).
macro_rules! paste_size {
    ($args:ident) => {
        $crate::common::struct_size_of::<xla_vmm_plugin::pjrt::$args>()
    };
}
pub(crate) use paste_size;

/// `size_of` works as the struct size for callers: it is never smaller than
/// the header's STRUCT_SIZE (only trailing padding differs).
pub const fn struct_size_of<T>() -> usize {
    std::mem::size_of::<T>()
}

pub fn create_client(backend: &str) -> Result<*mut PJRT_Client, (u32, String)> {
    let name = "backend";
    let mut opt: PJRT_NamedValue = unsafe { zeroed() };
    opt.struct_size = PJRT_NamedValue_STRUCT_SIZE as usize;
    opt.name = name.as_ptr().cast();
    opt.name_size = name.len();
    opt.type_ = PJRT_NamedValue_kString;
    opt.__bindgen_anon_1.string_value = backend.as_ptr().cast();
    opt.value_size = backend.len();
    let (err, a) = call!(PJRT_Client_Create, PJRT_Client_Create_Args, |a| {
        a.create_options = &opt;
        a.num_options = 1;
    });
    match err {
        Some(e) => Err(e),
        None => Ok(a.client),
    }
}

pub fn destroy_client(client: *mut PJRT_Client) {
    call_ok!(PJRT_Client_Destroy, PJRT_Client_Destroy_Args, |a| {
        a.client = client;
    });
}

pub fn devices(client: *mut PJRT_Client) -> Vec<*mut PJRT_Device> {
    let a = call_ok!(PJRT_Client_Devices, PJRT_Client_Devices_Args, |a| {
        a.client = client;
    });
    unsafe { std::slice::from_raw_parts(a.devices, a.num_devices).to_vec() }
}

pub fn from_host(
    client: *mut PJRT_Client,
    device: *mut PJRT_Device,
    ty: PJRT_Buffer_Type,
    dims: &[i64],
    data: &[u8],
    byte_strides: Option<&[i64]>,
) -> Result<*mut PJRT_Buffer, (u32, String)> {
    put(client, device, null_mut(), ty, dims, data, byte_strides)
}

/// [`from_host`] into a memory (`PJRT_Client_BufferFromHostBuffer`'s
/// `memory`: a device's pinned host memory, say) instead of a device.
pub fn from_host_in_memory(
    client: *mut PJRT_Client,
    memory: *mut PJRT_Memory,
    ty: PJRT_Buffer_Type,
    dims: &[i64],
    data: &[u8],
) -> Result<*mut PJRT_Buffer, (u32, String)> {
    put(client, null_mut(), memory, ty, dims, data, None)
}

fn put(
    client: *mut PJRT_Client,
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
    ty: PJRT_Buffer_Type,
    dims: &[i64],
    data: &[u8],
    byte_strides: Option<&[i64]>,
) -> Result<*mut PJRT_Buffer, (u32, String)> {
    let (err, a) = call!(
        PJRT_Client_BufferFromHostBuffer,
        PJRT_Client_BufferFromHostBuffer_Args,
        |a| {
            a.client = client;
            a.data = data.as_ptr().cast::<c_void>();
            a.type_ = ty;
            a.dims = dims.as_ptr();
            a.num_dims = dims.len();
            if let Some(s) = byte_strides {
                a.byte_strides = s.as_ptr();
                a.num_byte_strides = s.len();
            }
            a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
            a.device = device;
            a.memory = memory;
        }
    );
    if let Some(e) = err {
        return Err(e);
    }
    destroy_event(a.done_with_host_buffer);
    Ok(a.buffer)
}

pub fn await_event(event: *mut PJRT_Event) -> Option<(u32, String)> {
    let (err, _) = call!(PJRT_Event_Await, PJRT_Event_Await_Args, |a| {
        a.event = event;
    });
    err
}

pub fn destroy_event(event: *mut PJRT_Event) {
    call_ok!(PJRT_Event_Destroy, PJRT_Event_Destroy_Args, |a| {
        a.event = event;
    });
}

pub fn to_host(buffer: *mut PJRT_Buffer) -> Result<Vec<u8>, (u32, String)> {
    let (err, a) = call!(
        PJRT_Buffer_ToHostBuffer,
        PJRT_Buffer_ToHostBuffer_Args,
        |a| {
            a.src = buffer;
        }
    );
    if let Some(e) = err {
        return Err(e);
    }
    let mut out = vec![0u8; a.dst_size];
    let (err, a) = call!(
        PJRT_Buffer_ToHostBuffer,
        PJRT_Buffer_ToHostBuffer_Args,
        |a| {
            a.src = buffer;
            a.dst = out.as_mut_ptr().cast();
            a.dst_size = out.len();
        }
    );
    if let Some(e) = err {
        return Err(e);
    }
    assert_eq!(await_event(a.event), None);
    destroy_event(a.event);
    Ok(out)
}

pub fn destroy_buffer(buffer: *mut PJRT_Buffer) {
    call_ok!(PJRT_Buffer_Destroy, PJRT_Buffer_Destroy_Args, |a| {
        a.buffer = buffer;
    });
}

pub fn null_client() -> *mut PJRT_Client {
    null_mut()
}

/// Host backend, strict, every temp copied (threshold 1 byte).
pub fn host_options() -> ClientOptions {
    ClientOptions {
        backend: BackendKind::Host,
        strict: true,
        run: xla_vmm_runtime::RunConfig::default(),
        vendor_plugin_path: None,
        host_devices: 1,
        max_devices: None,
        node_id: 0,
        num_nodes: 1,
        exec: Default::default(),
        topology_timeout: std::time::Duration::from_secs(300),
        search_env: Default::default(),
    }
}

/// A client on a fresh host backend (`plans::backend`) whose device memory
/// limit is `limit` bytes (`None`: none) with a staging reserve of
/// `reserve` percent, one stream per device or not.
pub fn limited_client(
    limit: Option<u64>,
    reserve: u32,
    one_stream: bool,
) -> (std::sync::Arc<HostBackend>, *mut PJRT_Client) {
    use xla_vmm_device::Backend;
    use xla_vmm_plugin::objects::client::{self, Client};
    let be = plans::backend();
    let mut opts = host_options();
    opts.run.one_stream = one_stream;
    let client = client::into_c(Client::with_backend(opts, be.clone()).unwrap());
    // (The client sets the budget from its options: this one after it.)
    be.budget().set_limits(xla_vmm_device::MemoryLimits {
        device: limit,
        host: None,
        staging_reserve: Some(reserve),
    });
    (be, client)
}

/// An f32[len] buffer holding `v` on `device`.
pub fn put_f32(client: *mut PJRT_Client, device: *mut PJRT_Device, v: &[f32]) -> *mut PJRT_Buffer {
    from_host(
        client,
        device,
        PJRT_Buffer_Type_F32,
        &[v.len() as i64],
        &plans::f32_bytes(v),
        None,
    )
    .unwrap()
}

/// Execute without waiting: (output, device_complete_event).
pub fn execute_async(
    exe: *mut PJRT_LoadedExecutable,
    args: &[*mut PJRT_Buffer],
    non_donatable: &[i64],
) -> Result<(*mut PJRT_Buffer, *mut PJRT_Event), (u32, String)> {
    execute_async_claiming(exe, args, non_donatable, args.len())
}

/// [`execute_async`] with `num_args` as given (a careless caller's count,
/// whatever `args` holds).
pub fn execute_async_claiming(
    exe: *mut PJRT_LoadedExecutable,
    args: &[*mut PJRT_Buffer],
    non_donatable: &[i64],
    num_args: usize,
) -> Result<(*mut PJRT_Buffer, *mut PJRT_Event), (u32, String)> {
    let mut out: [*mut PJRT_Buffer; 1] = [null_mut()];
    let raw = RawExecute {
        num_args,
        non_donatable,
        ..RawExecute::new(args)
    };
    let done = raw.run(exe, out.as_mut_ptr())?;
    Ok((out[0], done))
}

/// One argument list's `PJRT_LoadedExecutable_Execute` as a caller may
/// make it (every execute helper here is this): a claimed `num_args`, the
/// non-donatable indices, an execute context and an `execute_device` (null:
/// none).
pub struct RawExecute<'a> {
    pub args: &'a [*mut PJRT_Buffer],
    pub num_args: usize,
    pub non_donatable: &'a [i64],
    pub context: *mut PJRT_ExecuteContext,
    pub device: *mut PJRT_Device,
}

impl<'a> RawExecute<'a> {
    pub fn new(args: &'a [*mut PJRT_Buffer]) -> Self {
        RawExecute {
            args,
            num_args: args.len(),
            non_donatable: &[],
            context: null_mut(),
            device: null_mut(),
        }
    }

    /// The call, with output list `out_list` (null allowed): its completion event.
    pub fn run(
        &self,
        exe: *mut PJRT_LoadedExecutable,
        out_list: *mut *mut PJRT_Buffer,
    ) -> Result<*mut PJRT_Event, (u32, String)> {
        let mut opts: PJRT_ExecuteOptions = unsafe { zeroed() };
        opts.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE as usize;
        opts.non_donatable_input_indices = self.non_donatable.as_ptr();
        opts.num_non_donatable_input_indices = self.non_donatable.len();
        opts.context = self.context;
        let arg_list: *const *mut PJRT_Buffer = self.args.as_ptr();
        let mut done: *mut PJRT_Event = null_mut();
        let (err, _) = call!(
            PJRT_LoadedExecutable_Execute,
            PJRT_LoadedExecutable_Execute_Args,
            |a| {
                a.executable = exe;
                a.options = &mut opts;
                a.argument_lists = &arg_list;
                a.num_devices = 1;
                a.num_args = self.num_args;
                a.output_lists = &out_list;
                a.device_complete_events = &mut done;
                a.execute_device = self.device;
            }
        );
        match err {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }
}

/// Execute and wait for the device work; returns the output.
pub fn execute(
    exe: *mut PJRT_LoadedExecutable,
    args: &[*mut PJRT_Buffer],
    non_donatable: &[i64],
) -> Result<*mut PJRT_Buffer, (u32, String)> {
    let (out, done) = execute_async(exe, args, non_donatable)?;
    assert_eq!(await_event(done), None);
    destroy_event(done);
    Ok(out)
}

pub fn destroy_exe(exe: *mut PJRT_LoadedExecutable) {
    call_ok!(
        PJRT_LoadedExecutable_Destroy,
        PJRT_LoadedExecutable_Destroy_Args,
        |x| {
            x.executable = exe;
        }
    );
}

pub fn is_ready(e: *mut PJRT_Event) -> bool {
    let r = call_ok!(PJRT_Event_IsReady, PJRT_Event_IsReady_Args, |a| {
        a.event = e;
    });
    r.is_ready
}

/// A new handle of `b`'s ready event (the caller destroys it).
pub fn ready_event(b: *mut PJRT_Buffer) -> *mut PJRT_Event {
    let e = call_ok!(PJRT_Buffer_ReadyEvent, PJRT_Buffer_ReadyEvent_Args, |a| {
        a.buffer = b;
    });
    e.event
}

/// Hold (`true`) or release the client's stream on the host backend: held,
/// the work enqueued on it stays pending.
pub fn hold(mem: &VmmDevice<HostBackend>, on: bool) {
    mem.with_stream(|b, s| {
        if on {
            b.hold_stream(s)?;
        } else {
            b.release_stream(s)?;
        }
        Ok(())
    })
    .unwrap();
}

/// The `PJRT_Executable` of a loaded executable (the caller destroys it).
pub fn executable_of(exe: *mut PJRT_LoadedExecutable) -> *mut PJRT_Executable {
    call_ok!(
        PJRT_LoadedExecutable_GetExecutable,
        PJRT_LoadedExecutable_GetExecutable_Args,
        |a| {
            a.loaded_executable = exe;
        }
    )
    .executable
}

/// `PJRT_Buffer_IncreaseExternalReferenceCount` (`up`) or its decrease.
pub fn external_ref(b: *mut PJRT_Buffer, up: bool) -> Option<(u32, String)> {
    if up {
        call!(
            PJRT_Buffer_IncreaseExternalReferenceCount,
            PJRT_Buffer_IncreaseExternalReferenceCount_Args,
            |a| {
                a.buffer = b;
            }
        )
        .0
    } else {
        call!(
            PJRT_Buffer_DecreaseExternalReferenceCount,
            PJRT_Buffer_DecreaseExternalReferenceCount_Args,
            |a| {
                a.buffer = b;
            }
        )
        .0
    }
}

/// What the plugin holds for `client` (its first device's allocations and
/// bytes in use, the live C buffers, events and errors, the host backend's
/// handles) and its report() and stats() JSON: what the long-run tests
/// compare over a run.
pub fn holdings(
    client: *mut PJRT_Client,
    be: &HostBackend,
) -> (String, serde_json::Value, serde_json::Value) {
    let device = devices(client)[0];
    let mem = call_ok!(PJRT_Device_MemoryStats, PJRT_Device_MemoryStats_Args, |a| {
        a.device = device;
    });
    let report = serde_json::from_str(&xla_vmm_plugin::cabi::stats::report_json()).unwrap();
    let stats = serde_json::from_str(&xla_vmm_plugin::cabi::stats::stats_json()).unwrap();
    let live = xla_vmm_plugin::live_objects();
    let held = format!(
        "allocations {} bytes {} | live {:?} | backend {:?}",
        mem.num_allocs,
        mem.bytes_in_use,
        (live.buffers, live.events, live.errors),
        be.outstanding()
    );
    (held, report, stats)
}

//! Executable entries on the host backend: what works without a GPU or a
//! vendor compiler (errors are clear; nothing crashes).
#![allow(unsafe_code)]

mod common;

use common::*;
use xla_vmm_plugin::pjrt::*;

fn fixture(name: &str) -> Vec<u8> {
    let p = xla_vmm::testdata::require_fixtures_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn deserialize(
    client: *mut PJRT_Client,
    bytes: &[u8],
) -> Result<*mut PJRT_LoadedExecutable, (u32, String)> {
    let (err, a) = call!(
        PJRT_Executable_DeserializeAndLoad,
        PJRT_Executable_DeserializeAndLoad_Args,
        |a| {
            a.client = client;
            a.serialized_executable = bytes.as_ptr().cast();
            a.serialized_executable_size = bytes.len();
        }
    );
    match err {
        Some(e) => Err(e),
        None => Ok(a.loaded_executable),
    }
}

#[test]
fn garbage_executable_bytes_are_a_decode_error() {
    let client = create_client("host").unwrap();
    let (code, msg) = deserialize(client, b"definitely not riegeli").unwrap_err();
    assert_eq!(code, PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(msg.contains("decoding the serialized executable"), "{msg}");
    destroy_client(client);
}

#[test]
fn compile_without_a_vendor_plugin_says_where_it_looked() {
    // Point the client at a plugin path that does not exist.
    let path = "/nonexistent/xla_cuda_plugin.so";
    let names = ["backend", "vendor_plugin_path"];
    let values = ["host", path];
    let mut opts: Vec<PJRT_NamedValue> = Vec::new();
    for (n, v) in names.iter().zip(values) {
        let mut o: PJRT_NamedValue = unsafe { std::mem::zeroed() };
        o.struct_size = PJRT_NamedValue_STRUCT_SIZE as usize;
        o.name = n.as_ptr().cast();
        o.name_size = n.len();
        o.type_ = PJRT_NamedValue_kString;
        o.__bindgen_anon_1.string_value = v.as_ptr().cast();
        o.value_size = v.len();
        opts.push(o);
    }
    let c = call_ok!(PJRT_Client_Create, PJRT_Client_Create_Args, |a| {
        a.create_options = opts.as_ptr();
        a.num_options = opts.len();
    });
    let code = b"module {}";
    let format = "mlir";
    let mut program: PJRT_Program = unsafe { std::mem::zeroed() };
    program.struct_size = PJRT_Program_STRUCT_SIZE as usize;
    program.code = code.as_ptr() as *mut _;
    program.code_size = code.len();
    program.format = format.as_ptr().cast();
    program.format_size = format.len();
    let (err, _) = call!(PJRT_Client_Compile, PJRT_Client_Compile_Args, |a| {
        a.client = c.client;
        a.program = &program;
    });
    let (code, msg) = err.unwrap();
    assert_eq!(code, PJRT_Error_Code_NOT_FOUND, "{msg}");
    assert!(
        msg.contains(path) && msg.contains("vendor_plugin_path"),
        "{msg}"
    );
    destroy_client(c.client);
}

#[test]
fn fixture_on_the_host_backend_loads_or_fails_clearly() {
    let bytes = fixture("loop.pjrt");
    let client = create_client("host").unwrap();
    match deserialize(client, &bytes) {
        // The host backend runs no cubin: the load must say so, by name.
        Err((code, msg)) => {
            assert_ne!(code, PJRT_Error_Code_INTERNAL, "{msg}");
            assert!(msg.contains("PJRT_Executable_DeserializeAndLoad"), "{msg}");
            eprintln!("loop.pjrt on host: {msg}");
        }
        Ok(exe) => {
            let g = call_ok!(
                PJRT_LoadedExecutable_GetExecutable,
                PJRT_LoadedExecutable_GetExecutable_Args,
                |a| {
                    a.loaded_executable = exe;
                }
            );
            let n = call_ok!(
                PJRT_Executable_NumOutputs,
                PJRT_Executable_NumOutputs_Args,
                |a| {
                    a.executable = g.executable;
                }
            );
            assert_eq!(n.num_outputs, 1);
            let s = call_ok!(
                PJRT_Executable_Serialize,
                PJRT_Executable_Serialize_Args,
                |a| {
                    a.executable = g.executable;
                }
            );
            let round = unsafe {
                std::slice::from_raw_parts(s.serialized_bytes.cast::<u8>(), s.serialized_bytes_size)
            };
            assert_eq!(round, &bytes[..]);
            unsafe { (s.serialized_executable_deleter.unwrap())(s.serialized_executable) };
        }
    }
    destroy_client(client);
}

/// `PJRT_Executable_DeserializeAndLoad` on mutated executables (the inner
/// message mutated, then wrapped as XLA writes it, so the mutants get past
/// riegeli's checksums): each returns an executable or an error; nothing
/// leaks once they are destroyed. On the host backend even the unmutated
/// fixtures stop at their GPU kernels: the decode, the plan checks and the
/// load up to the kernels are what the mutants reach here.
#[test]
fn deserialize_and_load_survives_mutated_executables() {
    use xla_vmm::decode::mutate::{inner_message, wrap_inner, Mutator};
    let be = common::plans::backend();
    let client = xla_vmm_plugin::objects::client::into_c(
        xla_vmm_plugin::objects::client::Client::with_backend(host_options(), be.clone()).unwrap(),
    );
    let dir = xla_vmm::testdata::require_fixtures_dir();
    let (mut loaded, mut refused) = (0, 0);
    for (i, name) in ["small", "loop", "mlp_adam_donated"].iter().enumerate() {
        let bytes = std::fs::read(dir.join(format!("{name}.pjrt"))).unwrap();
        let message = inner_message(&bytes).unwrap();
        let mut m = Mutator::new(7 + i as u64);
        for _ in 0..150 {
            match deserialize(client, &wrap_inner(&m.mutate(&message))) {
                Ok(exe) => {
                    loaded += 1;
                    destroy_exe(exe);
                }
                Err((code, msg)) => {
                    refused += 1;
                    assert_ne!(code, PJRT_Error_Code_INTERNAL, "{name}: {msg}");
                }
            }
        }
    }
    println!("{loaded} mutants loaded, {refused} refused");
    destroy_client(client);
    assert_eq!(be.outstanding().total(), 0, "{:?}", be.outstanding());
}

//! Typed-FFI custom calls on the host backend: binding at load (attributes,
//! missing handlers, legacy API versions), what a handler gets at run time
//! (stream, device, typed buffers, tokens, the run's context), handler
//! errors, and graph modes (a handler that is not command-buffer
//! compatible makes its program run eager, with the same result).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use xla_vmm::*;
use xla_vmm_device::{Backend, DevicePtr, HostBackend};
use xla_vmm_runtime::{
    BoundCall, CallContext, CallSite, CustomCallRegistry, DeviceBuffer, Executable, Invocation,
    Mode, RuntimeError,
};

/// `out = factor * in` on the host, through the backend (a stand-in for a
/// host callback); records what it was given.
#[derive(Debug)]
struct Scale {
    backend: Arc<HostBackend>,
    factor: f32,
    compatible: bool,
    seen: Arc<Mutex<Vec<String>>>,
}

impl BoundCall for Scale {
    fn graph_compatible(&self) -> bool {
        self.compatible
    }

    fn execute(&self, call: &Invocation<'_>) -> Result<(), String> {
        let user = call.context.and_then(|c| c.user_data(42));
        self.seen.lock().unwrap().push(format!(
            "stream={} device={} args={:?} rets={:?} user={user:?}",
            call.stream,
            call.device_ordinal,
            call.args
                .iter()
                .map(|a| (a.dtype, a.dims.clone(), a.data == DevicePtr::NULL))
                .collect::<Vec<_>>(),
            call.rets
                .iter()
                .map(|a| (a.dtype, a.dims.clone()))
                .collect::<Vec<_>>(),
        ));
        if self.factor < 0.0 {
            return Err("negative factor".into());
        }
        // Scratch memory: usable during the call, freed after it; only
        // what was allocated for the call can be freed.
        let tmp = call.scratch.allocate(16, 256)?;
        call.scratch.free(tmp)?;
        assert!(call.scratch.free(DevicePtr(tmp.0 + 8)).is_err());
        assert!(call.scratch.allocate(16, 3).is_err());
        let s = self.backend.stream_create().map_err(|e| e.to_string())?;
        let mut b = vec![0u8; 16];
        self.backend
            .read_sync(&mut b, call.args[0].data, &s)
            .map_err(|e| e.to_string())?;
        let v: Vec<f32> = b
            .chunks(4)
            .map(|c| self.factor * f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        self.backend
            .write_sync(call.rets[0].data, &bytes(&v), &s)
            .map_err(|e| e.to_string())?;
        self.backend.stream_destroy(s).map_err(|e| e.to_string())
    }
}

/// Binds target `scale` (attribute `factor`: f32), nothing else.
struct Registry {
    backend: Arc<HostBackend>,
    compatible: bool,
    seen: Arc<Mutex<Vec<String>>>,
    bound: Mutex<Vec<String>>,
}

impl CustomCallRegistry for Registry {
    fn bind(&self, site: &CallSite<'_>) -> Result<Option<Arc<dyn BoundCall>>, String> {
        self.bound
            .lock()
            .unwrap()
            .push(format!("{} {}", site.target, site.name));
        if site.target != "scale" {
            return Ok(None);
        }
        let factor = match site.attributes.as_slice() {
            [(name, FfiAttr::Scalar(FfiScalar::F32(f)))] if name == "factor" => *f,
            other => return Err(format!("bad attributes {other:?}")),
        };
        Ok(Some(Arc::new(Scale {
            backend: self.backend.clone(),
            factor,
            compatible: self.compatible,
            seen: self.seen.clone(),
        })))
    }
}

struct Context;
impl CallContext for Context {
    fn user_data(&self, type_id: i64) -> Option<usize> {
        (type_id == 42).then_some(0x1234)
    }
}

fn f32_shape(n: i64) -> Shape {
    Shape {
        element_type: ElementType::F32,
        dimensions: vec![n],
        ..Default::default()
    }
}

/// out = scale(param 0) with a token operand and a token result, as
/// `io_callback` lowers.
fn call_plan(target: &str, factor: f32, api_version: i32) -> Plan {
    let allocs = vec![
        alloc(0, 16, param(0, false)),
        alloc(1, 16, AllocationRole::Output { outputs: vec![] }),
    ];
    let cc = CustomCallThunk {
        target_name: target.into(),
        operands: vec![
            Some(ShapedSlice {
                slice: sl(0, 0, 16),
                shape: Some(f32_shape(4)),
            }),
            None,
        ],
        results: vec![
            Some(ShapedSlice {
                slice: sl(1, 0, 16),
                shape: Some(f32_shape(4)),
            }),
            None,
        ],
        opaque: Blob::default(),
        api_version,
        attributes: vec![("factor".into(), FfiAttr::Scalar(FfiScalar::F32(factor)))],
        called_computation: None,
        use_pdl: false,
    };
    plan(
        allocs,
        vec![f32s(4)],
        vec![(1, f32s(4))],
        vec![thunk("custom-call.7", ThunkKind::CustomCall(cc))],
    )
}

fn registry(b: &Arc<HostBackend>, compatible: bool) -> Registry {
    Registry {
        backend: b.clone(),
        compatible,
        seen: Arc::default(),
        bound: Mutex::default(),
    }
}

fn run(
    b: &Arc<HostBackend>,
    reg: &Registry,
    p: Plan,
    mode: Mode,
    context: Option<Arc<dyn CallContext>>,
) -> Result<Vec<f32>, RuntimeError> {
    let stream = b.stream_create()?;
    let mut exe = Executable::load_with(
        b.clone(),
        p,
        None,
        Some(reg),
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )?;
    exe.set_call_context(context);
    let input = DeviceBuffer::alloc(b, 16)?;
    b.write_sync(input.ptr(), &bytes(&[1.0, 2.0, 3.0, 4.0]), &stream)?;
    exe.bind_parameter(0, input.ptr(), 16)?;
    let out = exe.run(&stream, mode).and_then(|outs| {
        b.stream_synchronize(&stream)?;
        let mut d = vec![0u8; 16];
        b.read_sync(&mut d, outs[0].ptr, &stream)?;
        Ok(d.chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    });
    drop(exe);
    input.free()?;
    b.stream_destroy(stream)?;
    out
}

#[test]
fn a_bound_handler_gets_stream_device_typed_buffers_tokens_and_the_context() {
    let b = backend();
    let reg = registry(&b, false);
    let out = run(
        &b,
        &reg,
        call_plan("scale", 3.0, 4),
        Mode::Eager,
        Some(Arc::new(Context)),
    )
    .unwrap();
    assert_eq!(out, vec![3.0, 6.0, 9.0, 12.0]);
    // The call's scratch buffer was released with it (and the program's
    // own buffers with the program).
    assert_eq!(b.call_count("mem_create"), b.call_count("mem_release"));
    // Input, output and the call's scratch buffer.
    assert!(b.call_count("mem_create") >= 3, "{:?}", b.call_counts());
    assert_eq!(*reg.bound.lock().unwrap(), ["scale custom-call.7"]);
    let seen = reg.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    // F32 = 11, TOKEN = 17 (no data, rank 0); the context's user data.
    assert!(
        seen[0].contains("args=[(11, [4], false), (17, [], true)]")
            && seen[0].contains("rets=[(11, [4]), (17, [])]")
            && seen[0].contains("user=Some(4660)")
            && seen[0].contains("device=0"),
        "{}",
        seen[0]
    );
    // Without a context the handler sees none.
    let reg = registry(&b, false);
    run(&b, &reg, call_plan("scale", 1.0, 4), Mode::Eager, None).unwrap();
    assert!(reg.seen.lock().unwrap()[0].contains("user=None"));
}

#[test]
fn graph_modes_run_an_incompatible_handler_eager_with_the_same_result() {
    let b = backend();
    for mode in [Mode::Graph, Mode::GraphRecapture] {
        let reg = registry(&b, false);
        let out = run(&b, &reg, call_plan("scale", 2.0, 4), mode, None).unwrap();
        assert_eq!(out, vec![2.0, 4.0, 6.0, 8.0], "{mode:?}");
        assert_eq!(reg.seen.lock().unwrap().len(), 1, "{mode:?}");
    }
    // The program knows why it is not captured; a compatible handler does
    // not block capture.
    let stream = b.stream_create().unwrap();
    let reg = registry(&b, false);
    let exe = Executable::load_with(
        b.clone(),
        call_plan("scale", 2.0, 4),
        None,
        Some(&reg),
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .unwrap();
    let why = exe.program().capture_blocker().unwrap();
    assert!(
        why.contains("custom call 'scale'") && why.contains("command-buffer"),
        "{why}"
    );
    drop(exe);
    let reg = registry(&b, true);
    let exe = Executable::load_with(
        b.clone(),
        call_plan("scale", 2.0, 4),
        None,
        Some(&reg),
        &xla_vmm_runtime::RunConfig::default(),
        &stream,
    )
    .unwrap();
    assert_eq!(exe.program().capture_blocker(), None);
    drop(exe);
    b.stream_destroy(stream).unwrap();
}

#[test]
fn missing_handlers_legacy_calls_and_handler_errors_are_clear_errors() {
    let b = backend();
    let reg = registry(&b, false);
    let e = run(
        &b,
        &reg,
        call_plan("nobody_home", 1.0, 4),
        Mode::Eager,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("nobody_home") && e.contains("no FFI handler"),
        "{e}"
    );
    let e = run(&b, &reg, call_plan("scale", 1.0, 2), Mode::Eager, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("API version 2") && e.contains("custom-call.7"),
        "{e}"
    );
    // No registry at all.
    let stream = b.stream_create().unwrap();
    let e = Executable::load(b.clone(), call_plan("scale", 1.0, 4), None, &stream)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("without FFI handlers") && e.contains("scale"),
        "{e}"
    );
    b.stream_destroy(stream).unwrap();
    // A failing handler fails the run, naming the call and its message.
    let e = run(&b, &reg, call_plan("scale", -1.0, 4), Mode::Eager, None).unwrap_err();
    assert!(matches!(e, RuntimeError::Handler(_)), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("'scale'") && e.contains("custom-call.7") && e.contains("negative factor"),
        "{e}"
    );
    // A registry that cannot bind names the call.
    let mut p = call_plan("scale", 1.0, 4);
    if let ThunkKind::CustomCall(c) = &mut p.thunks[0].kind {
        c.attributes.clear();
    }
    let e = run(&b, &reg, p, Mode::Eager, None).unwrap_err().to_string();
    assert!(
        e.contains("binding its FFI handler") && e.contains("bad attributes"),
        "{e}"
    );
}

//! XLA's select_k thunk on our runtime (`src/selectk.rs`, kernel
//! `src/selectk.cu`):
//! - the kernel's own source, run on CPU threads (`selectk_emulated.cpp`:
//!   one thread per GPU thread, a barrier for the block's), gives each
//!   row's stable order for f32 / bf16 / u64 with ties, signed zeros,
//!   infinities and NaNs;
//! - the committed `selectk.ptx` is what clang-15 makes of that source;
//! - a select_k thunk loads and runs on the host backend (eager and graph),
//!   and bad thunks are refused at load naming what is wrong.
//!
//! Compilers: a C++20 compiler (`$XLA_VMM_CXX`, else clang++-19..15, else
//! c++) and clang-15 for the PTX. CI installs clang-15 and sets
//! `XLA_VMM_REQUIRE_CLANG=1`, so there a missing compiler fails the tests.

mod common;
mod tools;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use xla_vmm::*;
use xla_vmm_device::Backend;
use xla_vmm_runtime::selectk::{register_host_select_k, PTX, PTX_COMMAND};
use xla_vmm_runtime::{DeviceBuffer, Executable, Mode, RuntimeError};

fn src_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_kernel_on_cpu_threads_gives_each_rows_stable_order() {
    let mut names = tools::versioned("XLA_VMM_CXX", "clang++");
    names.push("c++".into());
    let Some(cxx) = tools::find_or_skip(
        names,
        "XLA_VMM_REQUIRE_CLANG",
        "C++20 compiler (set XLA_VMM_CXX)",
    ) else {
        return;
    };
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    let exe = std::env::temp_dir().join(format!("xla-vmm-selectk-{}", std::process::id()));
    tools::run_ok(
        Command::new(&cxx)
            .args(["-std=c++20", "-O2", "-pthread", "-Wall", "-Werror"])
            .arg("-o")
            .arg(&exe)
            .arg(here.join("selectk_emulated.cpp")),
        format_args!("{} on selectk_emulated.cpp", cxx.display()),
    );
    let r = Command::new(&exe).output().expect("running the emulation");
    std::fs::remove_file(&exe).ok();
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "emulated select_k differs: {out}");
    assert!(out.starts_with("ok 80"), "unexpected output: {out}");
}

#[test]
fn the_committed_ptx_is_what_clang_15_makes_of_the_source() {
    let Some(cc) = tools::find_or_skip(
        [PTX_COMMAND[0].into()],
        "XLA_VMM_REQUIRE_CLANG",
        PTX_COMMAND[0],
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("xla-vmm-selectk-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // PTX_COMMAND with the output into `dir` and the source from src/.
    let mut args: Vec<String> = PTX_COMMAND[1..].iter().map(|s| s.to_string()).collect();
    let n = args.len();
    args[n - 2] = dir.join("selectk.ptx").display().to_string();
    args[n - 1] = src_dir().join("selectk.cu").display().to_string();
    tools::run_ok(
        Command::new(&cc).args(&args),
        format_args!("{} on selectk.cu", cc.display()),
    );
    let made = std::fs::read_to_string(dir.join("selectk.ptx")).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        made == PTX,
        "src/selectk.ptx is stale: run `{}` in crates/runtime/src",
        PTX_COMMAND.join(" ")
    );
    for entry in ["select_k_f32", "select_k_bf16", "select_k_u64", "top_k_f32"] {
        assert!(PTX.contains(&format!(".entry xla_vmm_{entry}(")));
    }
}

fn shape(t: ElementType, dims: &[i64]) -> Shape {
    Shape {
        element_type: t,
        dimensions: dims.to_vec(),
        ..Default::default()
    }
}

/// `f32[batch, n]` in parameter 0, values out in allocation 1, indices in 2.
fn select_k_plan(batch: u32, n: u32, k: u32, element_type: ElementType) -> Plan {
    let (b, n64, k64) = (u64::from(batch), u64::from(n), u64::from(k));
    let out = AllocationRole::Output { outputs: vec![] };
    plan(
        vec![
            alloc(0, b * n64 * 4, param(0, false)),
            alloc(1, b * k64 * 4, out.clone()),
            alloc(2, b * k64 * 4, out),
        ],
        vec![shape(ElementType::F32, &[batch.into(), n.into()])],
        vec![
            (1, shape(ElementType::F32, &[batch.into(), k.into()])),
            (2, shape(ElementType::S32, &[batch.into(), k.into()])),
        ],
        vec![thunk(
            "custom-call.1",
            ThunkKind::SelectK(SelectKThunk {
                input: sl(0, 0, b * n64 * 4),
                values: sl(1, 0, b * k64 * 4),
                indices: sl(2, 0, b * k64 * 4),
                batch,
                num_elements: n,
                k,
                element_type,
            }),
        )],
    )
}

fn run(p: Plan, input: &[f32], mode: Mode) -> Result<(Vec<u32>, Vec<u32>), RuntimeError> {
    let b = backend();
    register_host_select_k(&b);
    let stream = b.stream_create()?;
    let mut exe = Executable::load(b.clone(), p, None, &stream)?;
    let buf = DeviceBuffer::alloc(&b, (input.len() * 4) as u64)?;
    b.write_sync(buf.ptr(), &bytes(input), &stream)?;
    exe.bind_parameter(0, buf.ptr(), (input.len() * 4) as u64)?;
    let mut got = Vec::new();
    // Twice: the second run replays the graph in graph modes.
    for _ in 0..2 {
        let outs = exe.run(&stream, mode)?;
        b.stream_synchronize(&stream)?;
        let mut words = Vec::new();
        for o in &outs {
            let mut d = vec![0u8; o.bytes as usize];
            b.read_sync(&mut d, o.ptr, &stream)?;
            words.push(
                d.chunks(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect::<Vec<u32>>(),
            );
        }
        got = words;
    }
    drop(exe);
    buf.free()?;
    Ok((got[0].clone(), got[1].clone()))
}

#[test]
fn select_k_runs_on_the_host_backend_in_xlas_total_order() {
    let nan = f32::NAN;
    // Two rows of 6; k = 3. Row 0 has ties (2.0 three times), row 1 NaN and signed zeros.
    let input = [
        1.0,
        2.0,
        -1.0,
        2.0,
        0.5,
        2.0, //
        0.0,
        -0.0,
        nan,
        -5.0,
        f32::INFINITY,
        0.0,
    ];
    for mode in [Mode::Eager, Mode::Graph, Mode::GraphRecapture] {
        let (values, indices) = run(select_k_plan(2, 6, 3, ElementType::F32), &input, mode)
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let want_values = [2.0f32, 2.0, 2.0, nan, f32::INFINITY, 0.0].map(f32::to_bits);
        assert_eq!(values, want_values, "{mode:?}: values");
        assert_eq!(indices, [1, 3, 5, 2, 4, 0], "{mode:?}: indices");
    }
}

#[test]
fn bad_select_k_thunks_are_refused_at_load_naming_why() {
    let cases: [(Plan, &str); 3] = [
        (
            select_k_plan(1, 4, 5, ElementType::F32),
            "k = 5 is larger than the row",
        ),
        (select_k_plan(1, 4, 2, ElementType::S32), "select_k of S32"),
        (
            {
                let mut p = select_k_plan(2, 4, 2, ElementType::F32);
                if let ThunkKind::SelectK(s) = &mut p.thunks[0].kind {
                    s.input.size = 16;
                }
                p
            },
            "input slice has 16 bytes, [2, 4] needs 32",
        ),
    ];
    for (p, want) in cases {
        let e = run(p, &[0.0; 8], Mode::Eager).expect_err(want);
        assert!(e.to_string().contains(want), "{e} (want: {want})");
        assert!(
            e.to_string().contains("custom-call.1"),
            "{e} names the thunk"
        );
    }
}

/// XLA's TopK kernel as its thunk names it: parameters (input, n, values,
/// indices, k), one block per row, and a scratch argument it does not use.
fn xla_top_k_plan(symbol: &str, batch: u32, n: u32, k: u32) -> Plan {
    let mut p = select_k_plan(batch, n, k, ElementType::F32);
    p.allocations.push(alloc(3, 64, AllocationRole::Temp));
    let arg = |slice, written| KernelArg {
        slice,
        shape: None,
        written,
        tma: None,
    };
    let word = |v: u32| KernelParam::Bytes {
        data: Blob(u64::from(v).to_le_bytes().to_vec()),
    };
    let ThunkKind::SelectK(s) = p.thunks[0].kind.clone() else {
        unreachable!()
    };
    p.thunks[0].kind = ThunkKind::CustomKernel(CustomKernelThunk {
        name: "topk".into(),
        spec: KernelSpec {
            code: KernelCode::InProcessSymbol {
                persistent_name: symbol.into(),
            },
            kernel_name: symbol.into(),
            arity: 5,
            packing: Some(vec![
                KernelParam::ArgAddress { arg_index: 0 },
                word(n),
                KernelParam::ArgAddress { arg_index: 1 },
                KernelParam::ArgAddress { arg_index: 2 },
                word(k),
            ]),
        },
        args: vec![
            arg(s.input, false),
            arg(s.values, true),
            arg(s.indices, true),
            arg(sl(3, 0, 64), true),
        ],
        launch: LaunchDims {
            blocks: Dim3 {
                x: batch.into(),
                y: 1,
                z: 1,
            },
            threads: Dim3 { x: 256, y: 1, z: 1 },
            cluster: None,
            shared_memory_bytes: 1024,
        },
        use_pdl: false,
        zeroed_output_buffer_indices: vec![],
    });
    p
}

#[test]
fn xlas_top_k_kernel_runs_on_ours_in_its_float_order() {
    // Float comparison: -0 and +0 tie (lowest index first), NaN below -inf.
    let input = [1.0, -0.0, f32::NAN, 0.0, 1.0, f32::NEG_INFINITY];
    let p = xla_top_k_plan("topk_k8_float_uint32_t", 1, 6, 6);
    let (values, indices) = run(p, &input, Mode::Graph).unwrap();
    assert_eq!(indices, [0, 4, 1, 3, 5, 2]);
    assert_eq!(
        values,
        [1.0, 1.0, -0.0, 0.0, f32::NEG_INFINITY, f32::NAN].map(f32::to_bits)
    );

    let e = run(
        xla_top_k_plan("topk_k4_float_uint16_t", 1, 6, 5),
        &input,
        Mode::Eager,
    )
    .expect_err("k above the kernel's bucket");
    assert!(
        e.to_string()
            .contains("k = 5 is larger than the kernel's 4"),
        "{e}"
    );
    // Any other in-process symbol stays unsupported, named.
    let e = run(
        xla_top_k_plan("topk_k4_bfloat16_uint32_t", 1, 6, 4),
        &input,
        Mode::Eager,
    )
    .expect_err("not a kernel we run");
    assert!(
        e.to_string()
            .contains("in-process kernel symbol 'topk_k4_bfloat16_uint32_t'"),
        "{e}"
    );
}

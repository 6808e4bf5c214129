//! `xla-vmm run`: replay a serialized executable on the GPU with inputs from
//! an `.npz`, write / compare its outputs, time steps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use xla_vmm_device::vmm::{Buffer, VmmAllocator, VmmConfig};
use xla_vmm_device::Backend;
use xla_vmm_runtime::npz::{self, NpyArray};
use xla_vmm_runtime::{Executable, Mode, Reclaimed, RunConfig, Threshold};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The serialized executable (`PJRT_Executable_Serialize` bytes, or
    /// jax's `serialize()` bytes).
    pub file: PathBuf,
    /// Inputs `in_0..in_k` in HLO parameter order.
    #[arg(long)]
    pub inputs: PathBuf,
    /// Write the results as `out_0..out_m`.
    #[arg(long)]
    pub outputs: Option<PathBuf>,
    /// `graph` (the default, as in the plugin: VA-stable, one graph per
    /// fixed VA reservation, recorded once; parameters bound by skip /
    /// remap / copy), `eager` (thunk by thunk, the reference) or
    /// `graph-recapture` (one graph, re-captured when parameter addresses
    /// change).
    /// Default: `XLA_VMM_EXEC_MODE`, else `graph`. In `graph` mode the
    /// never-slower guard (`XLA_VMM_GUARD`, on by default) may run the
    /// program as graph-recapture or eager after its first steps when that
    /// is faster: the last lines say so (`guard: ...`).
    #[arg(long)]
    pub mode: Option<String>,
    /// Copy threshold of graph mode: 0 = remap every slot (and no
    /// sub-allocated parameter buffers), 1 = auto, N = copy slots of at most
    /// N bytes. Default: `XLA_VMM_TMP_COPY_THRESHOLD`, else auto.
    #[arg(long)]
    pub threshold: Option<u64>,
    /// After the checked run, time this many more steps (state donated to
    /// the executable keeps evolving; the timing is what is reported).
    #[arg(long, default_value_t = 0)]
    pub steps: usize,
    /// Before the `--steps`, run this many untimed (the guard's trial, auto's
    /// warm-up: what a long training run leaves behind).
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Time the `--steps` runs as a training loop does: all enqueued
    /// without waiting, one wait at the end (stream time per step, host
    /// enqueue time per step) instead of each step waited for.
    #[arg(long)]
    pub pipelined: bool,
    /// Compare the first run's outputs with `out_i` of this `.npz`.
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// Training loop: run this many steps in total, feeding outputs
    /// `0..m-1` back as inputs `0..m-1` (the last output is the loss), and
    /// print each step's loss with its bits.
    #[arg(long, default_value_t = 0)]
    pub loop_steps: usize,
    /// Compare the loop's loss bits with `loss_bits` of this JSON file
    /// (integration/stock_ref.py's NAME.loop.json).
    #[arg(long)]
    pub loop_ref: Option<PathBuf>,
    /// The loop's steps after the first run with these modes in turn,
    /// whatever the configuration (no guard): `MODE:N,...`, e.g.
    /// `graph-recapture:10,eager:3,graph-recapture:36` (a diagnostic: what
    /// one runner leaves behind for the next, step by step); steps past
    /// it run as configured.
    #[arg(long)]
    pub schedule: Option<String>,
    /// Outputs that stock XLA itself does not reproduce run to run (the
    /// `stock_nondeterministic_outputs` of stock_ref.py's NAME.loop.json):
    /// a difference there is reported, with the thunks that write the
    /// output, but does not fail `--compare`.
    #[arg(long)]
    pub nondeterministic: Option<PathBuf>,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Device backend: `host` needs no GPU (inputs are read and checked and
    /// the program loaded; GPU kernels do not run there, so a real
    /// executable stops at load: "inputs OK; this program needs a GPU
    /// (the first GPU thunk it cannot run)", exit status 3).
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: crate::BackendKind,
    /// Run a multi-device executable on devices 0..N, one thread each
    /// (inputs `in_<arg>_<dev>`, expected outputs `out_<out>_<dev>`, `<dev>`
    /// = position in the device assignment: NAME.json's `devices` next to
    /// the executable, else 1 replica x N partitions with ids 0..N); checked
    /// against the visible devices before anything starts.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
}

/// Most devices `--devices` takes (more is a typo, answered at once).
pub const MAX_DEVICES: usize = 1024;

/// `out_i` -> the thunks that write its allocation ("kind 'annotation'"),
/// so a mismatch names where the bytes came from.
fn output_writers(plan: &xla_vmm::Plan) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut infos: Vec<_> = plan
        .outputs
        .iter()
        .filter(|o| !o.shape_index.is_empty() || plan.outputs.len() == 1)
        .collect();
    infos.sort_by(|a, b| a.shape_index.cmp(&b.shape_index));
    let mut map = std::collections::BTreeMap::new();
    for (i, info) in infos.iter().enumerate() {
        let mut writers = Vec::new();
        plan.walk(&mut |t, _| {
            let writes_it = t
                .own_uses()
                .iter()
                .any(|(s, a)| a.writes() && s.allocation == info.allocation);
            let name = format!("{} '{}'", t.kind_name(), t.info.profile_annotation);
            if writes_it && !writers.contains(&name) {
                writers.push(name);
            }
        });
        map.insert(format!("out_{i}"), writers);
    }
    map
}

/// Output indices listed as nondeterministic in stock XLA (see `--nondeterministic`).
fn nondeterministic_outputs(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let list = json["stock_nondeterministic_outputs"]
        .as_array()
        .ok_or_else(|| anyhow!("{}: no stock_nondeterministic_outputs", path.display()))?;
    list.iter()
        .map(|v| {
            v.as_u64()
                .map(|i| format!("out_{i}"))
                .ok_or_else(|| anyhow!("{}: bad output index {v}", path.display()))
        })
        .collect()
}

/// Exit status of `xla-vmm run` when the inputs fit the program but the
/// backend (`--backend host`) cannot run its GPU code: not a failure of the
/// program or of the inputs (1), nor a usage error (2, clap's).
pub const EXIT_NEEDS_GPU: u8 = 3;

/// The inputs were checked and fit; the program has GPU code that the
/// chosen backend (host) does not run. `reason`: the runtime's load error,
/// naming the first thunk it cannot run.
#[derive(Debug)]
pub struct NeedsGpu {
    pub reason: String,
}

impl std::fmt::Display for NeedsGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "inputs OK; this program needs a GPU ({})", self.reason)
    }
}

impl std::error::Error for NeedsGpu {}

/// Does `plan` run thunks through the library engine (cuBLASLt GEMMs,
/// cuDNN convolutions, cuBLAS triangular solves, cuFFT transforms; their
/// ROCm twins)?
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) fn needs_engine(plan: &xla_vmm::Plan) -> bool {
    let kinds = plan.kind_counts();
    ["cublas_lt_matmul", "convolution", "triangular_solve", "fft"]
        .iter()
        .any(|k| kinds.contains_key(*k))
}

/// `"<kind> thunk '<name>': "` of every thunk of `plan` whose work is GPU
/// code or a GPU library (compiled kernels, GEMMs, convolutions, triangular
/// solves, FFTs), as the runtime names a thunk in its load errors.
fn gpu_thunks(plan: &xla_vmm::Plan) -> Vec<String> {
    use xla_vmm::plan::ThunkKind as K;
    let mut out = Vec::new();
    plan.walk(&mut |t, _| {
        if matches!(
            t.kind,
            K::Kernel(_)
                | K::CustomKernel(_)
                | K::CublasLtMatmul(_)
                | K::Gemm(_)
                | K::Convolution(_)
                | K::TriangularSolve(_)
                | K::Fft(_)
        ) {
            out.push(format!(
                "{} thunk '{}': ",
                t.kind_name(),
                t.info.profile_annotation
            ));
        }
    });
    out
}

/// Is `e` (a host-backend load error) the runtime refusing one of the
/// plan's GPU thunks (`gpu`, from [`gpu_thunks`]) as unsupported there?
/// Then the reason, without the runtime's "invalid executable: " (the
/// executable is fine). Any other load error stays an error.
fn needs_gpu_reason(e: &xla_vmm_runtime::RuntimeError, gpu: &[String]) -> Option<String> {
    use xla_vmm_runtime::RuntimeError as E;
    let (message, unsupported) = match e {
        E::Unsupported(m) => (m, true),
        E::InvalidProgram(m) => (m, false),
        _ => return None,
    };
    // The innermost thunk named (a while loop's body names the loop first).
    let (at, prefix) = gpu
        .iter()
        .filter_map(|p| message.rfind(p.as_str()).map(|i| (i, p)))
        .max_by_key(|(i, _)| *i)?;
    let rest = &message[at + prefix.len()..];
    // A device's "unsupported: ..." (the host runs no GPU code) or the
    // runtime's own (no GEMM engine on this backend).
    (unsupported || rest.starts_with("unsupported: ")).then(|| message.clone())
}

/// How `--devices N` (N > 1) runs a decoded program (`run_multi::run`,
/// given by the caller: that module builds on this one).
pub type MultiDevice = fn(xla_vmm::Plan, &Args, Mode, OutputCheck) -> anyhow::Result<()>;

/// [`run_args`], exiting with [`EXIT_NEEDS_GPU`] (after saying why) when the
/// host backend cannot run the program's GPU code.
pub fn run(args: Args, multi: MultiDevice) -> anyhow::Result<()> {
    match run_args(args, multi) {
        Err(e) => match e.downcast_ref::<NeedsGpu>() {
            Some(n) => {
                eprintln!("{n}");
                std::process::exit(EXIT_NEEDS_GPU.into())
            }
            None => Err(e),
        },
        ok => ok,
    }
}

fn run_args(args: Args, multi: MultiDevice) -> anyhow::Result<()> {
    let config = run_config(&args)?;
    let mode = config.mode;
    let bytes = crate::read_executable(&args.file)?;
    // Constants XLA serialized without content take their value from the
    // HLO module in the decoder, as XLA's own deserialization does.
    let plan = xla_vmm::decode::decode(&bytes)
        .with_context(|| format!("decoding {}", args.file.display()))?;
    let check = OutputCheck {
        writers: output_writers(&plan),
        nondeterministic: match &args.nondeterministic {
            Some(p) => nondeterministic_outputs(p)?,
            None => Vec::new(),
        },
    };
    if args.devices == 0 || args.devices > MAX_DEVICES {
        bail!("--devices {}: expected 1 to {MAX_DEVICES}", args.devices);
    }
    // Inputs are read and checked before a device is opened (multi-device
    // runs name them per device and check them when binding).
    let inputs = if args.devices > 1 {
        Vec::new()
    } else {
        let inputs = npz::read_npz(&args.inputs)?;
        check_inputs(
            &plan.program_shape.parameters,
            &inputs,
            &|i| format!("in_{i}"),
            &args.inputs,
        )?;
        inputs
    };
    match args.backend {
        crate::BackendKind::Cuda if args.devices > 1 => multi(plan, &args, mode, check),
        crate::BackendKind::Cuda => run_cuda(plan, inputs, &args, &config, &check),
        _ if args.devices > 1 => bail!("--devices {} needs --backend cuda", args.devices),
        crate::BackendKind::Host => run_host(plan, inputs, &args, &config, &check),
        crate::BackendKind::Hip => run_hip(plan, inputs, &args, &config, &check),
    }
}

/// The host backend (no GPU): every input checked and uploaded, the program
/// loaded; it runs copies, memsets and the runtime's own kernels (the copy
/// kernels, select_k).
fn run_host(
    plan: xla_vmm::Plan,
    inputs: Vec<(String, NpyArray)>,
    args: &Args,
    config: &RunConfig,
    check: &OutputCheck,
) -> anyhow::Result<()> {
    let b = xla_vmm_device::HostBackend::new(xla_vmm_device::HostConfig::default())?;
    xla_vmm_runtime::copykernel::register_host_copy_kernel(&b);
    xla_vmm_runtime::selectk::register_host_select_k(&b);
    replay(Arc::new(b), plan, None, inputs, args, config, check)
}

/// A GPU backend's replay: its GEMM engine is made (and its library named
/// on stderr) only when the program has GEMM thunks.
#[cfg(any(feature = "cuda", feature = "hip"))]
#[allow(clippy::too_many_arguments)]
fn replay_gpu<B: Backend + 'static, G: xla_vmm_device::blas::GemmEngine<B> + 'static>(
    backend: B,
    engine: &str,
    make_gemm: impl FnOnce(&B) -> anyhow::Result<(G, String)>,
    plan: xla_vmm::Plan,
    inputs: Vec<(String, NpyArray)>,
    args: &Args,
    config: &RunConfig,
    check: &OutputCheck,
) -> anyhow::Result<()> {
    let gemm: Option<Arc<dyn xla_vmm_device::blas::GemmEngine<B>>> = if needs_engine(&plan) {
        let (g, library) = make_gemm(&backend)?;
        eprintln!("{engine}: {library}");
        Some(Arc::new(g))
    } else {
        None
    };
    replay(Arc::new(backend), plan, gemm, inputs, args, config, check)
}

/// The HIP backend (feature `hip`; hipBLASLt for `cublas_lt_matmul` thunks).
#[cfg(feature = "hip")]
fn run_hip(
    plan: xla_vmm::Plan,
    inputs: Vec<(String, NpyArray)>,
    args: &Args,
    config: &RunConfig,
    check: &OutputCheck,
) -> anyhow::Result<()> {
    use xla_vmm_device::hip::{blaslt::HipGemm, HipBackend};
    let gemm = |b: &HipBackend| {
        let g = HipGemm::new(b)?;
        let library = g.library().to_string();
        Ok((g, library))
    };
    let backend = HipBackend::new(args.device)?;
    replay_gpu(
        backend,
        "hipBLASLt",
        gemm,
        plan,
        inputs,
        args,
        config,
        check,
    )
}

#[cfg(not(feature = "hip"))]
fn run_hip(
    _plan: xla_vmm::Plan,
    _inputs: Vec<(String, NpyArray)>,
    _args: &Args,
    _config: &RunConfig,
    _check: &OutputCheck,
) -> anyhow::Result<()> {
    bail!("this xla-vmm was built without the HIP backend (cargo feature `hip`)")
}

#[cfg(feature = "cuda")]
fn run_cuda(
    plan: xla_vmm::Plan,
    inputs: Vec<(String, NpyArray)>,
    args: &Args,
    config: &RunConfig,
    check: &OutputCheck,
) -> anyhow::Result<()> {
    use xla_vmm_device::cuda::{blaslt::CudaGemm, CudaBackend};
    let gemm = |b: &CudaBackend| {
        let g = CudaGemm::new(b)?;
        let library = g.library().to_string();
        Ok((g, library))
    };
    let backend = CudaBackend::new(args.device)?;
    replay_gpu(backend, "cuBLASLt", gemm, plan, inputs, args, config, check)
}

/// What `--compare` needs besides the arrays.
#[derive(Default)]
pub struct OutputCheck {
    /// `out_i` -> thunks writing it.
    pub writers: std::collections::BTreeMap<String, Vec<String>>,
    /// Outputs stock XLA does not reproduce itself.
    pub nondeterministic: Vec<String>,
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _plan: xla_vmm::Plan,
    _inputs: Vec<(String, NpyArray)>,
    _args: &Args,
    _config: &RunConfig,
    _check: &OutputCheck,
) -> anyhow::Result<()> {
    bail!("this build has no CUDA backend (build with feature `cuda`)")
}

fn element_descr(shape: &xla_vmm::Shape) -> String {
    let bits = shape.element_type.bit_width().unwrap_or(8) as usize;
    npz::descr_for_element(shape.element_type.name().unwrap_or("?"), bits.div_ceil(8))
}

/// Load, upload inputs, run once (checked), then time `--steps` runs.
pub fn replay<B: Backend>(
    backend: Arc<B>,
    plan: xla_vmm::Plan,
    gemm: Option<Arc<dyn xla_vmm_device::blas::GemmEngine<B>>>,
    inputs: Vec<(String, NpyArray)>,
    args: &Args,
    config: &RunConfig,
    check: &OutputCheck,
) -> anyhow::Result<()> {
    let be = &*backend;
    be.budget().set_limits(config.memory);
    let stream = be.stream_create()?;
    let t = Instant::now();
    let gpu = match args.backend {
        crate::BackendKind::Host => gpu_thunks(&plan),
        _ => Vec::new(),
    };
    let mode = config.mode;
    let mut exe = Executable::load_with(backend.clone(), plan, gemm, None, config, &stream)
        .map_err(|e| match needs_gpu_reason(&e, &gpu) {
            Some(reason) => anyhow::Error::new(NeedsGpu { reason }),
            None => e.into(),
        })?;
    eprintln!("loaded in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let allocator = setup_binding(&backend, &exe)?;

    let mut params: Vec<Buffer<B>> = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        let in_names = |i: usize| format!("in_{i}");
        bind_inputs(
            be,
            &allocator,
            &mut exe,
            &stream,
            &inputs,
            &in_names,
            &args.inputs,
            &mut params,
        )?;
        let t = Instant::now();
        let outs = exe.step(&stream)?;
        be.stream_synchronize(&stream)?;
        eprintln!(
            "first run ({mode:?}) in {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        let arrays = read_outputs(be, &outs, &stream)?;
        if let Some(path) = &args.outputs {
            npz::write_npz(path, &arrays)?;
            eprintln!("wrote {} outputs to {}", arrays.len(), path.display());
        }
        let mut failed = false;
        if let Some(path) = &args.compare {
            failed = !compare(&arrays, &npz::read_npz(path)?, path, check)?;
        }
        if args.steps > 0 {
            for _ in 0..args.warmup {
                exe.step(&stream)?;
            }
            time_steps(be, &mut exe, &stream, None, args.steps, args.pipelined)?;
        }
        if args.loop_steps > 0 {
            if args.steps > 0 {
                bail!(
                    "--loop-steps needs the state of the first run: do not combine it with --steps"
                );
            }
            failed |= !train_loop(be, &allocator, &mut exe, &stream, &mut params, args)?;
        }
        if let Some(st) = exe.stats() {
            println!("{}", st.line());
            println!("{}", st.phases_line());
        }
        let m = be.budget().usage();
        if m.spilled > 0 || m.limits.device.is_some() {
            println!(
                "memory: device {} bytes (peak {}), host {} bytes (peak {}), {} allocations past the device budget",
                m.device_bytes, m.device_peak_bytes, m.host_bytes, m.host_peak_bytes, m.spilled
            );
        }
        if let Some(s) = exe.program().staging_summary() {
            println!(
                "staging: area {} bytes; {} buffers staged ({} bytes; {} of them kept from step to step, {} bytes, {} fetched by the step before, {} bytes; copied in before {} steps), {} read in place ({} bytes), {} bytes on the device; per step {} bytes in, {} out",
                s.area_bytes, s.staged, s.staged_bytes, s.kept, s.kept_bytes, s.carried, s.carried_bytes, s.refills,
                s.in_place, s.in_place_bytes, s.device_bytes, s.bytes_in_per_step, s.bytes_out_per_step
            );
            if s.timed_steps > 0 {
                println!(
                    "staging, last step timed: {:.1} us on the device, copies in {:.1} us at {:.1} GB/s, compute waited {:.1} us, link {:.0}% busy",
                    s.gpu_step_us, s.copy_in_us, s.copy_in_gbps, s.waited_us, 100.0 * s.link_utilisation
                );
            }
        } else if let Some(why) = exe.program().staging_note() {
            println!(
                "staging: none; part of its memory is in host memory, read there in place ({why})"
            );
        }
        if let Some(g) = exe.guard_report() {
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |u| format!("{:.3}", u / 1e3));
            let eager = if g.eager_skipped {
                "not sampled (recapture replayed one graph)".to_string()
            } else {
                ms(g.eager_us)
            };
            println!(
                "guard: runs as {} from step {} (median step ms: va-stable {} recapture {} eager {eager})",
                g.runner.name(),
                g.decided_at_step,
                ms(g.va_stable_us),
                ms(g.recapture_us),
            );
            if let Some(s) = &g.second_look {
                // The runner that kept the program, then graph-recapture.
                let kept = match (s.va_stable_us, s.eager_us) {
                    (None, Some(e)) => format!("eager {}", ms(Some(e))),
                    (v, _) => format!("va-stable {}", ms(v)),
                };
                println!(
                    "guard: second look at step {}: runs as {} (median step ms: {kept} recapture {})",
                    s.decided_at_step,
                    g.runner.name(),
                    ms(s.recapture_us)
                );
            }
        }
        if failed {
            bail!(
                "outputs differ from {}",
                args.compare
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
        Ok(())
    })();
    be.stream_synchronize(&stream).ok();
    drop(exe);
    drop(params);
    for e in allocator.take_deferred_errors() {
        eprintln!("deferred device error: {e}");
    }
    be.stream_destroy(stream).ok();
    result
}

/// How the command's programs run: the environment (`XLA_VMM_EXEC_MODE`,
/// ...), then `--mode` and `--threshold`; buffers are immutable while bound
/// (the loop writes a buffer only before binding it, a fresh buffer or a new
/// generation of a reused block, or through donation).
pub(crate) fn run_config(args: &Args) -> anyhow::Result<RunConfig> {
    let mut config = crate::run_config_from_env()?;
    if let Some(m) = &args.mode {
        config.mode = Mode::parse(m).map_err(|e| anyhow!("--mode: {e}"))?;
    }
    if let Some(t) = args.threshold {
        config.binding.threshold = Threshold::from(t);
    }
    config.binding.immutable_buffers = true;
    Ok(config)
}

/// The allocator of the parameter buffers as `exe`'s binding wants it.
pub(crate) fn setup_binding<B: Backend>(
    backend: &Arc<B>,
    exe: &Executable<B>,
) -> anyhow::Result<VmmAllocator<B>> {
    let binding = &exe.config().binding;
    // Under 0 every parameter buffer is its own remappable allocation (no
    // sub-allocation), as XLA's own VMM allocator does.
    let vmm_cfg = if binding.threshold.raw() == 0 {
        VmmConfig {
            small_threshold: 0,
            ..VmmConfig::default()
        }
    } else {
        VmmConfig::default()
    };
    Ok(VmmAllocator::new(backend.clone(), vmm_cfg)?)
}

/// Why array `a` cannot be parameter `shape`: its dtype, byte order or
/// dims differ (`None` when it fits). bf16 and the other types numpy lacks
/// are void types (`<V2`) of the element's width.
fn input_mismatch(a: &NpyArray, shape: &xla_vmm::Shape) -> Option<String> {
    let want = element_descr(shape);
    let body = |d: &str| d.trim_start_matches(['<', '|', '=']).to_string();
    if a.descr.starts_with('>') && a.item_size().is_some_and(|n| n > 1) {
        return Some(format!(
            "big-endian {} (the runtime takes little-endian data)",
            a.descr
        ));
    }
    if body(&a.descr) != body(&want) {
        return Some(format!("dtype {} where the parameter is {want}", a.descr));
    }
    let dims: Vec<u64> = shape.dimensions.iter().map(|&d| d.max(0) as u64).collect();
    if a.shape != dims {
        return Some(format!(
            "shape {:?} where the parameter is {dims:?}",
            a.shape
        ));
    }
    None
}

/// Every parameter i has its input `name_of(i)` in `inputs`, of the
/// parameter's dtype, byte order and shape, and there are no extra `in_*`
/// arrays: checked before any device is opened.
pub(crate) fn check_inputs(
    shapes: &[xla_vmm::Shape],
    inputs: &[(String, NpyArray)],
    name_of: &dyn Fn(usize) -> String,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    for (i, shape) in shapes.iter().enumerate() {
        let name = name_of(i);
        let (_, a) = inputs
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| anyhow!("{} has no {name} (parameter {i})", path.display()))?;
        shape
            .byte_size()
            .ok_or_else(|| anyhow!("parameter {i}: non-array shape"))?;
        if let Some(why) = input_mismatch(a, shape) {
            bail!(
                "{}: {name} does not fit parameter {i}: {why}",
                path.display()
            );
        }
    }
    let suffix = name_of(0).strip_prefix("in_0").unwrap_or("").to_string();
    let extra = inputs
        .iter()
        .filter(|(n, _)| {
            n.strip_prefix("in_")
                .and_then(|r| r.strip_suffix(suffix.as_str()))
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|c| c.is_ascii_digit()))
        })
        .count()
        .saturating_sub(shapes.len());
    if extra > 0 {
        bail!(
            "{} has {extra} more in_* arrays than the {} parameters",
            path.display(),
            shapes.len()
        );
    }
    Ok(())
}

/// Upload input `name_of(i)` of `inputs` for every parameter i and bind it
/// (buffers pushed to `params`); the caller ran [`check_inputs`] before
/// opening the device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bind_inputs<B: Backend>(
    be: &B,
    allocator: &VmmAllocator<B>,
    exe: &mut Executable<B>,
    stream: &B::Stream,
    inputs: &[(String, NpyArray)],
    name_of: &dyn Fn(usize) -> String,
    path: &std::path::Path,
    params: &mut Vec<Buffer<B>>,
) -> anyhow::Result<()> {
    let shapes = exe.parameter_shapes().to_vec();
    for (i, shape) in shapes.iter().enumerate() {
        let name = name_of(i);
        let (_, a) = inputs
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| anyhow!("{} has no {name}", path.display()))?;
        let want = shape
            .byte_size()
            .ok_or_else(|| anyhow!("parameter {i}: non-array shape"))?;
        if a.data.len() as u64 != want {
            bail!(
                "{name}: {} bytes, parameter {i} needs {want} bytes",
                a.data.len()
            );
        }
        let buf = allocator.alloc(want.max(1))?;
        if want > 0 {
            be.write_sync(buf.ptr(), &a.data, stream)?;
        }
        exe.bind_buffer(i, &buf)?;
        params.push(buf);
    }
    // Under a device budget, the first run's plan may want them elsewhere:
    // moved under their addresses, as the plugin does (one that cannot move
    // stays where it is, said).
    let at: Vec<_> = params
        .iter()
        .map(|b| (Some(b.location()), b.remappable()))
        .collect();
    for (i, to) in exe.placement(&at, stream, &mut Reclaimed::default) {
        match params[i].relocate(to, stream) {
            Ok(_) => exe.bind_buffer(i, &params[i])?,
            Err(e) => tracing::warn!(input = i, to = ?to, error = %e,
                "an input's memory could not move; it stays"),
        }
    }
    Ok(())
}

/// The outputs as `out_<i>` arrays (synchronize the stream first).
pub(crate) fn read_outputs<B: Backend>(
    be: &B,
    outs: &[xla_vmm_runtime::Output],
    stream: &B::Stream,
) -> anyhow::Result<Vec<(String, NpyArray)>> {
    let mut arrays = Vec::with_capacity(outs.len());
    for o in outs {
        let mut data = vec![0u8; o.bytes as usize];
        if o.bytes > 0 {
            be.read_sync(&mut data, o.ptr, stream)?;
        }
        let array = NpyArray {
            descr: element_descr(&o.shape),
            shape: o
                .shape
                .dimensions
                .iter()
                .map(|&d| d.max(0) as u64)
                .collect(),
            data,
        };
        arrays.push((format!("out_{}", o.index), array));
    }
    Ok(arrays)
}

/// Print bit-identical / first mismatches per output; true when all match.
pub(crate) fn compare(
    got: &[(String, NpyArray)],
    expected: &[(String, NpyArray)],
    path: &std::path::Path,
    check: &OutputCheck,
) -> anyhow::Result<bool> {
    let mut all = true;
    let mut tolerated = 0;
    for (name, g) in got {
        let Some((_, e)) = expected.iter().find(|(n, _)| n == name) else {
            println!("{name}: not in {}", path.display());
            all = false;
            continue;
        };
        if g.data == e.data {
            println!("{name}: bit-identical ({} bytes)", g.data.len());
            continue;
        }
        let stock_nondet = check.nondeterministic.contains(name);
        if stock_nondet {
            tolerated += 1;
        } else {
            all = false;
        }
        if g.data.len() != e.data.len() {
            println!(
                "{name}: size differs: got {} bytes, expected {}",
                g.data.len(),
                e.data.len()
            );
            continue;
        }
        let item = g.item_size().unwrap_or(1).max(1);
        let mut shown = 0;
        let mut count = 0usize;
        for (i, (a, b)) in g.data.chunks(item).zip(e.data.chunks(item)).enumerate() {
            if a != b {
                count += 1;
                if shown < 5 {
                    println!(
                        "{name}[{i}]: got {} expected {}",
                        show(a, &g.descr),
                        show(b, &g.descr)
                    );
                    shown += 1;
                }
            }
        }
        println!("{name}: {count} of {} elements differ", g.data.len() / item);
        if let Some(w) = check.writers.get(name) {
            println!("{name}: written by {}", w.join(", "));
        }
        if stock_nondet {
            println!(
                "{name}: stock XLA does not reproduce this output run to run either (tolerated)"
            );
        }
    }
    let missing = expected
        .iter()
        .filter(|(n, _)| n.starts_with("out_") && !got.iter().any(|(g, _)| g == n))
        .count();
    if missing > 0 {
        println!("{missing} expected outputs were not produced");
        all = false;
    }
    println!(
        "{}",
        if all && tolerated == 0 {
            "ALL OUTPUTS BIT-IDENTICAL".to_string()
        } else if all {
            format!(
                "OUTPUTS BIT-IDENTICAL except {tolerated} that stock XLA does not reproduce itself"
            )
        } else {
            "OUTPUTS DIFFER".to_string()
        }
    );
    Ok(all)
}

fn show(b: &[u8], descr: &str) -> String {
    let hex: String = b.iter().rev().map(|x| format!("{x:02x}")).collect();
    match (descr, b.len()) {
        ("<f4", 4) => format!("{} (0x{hex})", f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        (_, 2) if descr.contains('V') => {
            // bf16: the high half of an f32.
            format!(
                "{} (0x{hex})",
                f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
            )
        }
        _ => format!("0x{hex}"),
    }
}

/// `--schedule MODE:N,...`: one mode per step.
fn parse_schedule(text: &str) -> anyhow::Result<Vec<Mode>> {
    let mut modes = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (mode, n) = part
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("--schedule: '{part}' is not MODE:STEPS"))?;
        let mode = Mode::parse(mode).map_err(|e| anyhow!("--schedule: {e}"))?;
        let n: usize = n
            .parse()
            .map_err(|_| anyhow!("--schedule: '{n}' in '{part}' is not a step count"))?;
        if n > 1_000_000 {
            bail!("--schedule: {n} steps of {} is absurd", mode.name());
        }
        modes.extend(std::iter::repeat_n(mode, n));
    }
    Ok(modes)
}

/// `--loop-steps`: the first run already happened (its loss is step 0).
///
/// Outputs are fed back as a donated JAX loop does: an output aliased with
/// its parameter already is the parameter's buffer (updated in place); any
/// other state output is copied into a fresh buffer that becomes the next
/// input, and the old input buffer is freed (stream ordered).
fn train_loop<B: Backend>(
    be: &B,
    allocator: &VmmAllocator<B>,
    exe: &mut Executable<B>,
    stream: &B::Stream,
    params: &mut [Buffer<B>],
    args: &Args,
) -> anyhow::Result<bool> {
    let read_loss = |exe: &Executable<B>| -> anyhow::Result<u32> {
        let outs = exe.outputs()?;
        let last = outs.last().ok_or_else(|| anyhow!("no outputs"))?;
        if last.bytes != 4 {
            bail!("last output is {} bytes, not an f32 loss", last.bytes);
        }
        let mut b = [0u8; 4];
        be.read_sync(&mut b, last.ptr, stream)?;
        Ok(u32::from_le_bytes(b))
    };
    let schedule = args
        .schedule
        .as_deref()
        .map(parse_schedule)
        .transpose()?
        .unwrap_or_default();
    let mut bits = vec![read_loss(exe)?];
    // Per-step wall time (feed, run, wait, read the loss), for integration/ab.py.
    let mut step_ms = vec![None];
    for step in 1..args.loop_steps {
        let t = Instant::now();
        let outs = exe.outputs()?;
        let n_state = outs.len().saturating_sub(1);
        for (i, o) in outs.iter().take(n_state).enumerate() {
            let Some(p) = params.get_mut(i) else {
                bail!("output {i} has no input to feed");
            };
            if o.bytes != p.size() {
                bail!(
                    "output {} ({} bytes) cannot feed input {} ({} bytes)",
                    o.index,
                    o.bytes,
                    o.index,
                    p.size()
                );
            }
            if o.parameter == Some(i) || o.ptr == p.ptr() {
                continue;
            }
            let fresh = allocator.alloc(o.bytes.max(1))?;
            be.copy_d2d(fresh.ptr(), o.ptr, o.bytes, stream)?;
            let old = std::mem::replace(p, fresh);
            exe.bind_buffer(i, p)?;
            allocator.free(old, stream)?;
        }
        match schedule.get(step - 1) {
            Some(&mode) => drop(exe.run(stream, mode)?),
            None => drop(exe.step(stream)?),
        }
        be.stream_synchronize(stream)?;
        bits.push(read_loss(exe)?);
        step_ms.push(Some(t.elapsed().as_secs_f64() * 1e3));
    }
    for (i, (b, ms)) in bits.iter().zip(&step_ms).enumerate() {
        match ms {
            Some(ms) => println!("loss[{i}] = {} (0x{b:08x}) {ms:.3} ms", f32::from_bits(*b)),
            None => println!("loss[{i}] = {} (0x{b:08x})", f32::from_bits(*b)),
        }
    }
    let Some(path) = &args.loop_ref else {
        return Ok(true);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let want: Vec<u32> = json["loss_bits"]
        .as_array()
        .ok_or_else(|| anyhow!("{}: no loss_bits", path.display()))?
        .iter()
        .map(|v| v.as_u64().unwrap_or(u64::MAX) as u32)
        .collect();
    let n = want.len().min(bits.len());
    let first_diff = (0..n).find(|&i| want[i] != bits[i]);
    match first_diff {
        None => println!("LOSSES BIT-IDENTICAL for {n} steps"),
        Some(i) => println!(
            "LOSSES DIFFER from step {i}: got {} (0x{:08x}) expected {} (0x{:08x})",
            f32::from_bits(bits[i]),
            bits[i],
            f32::from_bits(want[i]),
            want[i]
        ),
    }
    Ok(first_diff.is_none())
}

/// Time `steps` steps: as the configuration says (`mode` `None`: guarded
/// where it is on), or all in `mode`.
pub(crate) fn time_steps<B: Backend>(
    be: &B,
    exe: &mut Executable<B>,
    stream: &B::Stream,
    mode: Option<Mode>,
    steps: usize,
    pipelined: bool,
) -> anyhow::Result<()> {
    let one = |exe: &mut Executable<B>| match mode {
        Some(m) => exe.run(stream, m).map(drop),
        None => exe.step(stream).map(drop),
    };
    let mode = mode.unwrap_or(exe.config().mode);
    let before = exe.stats().map(|s| (s.phases, s.counters.steps));
    let (start, end) = (be.event_create()?, be.event_create()?);
    if pipelined {
        let t = Instant::now();
        be.event_record(&start, stream)?;
        for _ in 0..steps {
            one(exe)?;
        }
        be.event_record(&end, stream)?;
        let host = t.elapsed().as_secs_f64() * 1e3;
        be.event_synchronize(&end)?;
        let gpu = f64::from(be.event_elapsed_ms(&start, &end)?);
        let n = steps.max(1) as f64;
        println!(
            "steps={steps} mode={mode:?} pipelined: stream ms/step {:.3} | host enqueue ms/step {:.3}",
            gpu / n,
            host / n
        );
        be.event_destroy(start).ok();
        be.event_destroy(end).ok();
        return Ok(());
    }
    let mut gpu = Vec::with_capacity(steps);
    let mut wall = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        be.event_record(&start, stream)?;
        one(exe)?;
        be.event_record(&end, stream)?;
        be.event_synchronize(&end)?;
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        gpu.push(f64::from(be.event_elapsed_ms(&start, &end)?));
    }
    be.event_destroy(start).ok();
    be.event_destroy(end).ok();
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        (p(0.5), v[0], p(0.9))
    };
    let (m, mn, p90) = stats(&mut wall);
    let (gm, gmn, gp90) = stats(&mut gpu);
    println!(
        "steps={steps} mode={mode:?} wall ms: median {m:.3} min {mn:.3} p90 {p90:.3} | \
         stream ms: median {gm:.3} min {gmn:.3} p90 {gp90:.3}"
    );
    // Host time per phase of the timed steps only (setup and warm-up of the
    // first run left out).
    if let (Some(st), Some((p0, n0))) = (exe.stats(), before) {
        let mut timed = st.clone();
        timed.phases = st.phases.minus(&p0);
        timed.counters.steps = st.counters.steps - n0;
        println!("timed {}", timed.phases_line());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm_runtime::RuntimeError as E;

    #[test]
    fn only_a_gpu_thunk_refused_as_unsupported_is_a_program_needing_a_gpu() {
        let gpu = vec![
            "custom_kernel thunk 'fusion': ".to_string(),
            "cublas_lt_matmul thunk 'dot': ".to_string(),
        ];
        let kernel = "while thunk 'w': custom_kernel thunk 'fusion': unsupported: no GPU code here";
        assert_eq!(
            needs_gpu_reason(&E::InvalidProgram(kernel.into()), &gpu).as_deref(),
            Some(kernel)
        );
        let gemm = "cublas_lt_matmul thunk 'dot': no BLAS-Lt engine on this backend";
        assert_eq!(
            needs_gpu_reason(&E::Unsupported(gemm.into()), &gpu).as_deref(),
            Some(gemm)
        );
        // A malformed GPU thunk, a thunk that is not GPU work, an error of another kind: errors.
        let bad = "custom_kernel thunk 'fusion': slice 3 outside allocation 1";
        assert_eq!(needs_gpu_reason(&E::InvalidProgram(bad.into()), &gpu), None);
        let copy = "copy thunk 'c': unsupported: something";
        assert_eq!(
            needs_gpu_reason(&E::InvalidProgram(copy.into()), &gpu),
            None
        );
        let io = E::Io {
            path: "x".into(),
            message: "custom_kernel thunk 'fusion': unsupported: x".into(),
        };
        assert_eq!(needs_gpu_reason(&io, &gpu), None);
        assert_eq!(
            needs_gpu_reason(&E::InvalidProgram(kernel.into()), &[]),
            None
        );
    }

    #[test]
    fn a_schedule_is_one_mode_per_step_and_bad_parts_are_named() {
        let s = parse_schedule("graph-recapture:2,eager:1,graph:2").unwrap();
        use Mode::*;
        assert_eq!(s, [GraphRecapture, GraphRecapture, Eager, Graph, Graph]);
        for (bad, says) in [
            ("eager", "not MODE:STEPS"),
            ("fast:3", "--schedule"),
            ("eager:x", "'x' in 'eager:x' is not a step count"),
            ("eager:99999999999", "absurd"),
        ] {
            let e = parse_schedule(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}

//! `xla-vmm inspect FILE [--json] [--time N]`: decode a serialized XLA GPU
//! executable and summarize it (allocations by role, thunk tree, kinds,
//! unsupported thunks). `--host-modules DIR` writes the HLO module of each
//! host-offloaded computation (`host_execute_start`) to DIR;
//! `--memory-budget BYTES` adds its residency plan (residency.rs).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use xla_vmm::{Access, AllocationRole, KernelCode, Nested, Plan, Thunk, ThunkKind};

#[derive(clap::Args)]
pub struct Args {
    /// The bytes `PJRT_Executable_Serialize` returns, or jax's `serialize()`
    /// bytes (with the IFRT header).
    file: PathBuf,
    /// Print one JSON object instead of the readable summary.
    #[arg(long)]
    json: bool,
    /// In the thunk tree, list under each thunk the slices it reads and
    /// writes (`#ALLOCATION+OFFSET BYTES`, read / write / overwrite), as the
    /// runtime and the residency planner see them.
    #[arg(long)]
    uses: bool,
    /// Also decode the file N times and report the decode time.
    #[arg(long, value_name = "N")]
    time: Option<u32>,
    /// Write the `xla.HloModuleProto` of each host-offloaded computation to
    /// DIR/THUNK_NAME.hlo.pb (and XLA:CPU's compile of it, when the
    /// executable carries one, to DIR/THUNK_NAME.cpu_aot.pb).
    #[arg(long, value_name = "DIR")]
    host_modules: Option<PathBuf>,
    /// Plan the program under this device memory budget (`16G`, `512M`,
    /// bytes): which buffers stay in device memory, which are staged ahead
    /// of their thunks, which are read in place from host memory, the bytes
    /// over the link per step and the thunks expected to wait.
    #[arg(long, value_name = "BYTES", value_parser = crate::residency::parse_budget)]
    memory_budget: Option<u64>,
    /// With --memory-budget: also plan the program as the plugin runs it
    /// under that device memory limit (parameters allocated first, then its
    /// own buffers, each in host memory past the limit less the staging
    /// reserve; then the staging of its first run).
    #[arg(long, requires = "memory_budget")]
    as_run: bool,
    /// The staging reserve --as-run assumes, percent of the limit
    /// (`XLA_VMM_STAGING_RESERVE`).
    #[arg(
        long,
        value_name = "PERCENT",
        default_value_t = 25,
        requires = "as_run"
    )]
    staging_reserve: u64,
    /// With --as-run: no first-run moves (the plugin's `XLA_VMM_REBALANCE=0`).
    #[arg(long, requires = "as_run")]
    no_rebalance: bool,
    /// With --as-run: device memory other programs hold already (their
    /// temporaries, outputs kept alive), under the limit and never moved for
    /// this program (`512M`, bytes).
    #[arg(long, value_name = "BYTES", value_parser = crate::residency::parse_budget, requires = "as_run")]
    device_held: Option<u64>,
    /// With --as-run: then this executable, taking the same parameters (by
    /// number), loaded after the first ran: staged in the area the first made
    /// (the inference bench's decode after its prefill).
    #[arg(long, value_name = "FILE", requires = "as_run")]
    then: Option<PathBuf>,
    #[command(flatten)]
    rates: crate::residency::RateArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let bytes = crate::read_executable(&args.file)?;
    let start = Instant::now();
    let plan =
        xla_vmm::decode(&bytes).with_context(|| format!("decoding {}", args.file.display()))?;
    let first = start.elapsed();
    if let Some(dir) = &args.host_modules {
        write_host_modules(&plan, dir)?;
    }
    let timing = match args.time {
        Some(n) if n > 0 => Some(time_decode(&bytes, n)?),
        _ => None,
    };
    let residency = match args.memory_budget {
        Some(b) => Some(crate::residency::plan(&plan, b, &args.rates)?),
        None => None,
    };
    let planning = std::time::Instant::now();
    let as_run = match args.memory_budget.filter(|_| args.as_run) {
        Some(b) => Some(crate::residency::as_run(
            &plan,
            b,
            args.staging_reserve,
            args.device_held.unwrap_or(0),
            !args.no_rebalance,
            &args.rates,
        )?),
        None => None,
    };
    // What a program's first run under the budget plans (its staging, and
    // the moves of its memory), here on this machine's CPU.
    let planning = planning.elapsed();
    let then = match (&as_run, &args.then) {
        (Some(a), Some(f)) => {
            let bytes = crate::read_executable(f)?;
            let second =
                xla_vmm::decode(&bytes).with_context(|| format!("decoding {}", f.display()))?;
            Some((
                f,
                crate::residency::then_staging(&plan, a, &second, &args.rates)?,
            ))
        }
        _ => None,
    };
    if args.json {
        let mut v = summary_json(&plan);
        if let Some(t) = &timing {
            v["decode_time_us"] =
                json!({"min": t.min.as_micros(), "median": t.median.as_micros(), "runs": t.runs});
        }
        if let Some(r) = &residency {
            v["residency"] = crate::residency::json(&r.0, &r.1);
        }
        if let Some(a) = &as_run {
            v["as_run"] = crate::residency::as_run_json(a);
            v["as_run"]["planning_us"] = json!(planning.as_micros());
        }
        if let Some((_, p)) = &then {
            v["as_run"]["then"] = json!({"staging": p.as_ref().map(|p| p.summary())});
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", summary_text(&plan, bytes.len(), args.uses));
        if let Some(r) = &residency {
            print!("{}", crate::residency::text(&plan, &r.0, &r.1));
        }
        if let Some(a) = &as_run {
            print!("{}", crate::residency::as_run_text(a));
            println!(
                "  planned in {:.3} s (what the program's first run under this limit plans, on this CPU)",
                planning.as_secs_f64()
            );
        }
        if let Some((f, p)) = &then {
            print!(
                "{}",
                crate::residency::then_text(&f.display().to_string(), p.as_ref())
            );
        }
        match &timing {
            Some(t) => println!(
                "decode time: min {:.3} ms, median {:.3} ms over {} runs",
                ms(t.min),
                ms(t.median),
                t.runs
            ),
            None => println!(
                "decode time: {:.3} ms (one run; --time N for more)",
                ms(first)
            ),
        }
    }
    Ok(())
}

fn write_host_modules(plan: &Plan, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut err = None;
    plan.walk(&mut |t, _| {
        if let (ThunkKind::HostExecuteStart(h), None) = (&t.kind, &err) {
            let name: String = t
                .info
                .profile_annotation
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let mut files = vec![(format!("{name}.hlo.pb"), &*h.hlo_module)];
            if let Some(aot) = &h.aot_result {
                files.push((format!("{name}.cpu_aot.pb"), &**aot));
            }
            for (file, bytes) in files {
                let path = dir.join(file);
                if let Err(e) = std::fs::write(&path, bytes) {
                    err = Some(anyhow::anyhow!("writing {}: {e}", path.display()));
                }
            }
        }
    });
    err.map_or(Ok(()), Err)
}

struct Timing {
    min: Duration,
    median: Duration,
    runs: u32,
}

fn time_decode(bytes: &[u8], runs: u32) -> anyhow::Result<Timing> {
    let mut t = Vec::with_capacity(runs as usize);
    for _ in 0..runs {
        let s = Instant::now();
        let plan = xla_vmm::decode(bytes)?;
        t.push(s.elapsed());
        drop(plan);
    }
    t.sort();
    Ok(Timing {
        min: t[0],
        median: t[t.len() / 2],
        runs,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `--json` object. Keys `allocations`, `roles`, `top_level_thunks`,
/// `kinds` and `bytes` are relied on by scripts.
pub fn summary_json(plan: &Plan) -> serde_json::Value {
    let mut roles: BTreeMap<&str, usize> = ["parameter", "constant", "output", "temp"]
        .iter()
        .map(|r| (*r, 0))
        .collect();
    let mut role_bytes: BTreeMap<&str, u64> = roles.keys().map(|r| (*r, 0)).collect();
    for a in &plan.allocations {
        *roles.entry(a.role.name()).or_default() += 1;
        *role_bytes.entry(a.role.name()).or_default() += a.size;
    }
    let kinds = plan.kind_counts();
    let unsupported: Vec<_> = plan
        .unsupported()
        .iter()
        .map(|t| match &t.kind {
            ThunkKind::Unsupported {
                kind_name,
                field_number,
            } => json!({"kind": kind_name, "field_number": field_number,
                        "profile_annotation": t.info.profile_annotation}),
            _ => json!(null),
        })
        .collect();
    json!({
        "module": plan.module_name,
        "compute_capability": plan.compute_capability,
        "allocations": plan.allocations.len(),
        "roles": roles,
        "role_bytes": role_bytes,
        "bytes": plan.total_allocation_bytes(),
        "multi_device": multi_device_count(plan),
        "top_level_thunks": plan.thunks.len(),
        "total_thunks": kinds.values().sum::<usize>(),
        "kinds": kinds,
        "unsupported": unsupported,
        "parameters": plan.program_shape.parameters.len(),
        "outputs": plan.outputs.len(),
        "module_binary_bytes": plan.kernels.binary.len(),
        "asm_text_bytes": plan.kernels.asm_text.len(),
        "custom_kernel_binaries": plan.custom_kernel_binaries().len(),
        "load_check": match xla_vmm_runtime::ops::load_check(plan) {
            Ok(r) => json!({"ok": true, "kernels": r.kernels, "images": r.images, "ptx_kernels": r.ptx_kernels,
                            "tma_kernels": r.tma_kernels}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        },
    })
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The readable summary.
pub fn summary_text(plan: &Plan, file_len: usize, uses: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "module `{}` ({:?}), {} serialized bytes, client `{}`",
        plan.module_name, plan.compute_capability, file_len, plan.pjrt_client_name
    );
    let _ = writeln!(
        s,
        "program: {} parameters, {} result leaves; module binary {}, PTX {}, {} custom kernel images",
        plan.program_shape.parameters.len(),
        plan.outputs.len(),
        human(plan.kernels.binary.len() as u64),
        human(plan.kernels.asm_text.len() as u64),
        plan.custom_kernel_binaries().len()
    );
    // What loading checks before it needs a device (thunk support, each
    // kernel in a code image of the program's platform).
    let _ = match xla_vmm_runtime::ops::load_check(plan) {
        Ok(r) => writeln!(
            s,
            "load check: ok ({} kernels in {} code images{}{})",
            r.kernels,
            r.images,
            if r.ptx_kernels > 0 {
                format!(", {} from PTX at load", r.ptx_kernels)
            } else {
                String::new()
            },
            if r.tma_kernels > 0 {
                format!(
                    "; {} take TMA descriptors, which HIP does not have",
                    r.tma_kernels
                )
            } else {
                String::new()
            }
        ),
        Err(e) => writeln!(s, "load check: {e}"),
    };
    let _ = writeln!(
        s,
        "\nallocations: {} ({} total)",
        plan.allocations.len(),
        human(plan.total_allocation_bytes())
    );
    for role in ["parameter", "constant", "output", "temp"] {
        let mut allocs: Vec<_> = plan
            .allocations
            .iter()
            .filter(|a| a.role.name() == role)
            .collect();
        let total: u64 = allocs.iter().map(|a| a.size).sum();
        let _ = writeln!(s, "  {role:<9} {:>4}  {:>10}", allocs.len(), human(total));
        // Temps can be many: show the largest few.
        let shown = if role == "temp" { 5 } else { usize::MAX };
        if role == "temp" {
            allocs.sort_by_key(|a| std::cmp::Reverse(a.size));
        }
        for a in allocs.iter().take(shown) {
            let detail = match &a.role {
                AllocationRole::Parameter {
                    number,
                    shape_index,
                    aliased_with_output,
                } => format!(
                    "param {number}{}{}",
                    if shape_index.is_empty() {
                        String::new()
                    } else {
                        format!(" {shape_index:?}")
                    },
                    if *aliased_with_output {
                        ", aliased with output (donated)"
                    } else {
                        ""
                    }
                ),
                AllocationRole::Constant { symbol_name, bytes } => {
                    format!("`{symbol_name}`, {} initial bytes", bytes.len())
                }
                AllocationRole::Output { outputs } => {
                    let idx: Vec<_> = outputs
                        .iter()
                        .map(|o| format!("{:?}", o.shape_index))
                        .collect();
                    format!("result {}", idx.join(" "))
                }
                AllocationRole::Temp => String::new(),
            };
            let _ = writeln!(s, "    #{:<4} {:>10}  {detail}", a.index, human(a.size));
        }
        if allocs.len() > shown {
            let _ = writeln!(s, "    ... {} smaller", allocs.len() - shown);
        }
    }
    let kinds = plan.kind_counts();
    let _ = writeln!(
        s,
        "\nthunks: {} top level, {} in all",
        plan.thunks.len(),
        kinds.values().sum::<usize>()
    );
    let list: Vec<_> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(s, "  kinds: {}", list.join(", "));
    let unsupported = plan.unsupported();
    if unsupported.is_empty() {
        let _ = writeln!(s, "  unsupported: none");
    } else {
        let _ = writeln!(s, "  unsupported: {}", unsupported.len());
        for t in unsupported {
            if let ThunkKind::Unsupported {
                kind_name,
                field_number,
            } = &t.kind
            {
                let _ = writeln!(
                    s,
                    "    {kind_name} (ThunkProto field {field_number}) `{}`",
                    t.info.profile_annotation
                );
            }
        }
    }
    let multi = multi_device_count(plan);
    if multi > 0 {
        let _ = writeln!(
            s,
            "  multi-device: {multi} collective / replica-id / partition-id thunk(s) (need a communicator per clique: `xla-vmm run --devices N`)"
        );
    }
    let _ = writeln!(s, "\nthunk tree:");
    for (i, t) in plan.thunks.iter().enumerate() {
        outline(&mut s, t, i, 1, uses);
    }
    s
}

fn outline(s: &mut String, t: &Thunk, i: usize, depth: usize, uses: bool) {
    let pad = "  ".repeat(depth);
    let _ = writeln!(
        s,
        "{pad}[{i}] {} `{}`{}",
        t.kind_name(),
        t.info.profile_annotation,
        detail(t)
    );
    if uses {
        for (slice, access) in t.own_uses() {
            let _ = writeln!(
                s,
                "{pad}      #{}+{} {} {}",
                slice.allocation,
                slice.offset,
                human(slice.size),
                match access {
                    Access::Read => "read",
                    Access::Write => "write",
                    Access::Overwrite => "overwrite",
                }
            );
        }
    }
    for n in t.nested() {
        let label = match n {
            Nested::Sequence(_) => None,
            Nested::WhileCondition(_) => Some("condition".to_string()),
            Nested::WhileBody(_) => Some("body".to_string()),
            Nested::Branch(b, _) => Some(format!("branch {b}")),
            Nested::Embedded(_) => Some("embedded".to_string()),
        };
        let d = if let Some(l) = label {
            let _ = writeln!(s, "{pad}  {l}:");
            depth + 2
        } else {
            depth + 1
        };
        for (j, c) in n.thunks().iter().enumerate() {
            outline(s, c, j, d, uses);
        }
    }
}

fn detail(t: &Thunk) -> String {
    match &t.kind {
        ThunkKind::CustomKernel(k) => {
            let code = match &k.spec.code {
                KernelCode::Cubin { data } => format!("cubin {}", human(data.len() as u64)),
                KernelCode::Ptx { text } => format!("ptx {}", human(text.len() as u64)),
                KernelCode::InProcessSymbol { .. } => "in-process symbol".into(),
                KernelCode::None => "no code".into(),
            };
            let l = &k.launch;
            let tma = k.args.iter().filter(|a| a.tma.is_some()).count();
            let tma = if tma > 0 {
                format!(" ({tma} as TMA descriptors)")
            } else {
                String::new()
            };
            format!(
                " {} grid {}x{}x{} block {}x{}x{} smem {} args {}{tma} ({code})",
                k.spec.kernel_name,
                l.blocks.x,
                l.blocks.y,
                l.blocks.z,
                l.threads.x,
                l.threads.y,
                l.threads.z,
                l.shared_memory_bytes,
                k.args.len()
            )
        }
        ThunkKind::Kernel(k) => format!(" {} args {}", k.kernel_name, k.args.len()),
        ThunkKind::DeviceToDeviceCopy(c)
        | ThunkKind::Copy(c)
        | ThunkKind::DeviceToHostCopy(c)
        | ThunkKind::HostToDeviceCopy(c) => format!(
            " #{}+{} -> #{}+{} ({} B)",
            c.source.slice.allocation,
            c.source.slice.offset,
            c.destination.slice.allocation,
            c.destination.slice.offset,
            c.mem_size
        ),
        ThunkKind::While(w) => match w.trip_count {
            Some(n) => format!(" trip count {n}"),
            None => " trip count unknown".into(),
        },
        ThunkKind::AsyncStart(a) => format!(" id {} on {:?}", a.async_execution_id, a.stream),
        ThunkKind::AsyncDone { async_execution_id } => format!(" id {async_execution_id}"),
        ThunkKind::CublasLtMatmul(m) => format!(
            " d=#{}+{} algorithm {}",
            m.d.slice.allocation, m.d.slice.offset, m.algorithm_idx
        ),
        ThunkKind::CustomCall(c) => format!(" target {}", c.target_name),
        ThunkKind::SelectK(s) => format!(
            " {}[{}, {}] k {}",
            s.element_type.name().unwrap_or("?").to_lowercase(),
            s.batch,
            s.num_elements,
            s.k
        ),
        ThunkKind::HostExecuteStart(h) => format!(
            " id {} args {} results {} module {}{}",
            h.async_events_unique_id,
            h.args.len(),
            h.results.len(),
            human(h.hlo_module.len() as u64),
            if h.aot_result.is_some() {
                " (+ XLA:CPU AOT result)"
            } else {
                ""
            }
        ),
        ThunkKind::HostExecuteDone {
            async_events_unique_id,
        } => format!(" id {async_events_unique_id}"),
        ThunkKind::Convolution(c) => format!(
            " {:?} {} -> {} engine {} ({} knobs)",
            c.kind,
            c.operand0_shape.element_type.name().unwrap_or("?"),
            c.result_shape.element_type.name().unwrap_or("?"),
            c.algorithm.algo_id,
            c.algorithm.knobs.len()
        ),
        ThunkKind::Fft(f) => format!(
            " {} lengths {:?} {}{:?} -> {}{:?} #{}+{} -> #{}+{}",
            f.fft_type.name(),
            f.fft_length,
            f.input_shape.element_type.name().unwrap_or("?"),
            f.input_shape.dimensions,
            f.output_shape.element_type.name().unwrap_or("?"),
            f.output_shape.dimensions,
            f.input.allocation,
            f.input.offset,
            f.output.allocation,
            f.output.offset
        ),
        ThunkKind::TriangularSolve(t) => format!(
            " {} {}x{} x{} ({} side, {}{}, {:?})",
            t.element_type.name().unwrap_or("?"),
            t.m,
            t.n,
            t.batch,
            if t.left_side { "left" } else { "right" },
            if t.lower { "lower" } else { "upper" },
            if t.unit_diagonal {
                ", unit diagonal"
            } else {
                ""
            },
            t.transpose_a
        ),
        ThunkKind::Collective(c) => collective_detail(c),
        ThunkKind::ReplicaId { dest } | ThunkKind::PartitionId { dest } => {
            format!(" -> #{}+{} (multi-device)", dest.allocation, dest.offset)
        }
        ThunkKind::Unsupported { field_number, .. } => {
            format!(" UNSUPPORTED (field {field_number})")
        }
        _ => String::new(),
    }
}

/// Collective, replica-id and partition-id thunks anywhere in the tree
/// (run over communicators when the executable is given a device
/// assignment; trivial on one device).
fn multi_device_count(plan: &Plan) -> usize {
    let mut n = 0;
    plan.walk(&mut |t, _| {
        if matches!(
            t.kind,
            ThunkKind::Collective(_) | ThunkKind::ReplicaId { .. } | ThunkKind::PartitionId { .. }
        ) {
            n += 1;
        }
    });
    n
}

/// Groups, mode, reduction and buffers of a collective thunk.
fn collective_detail(c: &xla_vmm::CollectiveThunk) -> String {
    let groups: Vec<String> = c
        .replica_groups
        .iter()
        .map(|g| {
            let ids: Vec<String> = g.iter().map(|i| i.to_string()).collect();
            format!("{{{}}}", ids.join(","))
        })
        .collect();
    let groups = if groups.is_empty() {
        "all".to_string()
    } else {
        groups.join(",")
    };
    let mut out = format!(" groups {groups} {}", c.group_mode.name());
    if let Some(r) = c.reduction {
        let _ = write!(out, " reduction {}", r.name());
    }
    if !c.source_target_pairs.is_empty() {
        let pairs: Vec<String> = c
            .source_target_pairs
            .iter()
            .map(|(a, b)| format!("{a}->{b}"))
            .collect();
        let _ = write!(out, " pairs {}", pairs.join(","));
    }
    for b in &c.buffers {
        let ty = b.element_type.and_then(|t| t.name()).unwrap_or("?");
        let _ = write!(
            out,
            " [#{}+{} -> #{}+{} {} x{}]",
            b.source.slice.allocation,
            b.source.slice.offset,
            b.destination.slice.allocation,
            b.destination.slice.offset,
            ty,
            b.element_count
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm::{
        CollectiveBuffer, CollectiveOp, CollectiveThunk, ElementType, GroupMode, ReductionKind,
        ShapedSlice, Slice, ThunkInfo,
    };

    fn thunk(kind: ThunkKind) -> Thunk {
        Thunk {
            info: ThunkInfo {
                profile_annotation: "all-reduce.7".into(),
                ..Default::default()
            },
            kind,
        }
    }

    #[test]
    fn collectives_show_groups_reduction_and_buffers() {
        let s = |allocation, offset| ShapedSlice {
            slice: Slice {
                allocation,
                offset,
                size: 64,
            },
            shape: None,
        };
        let c = CollectiveThunk {
            op: CollectiveOp::AllReduce,
            replica_groups: vec![vec![0, 1], vec![2, 3]],
            group_mode: GroupMode::CrossPartition,
            operand_element_types: vec![ElementType::F32],
            use_symmetric_buffer: false,
            reduction: Some(ReductionKind::Max),
            buffers: vec![CollectiveBuffer {
                element_count: 16,
                element_type: Some(ElementType::F32),
                source: s(2, 0),
                destination: s(3, 64),
                source_memory_space: 0,
                destination_memory_space: 0,
            }],
            source_target_pairs: vec![],
            has_split_dimension: false,
            has_dynamic_root: false,
            from_collective_kernel: false,
            collectives_mode: 0,
        };
        let t = thunk(ThunkKind::Collective(Box::new(c)));
        assert_eq!(
            detail(&t),
            " groups {0,1},{2,3} cross_partition reduction max [#2+0 -> #3+64 F32 x16]"
        );
        let mut out = String::new();
        outline(&mut out, &t, 0, 0, false);
        assert!(
            out.contains("all_reduce") && out.contains("all-reduce.7"),
            "{out}"
        );
        let r = thunk(ThunkKind::ReplicaId {
            dest: Slice {
                allocation: 1,
                offset: 8,
                size: 4,
            },
        });
        assert_eq!(detail(&r), " -> #1+8 (multi-device)");
    }
}

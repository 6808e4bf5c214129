//! The plan of one `GpuExecutableProto`: allocations, constants, the
//! thunk tree and the outputs, checked against each other.

use std::collections::BTreeMap;

use super::convert::*;
use super::{thunk, DecodeError};
use crate::plan::{
    AllocationRole, Blob, ComputeCapability, KernelBinaries, OutputAlias, OutputInfo, Plan,
    ProgramShape,
};
use crate::proto::stream_executor::gpu_compute_capability_proto::ComputeCapability as CcProto;
use crate::proto::xla::gpu::GpuExecutableProto;

pub(crate) fn plan_from_proto(
    exe: GpuExecutableProto,
    pjrt_client_name: String,
) -> Result<Plan, DecodeError> {
    let alloc_protos = exe
        .buffer_allocations
        .as_ref()
        .map(|b| b.values.as_slice())
        .unwrap_or_default();
    let mut allocs = allocations(alloc_protos, "allocation")?;
    let n = allocs.len();

    let mut outputs = Vec::with_capacity(exe.output_info_map.len());
    for (i, e) in exe.output_info_map.iter().enumerate() {
        let info = e
            .output_info
            .as_ref()
            .ok_or_else(|| invalid(format!("output_info_map[{i}] has no output_info")))?;
        let allocation = alloc_index(info.allocation_index, n, &|| {
            format!("output_info_map[{i}]")
        })?;
        outputs.push(OutputInfo {
            shape_index: e
                .shape_index
                .as_ref()
                .map(|s| s.indexes.clone())
                .unwrap_or_default(),
            allocation,
            passthrough: info.passthrough,
            alias: info.alias_config.as_ref().map(|a| OutputAlias {
                output_shape_index: a.output_shape_index.clone(),
                parameter_number: a.parameter_number,
                parameter_shape_index: a.parameter_shape_index.clone(),
                kind: a.kind,
            }),
        });
    }
    for o in &outputs {
        if let AllocationRole::Output { outputs } = &mut allocs[o.allocation].role {
            outputs.push(o.clone());
        }
    }

    for (i, c) in exe.constants.into_iter().enumerate() {
        let a = alloc_index(c.allocation_index, n, &|| format!("constants[{i}]"))?;
        let alloc_size = allocs[a].size;
        match &mut allocs[a].role {
            AllocationRole::Constant { symbol_name, bytes } => {
                let data = c.content.map(|d| d.data).unwrap_or_default();
                if data.len() as u64 > alloc_size {
                    return Err(invalid(format!(
                        "constants[{i}] `{}`: {} bytes do not fit allocation {a} ({} bytes)",
                        c.symbol_name,
                        data.len(),
                        alloc_size
                    )));
                }
                *symbol_name = c.symbol_name;
                *bytes = Blob(data);
            }
            other => {
                return Err(invalid(format!(
                    "constants[{i}] `{}` refers to allocation {a}, which is a {} allocation",
                    c.symbol_name,
                    other.name()
                )))
            }
        }
    }

    super::constants::fill_from_hlo_module(&mut allocs, &exe.hlo_module_with_config)?;

    let program_shape = match &exe.program_shape {
        Some(p) => ProgramShape {
            parameters: p.parameters.iter().map(shape).collect::<Result<_, _>>()?,
            result: opt_shape(&p.result)?.unwrap_or_default(),
            parameter_names: p.parameter_names.clone(),
        },
        None => ProgramShape::default(),
    };

    let compute_capability = match exe
        .gpu_compute_capability
        .as_ref()
        .and_then(|c| c.compute_capability.as_ref())
    {
        Some(CcProto::CudaComputeCapability(c)) => ComputeCapability::Cuda {
            major: c.major,
            minor: c.minor,
        },
        Some(CcProto::RocmComputeCapability(r)) => ComputeCapability::Rocm {
            gcn_arch_name: r.gcn_arch_name.clone(),
        },
        None => ComputeCapability::Unknown,
    };

    let sizes: Vec<u64> = allocs.iter().map(|a| a.size).collect();
    let top = Allocs {
        sizes: &sizes,
        what: "allocation",
    };
    let mut thunks = thunk::sequence(&exe.thunks, top, 0, "thunks")?;
    super::hlo_reduction::resolve_collective_kernels(&mut thunks, &exe.hlo_module_with_config)?;

    Ok(Plan {
        module_name: exe.module_name,
        pjrt_client_name,
        compute_capability,
        allocations: allocs,
        program_shape,
        outputs,
        kernels: KernelBinaries {
            binary: Blob(exe.binary),
            asm_text: exe.asm_text,
            dnn_compiled_graphs: exe
                .dnn_compiled_graphs
                .into_iter()
                .map(|(k, v)| (k, Blob(v)))
                .collect::<BTreeMap<_, _>>(),
        },
        thunks,
    })
}

//! Constants serialized without content take their value from the HLO module
//! the executable carries (as XLA does when loading it).

mod common;

use common::{executable, fixture, fixtures_dir};
use prost::Message;
use xla_vmm::proto::xla::{self as px, gpu::gpu_executable_proto as gep};
use xla_vmm::AllocationRole;

/// The bytes of scalar `%name = ty[] constant(v)` in the fixture's HLO text.
fn hlo_text_scalar(hlo: &str, name: &str) -> Option<Vec<u8>> {
    let line = hlo
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("%{name} = ")))?;
    let (_, rhs) = line.split_once(" = ")?;
    let (ty, rest) = rhs.split_once("[] constant(")?;
    let v = rest.split(')').next()?;
    Some(match ty {
        "s32" => v.parse::<i32>().ok()?.to_le_bytes().to_vec(),
        "f32" => v.parse::<f32>().ok()?.to_le_bytes().to_vec(),
        "bf16" => (v.parse::<f32>().ok()?.to_bits() >> 16)
            .to_le_bytes()
            .get(..2)?
            .to_vec(),
        _ => return None,
    })
}

#[test]
fn fixture_constants_without_content_come_from_the_hlo_module() {
    for name in ["loop", "llama_scan_bf16"] {
        let bytes = fixture(name);
        // The fixture really has constants without content.
        let outer = xla_vmm::decode::decode_executable_and_options(&bytes).unwrap();
        let exe =
            xla_vmm::decode::decode_gpu_executable_proto(&outer.serialized_executable).unwrap();
        assert!(!exe.constants.is_empty(), "{name}");
        assert!(
            exe.constants
                .iter()
                .all(|c| c.content.as_ref().is_none_or(|d| d.data.is_empty())),
            "{name}: constants with content"
        );
        assert!(!exe.hlo_module_with_config.is_empty(), "{name}");

        let plan = xla_vmm::decode(&bytes).unwrap();
        let hlo = std::fs::read_to_string(fixtures_dir().join(format!("{name}.hlo.txt"))).unwrap();
        let mut checked = 0;
        for a in &plan.allocations {
            let AllocationRole::Constant { symbol_name, bytes } = &a.role else {
                continue;
            };
            assert_eq!(bytes.len() as u64, a.size, "{name} {symbol_name}");
            let instr = symbol_name.strip_prefix("buffer_for_").unwrap();
            let want = hlo_text_scalar(&hlo, instr)
                .unwrap_or_else(|| panic!("{name}: no scalar constant %{instr} in the HLO text"));
            assert_eq!(bytes.to_vec(), want, "{name} {symbol_name}");
            checked += 1;
        }
        assert!(checked > 0, "{name}");
    }
}

fn constant_alloc(index: i64, size: i64) -> px::BufferAllocationProto {
    px::BufferAllocationProto {
        index,
        size,
        is_constant: true,
        ..Default::default()
    }
}

fn constant_instr(name: &str, values: Vec<i32>) -> px::HloInstructionProto {
    px::HloInstructionProto {
        name: name.into(),
        opcode: "constant".into(),
        literal: Some(px::LiteralProto {
            shape: Some(px::ShapeProto {
                element_type: 4, // S32
                dimensions: vec![values.len() as i64],
                ..Default::default()
            }),
            s32s: values,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An executable with constant allocations of the given sizes (symbols
/// `buffer_for_<name>`, no content) and an HLO module holding `instrs`.
fn synthetic(consts: &[(&str, i64)], instrs: Vec<px::HloInstructionProto>) -> Vec<u8> {
    let module = px::HloModuleProtoWithConfig {
        hlo_module: Some(px::HloModuleProto {
            name: "m".into(),
            computations: vec![px::HloComputationProto {
                name: "entry".into(),
                instructions: instrs,
                ..Default::default()
            }],
        }),
    };
    let exe = px::gpu::GpuExecutableProto {
        hlo_module_with_config: module.encode_to_vec(),
        buffer_allocations: Some(gep::RepeatedBufferAllocations {
            values: consts
                .iter()
                .enumerate()
                .map(|(i, &(_, size))| constant_alloc(i as i64, size))
                .collect(),
        }),
        constants: consts
            .iter()
            .enumerate()
            .map(|(i, &(name, _))| gep::ConstantInfoProto {
                symbol_name: format!("buffer_for_{name}"),
                content: None,
                allocation_index: i as i64,
            })
            .collect(),
        ..Default::default()
    };
    executable(&exe)
}

fn constant_bytes(plan: &xla_vmm::Plan, index: usize) -> Vec<u8> {
    match &plan.allocations[index].role {
        AllocationRole::Constant { bytes, .. } => bytes.to_vec(),
        other => panic!("allocation {index} is a {}", other.name()),
    }
}

#[test]
fn constants_match_instructions_by_global_name() {
    let bytes = synthetic(
        &[("iota_3", 12), ("missing", 4)],
        vec![
            constant_instr("iota_3", vec![0, 1, -2]),
            // needs sanitizing: XLA never names a global after it
            constant_instr("missing.1", vec![5]),
            px::HloInstructionProto {
                name: "missing".into(),
                opcode: "add".into(),
                literal: None,
                ..Default::default()
            },
        ],
    );
    let plan = xla_vmm::decode(&bytes).unwrap();
    let want: Vec<u8> = [0i32, 1, -2].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(constant_bytes(&plan, 0), want);
    assert!(constant_bytes(&plan, 1).is_empty());
}

#[test]
fn a_constant_of_the_wrong_size_is_an_error() {
    let bytes = synthetic(&[("c", 8)], vec![constant_instr("c", vec![1, 2, 3])]);
    let e = xla_vmm::decode(&bytes).unwrap_err().to_string();
    assert!(e.contains("12 bytes") && e.contains("8"), "{e}");
}

#[test]
fn a_corrupt_hlo_module_is_an_error_not_a_panic() {
    let exe = px::gpu::GpuExecutableProto {
        hlo_module_with_config: vec![0x0a, 0xff, 0x01],
        buffer_allocations: Some(gep::RepeatedBufferAllocations {
            values: vec![constant_alloc(0, 4)],
        }),
        constants: vec![gep::ConstantInfoProto {
            symbol_name: "buffer_for_c".into(),
            content: None,
            allocation_index: 0,
        }],
        ..Default::default()
    };
    let e = xla_vmm::decode(&executable(&exe)).unwrap_err().to_string();
    assert!(e.contains("HloModuleProtoWithConfig"), "{e}");
}

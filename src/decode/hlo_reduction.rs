//! The reduction of `collective_kernel` thunks, from the executable's HLO
//! module.
//!
//! XLA's one-shot all-reduce kernel bakes its reduction into the kernel, and
//! `CollectiveKernelThunkProto` does not record it. The HLO module does: the
//! thunk `<P>-fusion.N` runs the fusion computation `fused_<P>` (maybe with
//! `.clone` suffixes), which holds an `all-reduce` whose `to_apply`
//! computation's root is `add` / `multiply` / `maximum` / `minimum` (`or` /
//! `and` for PRED, as max / min). Without a name match, the reduction of
//! every all-reduce inside fused computations is used when they all agree.
//! A thunk whose reduction cannot be found becomes
//! [`ThunkKind::Unsupported`] (with a warning saying why).

use std::collections::HashMap;

use prost::Message;

use super::DecodeError;
use crate::plan::{ReductionKind, Thunk, ThunkKind};
use crate::proto::xla::{HloComputationProto, HloModuleProtoWithConfig};

/// Fills `reduction` of every `collective_kernel` thunk in `thunks`.
pub(crate) fn resolve_collective_kernels(
    thunks: &mut [Thunk],
    module_with_config: &[u8],
) -> Result<(), DecodeError> {
    let mut pending = false;
    visit(
        thunks,
        &mut |t| pending |= matches!(&t.kind, ThunkKind::Collective(c) if c.from_collective_kernel),
    );
    if !pending {
        return Ok(());
    }
    let index = if module_with_config.is_empty() {
        None
    } else {
        let m = HloModuleProtoWithConfig::decode(module_with_config).map_err(|source| {
            DecodeError::Proto {
                what: "xla.HloModuleProtoWithConfig (GpuExecutableProto.hlo_module_with_config)"
                    .into(),
                source,
            }
        })?;
        m.hlo_module.map(|m| Index::new(m.computations))
    };
    visit(thunks, &mut |t| {
        let ThunkKind::Collective(c) = &mut t.kind else {
            return;
        };
        if !c.from_collective_kernel || c.reduction.is_some() {
            return;
        }
        let found = match &index {
            Some(ix) => ix.reduction_for(&t.info.profile_annotation),
            None => Err("the executable carries no HLO module".to_string()),
        };
        match found {
            Ok(r) => c.reduction = Some(r),
            Err(why) => {
                tracing::warn!(
                    thunk = %t.info.profile_annotation,
                    "collective_kernel left unsupported: reduction unknown ({why})"
                );
                t.kind = ThunkKind::Unsupported {
                    kind_name: "collective_kernel".into(),
                    field_number: 59,
                };
            }
        }
    });
    Ok(())
}

fn visit(thunks: &mut [Thunk], f: &mut dyn FnMut(&mut Thunk)) {
    for t in thunks {
        f(t);
        match &mut t.kind {
            ThunkKind::Sequential { thunks } => visit(thunks, f),
            ThunkKind::While(w) => {
                visit(&mut w.condition, f);
                visit(&mut w.body, f);
            }
            ThunkKind::Conditional(c) => {
                for b in &mut c.branches {
                    visit(b, f);
                }
            }
            ThunkKind::AsyncStart(a) => visit(&mut a.thunks, f),
            ThunkKind::DynamicSliceFusion(d) => visit(&mut d.embedded, f),
            _ => {}
        }
    }
}

struct Index {
    computations: Vec<HloComputationProto>,
    by_id: HashMap<i64, usize>,
}

const PRED: i32 = 1;

impl Index {
    fn new(computations: Vec<HloComputationProto>) -> Self {
        let by_id = computations
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id, i))
            .collect();
        Index {
            computations,
            by_id,
        }
    }

    /// The reduction of every all-reduce in computation `c`.
    fn all_reduces(&self, c: &HloComputationProto) -> Vec<Result<ReductionKind, String>> {
        c.instructions
            .iter()
            .filter(|i| i.opcode == "all-reduce")
            .map(|i| {
                let pred = i.shape.as_ref().is_some_and(|s| s.element_type == PRED);
                let id = i
                    .called_computation_ids
                    .first()
                    .ok_or_else(|| format!("all-reduce '{}' has no to_apply", i.name))?;
                let comp = self
                    .by_id
                    .get(id)
                    .map(|&k| &self.computations[k])
                    .ok_or_else(|| format!("to_apply computation {id} not in the module"))?;
                let root = comp
                    .instructions
                    .iter()
                    .find(|x| x.id == comp.root_id)
                    .or(comp.instructions.last())
                    .ok_or_else(|| format!("empty to_apply computation '{}'", comp.name))?;
                opcode_reduction(&root.opcode, pred).ok_or_else(|| {
                    format!(
                        "to_apply '{}' of '{}' reduces by '{}'",
                        comp.name, i.name, root.opcode
                    )
                })
            })
            .collect()
    }

    fn reduction_for(&self, annotation: &str) -> Result<ReductionKind, String> {
        if let Some(p) = annotation.find("-fusion").map(|k| &annotation[..k]) {
            let want = format!("fused_{p}");
            let named: Vec<_> = self
                .computations
                .iter()
                .filter(|c| {
                    c.name
                        .strip_prefix(&want)
                        .is_some_and(|rest| rest.split(".clone").all(str::is_empty))
                })
                .collect();
            let found: Vec<_> = named.iter().flat_map(|c| self.all_reduces(c)).collect();
            if !found.is_empty() {
                return agree(found, &format!("computation '{want}'"));
            }
        }
        let found: Vec<_> = self
            .computations
            .iter()
            .filter(|c| c.name.starts_with("fused_"))
            .flat_map(|c| self.all_reduces(c))
            .collect();
        if found.is_empty() {
            return Err(format!(
                "no fused computation named after '{annotation}' and no all-reduce in any \
                 fused computation"
            ));
        }
        agree(found, "the fused computations")
    }
}

fn agree(found: Vec<Result<ReductionKind, String>>, place: &str) -> Result<ReductionKind, String> {
    let kinds = found.into_iter().collect::<Result<Vec<_>, _>>()?;
    let first = kinds[0];
    if kinds.iter().all(|&k| k == first) {
        Ok(first)
    } else {
        Err(format!("the all-reduces in {place} disagree: {kinds:?}"))
    }
}

fn opcode_reduction(opcode: &str, pred: bool) -> Option<ReductionKind> {
    Some(match opcode {
        "add" => ReductionKind::Sum,
        "multiply" => ReductionKind::Product,
        "maximum" => ReductionKind::Max,
        "minimum" => ReductionKind::Min,
        "or" if pred => ReductionKind::Max,
        "and" if pred => ReductionKind::Min,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::xla::{HloInstructionProto, ShapeProto};

    fn instr(id: i64, name: &str, opcode: &str, calls: &[i64], ty: i32) -> HloInstructionProto {
        HloInstructionProto {
            name: name.into(),
            opcode: opcode.into(),
            shape: Some(ShapeProto {
                element_type: ty,
                ..Default::default()
            }),
            id,
            called_computation_ids: calls.to_vec(),
            ..Default::default()
        }
    }

    fn comp(id: i64, name: &str, root: i64, ins: Vec<HloInstructionProto>) -> HloComputationProto {
        HloComputationProto {
            name: name.into(),
            instructions: ins,
            id,
            root_id: root,
        }
    }

    fn module(second: &str, second_ty: i32) -> Index {
        Index::new(vec![
            comp(
                1,
                "region_0.0",
                3,
                vec![
                    instr(3, "add.1", "add", &[], 11),
                    instr(2, "p", "parameter", &[], 11),
                ],
            ),
            comp(
                4,
                "region_1",
                5,
                vec![instr(5, "m", second, &[], second_ty)],
            ),
            comp(
                6,
                "fused_psum.7.0.clone",
                7,
                vec![instr(7, "ar", "all-reduce", &[1], 11)],
            ),
            comp(
                8,
                "fused_other.1",
                9,
                vec![instr(9, "ar2", "all-reduce", &[4], second_ty)],
            ),
        ])
    }

    #[test]
    fn name_match_then_agreement() {
        let ix = module("maximum", 11);
        assert_eq!(
            ix.reduction_for("psum.7.0-fusion.1"),
            Ok(ReductionKind::Sum)
        );
        assert_eq!(ix.reduction_for("other.1-fusion"), Ok(ReductionKind::Max));
        // No name match and two different reductions: unresolved, saying why.
        let e = ix.reduction_for("nomatch-fusion.2").unwrap_err();
        assert!(e.contains("disagree"), "{e}");
        // PRED or = max; or on integers is not a reduction we map.
        let ix = module("or", PRED);
        assert_eq!(ix.reduction_for("other.1-fusion"), Ok(ReductionKind::Max));
        let ix = module("or", 4);
        assert!(ix.reduction_for("other.1-fusion").is_err());
        // All agree: the fallback resolves any name.
        let ix = module("add", 11);
        assert_eq!(ix.reduction_for("x-fusion"), Ok(ReductionKind::Sum));
        assert_eq!(ix.reduction_for("no annotation"), Ok(ReductionKind::Sum));
    }
}

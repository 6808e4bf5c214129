//! One VA-stable step as a value: [`StepPlanner`] turns the tracker's
//! actions into a [`StepPlan`] that says, with addresses, what the runtime
//! does for the step: which slot regions of the reservation get the caller's
//! allocation or the slot's shadow mapped, and which copies run before and
//! after the launch. The runtime then *applies* the plan (driver calls; a
//! failing call turns its slot into a copy slot through
//! [`StepPlanner::fall_back`]) and *submits* the step (copy nodes or batches,
//! the graph launch, the copies back). As XLA's command buffer (diff the
//! recorded addresses, update, submit) and IREE's binding table do.
//!
//! The planner keeps what the tracker does not need to decide but the step
//! needs to be right:
//! - what each reservation's region of a slot holds now (the caller's
//!   allocation, by id and address; the shadow; nothing), so that a region
//!   that already holds what the step wants costs no driver call, including
//!   the first step after [`StepPlanner::prebind`];
//! - what each shadow holds, under immutable buffers (PJRT: a buffer's content
//!   changes only when a program it is donated to writes it in place, and the
//!   front door then gives the allocation its next generation): the copy in
//!   is left out when the same buffer (id and generation) is bound again,
//!   and after a step that writes the slot, when its next generation is.
//!
//! Pure data, no device: tested here.

use crate::plan::Decision;
use crate::tracker::{Binding, SlotAction};

/// Where a slot's region lies in each reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRegion {
    /// Offset of the region from the reservation's base.
    pub offset: u64,
    /// The region's length (whole granules).
    pub region: u64,
    /// The parameter's bytes (what a copy moves).
    pub size: u64,
    /// The program writes the slot (a direct mapping changes the caller's
    /// buffer, not the shadow).
    pub written: bool,
}

/// The buffer bound to a slot this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Identity and address as the tracker sees them.
    pub binding: Binding,
    /// The allocation block's lifetime: with a real allocation id it names
    /// the buffer's content (`None`: raw memory, content unknown).
    pub generation: Option<u64>,
}

/// What a region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Nothing mapped.
    Nothing,
    /// The caller's allocation (by id and address).
    Caller(Binding),
    /// The slot's shadow.
    Shadow,
}

/// What a slot's region is to hold after this step's mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The caller's allocation (a remap, or a skip the region could not honour).
    Caller,
    /// The slot's shadow (created on first use).
    Shadow,
}

/// One region to map this step (unmapping what is there first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionMap {
    /// The slot whose region is mapped.
    pub slot: usize,
    /// What it gets.
    pub target: Target,
    /// The tracker said skip, but the region does not hold the allocation.
    pub unexpected: bool,
}

/// One copy of a step, `bytes` from `src` to `dst` (device addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedCopy {
    /// The slot the copy serves.
    pub slot: usize,
    /// Destination address.
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes moved.
    pub bytes: u64,
}

/// One step of one reservation, as the runtime applies and submits it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// The reservation the step runs on.
    pub reservation: usize,
    /// Regions to map, in slot order: the caller's allocations first are
    /// mapped, access set per contiguous run, then the shadows.
    pub maps: Vec<RegionMap>,
    /// Copies into shadows before the launch, in slot order.
    pub ins: Vec<PlannedCopy>,
    /// Copies back to the caller's buffers after the launch, in slot order.
    pub outs: Vec<PlannedCopy>,
    /// Copies in left out because the shadow holds the buffer already.
    pub elided: u64,
    /// Their bytes.
    pub elided_bytes: u64,
}

impl StepPlan {
    /// Empty, for a step on `reservation` (capacity kept).
    fn reset(&mut self, reservation: usize) {
        self.reservation = reservation;
        self.maps.clear();
        self.ins.clear();
        self.outs.clear();
        self.elided = 0;
        self.elided_bytes = 0;
    }
}

/// Turns the tracker's actions into [`StepPlan`]s and remembers what the
/// regions and the shadows hold (see the module docs).
#[derive(Clone, Debug)]
pub struct StepPlanner {
    regions: Vec<SlotRegion>,
    /// Base address of each reservation.
    bases: Vec<u64>,
    immutable: bool,
    /// Per reservation, per slot.
    held: Vec<Vec<Held>>,
    /// Per slot: (allocation id, generation) whose content the shadow holds.
    shadow_holds: Vec<Option<(u64, u64)>>,
}

impl StepPlanner {
    /// A planner for slots laid out as `regions` (in each reservation, once
    /// added); `immutable`: PJRT semantics (see the module docs).
    pub fn new(regions: Vec<SlotRegion>, immutable: bool) -> Self {
        let n = regions.len();
        StepPlanner {
            held: Vec::new(),
            regions,
            bases: Vec::new(),
            immutable,
            shadow_holds: vec![None; n],
        }
    }

    /// A reservation based at `base`, its regions holding nothing; returns
    /// its index.
    pub fn add_reservation(&mut self, base: u64) -> usize {
        self.bases.push(base);
        self.held.push(vec![Held::Nothing; self.regions.len()]);
        self.bases.len() - 1
    }

    /// The slots' regions, in slot order.
    pub fn regions(&self) -> &[SlotRegion] {
        &self.regions
    }

    /// What slot `slot`'s region in `reservation` holds.
    pub fn held(&self, reservation: usize, slot: usize) -> Held {
        self.held[reservation][slot]
    }

    /// The shadows' contents are unknown from now on (a run outside this
    /// mode may have written the caller's buffers).
    pub fn forget_shadow_contents(&mut self) {
        self.shadow_holds.iter_mut().for_each(|h| *h = None);
    }

    /// The address of slot `slot`'s region in `reservation`.
    pub fn region_addr(&self, reservation: usize, slot: usize) -> u64 {
        self.bases[reservation] + self.regions[slot].offset
    }

    /// Before reservation `reservation` is recorded: each slot's region gets
    /// the first step's buffer where the plan maps it (skip or remap) and
    /// its shadow where it copies. No copies: nothing has run yet.
    pub fn prebind(&mut self, reservation: usize, decisions: &[Decision], out: &mut StepPlan) {
        out.reset(reservation);
        for (slot, d) in decisions.iter().enumerate() {
            let target = if *d == Decision::Copy {
                Target::Shadow
            } else {
                Target::Caller
            };
            out.maps.push(RegionMap {
                slot,
                target,
                unexpected: false,
            });
        }
    }

    /// Record that `map` was applied with the buffer `bound` (prebind's maps
    /// and the step's, once their driver calls succeeded).
    pub fn mapped(&mut self, reservation: usize, map: &RegionMap, bound: &Bound) {
        self.held[reservation][map.slot] = match map.target {
            Target::Caller => Held::Caller(bound.binding),
            Target::Shadow => Held::Shadow,
        };
    }

    /// The plan of one step on `reservation` from the tracker's `actions`
    /// and the step's buffers (`out` overwritten, its capacity reused).
    /// Regions are recorded as holding what the plan maps there; a driver
    /// failure corrects that through [`StepPlanner::fall_back`].
    pub fn plan(
        &mut self,
        reservation: usize,
        actions: &[SlotAction],
        bound: &[Bound],
        out: &mut StepPlan,
    ) {
        out.reset(reservation);
        for (slot, (&action, b)) in actions.iter().zip(bound).enumerate() {
            let held = self.held[reservation][slot];
            match action {
                SlotAction::Skip | SlotAction::Remap { .. } => {
                    // Already there (bound at prebind, or the skip the
                    // tracker expects): no driver call.
                    if held != Held::Caller(b.binding) {
                        out.maps.push(RegionMap {
                            slot,
                            target: Target::Caller,
                            unexpected: action == SlotAction::Skip,
                        });
                        self.held[reservation][slot] = Held::Caller(b.binding);
                    }
                    if self.regions[slot].written {
                        // Written in place: the caller's buffer changes, the
                        // shadow does not.
                        self.shadow_holds[slot] = None;
                    }
                }
                SlotAction::Copy {
                    copy_in, copy_out, ..
                } => {
                    if held != Held::Shadow {
                        out.maps.push(RegionMap {
                            slot,
                            target: Target::Shadow,
                            unexpected: false,
                        });
                        self.held[reservation][slot] = Held::Shadow;
                    }
                    self.copies(reservation, slot, b, copy_in, copy_out, out);
                }
            }
        }
    }

    /// Slot `slot`'s region of the plan's reservation gets its shadow (its
    /// map in the plan now targets the shadow): a caller mapping failed.
    pub fn to_shadow(&mut self, slot: usize, plan: &mut StepPlan) {
        self.held[plan.reservation][slot] = Held::Shadow;
        match plan.maps.iter_mut().find(|m| m.slot == slot) {
            Some(m) => m.target = Target::Shadow,
            None => {
                let at = plan.maps.partition_point(|m| m.slot < slot);
                plan.maps.insert(
                    at,
                    RegionMap {
                        slot,
                        target: Target::Shadow,
                        unexpected: false,
                    },
                );
            }
        }
    }

    /// Slot `slot`'s caller mapping failed this step: [`Self::to_shadow`],
    /// and its copies join the plan (the tracker's fallback `action` says
    /// which).
    pub fn fall_back(
        &mut self,
        slot: usize,
        action: SlotAction,
        bound: &Bound,
        plan: &mut StepPlan,
    ) {
        let r = plan.reservation;
        self.to_shadow(slot, plan);
        if let SlotAction::Copy {
            copy_in, copy_out, ..
        } = action
        {
            let mut extra = StepPlan::default();
            self.copies(r, slot, bound, copy_in, copy_out, &mut extra);
            for (list, add) in [(&mut plan.ins, extra.ins), (&mut plan.outs, extra.outs)] {
                for c in add {
                    let at = list.partition_point(|x| x.slot < slot);
                    list.insert(at, c);
                }
            }
            plan.elided += extra.elided;
            plan.elided_bytes += extra.elided_bytes;
        }
    }

    /// The copies of a slot served from its shadow this step.
    fn copies(
        &mut self,
        reservation: usize,
        slot: usize,
        b: &Bound,
        copy_in: bool,
        copy_out: bool,
        out: &mut StepPlan,
    ) {
        let size = self.regions[slot].size;
        let at = self.region_addr(reservation, slot);
        let user = b.binding.addr;
        let key = b.generation.map(|g| (b.binding.id, g));
        let known = self.immutable && key.is_some() && self.shadow_holds[slot] == key;
        if copy_in && known {
            out.elided += 1;
            out.elided_bytes += size;
        } else if copy_in {
            out.ins.push(PlannedCopy {
                slot,
                dst: at,
                src: user,
                bytes: size,
            });
        }
        if copy_out {
            out.outs.push(PlannedCopy {
                slot,
                dst: user,
                src: at,
                bytes: size,
            });
        }
        // After this step the shadow equals the caller's buffer; one the
        // step writes is new content, which the front door names by the
        // allocation's next generation (it renews an allocation written in
        // place: `vmm::Buffer::renew`).
        self.shadow_holds[slot] = if copy_out {
            key.map(|(id, g)| (id, g + 1))
        } else {
            key
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn planner(immutable: bool) -> StepPlanner {
        let regions = vec![
            SlotRegion {
                offset: 0,
                region: 2 * MIB,
                size: 1000,
                written: false,
            },
            SlotRegion {
                offset: 2 * MIB,
                region: 2 * MIB,
                size: 2 * MIB,
                written: true,
            },
        ];
        let mut p = StepPlanner::new(regions, immutable);
        assert_eq!(
            (p.add_reservation(1 << 40), p.add_reservation(1 << 41)),
            (0, 1)
        );
        p
    }

    fn bound(id: u64, addr: u64, generation: u64) -> Bound {
        Bound {
            binding: Binding { id, addr },
            generation: Some(generation),
        }
    }

    const COPY_IN: SlotAction = SlotAction::Copy {
        map_shadow: false,
        unmap_old: false,
        copy_in: true,
        copy_out: false,
    };
    const COPY_BOTH: SlotAction = SlotAction::Copy {
        map_shadow: false,
        unmap_old: false,
        copy_in: true,
        copy_out: true,
    };

    #[test]
    fn a_region_is_mapped_once_and_copies_carry_the_regions_addresses() {
        let mut p = planner(false);
        let mut plan = StepPlan::default();
        let b = [bound(7, 0x1000, 1), bound(8, 0x9000, 1)];
        p.plan(
            1,
            &[COPY_IN, SlotAction::Remap { unmap_old: false }],
            &b,
            &mut plan,
        );
        assert_eq!(
            plan.maps,
            vec![
                RegionMap {
                    slot: 0,
                    target: Target::Shadow,
                    unexpected: false
                },
                RegionMap {
                    slot: 1,
                    target: Target::Caller,
                    unexpected: false
                },
            ]
        );
        assert_eq!(
            plan.ins,
            vec![PlannedCopy {
                slot: 0,
                dst: 1 << 41,
                src: 0x1000,
                bytes: 1000
            }]
        );
        assert!(plan.outs.is_empty());
        // The same buffers again: the shadow stays, the caller's allocation
        // is there: no map; the copy in runs again (not immutable).
        p.plan(1, &[COPY_IN, SlotAction::Skip], &b, &mut plan);
        assert!(plan.maps.is_empty());
        assert_eq!(plan.ins.len(), 1);
        assert_eq!(plan.elided, 0);
        // Another allocation for slot 1: mapped over the old one.
        let b2 = [b[0], bound(9, 0xa000, 1)];
        p.plan(
            1,
            &[COPY_IN, SlotAction::Remap { unmap_old: true }],
            &b2,
            &mut plan,
        );
        assert_eq!(plan.maps.len(), 1);
        assert_eq!(p.held(1, 1), Held::Caller(b2[1].binding));
        assert_eq!(
            p.held(0, 1),
            Held::Nothing,
            "the other reservation is untouched"
        );
    }

    #[test]
    fn prebound_regions_cost_nothing_and_an_unexpected_skip_maps() {
        let mut p = planner(false);
        let mut plan = StepPlan::default();
        let b = [bound(7, 0x1000, 1), bound(8, 0x9000, 1)];
        p.prebind(0, &[Decision::Copy, Decision::Remap], &mut plan);
        for m in plan.maps.clone() {
            p.mapped(0, &m, &b[m.slot]);
        }
        p.plan(
            0,
            &[COPY_IN, SlotAction::Remap { unmap_old: false }],
            &b,
            &mut plan,
        );
        assert!(plan.maps.is_empty(), "{:?}", plan.maps);
        // A skip the region cannot honour (another allocation is there).
        let b2 = [b[0], bound(9, 0xa000, 1)];
        p.plan(0, &[COPY_IN, SlotAction::Skip], &b2, &mut plan);
        assert_eq!(
            plan.maps,
            vec![RegionMap {
                slot: 1,
                target: Target::Caller,
                unexpected: true
            }]
        );
    }

    #[test]
    fn immutable_buffers_skip_the_copy_in_until_the_caller_writes_in_place() {
        let mut p = planner(true);
        let mut plan = StepPlan::default();
        let b = [bound(7, 0x1000, 1), bound(8, 0x9000, 1)];
        let both = [COPY_IN, COPY_BOTH];
        p.plan(0, &both, &b, &mut plan);
        assert_eq!((plan.ins.len(), plan.outs.len(), plan.elided), (2, 1, 0));
        // Slot 0 is read only: the same buffer is the same content. Slot 1
        // was written: the caller's allocation holds the step's output
        // under its next generation; the generation before is stale.
        p.plan(0, &both, &b, &mut plan);
        assert_eq!((plan.ins.len(), plan.outs.len()), (1, 1));
        assert_eq!(plan.ins[0].slot, 1);
        assert_eq!((plan.elided, plan.elided_bytes), (1, 1000));
        let b = [b[0], bound(8, 0x9000, 2)];
        p.plan(0, &both, &b, &mut plan);
        assert_eq!((plan.ins.len(), plan.outs.len()), (0, 1));
        assert_eq!((plan.elided, plan.elided_bytes), (2, 1000 + 2 * MIB));
        // A new generation of the same allocation is new content.
        let b2 = [bound(7, 0x1000, 2), bound(8, 0x9000, 3)];
        p.plan(0, &both, &b2, &mut plan);
        assert_eq!(plan.ins.iter().map(|c| c.slot).collect::<Vec<_>>(), vec![0]);
        // Slot 1 mapped directly and written there: its shadow is stale.
        p.plan(
            0,
            &[COPY_IN, SlotAction::Remap { unmap_old: true }],
            &b2,
            &mut plan,
        );
        let b2 = [b2[0], bound(8, 0x9000, 4)];
        p.plan(0, &both, &b2, &mut plan);
        assert_eq!(plan.ins.iter().map(|c| c.slot).collect::<Vec<_>>(), vec![1]);
        // Raw memory (no generation): always copied.
        let raw = [
            Bound {
                generation: None,
                ..b2[0]
            },
            bound(8, 0x9000, 5),
        ];
        p.plan(0, &both, &raw, &mut plan);
        assert_eq!(plan.ins.iter().map(|c| c.slot).collect::<Vec<_>>(), vec![0]);
        p.plan(0, &both, &[raw[0], bound(8, 0x9000, 6)], &mut plan);
        assert_eq!(plan.ins.iter().map(|c| c.slot).collect::<Vec<_>>(), vec![0]);
        p.forget_shadow_contents();
        p.plan(0, &both, &[b2[0], bound(8, 0x9000, 7)], &mut plan);
        assert_eq!(plan.ins.len(), 2);
    }

    #[test]
    fn a_fallback_serves_the_slot_from_its_shadow_with_its_copies_in_slot_order() {
        let mut p = planner(false);
        let mut plan = StepPlan::default();
        let b = [bound(7, 0x1000, 1), bound(8, 0x9000, 1)];
        p.plan(
            0,
            &[SlotAction::Remap { unmap_old: false }, COPY_BOTH],
            &b,
            &mut plan,
        );
        assert_eq!(plan.ins.len(), 1);
        p.fall_back(0, COPY_IN, &b[0], &mut plan);
        assert_eq!(p.held(0, 0), Held::Shadow);
        assert_eq!(
            plan.maps[0],
            RegionMap {
                slot: 0,
                target: Target::Shadow,
                unexpected: false
            }
        );
        assert_eq!(
            plan.ins.iter().map(|c| c.slot).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(
            plan.ins[0],
            PlannedCopy {
                slot: 0,
                dst: 1 << 40,
                src: 0x1000,
                bytes: 1000
            }
        );
        // The tracker keeps the slot on copy: its shadow is there.
        p.plan(0, &[COPY_IN, COPY_BOTH], &b, &mut plan);
        assert!(plan.maps.is_empty());
        assert_eq!(plan.ins.len(), 2);
    }
}

//! The loaded form of collective thunks ([`CollOp`]), their communicators
//! on this device ([`Resolved`], made at the first run) and their
//! execution ([`run`]): library calls, copies and memsets only, so that
//! they can be captured into graphs.
//!
//! A `collective_kernel` thunk (XLA's one-shot all-reduce over peer memory)
//! runs as a library all-reduce: for 2 participants the result is
//! bit-identical (one addition, which commutes); with more participants the
//! library may sum in another order than the one-shot kernel.

use std::sync::Arc;

use xla_vmm::{CollectiveOp, CollectiveThunk, ElementType, GroupMode, ReductionKind, Slice};
use xla_vmm_device::{Backend, CommType, Communicator, DevicePtr, ReduceOp};

use super::{participants, permute_device, permute_id, CollectiveEnv};
use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;

/// One operand of a loaded collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollBuffer {
    pub src: Slice,
    pub dst: Slice,
    /// Elements of the source.
    pub count: u64,
    /// Bytes of the source (`count` × element size).
    pub bytes: u64,
}

/// What a loaded collective does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollKind {
    /// `mult`: library elements per XLA element (2 for complex).
    AllReduce {
        ty: CommType,
        op: ReduceOp,
        mult: u64,
    },
    ReduceScatter {
        ty: CommType,
        op: ReduceOp,
        mult: u64,
    },
    AllGather,
    AllToAll {
        split: bool,
    },
    Permute,
    Broadcast,
}

/// A loaded collective thunk; `index` selects its communicator among the
/// executable's resolved ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollOp {
    pub name: String,
    pub kind: CollKind,
    pub mode: GroupMode,
    pub groups: Vec<Vec<i64>>,
    pub pairs: Vec<(i64, i64)>,
    pub buffers: Vec<CollBuffer>,
    pub index: usize,
    /// Which communicator set: 0, or i + 1 inside an async start on
    /// communication stream i (see [`Cliques::communicator_tagged`](crate::Cliques::communicator_tagged)).
    pub stream_tag: usize,
}

/// The library type and reduction for element type `et` (XLA element
/// types; PRED reduces as bytes: or = max, and = min).
pub fn reduce_type(et: ElementType, r: ReductionKind) -> Result<(CommType, ReduceOp, u64)> {
    let op = match r {
        ReductionKind::Sum => ReduceOp::Sum,
        ReductionKind::Product => ReduceOp::Prod,
        ReductionKind::Min => ReduceOp::Min,
        ReductionKind::Max => ReduceOp::Max,
    };
    let name = et.name().unwrap_or("unknown");
    let (ty, mult) = match et.0 {
        1 => {
            if !matches!(op, ReduceOp::Min | ReduceOp::Max) {
                return Err(RuntimeError::unsupported(format!(
                    "{} reduction of PRED",
                    r.name()
                )));
            }
            (CommType::U8, 1)
        }
        2 => (CommType::I8, 1),
        6 => (CommType::U8, 1),
        4 => (CommType::I32, 1),
        8 => (CommType::U32, 1),
        5 => (CommType::I64, 1),
        9 => (CommType::U64, 1),
        10 => (CommType::F16, 1),
        11 => (CommType::F32, 1),
        12 => (CommType::F64, 1),
        16 => (CommType::Bf16, 1),
        20 => (CommType::F8E4M3, 1),
        19 => (CommType::F8E5M2, 1),
        15 | 18 if op == ReduceOp::Sum => (
            if et.0 == 15 {
                CommType::F32
            } else {
                CommType::F64
            },
            2,
        ),
        _ => {
            return Err(RuntimeError::unsupported(format!(
                "{} reduction of element type {name}",
                r.name()
            )))
        }
    };
    Ok((ty, op, mult))
}

/// Load collective thunk `c` (checks element types and shapes; the
/// communicator is resolved at the first run).
pub fn load(name: &str, c: &CollectiveThunk, index: usize) -> Result<CollOp> {
    if c.op == CollectiveOp::CollectiveBroadcast && c.has_dynamic_root {
        return Err(RuntimeError::unsupported(
            "collective broadcast with a dynamic root",
        ));
    }
    let mut buffers = Vec::with_capacity(c.buffers.len());
    let mut types = Vec::with_capacity(c.buffers.len());
    for (i, b) in c.buffers.iter().enumerate() {
        let et = b
            .element_type
            .or_else(|| b.source.shape.as_ref().map(|s| s.element_type))
            .ok_or_else(|| RuntimeError::invalid(format!("buffer {i} has no element type")))?;
        let bits = et.bit_width().filter(|b| b % 8 == 0).ok_or_else(|| {
            RuntimeError::unsupported(format!(
                "buffer {i}: element type {}",
                et.name().unwrap_or("unknown")
            ))
        })?;
        let bytes = b.element_count * u64::from(bits / 8);
        if bytes > b.source.slice.size {
            return Err(RuntimeError::invalid(format!(
                "buffer {i}: {} elements ({bytes} bytes) in a {}-byte source",
                b.element_count, b.source.slice.size
            )));
        }
        buffers.push(CollBuffer {
            src: b.source.slice,
            dst: b.destination.slice,
            count: b.element_count,
            bytes,
        });
        types.push(et);
    }
    let reduce = || -> Result<(CommType, ReduceOp, u64)> {
        let r = c
            .reduction
            .ok_or_else(|| RuntimeError::invalid("reduction without a reduction kind"))?;
        let first = *types
            .first()
            .ok_or_else(|| RuntimeError::invalid("collective without buffers"))?;
        if types.iter().any(|&t| t != first) {
            return Err(RuntimeError::unsupported(
                "reduction over buffers of different element types",
            ));
        }
        reduce_type(first, r)
    };
    let kind = match c.op {
        CollectiveOp::AllReduce => {
            let (ty, op, mult) = reduce()?;
            CollKind::AllReduce { ty, op, mult }
        }
        CollectiveOp::ReduceScatter => {
            let (ty, op, mult) = reduce()?;
            CollKind::ReduceScatter { ty, op, mult }
        }
        CollectiveOp::AllGather => CollKind::AllGather,
        CollectiveOp::AllToAll => {
            if buffers.windows(2).any(|w| w[0].bytes != w[1].bytes) {
                return Err(RuntimeError::invalid(
                    "all-to-all buffers of different sizes",
                ));
            }
            CollKind::AllToAll {
                split: c.has_split_dimension,
            }
        }
        CollectiveOp::CollectivePermute => CollKind::Permute,
        CollectiveOp::CollectiveBroadcast => CollKind::Broadcast,
    };
    Ok(CollOp {
        name: name.to_string(),
        kind,
        mode: c.group_mode,
        groups: c.replica_groups.clone(),
        pairs: c.source_target_pairs.clone(),
        buffers,
        index,
        stream_tag: 0,
    })
}

/// A collective's communicator and peers on this device, fixed at the
/// first run.
pub struct Resolved<B: Backend> {
    /// `None` for a clique of one (the op becomes a local copy).
    pub comm: Option<Arc<dyn Communicator<B::Stream>>>,
    pub rank: usize,
    pub size: usize,
    /// Collective permute: the rank this device sends to / receives from.
    pub send_to: Option<usize>,
    pub recv_from: Option<usize>,
}

/// Resolve the communicator of every op in `ops` (in load order, so that
/// every device joins cliques in the same order). Blocks until the peers of
/// each clique join.
pub fn resolve<B: Backend>(
    backend: &B,
    env: &CollectiveEnv<B>,
    ops: &[CollOp],
) -> Result<Vec<Resolved<B>>> {
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        let ctx = |e: RuntimeError| match e {
            RuntimeError::InvalidProgram(m) => {
                RuntimeError::InvalidProgram(format!("collective '{}': {m}", op.name))
            }
            RuntimeError::InvalidArgument(m) => {
                RuntimeError::InvalidArgument(format!("collective '{}': {m}", op.name))
            }
            other => other,
        };
        out.push(resolve_one(backend, env, op).map_err(ctx)?);
    }
    Ok(out)
}

fn resolve_one<B: Backend>(
    backend: &B,
    env: &CollectiveEnv<B>,
    op: &CollOp,
) -> Result<Resolved<B>> {
    let a = &env.assignment;
    let parts = participants(a, env.device_id, op.mode, &op.groups)?;
    let rank = parts
        .iter()
        .position(|&d| d == env.device_id)
        .ok_or_else(|| RuntimeError::invalid("this device is not among the participants"))?;
    let rank_of = |id: i64| -> Result<usize> {
        let d = permute_device(a, env.device_id, op.mode, id)?;
        parts.iter().position(|&x| x == d).ok_or_else(|| {
            RuntimeError::invalid(format!(
                "permute peer {id} (device {d}) is not in the clique"
            ))
        })
    };
    let (mut send_to, mut recv_from) = (None, None);
    if op.kind == CollKind::Permute {
        let me = permute_id(a, env.device_id, op.mode)
            .ok_or_else(|| RuntimeError::arg("device not assigned"))?;
        for &(s, t) in &op.pairs {
            if s == me {
                send_to = Some(rank_of(t)?);
            }
            if t == me {
                recv_from = Some(rank_of(s)?);
            }
        }
    }
    let comm = if parts.len() > 1 {
        Some(
            env.cliques
                .communicator_tagged(backend, &parts, rank, op.stream_tag)?,
        )
    } else {
        None
    };
    Ok(Resolved {
        comm,
        rank,
        size: parts.len(),
        send_to,
        recv_from,
    })
}

fn copy<B: Backend>(
    be: &B,
    dst: DevicePtr,
    src: DevicePtr,
    bytes: u64,
    s: &B::Stream,
) -> Result<()> {
    if bytes > 0 && dst != src {
        be.copy_d2d(dst, src, bytes, s)?;
    }
    Ok(())
}

fn check_dst(b: &CollBuffer, need: u64) -> Result<()> {
    if b.dst.size < need {
        return Err(RuntimeError::invalid(format!(
            "destination of {} bytes, the collective writes {need}",
            b.dst.size
        )));
    }
    Ok(())
}

/// Enqueue `op` on `stream` (capturable: only library calls, copies and
/// memsets).
pub fn run<B: Backend>(
    be: &B,
    op: &CollOp,
    r: &Resolved<B>,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let n = r.size as u64;
    let comm = r.comm.as_deref();
    let grouped =
        op.buffers.len() > 1 || matches!(op.kind, CollKind::AllToAll { .. } | CollKind::Permute);
    if let (Some(c), true) = (comm, grouped) {
        c.group_start()?;
    }
    let result = run_buffers(be, op, r, comm, n, slots, stream);
    if let (Some(c), true) = (comm, grouped) {
        let end = c.group_end();
        result?;
        end?;
    } else {
        result?;
    }
    if op.kind == CollKind::Permute && r.recv_from.is_none() {
        for b in &op.buffers {
            if b.dst.size > 0 {
                be.memset_d8(slots.resolve(&b.dst)?, 0, b.bytes.min(b.dst.size), stream)?;
            }
        }
    }
    Ok(())
}

fn run_buffers<B: Backend>(
    be: &B,
    op: &CollOp,
    r: &Resolved<B>,
    comm: Option<&dyn Communicator<B::Stream>>,
    n: u64,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let u8t = CommType::U8;
    if let CollKind::AllToAll { split: false } = op.kind {
        if op.buffers.len() as u64 != n {
            return Err(RuntimeError::invalid(format!(
                "all-to-all without split dimension: {} buffers for {n} ranks",
                op.buffers.len()
            )));
        }
        for (peer, b) in op.buffers.iter().enumerate() {
            check_dst(b, b.bytes)?;
            let (src, dst) = (slots.resolve(&b.src)?, slots.resolve(&b.dst)?);
            match comm {
                Some(c) if peer != r.rank => {
                    c.send(src, b.bytes as usize, u8t, peer, stream)?;
                    c.recv(dst, b.bytes as usize, u8t, peer, stream)?;
                }
                _ => copy(be, dst, src, b.bytes, stream)?,
            }
        }
        return Ok(());
    }
    for b in &op.buffers {
        let (src, dst) = (slots.resolve(&b.src)?, slots.resolve(&b.dst)?);
        match op.kind {
            CollKind::AllReduce { ty, op: rop, mult } => {
                check_dst(b, b.bytes)?;
                match comm {
                    Some(c) => {
                        c.all_reduce(src, dst, (b.count * mult) as usize, ty, rop, stream)?
                    }
                    None => copy(be, dst, src, b.bytes, stream)?,
                }
            }
            CollKind::ReduceScatter { ty, op: rop, mult } => {
                if b.count % n != 0 {
                    return Err(RuntimeError::invalid(format!(
                        "reduce-scatter of {} elements over {n} ranks",
                        b.count
                    )));
                }
                let out = b.bytes / n;
                check_dst(b, out)?;
                match comm {
                    Some(c) => {
                        c.reduce_scatter(src, dst, (b.count / n * mult) as usize, ty, rop, stream)?
                    }
                    None => copy(be, dst, src, out, stream)?,
                }
            }
            CollKind::AllGather => {
                check_dst(b, b.bytes * n)?;
                match comm {
                    Some(c) => c.all_gather(src, dst, b.bytes as usize, u8t, stream)?,
                    None => copy(be, dst, src, b.bytes, stream)?,
                }
            }
            CollKind::Broadcast => {
                check_dst(b, b.bytes)?;
                match comm {
                    Some(c) => c.broadcast(src, dst, b.bytes as usize, u8t, 0, stream)?,
                    None => copy(be, dst, src, b.bytes, stream)?,
                }
            }
            CollKind::AllToAll { .. } => {
                if op.buffers.len() != 1 || b.bytes % n != 0 {
                    return Err(RuntimeError::invalid(format!(
                        "all-to-all with split dimension: {} buffers of {} bytes for {n} ranks",
                        op.buffers.len(),
                        b.bytes
                    )));
                }
                check_dst(b, b.bytes)?;
                let chunk = b.bytes / n;
                for peer in 0..r.size {
                    let off = peer as u64 * chunk;
                    let (s, d) = (src.offset(off), dst.offset(off));
                    match comm {
                        Some(c) if peer != r.rank => {
                            c.send(s, chunk as usize, u8t, peer, stream)?;
                            c.recv(d, chunk as usize, u8t, peer, stream)?;
                        }
                        _ => copy(be, d, s, chunk, stream)?,
                    }
                }
            }
            CollKind::Permute => {
                check_dst(b, b.bytes)?;
                if let Some(t) = r.send_to {
                    match comm {
                        Some(c) if t != r.rank => c.send(src, b.bytes as usize, u8t, t, stream)?,
                        _ => copy(be, dst, src, b.bytes, stream)?,
                    }
                }
                if let (Some(s), Some(c)) = (r.recv_from, comm) {
                    if s != r.rank {
                        c.recv(dst, b.bytes as usize, u8t, s, stream)?;
                    }
                }
            }
        }
    }
    Ok(())
}

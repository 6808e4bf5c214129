//! Collectives across devices: XLA's device assignment, the participants
//! of each collective (XLA's `GetParticipatingDevices`), the communicators
//! of one process ([`Cliques`]), and the loaded form of collective thunks.
//!
//! One [`Executable`](crate::Executable) runs on one device. For a program
//! that spans several devices the caller loads one executable per device,
//! gives each a [`CollectiveEnv`] (the same [`Cliques`] for all), and calls
//! `run` on device k from device k's own thread: the first run makes the
//! communicators (every rank of a clique must join at the same time), before
//! any graph capture begins. Later runs, captured or not, only enqueue.
//!
//! Semantics (XLA's GPU collective thunks): all-reduce per buffer;
//! all-gather of `element_count` elements per rank; reduce-scatter of
//! `element_count / ranks` elements per rank (`element_count` is the
//! source's count); all-to-all with a split dimension sends chunk i of the
//! one buffer to rank i, without it buffer i to rank i; collective permute
//! sends to its target and receives from its source, zeroing the
//! destination where there is no source; collective broadcast from rank 0.
//! Data movement uses bytes ([`CommType::U8`]); reductions use the element
//! type (complex as pairs of reals, which is exact for sums).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use xla_vmm::{CollectiveOp, CollectiveThunk, ElementType, GroupMode, ReductionKind, Slice};
use xla_vmm_device::{Backend, CliqueId, CommType, Communicator, DevicePtr, ReduceOp};

use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;

/// How long a rank waits for rank 0's clique id.
const ID_TIMEOUT: Duration = Duration::from_secs(600);

/// XLA's device assignment: ids[r * partitions + p] = global device id of replica r, partition p.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAssignment {
    pub replicas: usize,
    pub partitions: usize,
    pub ids: Vec<i64>,
}

impl DeviceAssignment {
    /// One device (id 0): replica 0, partition 0.
    pub fn single() -> Self {
        DeviceAssignment {
            replicas: 1,
            partitions: 1,
            ids: vec![0],
        }
    }

    fn check(&self) -> Result<()> {
        if self.replicas == 0
            || self.partitions == 0
            || self.ids.len() != self.replicas * self.partitions
        {
            return Err(RuntimeError::arg(format!(
                "device assignment of {} replicas x {} partitions has {} ids",
                self.replicas,
                self.partitions,
                self.ids.len()
            )));
        }
        Ok(())
    }

    /// (replica, partition) of global device `id`.
    pub fn logical(&self, id: i64) -> Option<(usize, usize)> {
        let i = self.ids.iter().position(|&d| d == id)?;
        Some((i / self.partitions, i % self.partitions))
    }

    fn at(&self, r: usize, p: usize) -> i64 {
        self.ids[r * self.partitions + p]
    }
}

/// Hands clique ids between ranks (in-process, or jax's key-value store across processes).
pub trait IdExchange: Send + Sync {
    fn put(&self, key: &str, value: &str) -> Result<()>;
    /// Blocks until `key` is present or `timeout` passes (then an error naming the key).
    fn get(&self, key: &str, timeout: Duration) -> Result<String>;
}

/// In-process IdExchange (HashMap + Condvar).
#[derive(Default)]
pub struct LocalExchange {
    map: Mutex<HashMap<String, String>>,
    cv: Condvar,
}

impl LocalExchange {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

impl IdExchange for LocalExchange {
    fn put(&self, key: &str, value: &str) -> Result<()> {
        let mut m = self
            .map
            .lock()
            .map_err(|_| RuntimeError::invalid("id exchange lock poisoned"))?;
        m.insert(key.to_string(), value.to_string());
        self.cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<String> {
        let deadline = std::time::Instant::now() + timeout;
        let mut m = self
            .map
            .lock()
            .map_err(|_| RuntimeError::invalid("id exchange lock poisoned"))?;
        loop {
            if let Some(v) = m.get(key) {
                return Ok(v.clone());
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(RuntimeError::arg(format!(
                    "timed out after {timeout:?} waiting for key '{key}'"
                )));
            }
            m = self
                .cv
                .wait_timeout(m, deadline - now)
                .map_err(|_| RuntimeError::invalid("id exchange lock poisoned"))?
                .0;
        }
    }
}

type CommMap<B> = HashMap<(Vec<i64>, usize, usize), Arc<dyn Communicator<B>>>;

/// The communicators of one process, shared by all its devices and executables:
/// one per (participants in rank order, rank). Key in the exchange: "xla_vmm/clique/<ids comma-joined>".
pub struct Cliques<B: Backend> {
    exchange: Arc<dyn IdExchange>,
    comms: Mutex<CommMap<B>>,
}

/// The exchange key of the clique of `participants`.
pub fn clique_key(participants: &[i64]) -> String {
    let ids: Vec<String> = participants.iter().map(i64::to_string).collect();
    format!("xla_vmm/clique/{}", ids.join(","))
}

impl<B: Backend> Cliques<B> {
    pub fn new(exchange: Arc<dyn IdExchange>) -> Arc<Self> {
        Arc::new(Cliques {
            exchange,
            comms: Mutex::new(HashMap::new()),
        })
    }

    /// The communicator of `rank` in the clique `participants` (global device ids, rank order),
    /// made on first use: rank 0 makes the id (backend.clique_id()) and puts it, the others get it;
    /// then backend.comm_init_rank (blocks until all ranks join, so each local rank calls this from its own thread).
    pub fn communicator(
        &self,
        backend: &B,
        participants: &[i64],
        rank: usize,
    ) -> Result<Arc<dyn Communicator<B>>> {
        self.communicator_tagged(backend, participants, rank, 0)
    }

    /// [`Cliques::communicator`] of a separate clique per `tag`: collectives
    /// on communication stream i use tag i + 1, the others 0 (XLA keys its
    /// cliques by stream the same way, so that async collectives never wait
    /// behind synchronous ones on a shared communicator). Exchange key:
    /// that of tag 0, plus `/stream<tag>` for tag > 0.
    pub fn communicator_tagged(
        &self,
        backend: &B,
        participants: &[i64],
        rank: usize,
        tag: usize,
    ) -> Result<Arc<dyn Communicator<B>>> {
        if rank >= participants.len() {
            return Err(RuntimeError::arg(format!(
                "rank {rank} of a {}-device clique",
                participants.len()
            )));
        }
        let key = (participants.to_vec(), rank, tag);
        let lock = || {
            self.comms
                .lock()
                .map_err(|_| RuntimeError::invalid("clique table lock poisoned"))
        };
        if let Some(c) = lock()?.get(&key) {
            return Ok(c.clone());
        }
        // Not under the lock: joining blocks until the other ranks, which
        // need the table too, have joined.
        let mut name = clique_key(participants);
        if tag > 0 {
            name.push_str(&format!("/stream{tag}"));
        }
        let id = if rank == 0 {
            let id = backend.clique_id()?;
            self.exchange.put(&name, &id.to_hex())?;
            id
        } else {
            let hex = self.exchange.get(&name, ID_TIMEOUT)?;
            CliqueId::from_hex(&hex)
                .ok_or_else(|| RuntimeError::arg(format!("'{name}': not a clique id")))?
        };
        tracing::info!(clique = %name, rank, "joining clique");
        let comm: Arc<dyn Communicator<B>> =
            Arc::from(backend.comm_init_rank(&id, participants.len(), rank)?);
        Ok(lock()?.entry(key).or_insert(comm).clone())
    }
}

/// What an executable needs to run collectives on its device.
pub struct CollectiveEnv<B: Backend> {
    pub assignment: DeviceAssignment,
    pub device_id: i64,
    pub cliques: Arc<Cliques<B>>,
}

/// The ids of the group (of `groups`) holding `me`; empty `groups` = one
/// group of `0..total`.
fn group_of(groups: &[Vec<i64>], me: usize, total: Option<usize>) -> Result<Vec<usize>> {
    if groups.is_empty() {
        let n = total.ok_or_else(|| {
            RuntimeError::invalid("replica groups cannot be empty in flattened-id mode")
        })?;
        return Ok((0..n).collect());
    }
    let g = groups
        .iter()
        .find(|g| g.contains(&(me as i64)))
        .ok_or_else(|| RuntimeError::invalid(format!("id {me} is in no replica group")))?;
    g.iter()
        .map(|&i| usize::try_from(i).map_err(|_| RuntimeError::invalid(format!("negative id {i}"))))
        .collect()
}

fn id_range(i: usize, n: usize, what: &str) -> Result<usize> {
    if i < n {
        Ok(i)
    } else {
        Err(RuntimeError::invalid(format!("{what} {i} of {n}")))
    }
}

/// The global device ids taking part, in rank order, with `device_id` (XLA's
/// `GetParticipatingDevices`).
pub fn participants(
    a: &DeviceAssignment,
    device_id: i64,
    mode: GroupMode,
    groups: &[Vec<i64>],
) -> Result<Vec<i64>> {
    a.check()?;
    let (r, p) = a.logical(device_id).ok_or_else(|| {
        RuntimeError::arg(format!(
            "device {device_id} is not in the device assignment"
        ))
    })?;
    let (nr, np) = (a.replicas, a.partitions);
    let mut out = Vec::new();
    match mode {
        GroupMode::CrossReplica => {
            for r2 in group_of(groups, r, Some(nr))? {
                out.push(a.at(id_range(r2, nr, "replica")?, p));
            }
        }
        GroupMode::CrossPartition => {
            for p2 in group_of(groups, p, Some(np))? {
                out.push(a.at(r, id_range(p2, np, "partition")?));
            }
        }
        GroupMode::CrossReplicaAndPartition => {
            for r2 in group_of(groups, r, Some(nr))? {
                let r2 = id_range(r2, nr, "replica")?;
                for p2 in 0..np {
                    out.push(a.at(r2, p2));
                }
            }
        }
        GroupMode::FlattenedId => {
            for f in group_of(groups, r * np + p, None)? {
                let f = id_range(f, nr * np, "flattened id")?;
                out.push(a.at(f / np, f % np));
            }
        }
    }
    Ok(out)
}

/// The global device of collective-permute id `id` seen from `device_id`
/// (ids are replica ids in cross-replica mode, partition ids in
/// cross-partition mode, flattened ids otherwise).
pub fn permute_device(
    a: &DeviceAssignment,
    device_id: i64,
    mode: GroupMode,
    id: i64,
) -> Result<i64> {
    let (r, p) = a
        .logical(device_id)
        .ok_or_else(|| RuntimeError::arg(format!("device {device_id} is not assigned")))?;
    let id = usize::try_from(id).map_err(|_| RuntimeError::invalid(format!("id {id}")))?;
    Ok(match mode {
        GroupMode::CrossReplica => a.at(id_range(id, a.replicas, "replica")?, p),
        GroupMode::CrossPartition => a.at(r, id_range(id, a.partitions, "partition")?),
        _ => {
            let f = id_range(id, a.ids.len(), "flattened id")?;
            a.ids[f]
        }
    })
}

/// This device's id in collective-permute id space.
fn permute_id(a: &DeviceAssignment, device_id: i64, mode: GroupMode) -> Option<i64> {
    let (r, p) = a.logical(device_id)?;
    Some(match mode {
        GroupMode::CrossReplica => r as i64,
        GroupMode::CrossPartition => p as i64,
        _ => (r * a.partitions + p) as i64,
    })
}

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
    /// communication stream i (see [`Cliques::communicator_tagged`]).
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
    pub comm: Option<Arc<dyn Communicator<B>>>,
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
    comm: Option<&dyn Communicator<B>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn a(r: usize, p: usize) -> DeviceAssignment {
        DeviceAssignment {
            replicas: r,
            partitions: p,
            ids: (0..(r * p) as i64).map(|i| 10 + i).collect(),
        }
    }

    #[test]
    fn participants_follow_xla_group_modes() {
        // 2 replicas x 3 partitions: ids[r*3+p] = 10 + r*3 + p.
        let d = a(2, 3);
        let dev = 14; // replica 1, partition 1
        assert_eq!(d.logical(dev), Some((1, 1)));
        assert_eq!(
            participants(&d, dev, GroupMode::CrossReplica, &[]).unwrap(),
            vec![11, 14]
        );
        assert_eq!(
            participants(&d, dev, GroupMode::CrossPartition, &[vec![2, 1], vec![0]]).unwrap(),
            vec![15, 14]
        );
        assert_eq!(
            participants(&d, dev, GroupMode::CrossPartition, &[]).unwrap(),
            vec![13, 14, 15]
        );
        assert_eq!(
            participants(&d, dev, GroupMode::CrossReplicaAndPartition, &[vec![1, 0]]).unwrap(),
            vec![13, 14, 15, 10, 11, 12]
        );
        assert_eq!(
            participants(
                &d,
                dev,
                GroupMode::FlattenedId,
                &[vec![4, 0], vec![1, 2, 3, 5]]
            )
            .unwrap(),
            vec![14, 10]
        );
        assert!(participants(&d, dev, GroupMode::FlattenedId, &[]).is_err());
        assert!(participants(&d, 99, GroupMode::CrossReplica, &[]).is_err());
        assert!(participants(&d, dev, GroupMode::CrossPartition, &[vec![0, 2]]).is_err());
        assert!(participants(&d, dev, GroupMode::CrossReplica, &[vec![1, 7]]).is_err());
    }

    #[test]
    fn permute_ids_map_to_devices() {
        let d = a(2, 3);
        assert_eq!(
            permute_device(&d, 14, GroupMode::CrossPartition, 2).unwrap(),
            15
        );
        assert_eq!(
            permute_device(&d, 14, GroupMode::CrossReplica, 0).unwrap(),
            11
        );
        assert_eq!(
            permute_device(&d, 14, GroupMode::FlattenedId, 5).unwrap(),
            15
        );
        assert_eq!(permute_id(&d, 14, GroupMode::CrossPartition), Some(1));
        assert_eq!(permute_id(&d, 14, GroupMode::FlattenedId), Some(4));
    }

    #[test]
    fn reduction_types() {
        let r = reduce_type(ElementType(15), ReductionKind::Sum).unwrap();
        assert_eq!(r, (CommType::F32, ReduceOp::Sum, 2));
        assert_eq!(
            reduce_type(ElementType::PRED, ReductionKind::Max)
                .unwrap()
                .0,
            CommType::U8
        );
        assert!(reduce_type(ElementType::PRED, ReductionKind::Sum).is_err());
        assert!(reduce_type(ElementType(15), ReductionKind::Max).is_err());
        assert!(reduce_type(ElementType(3), ReductionKind::Sum).is_err()); // S16
    }

    #[test]
    fn local_exchange_times_out_naming_the_key() {
        let x = LocalExchange::new();
        x.put("a", "1").unwrap();
        assert_eq!(x.get("a", Duration::from_millis(1)).unwrap(), "1");
        let e = x.get("missing", Duration::from_millis(5)).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let x2 = x.clone();
        let t = std::thread::spawn(move || x2.get("late", Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(20));
        x.put("late", "v").unwrap();
        assert_eq!(t.join().unwrap().unwrap(), "v");
    }
}

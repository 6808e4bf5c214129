//! Collectives of the host backend: an in-process emulation of NCCL, so the
//! multi-device runtime can be tested without GPUs.
//!
//! Each rank is a separate [`HostBackend`] (one per emulated device; two
//! ranks of one clique on the same backend are refused, since an operation
//! blocks with its backend locked while it waits for its peers). A clique is
//! a process-wide registry entry keyed by [`CliqueId`]:
//! [`comm_init_rank`] blocks until `nranks` ranks have joined (or the
//! clique's timeout passes: a clear error).
//!
//! Operations are stream ordered like every host operation: each is one
//! queued op (a launch of an internal kernel, so it is captured into graphs,
//! and every replay of the graph performs the collective again). When it
//! executes, a collective deposits its input in a *round* of the clique (the
//! n-th collective this rank executes joins round n), the last rank to
//! arrive computes every rank's output, and each rank copies its output to
//! its buffer. Sends are non-blocking (a FIFO mailbox per (source,
//! destination) pair); a receive waits for the matching send. Operations
//! between `group_start` and `group_end` run as one op, sends first, so a
//! ring of send/recv pairs cannot deadlock.
//!
//! Every wait is bounded by the clique's timeout (default 60 s, or
//! `$XLA_VMM_HOST_COLLECTIVE_TIMEOUT_MS` when `clique_id` runs; see also
//! [`HostBackend::clique_id_with_timeout`]). Each communicator call is a
//! counted backend call (`all_reduce`, `send`, `group_end`, ...), so
//! [`HostBackend::inject_failure`] can make it fail.
//!
//! While a communicator lives, the backend counts one module (the internal
//! kernel's); dropping the communicator unloads it, after which a graph that
//! captured its operations fails on replay.

mod reduce;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::exec::{Op, State};
use super::kernel::{HostKernelCtx, HostKernelFn};
use super::{count_call, CallLog, HostBackend, HostStream};
use crate::backend::{DevicePtr, LaunchConfig};
use crate::collective::{CliqueId, CommType, Communicator, ReduceOp};
use crate::error::{DeviceError, Result};

/// Timeout of a clique made by [`Backend::clique_id`](crate::Backend::clique_id).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(60);

const MAGIC: &[u8; 8] = b"XVMMHOST";
const KERNEL: &str = "xla_vmm_host_collective";

static NEXT_CLIQUE: AtomicU64 = AtomicU64::new(1);

fn registry() -> &'static Mutex<HashMap<CliqueId, Arc<Clique>>> {
    static R: OnceLock<Mutex<HashMap<CliqueId, Arc<Clique>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn collective_error(call: &'static str, message: String) -> DeviceError {
    DeviceError::Driver {
        call,
        code: 5,
        name: "HOST_COLLECTIVE_ERROR".into(),
        message,
    }
}

impl HostBackend {
    /// A fresh clique id whose waits (joining, and every operation) time out
    /// after `timeout`.
    pub fn clique_id_with_timeout(&self, timeout: Duration) -> CliqueId {
        let mut b = [0u8; 128];
        b[..8].copy_from_slice(MAGIC);
        let n = NEXT_CLIQUE.fetch_add(1, Ordering::Relaxed);
        b[8..16].copy_from_slice(&n.to_le_bytes());
        b[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        b[20..28].copy_from_slice(&ms.to_le_bytes());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b[28..36].copy_from_slice(&nanos.to_le_bytes());
        CliqueId(b)
    }
}

pub(super) fn clique_id(backend: &HostBackend) -> Result<CliqueId> {
    if let Some(e) = backend.count("clique_id") {
        return Err(e);
    }
    let timeout = xla_vmm_ffi::settings::get()
        .host_collective_timeout_ms
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_COLLECTIVE_TIMEOUT, Duration::from_millis);
    Ok(backend.clique_id_with_timeout(timeout))
}

fn timeout_of(id: &CliqueId) -> Result<Duration> {
    if &id.0[..8] != MAGIC {
        return Err(DeviceError::InvalidArgument(format!(
            "{id:?} was not made by a host backend (clique_id)"
        )));
    }
    let mut ms = [0u8; 8];
    ms.copy_from_slice(&id.0[20..28]);
    Ok(Duration::from_millis(u64::from_le_bytes(ms)))
}

/// Data of one collective of one rank.
#[derive(Clone, Debug)]
enum Coll {
    AllReduce {
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
    },
    AllGather {
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
    },
    ReduceScatter {
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
    },
    Broadcast {
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        root: usize,
    },
    Send {
        src: DevicePtr,
        bytes: usize,
        peer: usize,
    },
    Recv {
        dst: DevicePtr,
        bytes: usize,
        peer: usize,
    },
}

impl Coll {
    /// What every rank of a round must agree on.
    fn signature(&self) -> String {
        match self {
            Coll::AllReduce { count, ty, op, .. } => {
                format!("all_reduce({count} x {ty:?}, {op:?})")
            }
            Coll::AllGather { count, ty, .. } => format!("all_gather({count} x {ty:?})"),
            Coll::ReduceScatter { count, ty, op, .. } => {
                format!("reduce_scatter({count} x {ty:?}, {op:?})")
            }
            Coll::Broadcast {
                count, ty, root, ..
            } => format!("broadcast({count} x {ty:?}, root {root})"),
            Coll::Send { .. } | Coll::Recv { .. } => "p2p".into(),
        }
    }
}

struct Round {
    signature: String,
    inputs: Vec<Option<Vec<u8>>>,
    outputs: Option<std::result::Result<Vec<Vec<u8>>, String>>,
    taken: usize,
}

#[derive(Default)]
struct CliqueState {
    /// Backend id of each joined rank.
    joined: Vec<Option<u64>>,
    rounds: HashMap<u64, Round>,
    mail: HashMap<(usize, usize), VecDeque<Vec<u8>>>,
}

struct Clique {
    id: CliqueId,
    nranks: usize,
    timeout: Duration,
    state: Mutex<CliqueState>,
    cv: Condvar,
}

impl Clique {
    /// Wait on the condvar until `done` or the deadline; `Err(())` on timeout.
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, CliqueState>,
        deadline: Instant,
        mut done: impl FnMut(&mut CliqueState) -> bool,
    ) -> std::result::Result<MutexGuard<'a, CliqueState>, MutexGuard<'a, CliqueState>> {
        loop {
            if done(&mut st) {
                return Ok(st);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(st);
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

pub(super) fn comm_init_rank(
    backend: &HostBackend,
    id: &CliqueId,
    nranks: usize,
    rank: usize,
) -> Result<Box<dyn Communicator<HostStream>>> {
    if let Some(e) = backend.count("comm_init_rank") {
        return Err(e);
    }
    let timeout = timeout_of(id)?;
    if nranks == 0 || rank >= nranks {
        return Err(DeviceError::InvalidArgument(format!(
            "comm_init_rank: rank {rank} of {nranks}"
        )));
    }
    let clique = {
        let mut reg = relock(registry());
        let c = reg
            .entry(id.clone())
            .or_insert_with(|| {
                Arc::new(Clique {
                    id: id.clone(),
                    nranks,
                    timeout,
                    state: Mutex::new(CliqueState {
                        joined: vec![None; nranks],
                        ..Default::default()
                    }),
                    cv: Condvar::new(),
                })
            })
            .clone();
        if c.nranks != nranks {
            return Err(DeviceError::InvalidArgument(format!(
                "comm_init_rank: {id:?} has {} ranks, rank {rank} says {nranks}",
                c.nranks
            )));
        }
        let mut st = relock(&c.state);
        if st.joined[rank].is_some() {
            return Err(DeviceError::InvalidArgument(format!(
                "comm_init_rank: rank {rank} of {id:?} joined twice"
            )));
        }
        if st.joined.contains(&Some(backend.id)) {
            return Err(DeviceError::InvalidArgument(format!(
                "comm_init_rank: two ranks of {id:?} on one host backend (each rank needs its own HostBackend)"
            )));
        }
        st.joined[rank] = Some(backend.id);
        drop(st);
        c
    };
    clique.cv.notify_all();
    let deadline = Instant::now() + clique.timeout;
    let st = relock(&clique.state);
    match clique.wait_until(st, deadline, |s| s.joined.iter().all(Option::is_some)) {
        Ok(_) => {
            // Everyone is in: the id cannot be joined again.
            let mut reg = relock(registry());
            if reg.get(id).is_some_and(|c| Arc::ptr_eq(c, &clique)) {
                reg.remove(id);
            }
        }
        Err(mut st) => {
            let missing: Vec<usize> = (0..nranks).filter(|&r| st.joined[r].is_none()).collect();
            st.joined[rank] = None;
            let nobody = st.joined.iter().all(Option::is_none);
            drop(st);
            if nobody {
                let mut reg = relock(registry());
                if reg.get(id).is_some_and(|c| Arc::ptr_eq(c, &clique)) {
                    reg.remove(id);
                }
            }
            return Err(collective_error(
                "comm_init_rank",
                format!(
                    "rank {rank} of {id:?}: ranks {missing:?} did not join within {:?}",
                    clique.timeout
                ),
            ));
        }
    }
    let module = backend.new_handle();
    backend
        .lock()
        .modules
        .insert(module, vec![KERNEL.to_string()]);
    tracing::debug!(rank, nranks, ?id, "host backend: communicator ready");
    Ok(Box::new(HostComm {
        backend: backend.id,
        state: backend.state.clone(),
        calls: backend.calls.clone(),
        module,
        rank,
        clique,
        executed: Arc::new(AtomicU64::new(0)),
        group: Mutex::new(Group::default()),
    }))
}

#[derive(Default)]
struct Group {
    depth: usize,
    stream: Option<u64>,
    ops: Vec<Coll>,
}

/// One rank of a host clique.
struct HostComm {
    backend: u64,
    state: Arc<Mutex<State>>,
    calls: Arc<Mutex<CallLog>>,
    module: u64,
    rank: usize,
    clique: Arc<Clique>,
    /// Collectives this rank has executed (its next round number).
    executed: Arc<AtomicU64>,
    group: Mutex<Group>,
}

impl Drop for HostComm {
    fn drop(&mut self) {
        relock(&self.state).modules.remove(&self.module);
    }
}

impl HostComm {
    fn check_peer(&self, what: &str, peer: usize) -> Result<()> {
        if peer >= self.clique.nranks {
            return Err(DeviceError::InvalidArgument(format!(
                "{what}: rank {peer} outside a clique of {}",
                self.clique.nranks
            )));
        }
        Ok(())
    }

    /// Count the call, then queue `coll` (or add it to the open group).
    fn issue(&self, call: &'static str, coll: Coll, stream: &HostStream) -> Result<()> {
        if stream.backend != self.backend {
            return Err(DeviceError::InvalidArgument(format!(
                "{call}: stream of host backend {} used with a communicator of host backend {}",
                stream.backend, self.backend
            )));
        }
        if let Some(e) = count_call(&self.calls, call) {
            return Err(e);
        }
        let mut g = relock(&self.group);
        if g.depth > 0 {
            if g.stream.is_some_and(|s| s != stream.id) {
                return Err(DeviceError::InvalidArgument(format!(
                    "{call}: the host emulation needs one stream per group"
                )));
            }
            g.stream = Some(stream.id);
            g.ops.push(coll);
            return Ok(());
        }
        drop(g);
        self.submit(stream.id, vec![coll])
    }

    fn submit(&self, stream: u64, ops: Vec<Coll>) -> Result<()> {
        let clique = self.clique.clone();
        let rank = self.rank;
        let executed = self.executed.clone();
        let ops = Arc::new(ops);
        let kernel: HostKernelFn =
            Arc::new(move |ctx, _args, _config| run_group(ctx, &clique, rank, &executed, &ops));
        let op = Op::Launch {
            module: self.module,
            name: KERNEL.into(),
            kernel,
            config: LaunchConfig {
                grid: [1, 1, 1],
                block: [1, 1, 1],
                ..Default::default()
            },
            args: Vec::new(),
            enabled: true,
        };
        relock(&self.state).submit(stream, op)
    }
}

/// Execute one rank's op list: sends first (non-blocking), then the rest
/// in order.
fn run_group(
    ctx: &HostKernelCtx<'_>,
    clique: &Clique,
    rank: usize,
    executed: &AtomicU64,
    ops: &[Coll],
) -> Result<()> {
    for c in ops {
        if let Coll::Send { src, bytes, peer } = c {
            let data = ctx.read_vec(*src, *bytes)?;
            relock(&clique.state)
                .mail
                .entry((rank, *peer))
                .or_default()
                .push_back(data);
            clique.cv.notify_all();
        }
    }
    for c in ops {
        match c {
            Coll::Send { .. } => {}
            Coll::Recv { dst, bytes, peer } => {
                let deadline = Instant::now() + clique.timeout;
                let st = relock(&clique.state);
                let key = (*peer, rank);
                let mut got = None;
                let r = clique.wait_until(st, deadline, |s| {
                    got = s.mail.get_mut(&key).and_then(VecDeque::pop_front);
                    got.is_some()
                });
                drop(r.map_err(|_| {
                    collective_error(
                        "recv",
                        format!(
                            "rank {rank} of {:?}: no send from rank {peer} within {:?}",
                            clique.id, clique.timeout
                        ),
                    )
                })?);
                let data = got.expect("wait_until succeeded");
                if data.len() != *bytes {
                    return Err(collective_error(
                        "recv",
                        format!(
                            "rank {rank}: receive of {bytes} bytes matched a send of {} bytes from rank {peer}",
                            data.len()
                        ),
                    ));
                }
                ctx.write(*dst, &data)?;
            }
            coll => {
                let seq = executed.fetch_add(1, Ordering::Relaxed);
                rendezvous(ctx, clique, rank, seq, coll)?;
            }
        }
    }
    Ok(())
}

fn bytes_of(count: usize, ty: CommType) -> Result<usize> {
    count.checked_mul(ty.size()).ok_or_else(|| {
        DeviceError::InvalidArgument(format!("collective of {count} x {ty:?} overflows"))
    })
}

/// This rank's input, destination and output length (`None`: p2p).
fn read_input(
    ctx: &HostKernelCtx<'_>,
    coll: &Coll,
    rank: usize,
    n: usize,
) -> Result<Option<(Vec<u8>, DevicePtr, usize)>> {
    Ok(Some(match *coll {
        Coll::AllReduce {
            src,
            dst,
            count,
            ty,
            ..
        } => {
            let b = bytes_of(count, ty)?;
            (ctx.read_vec(src, b)?, dst, b)
        }
        Coll::AllGather {
            src,
            dst,
            count,
            ty,
        } => {
            let b = bytes_of(count, ty)?;
            (ctx.read_vec(src, b)?, dst, b * n)
        }
        Coll::ReduceScatter {
            src,
            dst,
            count,
            ty,
            ..
        } => {
            let b = bytes_of(count, ty)?;
            (ctx.read_vec(src, b * n)?, dst, b)
        }
        Coll::Broadcast {
            src,
            dst,
            count,
            ty,
            root,
        } => {
            let b = bytes_of(count, ty)?;
            let input = if rank == root {
                ctx.read_vec(src, b)?
            } else {
                Vec::new()
            };
            (input, dst, b)
        }
        Coll::Send { .. } | Coll::Recv { .. } => return Ok(None),
    }))
}

fn rendezvous(
    ctx: &HostKernelCtx<'_>,
    clique: &Clique,
    rank: usize,
    seq: u64,
    coll: &Coll,
) -> Result<()> {
    let n = clique.nranks;
    let (input, dst, out_len) = match read_input(ctx, coll, rank, n) {
        Ok(Some(x)) => x,
        Ok(None) => return Ok(()),
        Err(e) => {
            // Fail the round for every rank now rather than at the timeout.
            let mut st = relock(&clique.state);
            let round = st.rounds.entry(seq).or_insert_with(|| Round {
                signature: coll.signature(),
                inputs: vec![None; n],
                outputs: None,
                taken: 0,
            });
            round.outputs.get_or_insert_with(|| {
                Err(format!(
                    "collective #{seq} of {:?} failed on rank {rank}: {e}",
                    clique.id
                ))
            });
            round.taken += 1;
            if round.taken == n {
                st.rounds.remove(&seq);
            }
            clique.cv.notify_all();
            return Err(e);
        }
    };
    let signature = coll.signature();
    let mut st = relock(&clique.state);
    let round = st.rounds.entry(seq).or_insert_with(|| Round {
        signature: signature.clone(),
        inputs: vec![None; n],
        outputs: None,
        taken: 0,
    });
    if round.signature != signature && round.outputs.is_none() {
        round.outputs = Some(Err(format!(
            "collective #{seq} of {:?}: rank {rank} issued {signature}, another rank {}",
            clique.id, round.signature
        )));
    }
    round.inputs[rank] = Some(input);
    if round.outputs.is_none() && round.inputs.iter().all(Option::is_some) {
        let inputs: Vec<Vec<u8>> = round
            .inputs
            .iter_mut()
            .map(|i| i.take().unwrap_or_default())
            .collect();
        round.outputs = Some(Ok(compute(coll, &inputs, n)));
        clique.cv.notify_all();
    } else if round.outputs.is_some() {
        clique.cv.notify_all();
    }
    let deadline = Instant::now() + clique.timeout;
    let waited = clique.wait_until(st, deadline, |s| {
        s.rounds.get(&seq).is_some_and(|r| r.outputs.is_some())
    });
    let mut st = match waited {
        Ok(st) => st,
        Err(st) => {
            let missing: Vec<usize> = st
                .rounds
                .get(&seq)
                .map(|r| (0..n).filter(|&i| r.inputs[i].is_none()).collect())
                .unwrap_or_default();
            return Err(collective_error(
                "collective",
                format!(
                    "rank {rank} of {:?}: {signature} (collective #{seq}) waited {:?} for ranks {missing:?}",
                    clique.id, clique.timeout
                ),
            ));
        }
    };
    let round = st.rounds.get_mut(&seq).expect("checked by the wait");
    round.taken += 1;
    let out = match round.outputs.as_mut().expect("checked by the wait") {
        Ok(outs) => Ok(std::mem::take(&mut outs[rank])),
        Err(msg) => Err(collective_error("collective", msg.clone())),
    };
    if round.taken == n {
        st.rounds.remove(&seq);
    }
    drop(st);
    let out = out?;
    debug_assert_eq!(out.len(), out_len);
    ctx.write(dst, &out)
}

/// Every rank's output of one round.
fn compute(coll: &Coll, inputs: &[Vec<u8>], n: usize) -> Vec<Vec<u8>> {
    match *coll {
        Coll::AllReduce { ty, op, .. } => {
            let r = reduce::reduce_all(ty, op, inputs);
            vec![r; n]
        }
        Coll::AllGather { .. } => vec![inputs.concat(); n],
        Coll::ReduceScatter { count, ty, op, .. } => {
            let r = reduce::reduce_all(ty, op, inputs);
            let b = count * ty.size();
            (0..n).map(|i| r[i * b..(i + 1) * b].to_vec()).collect()
        }
        Coll::Broadcast { root, .. } => vec![inputs[root].clone(); n],
        Coll::Send { .. } | Coll::Recv { .. } => vec![Vec::new(); n],
    }
}

impl Communicator<HostStream> for HostComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.clique.nranks
    }

    fn all_reduce(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &HostStream,
    ) -> Result<()> {
        bytes_of(count, ty)?;
        let c = Coll::AllReduce {
            src,
            dst,
            count,
            ty,
            op,
        };
        self.issue("all_reduce", c, stream)
    }

    fn all_gather(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        stream: &HostStream,
    ) -> Result<()> {
        bytes_of(count, ty)?;
        let c = Coll::AllGather {
            src,
            dst,
            count,
            ty,
        };
        self.issue("all_gather", c, stream)
    }

    fn reduce_scatter(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        op: ReduceOp,
        stream: &HostStream,
    ) -> Result<()> {
        bytes_of(count, ty)?;
        let c = Coll::ReduceScatter {
            src,
            dst,
            count,
            ty,
            op,
        };
        self.issue("reduce_scatter", c, stream)
    }

    fn broadcast(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        root: usize,
        stream: &HostStream,
    ) -> Result<()> {
        self.check_peer("broadcast", root)?;
        bytes_of(count, ty)?;
        let c = Coll::Broadcast {
            src,
            dst,
            count,
            ty,
            root,
        };
        self.issue("broadcast", c, stream)
    }

    fn send(
        &self,
        src: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &HostStream,
    ) -> Result<()> {
        self.check_peer("send", peer)?;
        let bytes = bytes_of(count, ty)?;
        self.issue("send", Coll::Send { src, bytes, peer }, stream)
    }

    fn recv(
        &self,
        dst: DevicePtr,
        count: usize,
        ty: CommType,
        peer: usize,
        stream: &HostStream,
    ) -> Result<()> {
        self.check_peer("recv", peer)?;
        let bytes = bytes_of(count, ty)?;
        self.issue("recv", Coll::Recv { dst, bytes, peer }, stream)
    }

    fn group_start(&self) -> Result<()> {
        if let Some(e) = count_call(&self.calls, "group_start") {
            return Err(e);
        }
        relock(&self.group).depth += 1;
        Ok(())
    }

    fn group_end(&self) -> Result<()> {
        let (stream, ops) = {
            let mut g = relock(&self.group);
            if g.depth == 0 {
                return Err(DeviceError::InvalidArgument(
                    "group_end without group_start".into(),
                ));
            }
            g.depth -= 1;
            if g.depth > 0 {
                return Ok(());
            }
            (g.stream.take(), std::mem::take(&mut g.ops))
        };
        // Counted after closing the group, so a failure leaves no group open.
        if let Some(e) = count_call(&self.calls, "group_end") {
            return Err(e);
        }
        match stream {
            Some(s) if !ops.is_empty() => self.submit(s, ops),
            _ => Ok(()),
        }
    }
}

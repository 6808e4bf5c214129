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
//! Data movement uses bytes ([`CommType::U8`](xla_vmm_device::collective::CommType::U8)); reductions use the element
//! type (complex as pairs of reals, which is exact for sums).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use xla_vmm::GroupMode;
use xla_vmm_device::{Backend, CliqueId, Communicator};

use crate::error::{Result, RuntimeError};

mod op;
pub use op::{load, reduce_type, resolve, run, CollBuffer, CollKind, CollOp, Resolved};

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
    /// One replica, one partition, on global device `device_id`.
    pub fn single(device_id: i64) -> Self {
        DeviceAssignment {
            replicas: 1,
            partitions: 1,
            ids: vec![device_id],
        }
    }

    pub fn num_devices(&self) -> usize {
        self.ids.len()
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

type CommMap<B> = HashMap<(Vec<i64>, usize, usize), Arc<dyn Communicator<<B as Backend>::Stream>>>;

/// The communicators of one process, shared by all its devices and executables:
/// one per (participants in rank order, rank). Key in the exchange: `"xla_vmm/clique/<ids comma-joined>"`.
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
    ) -> Result<Arc<dyn Communicator<B::Stream>>> {
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
    ) -> Result<Arc<dyn Communicator<B::Stream>>> {
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
        let comm: Arc<dyn Communicator<B::Stream>> =
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
/// (ids are replica ids in cross-replica mode, partition ids in every
/// other mode, as in XLA's collective permute).
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
        _ => a.at(r, id_range(id, a.partitions, "partition")?),
    })
}

/// This device's id in collective-permute id space.
fn permute_id(a: &DeviceAssignment, device_id: i64, mode: GroupMode) -> Option<i64> {
    let (r, p) = a.logical(device_id)?;
    Some(match mode {
        GroupMode::CrossReplica => r as i64,
        _ => p as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_vmm::{ElementType, ReductionKind};
    use xla_vmm_device::{CommType, ReduceOp};

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
        // Every mode but cross-replica names partitions (XLA's
        // GetCollectiveCurrentId / RemapSourceTargetToCliqueRanks).
        assert_eq!(
            permute_device(&d, 14, GroupMode::FlattenedId, 2).unwrap(),
            15
        );
        assert!(permute_device(&d, 14, GroupMode::FlattenedId, 5).is_err());
        assert_eq!(permute_id(&d, 14, GroupMode::CrossPartition), Some(1));
        assert_eq!(permute_id(&d, 14, GroupMode::FlattenedId), Some(1));
        assert_eq!(permute_id(&d, 14, GroupMode::CrossReplica), Some(1));
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

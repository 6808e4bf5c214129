//! Streams, events and graphs of the host backend: an in-order queue per
//! stream, executed on the calling thread.
//!
//! Work submitted to a stream whose queue is empty runs immediately, inside
//! the call, and its error (if any) is returned by that call. A stream can be
//! *held* ([`HostBackend::hold_stream`](super::HostBackend::hold_stream)):
//! its work then queues up (events recorded on it stay pending, streams
//! waiting on those events queue too) until it is released, which lets tests
//! observe stream-ordered behaviour. An error of queued work is kept on its
//! stream and returned by the next `stream_synchronize`.
//!
//! Capture: while a stream captures, its operations are appended to the
//! capture's op list instead of running; a stream that waits on an event
//! recorded inside the capture joins it (fork/join). The graph is that list;
//! launching an instance queues it as one operation.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::kernel::{HostKernelCtx, HostKernelFn};
use super::memory::Memory;
use super::pinned::PinnedStorage;
use crate::backend::{DevicePtr, LaunchConfig};
use crate::error::{DeviceError, Result};

/// Iteration cap of a WHILE node, so a predicate that never clears fails
/// instead of hanging.
const MAX_WHILE_ITERATIONS: u64 = 1 << 24;

#[derive(Clone)]
pub(crate) enum Op {
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    },
    H2D {
        dst: DevicePtr,
        host: Arc<PinnedStorage>,
        offset: usize,
        bytes: usize,
    },
    D2H {
        host: Arc<PinnedStorage>,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    },
    Fill {
        dst: DevicePtr,
        bytes: u64,
        pattern: Vec<u8>,
    },
    Launch {
        module: u64,
        name: Arc<str>,
        kernel: HostKernelFn,
        config: LaunchConfig,
        args: Vec<Vec<u8>>,
        /// False: a graph's node turned off (`graph_exec_node_set_enabled`),
        /// which runs as nothing.
        enabled: bool,
    },
    Graph(Arc<Vec<Op>>),
    While {
        predicate: DevicePtr,
        body: Arc<Vec<Op>>,
    },
    /// XLA's conditional as a graph node: the branch the value at `index`
    /// picks (see `Backend::capture_case`), read once when the node runs.
    Case {
        index: DevicePtr,
        is_pred: bool,
        branches: Vec<Arc<Vec<Op>>>,
    },
    Record {
        event: u64,
        seq: u64,
    },
    /// A record captured into a graph: the event is recorded (and
    /// complete) each time the graph runs here.
    RecordInGraph {
        event: u64,
    },
    Wait {
        event: u64,
        seq: u64,
    },
}

impl Op {
    /// Paths (indices through nested graphs and WHILE bodies) of the
    /// launches of kernel `name` of module `module` in `ops`.
    pub fn find_launches(
        ops: &[Op],
        module: u64,
        name: &str,
        prefix: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        for (i, op) in ops.iter().enumerate() {
            prefix.push(i);
            match op {
                Op::Launch {
                    module: m, name: n, ..
                } if *m == module && &**n == name => out.push(prefix.clone()),
                Op::Graph(body) | Op::While { body, .. } => {
                    Self::find_launches(body, module, name, prefix, out)
                }
                Op::Case { branches, .. } => {
                    for (b, body) in branches.iter().enumerate() {
                        prefix.push(b);
                        Self::find_launches(body, module, name, prefix, out);
                        prefix.pop();
                    }
                }
                _ => {}
            }
            prefix.pop();
        }
    }

    /// The op at `path` (see [`Op::find_launches`]), made unique (copied on
    /// write) along the way.
    pub fn at_path_mut<'a>(ops: &'a mut [Op], path: &[usize]) -> Option<&'a mut Op> {
        let (&first, rest) = path.split_first()?;
        let op = ops.get_mut(first)?;
        if rest.is_empty() {
            return Some(op);
        }
        match op {
            Op::Graph(body) | Op::While { body, .. } => {
                Self::at_path_mut(Arc::make_mut(body).as_mut_slice(), rest)
            }
            Op::Case { branches, .. } => {
                let (&b, rest) = rest.split_first()?;
                Self::at_path_mut(Arc::make_mut(branches.get_mut(b)?).as_mut_slice(), rest)
            }
            _ => None,
        }
    }

    /// Shape used by `graph_exec_update`: kinds, kernels and nesting must
    /// match; addresses, sizes and arguments may differ.
    pub fn same_topology(a: &[Op], b: &[Op]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| match (x, y) {
                (Op::Copy { .. }, Op::Copy { .. })
                | (Op::H2D { .. }, Op::H2D { .. })
                | (Op::D2H { .. }, Op::D2H { .. }) => true,
                (Op::Fill { pattern: p, .. }, Op::Fill { pattern: q, .. }) => p.len() == q.len(),
                (Op::Launch { name: n, .. }, Op::Launch { name: m, .. }) => n == m,
                (Op::Graph(g), Op::Graph(h)) => Op::same_topology(g, h),
                (Op::While { body: g, .. }, Op::While { body: h, .. }) => Op::same_topology(g, h),
                (Op::Case { branches: g, .. }, Op::Case { branches: h, .. }) => {
                    g.len() == h.len() && g.iter().zip(h).all(|(g, h)| Op::same_topology(g, h))
                }
                _ => false,
            })
    }
}

#[derive(Default)]
pub(crate) struct StreamEntry {
    pub queue: VecDeque<Op>,
    pub held: bool,
    pub error: Option<DeviceError>,
    /// Id of the capture this stream is part of.
    pub capture: Option<u64>,
}

#[derive(Default)]
pub(crate) struct EventEntry {
    /// Number of records issued (outside capture).
    pub recorded: u64,
    /// Highest record that has executed.
    pub completed: u64,
    pub time: Option<Instant>,
    /// Made by `event_create_untimed`: `event_elapsed_ms` refuses it.
    pub untimed: bool,
    /// Last recorded inside this capture (for fork/join).
    pub captured_in: Option<u64>,
}

impl EventEntry {
    pub fn complete(&self) -> bool {
        self.completed >= self.recorded
    }
}

pub(crate) struct Capture {
    pub origin: u64,
    /// Stack of op lists: [0] is the graph, the rest are open WHILE bodies.
    pub frames: Vec<Vec<Op>>,
}

pub(crate) struct State {
    pub mem: Memory,
    pub streams: BTreeMap<u64, StreamEntry>,
    pub events: HashMap<u64, EventEntry>,
    pub modules: HashMap<u64, Vec<String>>,
    pub graphs: HashMap<u64, Arc<Vec<Op>>>,
    pub execs: HashMap<u64, Arc<Vec<Op>>>,
    pub host_bufs: HashMap<u64, usize>,
    pub captures: HashMap<u64, Capture>,
    pub kernels: HashMap<String, HostKernelFn>,
}

impl State {
    pub fn new(mem: Memory) -> Self {
        State {
            mem,
            streams: BTreeMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            host_bufs: HashMap::new(),
            captures: HashMap::new(),
            kernels: HashMap::new(),
        }
    }

    fn execute(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::Copy { dst, src, bytes } => self.mem.copy(*dst, *src, *bytes),
            Op::H2D {
                dst,
                host,
                offset,
                bytes,
            } => {
                check_host_range(host, *offset, *bytes)?;
                let mut tmp = vec![0u8; *bytes];
                host.read(*offset, &mut tmp);
                self.mem.write(*dst, &tmp)
            }
            Op::D2H {
                host,
                offset,
                src,
                bytes,
            } => {
                check_host_range(host, *offset, *bytes)?;
                let mut tmp = vec![0u8; *bytes];
                self.mem.read(*src, &mut tmp)?;
                host.write(*offset, &tmp);
                Ok(())
            }
            Op::Fill {
                dst,
                bytes,
                pattern,
            } => self.mem.fill(*dst, *bytes, pattern),
            Op::Launch { enabled: false, .. } => Ok(()),
            Op::Launch {
                module,
                name,
                kernel,
                config,
                args,
                ..
            } => {
                if !self.modules.contains_key(module) {
                    return Err(DeviceError::InvalidArgument(format!(
                        "launch of {name}: its module was unloaded"
                    )));
                }
                let slices: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let ctx = HostKernelCtx::new(&mut self.mem);
                kernel(&ctx, &slices, config)
            }
            Op::Graph(ops) => ops.iter().try_for_each(|o| self.execute(o)),
            Op::While { predicate, body } => {
                for _ in 0..MAX_WHILE_ITERATIONS {
                    let mut p = [0u8];
                    self.mem.read(*predicate, &mut p)?;
                    if p[0] == 0 {
                        return Ok(());
                    }
                    body.iter().try_for_each(|o| self.execute(o))?;
                }
                Err(DeviceError::InvalidArgument(format!(
                    "WHILE node ran {MAX_WHILE_ITERATIONS} iterations without its predicate clearing"
                )))
            }
            Op::Case {
                index,
                is_pred,
                branches,
            } => {
                let n = branches.len();
                let pick = if *is_pred {
                    let mut p = [0u8];
                    self.mem.read(*index, &mut p)?;
                    usize::from(p[0] == 0)
                } else {
                    let mut v = [0u8; 4];
                    self.mem.read(*index, &mut v)?;
                    usize::try_from(i32::from_le_bytes(v))
                        .ok()
                        .filter(|&i| i < n)
                        .unwrap_or(n.saturating_sub(1))
                };
                match branches.get(pick) {
                    Some(ops) => ops.iter().try_for_each(|o| self.execute(o)),
                    None => Ok(()),
                }
            }
            Op::Record { event, seq } => {
                if let Some(e) = self.events.get_mut(event) {
                    e.completed = e.completed.max(*seq);
                    e.time = Some(Instant::now());
                }
                Ok(())
            }
            Op::RecordInGraph { event } => {
                if let Some(e) = self.events.get_mut(event) {
                    e.recorded = e.recorded.max(e.completed) + 1;
                    e.completed = e.recorded;
                    e.time = Some(Instant::now());
                }
                Ok(())
            }
            Op::Wait { .. } => Ok(()),
        }
    }

    fn waits_done(&self, op: &Op) -> bool {
        match op {
            Op::Wait { event, seq } => self.events.get(event).is_none_or(|e| e.completed >= *seq),
            _ => true,
        }
    }

    /// Run queued work on every stream until nothing can progress.
    pub fn pump(&mut self) {
        loop {
            let mut progress = false;
            let ids: Vec<u64> = self.streams.keys().copied().collect();
            for id in ids {
                while let Some(s) = self.streams.get(&id) {
                    let Some(front) = s.queue.front() else {
                        break;
                    };
                    if s.held || !self.waits_done(front) {
                        break;
                    }
                    let op = self
                        .streams
                        .get_mut(&id)
                        .and_then(|s| s.queue.pop_front())
                        .expect("front exists");
                    let r = self.execute(&op);
                    if let Err(e) = r {
                        tracing::debug!(stream = id, error = %e, "host backend: queued work failed");
                        let s = self.streams.get_mut(&id).expect("stream exists");
                        s.error.get_or_insert(e);
                    }
                    progress = true;
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// Queue `op` on `stream` (or append it to the stream's capture).
    pub fn submit(&mut self, stream: u64, op: Op) -> Result<()> {
        let s = self
            .streams
            .get(&stream)
            .ok_or_else(|| DeviceError::InvalidArgument("stream is not live".into()))?;
        if let Some(cap) = s.capture {
            // As CUDA does (CUDA_ERROR_INVALID_VALUE), a recorded copy's or
            // fill's device addresses must be accessible when recorded;
            // kernel arguments are not checked.
            let device_ranges = match &op {
                Op::Copy { dst, src, bytes } => [(*dst, *bytes), (*src, *bytes)],
                Op::Fill { dst, bytes, .. } => [(*dst, *bytes), (*dst, 0)],
                Op::H2D { dst, bytes, .. } => [(*dst, *bytes as u64), (*dst, 0)],
                Op::D2H { src, bytes, .. } => [(*src, *bytes as u64), (*src, 0)],
                _ => [(DevicePtr::NULL, 0); 2],
            };
            for (ptr, len) in device_ranges {
                self.mem.check_range(ptr, len).map_err(|e| match e {
                    DeviceError::InvalidArgument(m) => {
                        DeviceError::InvalidArgument(format!("recording a copy: {m}"))
                    }
                    e => e,
                })?;
            }
            let c = self
                .captures
                .get_mut(&cap)
                .expect("capture of a capturing stream");
            c.frames.last_mut().expect("capture has a frame").push(op);
            return Ok(());
        }
        let immediate = !s.held && s.queue.is_empty() && self.waits_done(&op);
        if immediate {
            let r = self.execute(&op);
            self.pump();
            r
        } else {
            self.streams
                .get_mut(&stream)
                .expect("checked above")
                .queue
                .push_back(op);
            Ok(())
        }
    }

    /// Error if `stream` cannot drain (held, or waiting on held work).
    pub fn drain_error(&self, stream: u64) -> Option<DeviceError> {
        let s = self.streams.get(&stream)?;
        if s.queue.is_empty() {
            return None;
        }
        Some(DeviceError::Driver {
            call: "stream_synchronize",
            code: 2,
            name: "HOST_WOULD_BLOCK_FOREVER".into(),
            message: if s.held {
                "the stream is held (HostBackend::hold_stream)".into()
            } else {
                "the stream waits on an event of a held stream".into()
            },
        })
    }
}

fn check_host_range(host: &PinnedStorage, offset: usize, bytes: usize) -> Result<()> {
    if offset.checked_add(bytes).is_none_or(|e| e > host.len()) {
        return Err(DeviceError::InvalidArgument(format!(
            "host range [{offset}, +{bytes}) outside the host buffer of {} bytes",
            host.len()
        )));
    }
    Ok(())
}

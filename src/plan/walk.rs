//! Traversal of the thunk tree and the slices each thunk reads and writes.

use super::{
    Access, CollectiveOp, CollectiveThunk, DynamicSliceFusionThunk, ShapedSlice, Slice, Thunk,
    ThunkKind,
};

/// A nested thunk sequence of a thunk, with what it is.
#[derive(Clone, Copy, Debug)]
pub enum Nested<'a> {
    /// Sequential thunks, async-start thunks: run as part of this thunk.
    Sequence(&'a [Thunk]),
    /// While condition (evaluated before each iteration).
    WhileCondition(&'a [Thunk]),
    /// While body.
    WhileBody(&'a [Thunk]),
    /// Conditional branch `n`.
    Branch(usize, &'a [Thunk]),
    /// Dynamic-slice-fusion embedded thunks: their slices refer to the
    /// fusion's synthetic `embedded_allocations`, not the plan's allocations.
    Embedded(&'a [Thunk]),
}

impl<'a> Nested<'a> {
    pub fn thunks(&self) -> &'a [Thunk] {
        match *self {
            Nested::Sequence(t)
            | Nested::WhileCondition(t)
            | Nested::WhileBody(t)
            | Nested::Branch(_, t)
            | Nested::Embedded(t) => t,
        }
    }
}

impl ThunkKind {
    /// The `ThunkProto` oneof field name without `_thunk` (`custom_kernel`,
    /// `device_to_device_copy`, `memset32bit_value`, ...). For `Unsupported`
    /// the kind name it carries.
    pub fn name(&self) -> &str {
        match self {
            ThunkKind::CustomKernel(_) => "custom_kernel",
            ThunkKind::Kernel(_) => "kernel",
            ThunkKind::CublasLtMatmul(_) => "cublas_lt_matmul",
            ThunkKind::Gemm(_) => "gemm",
            ThunkKind::TriangularSolve(_) => "triangular_solve",
            ThunkKind::Convolution(_) => "convolution",
            ThunkKind::Fft(_) => "fft",
            ThunkKind::DeviceToDeviceCopy(_) => "device_to_device_copy",
            ThunkKind::Copy(_) => "copy",
            ThunkKind::DeviceToHostCopy(_) => "device_to_host_copy",
            ThunkKind::HostToDeviceCopy(_) => "host_to_device_copy",
            ThunkKind::Memzero { .. } => "memzero",
            ThunkKind::SelectK(_) => "select_k",
            ThunkKind::Memset32 { .. } => "memset32bit_value",
            ThunkKind::While(_) => "while",
            ThunkKind::Conditional(_) => "conditional",
            ThunkKind::Sequential { .. } => "sequential",
            ThunkKind::DynamicSliceFusion(_) => "dynamic_slice_fusion",
            ThunkKind::AsyncStart(_) => "async_start",
            ThunkKind::AsyncDone { .. } => "async_done",
            ThunkKind::CustomCall(_) => "custom_call",
            ThunkKind::HostExecuteStart(_) => "host_execute_start",
            ThunkKind::HostExecuteDone { .. } => "host_execute_done",
            ThunkKind::Collective(c) if c.from_collective_kernel => "collective_kernel",
            ThunkKind::Collective(c) => c.op.name(),
            ThunkKind::ReplicaId { .. } => "replica_id",
            ThunkKind::PartitionId { .. } => "partition_id",
            ThunkKind::Unsupported { kind_name, .. } => kind_name,
        }
    }
}

impl Thunk {
    /// Shorthand for `self.kind.name()`.
    pub fn kind_name(&self) -> &str {
        self.kind.name()
    }

    /// The thunk sequences nested directly inside this thunk.
    pub fn nested(&self) -> Vec<Nested<'_>> {
        match &self.kind {
            ThunkKind::While(w) => vec![
                Nested::WhileCondition(&w.condition),
                Nested::WhileBody(&w.body),
            ],
            ThunkKind::Conditional(c) => c
                .branches
                .iter()
                .enumerate()
                .map(|(i, b)| Nested::Branch(i, b))
                .collect(),
            ThunkKind::Sequential { thunks } => vec![Nested::Sequence(thunks)],
            ThunkKind::AsyncStart(a) => vec![Nested::Sequence(&a.thunks)],
            ThunkKind::DynamicSliceFusion(d) => vec![Nested::Embedded(&d.embedded)],
            _ => Vec::new(),
        }
    }

    /// Calls `f(thunk, depth)` for this thunk (depth `depth`) and then,
    /// depth first in order, for every nested thunk (including
    /// dynamic-slice-fusion embedded thunks).
    pub fn walk<'a>(&'a self, depth: usize, f: &mut dyn FnMut(&'a Thunk, usize)) {
        f(self, depth);
        for n in self.nested() {
            for t in n.thunks() {
                t.walk(depth + 1, f);
            }
        }
    }

    /// The slices this thunk itself accesses (not its nested sequences),
    /// with how. For a dynamic-slice fusion: reads of its parameter buffers
    /// and writes of its result buffers (the real slices; as in XLA's
    /// `buffer_uses`). For a while loop: the condition result (written by
    /// the condition, read by the host).
    pub fn own_uses(&self) -> Vec<(Slice, Access)> {
        let mut out = Vec::new();
        let shaped = |out: &mut Vec<(Slice, Access)>, s: &Option<ShapedSlice>, a: Access| {
            if let Some(s) = s {
                out.push((s.slice, a));
            }
        };
        match &self.kind {
            ThunkKind::CustomKernel(k) => {
                for (i, a) in k.args.iter().enumerate() {
                    let zeroed = k.zeroed_output_buffer_indices.contains(&(i as u64));
                    out.push((a.slice, arg_access(a.written, zeroed)));
                }
            }
            ThunkKind::Kernel(k) => {
                for (i, a) in k.args.iter().enumerate() {
                    let zeroed = k.zeroed_output_buffer_indices.contains(&(i as u64));
                    out.push((a.slice, arg_access(a.written, zeroed)));
                }
            }
            ThunkKind::CublasLtMatmul(m) => {
                out.push((m.a.slice, Access::Read));
                out.push((m.b.slice, Access::Read));
                let beta_zero = m.gemm_config.as_ref().is_some_and(|g| g.beta == 0.0);
                if m.c.slice != m.d.slice && !beta_zero {
                    out.push((m.c.slice, Access::Read));
                }
                // d is read too when it is also c and beta != 0.
                let d_access = if m.c.slice == m.d.slice && !beta_zero {
                    Access::Write
                } else {
                    Access::Overwrite
                };
                out.push((m.d.slice, d_access));
                for s in [
                    &m.bias,
                    &m.a_scale,
                    &m.b_scale,
                    &m.c_scale,
                    &m.d_scale,
                    &m.group_sizes,
                ] {
                    shaped(&mut out, s, Access::Read);
                }
                shaped(&mut out, &m.aux, Access::Overwrite);
                shaped(&mut out, &m.d_amax, Access::Write);
                shaped(&mut out, &m.workspace, Access::Overwrite);
            }
            ThunkKind::Gemm(g) => {
                out.push((g.lhs, Access::Read));
                out.push((g.rhs, Access::Read));
                let access = if g.config.beta == 0.0 {
                    Access::Overwrite
                } else {
                    Access::Write
                };
                out.push((g.output, access));
                if let Some(w) = g.workspace {
                    out.push((w, Access::Overwrite));
                }
            }
            ThunkKind::SelectK(s) => {
                out.push((s.input, Access::Read));
                // The kernel writes [batch, k] of each; a larger slice keeps its tail.
                let rows = u64::from(s.batch) * u64::from(s.k);
                let elem = s.element_type.bit_width().map_or(0, |b| u64::from(b) / 8);
                for (slice, bytes) in [
                    (s.values, rows.saturating_mul(elem)),
                    (s.indices, rows.saturating_mul(4)),
                ] {
                    let access = if slice.size == bytes {
                        Access::Overwrite
                    } else {
                        Access::Write
                    };
                    out.push((slice, access));
                }
            }
            ThunkKind::Convolution(c) => {
                for o in &c.operands {
                    out.push((o.slice, Access::Read));
                }
                for r in &c.results {
                    out.push((r.slice, Access::Overwrite));
                }
                out.push((c.scratch, Access::Overwrite));
            }
            ThunkKind::Fft(f) => {
                out.push((f.input, Access::Read));
                out.push((f.output, Access::Overwrite));
            }
            ThunkKind::TriangularSolve(t) => {
                out.push((t.a.slice, Access::Read));
                out.push((t.b.slice, Access::Write));
                out.push((t.temp.slice, Access::Overwrite));
            }
            ThunkKind::DeviceToDeviceCopy(c)
            | ThunkKind::Copy(c)
            | ThunkKind::DeviceToHostCopy(c)
            | ThunkKind::HostToDeviceCopy(c) => {
                out.push((c.source.slice, Access::Read));
                out.push((c.destination.slice, Access::Overwrite));
            }
            ThunkKind::Memzero { dest } => out.push((dest.slice, Access::Overwrite)),
            ThunkKind::Memset32 { dest, .. } => out.push((*dest, Access::Overwrite)),
            ThunkKind::While(w) => out.push((w.condition_result, Access::Write)),
            ThunkKind::Conditional(c) => out.push((c.branch_index.slice, Access::Read)),
            ThunkKind::DynamicSliceFusion(d) => {
                out.extend(dsf_uses(d).into_iter().map(|(s, a, _)| (s, a)))
            }
            ThunkKind::CustomCall(c) => {
                for s in &c.operands {
                    shaped(&mut out, s, Access::Read);
                }
                for s in &c.results {
                    shaped(&mut out, s, Access::Write);
                }
            }
            ThunkKind::HostExecuteStart(h) => {
                out.extend(h.args.iter().map(|s| (s.slice, Access::Read)));
                out.extend(h.results.iter().map(|s| (s.slice, Access::Overwrite)));
            }
            ThunkKind::Collective(c) => collective_uses(c, &mut out),
            ThunkKind::ReplicaId { dest } | ThunkKind::PartitionId { dest } => {
                out.push((*dest, Access::Overwrite))
            }
            ThunkKind::Sequential { .. }
            | ThunkKind::AsyncStart(_)
            | ThunkKind::AsyncDone { .. }
            | ThunkKind::HostExecuteDone { .. }
            | ThunkKind::Unsupported { .. } => {}
        }
        out
    }

    /// [`Thunk::own_uses`] with the bytes one run of the thunk touches in
    /// each slice: the slice's size, except for a dynamic-slice fusion,
    /// which reads (or updates) one window of each of its buffers, the size
    /// of the synthetic allocation its embedded thunks address (a scan over
    /// layers copies one layer's weights out of the stacked buffer per
    /// iteration, not the whole buffer).
    pub fn own_uses_touched(&self) -> Vec<(Slice, Access, u64)> {
        match &self.kind {
            ThunkKind::DynamicSliceFusion(d) => dsf_uses(d),
            _ => self
                .own_uses()
                .into_iter()
                .map(|(s, a)| (s, a, s.size))
                .collect(),
        }
    }

    /// All slices of the plan's allocations this thunk accesses, including
    /// nested sequences (while condition and body, branches, async and
    /// sequential thunks). Dynamic-slice-fusion embedded thunks are not
    /// descended into (their slices index synthetic allocations); the
    /// fusion's own uses cover them.
    pub fn uses(&self) -> Vec<(Slice, Access)> {
        let mut out = self.own_uses();
        for n in self.nested() {
            if matches!(n, Nested::Embedded(_)) {
                continue;
            }
            for t in n.thunks() {
                out.extend(t.uses());
            }
        }
        out
    }

    /// Slices read (`Access::reads`), recursively; see [`Thunk::uses`].
    pub fn reads(&self) -> Vec<Slice> {
        self.uses()
            .into_iter()
            .filter(|(_, a)| a.reads())
            .map(|(s, _)| s)
            .collect()
    }

    /// Slices written (`Access::writes`), recursively; see [`Thunk::uses`].
    pub fn writes(&self) -> Vec<Slice> {
        self.uses()
            .into_iter()
            .filter(|(_, a)| a.writes())
            .map(|(s, _)| s)
            .collect()
    }
}

/// Kernel argument access: `written` args may be read too, unless XLA zeroes
/// them before the launch (then prior contents are irrelevant).
fn arg_access(written: bool, zeroed: bool) -> Access {
    match (written, zeroed) {
        (false, _) => Access::Read,
        (true, true) => Access::Overwrite,
        (true, false) => Access::Write,
    }
}

/// Collective uses: every source is read; every destination written, and
/// treated as read too (`Write`) when it overlaps a source (in place) or
/// when the op may leave parts of it unchanged (collective permute: a
/// device that is no pair's target). The dynamic-root buffer of a
/// collective broadcast is only read.
fn collective_uses(c: &CollectiveThunk, out: &mut Vec<(Slice, Access)>) {
    let n = c.buffers.len();
    let root =
        (c.op == CollectiveOp::CollectiveBroadcast && c.has_dynamic_root && n > 0).then(|| n - 1);
    for b in &c.buffers {
        out.push((b.source.slice, Access::Read));
    }
    for (i, b) in c.buffers.iter().enumerate() {
        if Some(i) == root {
            continue;
        }
        let d = b.destination.slice;
        let in_place = c.buffers.iter().any(|s| s.source.slice.overlaps(&d));
        let access = if in_place || c.op == CollectiveOp::CollectivePermute {
            Access::Write
        } else {
            Access::Overwrite
        };
        out.push((d, access));
    }
}

/// A dynamic-slice fusion's real slices: reads of its (sliced) parameter
/// buffers, writes of its result buffers, each with the bytes of its window
/// (the synthetic allocation of the same position: parameters first, then
/// results), at most the slice's size.
fn dsf_uses(d: &DynamicSliceFusionThunk) -> Vec<(Slice, Access, u64)> {
    let window = |i: usize, s: &Slice| {
        d.embedded_allocations
            .get(i)
            .map_or(s.size, |a| a.size.min(s.size))
    };
    let params = d.parameters.iter().enumerate().filter_map(|(i, p)| {
        let s = usize::try_from(p.parameter_number)
            .ok()
            .and_then(|n| d.parameter_buffers.get(n))?;
        Some((*s, Access::Read, window(i, s)))
    });
    let results = d.results.iter().enumerate().filter_map(|(j, r)| {
        let s = usize::try_from(r.result_number)
            .ok()
            .and_then(|n| d.result_buffers.get(n))?;
        Some((*s, Access::Write, window(d.parameters.len() + j, s)))
    });
    params.chain(results).collect()
}

//! Host-offloaded compute: XLA's `HostExecuteStartThunk` /
//! `HostExecuteDoneThunk` (`compute_on("device_host")` in JAX), on this
//! runtime.
//!
//! XLA's GPU compiler extracts the host computation into its own HLO module
//! and compiles it for the CPU; its thunk copies each device-resident
//! operand leaf into pinned host memory, runs the CPU program once the
//! copies are done, copies the device-resident results back, and the done
//! thunk makes later work wait for that. Host-space operands and results
//! (`pinned_host`) it passes to the CPU program directly.
//!
//! Here the program comes from whoever embeds the runtime
//! ([`crate::CustomCallRegistry::bind_host_program`]: the plugin compiles
//! the module with JAX's CPU client), and the start runs synchronously on
//! the thunk's stream: every operand leaf into one pinned staging buffer
//! (host-space ones too: one copy, the same bytes), wait, run the program
//! over the staged bytes, every result leaf back to its slice, wait. The
//! done thunk has nothing left to wait for. Like XLA's, neither thunk can
//! be recorded into a graph: a program holding them runs eager. Staging
//! buffers are kept by the program between runs ([`StagingPool`]; XLA
//! keeps a pinned-memory allocator for the same), so a step pays no
//! pinned allocation once warm.
//!
//! The bytes are XLA's dense row-major layout (XLA's host thunk assumes the
//! same: tiles are cleared from the host computation's shapes); sub-byte
//! types stay packed as the device holds them. Loading refuses any other
//! layout.

use std::sync::{Arc, Mutex};

use xla_vmm::{ElementType, Plan, Shape, ShapedSlice, Slice};
use xla_vmm_device::Backend;

use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;

/// One array a host program reads, in XLA's dense row-major layout.
#[derive(Clone, Copy, Debug)]
pub struct HostArray<'a> {
    pub dtype: ElementType,
    pub dims: &'a [i64],
    pub bytes: &'a [u8],
}

/// One array a host program writes (every byte of it).
#[derive(Debug)]
pub struct HostArrayMut<'a> {
    pub dtype: ElementType,
    pub dims: &'a [i64],
    pub bytes: &'a mut [u8],
}

/// A host computation, compiled for the CPU by whoever embeds the runtime.
pub trait HostProgram: Send + Sync + std::fmt::Debug {
    /// Run once: read `args`, write every result; the error message on
    /// failure.
    fn run(
        &self,
        args: &[HostArray<'_>],
        results: &mut [HostArrayMut<'_>],
    ) -> std::result::Result<(), String>;
}

/// One leaf of a host computation's operands or results, as loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLeaf {
    pub slice: Slice,
    pub dtype: ElementType,
    pub dims: Vec<i64>,
    /// Offset in the staging buffer.
    pub offset: usize,
}

/// A loaded host-execute start.
#[derive(Debug)]
pub struct HostExecuteOp {
    pub name: String,
    pub program: Arc<dyn HostProgram>,
    pub args: Vec<HostLeaf>,
    pub results: Vec<HostLeaf>,
    /// Bytes of the staging buffer (every leaf, each 64-byte aligned).
    pub staging_bytes: usize,
}

/// Alignment of each leaf in the staging buffer (what CPU code assumes of
/// its buffers).
const LEAF_ALIGN: usize = 64;

/// The leaves of a start thunk in their staging places: a dense, row-major
/// array each, its slice exactly its bytes.
pub fn leaves(
    args: &[ShapedSlice],
    results: &[ShapedSlice],
) -> Result<(Vec<HostLeaf>, Vec<HostLeaf>, usize)> {
    let mut offset = 0usize;
    let mut place = |v: &[ShapedSlice], what: &str| -> Result<Vec<HostLeaf>> {
        v.iter()
            .enumerate()
            .map(|(i, s)| {
                let shape = s.shape.as_ref().ok_or_else(|| {
                    RuntimeError::invalid(format!("host compute {what} {i} has no shape"))
                })?;
                check_leaf(shape, s.slice, &format!("{what} {i}"))?;
                let leaf = HostLeaf {
                    slice: s.slice,
                    dtype: shape.element_type,
                    dims: shape.dimensions.clone(),
                    offset,
                };
                let size = usize::try_from(s.slice.size)
                    .map_err(|_| RuntimeError::invalid("host compute leaf size"))?;
                offset = offset
                    .checked_add(size.div_ceil(LEAF_ALIGN) * LEAF_ALIGN)
                    .ok_or_else(|| RuntimeError::invalid("host compute staging size overflows"))?;
                Ok(leaf)
            })
            .collect()
    };
    let a = place(args, "operand")?;
    let r = place(results, "result")?;
    Ok((a, r, offset))
}

/// An array leaf this runtime stages: a known element type, static
/// dimensions, the default (row-major) layout, and a slice of exactly its
/// dense size.
fn check_leaf(shape: &Shape, slice: Slice, what: &str) -> Result<()> {
    let kind = shape.element_type;
    if shape.is_tuple() || kind.bit_width().is_none() {
        return Err(RuntimeError::unsupported(format!(
            "host compute {what} of element type {} (arrays only)",
            kind.name().unwrap_or("unknown")
        )));
    }
    if shape.is_dynamic_dimension.iter().any(|&d| d) {
        return Err(RuntimeError::unsupported(format!(
            "host compute {what} has a dynamic dimension"
        )));
    }
    let rank = shape.dimensions.len() as i64;
    if let Some(m2m) = &shape.minor_to_major {
        if !m2m.is_empty() && !m2m.iter().copied().eq((0..rank).rev()) {
            return Err(RuntimeError::unsupported(format!(
                "host compute {what} in layout {m2m:?} (only the row-major layout is staged)"
            )));
        }
    }
    let bytes = shape
        .byte_size()
        .ok_or_else(|| RuntimeError::invalid(format!("host compute {what}: shape size")))?;
    if bytes != slice.size {
        return Err(RuntimeError::invalid(format!(
            "host compute {what}: its slice is {} bytes, its shape {bytes}",
            slice.size
        )));
    }
    Ok(())
}

/// Pinned staging buffers, reused from run to run (a program's, freed
/// with it).
pub struct StagingPool<B: Backend>(Mutex<Vec<B::HostBuffer>>);

impl<B: Backend> Default for StagingPool<B> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

impl<B: Backend> StagingPool<B> {
    /// A buffer of at least `bytes`: the smallest kept one that is large
    /// enough, else a new one.
    fn take(&self, be: &B, bytes: usize) -> Result<B::HostBuffer> {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let fit = pool
            .iter()
            .enumerate()
            .filter(|(_, b)| be.host_bytes(b).len() >= bytes)
            .min_by_key(|(_, b)| be.host_bytes(b).len())
            .map(|(i, _)| i);
        match fit {
            Some(i) => Ok(pool.swap_remove(i)),
            None => Ok(be.host_alloc(bytes)?),
        }
    }

    fn give_back(&self, buf: B::HostBuffer) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
    }

    /// Every kept buffer, for the owner to free.
    pub(crate) fn drain(&self) -> Vec<B::HostBuffer> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The start thunk, synchronously (see the module docs).
pub(crate) fn run<B: Backend>(
    be: &B,
    pool: &StagingPool<B>,
    h: &HostExecuteOp,
    slots: &SlotTable,
    stream: &B::Stream,
) -> Result<()> {
    let mut staging = pool.take(be, h.staging_bytes.max(1))?;
    let r = (|| -> Result<()> {
        for a in &h.args {
            let src = slots.resolve(&a.slice)?;
            be.copy_d2h(&staging, a.offset, src, a.slice.size as usize, stream)?;
        }
        be.stream_synchronize(stream)?;
        run_program(h, be.host_bytes_mut(&mut staging))?;
        for r in &h.results {
            let dst = slots.resolve(&r.slice)?;
            be.copy_h2d(dst, &staging, r.offset, r.slice.size as usize, stream)?;
        }
        // The staging buffer is reused: the copies must be done.
        be.stream_synchronize(stream)?;
        Ok(())
    })();
    match r {
        Ok(()) => {
            pool.give_back(staging);
            Ok(())
        }
        // Copies may still be in flight after a failure: wait before
        // freeing (a failed wait leaves the buffer allocated, not reused).
        Err(e) => {
            if be.stream_synchronize(stream).is_ok() {
                if let Err(f) = be.host_free(staging) {
                    tracing::warn!(error = %f, "freeing host compute staging memory");
                }
            } else {
                std::mem::forget(staging);
            }
            Err(e)
        }
    }
}

/// Run the program over the staged leaves (`staging`: operands, then
/// results, at their offsets).
fn run_program(h: &HostExecuteOp, staging: &mut [u8]) -> Result<()> {
    let split = h.results.first().map_or(staging.len(), |r| r.offset);
    let (ins, mut outs) = staging.split_at_mut(split);
    let args: Vec<HostArray<'_>> = h
        .args
        .iter()
        .map(|a| HostArray {
            dtype: a.dtype,
            dims: &a.dims,
            bytes: &ins[a.offset..a.offset + a.slice.size as usize],
        })
        .collect();
    let mut results = Vec::with_capacity(h.results.len());
    let mut at = split;
    for r in &h.results {
        let (_, rest) = std::mem::take(&mut outs).split_at_mut(r.offset - at);
        let (mine, rest) = rest.split_at_mut(r.slice.size as usize);
        results.push(HostArrayMut {
            dtype: r.dtype,
            dims: &r.dims,
            bytes: mine,
        });
        outs = rest;
        at = r.offset + r.slice.size as usize;
    }
    tracing::trace!(name = %h.name, args = args.len(), results = results.len(), "host compute");
    h.program
        .run(&args, &mut results)
        .map_err(|e| RuntimeError::Handler(format!("host compute '{}': {e}", h.name)))
}

/// Is every host-execute start of `plan` paired with a done (and the other
/// way round)? Part of [`crate::ops::check_support`].
pub(crate) fn check_pairs(plan: &Plan) -> Result<()> {
    use xla_vmm::ThunkKind;
    let (mut starts, mut dones) = (Vec::new(), Vec::new());
    plan.walk(&mut |t, _| match &t.kind {
        ThunkKind::HostExecuteStart(h) => starts.push(h.async_events_unique_id),
        ThunkKind::HostExecuteDone {
            async_events_unique_id,
        } => dones.push(*async_events_unique_id),
        _ => {}
    });
    starts.sort_unstable();
    dones.sort_unstable();
    if starts != dones {
        return Err(RuntimeError::invalid(format!(
            "host execute starts {starts:?} and dones {dones:?} do not pair up"
        )));
    }
    Ok(())
}

/// Load host-offloaded compute: its leaves, then its program (`bind`).
pub(crate) fn build(
    t: &xla_vmm::Thunk,
    h: &xla_vmm::HostExecuteStartThunk,
    bind: impl FnOnce() -> Result<Arc<dyn HostProgram>>,
) -> Result<HostExecuteOp> {
    let (args, results, staging_bytes) = leaves(&h.args, &h.results)?;
    Ok(HostExecuteOp {
        name: t.info.profile_annotation.clone(),
        program: bind()?,
        args,
        results,
        staging_bytes,
    })
}

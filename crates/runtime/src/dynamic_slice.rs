//! Dynamic-slice-fusion windows (XLA's `DynamicSliceFusionV2Thunk`).
//!
//! Each embedded allocation is a window into a real buffer. With a
//! `DynamicSliceConfig` its byte offset is
//! `byte_offset + loop_iteration[loop_index] * byte_stride` (loop index 0 =
//! innermost enclosing while loop), clamped to `[0, buffer - window]`;
//! without one the window is the whole buffer. The offset expressions are
//! only XLA's optional verification aid and do not change the result.

use xla_vmm::{DynamicSliceConfig, DynamicSliceFusionThunk, Slice};

use crate::error::{Result, RuntimeError};
use crate::slots::SlotTable;

fn cfg(c: &Option<DynamicSliceConfig>) -> Option<(Option<i64>, i64, i64)> {
    c.as_ref()
        .map(|c| (c.loop_index, c.byte_offset, c.byte_stride))
}

/// A dynamic-slice-fusion window into a real buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The real buffer.
    pub buffer: Slice,
    /// Window size (the embedded allocation's size).
    pub size: u64,
    /// `(loop_index, byte_offset, byte_stride)`; `None` = whole buffer.
    pub config: Option<(Option<i64>, i64, i64)>,
}

/// The windows of a fusion, in embedded-allocation order (parameters, then
/// results).
pub fn windows(d: &DynamicSliceFusionThunk) -> Result<Vec<Window>> {
    let n = d.parameters.len() + d.results.len();
    if d.embedded_allocations.len() < n {
        return Err(RuntimeError::invalid(format!(
            "{} embedded allocations for {n} parameters + results",
            d.embedded_allocations.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    for (i, p) in d.parameters.iter().enumerate() {
        let buffer = *d
            .parameter_buffers
            .get(p.parameter_number as usize)
            .ok_or_else(|| {
                RuntimeError::invalid(format!(
                    "fusion parameter {} has no buffer",
                    p.parameter_number
                ))
            })?;
        out.push(Window {
            buffer,
            size: d.embedded_allocations[i].size,
            config: cfg(&p.slice_config),
        });
    }
    for (j, r) in d.results.iter().enumerate() {
        let buffer = *d
            .result_buffers
            .get(r.result_number as usize)
            .ok_or_else(|| {
                RuntimeError::invalid(format!("fusion result {} has no buffer", r.result_number))
            })?;
        out.push(Window {
            buffer,
            size: d.embedded_allocations[d.parameters.len() + j].size,
            config: cfg(&r.update_config),
        });
    }
    Ok(out)
}

/// Byte offset of a window for the current loop nest (`loop_nest` holds
/// the iteration of each enclosing while loop, outermost first).
pub fn window_offset(
    config: (Option<i64>, i64, i64),
    loop_nest: &[i64],
    buffer_size: u64,
    window: u64,
) -> u64 {
    let (loop_index, byte_offset, byte_stride) = config;
    let iteration = match loop_index {
        Some(k) if k >= 0 && (k as usize) < loop_nest.len() => {
            loop_nest[loop_nest.len() - 1 - k as usize]
        }
        _ => 0,
    };
    let offset = byte_offset.saturating_add(iteration.saturating_mul(byte_stride));
    let max = buffer_size.saturating_sub(window) as i64;
    offset.clamp(0, max.max(0)) as u64
}

/// The embedded slot table of a fusion for this iteration.
pub fn embedded_table(
    windows: &[Window],
    outer: &SlotTable,
    loop_nest: &[i64],
) -> Result<SlotTable> {
    let mut t = SlotTable::new(windows.len());
    for (i, w) in windows.iter().enumerate() {
        let base = outer.resolve(&w.buffer)?;
        let (ptr, size) = match w.config {
            Some(c) => {
                let off = window_offset(c, loop_nest, w.buffer.size, w.size);
                (base.offset(off), w.size.min(w.buffer.size))
            }
            None => (base, w.buffer.size),
        };
        t.bind(i, ptr, size)?;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_loop_nest_and_clamp() {
        // innermost loop at iteration 2, outer at 5.
        let nest = [5, 2];
        assert_eq!(
            window_offset((Some(0), 16, 64), &nest, 1024, 64),
            16 + 2 * 64
        );
        assert_eq!(window_offset((Some(1), 0, 64), &nest, 1024, 64), 5 * 64);
        assert_eq!(window_offset((None, 32, 64), &nest, 1024, 64), 32);
        // Out of range clamps to the last full window, negative to 0.
        assert_eq!(window_offset((Some(0), 0, 1000), &nest, 1024, 64), 960);
        assert_eq!(window_offset((Some(0), 0, -100), &nest, 1024, 64), 0);
        // Loop index deeper than the nest: iteration 0.
        assert_eq!(window_offset((Some(4), 8, 64), &nest, 1024, 64), 8);
    }
}

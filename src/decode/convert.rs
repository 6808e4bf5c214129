//! Proto → plan conversion of everything but thunks, with validation.

use prost::Message;

use super::DecodeError;
use crate::plan::{AllocationRole, Blob, BufferAllocation, ElementType, Shape, ShapedSlice, Slice};
use crate::proto::xla;
use crate::proto::xla::buffer_assignment::BufferAllocationSliceProto;

pub(crate) fn invalid(msg: impl Into<String>) -> DecodeError {
    DecodeError::Invalid(msg.into())
}

/// A non-negative proto int64 as u64.
pub(crate) fn non_negative(v: i64, what: &dyn Fn() -> String) -> Result<u64, DecodeError> {
    u64::try_from(v).map_err(|_| invalid(format!("{}: negative value {v}", what())))
}

/// Maximum nesting of shapes (tuples of tuples); deeper input is rejected.
const MAX_SHAPE_DEPTH: usize = 64;

pub(crate) fn shape(p: &xla::ShapeProto) -> Result<Shape, DecodeError> {
    shape_at(p, 0)
}

fn shape_at(p: &xla::ShapeProto, depth: usize) -> Result<Shape, DecodeError> {
    if depth > MAX_SHAPE_DEPTH {
        return Err(invalid("shape nested too deeply"));
    }
    Ok(Shape {
        element_type: ElementType(p.element_type),
        dimensions: p.dimensions.clone(),
        is_dynamic_dimension: p.is_dynamic_dimension.clone(),
        tuple_shapes: p
            .tuple_shapes
            .iter()
            .map(|t| shape_at(t, depth + 1))
            .collect::<Result<_, _>>()?,
        minor_to_major: p.layout.as_ref().map(|l| l.minor_to_major.clone()),
        memory_space: p.layout.as_ref().map_or(0, |l| l.memory_space),
    })
}

pub(crate) fn opt_shape(p: &Option<xla::ShapeProto>) -> Result<Option<Shape>, DecodeError> {
    p.as_ref().map(shape).transpose()
}

/// Sizes of the allocations slices may refer to, for bounds checks.
#[derive(Clone, Copy)]
pub(crate) struct Allocs<'a> {
    pub sizes: &'a [u64],
    /// "allocation" or "embedded allocation" (for messages).
    pub what: &'static str,
}

impl Allocs<'_> {
    /// Converts and bounds-checks a slice; `ctx` names its place for errors.
    pub(crate) fn slice(
        &self,
        p: &BufferAllocationSliceProto,
        ctx: &dyn Fn() -> String,
    ) -> Result<Slice, DecodeError> {
        let index = usize::try_from(p.buffer_allocation_index)
            .ok()
            .filter(|&i| i < self.sizes.len())
            .ok_or_else(|| {
                invalid(format!(
                    "{}: slice refers to {} {} of {}",
                    ctx(),
                    self.what,
                    p.buffer_allocation_index,
                    self.sizes.len()
                ))
            })?;
        let offset = non_negative(p.offset, &|| format!("{}: slice offset", ctx()))?;
        let size = non_negative(p.size, &|| format!("{}: slice size", ctx()))?;
        let alloc_size = self.sizes[index];
        if offset.checked_add(size).is_none_or(|end| end > alloc_size) {
            return Err(invalid(format!(
                "{}: slice [offset {offset}, size {size}] out of bounds of {} {index} ({alloc_size} bytes)",
                ctx(),
                self.what
            )));
        }
        Ok(Slice {
            allocation: index,
            offset,
            size,
        })
    }

    pub(crate) fn req_slice(
        &self,
        p: &Option<BufferAllocationSliceProto>,
        ctx: &dyn Fn() -> String,
    ) -> Result<Slice, DecodeError> {
        match p {
            Some(p) => self.slice(p, ctx),
            None => Err(invalid(format!("{}: missing slice", ctx()))),
        }
    }

    pub(crate) fn shaped(
        &self,
        p: &xla::ShapedSliceProto,
        ctx: &dyn Fn() -> String,
    ) -> Result<ShapedSlice, DecodeError> {
        Ok(ShapedSlice {
            slice: self.req_slice(&p.slice, ctx)?,
            shape: opt_shape(&p.shape)?,
        })
    }

    pub(crate) fn req_shaped(
        &self,
        p: &Option<xla::ShapedSliceProto>,
        ctx: &dyn Fn() -> String,
    ) -> Result<ShapedSlice, DecodeError> {
        match p {
            Some(p) => self.shaped(p, ctx),
            None => Err(invalid(format!("{}: missing shaped slice", ctx()))),
        }
    }

    pub(crate) fn opt_shaped(
        &self,
        p: &Option<xla::ShapedSliceProto>,
        ctx: &dyn Fn() -> String,
    ) -> Result<Option<ShapedSlice>, DecodeError> {
        p.as_ref().map(|p| self.shaped(p, ctx)).transpose()
    }
}

/// Converts allocation protos; `role_of` may refine roles (constants and
/// outputs need the executable's constant and output tables).
pub(crate) fn allocations(
    protos: &[xla::BufferAllocationProto],
    what: &str,
) -> Result<Vec<BufferAllocation>, DecodeError> {
    protos
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if usize::try_from(p.index).ok() != Some(i) {
                return Err(invalid(format!(
                    "{what} {i} has index {} (allocations must be listed in index order)",
                    p.index
                )));
            }
            let size = non_negative(p.size, &|| format!("{what} {i} size"))?;
            let role = if p.is_entry_computation_parameter {
                AllocationRole::Parameter {
                    number: non_negative(p.parameter_number, &|| {
                        format!("{what} {i} parameter_number")
                    })?,
                    shape_index: p.parameter_shape_index.clone(),
                    aliased_with_output: p.is_parameter_aliased_with_output,
                }
            } else if p.is_constant {
                AllocationRole::Constant {
                    symbol_name: String::new(),
                    bytes: Blob::default(),
                }
            } else if p.maybe_live_out {
                AllocationRole::Output {
                    outputs: Vec::new(),
                }
            } else {
                AllocationRole::Temp
            };
            Ok(BufferAllocation {
                index: i,
                size,
                role,
                maybe_live_out: p.maybe_live_out,
                is_tuple: p.is_tuple,
                is_thread_local: p.is_thread_local,
                color: p.color,
            })
        })
        .collect()
}

pub(crate) fn alloc_index(
    v: i64,
    n: usize,
    what: &dyn Fn() -> String,
) -> Result<usize, DecodeError> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| invalid(format!("{}: allocation index {v} of {n}", what())))
}

fn proto_err(what: &str, path: &str) -> impl FnOnce(prost::DecodeError) -> DecodeError {
    let what = format!("{what} at {path}");
    move |source| DecodeError::Proto { what, source }
}

pub(crate) fn decode_msg<M: Message + Default>(
    bytes: &[u8],
    what: &str,
    path: &str,
) -> Result<M, DecodeError> {
    let m = M::decode(bytes).map_err(proto_err(what, path))?;
    if tracing::enabled!(tracing::Level::TRACE) && m.encoded_len() != bytes.len() {
        tracing::trace!(
            what,
            path,
            "message has fields our schema subset does not read"
        );
    }
    Ok(m)
}

//! Each tensor's type and shape at a given latent size, inferred operator by operator, with the
//! values of the small integer tensors that compute shapes: what [`super::split`] sizes a piece by.

use super::nodes::small_values;
use super::proto::{read_tensor, Node};
use crate::onnx::fields::*;

/// Integer tensors of at most this many elements have their values followed (shape arithmetic).
const MAX_KNOWN: u64 = 64;

/// A tensor's type and shape at the size asked for.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Info {
    /// ONNX `DataType`.
    pub(super) elem: u64,
    pub(super) dims: Vec<u64>,
    /// The values of a small tensor of shape arithmetic or a constant (integers are exact in f64).
    pub(super) known: Option<Vec<f64>>,
}

impl Info {
    pub(super) fn new(elem: u64, dims: Vec<u64>) -> Info {
        Info { elem, dims, known: None }
    }

    pub(super) fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub(super) fn bytes(&self) -> u64 {
        self.elements() * elem_size(self.elem).unwrap_or(0)
    }

    /// `known` kept only while the tensor is small.
    pub(super) fn with_known(mut self, known: Option<Vec<f64>>) -> Info {
        self.known = known.filter(|v| v.len() as u64 == self.elements() && self.elements() <= MAX_KNOWN);
        self
    }
}

pub(super) fn elem_size(elem: u64) -> Option<u64> {
    match elem {
        UINT8 | INT8 | BOOL => Some(1),
        FLOAT16 | BFLOAT16 => Some(2),
        FLOAT | INT32 => Some(4),
        INT64 | DOUBLE => Some(8),
        _ => None,
    }
}

pub(super) fn is_float(elem: u64) -> bool {
    matches!(elem, FLOAT | FLOAT16 | BFLOAT16 | DOUBLE)
}

/// Operators whose output has their first input's type and shape (unary elementwise, softmax,
/// normalizations; only the first output of those that have more).
#[rustfmt::skip]
const SAME_SHAPE: &[&str] = &[
    "Identity", "Sigmoid", "Relu", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal",
    "Sin", "Cos", "Gelu", "LeakyRelu", "HardSigmoid", "HardSwish", "Softplus", "Elu", "Clip", "Dropout",
    "Softmax", "LogSoftmax", "InstanceNormalization", "LayerNormalization", "GroupNormalization",
    "BatchNormalization",
];

/// Elementwise operators over broadcast inputs, of their first input's type.
const BROADCAST: &[&str] = &["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"];

/// The type and shape of `node`'s outputs (only the first, for most operators), given its inputs'
/// (`None` for an omitted optional input), or why not.
pub(super) fn output_infos(node: &Node, inputs: &[Option<&Info>]) -> Result<Vec<Info>, String> {
    if !matches!(node.domain, "" | "ai.onnx") {
        return Err(NO_RULE.into());
    }
    let op = node.op_type;
    let rule: Rule = match op {
        _ if SAME_SHAPE.contains(&op) => same_shape,
        _ if BROADCAST.contains(&op) => broadcast_elementwise,
        "Cast" => cast,
        "Conv" | "ConvTranspose" => {
            |at| Ok(Info::new(at.input(0)?.elem, convolution(at.node, at.input(0)?, at.input(1)?)?))
        }
        "MatMul" => |at| Ok(Info::new(at.input(0)?.elem, matmul(&at.input(0)?.dims, &at.input(1)?.dims)?)),
        "Gemm" => gemm,
        "Reshape" => reshape,
        "Transpose" => transpose,
        "Flatten" => flatten,
        "Squeeze" => squeeze,
        "Unsqueeze" => unsqueeze,
        "Expand" => expand,
        "Concat" => concat,
        "Slice" => slice,
        "Gather" => gather,
        "Shape" => shape,
        "Size" => {
            |at| Ok(Info::new(INT64, Vec::new()).with_known(Some(vec![at.input(0)?.elements() as f64])))
        }
        "Constant" => |at| constant(at.node),
        "ConstantOfShape" => constant_of_shape,
        "Resize" | "Upsample" => {
            |at| Ok(Info::new(at.input(0)?.elem, resize(at.node, at.inputs, &at.input(0)?.dims)?))
        }
        _ => return Err(NO_RULE.into()),
    };
    Ok(vec![rule(&Operands { node, inputs })?])
}

const NO_RULE: &str = "the split has no rule for the operator";

/// How one operator's output info follows from its operands.
type Rule = fn(&Operands) -> Result<Info, String>;

/// A node and its inputs' infos, read with the error messages every rule shares.
struct Operands<'n, 'a> {
    node: &'n Node<'a>,
    inputs: &'n [Option<&'n Info>],
}

impl Operands<'_, '_> {
    fn input(&self, i: usize) -> Result<&Info, String> {
        self.inputs.get(i).copied().flatten().ok_or_else(|| format!("its input {i} is missing"))
    }

    fn known(&self, i: usize, what: &str) -> Result<Vec<f64>, String> {
        self.input(i)?.known.clone().ok_or_else(|| {
            format!("its {what} ({:?}) is not a value the split can evaluate", self.node.inputs[i])
        })
    }

    fn ints(&self, i: usize, what: &str) -> Result<Vec<i64>, String> {
        Ok(self.known(i, what)?.into_iter().map(|v| v as i64).collect())
    }

    /// `None` for an omitted input.
    fn optional_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>, String> {
        match self.inputs.get(i).copied().flatten() {
            Some(_) => self.ints(i, what).map(Some),
            None => Ok(None),
        }
    }

    fn attr(&self, name: &str) -> Option<i64> {
        self.node.int_attribute(name).map(|v| v as i64)
    }

    /// Integers from the attribute `name` (older opsets) or else from input `i`.
    fn attribute_or_input(&self, name: &str, i: usize) -> Result<Option<Vec<i64>>, String> {
        match self.node.ints_attribute(name) {
            Some(values) => Ok(Some(values)),
            None => self.optional_ints(i, name),
        }
    }
}

/// Only `Identity` passes its values through.
fn same_shape(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let known = if at.node.op_type == "Identity" { x.known.clone() } else { None };
    Ok(Info::new(x.elem, x.dims.clone()).with_known(known))
}

/// The four arithmetic operators of two inputs are evaluated, for shape arithmetic.
fn broadcast_elementwise(at: &Operands) -> Result<Info, String> {
    let mut dims = at.input(0)?.dims.clone();
    for i in 1..at.inputs.len() {
        dims = broadcast(&dims, &at.input(i)?.dims)?;
    }
    let x = at.input(0)?;
    let op = at.node.op_type;
    let known = match (op, at.inputs) {
        ("Add" | "Sub" | "Mul" | "Div", [Some(a), Some(b)]) => elementwise(op, x.elem, a, b, &dims),
        _ => None,
    };
    Ok(Info::new(x.elem, dims).with_known(known))
}

/// A cast to an integer type truncates the known values.
fn cast(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let to = at.attr("to").ok_or("it has no `to`")? as u64;
    let known =
        x.known.clone().map(|v| if is_float(to) { v } else { v.into_iter().map(f64::trunc).collect() });
    Ok(Info::new(to, x.dims.clone()).with_known(known))
}

fn gemm(at: &Operands) -> Result<Info, String> {
    let (a, b) = (&at.input(0)?.dims, &at.input(1)?.dims);
    if a.len() != 2 || b.len() != 2 {
        return Err("its inputs are not matrices".into());
    }
    let m = if at.attr("transA") == Some(1) { a[1] } else { a[0] };
    let n = if at.attr("transB") == Some(1) { b[0] } else { b[1] };
    Ok(Info::new(at.input(0)?.elem, vec![m, n]))
}

fn reshape(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let dims = reshaped_dims(&x.dims, &at.ints(1, "shape")?, at.attr("allowzero") == Some(1))?;
    Ok(Info::new(x.elem, dims).with_known(x.known.clone()))
}

/// Values are kept only where the order of elements cannot change (rank 1 or less).
fn transpose(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let perm = at.node.ints_attribute("perm").unwrap_or_else(|| (0..x.dims.len() as i64).rev().collect());
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..x.dims.len() as i64).collect::<Vec<_>>() {
        return Err(format!("its perm {perm:?} is not a permutation of {} axes", x.dims.len()));
    }
    let known = if x.dims.len() <= 1 { x.known.clone() } else { None };
    Ok(Info::new(x.elem, perm.iter().map(|&p| x.dims[p as usize]).collect()).with_known(known))
}

fn flatten(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let rank = x.dims.len() as i64;
    let axis = at.attr("axis").unwrap_or(1);
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..=rank).contains(&axis) {
        return Err(format!("its axis is outside {rank} dims"));
    }
    let axis = axis as usize;
    let outer = x.dims[..axis].iter().product();
    Ok(Info::new(x.elem, vec![outer, x.dims[axis..].iter().product()]).with_known(x.known.clone()))
}

/// Without axes, every dim of 1 goes.
fn squeeze(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let dims = match at.attribute_or_input("axes", 1)? {
        None => x.dims.iter().copied().filter(|&d| d != 1).collect(),
        Some(axes) => {
            let axes = axes.iter().map(|&a| axis(a, x.dims.len())).collect::<Result<Vec<_>, _>>()?;
            if axes.iter().any(|&a| x.dims[a] != 1) {
                return Err(format!("it squeezes axes {axes:?} of {:?}, not all 1", x.dims));
            }
            x.dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
        }
    };
    Ok(Info::new(x.elem, dims).with_known(x.known.clone()))
}

fn unsqueeze(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let axes = match at.node.ints_attribute("axes") {
        Some(axes) => axes,
        None => at.ints(1, "axes")?,
    };
    let rank = x.dims.len() + axes.len();
    let mut axes = axes.iter().map(|&a| axis(a, rank)).collect::<Result<Vec<_>, _>>()?;
    axes.sort_unstable();
    let mut dims = x.dims.clone();
    for a in axes {
        if a > dims.len() {
            return Err(format!("it inserts axis {a} into {} dims", dims.len()));
        }
        dims.insert(a, 1);
    }
    Ok(Info::new(x.elem, dims).with_known(x.known.clone()))
}

fn expand(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let shape = non_negative(at.ints(1, "shape")?)?;
    Ok(Info::new(x.elem, broadcast(&x.dims, &shape)?))
}

/// The values of 1-D inputs are concatenated too (shape arithmetic builds shapes so).
fn concat(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let rank = x.dims.len();
    let axis = axis(at.attr("axis").ok_or("it has no `axis`")?, rank)?;
    let mut dims = x.dims.clone();
    dims[axis] = 0;
    let mut known = Some(Vec::new());
    for i in 0..at.inputs.len() {
        let y = at.input(i)?;
        let same_rest = y.dims.len() == rank && (0..rank).all(|k| k == axis || y.dims[k] == x.dims[k]);
        if !same_rest {
            return Err(format!("its inputs {:?} and {:?} do not concatenate", x.dims, y.dims));
        }
        dims[axis] += y.dims[axis];
        known = known.zip(y.known.as_ref()).map(|(mut k, v)| {
            k.extend(v);
            k
        });
    }
    Ok(Info::new(x.elem, dims).with_known(if rank == 1 { known } else { None }))
}

/// The values of a 1-D input are sliced too.
fn slice(at: &Operands) -> Result<Info, String> {
    let x = at.input(0)?;
    let SliceArguments { starts, ends, axes, steps } = slice_arguments(at)?;
    let mut dims = x.dims.clone();
    let mut taken = None;
    for k in 0..starts.len() {
        let a = axis(axes[k], dims.len())?;
        let (first, step, count) = slice_range(x.dims[a] as i64, starts[k], ends[k], steps[k])?;
        dims[a] = count;
        taken = Some((first, step, count));
    }
    let known = match (&x.known, taken) {
        (Some(v), Some((first, step, count))) if x.dims.len() == 1 => {
            (0..count as i64).map(|j| v.get((first + j * step) as usize).copied()).collect()
        }
        _ => None,
    };
    Ok(Info::new(x.elem, dims).with_known(known))
}

/// `Slice`'s arguments, one of each per sliced axis.
struct SliceArguments {
    starts: Vec<i64>,
    ends: Vec<i64>,
    axes: Vec<i64>,
    steps: Vec<i64>,
}

/// From attributes (opset 1) or inputs (opset 10 on), with ONNX's defaults.
fn slice_arguments(at: &Operands) -> Result<SliceArguments, String> {
    let node = at.node;
    let (starts, ends, axes, steps) = match node.ints_attribute("starts") {
        Some(starts) => {
            (starts, node.ints_attribute("ends").unwrap_or_default(), node.ints_attribute("axes"), None)
        }
        None => (
            at.ints(1, "starts")?,
            at.ints(2, "ends")?,
            at.optional_ints(3, "axes")?,
            at.optional_ints(4, "steps")?,
        ),
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("its starts, ends, axes and steps differ in length".into());
    }
    Ok(SliceArguments { starts, ends, axes, steps })
}

/// The values of a 1-D input are gathered too (negative indices count from the end).
fn gather(at: &Operands) -> Result<Info, String> {
    let (x, indices) = (at.input(0)?, at.input(1)?);
    let a = axis(at.attr("axis").unwrap_or(0), x.dims.len())?;
    let dims = [&x.dims[..a], &indices.dims[..], &x.dims[a + 1..]].concat();
    let known = match (&x.known, &indices.known) {
        (Some(values), Some(idx)) if x.dims.len() == 1 => idx
            .iter()
            .map(|&i| {
                let i = if i < 0.0 { i + values.len() as f64 } else { i };
                values.get(i as usize).copied()
            })
            .collect(),
        _ => None,
    };
    Ok(Info::new(x.elem, dims).with_known(known))
}

/// The known values are the input's dims from `start` to `end`.
fn shape(at: &Operands) -> Result<Info, String> {
    let dims = &at.input(0)?.dims;
    let rank = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let (start, end) = (clamp(at.attr("start").unwrap_or(0)), clamp(at.attr("end").unwrap_or(rank)));
    let shape: Vec<f64> = dims[start..end.max(start)].iter().map(|&d| d as f64).collect();
    Ok(Info::new(INT64, vec![shape.len() as u64]).with_known(Some(shape)))
}

/// Of the type of its `value` attribute, float without one.
fn constant_of_shape(at: &Operands) -> Result<Info, String> {
    let shape = non_negative(at.ints(0, "shape")?)?;
    let elem = match tensor_attribute(at.node, "value") {
        Some(t) => read_tensor(t).map_err(|e| e.to_string())?.data_type,
        None => FLOAT,
    };
    Ok(Info::new(elem, shape))
}

/// A shape given as values, which must not be negative.
fn non_negative(shape: Vec<i64>) -> Result<Vec<u64>, String> {
    if shape.iter().any(|&d| d < 0) {
        return Err(format!("its shape {shape:?} has a negative dim"));
    }
    Ok(shape.iter().map(|&d| d as u64).collect())
}

/// `axis` (negative from the end) of `rank` axes.
fn axis(axis: i64, rank: usize) -> Result<usize, String> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if (0..rank as i64).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("its axis {axis} is outside {rank} dims"))
    }
}

/// NumPy broadcasting.
fn broadcast(a: &[u64], b: &[u64]) -> Result<Vec<u64>, String> {
    let rank = a.len().max(b.len());
    let dim = |d: &[u64], k: usize| if k < rank - d.len() { 1 } else { d[k - (rank - d.len())] };
    (0..rank)
        .map(|k| match (dim(a, k), dim(b, k)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            _ => Err(format!("its inputs {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// The values of `a op b` broadcast to `dims`, when both are known; integer division truncates.
fn elementwise(op: &str, elem: u64, a: &Info, b: &Info, dims: &[u64]) -> Option<Vec<f64>> {
    let (x, y) = (a.known.as_ref()?, b.known.as_ref()?);
    let count: u64 = dims.iter().product();
    if count > MAX_KNOWN {
        return None;
    }
    // The flat index into a tensor of `from` dims (broadcast to `dims`) of the flat output index `k`.
    let source = |mut k: u64, from: &[u64]| {
        let (mut index, mut stride) = (0, 1);
        for (back, &d) in dims.iter().rev().enumerate() {
            let coordinate = k % d;
            k /= d;
            if let Some(&f) = from.len().checked_sub(back + 1).map(|i| &from[i]) {
                if f != 1 {
                    index += coordinate * stride;
                }
                stride *= f;
            }
        }
        index as usize
    };
    (0..count)
        .map(|k| {
            let (p, q) = (x[source(k, &a.dims)], y[source(k, &b.dims)]);
            Some(match op {
                "Add" => p + q,
                "Sub" => p - q,
                "Mul" => p * q,
                _ if q == 0.0 && !is_float(elem) => return None,
                _ if is_float(elem) => p / q,
                _ => (p / q).trunc(),
            })
        })
        .collect()
}

fn reshaped_dims(dims: &[u64], shape: &[i64], allowzero: bool) -> Result<Vec<u64>, String> {
    let mut out = Vec::with_capacity(shape.len());
    let mut inferred = None;
    for (i, &s) in shape.iter().enumerate() {
        out.push(match s {
            0 if !allowzero => {
                *dims.get(i).ok_or_else(|| format!("its shape {shape:?} copies a dim {dims:?} lacks"))?
            }
            -1 if inferred.is_none() => {
                inferred = Some(i);
                1
            }
            s if s >= 0 => s as u64,
            _ => return Err(format!("its shape {shape:?} is not valid")),
        });
    }
    let total: u64 = dims.iter().product();
    let rest: u64 = out.iter().product();
    match inferred {
        Some(i) if rest != 0 && total.is_multiple_of(rest) => out[i] = total / rest,
        None if rest == total => {}
        _ => return Err(format!("it cannot reshape {dims:?} to {shape:?}")),
    }
    Ok(out)
}

/// The first index, step and count that `Slice` takes along a dim of `dim` elements (ONNX's clamping
/// rules).
fn slice_range(dim: i64, start: i64, end: i64, step: i64) -> Result<(i64, i64, u64), String> {
    if step == 0 {
        return Err("its step is 0".into());
    }
    let from_end = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let count = if step > 0 {
        let (start, end) = (from_end(start).clamp(0, dim), from_end(end).clamp(0, dim));
        ((end - start).max(0) as u64).div_ceil(step as u64)
    } else {
        let (start, end) = (from_end(start).clamp(0, dim - 1), from_end(end).clamp(-1, dim - 1));
        ((start - end).max(0) as u64).div_ceil(step.unsigned_abs())
    };
    let first = if step > 0 { from_end(start).clamp(0, dim) } else { from_end(start).clamp(0, dim - 1) };
    Ok((first, step, count))
}

fn matmul(a: &[u64], b: &[u64]) -> Result<Vec<u64>, String> {
    if a.is_empty() || b.is_empty() {
        return Err("an input is a scalar".into());
    }
    // 1-D operands are promoted to matrices, and the added dim removed after.
    let a2 = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2 = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(format!("its inputs {a:?} and {b:?} do not multiply"));
    }
    let mut dims = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    if a.len() > 1 {
        dims.push(m);
    }
    if b.len() > 1 {
        dims.push(n);
    }
    Ok(dims)
}

fn convolution(node: &Node, x: &Info, w: &Info) -> Result<Vec<u64>, String> {
    let spatial = x.dims.len().checked_sub(2).filter(|&s| s > 0 && w.dims.len() == s + 2);
    let spatial =
        spatial.ok_or_else(|| format!("its input {:?} and weight {:?} do not match", x.dims, w.dims))?;
    let ints = |name: &str, default: i64, len: usize| {
        node.ints_attribute(name).filter(|v| !v.is_empty()).unwrap_or_else(|| vec![default; len])
    };
    let group = node.int_attribute("group").unwrap_or(1).max(1);
    let kernel = ints("kernel_shape", 0, spatial);
    let kernel: Vec<i64> =
        kernel.iter().zip(&w.dims[2..]).map(|(&k, &wk)| if k > 0 { k } else { wk as i64 }).collect();
    let (strides, dilations, pads) =
        (ints("strides", 1, spatial), ints("dilations", 1, spatial), ints("pads", 0, 2 * spatial));
    let auto_pad = string_attribute(node, "auto_pad").unwrap_or("NOTSET");
    if [strides.len(), dilations.len(), kernel.len()].iter().any(|&l| l != spatial)
        || pads.len() != 2 * spatial
    {
        return Err("its strides, dilations, kernel or pads do not match its input's rank".into());
    }
    if strides.iter().chain(&dilations).any(|&v| v <= 0) {
        return Err(format!("its strides {strides:?} or dilations {dilations:?} are not positive"));
    }
    let transpose = node.op_type == "ConvTranspose";
    let (in_channels, out_channels) =
        if transpose { (w.dims[0], w.dims[1] * group) } else { (w.dims[1] * group, w.dims[0]) };
    if x.dims[1] != in_channels {
        return Err(format!(
            "its input {:?} has not the {in_channels} channels its weight {:?} reads",
            x.dims, w.dims
        ));
    }
    let output_shape = node.ints_attribute("output_shape").filter(|v| v.len() == spatial);
    let output_padding = ints("output_padding", 0, spatial);
    let mut dims = vec![x.dims[0], out_channels];
    for i in 0..spatial {
        let (d, s) = (x.dims[i + 2] as i64, strides[i]);
        let extent = dilations[i] * (kernel[i] - 1) + 1;
        let padded = pads[i] + pads[i + spatial];
        let out = match (transpose, auto_pad) {
            (true, _) if output_shape.is_some() => output_shape.as_ref().map_or(0, |o| o[i]),
            (true, "SAME_UPPER" | "SAME_LOWER") => d * s,
            (true, "VALID") => s * (d - 1) + output_padding.get(i).copied().unwrap_or(0) + extent,
            (true, _) => s * (d - 1) + output_padding.get(i).copied().unwrap_or(0) + extent - padded,
            (false, "SAME_UPPER" | "SAME_LOWER") => (d + s - 1) / s,
            (false, "VALID") => (d - extent) / s + 1,
            (false, _) => (d + padded - extent).div_euclid(s) + 1,
        };
        if out < 0 {
            return Err(format!("its output dim {i} comes out as {out}"));
        }
        dims.push(out as u64);
    }
    Ok(dims)
}

fn resize(node: &Node, inputs: &[Option<&Info>], dims: &[u64]) -> Result<Vec<u64>, String> {
    if node.attributes.iter().any(|a| a.name == "axes") {
        return Err("it resizes some axes only, which the split does not size".into());
    }
    let value = |i: usize| inputs.get(i).copied().flatten();
    let (sizes, scales) =
        if node.op_type == "Upsample" || inputs.len() == 2 { (None, value(1)) } else { (value(3), value(2)) };
    let not_known = |what: &str| format!("its {what} is not a value the split can evaluate");
    if let Some(sizes) = sizes {
        let sizes = sizes.known.as_ref().ok_or_else(|| not_known("sizes"))?;
        if string_attribute(node, "keep_aspect_ratio_policy").is_some_and(|p| p != "stretch") {
            return Err("it keeps the aspect ratio, which the split does not size".into());
        }
        if sizes.len() != dims.len() {
            return Err(format!("its sizes {sizes:?} do not match {dims:?}"));
        }
        return Ok(sizes.iter().map(|&s| s as u64).collect());
    }
    let scales = scales.ok_or("it has neither scales nor sizes")?;
    let scales = scales.known.as_ref().ok_or_else(|| not_known("scales"))?;
    if scales.len() != dims.len() {
        return Err(format!("its scales {scales:?} do not match {dims:?}"));
    }
    Ok(dims.iter().zip(scales).map(|(&d, &s)| (d as f64 * s).floor() as u64).collect())
}

fn constant(node: &Node) -> Result<Info, String> {
    if let Some(t) = tensor_attribute(node, "value") {
        let tensor = read_tensor(t).map_err(|e| e.to_string())?;
        return Ok(Info::new(tensor.data_type, tensor.dims).with_known(small_values(t)));
    }
    if let Some(v) = node.int_attribute("value_int") {
        return Ok(Info::new(INT64, Vec::new()).with_known(Some(vec![v as i64 as f64])));
    }
    if let Some(v) = node.ints_attribute("value_ints") {
        let values = v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        return Ok(Info::new(INT64, vec![v.len() as u64]).with_known(Some(values)));
    }
    Err("its value is not a tensor, value_int or value_ints attribute".into())
}

fn tensor_attribute<'a>(node: &Node<'a>, name: &str) -> Option<&'a [u8]> {
    let a = node.attributes.iter().find(|a| a.name == name)?;
    a.fields.iter().find(|f| f.number == ATTR_T).and_then(|f| f.bytes("AttributeProto").ok())
}

fn string_attribute<'a>(node: &Node<'a>, name: &str) -> Option<&'a str> {
    let a = node.attributes.iter().find(|a| a.name == name)?;
    a.fields.iter().find(|f| f.number == ATTR_S).and_then(|f| f.string("AttributeProto").ok())
}

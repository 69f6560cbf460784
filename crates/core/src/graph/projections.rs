//! A wide `MatMulNBits` whose output is only cut apart, computed as one narrower `MatMulNBits` per part.
//!
//! Each single-stream block of the FLUX.2 transformer projects into one tensor of 9 x 3072 columns
//! (query, key and value, and the gated MLP's two halves) that `Split` and `Slice` cut at once: at
//! 1024x1024 in float32 it is the transformer's widest tensor (510 MB), and the parts are copies of it.
//! Output column n of `MatMulNBits` reads only row n of B, of its scales, zero points and bias, so a
//! part is the same node over a range of those rows: for weights stored outside the graph the same
//! file at another offset, nothing copied. Tests: `graph/tests/projections.rs` and
//! `tools/export/tests/test_projection_parts.py` (the tiny transformers on ONNX Runtime against the
//! graphs as exported).

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::nodes::{write_nodes, Graph, NewNode, GRAPH_PROTO};
use super::proto::{
    bytes_field, edit_message, entry, model_graph, read_tensor, with_graph, Edit, Node, Tensor,
};
use super::reblock::{default_opset, element_size, int_attribute};
use super::RewriteError;
use crate::onnx::fields::*;
use crate::onnx::wire;

/// The first default-domain opset whose `Split` and `Slice` take their sizes and bounds as inputs.
const MIN_OPSET: u64 = 13;

/// `MatMulNBits`' inputs, by position (`g_idx` is input 4).
const B: usize = 1;
const G_IDX: usize = 4;
/// The inputs that hold one row per output column: B, scales, zero points and bias.
const ROW_INPUTS: [usize; 4] = [1, 2, 3, 5];

/// `model` with every `MatMulNBits` whose output only `Split`s and `Slice`s along its last axis read
/// (through any number of them) computed as one `MatMulNBits` per part they leave, and how many nodes
/// changed; the model as it was and 0 when none qualifies.
///
/// Each part's node writes the value the cutting nodes wrote, which go with the wide node. A node
/// stays as it is unless every step is proven: the cutting nodes' sizes and bounds constant, their
/// axis the last one (declared rank), steps of 1, no `g_idx`, and B, scales, zero points and bias
/// initializers stored as raw bytes, one row per output column.
pub fn per_part(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph_bytes = model_graph(&fields)?;
    if default_opset(&fields)? < MIN_OPSET {
        return Ok((model.to_vec(), 0));
    }
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    let initializers = initializers(&graph_fields)?;
    let found: Vec<Projection> =
        graph.nodes.iter().filter_map(|node| Projection::of(&graph, &initializers, node)).collect();
    if found.is_empty() {
        return Ok((model.to_vec(), 0));
    }
    let (nodes, tensors) = parted_nodes(&graph, &found, &initializers)?;
    let kept: Vec<&NewNode> = nodes.iter().collect();
    let out = write_nodes(&graph, &graph_fields, &kept, &tensors, graph_bytes.len())?;
    Ok((with_graph(&fields, &out), found.len()))
}

/// A `MatMulNBits` to compute per part.
struct Projection<'a> {
    /// The wide node.
    node: usize,
    /// Each part: the value it writes and its output columns.
    parts: Vec<(&'a str, Range<u64>)>,
    /// The `Split`s and `Slice`s that go.
    cutters: Vec<usize>,
}

/// A graph's initializers by name, each with its TensorProto's bytes.
pub(super) type Initializers<'a> = HashMap<String, (Tensor, &'a [u8])>;

pub(super) fn initializers<'a>(graph_fields: &[wire::Field<'a>]) -> Result<Initializers<'a>, RewriteError> {
    let mut initializers = HashMap::new();
    for f in graph_fields.iter().filter(|f| f.number == GRAPH_INITIALIZER) {
        let bytes = f.bytes(GRAPH_PROTO)?;
        let tensor = read_tensor(bytes)?;
        initializers.insert(tensor.name.clone(), (tensor, bytes));
    }
    Ok(initializers)
}

/// A cutting node and the value and columns of each of its outputs.
type Cut<'a> = (usize, Vec<(&'a str, Range<u64>)>);

impl<'a> Projection<'a> {
    fn of(graph: &Graph<'a>, initializers: &Initializers, node: &Node<'a>) -> Option<Projection<'a>> {
        if !(node.domain == "com.microsoft" && node.op_type == "MatMulNBits") {
            return None;
        }
        let n = node.int_attribute("N")?;
        let output = *node.outputs.first()?;
        let rank = graph.dims.get(output).map(Vec::len)?;
        if node.inputs.get(G_IDX).is_some_and(|g| !g.is_empty()) || n == 0 {
            return None;
        }
        for &i in &ROW_INPUTS {
            match node.inputs.get(i).filter(|v| !v.is_empty()) {
                Some(v) => rows_of(initializers.get(*v)?, n)?,
                None if i == B => return None,
                None => continue,
            };
        }
        let mut found = Projection { node: node.index, parts: Vec::new(), cutters: Vec::new() };
        let cuts = cuts_of(graph, output, 0..n, rank)?;
        found.expand(graph, cuts, rank);
        Some(found)
    }

    /// Follows each cutting node's outputs: cut again where they are only cut, else a part.
    fn expand(&mut self, graph: &Graph<'a>, cuts: Vec<Cut<'a>>, rank: usize) {
        for (cutter, outputs) in cuts {
            self.cutters.push(cutter);
            for (value, columns) in outputs {
                match cuts_of(graph, value, columns.clone(), rank) {
                    Some(more) => self.expand(graph, more, rank),
                    None if graph.consumers.contains_key(value) || graph.outputs.contains(value) => {
                        self.parts.push((value, columns))
                    }
                    None => {}
                }
            }
        }
    }
}

/// When every reader of `value` (columns `columns` of the wide output) is a `Split` or `Slice` of its
/// last axis with constant sizes or bounds: each reader and the columns of each of its outputs.
fn cuts_of<'a>(graph: &Graph<'a>, value: &str, columns: Range<u64>, rank: usize) -> Option<Vec<Cut<'a>>> {
    let readers = graph.consumers.get(value)?;
    if graph.outputs.contains(value) {
        return None;
    }
    let last_axis = |axis: i64| axis == -1 || axis == rank as i64 - 1;
    let mut cuts = Vec::new();
    for &r in readers {
        let node = &graph.nodes[r];
        if node.inputs.first() != Some(&value) {
            return None;
        }
        let width = columns.end - columns.start;
        let within = if node.is_onnx("Split") {
            last_axis(node.int_attribute("axis").unwrap_or(0) as i64).then_some(())?;
            split_sizes(graph, node, width)?
        } else if node.is_onnx("Slice") {
            vec![slice_bounds(graph, node, width, &last_axis)?]
        } else {
            return None;
        };
        let outputs = node
            .outputs
            .iter()
            .zip(within)
            .filter(|(o, _)| !o.is_empty())
            .map(|(o, r)| (*o, columns.start + r.start..columns.start + r.end))
            .collect();
        cuts.push((r, outputs));
    }
    Some(cuts)
}

/// The columns of each output of a `Split` of `width` columns.
fn split_sizes(graph: &Graph, node: &Node, width: u64) -> Option<Vec<Range<u64>>> {
    let count = node.outputs.len() as u64;
    let sizes: Vec<u64> = match node.inputs.get(1).filter(|s| !s.is_empty()) {
        Some(sizes) => graph.constants.get(sizes)?.iter().map(|&s| s as u64).collect(),
        None => match node.ints_attribute("split") {
            Some(sizes) if !sizes.is_empty() => sizes.iter().map(|&s| s as u64).collect(),
            // Equal parts, the last smaller where they do not divide (ONNX's `num_outputs`).
            _ => {
                let part = width.div_ceil(count.max(1));
                (0..count).map(|i| part.min(width.saturating_sub(i * part))).collect()
            }
        },
    };
    if sizes.len() as u64 != count || sizes.iter().sum::<u64>() != width || sizes.contains(&0) {
        return None;
    }
    let mut start = 0;
    Some(
        sizes
            .iter()
            .map(|s| {
                start += s;
                start - s..start
            })
            .collect(),
    )
}

/// The columns a `Slice` of `width` columns keeps: one axis, the last, constant bounds, step 1.
fn slice_bounds(
    graph: &Graph,
    node: &Node,
    width: u64,
    last_axis: &dyn Fn(i64) -> bool,
) -> Option<Range<u64>> {
    let constant = |i: usize| -> Option<i64> {
        match graph.constants.get(*node.inputs.get(i)?)?.as_slice() {
            // i64::MAX as f64 rounds up: saturating is what Slice's clamping does.
            &[v] => Some(if v >= i64::MAX as f64 { i64::MAX } else { v as i64 }),
            _ => None,
        }
    };
    if !last_axis(constant(3)?) || node.inputs.get(4).is_some_and(|s| !s.is_empty() && constant(4) != Some(1))
    {
        return None;
    }
    let clamp = |v: i64| -> u64 {
        let v = if v < 0 { v.saturating_add(width as i64) } else { v };
        v.clamp(0, width as i64) as u64
    };
    let (start, end) = (clamp(constant(1)?), clamp(constant(2)?));
    (start < end).then_some(start..end)
}

/// How a row-per-column initializer of a node with `n` columns is cut: its bytes per row, when its
/// first dim is `n` (or, for one dim, a multiple of it) and its bytes are raw (external, or inline
/// `raw_data`).
pub(super) fn rows_of((tensor, bytes): &(Tensor, &[u8]), n: u64) -> Option<u64> {
    let first = *tensor.dims.first()?;
    if !(first == n || (tensor.dims.len() == 1 && first % n == 0)) || tensor.segmented {
        return None;
    }
    let length = tensor.dims.iter().try_fold(element_size(tensor.data_type)?, |b, &d| b.checked_mul(d))?;
    let raw = match &tensor.external {
        Some(e) => e.length.is_none_or(|l| l == length),
        None => wire::parse(bytes, "TensorProto").ok()?.iter().any(|f| {
            f.number == TENSOR_RAW_DATA && f.bytes("TensorProto").is_ok_and(|r| r.len() as u64 == length)
        }),
    };
    raw.then_some(length / n)
}

/// The new node list and the parts' initializers: each projection's parts where it was, its cutting
/// nodes gone.
fn parted_nodes(
    graph: &Graph,
    found: &[Projection],
    initializers: &Initializers,
) -> Result<(Vec<NewNode>, Vec<Vec<u8>>), RewriteError> {
    let at: HashMap<usize, &Projection> = found.iter().map(|p| (p.node, p)).collect();
    let gone: HashSet<usize> = found.iter().flat_map(|p| p.cutters.iter().copied()).collect();
    let mut nodes = Vec::with_capacity(graph.nodes.len() + 4 * found.len());
    let mut tensors = Vec::new();
    for (index, node) in graph.nodes.iter().enumerate() {
        if let Some(projection) = at.get(&index) {
            for (value, columns) in &projection.parts {
                nodes.push(part_node(node, value, columns, initializers, &mut tensors)?);
            }
        } else if !gone.contains(&index) {
            nodes.push(NewNode::kept(node));
        }
    }
    Ok((nodes, tensors))
}

/// The node computing `columns` of `wide` into `value`, its row inputs cut into `tensors`.
fn part_node(
    wide: &Node,
    value: &str,
    columns: &Range<u64>,
    initializers: &Initializers,
    tensors: &mut Vec<Vec<u8>>,
) -> Result<NewNode, RewriteError> {
    let n = wide.int_attribute("N").unwrap_or(0);
    let name = format!("{}/columns_{}_{}", wide.name_or_output(), columns.start, columns.end);
    let mut inputs: Vec<String> = wide.inputs.iter().map(|i| (*i).to_owned()).collect();
    for i in ROW_INPUTS {
        let Some(input) = wide.inputs.get(i).filter(|v| !v.is_empty()) else { continue };
        let rows = &initializers[*input];
        let part = format!("{name}/{input}");
        tensors.push(rows_cut(rows, n, columns, &part)?);
        inputs[i] = part;
    }
    let attributes = wide
        .attributes
        .iter()
        .map(|a| {
            if a.name == "N" {
                int_attribute("N", columns.end - columns.start)
            } else {
                a.fields.iter().flat_map(|f| f.raw.iter().copied()).collect()
            }
        })
        .collect();
    let input_names: Vec<&str> = inputs.iter().map(String::as_str).collect();
    Ok(NewNode::new(&name, (wide.domain, wide.op_type), &input_names, &[value], attributes))
}

/// The TensorProto of rows `columns` of a row-per-column initializer, named `name`: the same external
/// file at the rows' offset, or the rows' raw bytes.
pub(super) fn rows_cut(
    rows: &(Tensor, &[u8]),
    n: u64,
    columns: &Range<u64>,
    name: &str,
) -> Result<Vec<u8>, RewriteError> {
    let (tensor, bytes) = rows;
    let row = rows_of(rows, n).ok_or_else(|| tensor.error("its rows can not be cut"))?;
    let (start, length) = (columns.start * row, (columns.end - columns.start) * row);
    let mut dims = tensor.dims.clone();
    dims[0] = dims[0] / n * (columns.end - columns.start);
    let mut out = edit_message(bytes, "TensorProto", |f| {
        Ok(match f.number {
            TENSOR_NAME => Edit::Replace(bytes_field(TENSOR_NAME, name.as_bytes())),
            TENSOR_DIMS | TENSOR_EXTERNAL_DATA => Edit::Drop,
            TENSOR_RAW_DATA => {
                let raw = f.bytes("TensorProto")?;
                Edit::Replace(bytes_field(TENSOR_RAW_DATA, &raw[start as usize..(start + length) as usize]))
            }
            _ => Edit::Keep,
        })
    })?
    .unwrap_or_else(|| bytes.to_vec());
    for d in dims {
        wire::put_varint_field(&mut out, TENSOR_DIMS, d);
    }
    if let Some(e) = &tensor.external {
        for (key, value) in [("location", e.file.clone()), ("offset", (e.offset + start).to_string())] {
            wire::put_bytes_field(&mut out, TENSOR_EXTERNAL_DATA, &entry(key, &value));
        }
        wire::put_bytes_field(&mut out, TENSOR_EXTERNAL_DATA, &entry("length", &length.to_string()));
    }
    Ok(out)
}

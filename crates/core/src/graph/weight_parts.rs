//! A `Gemm` or a `MatMulNBits` whose weights weigh more than a limit, computed as nodes of its kind over
//! ranges of the weights' rows, joined by a `Concat`.
//!
//! ONNX Runtime Web uploads each initializer through a staging buffer of its size, and reads it whole
//! into one JavaScript buffer first. Chromium backs staging buffers with chunks of shared memory that
//! the renderer keeps for the stage worker's life, each as large as the upload that made it; so the
//! largest initializers set a floor under the renderer's memory. FLUX.2's modulation projections are
//! float weights of 113 MB each (226 MB converted to float32): with them whole, the renderer held 0.72
//! GB of shared memory while the float32 transformer loaded on an H100, 0.25 GB with them in parts;
//! what was left were chunks the sizes of its largest int8 `MatMulNBits` (28 to 54 MB). With those in
//! parts too, the renderer's shared memory fell 0.60x (BENCHMARKS.md).
//!
//! Output column n reads only row n of the weights: of B for a `Gemm` with `transB` set (and element n
//! of a bias of one element per column); of B, its scales, zero points and bias for a `MatMulNBits`.
//! So a range of rows is a node of its own: for weights stored outside the graph, the same file at
//! another offset, nothing copied. Each output column's sum is the one it was. The rows of a part are
//! one initializer however many nodes read them (the copies of a node that `rows` computes per chunk
//! of tokens). Tests: `graph/tests/weight_parts.rs` and `tools/export/tests/test_weight_parts.py` (the
//! tiny transformers on ONNX Runtime against the graphs as exported).

use std::collections::HashSet;
use std::ops::Range;

use super::nodes::{write_nodes, Graph, NewNode, GRAPH_PROTO};
use super::projections::{initializers, rows_cut, rows_of, Initializers};
use super::proto::{model_graph, with_graph, Node};
use super::reblock::{default_opset, int_attribute};
use super::RewriteError;
use crate::onnx::wire;

/// The most bytes of weights one node uploads after [`by_rows`] as the stage worker applies it: less
/// than the transformer's larger quantized weights (a 3072 x 9216 int8 projection is 28 MB).
pub const MAX_PART_BYTES: u64 = 16 << 20;

/// Which nodes [`by_rows`] cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `Gemm` with `transB` set: float weights (the modulations).
    Gemm,
    /// `MatMulNBits`: quantized weights (the projections).
    MatMulNBits,
}

/// `MatMulNBits`' inputs that hold one row per output column: B, scales, zero points and bias
/// (`g_idx`, input 4, is not).
const MATMUL_ROW_INPUTS: [usize; 4] = [1, 2, 3, 5];
const MATMUL_G_IDX: usize = 4;

/// The first default-domain opset whose `Concat` takes a negative axis.
const CONCAT_NEGATIVE_AXIS_OPSET: u64 = 11;

/// `model` with every `op` node whose weights (B) weigh more than `max_part_bytes` computed as nodes
/// over equal ranges of B's rows, each at most that heavy, their outputs joined along the last axis,
/// and how many nodes changed; the model as it was and 0 when none qualifies.
///
/// A node stays as it is unless each input it cuts is an initializer stored as raw bytes (in a file,
/// or inline) of one row per output column: for a `Gemm`, B of two dims with `transB` set and a bias
/// of one element per column (a single value is read whole by every part); for a `MatMulNBits`, B,
/// its scales and any zero points and bias, and no `g_idx`.
pub fn by_rows(model: &[u8], max_part_bytes: u64, op: Op) -> Result<(Vec<u8>, usize), RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph_bytes = model_graph(&fields)?;
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    let of_op = |n: &Node| match op {
        Op::Gemm => n.is_onnx("Gemm"),
        Op::MatMulNBits => n.domain == "com.microsoft" && n.op_type == "MatMulNBits",
    };
    if !graph.nodes.iter().any(of_op)
        || (op == Op::MatMulNBits && default_opset(&fields)? < CONCAT_NEGATIVE_AXIS_OPSET)
    {
        return Ok((model.to_vec(), 0));
    }
    let initializers = initializers(&graph_fields)?;
    let mut nodes = Vec::with_capacity(graph.nodes.len());
    let mut tensors = Tensors::default();
    let mut changed = 0;
    for node in &graph.nodes {
        let wide = if of_op(node) { Wide::of(node, op, &initializers, max_part_bytes) } else { None };
        match wide {
            Some(wide) => {
                nodes.extend(wide.parts(node, &initializers, &mut tensors)?);
                changed += 1;
            }
            None => nodes.push(NewNode::kept(node)),
        }
    }
    if changed == 0 {
        return Ok((model.to_vec(), 0));
    }
    let kept: Vec<&NewNode> = nodes.iter().collect();
    let out = write_nodes(&graph, &graph_fields, &kept, &tensors.written, graph_bytes.len())?;
    Ok((with_graph(&fields, &out), changed))
}

/// The parts' initializers, each written once.
#[derive(Default)]
struct Tensors {
    names: HashSet<String>,
    written: Vec<Vec<u8>>,
}

/// A node to compute in parts.
struct Wide {
    op: Op,
    /// B's rows: the output's columns.
    n: u64,
    /// The rows of each part.
    parts: Vec<Range<u64>>,
    /// The inputs cut with B's rows; the others every part reads whole.
    cut: Vec<usize>,
}

impl Wide {
    fn of(node: &Node, op: Op, initializers: &Initializers, max_part_bytes: u64) -> Option<Wide> {
        if node.outputs.len() != 1 {
            return None;
        }
        let present = |i: usize| node.inputs.get(i).filter(|v| !v.is_empty());
        let weights = initializers.get(*present(1)?)?;
        let (n, cut) = match op {
            Op::Gemm => {
                let [n, _] = weights.0.dims[..] else { return None };
                if node.int_attribute("transB") != Some(1) {
                    return None;
                }
                let cut = match present(2) {
                    None => vec![1],
                    Some(c) => {
                        let bias = initializers.get(*c)?;
                        if bias.0.dims.iter().product::<u64>() == 1 {
                            vec![1]
                        } else if bias.0.dims == [n] && rows_of(bias, n).is_some() {
                            vec![1, 2]
                        } else {
                            return None;
                        }
                    }
                };
                (n, cut)
            }
            Op::MatMulNBits => {
                let n = node.int_attribute("N").filter(|&n| n > 0)?;
                if present(MATMUL_G_IDX).is_some() {
                    return None;
                }
                let cut: Vec<usize> =
                    MATMUL_ROW_INPUTS.into_iter().filter(|&i| present(i).is_some()).collect();
                for &i in &cut {
                    rows_of(initializers.get(*present(i)?)?, n)?;
                }
                (n, cut)
            }
        };
        let row_bytes = rows_of(weights, n)?;
        let parts = (n * row_bytes).div_ceil(max_part_bytes.max(1)).min(n);
        if parts < 2 {
            return None;
        }
        let rows = n.div_ceil(parts);
        let parts = (0..n).step_by(rows as usize).map(|start| start..(start + rows).min(n)).collect();
        Some(Wide { op, n, parts, cut })
    }

    /// A node per part, then the `Concat` that writes the wide output; the parts' rows of each cut
    /// input go into `tensors`, once.
    fn parts(
        &self,
        node: &Node,
        initializers: &Initializers,
        tensors: &mut Tensors,
    ) -> Result<Vec<NewNode>, RewriteError> {
        let name = node.name_or_output();
        let mut nodes = Vec::with_capacity(self.parts.len() + 1);
        let mut outputs = Vec::with_capacity(self.parts.len());
        for rows in &self.parts {
            let suffix = format!("imagine_rows_{}_{}", rows.start, rows.end);
            let part = format!("{name}/{suffix}");
            let mut inputs: Vec<String> = node.inputs.iter().map(|i| (*i).to_owned()).collect();
            for &i in &self.cut {
                let whole = node.inputs[i];
                inputs[i] = format!("{whole}/{suffix}");
                if tensors.names.insert(inputs[i].clone()) {
                    tensors.written.push(rows_cut(&initializers[whole], self.n, rows, &inputs[i])?);
                }
            }
            let attributes = node
                .attributes
                .iter()
                .map(|a| match self.op {
                    Op::MatMulNBits if a.name == "N" => int_attribute("N", rows.end - rows.start),
                    _ => a.fields.iter().flat_map(|f| f.raw.iter().copied()).collect(),
                })
                .collect();
            let output = format!("{part}/output");
            let input_names: Vec<&str> = inputs.iter().map(String::as_str).collect();
            nodes.push(NewNode::new(
                &part,
                (node.domain, node.op_type),
                &input_names,
                &[&output],
                attributes,
            ));
            outputs.push(output);
        }
        // A Gemm's output is a matrix; a MatMulNBits' has its input's rank, columns last. An int64
        // attribute of -1 is the varint of its two's complement.
        let axis = match self.op {
            Op::Gemm => 1,
            Op::MatMulNBits => -1i64 as u64,
        };
        let joined: Vec<&str> = outputs.iter().map(String::as_str).collect();
        nodes.push(NewNode::new(
            &format!("{name}/imagine_concat"),
            ("", "Concat"),
            &joined,
            &[node.outputs[0]],
            vec![int_attribute("axis", axis)],
        ));
        Ok(nodes)
    }
}

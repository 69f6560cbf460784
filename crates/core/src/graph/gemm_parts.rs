//! A `Gemm` whose weights weigh more than a limit, computed as `Gemm`s over ranges of the weights' rows,
//! joined by a `Concat`.
//!
//! ONNX Runtime Web uploads each initializer through a staging buffer of its size, and reads it whole
//! into one JavaScript buffer first. Chromium backs staging buffers with shared memory that the
//! renderer keeps, once grown, for the stage worker's life; so the largest initializers set a floor
//! under the renderer's memory. FLUX.2's modulation projections are float weights of 113 MB each (226
//! MB converted to float32): with them whole, the renderer held 0.72 GB of shared memory while the
//! float32 transformer loaded on an H100, 0.25 GB with them in parts (BENCHMARKS.md). With `transB` set, output column n of a `Gemm` reads only row n of B
//! (and element n of a bias of one element per column), so a range of rows is a `Gemm` of its own:
//! for weights stored outside the graph, the same file at another offset, nothing copied. Each output
//! column's sum is the one it was, so the output is the same bit for bit. Tests:
//! `graph/tests/gemm_parts.rs` and `tools/export/tests/test_gemm_parts.py` (the tiny transformers on
//! ONNX Runtime against the graphs as exported).

use std::ops::Range;

use super::nodes::{write_nodes, Graph, NewNode, GRAPH_PROTO};
use super::projections::{initializers, rows_cut, rows_of, Initializers};
use super::proto::{model_graph, with_graph, Node};
use super::reblock::int_attribute;
use super::RewriteError;
use crate::onnx::wire;

/// The most bytes of weights one `Gemm` uploads after [`by_rows`] as the stage worker applies it: less
/// than the transformer's larger quantized weights (a 3072 x 9216 int8 projection is 28 MB).
pub const MAX_PART_BYTES: u64 = 16 << 20;

/// `model` with every `Gemm` whose weights (B, with `transB` set) weigh more than `max_part_bytes`
/// computed as `Gemm`s over equal ranges of B's rows, each at most that heavy, their outputs joined
/// along the columns, and how many `Gemm`s changed; the model as it was and 0 when none qualifies.
///
/// A `Gemm` stays as it is unless B is an initializer of two dims stored as raw bytes (in a file, or
/// inline) and its bias, if any, is one value for every column (kept whole) or an initializer of one
/// element per column stored the same way (cut with B).
pub fn by_rows(model: &[u8], max_part_bytes: u64) -> Result<(Vec<u8>, usize), RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph_bytes = model_graph(&fields)?;
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    if !graph.nodes.iter().any(|n| n.is_onnx("Gemm")) {
        return Ok((model.to_vec(), 0));
    }
    let initializers = initializers(&graph_fields)?;
    let mut nodes = Vec::with_capacity(graph.nodes.len());
    let mut tensors = Vec::new();
    let mut changed = 0;
    for node in &graph.nodes {
        match WideGemm::of(node, &initializers, max_part_bytes) {
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
    let out = write_nodes(&graph, &graph_fields, &kept, &tensors, graph_bytes.len())?;
    Ok((with_graph(&fields, &out), changed))
}

/// A `Gemm` to compute in parts.
struct WideGemm {
    /// B's rows: the output's columns.
    n: u64,
    /// The rows of each part.
    parts: Vec<Range<u64>>,
    /// The bias is cut with B (one element per column) rather than read whole by every part.
    bias_per_column: bool,
}

impl WideGemm {
    fn of(node: &Node, initializers: &Initializers, max_part_bytes: u64) -> Option<WideGemm> {
        if !node.is_onnx("Gemm") || node.int_attribute("transB") != Some(1) || node.outputs.len() != 1 {
            return None;
        }
        let weights = initializers.get(*node.inputs.get(1)?)?;
        let [n, _] = weights.0.dims[..] else { return None };
        let row_bytes = rows_of(weights, n)?;
        let parts = (n * row_bytes).div_ceil(max_part_bytes.max(1)).min(n);
        if parts < 2 {
            return None;
        }
        let bias_per_column = match node.inputs.get(2).filter(|c| !c.is_empty()) {
            None => false,
            Some(c) => {
                let bias = initializers.get(*c)?;
                if bias.0.dims.iter().product::<u64>() == 1 {
                    false
                } else if bias.0.dims == [n] && rows_of(bias, n).is_some() {
                    true
                } else {
                    return None;
                }
            }
        };
        let rows = n.div_ceil(parts);
        let parts = (0..n).step_by(rows as usize).map(|start| start..(start + rows).min(n)).collect();
        Some(WideGemm { n, parts, bias_per_column })
    }

    /// A `Gemm` per part, then the `Concat` that writes the wide output; the parts' weights (and
    /// biases) go into `tensors`.
    fn parts(
        &self,
        node: &Node,
        initializers: &Initializers,
        tensors: &mut Vec<Vec<u8>>,
    ) -> Result<Vec<NewNode>, RewriteError> {
        let name = node.name_or_output();
        let attributes: Vec<Vec<u8>> = node
            .attributes
            .iter()
            .map(|a| a.fields.iter().flat_map(|f| f.raw.iter().copied()).collect())
            .collect();
        let mut nodes = Vec::with_capacity(self.parts.len() + 1);
        let mut outputs = Vec::with_capacity(self.parts.len());
        for rows in &self.parts {
            let part = format!("{name}/imagine_rows_{}_{}", rows.start, rows.end);
            let mut inputs: Vec<String> = node.inputs.iter().map(|i| (*i).to_owned()).collect();
            let cut = if self.bias_per_column { 1..=2 } else { 1..=1 };
            for i in cut {
                let whole = &initializers[node.inputs[i]];
                inputs[i] = format!("{part}/{}", node.inputs[i]);
                tensors.push(rows_cut(whole, self.n, rows, &inputs[i])?);
            }
            let output = format!("{part}/output");
            let input_names: Vec<&str> = inputs.iter().map(String::as_str).collect();
            nodes.push(NewNode::new(&part, ("", "Gemm"), &input_names, &[&output], attributes.clone()));
            outputs.push(output);
        }
        let joined: Vec<&str> = outputs.iter().map(String::as_str).collect();
        nodes.push(NewNode::new(
            &format!("{name}/imagine_concat"),
            ("", "Concat"),
            &joined,
            &[node.outputs[0]],
            vec![int_attribute("axis", 1)],
        ));
        Ok(nodes)
    }
}

//! `Clip` computed as `Max` then `Min`.
//!
//! FLUX.2's transformer clamps its residual stream to float16's range after each block (`Clip` with
//! scalar bounds). The WGSL that ONNX Runtime Web writes for a float16 `Clip` indexes a vector with a
//! float, which Tint (Chrome) accepts and naga (Firefox) refuses ("Access index type Scalar(Float)"),
//! so in Firefox the whole transformer failed to load. `Max(x, min)` then `Min(_, max)` is ONNX's own
//! definition of `Clip` (a `min` above `max` gives `max` everywhere, as `Clip` does), computed by ONNX
//! Runtime's broadcasting binary kernels, which both compilers take. One more pass over a tensor per
//! clamp; the graph is the same in every browser. Tests: `graph/tests/clip.rs`,
//! `tools/export/tests/test_clip.py` (the tiny transformers on ONNX Runtime against the exported graph).

use super::nodes::{write_nodes, Graph, NewNode, GRAPH_PROTO};
use super::proto::{model_graph, with_graph, Node};
use super::RewriteError;
use crate::onnx::wire;

/// `model` with every `Clip` that takes its bounds as inputs (opset 11 and later) computed as `Max`
/// then `Min`, and how many; the model as it was and 0 when there is none. A `Clip` with its bounds
/// as attributes (before opset 11) stays.
pub fn as_max_min(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph_bytes = model_graph(&fields)?;
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    if !graph.nodes.iter().any(takes_bounds_as_inputs) {
        return Ok((model.to_vec(), 0));
    }
    let mut nodes = Vec::with_capacity(graph.nodes.len() + 8);
    let mut rewritten = 0;
    for node in &graph.nodes {
        if takes_bounds_as_inputs(node) {
            nodes.extend(max_min(node));
            rewritten += 1;
        } else {
            nodes.push(NewNode::kept(node));
        }
    }
    let kept: Vec<&NewNode> = nodes.iter().collect();
    let out = write_nodes(&graph, &graph_fields, &kept, &[], graph_bytes.len())?;
    Ok((with_graph(&fields, &out), rewritten))
}

fn takes_bounds_as_inputs(node: &Node) -> bool {
    node.is_onnx("Clip") && node.attributes.is_empty() && !node.inputs.is_empty() && node.outputs.len() == 1
}

/// The nodes that compute `node`'s output under its name: `Max` with the lower bound, then `Min` with
/// the upper, each left out where `Clip` has no such bound (an `Identity` where it has neither).
fn max_min(node: &Node) -> Vec<NewNode> {
    let bound = |i: usize| node.inputs.get(i).copied().filter(|v| !v.is_empty());
    let (x, output, name) = (node.inputs[0], node.outputs[0], node.name_or_output());
    let low_name = format!("{name}/imagine_max");
    let low_output = format!("{output}/imagine_at_least_min");
    match (bound(1), bound(2)) {
        (Some(min), Some(max)) => vec![
            NewNode::new(&low_name, ("", "Max"), &[x, min], &[&low_output], Vec::new()),
            NewNode::new(
                &format!("{name}/imagine_min"),
                ("", "Min"),
                &[&low_output, max],
                &[output],
                Vec::new(),
            ),
        ],
        (Some(min), None) => vec![NewNode::new(&low_name, ("", "Max"), &[x, min], &[output], Vec::new())],
        (None, Some(max)) => {
            vec![NewNode::new(&format!("{name}/imagine_min"), ("", "Min"), &[x, max], &[output], Vec::new())]
        }
        (None, None) => vec![NewNode::new(name, ("", "Identity"), &[x], &[output], Vec::new())],
    }
}

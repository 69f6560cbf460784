//! A chain of per-token nodes ending in a `MatMulNBits` computed in chunks of tokens.
//!
//! With the projections per part ([`super::projections`]), a single-stream block's widest tensors are its
//! gated MLP's (the two halves, the activation's steps, the product: 9216 columns each) and the second
//! projection's input (the attention's output and the MLP's, 12,288 columns). At 1024x1024 in float32
//! each is above ONNX Runtime Web's largest cached buffer, so every layer allocates them afresh and they
//! pile up. Every node from the projections to that second product works token by token, so the chain
//! computed on chunks of the tokens (a `Split` of each input along the tokens, a copy of the chain per
//! chunk, a `Concat` of the results) is the same function with tensors `chunks` times smaller. Tests:
//! `graph/tests/rows.rs` and `tools/export/tests/test_projection_parts.py` (the tiny transformers on
//! ONNX Runtime against the graphs as exported).

use std::collections::{HashMap, HashSet};

use super::nodes::{with_values, write_nodes, Graph, NewNode, GRAPH_PROTO};
use super::proto::{model_graph, with_graph, Node};
use super::reblock::{default_opset, int_attribute};
use super::RewriteError;
use crate::onnx::wire;

/// The first default-domain opset with `Split`'s `num_outputs`.
const SPLIT_NUM_OUTPUTS_OPSET: u64 = 18;

/// The axis of the tokens in `[batch, tokens, channels]`.
const TOKEN_AXIS: u64 = 1;

/// Elementwise operators whose inputs all have the tokens' axis (or are constants): a chunk of tokens
/// in, the same chunk out.
const TOKEN_WISE: [&str; 6] = ["Sigmoid", "Mul", "Add", "Tanh", "Relu", "Erf"];

/// `model` with every chain [`chunk_rows`] proves computed in `chunks` chunks of tokens, and how many
/// chains; the model as it was and 0 when `chunks <= 1`, there is none, or the default opset is older
/// than 18.
///
/// A chain ends in a `MatMulNBits` whose input is a `Concat` along the last axis, or a token-wise
/// node; going back from there it takes in every producer that is a `MatMulNBits` (its input), a
/// token-wise node or such a `Concat`, as long as everything the chain's values feed is in the chain.
/// What it reads from outside (not constants) must be `[batch, tokens, ...]` with the tokens' dim
/// symbolic, as declared: each is cut along the tokens by one `Split` (ONNX Runtime cuts parts of
/// `ceil(n / C)`), and the chain's result is put back by a `Concat` under its old name.
pub fn chunk_rows(model: &[u8], chunks: u32) -> Result<(Vec<u8>, usize), RewriteError> {
    if chunks <= 1 {
        return Ok((model.to_vec(), 0));
    }
    let fields = wire::parse(model, "ModelProto")?;
    if default_opset(&fields)? < SPLIT_NUM_OUTPUTS_OPSET {
        return Ok((model.to_vec(), 0));
    }
    let graph_bytes = model_graph(&fields)?;
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    let chains: Vec<Chain> = (0..graph.nodes.len()).filter_map(|i| Chain::ending_at(&graph, i)).collect();
    if chains.is_empty() {
        return Ok((model.to_vec(), 0));
    }
    let (nodes, chunked) = chunked_nodes(&graph, &chains, chunks)?;
    let kept: Vec<&NewNode> = nodes.iter().collect();
    let out = write_nodes(&graph, &graph_fields, &kept, &[], graph_bytes.len())?;
    Ok((with_graph(&fields, &out), chunked))
}

/// One chain of token-wise nodes.
struct Chain<'a> {
    /// Its nodes, in graph order; the last is the `MatMulNBits` it ends in.
    nodes: Vec<usize>,
    /// What it reads from outside, cut along the tokens.
    inputs: Vec<&'a str>,
}

impl<'a> Chain<'a> {
    fn ending_at(graph: &Graph<'a>, end: usize) -> Option<Chain<'a>> {
        let last = &graph.nodes[end];
        if !is_matmul_nbits(last) {
            return None;
        }
        let output = *last.outputs.first()?;
        let rank = graph.dims.get(output)?.len();
        let feeds_chain = |i: usize| graph.nodes.get(i).is_some_and(|n| is_token_wise(n, rank));
        graph.producer.get(last.inputs[0]).copied().filter(|&p| feeds_chain(p))?;

        let mut members: HashSet<usize> = HashSet::from([end]);
        let mut inputs: Vec<&'a str> = Vec::new();
        let mut stack = vec![end];
        while let Some(i) = stack.pop() {
            let node = &graph.nodes[i];
            // A MatMulNBits reads its weights as they are; one that is not the end starts the chain,
            // its input read from outside.
            let reads = if is_matmul_nbits(node) { &node.inputs[..1] } else { &node.inputs[..] };
            for &value in reads.iter().filter(|v| !v.is_empty() && !graph.constants.contains_key(*v)) {
                let producer = graph.producer.get(value).copied();
                let starts = is_matmul_nbits(node) && i != end;
                match producer {
                    Some(p) if members.contains(&p) => {}
                    Some(p) if !starts && (is_matmul_nbits(&graph.nodes[p]) || feeds_chain(p)) => {
                        members.insert(p);
                        stack.push(p);
                    }
                    _ if !inputs.contains(&value) => inputs.push(value),
                    _ => {}
                }
            }
        }
        // Every value made in the chain is read in it only (but its result), and what it reads from
        // outside has the tokens' axis.
        let inside = |value: &str| {
            !graph.outputs.contains(value)
                && graph.consumers.get(value).is_some_and(|c| c.iter().all(|r| members.contains(r)))
        };
        let mut made_inside =
            members.iter().filter(|&&m| m != end).flat_map(|&m| graph.nodes[m].outputs.iter());
        let tokens = |value: &&str| {
            graph.dims.get(*value).is_some_and(|d| d.len() == rank && d[TOKEN_AXIS as usize].is_none())
        };
        if !made_inside.all(|v| inside(v)) || !inputs.iter().all(tokens) || members.len() < 3 {
            return None;
        }
        let mut nodes: Vec<usize> = members.into_iter().collect();
        nodes.sort_unstable();
        Some(Chain { nodes, inputs })
    }
}

fn is_matmul_nbits(node: &Node) -> bool {
    node.domain == "com.microsoft" && node.op_type == "MatMulNBits" && !node.inputs.is_empty()
}

/// A token-wise node of a chain: an elementwise operator of [`TOKEN_WISE`], or a `Concat` along the
/// last axis of `rank`.
fn is_token_wise(node: &Node, rank: usize) -> bool {
    if node.is_onnx("Concat") {
        let axis = node.int_attribute("axis").map(|a| a as i64);
        return matches!(axis, Some(a) if a == -1 || a == rank as i64 - 1);
    }
    TOKEN_WISE.iter().any(|op| node.is_onnx(op)) && !node.outputs.is_empty()
}

/// The new node list: each chain's inputs cut, its copies, its results put back, where its last node
/// was; its nodes gone; and how many chains were cut (one that shares a node with an earlier one is not).
fn chunked_nodes(
    graph: &Graph,
    chains: &[Chain],
    chunks: u32,
) -> Result<(Vec<NewNode>, usize), RewriteError> {
    let mut at: HashMap<usize, (usize, &Chain)> = HashMap::new();
    let mut gone: HashSet<usize> = HashSet::new();
    for (k, chain) in chains.iter().enumerate() {
        let last = *chain.nodes.last().expect("a chain has nodes");
        if chain.nodes.iter().any(|n| gone.contains(n)) {
            continue;
        }
        at.insert(last, (k, chain));
        gone.extend(chain.nodes.iter().copied());
    }
    let mut nodes = Vec::with_capacity(graph.nodes.len() + chains.len() * 16);
    for (index, node) in graph.nodes.iter().enumerate() {
        if let Some(&(k, chain)) = at.get(&index) {
            push_chunked(&mut nodes, graph, chain, chunks, &format!("imagine_rows/{k}"))?;
        } else if !gone.contains(&index) {
            nodes.push(NewNode::kept(node));
        }
    }
    Ok((nodes, at.len()))
}

/// One chain: each input cut into `chunks` along the tokens, the chain's nodes copied per chunk, and
/// the chunks' results concatenated under the last node's output name.
fn push_chunked(
    nodes: &mut Vec<NewNode>,
    graph: &Graph,
    chain: &Chain,
    chunks: u32,
    prefix: &str,
) -> Result<(), RewriteError> {
    let part = |c: u32, value: &str| format!("{prefix}/chunk_{c}/{value}");
    for (i, input) in chain.inputs.iter().enumerate() {
        let parts: Vec<String> = (0..chunks).map(|c| part(c, input)).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let attributes =
            vec![int_attribute("axis", TOKEN_AXIS), int_attribute("num_outputs", u64::from(chunks))];
        nodes.push(NewNode::new(&format!("{prefix}/split_{i}"), ("", "Split"), &[input], &parts, attributes));
    }
    let output = graph.nodes[*chain.nodes.last().expect("a chain has nodes")].outputs[0];
    let mut results = Vec::with_capacity(chunks as usize);
    for c in 0..chunks {
        let mut renamed: HashMap<&str, String> = chain.inputs.iter().map(|&v| (v, part(c, v))).collect();
        for &i in &chain.nodes {
            let node = &graph.nodes[i];
            for o in node.outputs.iter().filter(|o| !o.is_empty()) {
                renamed.insert(o, part(c, o));
            }
            let bytes = with_values(node, &part(c, node.name_or_output()), &renamed)?;
            let names = |values: &[&str]| -> Vec<String> {
                values.iter().map(|&v| renamed.get(v).cloned().unwrap_or_else(|| v.to_owned())).collect()
            };
            let (inputs, outputs) = (names(&node.inputs), names(&node.outputs));
            nodes.push(NewNode { original: None, inputs, outputs, bytes });
        }
        results.push(part(c, output));
    }
    let results: Vec<&str> = results.iter().map(String::as_str).collect();
    let axis = vec![int_attribute("axis", TOKEN_AXIS)];
    nodes.push(NewNode::new(&format!("{prefix}/concat"), ("", "Concat"), &results, &[output], axis));
    Ok(())
}

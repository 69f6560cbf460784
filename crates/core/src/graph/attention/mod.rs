//! Attention fused into ONNX Runtime's `MultiHeadAttention` for its WebGPU flash attention, or
//! computed in chunks of query rows so that its scores fit ONNX Runtime Web's buffer cache.
//!
//! The exporter writes the transformer's attention node by node, as PyTorch decomposes scaled
//! dot-product attention (query and key scaled, the key transposed, `MatMul`, `Softmax`, `MatMul` with
//! the value), and ORT Web runs it as written: every layer writes and reads back `heads x tokens x
//! tokens` scores, allocated afresh at large sizes. [`fuse_attention`] keeps the scores in the GPU's
//! workgroup memory; [`chunk_attention`] cuts them into parts the buffer cache keeps. Both start from the
//! attentions the same finder proves; anything else (a mask added to the scores, a causal attention,
//! another layout) stays as it is.
//!
//! Tests: `graph/tests/attention.rs`, `tools/export/tests/test_attention_fusion.py` and
//! `test_attention_chunks.py` (the tiny transformers on ONNX Runtime against the graphs as exported), and
//! in the browser `real-arch-bench.test.mjs`.

use std::collections::{HashMap, HashSet};

use super::nodes::{int64s_tensor, used, write_nodes, Graph, NewNode, GRAPH_PROTO};
use super::proto::{bytes_field, model_graph, varint_field, with_graph};
use super::reblock::{default_opset, int_attribute};
use super::RewriteError;
use crate::onnx::fields::*;
use crate::onnx::wire::{self, Field};

mod chunks;
pub use chunks::{chunk_attention, chunks_for, ORT_LARGEST_CACHED_BUFFER};

/// The domain of ONNX Runtime's contrib operators.
const MS_DOMAIN: &str = "com.microsoft";

/// A transpose that swaps the sequence and head axes of a rank-4 tensor (BSNH to BNSH and back).
const SWAP_SEQUENCE_AND_HEADS: [i64; 4] = [0, 2, 1, 3];

/// One attention found in the graph.
struct Attention<'a> {
    /// Query, key and value as the heads' projections leave them: `[batch, sequence, heads, head_size]`.
    query: &'a str,
    key: &'a str,
    value: &'a str,
    /// The attention's output in the same layout, the value the rest of the graph reads.
    output: &'a str,
    heads: u64,
    head_size: u64,
    scale: f64,
    /// The node that writes `output` (the new nodes take its place), and the matrix products and softmax
    /// that go with it.
    replaced: usize,
    removed: [usize; 3],
    /// The scores' scaling (`Mul` or `Div` by a scalar) between the first product and the softmax.
    post_scale: Option<usize>,
}

/// Every attention of `graph` that [`Graph::attention`] proves: what both rewrites start from.
fn find_attentions<'a>(graph: &Graph<'a>) -> Vec<Attention<'a>> {
    (0..graph.nodes.len()).filter_map(|i| graph.attention(i)).collect()
}

/// `model` with every attention it can prove fused into `MultiHeadAttention`, and how many.
///
/// It proves `Softmax` over the last axis of `MatMul(Transpose(q), Kᵀ)`, optionally scaled, with the
/// key transposed (directly, or as a `Reshape` to 3-D, a swap and a `Reshape` back) and a value
/// `Transpose(v)` of the same layout, read only by the `MatMul` with the value whose result is only
/// transposed back; heads and head size declared statically and the same for all three. Each becomes
/// `Reshape`s of query, key and value from `[batch, sequence, heads, head_size]` to `[batch, sequence,
/// heads * head_size]` (the same bytes), one `MultiHeadAttention` (`num_heads`, and `scale` the product
/// of the scalar factors on the query, the key and the scores) and a `Reshape` back under the name the
/// rest of the graph reads; the nodes that fed only the fused ones go with them.
///
/// Only nodes change, quickly, so nothing is stored: the stage worker fuses the transformer as it loads
/// on WebGPU when a job asks for it (`fuseAttention`). Off by default, to measure again with each ORT
/// release: ORT Web's flash attention is as exact but slower than the exported nodes (BENCHMARKS.md,
/// "Attention fused into `MultiHeadAttention`"). The decoder's single-head attention is never fused:
/// ORT's `MultiHeadAttention` overflows a tensor size on it at 1024x1024.
pub fn fuse_attention(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph_bytes = model_graph(&fields)?;
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    let found = find_attentions(&graph);
    if found.is_empty() {
        return Ok((model.to_vec(), 0));
    }
    let (nodes, tensors) = fused_nodes(&graph, &found);
    let kept = still_used(&graph, &nodes);
    let out = write_nodes(&graph, &graph_fields, &kept, &tensors, graph_bytes.len())?;
    let mut model_out = with_graph(&fields, &out);
    if !imports(&fields, MS_DOMAIN)? {
        let mut opset = bytes_field(OPSET_DOMAIN, MS_DOMAIN.as_bytes());
        opset.extend(varint_field(OPSET_VERSION, 1));
        wire::put_bytes_field(&mut model_out, MODEL_OPSET_IMPORT, &opset);
    }
    Ok((model_out, found.len()))
}

/// The new node list, and the shape initializers it adds: each attention's nodes where its output was
/// written, its other nodes gone.
fn fused_nodes(graph: &Graph, found: &[Attention]) -> (Vec<NewNode>, Vec<Vec<u8>>) {
    let mut replaced: HashMap<usize, &Attention> = HashMap::new();
    let mut removed = HashSet::new();
    for a in found {
        replaced.insert(a.replaced, a);
        removed.extend(a.removed);
    }
    let bsd_shape = "imagine_attention/bsd_shape";
    let mut tensors = vec![int64s_tensor(bsd_shape, &[0, 0, -1])];
    let mut nodes: Vec<NewNode> = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        if let Some(a) = replaced.get(&i) {
            let prefix = format!("imagine_attention/{}/", node.name_or_output());
            push_fused(&mut nodes, &mut tensors, &prefix, a, bsd_shape);
        } else if !removed.contains(&i) {
            nodes.push(NewNode::kept(node));
        }
    }
    (nodes, tensors)
}

/// The nodes of one fused attention: query, key and value reshaped to `[batch, sequence, hidden]`
/// (`bsd_shape`), `MultiHeadAttention`, and its output reshaped back to BSNH under the old name.
fn push_fused(
    nodes: &mut Vec<NewNode>,
    tensors: &mut Vec<Vec<u8>>,
    prefix: &str,
    a: &Attention,
    bsd_shape: &str,
) {
    let [query, key, value] = [a.query, a.key, a.value].map(|input| {
        let name = format!("{prefix}{input}_bsd");
        nodes.push(NewNode::reshape(&name, &name, input, bsd_shape));
        name
    });
    let fused = format!("{prefix}output_bsd");
    nodes.push(NewNode::attention(prefix, [&query, &key, &value], &fused, a));
    let bsnh_shape = format!("{prefix}bsnh_shape");
    tensors.push(int64s_tensor(&bsnh_shape, &[0, 0, a.heads as i64, a.head_size as i64]));
    nodes.push(NewNode::reshape(&format!("{prefix}output_bsnh"), a.output, &fused, &bsnh_shape));
}

/// `nodes` without those that fed only what was fused (the scaling, the transposes, the key's shape
/// arithmetic); nodes that were unused before stay as they were.
fn still_used<'n>(graph: &Graph, nodes: &'n [NewNode]) -> Vec<&'n NewNode> {
    let before: Vec<NewNode> = graph.nodes.iter().map(NewNode::kept).collect();
    let used_before = used(&before, &graph.outputs);
    let used_after = used(nodes, &graph.outputs);
    nodes
        .iter()
        .filter(|n| n.original.is_none_or(|i| !used_before.contains(&i) || used_after.contains(&i)))
        .collect()
}

impl<'a> Graph<'a> {
    /// `value` with a scalar `Mul` (or `Div`) taken off: the other input and the factor (1 when `value`
    /// is not such a product). The product must have no other reader than the attention.
    fn unscaled(&self, value: &'a str) -> (&'a str, f64) {
        let Some(node) = self.producer(value) else { return (value, 1.0) };
        if self.only_consumer(value).is_none() || node.inputs.len() != 2 {
            return (value, 1.0);
        }
        let (a, b) = (node.inputs[0], node.inputs[1]);
        if node.is_onnx("Mul") {
            if let Some(c) = self.scalar(b) {
                return (a, c);
            }
            if let Some(c) = self.scalar(a) {
                return (b, c);
            }
        }
        if node.is_onnx("Div") {
            if let Some(c) = self.scalar(b).filter(|c| *c != 0.0) {
                return (a, 1.0 / c);
            }
        }
        (value, 1.0)
    }

    /// The input of `value`'s producer when it is a `Transpose` with `perm`.
    fn transposed_from(&self, value: &str, perm: &[i64]) -> Option<&'a str> {
        let node = self.producer(value)?;
        (node.is_onnx("Transpose") && node.ints_attribute("perm")? == perm).then(|| node.inputs[0])
    }

    /// The BSNH key whose transpose to `[batch, heads, head_size, sequence]` `value` is: one `Transpose`
    /// from BSNH, one from BNSH, or the exporter's `Reshape` to 3-D, swap, `Reshape` back, with the
    /// shapes computed from the BNSH key's own.
    fn key_transposed(&self, value: &'a str) -> Option<&'a str> {
        if let Some(key) = self.transposed_from(value, &[0, 2, 3, 1]) {
            return Some(key);
        }
        let bnsh = match self.transposed_from(value, &[0, 1, 3, 2]) {
            Some(bnsh) => bnsh,
            None => {
                // Reshape(Transpose(Reshape(k, [-1, S, H]), [0, 2, 1]), [B, N, H, S]).
                let back = self.producer(value).filter(|n| n.is_onnx("Reshape"))?;
                let swapped = self.transposed_from(back.inputs[0], &[0, 2, 1])?;
                let flat = self.producer(swapped).filter(|n| n.is_onnx("Reshape"))?;
                let bnsh = flat.inputs[0];
                let shape = |value: &str, parts: &[Part]| -> bool {
                    let Some(concat) = self.producer(value) else { return false };
                    concat.is_onnx("Concat")
                        && concat.int_attribute("axis") == Some(0)
                        && concat.inputs.len() == parts.len()
                        && concat.inputs.iter().zip(parts).all(|(input, part)| match part {
                            Part::Constant(c) => self.constant_is(input, c),
                            Part::Dims(start, end) => self.dims_of(input, bnsh, *start, *end),
                        })
                };
                // [-1, S, H] (the last two dims in one slice or two) and [B, N, H, S].
                let merged: [&[Part]; 2] = [
                    &[Part::Constant(&[-1]), Part::Dims(-2, i64::MAX)],
                    &[Part::Constant(&[-1]), Part::Dims(-2, -1), Part::Dims(-1, i64::MAX)],
                ];
                let restored = [Part::Dims(i64::MIN, -2), Part::Dims(-1, i64::MAX), Part::Dims(-2, -1)];
                let flat_shape = flat.inputs.get(1)?;
                if !(merged.iter().any(|m| shape(flat_shape, m)) && shape(back.inputs.get(1)?, &restored)) {
                    return None;
                }
                for v in [flat.outputs[0], swapped] {
                    self.only_consumer(v)?;
                }
                bnsh
            }
        };
        self.transposed_from(bnsh, &SWAP_SEQUENCE_AND_HEADS)
    }

    /// Whether `value` is `Slice(Shape(tensor), [start], [end])` (on axis 0, step 1).
    fn dims_of(&self, value: &str, tensor: &str, start: i64, end: i64) -> bool {
        let Some(slice) = self.producer(value).filter(|n| n.is_onnx("Slice")) else { return false };
        let Some(shape) = slice.inputs.first().and_then(|s| self.producer(s)) else { return false };
        let optional = |i: usize, expected: i64| {
            slice.inputs.get(i).is_none_or(|v| v.is_empty() || self.constant_is(v, &[expected]))
        };
        shape.is_onnx("Shape")
            && shape.inputs.first() == Some(&tensor)
            && shape.int_attribute("start").is_none_or(|s| s == 0)
            && shape.int_attribute("end").is_none()
            && slice.inputs.len() >= 3
            && self.constant_is(slice.inputs[1], &[start])
            && self.constant_is(slice.inputs[2], &[end])
            && optional(3, 0)
            && optional(4, 1)
    }

    /// Static `[heads, head_size]` of a BSNH value, from its declared dims or its BNSH transpose's.
    fn heads(&self, bsnh: &str, bnsh: Option<&str>) -> Option<(u64, u64)> {
        let from = |name: &str, heads: usize| {
            let dims = self.dims.get(name).filter(|d| d.len() == 4)?;
            Some((dims[heads]?, dims[3]?))
        };
        from(bsnh, 2).or_else(|| bnsh.and_then(|b| from(b, 1)))
    }

    /// The attention whose softmax is node `index`, if every part of it is as [`fuse_attention`] needs.
    fn attention(&self, index: usize) -> Option<Attention<'a>> {
        let softmax = &self.nodes[index];
        let axis = softmax.int_attribute("axis").map(|a| a as i64);
        if !softmax.is_onnx("Softmax") || !matches!(axis, Some(-1 | 3)) {
            return None;
        }
        let (scores, post_scale) = self.unscaled(softmax.inputs[0]);
        let product = self.producer.get(scores).copied()?;
        let qk = &self.nodes[product];
        if !qk.is_onnx("MatMul") || self.only_consumer(scores).is_none() {
            return None;
        }
        let (query_bnsh, query_scale) = self.unscaled(qk.inputs[0]);
        let (key_t, key_scale) = self.unscaled(qk.inputs[1]);
        let query = self.transposed_from(query_bnsh, &SWAP_SEQUENCE_AND_HEADS)?;
        let key = self.key_transposed(key_t)?;

        let weighted = self.only_consumer(softmax.outputs[0])?;
        let pv = &self.nodes[weighted];
        if !pv.is_onnx("MatMul") || pv.inputs[0] != softmax.outputs[0] {
            return None;
        }
        let value_bnsh = pv.inputs[1];
        let value = self.transposed_from(value_bnsh, &SWAP_SEQUENCE_AND_HEADS)?;
        let replaced = self.only_consumer(pv.outputs[0])?;
        let back = &self.nodes[replaced];
        if !(back.is_onnx("Transpose") && back.ints_attribute("perm")? == SWAP_SEQUENCE_AND_HEADS) {
            return None;
        }

        let (heads, head_size) = self.heads(query, Some(query_bnsh))?;
        let same = |bsnh: &str, bnsh: Option<&str>| self.heads(bsnh, bnsh) == Some((heads, head_size));
        if !(same(key, None) && same(value, Some(value_bnsh))) || heads == 0 || head_size == 0 {
            return None;
        }
        Some(Attention {
            query,
            key,
            value,
            output: back.outputs[0],
            heads,
            head_size,
            scale: query_scale * key_scale * post_scale,
            replaced,
            removed: [product, index, weighted],
            post_scale: (scores != softmax.inputs[0]).then(|| self.producer[softmax.inputs[0]]),
        })
    }
}

/// A piece of a shape built by `Concat`.
enum Part<'p> {
    Constant(&'p [i64]),
    /// `Shape(key)[start..end]`.
    Dims(i64, i64),
}

impl NewNode {
    /// `MultiHeadAttention` over BSD query, key and value. It declares the present key and value too:
    /// ONNX Runtime's WebGPU kernel takes its flash-attention path only when they are asked for (in
    /// the versions that check), and they cost one copy of the key and value.
    fn attention(prefix: &str, inputs: [&str; 3], output: &str, a: &Attention) -> NewNode {
        let present_key = format!("{prefix}present_key");
        let present_value = format!("{prefix}present_value");
        let mut scale = bytes_field(ATTR_NAME, b"scale");
        let mut bits = Vec::new();
        wire::put_varint(&mut bits, (ATTR_F << 3) | 5); // fixed32
        bits.extend_from_slice(&(a.scale as f32).to_le_bytes());
        scale.extend(bits);
        scale.extend(varint_field(ATTR_TYPE, ATTR_TYPE_FLOAT));
        NewNode::new(
            output,
            (MS_DOMAIN, "MultiHeadAttention"),
            &inputs,
            &[output, &present_key, &present_value],
            vec![int_attribute("num_heads", a.heads), scale],
        )
    }
}

/// Whether the model imports the operator set `domain`.
fn imports(fields: &[Field], domain: &str) -> Result<bool, RewriteError> {
    for f in fields.iter().filter(|f| f.number == MODEL_OPSET_IMPORT) {
        for g in wire::parse(f.bytes("ModelProto")?, "OperatorSetIdProto")? {
            if g.number == OPSET_DOMAIN && g.string("OperatorSetIdProto")? == domain {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

//! The attention computed in chunks of queries: each chunk's scores under ONNX Runtime Web's largest
//! cached buffer, so that they are reused rather than piled up (see `crate::gpu_memory`).

use super::*;
use crate::graph::nodes::{initializer_name, with_values};
use crate::graph::proto::{value_info_name, Node};

/// The first default-domain opset with `Split`'s `num_outputs` (parts of `ceil(n / C)`, the last
/// smaller): one node, no shape arithmetic.
const SPLIT_NUM_OUTPUTS_OPSET: u64 = 18;

/// The first with `Slice`, `Split` and the rest of the fallback's operators taking their inputs as now.
const SLICE_OPSET: u64 = 13;

/// The axis of the query's rows in `[batch, heads, sequence, head_size]`.
const SEQUENCE_AXIS: u64 = 2;

/// `model` with every attention [`fuse_attention`]'s finder proves computed in `chunks` parts along
/// the query's sequence axis, and how many; the model as it was and 0 when `chunks <= 1`, there is none,
/// or the default opset is older than 13.
///
/// The query `[batch, heads, sequence, head_size]` as the first `MatMul` reads it is cut along the
/// sequence: `Split` with `num_outputs` from opset 18 (ORT's kernels cut parts of `ceil(n / C)`, as ONNX
/// defines it whenever `n > (C - 1)^2`), `Slice`s of the same rows from `Shape` for opsets 13 to 17.
/// Each part goes through copies of the first `MatMul`, the scaling, `Softmax` and the `MatMul` with
/// the value (the key's and value's side stay as they are), and `Concat` puts the parts back under the
/// name the rest of the graph reads. Softmax is per query row, so it is the same function, with scores
/// `chunks` times smaller; [`chunks_for`] picks `chunks` so that they fit [`ORT_LARGEST_CACHED_BUFFER`].
pub fn chunk_attention(model: &[u8], chunks: u32) -> Result<(Vec<u8>, usize), RewriteError> {
    if chunks <= 1 {
        return Ok((model.to_vec(), 0));
    }
    let fields = wire::parse(model, "ModelProto")?;
    let opset = default_opset(&fields)?;
    let graph_bytes = model_graph(&fields)?;
    let graph_fields = wire::parse(graph_bytes, GRAPH_PROTO)?;
    let graph = Graph::read(&graph_fields)?;
    let found = find_attentions(&graph);
    if found.is_empty() || opset < SLICE_OPSET {
        return Ok((model.to_vec(), 0));
    }
    let chunking = Chunking {
        base: free_prefix(&graph, &graph_fields)?,
        chunks,
        split: opset >= SPLIT_NUM_OUTPUTS_OPSET,
    };
    let tensors = if chunking.split { Vec::new() } else { chunking.fallback_constants() };
    let (nodes, removed) = chunking.nodes(&graph, &found)?;
    // The scores and their weights no longer exist under their names.
    let gone: HashSet<&str> = removed.iter().flat_map(|&i| graph.nodes[i].outputs.iter().copied()).collect();
    let out = write_chunked(&graph_fields, &nodes, &tensors, &gone, graph_bytes.len())?;
    Ok((with_graph(&fields, &out), found.len()))
}

/// A prefix that no name of the graph (node, value, initializer, declared value) starts with, which
/// every new name starts with.
fn free_prefix(graph: &Graph, graph_fields: &[Field]) -> Result<String, RewriteError> {
    let mut names: Vec<&str> = graph.nodes.iter().map(|n| n.name).collect();
    names.extend(graph.producer.keys().chain(graph.consumers.keys()));
    for f in graph_fields {
        match f.number {
            GRAPH_INITIALIZER => names.push(initializer_name(f.bytes(GRAPH_PROTO)?)?),
            GRAPH_INPUT | GRAPH_OUTPUT | GRAPH_VALUE_INFO => {
                names.push(value_info_name(f.bytes(GRAPH_PROTO)?)?)
            }
            _ => {}
        }
    }
    Ok((0..)
        .map(|n| if n == 0 { "imagine_chunks".to_owned() } else { format!("imagine_chunks_{n}") })
        .find(|base| !names.iter().any(|name| name.starts_with(base.as_str())))
        .expect("some prefix is free"))
}

/// How the attentions of one graph are cut.
struct Chunking {
    /// The prefix of every new name.
    base: String,
    chunks: u32,
    /// One `Split` cuts each query (opset 18 on), or else the fallback's `Slice`s.
    split: bool,
}

impl Chunking {
    /// The fallback's constants, shared by every attention: ends are the next part's start.
    fn fallback_constants(&self) -> Vec<Vec<u8>> {
        let (base, c) = (&self.base, i64::from(self.chunks));
        let mut tensors = vec![
            int64s_tensor(&format!("{base}/axis"), &[SEQUENCE_AXIS as i64]),
            int64s_tensor(&format!("{base}/round_up"), &[c - 1]),
            int64s_tensor(&format!("{base}/chunks"), &[c]),
            int64s_tensor(&format!("{base}/zero"), &[0]),
            int64s_tensor(&format!("{base}/end"), &[i64::MAX]),
        ];
        for i in 1..c {
            tensors.push(int64s_tensor(&format!("{base}/times_{i}"), &[i]));
        }
        tensors
    }

    /// The new node list, each attention chunked where its weighted sum was; and the indices of the
    /// nodes that went (the first product, the scaling, the softmax).
    fn nodes(
        &self,
        graph: &Graph,
        found: &[Attention],
    ) -> Result<(Vec<Vec<u8>>, HashSet<usize>), RewriteError> {
        let mut at: HashMap<usize, (usize, &Attention)> = HashMap::new();
        let mut removed: HashSet<usize> = HashSet::new();
        for (k, a) in found.iter().enumerate() {
            let [product, softmax, weighted] = a.removed;
            at.insert(weighted, (k, a));
            removed.extend([product, softmax].into_iter().chain(a.post_scale));
        }
        let mut nodes: Vec<Vec<u8>> =
            Vec::with_capacity(graph.nodes.len() + found.len() * (4 * self.chunks as usize + 8));
        for (index, node) in graph.nodes.iter().enumerate() {
            if let Some(&(k, a)) = at.get(&index) {
                self.push_chunked(&mut nodes, graph, &format!("{}/{k}", self.base), a)?;
            } else if !removed.contains(&index) {
                nodes.push(node.bytes.to_vec());
            }
        }
        Ok((nodes, removed))
    }

    /// One attention's nodes: its query cut in parts, each part through copies of the original nodes,
    /// and the parts' results concatenated under the old output's name.
    fn push_chunked(
        &self,
        nodes: &mut Vec<Vec<u8>>,
        graph: &Graph,
        prefix: &str,
        a: &Attention,
    ) -> Result<(), RewriteError> {
        let query = graph.nodes[a.removed[0]].inputs[0];
        let parts: Vec<String> = (0..self.chunks).map(|i| format!("{prefix}/part_{i}/{query}")).collect();
        let part_names: Vec<&str> = parts.iter().map(String::as_str).collect();
        if self.split {
            let attributes = vec![
                int_attribute("axis", SEQUENCE_AXIS),
                int_attribute("num_outputs", u64::from(self.chunks)),
            ];
            let split =
                NewNode::new(&format!("{prefix}/split"), ("", "Split"), &[query], &part_names, attributes);
            nodes.push(split.bytes);
        } else {
            nodes.extend(slices(&self.base, prefix, query, &part_names));
        }
        let chain: Vec<&Node> = [a.removed[0]]
            .into_iter()
            .chain(a.post_scale)
            .chain([a.removed[1], a.removed[2]])
            .map(|i| &graph.nodes[i])
            .collect();
        let output = graph.nodes[a.removed[2]].outputs[0];
        let mut results = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            results.push(part_through(nodes, &chain, query, part, &format!("{prefix}/part_{i}"), output)?);
        }
        let results: Vec<&str> = results.iter().map(String::as_str).collect();
        let axis = vec![int_attribute("axis", SEQUENCE_AXIS)];
        nodes
            .push(NewNode::new(&format!("{prefix}/concat"), ("", "Concat"), &results, &[output], axis).bytes);
        Ok(())
    }
}

/// Copies of the `chain` of nodes for one part of the query, their values renamed under `prefix`;
/// the name `output` has in the copies.
fn part_through(
    nodes: &mut Vec<Vec<u8>>,
    chain: &[&Node],
    query: &str,
    part: &str,
    prefix: &str,
    output: &str,
) -> Result<String, RewriteError> {
    // The query is renamed where the first product reads it only: the value may be the same tensor.
    let mut renamed: HashMap<&str, String> = HashMap::from([(query, part.to_owned())]);
    for n in chain {
        for o in &n.outputs {
            renamed.insert(o, format!("{prefix}/{o}"));
        }
        nodes.push(with_values(n, &renamed[n.outputs[0]], &renamed)?);
        renamed.remove(query);
    }
    Ok(renamed[output].clone())
}

/// The GraphProto with `nodes` in place of its nodes, without the declared shapes of the `gone`
/// values, and `tensors` added.
fn write_chunked(
    graph_fields: &[Field],
    nodes: &[Vec<u8>],
    tensors: &[Vec<u8>],
    gone: &HashSet<&str>,
    graph_len: usize,
) -> Result<Vec<u8>, RewriteError> {
    let mut out = Vec::with_capacity(graph_len + nodes.iter().map(Vec::len).sum::<usize>());
    let mut nodes_written = false;
    for f in graph_fields {
        match f.number {
            GRAPH_NODE if !nodes_written => {
                for n in nodes {
                    wire::put_bytes_field(&mut out, GRAPH_NODE, n);
                }
                nodes_written = true;
            }
            GRAPH_NODE => {}
            GRAPH_VALUE_INFO if gone.contains(value_info_name(f.bytes(GRAPH_PROTO)?)?) => {}
            _ => out.extend_from_slice(f.raw),
        }
    }
    for t in tensors {
        wire::put_bytes_field(&mut out, GRAPH_INITIALIZER, t);
    }
    Ok(out)
}

/// `Slice`s of `query` into `parts` along the sequence axis, as `Split` with `num_outputs` cuts it:
/// parts of `ceil(n / C)` rows from `Shape(query)`, the last to the end.
fn slices(base: &str, prefix: &str, query: &str, parts: &[&str]) -> Vec<Vec<u8>> {
    let value = |v: &str| format!("{prefix}/{v}");
    let constant = |v: &str| format!("{base}/{v}");
    let node = |op: &str, inputs: &[&str], output: &str, attributes| {
        NewNode::new(output, ("", op), inputs, &[output], attributes).bytes
    };
    let (shape, length, rounded, size) = (value("shape"), value("length"), value("rounded"), value("size"));
    let mut nodes = vec![
        node("Shape", &[query], &shape, vec![]),
        node("Gather", &[&shape, &constant("axis")], &length, vec![]),
        node("Add", &[&length, &constant("round_up")], &rounded, vec![]),
        node("Div", &[&rounded, &constant("chunks")], &size, vec![]),
    ];
    let mut starts = vec![constant("zero")];
    for i in 1..parts.len() {
        let start = value(&format!("start_{i}"));
        nodes.push(node("Mul", &[&size, &constant(&format!("times_{i}"))], &start, vec![]));
        starts.push(start);
    }
    let end = constant("end");
    for (i, part) in parts.iter().enumerate() {
        let stop = starts.get(i + 1).unwrap_or(&end);
        nodes.push(node("Slice", &[query, &starts[i], stop, &constant("axis")], part, vec![]));
    }
    nodes
}

/// The largest bucket of ONNX Runtime Web's WebGPU buffer cache (160 MiB): larger buffers are created
/// and destroyed at every use instead of reused.
pub const ORT_LARGEST_CACHED_BUFFER: u64 = 167_772_160;

/// The fewest chunks `C` that keep one chunk's scores, `heads x ceil(tokens / C) x tokens` elements of
/// `bytes_per_element`, at or under `max_scores_bytes`; `tokens` (a row a chunk) when even one row is
/// over, 1 when there is nothing to cut.
pub fn chunks_for(heads: u64, tokens: u64, bytes_per_element: u64, max_scores_bytes: u64) -> u32 {
    let row = u128::from(heads) * u128::from(tokens) * u128::from(bytes_per_element);
    if row == 0 {
        return 1;
    }
    // ceil(tokens / C) <= rows exactly when C >= ceil(tokens / rows).
    let rows = (u128::from(max_scores_bytes) / row).max(1);
    u32::try_from(u128::from(tokens).div_ceil(rows)).unwrap_or(u32::MAX)
}

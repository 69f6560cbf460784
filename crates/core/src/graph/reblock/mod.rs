//! `MatMulNBits` re-blocked to 32 for ONNX Runtime Web's WebGPU kernels.
//!
//! ONNX Runtime Web (1.30) has a tiled WebGPU kernel for `MatMulNBits` on inputs of 4 rows or more (a
//! prompt's tokens, an image's latents) only for block size 32. Any other block falls back to a kernel
//! made for one row at a time (a workgroup for every row and 8 output columns), many times slower
//! (BENCHMARKS.md, "`MatMulNBits` re-blocked to 32"); the published pack and the exporter use block 128.
//! The edit is exact: each block of 32 takes the scale and zero point of the block it was part of, so
//! every node computes the same function, and the pack's own files never change.
//!
//! The form a stage loads is made once, when a pack is installed for WebGPU, checked and stored beside
//! it ([`ReblockedGraph`], [`ReblockedRecord`], [`stored_bytes`] for the space check); a graph the record
//! does not name is re-blocked as it loads ([`ReblockedRecord::form`]). The wasm backend is left alone:
//! its kernels have no such cliff. Tests: `graph/tests/reblock.rs` and
//! `tools/export/tests/test_matmul_blocks.py` (the re-blocked tiny graphs against the originals on ORT).

use std::collections::{HashMap, HashSet};

use super::proto::{
    bytes_field, edit_message, model_graph, read_node, read_tensor, value_info_name, varint_field,
    with_graph, Edit, Node, Tensor,
};
use super::RewriteError;
use crate::onnx::fields::*;
use crate::onnx::wire;

mod added;
mod stored;
use added::Added;
pub use stored::*;

/// The block size ONNX Runtime Web's tiled WebGPU kernel takes.
pub const TARGET_BLOCK: u64 = 32;

/// The external-data location of the scales and zero points
/// [`crate::graph::reblock::to_block_32_computed`] computes when they are handed to ONNX Runtime from
/// memory: a file of the edited graph's own.
pub const COMPUTED_DATA: &str = "imagine-block32.data";

/// Where each tensor starts in the computed data: a multiple of this.
const COMPUTED_ALIGN: u64 = 64;

/// A range of bytes of a graph's external data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DataRange {
    /// The location the graph names (its external-data `location`).
    pub location: String,
    /// The first byte, in that file.
    pub offset: u64,
    /// How many bytes.
    pub length: u64,
}

/// A graph re-blocked by [`crate::graph::reblock::to_block_32_computed`].
#[derive(Debug)]
pub struct Reblocked {
    /// The edited ModelProto.
    pub graph: Vec<u8>,
    /// How many bytes of computed data were written (0 when nothing was computed).
    pub data_length: u64,
    /// How many `MatMulNBits` changed.
    pub changed: usize,
}

/// The default-domain opset the added nodes need (Slice, Reshape and Expand as inputs-driven ops).
const MIN_OPSET: u64 = 13;

/// Rewrites every `MatMulNBits` of `model` (a ModelProto) whose block size is a power of two above 32
/// to block 32, exactly; the new model and how many nodes changed. The model comes back as it was
/// (and 0) when no node qualifies. The repeated scales and zero points are computed by nodes added in
/// front of the graph.
///
/// B keeps its bytes: a block of 32 is the old block cut in pieces, so when K is a multiple of the old
/// block only B's dims change (`[N, K / 32, 4 * bits]`) and its external data is read as before;
/// otherwise (only the tiny test graphs, whose K can be 64) a Reshape and a Slice drop the padding at
/// the end of each column. Each scale and zero point is repeated once per block of 32 of its old block
/// (4-bit zero points unpacked first) by nodes (Reshape, Expand, Reshape, Slice) that ONNX Runtime's
/// constant folding computes while it creates the session: seconds on ORT Web's single-threaded wasm,
/// on the path of a cold image, hence [`to_block_32_computed`] for the stored form.
///
/// Nodes it cannot prove it handles stay as they are: 2-bit weights, `g_idx`, a B that is not a uint8
/// initializer of the documented shape or that another node reads too, scales or zero points that are
/// not initializers of one value per block.
pub fn to_block_32(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    let reblocked = rewrite(model, None)?;
    Ok((reblocked.graph, reblocked.changed))
}

/// The external-data ranges [`to_block_32_computed`] reads: the scales and zero points of every node it
/// re-blocks that are stored outside the graph.
pub fn sources_to_read(model: &[u8]) -> Result<Vec<DataRange>, RewriteError> {
    let mut wanted = Vec::new();
    rewrite(model, Some(&mut Sources::Listing(&mut wanted)))?;
    Ok(wanted)
}

/// As [`to_block_32`], but the repeated scales and zero points are computed here, from their stored
/// values (`read`: the bytes of each range [`sources_to_read`] listed; inline ones from the graph), into
/// tensors of the external-data file `location`, whose bytes go to `write` in order. An input whose
/// bytes are missing, of another length, or not raw bytes is repeated by nodes as in [`to_block_32`].
/// ORT reads the computed tensors (4 times the stored ones, from block 128) as one more external-data
/// file, so nothing is folded while the session is created.
pub fn to_block_32_computed(
    model: &[u8],
    read: &HashMap<DataRange, Vec<u8>>,
    location: &str,
    write: &mut dyn FnMut(&[u8]),
) -> Result<Reblocked, RewriteError> {
    rewrite(model, Some(&mut Sources::Reading { read, data: ComputedData { location, write, length: 0 } }))
}

/// Where repeated scales and zero points come from when not from nodes.
enum Sources<'s> {
    /// Only note the external ranges that would be read.
    Listing(&'s mut Vec<DataRange>),
    /// Computed from these bytes into `data`.
    Reading { read: &'s HashMap<DataRange, Vec<u8>>, data: ComputedData<'s> },
}

/// The bytes of the computed data file, as they are written.
struct ComputedData<'s> {
    /// The file's external-data location in the edited graph.
    location: &'s str,
    write: &'s mut dyn FnMut(&[u8]),
    length: u64,
}

impl ComputedData<'_> {
    /// Appends `values` at the next aligned offset; that offset.
    fn append(&mut self, values: &[u8]) -> u64 {
        let offset = self.length.next_multiple_of(COMPUTED_ALIGN);
        if offset > self.length {
            (self.write)(&[0; COMPUTED_ALIGN as usize][..(offset - self.length) as usize]);
        }
        (self.write)(values);
        self.length = offset + values.len() as u64;
        offset
    }
}

const GRAPH_PROTO: &str = "GraphProto";

/// What [`to_block_32`], [`sources_to_read`] and [`to_block_32_computed`] share: `sources` says
/// where repeated scales and zero points come from (`None`: from added nodes).
fn rewrite(model: &[u8], mut sources: Option<&mut Sources>) -> Result<Reblocked, RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let graph = model_graph(&fields)?;
    let unchanged = || Reblocked { graph: model.to_vec(), data_length: 0, changed: 0 };
    if default_opset(&fields)? < MIN_OPSET {
        return Ok(unchanged());
    }
    let graph_fields = wire::parse(graph, GRAPH_PROTO)?;
    let read = Read::of(&graph_fields)?;
    let edits = reblock_nodes(&read, &mut sources)?;
    if edits.nodes.is_empty() {
        return Ok(unchanged());
    }
    let out = edits.write(&graph_fields, &read.tensors, graph.len())?;
    let data_length = match sources {
        Some(Sources::Reading { data, .. }) => data.length,
        _ => 0,
    };
    Ok(Reblocked { graph: with_graph(&fields, &out), data_length, changed: edits.nodes.len() })
}

/// What the rewrite reads of a GraphProto.
struct Read<'a> {
    nodes: Vec<Node<'a>>,
    /// The initializers, in graph order.
    tensors: Vec<Tensor>,
    /// Each initializer's TensorProto bytes, by name.
    tensor_bytes: HashMap<String, &'a [u8]>,
    /// The names of the graph's inputs and outputs.
    graph_io: HashSet<&'a str>,
}

impl<'a> Read<'a> {
    fn of(graph_fields: &[wire::Field<'a>]) -> Result<Read<'a>, RewriteError> {
        let mut read = Read {
            nodes: Vec::new(),
            tensors: Vec::new(),
            tensor_bytes: HashMap::new(),
            graph_io: HashSet::new(),
        };
        for f in graph_fields {
            match f.number {
                GRAPH_NODE => read.nodes.push(read_node(f.bytes(GRAPH_PROTO)?, read.nodes.len())?),
                GRAPH_INITIALIZER => {
                    let bytes = f.bytes(GRAPH_PROTO)?;
                    let tensor = read_tensor(bytes)?;
                    read.tensor_bytes.insert(tensor.name.clone(), bytes);
                    read.tensors.push(tensor);
                }
                GRAPH_INPUT | GRAPH_OUTPUT => {
                    read.graph_io.insert(value_info_name(f.bytes(GRAPH_PROTO)?)?);
                }
                _ => {}
            }
        }
        Ok(read)
    }
}

/// What re-blocking changes in a graph.
#[derive(Default)]
struct Edits<'a> {
    added: Added,
    /// The re-blocked nodes' new NodeProtos, by node index.
    nodes: HashMap<usize, Vec<u8>>,
    /// The new dims of each B that keeps its bytes, by name.
    new_dims: HashMap<&'a str, [u64; 3]>,
}

/// Re-blocks every node [`Plan::of`] accepts, in graph order (the order of the added nodes and
/// computed data).
fn reblock_nodes<'a>(read: &Read<'a>, sources: &mut Option<&mut Sources>) -> Result<Edits<'a>, RewriteError> {
    let initializers: HashMap<&str, &Tensor> = read.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for name in read.nodes.iter().flat_map(|n| n.inputs.iter()) {
        *readers.entry(name).or_default() += 1;
    }
    let exclusive = |name: &str| readers.get(name) == Some(&1) && !read.graph_io.contains(name);
    let mut edits = Edits::default();
    for node in &read.nodes {
        let Some(plan) = Plan::of(node, &initializers) else { continue };
        let at = Reblocking {
            node,
            prefix: format!("imagine_block32_{}_", node.index),
            plan,
            initializers: &initializers,
            tensor_bytes: &read.tensor_bytes,
        };
        let Some(b) = edits.reblock_b(&at, exclusive(node.inputs[1])) else { continue };
        let mut inputs: Vec<String> = node.inputs.iter().map(|i| (*i).to_owned()).collect();
        inputs[1] = b;
        let computed_scales = at.computed(2, Layout::Scales, sources, &mut edits.added);
        let computed_zero_points = at
            .plan
            .zero_points
            .and_then(|z| at.computed(3, Layout::ZeroPoints(z), sources, &mut edits.added));
        inputs[2] = match computed_scales {
            Some(name) => name,
            None => at.repeated_scales(&mut edits.added),
        };
        if let Some(name) = computed_zero_points {
            inputs[3] = name;
        } else if let Some(zero_points) = at.plan.zero_points {
            inputs[3] = at.repeated_zero_points(zero_points, &mut edits.added);
        }
        edits.nodes.insert(node.index, edit_node(node, &inputs)?);
    }
    Ok(edits)
}

/// One node being re-blocked, and what its inputs are read from.
struct Reblocking<'r, 'a> {
    node: &'r Node<'a>,
    /// The start of the names of everything added for the node.
    prefix: String,
    plan: Plan,
    initializers: &'r HashMap<&'r str, &'r Tensor>,
    tensor_bytes: &'r HashMap<String, &'a [u8]>,
}

impl<'a> Edits<'a> {
    /// B's new name, or `None` when the node stays as it is: where K is a multiple of the old block
    /// only B's dims change, which needs B read by this node alone (`exclusive`).
    fn reblock_b(&mut self, at: &Reblocking<'_, 'a>, exclusive: bool) -> Option<String> {
        let (node, plan, prefix) = (at.node, &at.plan, at.prefix.as_str());
        let b = node.inputs[1];
        if plan.blocks * plan.ratio == plan.blocks_32 {
            // B keeps its bytes: blocks of 32 are the blocks of the old size cut in `ratio`.
            if !exclusive {
                return None;
            }
            self.new_dims.insert(b, [plan.n, plan.blocks_32, plan.blob_32()]);
            Some(b.to_owned())
        } else {
            // K is not a multiple of the old block: drop each row's padding past K.
            let added = &mut self.added;
            let rows = added.reshape(prefix, "b_rows", b, &[plan.n, plan.blocks * plan.blob()]);
            let kept = added.slice_columns(prefix, "b_kept", &rows, plan.blocks_32 * plan.blob_32());
            Some(added.reshape(prefix, "b", &kept, &[plan.n, plan.blocks_32, plan.blob_32()]))
        }
    }

    /// The GraphProto with the edits: the added nodes before the first node, the re-blocked nodes and
    /// Bs in place, the added initializers last.
    fn write(
        &self,
        graph_fields: &[wire::Field],
        tensors: &[Tensor],
        graph_len: usize,
    ) -> Result<Vec<u8>, RewriteError> {
        let added = &self.added;
        let mut out = Vec::with_capacity(graph_len + added.nodes.iter().map(Vec::len).sum::<usize>());
        let (mut node_index, mut tensor_index, mut added_written) = (0, 0, false);
        for f in graph_fields {
            match f.number {
                GRAPH_NODE => {
                    // The added nodes read only constants: before every other node keeps the order topological.
                    if !added_written {
                        for n in &added.nodes {
                            wire::put_bytes_field(&mut out, GRAPH_NODE, n);
                        }
                        added_written = true;
                    }
                    match self.nodes.get(&node_index) {
                        Some(n) => wire::put_bytes_field(&mut out, GRAPH_NODE, n),
                        None => out.extend_from_slice(f.raw),
                    }
                    node_index += 1;
                }
                GRAPH_INITIALIZER => {
                    match self.new_dims.get(tensors[tensor_index].name.as_str()) {
                        Some(dims) => wire::put_bytes_field(
                            &mut out,
                            GRAPH_INITIALIZER,
                            &with_dims(f.bytes(GRAPH_PROTO)?, dims)?,
                        ),
                        None => out.extend_from_slice(f.raw),
                    }
                    tensor_index += 1;
                }
                _ => out.extend_from_slice(f.raw),
            }
        }
        for t in &added.tensors {
            wire::put_bytes_field(&mut out, GRAPH_INITIALIZER, t);
        }
        Ok(out)
    }
}

impl Reblocking<'_, '_> {
    /// Input `input` re-blocked here from its stored values into the computed data; its name. `None`
    /// where nodes must repeat it: no `sources`, only listing them (the external range is noted), or
    /// bytes that are not raw or not at hand.
    fn computed(
        &self,
        input: usize,
        layout: Layout,
        sources: &mut Option<&mut Sources>,
        added: &mut Added,
    ) -> Option<String> {
        let (plan, name) = (&self.plan, self.node.inputs[input]);
        let stored = Stored::of(self.initializers.get(name)?, self.tensor_bytes.get(name)?)?;
        match sources.as_deref_mut()? {
            Sources::Listing(wanted) => {
                if let Stored::External(range) = stored {
                    wanted.push(range);
                }
                None
            }
            Sources::Reading { read, data } => {
                let bytes = match &stored {
                    Stored::Inline(bytes) => bytes,
                    Stored::External(range) => read.get(range)?.as_slice(),
                };
                let (data_type, values) =
                    layout.compute(bytes, plan, self.initializers.get(name)?.data_type)?;
                let dims = [plan.n, layout.keep(plan)];
                Some(added.computed(&self.prefix, layout.name(), data_type, &dims, values, data))
            }
        }
    }

    /// The scales repeated by added nodes, each once per block of 32 of its old block.
    fn repeated_scales(&self, added: &mut Added) -> String {
        let plan = &self.plan;
        added.repeat_blocks(&self.prefix, "scales", self.node.inputs[2], plan, plan.ratio, plan.blocks_32)
    }

    /// The zero points repeated by added nodes, as the scales are (4-bit ones unpacked first).
    fn repeated_zero_points(&self, zero_points: ZeroPoints, added: &mut Added) -> String {
        let (plan, prefix, input) = (&self.plan, self.prefix.as_str(), self.node.inputs[3]);
        match zero_points {
            ZeroPoints::Packed4 => {
                // Each 32-block's nibble is its old block's, and `ratio` is even: a byte of the new
                // zero points holds two nibbles of the same old block, `z | z << 4`.
                let z = added.unpack_nibbles(prefix, input, plan);
                added.repeat_blocks(
                    prefix,
                    "zero_points",
                    &z,
                    plan,
                    plan.ratio / 2,
                    plan.blocks_32.div_ceil(2),
                )
            }
            ZeroPoints::PerBlock => {
                added.repeat_blocks(prefix, "zero_points", input, plan, plan.ratio, plan.blocks_32)
            }
        }
    }
}

/// Where an initializer's bytes are.
enum Stored<'a> {
    Inline(&'a [u8]),
    External(DataRange),
}

impl<'a> Stored<'a> {
    /// `tensor`'s bytes, when they are raw (inline `raw_data`, or external with the length its shape
    /// and type give); `None` for typed fields, segments and unknown types.
    fn of(tensor: &Tensor, bytes: &'a [u8]) -> Option<Stored<'a>> {
        let length =
            tensor.dims.iter().try_fold(element_size(tensor.data_type)?, |n, &d| n.checked_mul(d))?;
        if tensor.segmented {
            return None;
        }
        match &tensor.external {
            Some(e) if e.length.is_none_or(|l| l == length) => {
                Some(Stored::External(DataRange { location: e.file.clone(), offset: e.offset, length }))
            }
            Some(_) => None,
            None => {
                let fields = wire::parse(bytes, "TensorProto").ok()?;
                let raw = fields.iter().find(|f| f.number == TENSOR_RAW_DATA)?.bytes("TensorProto").ok()?;
                (raw.len() as u64 == length).then_some(Stored::Inline(raw))
            }
        }
    }
}

pub(super) fn element_size(data_type: u64) -> Option<u64> {
    match data_type {
        UINT8 | INT8 => Some(1),
        FLOAT16 | BFLOAT16 => Some(2),
        FLOAT => Some(4),
        DOUBLE => Some(8),
        _ => None,
    }
}

/// What a computed input of a re-blocked node holds.
#[derive(Clone, Copy)]
enum Layout {
    /// One scale per block.
    Scales,
    ZeroPoints(ZeroPoints),
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Scales => "scales",
            Layout::ZeroPoints(_) => "zero_points",
        }
    }

    /// Values per column after re-blocking.
    fn keep(self, plan: &Plan) -> u64 {
        match self {
            Layout::ZeroPoints(ZeroPoints::Packed4) => plan.blocks_32.div_ceil(2),
            _ => plan.blocks_32,
        }
    }

    /// The re-blocked values from the stored ones (`bytes`, of `data_type`), as the nodes of
    /// [`Added::repeat_blocks`] and [`Added::unpack_nibbles`] compute them; `None` when `bytes` do not
    /// have the plan's size.
    fn compute(self, bytes: &[u8], plan: &Plan, data_type: u64) -> Option<(u64, Vec<u8>)> {
        let (n, blocks) = (plan.n as usize, plan.blocks as usize);
        let keep = self.keep(plan) as usize;
        match self {
            Layout::ZeroPoints(ZeroPoints::Packed4) => {
                // Each new byte holds two blocks of 32 of the same old block: its nibble twice, `z * 17`.
                let stored = blocks.div_ceil(2);
                if bytes.len() != n * stored {
                    return None;
                }
                let per_byte = plan.ratio as usize / 2;
                let mut out = Vec::with_capacity(n * keep);
                for column in bytes.chunks_exact(stored) {
                    out.extend((0..keep).map(|m| {
                        let old = m / per_byte;
                        let nibble = (column[old / 2] >> (4 * (old % 2))) & 0x0f;
                        nibble * 17
                    }));
                }
                Some((UINT8, out))
            }
            Layout::Scales | Layout::ZeroPoints(ZeroPoints::PerBlock) => {
                let size = element_size(data_type)? as usize;
                if bytes.len() != n * blocks * size {
                    return None;
                }
                let ratio = plan.ratio as usize;
                let mut out = Vec::with_capacity(n * keep * size);
                for column in bytes.chunks_exact(blocks * size) {
                    for j in 0..keep {
                        let old = j / ratio * size;
                        out.extend_from_slice(&column[old..old + size]);
                    }
                }
                Some((data_type, out))
            }
        }
    }
}

/// `model` with `accuracy_level` `level` on every `MatMulNBits` (ONNX Runtime's compute type for it:
/// 4 quantizes the activations to int8), and how many nodes that is.
pub fn with_accuracy_level(model: &[u8], level: u8) -> Result<(Vec<u8>, usize), RewriteError> {
    let level = u64::from(level);
    const WHAT: &str = "GraphProto";
    let fields = wire::parse(model, "ModelProto")?;
    let graph = model_graph(&fields)?;
    let mut out = Vec::with_capacity(graph.len() + 64);
    let mut changed = 0;
    for (index, f) in wire::parse(graph, WHAT)?.iter().enumerate() {
        let node = match f.number {
            GRAPH_NODE => Some(read_node(f.bytes(WHAT)?, index)?),
            _ => None,
        };
        match node {
            Some(node) if node.domain == "com.microsoft" && node.op_type == "MatMulNBits" => {
                let mut attributes = node.attributes.iter();
                let edited = edit_message(node.bytes, "NodeProto", |g| {
                    Ok(match g.number {
                        NODE_ATTRIBUTE if attributes.next().is_some_and(|a| a.name == "accuracy_level") => {
                            Edit::Drop
                        }
                        _ => Edit::Keep,
                    })
                })?;
                let mut edited = edited.unwrap_or_else(|| node.bytes.to_vec());
                wire::put_bytes_field(&mut edited, NODE_ATTRIBUTE, &int_attribute("accuracy_level", level));
                wire::put_bytes_field(&mut out, GRAPH_NODE, &edited);
                changed += 1;
            }
            _ => out.extend_from_slice(f.raw),
        }
    }
    if changed == 0 {
        return Ok((model.to_vec(), 0));
    }
    Ok((with_graph(&fields, &out), changed))
}

/// The version of the default ONNX domain the model imports (0 when none is declared).
pub(super) fn default_opset(fields: &[wire::Field]) -> Result<u64, RewriteError> {
    const WHAT: &str = "OperatorSetIdProto";
    let mut version = 0;
    for f in fields.iter().filter(|f| f.number == MODEL_OPSET_IMPORT) {
        let (mut domain, mut v) = ("", 0);
        for g in wire::parse(f.bytes("ModelProto")?, WHAT)? {
            match g.number {
                OPSET_DOMAIN => domain = g.string(WHAT)?,
                OPSET_VERSION => v = g.varint(WHAT)?,
                _ => {}
            }
        }
        if matches!(domain, "" | "ai.onnx") {
            version = v;
        }
    }
    Ok(version)
}

/// How the zero points of a node are laid out.
#[derive(Clone, Copy)]
enum ZeroPoints {
    /// uint8, two 4-bit values a byte, each column's run padded to whole bytes.
    Packed4,
    /// One element per block: uint8 for 8 bits, or the scales' float type.
    PerBlock,
}

/// One `MatMulNBits` that can be re-blocked, and its sizes.
struct Plan {
    n: u64,
    bits: u64,
    block: u64,
    /// Blocks of the old size per column, and of 32.
    blocks: u64,
    blocks_32: u64,
    /// Blocks of 32 in one old block.
    ratio: u64,
    zero_points: Option<ZeroPoints>,
}

impl Plan {
    /// The plan for `node`, or `None` when it is not a `MatMulNBits` this rewrite handles (any other
    /// block size, 2 bits, `g_idx`, a B that is not a uint8 initializer of the documented shape, scales
    /// or zero points that are not initializers of one value per block).
    fn of(node: &Node, initializers: &HashMap<&str, &Tensor>) -> Option<Plan> {
        if node.domain != "com.microsoft" || node.op_type != "MatMulNBits" {
            return None;
        }
        let (k, n) = (node.int_attribute("K")?, node.int_attribute("N")?);
        let (bits, block) = (node.int_attribute("bits")?, node.int_attribute("block_size")?);
        if !matches!(bits, 4 | 8) || block <= TARGET_BLOCK || !block.is_power_of_two() || k == 0 || n == 0 {
            return None;
        }
        let present = |i: usize| node.inputs.get(i).copied().filter(|name| !name.is_empty());
        if present(4).is_some() || present(2).is_none() {
            return None;
        }
        let blocks = k.div_ceil(block);
        let plan = Plan {
            n,
            bits,
            block,
            blocks,
            blocks_32: k.div_ceil(TARGET_BLOCK),
            ratio: block / TARGET_BLOCK,
            zero_points: None,
        };
        let b = initializers.get(present(1)?)?;
        if b.data_type != UINT8 || b.dims != [n, blocks, plan.blob()] {
            return None;
        }
        // One value per block of each column (`per_column` of them), counted without overflow.
        let fits = |t: &Tensor, per_column: u64| {
            let elements = t.dims.iter().try_fold(1u64, |e, &d| e.checked_mul(d));
            elements.is_some() && elements == n.checked_mul(per_column)
        };
        if !fits(initializers.get(present(2)?)?, blocks) {
            return None;
        }
        let zero_points = match present(3) {
            None => None,
            Some(name) => {
                let z = initializers.get(name)?;
                let (layout, per_column) = match z.data_type {
                    UINT8 if bits == 4 => (ZeroPoints::Packed4, blocks.div_ceil(2)),
                    _ => (ZeroPoints::PerBlock, blocks),
                };
                if !fits(z, per_column) {
                    return None;
                }
                Some(layout)
            }
        };
        Some(Plan { zero_points, ..plan })
    }

    /// Bytes of one block of B, at the old size and at 32.
    fn blob(&self) -> u64 {
        self.block * self.bits / 8
    }

    fn blob_32(&self) -> u64 {
        TARGET_BLOCK * self.bits / 8
    }
}

pub(super) fn int_attribute(name: &str, value: u64) -> Vec<u8> {
    let mut a = bytes_field(ATTR_NAME, name.as_bytes());
    a.extend(varint_field(ATTR_I, value));
    a.extend(varint_field(ATTR_TYPE, ATTR_TYPE_INT));
    a
}

/// `node` with `inputs` in place of its inputs and `block_size` 32.
fn edit_node(node: &Node, inputs: &[String]) -> Result<Vec<u8>, RewriteError> {
    let mut inputs = inputs.iter();
    let mut attributes = node.attributes.iter();
    let edited = edit_message(node.bytes, "NodeProto", |f| {
        Ok(match f.number {
            NODE_INPUT => Edit::Replace(bytes_field(NODE_INPUT, inputs.next().map_or("", |i| i).as_bytes())),
            NODE_ATTRIBUTE if attributes.next().is_some_and(|a| a.name == "block_size") => {
                Edit::Replace(bytes_field(NODE_ATTRIBUTE, &int_attribute("block_size", TARGET_BLOCK)))
            }
            _ => Edit::Keep,
        })
    })?;
    Ok(edited.unwrap_or_else(|| node.bytes.to_vec()))
}

/// A TensorProto with `dims` in place of its dims.
fn with_dims(tensor: &[u8], dims: &[u64]) -> Result<Vec<u8>, RewriteError> {
    let mut out = edit_message(tensor, "TensorProto", |f| {
        Ok(if f.number == TENSOR_DIMS { Edit::Drop } else { Edit::Keep })
    })?
    .unwrap_or_else(|| tensor.to_vec());
    for d in dims {
        wire::put_varint_field(&mut out, TENSOR_DIMS, *d);
    }
    Ok(out)
}

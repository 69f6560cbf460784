//! A graph cut into a chain of smaller graphs ("pieces"), one ONNX Runtime session each: the VAE
//! decoder's way to fit in GPU memory.
//!
//! Within one `session.run`, ONNX Runtime Web's WebGPU backend does not reuse a released buffer until
//! it flushes, and the GPU lags behind, so a run's peak is about the sum of every tensor it allocates.
//! Run as a chain of pieces, the GPU awaited between them, the peak becomes the largest piece's sum. A
//! piece holds the original nodes and reads the original weights unchanged, so the chain computes
//! exactly what the whole graph does. [`activation_bytes`] sizes a graph at a latent size and [`split`]
//! cuts it to a budget (BENCHMARKS.md compares the full-size decoder's counts with measured peaks).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Range;

use thiserror::Error;

use super::nodes::small_values;
use super::ops::domain_name;
use super::proto::{bytes_field, model_graph, read_tensor, value_info_name, varint_field, with_graph};
use super::proto::{read_node, Node};
use super::shapes::{elem_size, is_float, output_infos, Info};
use super::RewriteError;
use crate::message::{Localize, Message};
use crate::onnx::fields::*;
use crate::onnx::wire::{self, Field};

/// The most tensors passed across one cut: the current activation and a residual, or attention's
/// query and key and a residual. More would make the chain's bookkeeping harder to follow for little
/// gain.
pub const MAX_CROSSING: usize = 3;

/// Operators whose output is their input's buffer, so allocates nothing: ONNX Runtime registers their
/// kernels (WebGPU's and the CPU's) with `Alias(0, 0)`.
const ALIASES: &[&str] = &["Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"];

/// One graph of the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The ModelProto: the original's fields (IR version, opsets, producer) with a graph of this
    /// piece's nodes and the initializers they read, byte for byte (external data points at the same
    /// files).
    pub model: Vec<u8>,
    /// Its graph inputs, by name: original graph inputs (feed the whole graph's values) and earlier
    /// pieces' outputs.
    pub inputs: Vec<String>,
    /// Its graph outputs: tensors later pieces read, and the original graph outputs it computes.
    pub outputs: Vec<String>,
    /// The original nodes it computes, by index. It may also compute again some earlier shape
    /// arithmetic (see [`split`]).
    pub nodes: Range<usize>,
    /// What running it holds at the size asked for: its inputs, its nodes' outputs, and tensors held
    /// for later pieces. Above the budget when no allowed cut made it fit.
    pub bytes: u64,
}

/// Why a graph cannot be sized or split.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SplitError {
    /// The model cannot be read.
    #[error("cannot read the model to split it: {0}")]
    Read(#[from] RewriteError),
    /// Something about the whole model.
    #[error("cannot split the model: {0}")]
    Model(String),
    /// A graph input whose shape at the given size is unknown.
    #[error("cannot size graph input {name:?}: {reason}")]
    Input {
        /// Its name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A node whose outputs cannot be sized.
    #[error("cannot size node {index} {name:?} ({op}): {reason}")]
    Node {
        /// Its index in the graph's node list.
        index: usize,
        /// Its name (may be empty).
        name: String,
        /// `domain::op_type` (`ai.onnx` for the default domain).
        op: String,
        /// Why.
        reason: String,
    },
}

impl From<wire::WireError> for SplitError {
    fn from(e: wire::WireError) -> Self {
        SplitError::Read(e.into())
    }
}

/// A graph's details for developers, not translated: the text is shown as it is.
impl Localize for SplitError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

/// The channels `model`'s latent (its first 4-D float input that is not an initializer) declares, if
/// fixed: the decoder's tells whether its latent is `H/16` (packed tokens) or `H/8` (unpatchified).
pub fn latent_channels(model: &[u8]) -> Result<Option<u64>, SplitError> {
    const WHAT: &str = "GraphProto";
    let model_fields = wire::parse(model, "ModelProto")?;
    let graph_fields = wire::parse(model_graph(&model_fields)?, WHAT)?;
    let mut initializers = HashSet::new();
    for f in graph_fields.iter().filter(|f| f.number == GRAPH_INITIALIZER) {
        initializers.insert(tensor_name(f.bytes(WHAT)?)?);
    }
    for f in graph_fields.iter().filter(|f| f.number == GRAPH_INPUT) {
        let bytes = f.bytes(WHAT)?;
        if initializers.contains(value_info_name(bytes)?) {
            continue;
        }
        if let Some(Declared { elem, dims: Some(dims), .. }) = declared_type(bytes)? {
            if is_float(elem) && dims.len() == 4 {
                return Ok(dims[1]);
            }
        }
    }
    Err(SplitError::Model("it has no 4-D float graph input (the latent)".into()))
}

/// The bytes one run of `model` allocates for its inputs and every node's outputs when its latent is
/// `latent_h` x `latent_w`.
///
/// Every tensor is sized exactly: shapes are inferred node by node from the latent (the first 4-D float
/// graph input, batch 1, the given height and width), the initializers and each operator's rule, and
/// the small integer tensors that compute shapes (`Shape`, `Gather`, `Concat`, `Mul`, ... feeding a
/// `Reshape`) are evaluated, so attention's `[N, N]` scores come out quadratic without a special case.
/// An operator without a rule, or a shape that depends on a value not evaluated, is an error naming the
/// node: a wrong size would silently overrun the budget. Declared shapes are not needed; where they give
/// an element type or a static dim, they must agree. Outputs of `Reshape`, `Squeeze`, `Unsqueeze`,
/// `Flatten` and `Identity` count nothing (ORT gives them their input's buffer). The count overstates
/// ORT Web's measured peak (it reuses some buffers after a flush), so a budget is best calibrated
/// against a measurement; within one graph, it ranks the pieces.
pub fn activation_bytes(model: &[u8], latent_h: u64, latent_w: u64) -> Result<u64, SplitError> {
    let graph = Graph::read(model, latent_h, latent_w)?;
    Ok(graph.plan(0, graph.nodes.len()).bytes)
}

/// `model` cut into pieces of at most `max_piece_bytes` each where the allowed cuts permit, for a
/// latent of `latent_h` x `latent_w`, sized as [`activation_bytes`] sizes it. Run them in order,
/// feeding each its inputs by name; the last piece's outputs are the graph's. One piece, the model as
/// it was, when it fits whole or cannot be cut.
///
/// A piece is a run of consecutive nodes (the graph in topological order, as ONNX requires); its bytes
/// are its inputs, its nodes' outputs, and earlier pieces' outputs that later pieces still need (the
/// caller holds them meanwhile). Small values computed from constants and graph inputs' shapes (the
/// exporter's `Shape`/`Squeeze`/`Mul`/`Concat` chains that build `Reshape` targets) are not passed:
/// each piece that reads one computes it again. A cut is allowed only where every other tensor crossing
/// it is a float tensor, at most [`MAX_CROSSING`] of them, so a shape taken of an intermediate tensor
/// (a group norm's `Shape` for its `Reshape` back) is never cut from its use. Each piece takes the nodes
/// up to the last allowed cut where it still fits; when even the first does not (a single node too
/// large), the piece ends there and its bytes say it does not fit.
pub fn split(
    model: &[u8],
    latent_h: u64,
    latent_w: u64,
    max_piece_bytes: u64,
) -> Result<Vec<Piece>, SplitError> {
    let graph = Graph::read(model, latent_h, latent_w)?;
    let n = graph.nodes.len();
    let allowed = graph.allowed_cuts();
    let mut plans = Vec::new();
    let mut start = 0;
    while start < n {
        // The cost only grows with the end, so stop at the first that does not fit.
        let mut chosen: Option<Plan> = None;
        for end in (start + 1..=n).filter(|&e| allowed[e]) {
            let plan = graph.plan(start, end);
            let fits = plan.bytes <= max_piece_bytes;
            if fits || chosen.is_none() {
                chosen = Some(plan);
            }
            if !fits {
                break;
            }
        }
        let plan = chosen.expect("the graph's end is always an allowed cut");
        start = plan.own.end;
        plans.push(plan);
    }
    if plans.len() <= 1 {
        let bytes = plans.first().map_or(0, |p| p.bytes);
        return Ok(vec![Piece {
            model: model.to_vec(),
            inputs: graph.inputs.iter().map(|s| s.to_string()).collect(),
            outputs: graph.outputs.iter().map(|s| s.to_string()).collect(),
            nodes: 0..n,
            bytes,
        }]);
    }
    plans
        .iter()
        .map(|plan| {
            Ok(Piece {
                model: graph.write(plan)?,
                inputs: plan.inputs.iter().map(|s| s.to_string()).collect(),
                outputs: plan.outputs.iter().map(|s| s.to_string()).collect(),
                nodes: plan.own.clone(),
                bytes: plan.bytes,
            })
        })
        .collect()
}

/// What a piece holds: which nodes, what it reads and gives, and its bytes.
struct Plan<'a> {
    /// The nodes it computes for the first time.
    own: Range<usize>,
    /// Every node it runs: earlier shape arithmetic computed again, then `own`, in graph order.
    nodes: BTreeSet<usize>,
    inputs: Vec<&'a str>,
    outputs: Vec<&'a str>,
    bytes: u64,
}

/// The graph as the split reads it, every tensor sized.
struct Graph<'a> {
    model_fields: Vec<Field<'a>>,
    graph_fields: Vec<Field<'a>>,
    nodes: Vec<Node<'a>>,
    initializers: HashSet<&'a str>,
    /// Graph inputs that are not initializers, in order.
    inputs: Vec<&'a str>,
    outputs: Vec<&'a str>,
    /// ValueInfoProtos (value_info, inputs, outputs) by name.
    declared: HashMap<&'a str, &'a [u8]>,
    infos: HashMap<&'a str, Info>,
    producer: HashMap<&'a str, usize>,
    /// The last node that reads each value.
    last_use: HashMap<&'a str, usize>,
    /// Values computed from constants and graph inputs' shapes only: computed again where needed.
    recomputed: HashSet<&'a str>,
}

impl<'a> Graph<'a> {
    fn read(model: &'a [u8], latent_h: u64, latent_w: u64) -> Result<Graph<'a>, SplitError> {
        let mut graph = Graph::structure(model)?;
        graph.size_inputs(latent_h, latent_w)?;
        for index in 0..graph.nodes.len() {
            graph.size_node(index)?;
        }
        for output in &graph.outputs {
            if !graph.infos.contains_key(output) {
                return Err(SplitError::Model(format!("no node computes its output {output:?}")));
            }
        }
        Ok(graph)
    }

    /// The graph's nodes, initializers, inputs, outputs and declarations, who produces and who last
    /// reads each value; only the initializers sized.
    fn structure(model: &'a [u8]) -> Result<Graph<'a>, SplitError> {
        const WHAT: &str = "GraphProto";
        let model_fields = wire::parse(model, "ModelProto")?;
        let graph_fields = wire::parse(model_graph(&model_fields)?, WHAT)?;
        let mut graph = Graph {
            model_fields: Vec::new(),
            graph_fields: Vec::new(),
            nodes: Vec::new(),
            initializers: HashSet::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            declared: HashMap::new(),
            infos: HashMap::new(),
            producer: HashMap::new(),
            last_use: HashMap::new(),
            recomputed: HashSet::new(),
        };
        let mut all_inputs = Vec::new();
        for f in &graph_fields {
            match f.number {
                GRAPH_NODE => graph.nodes.push(read_node(f.bytes(WHAT)?, graph.nodes.len())?),
                GRAPH_INITIALIZER => {
                    let bytes = f.bytes(WHAT)?;
                    let t = read_tensor(bytes)?;
                    let name = tensor_name(bytes)?;
                    graph.initializers.insert(name);
                    let info = Info::new(t.data_type, t.dims);
                    graph.infos.insert(name, info.with_known(small_values(bytes)));
                }
                GRAPH_INPUT | GRAPH_OUTPUT | GRAPH_VALUE_INFO => {
                    let bytes = f.bytes(WHAT)?;
                    let name = value_info_name(bytes)?;
                    graph.declared.entry(name).or_insert(bytes);
                    match f.number {
                        GRAPH_INPUT => all_inputs.push(name),
                        GRAPH_OUTPUT => graph.outputs.push(name),
                        _ => {}
                    }
                }
                GRAPH_SPARSE_INITIALIZER => {
                    return Err(SplitError::Model("it has sparse initializers, which are not split".into()));
                }
                _ => {}
            }
        }
        graph.inputs = all_inputs.into_iter().filter(|i| !graph.initializers.contains(i)).collect();
        for (index, node) in graph.nodes.iter().enumerate() {
            for &name in node.inputs.iter().filter(|i| !i.is_empty()) {
                graph.last_use.insert(name, index);
            }
            for &name in node.outputs.iter().filter(|o| !o.is_empty()) {
                graph.producer.insert(name, index);
            }
        }
        graph.model_fields = model_fields;
        graph.graph_fields = graph_fields;
        Ok(graph)
    }

    /// The latent (the first 4-D float input) at `latent_h` x `latent_w`, batch 1; other inputs must be
    /// static but for their batch.
    fn size_inputs(&mut self, latent_h: u64, latent_w: u64) -> Result<(), SplitError> {
        let mut latent_found = false;
        for &name in &self.inputs {
            let error = |reason: String| SplitError::Input { name: name.to_owned(), reason };
            let declared = self.declared.get(name).map(|b| declared_type(b)).transpose()?.flatten();
            let Some(Declared { elem, dims: Some(dims), .. }) = declared else {
                return Err(error("it declares no tensor type and shape".into()));
            };
            let is_latent = !latent_found && is_float(elem) && dims.len() == 4;
            latent_found |= is_latent;
            let mut sized = Vec::with_capacity(dims.len());
            for (i, d) in dims.iter().enumerate() {
                let size = match (is_latent, i, d) {
                    (true, 2, _) => latent_h,
                    (true, 3, _) => latent_w,
                    (_, _, Some(d)) => *d,
                    (_, 0, None) => 1,
                    (_, _, None) => return Err(error(format!("its dim {i} is symbolic"))),
                };
                if let (true, Some(d)) = (i >= 2 && is_latent, d) {
                    if *d != size {
                        return Err(error(format!(
                            "it is the latent, and its dim {i} is fixed at {d}, not {size}"
                        )));
                    }
                }
                sized.push(size);
            }
            if elem_size(elem).is_none() {
                return Err(error(format!("its element type {elem} has no known size")));
            }
            self.infos.insert(name, Info::new(elem, sized));
        }
        if !latent_found {
            return Err(SplitError::Model("it has no 4-D float graph input (the latent)".into()));
        }
        Ok(())
    }

    /// Sizes node `index`'s outputs from its inputs' infos.
    fn size_node(&mut self, index: usize) -> Result<(), SplitError> {
        let node = &self.nodes[index];
        let error = |reason: String| SplitError::Node {
            index,
            name: node.name.to_owned(),
            op: format!("{}::{}", domain_name(node.domain), node.op_type),
            reason,
        };
        let inputs = self.input_infos(node, error)?;
        let infos = output_infos(node, &inputs).map_err(error)?;
        let mut outputs = Vec::new();
        for (i, &name) in node.outputs.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            let info = infos
                .get(i)
                .cloned()
                .ok_or_else(|| error(format!("its output {i} ({name:?}) is not sized, only the first")))?;
            self.check_output(name, &info, error)?;
            outputs.push((name, info));
        }
        let recomputed = self.is_recomputed(node);
        for (name, info) in outputs {
            if recomputed {
                self.recomputed.insert(name);
            }
            self.infos.insert(name, info);
        }
        Ok(())
    }

    /// The infos of `node`'s inputs (`None` for an omitted one), each sized by an earlier node, a graph
    /// input or an initializer.
    fn input_infos(
        &self,
        node: &Node,
        error: impl Fn(String) -> SplitError,
    ) -> Result<Vec<Option<&Info>>, SplitError> {
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &name in node.inputs.iter() {
            if name.is_empty() {
                inputs.push(None);
                continue;
            }
            inputs.push(Some(self.infos.get(name).ok_or_else(|| {
                error(format!(
                    "it reads {name:?}, which no earlier node, graph input or initializer gives (nodes must be in topological order)"
                ))
            })?));
        }
        Ok(inputs)
    }

    /// Refuses an output of no known element size, or sized against its declared type and shape.
    fn check_output(
        &self,
        name: &str,
        info: &Info,
        error: impl Fn(String) -> SplitError,
    ) -> Result<(), SplitError> {
        if elem_size(info.elem).is_none() {
            return Err(error(format!(
                "its output {name:?} has element type {}, of no known size",
                info.elem
            )));
        }
        let declared = self.declared.get(name).map(|b| declared_type(b)).transpose()?.flatten();
        if let Some(Declared { elem, dims, .. }) = declared {
            let agrees = (elem == 0 || elem == info.elem)
                && dims.is_none_or(|d| {
                    d.len() == info.dims.len()
                        && d.iter().zip(&info.dims).all(|(d, s)| d.is_none_or(|d| d == *s))
                });
            if !agrees {
                return Err(error(format!(
                    "its output {name:?} is sized as type {} {:?}, which its declared type and shape contradict",
                    info.elem, info.dims
                )));
            }
        }
        Ok(())
    }

    /// Whether `node` computes from constants only, or is arithmetic on them and on graph inputs'
    /// shapes: then its outputs are computed again where needed.
    fn is_recomputed(&self, node: &Node) -> bool {
        node.inputs
            .iter()
            .all(|i| i.is_empty() || self.initializers.contains(i) || self.recomputed.contains(i))
            || (node.is_onnx("Shape") || node.is_onnx("Size"))
                && node.inputs.first().is_some_and(|i| self.inputs.contains(i))
    }

    /// Whether a cut may go before node `c`, for `c` in `0..=n`: every tensor produced before it and
    /// read from it on is computed again where needed, or a float tensor, and at most [`MAX_CROSSING`]
    /// of those; and node `c - 1` is not one that is computed again.
    fn allowed_cuts(&self) -> Vec<bool> {
        let n = self.nodes.len();
        // Difference arrays over cuts: value produced by node p and last read by node u crosses p+1..=u.
        let mut passed = vec![0i64; n + 2];
        let mut forbidden = vec![0i64; n + 2];
        for (name, &p) in &self.producer {
            let Some(&u) = self.last_use.get(name).filter(|&&u| u > p) else { continue };
            if self.recomputed.contains(name) {
                continue;
            }
            let counts = if is_float(self.infos[name].elem) { &mut passed } else { &mut forbidden };
            counts[p + 1] += 1;
            counts[u + 1] -= 1;
        }
        let (mut crossing, mut bad) = (0, 0);
        (0..=n)
            .map(|c| {
                crossing += passed[c];
                bad += forbidden[c];
                // Shape arithmetic goes with the node after it, which reads it: a piece never ends with
                // it, so no piece is shape arithmetic alone, which would give nothing.
                let after_recomputed =
                    c > 0 && self.nodes[c - 1].outputs.iter().any(|o| self.recomputed.contains(o));
                c == 0 || c == n || (bad == 0 && crossing <= MAX_CROSSING as i64 && !after_recomputed)
            })
            .collect()
    }

    /// The piece of nodes `start..end`.
    fn plan(&self, start: usize, end: usize) -> Plan<'a> {
        let mut nodes: BTreeSet<usize> = (start..end).collect();
        let produced: HashSet<&str> =
            self.nodes[start..end].iter().flat_map(|n| n.outputs.iter().copied()).collect();
        let mut needed: Vec<&str> = self.nodes[start..end]
            .iter()
            .flat_map(|n| n.inputs.iter().copied())
            .filter(|i| !produced.contains(i))
            .collect();
        let mut seen = HashSet::new();
        let mut inputs = Vec::new();
        while let Some(v) = needed.pop() {
            if v.is_empty() || self.initializers.contains(v) || !seen.insert(v) {
                continue;
            }
            if self.recomputed.contains(v) {
                let p = self.producer[v];
                if nodes.insert(p) {
                    needed.extend(self.nodes[p].inputs.iter().copied());
                }
            } else {
                inputs.push(v);
            }
        }
        let order = |v: &&str| match self.producer.get(v) {
            Some(&p) => (1, p, self.nodes[p].outputs.iter().position(|o| o == v).unwrap_or(0)),
            None => (0, self.inputs.iter().position(|i| i == v).unwrap_or(0), 0),
        };
        inputs.sort_by_key(order);
        let outputs: Vec<&str> = self.nodes[start..end]
            .iter()
            .flat_map(|n| n.outputs.iter().copied())
            .filter(|o| {
                self.outputs.contains(o)
                    || (!o.is_empty()
                        && !self.recomputed.contains(o)
                        && self.last_use.get(o).is_some_and(|&u| u >= end))
            })
            .collect();
        // Passed from before this piece to after it, through the caller.
        let held = self.producer.iter().filter(|(v, &p)| {
            p < start
                && self.last_use.get(*v).is_some_and(|&u| u >= end)
                && !self.recomputed.contains(*v)
                && !inputs.contains(v)
        });
        // Nothing sized (a cut by weights, `by_weights`) counts nothing.
        let size = |v: &str| self.infos.get(v).map_or(0, Info::bytes);
        let bytes = inputs.iter().map(|v| size(v)).sum::<u64>()
            + nodes
                .iter()
                .filter(|&&i| !ALIASES.contains(&self.nodes[i].op_type))
                .flat_map(|&i| self.nodes[i].outputs.iter().filter(|o| !o.is_empty()))
                .map(|o| size(o))
                .sum::<u64>()
            + held.map(|(v, _)| size(v)).sum::<u64>();
        Plan { own: start..end, nodes, inputs, outputs, bytes }
    }

    /// The ModelProto of `plan`: the original model's fields, and a graph of the original graph's
    /// fields that concern the piece, in their order, then the declarations of the tensors passed in
    /// and out.
    fn write(&self, plan: &Plan) -> Result<Vec<u8>, SplitError> {
        const WHAT: &str = "GraphProto";
        let read: HashSet<&str> =
            plan.nodes.iter().flat_map(|&i| self.nodes[i].inputs.iter().copied()).collect();
        let produced: HashSet<&str> =
            plan.nodes.iter().flat_map(|&i| self.nodes[i].outputs.iter().copied()).collect();
        let is_io = |name: &str| plan.inputs.contains(&name) || plan.outputs.contains(&name);
        let mut out = Vec::new();
        let mut node_index = 0;
        for f in &self.graph_fields {
            let keep = match f.number {
                GRAPH_NODE => {
                    node_index += 1;
                    plan.nodes.contains(&(node_index - 1))
                }
                GRAPH_INITIALIZER => read.contains(tensor_name(f.bytes(WHAT)?)?),
                GRAPH_INPUT => {
                    let name = value_info_name(f.bytes(WHAT)?)?;
                    plan.inputs.contains(&name) || (self.initializers.contains(name) && read.contains(name))
                }
                GRAPH_OUTPUT => plan.outputs.contains(&value_info_name(f.bytes(WHAT)?)?),
                GRAPH_VALUE_INFO => {
                    let name = value_info_name(f.bytes(WHAT)?)?;
                    produced.contains(name) && !is_io(name)
                }
                _ => true,
            };
            if keep {
                out.extend_from_slice(f.raw);
            }
        }
        let passed_in = plan.inputs.iter().filter(|v| !self.inputs.contains(v));
        let passed_out = plan.outputs.iter().filter(|v| !self.outputs.contains(v));
        for (number, name) in passed_in.map(|v| (GRAPH_INPUT, v)).chain(passed_out.map(|v| (GRAPH_OUTPUT, v)))
        {
            let info = match self.declared.get(name) {
                Some(declared) => declared.to_vec(),
                None => {
                    let tensor = varint_field(TENSOR_TYPE_ELEM_TYPE, self.infos[name].elem);
                    let mut info = bytes_field(VALUE_INFO_NAME, name.as_bytes());
                    info.extend(bytes_field(VALUE_INFO_TYPE, &bytes_field(TYPE_TENSOR, &tensor)));
                    info
                }
            };
            wire::put_bytes_field(&mut out, number, &info);
        }
        Ok(with_graph(&self.model_fields, &out))
    }
}

fn tensor_name(bytes: &[u8]) -> Result<&str, SplitError> {
    for f in wire::parse(bytes, "TensorProto")? {
        if f.number == TENSOR_NAME {
            return Ok(f.string("TensorProto")?);
        }
    }
    Ok("")
}

/// A ValueInfoProto's tensor type: element type (0 when unset) and dims (`None` for a symbolic one),
/// or no dims without a shape; the symbolic dims' names (empty for a fixed or unnamed one).
struct Declared {
    elem: u64,
    dims: Option<Vec<Option<u64>>>,
    dim_names: Vec<String>,
}

fn declared_type(value_info: &[u8]) -> Result<Option<Declared>, SplitError> {
    let field = |bytes: &[u8], number: u64, what: &'static str| -> Result<Option<Vec<u8>>, SplitError> {
        let fields = wire::parse(bytes, what)?;
        Ok(fields.iter().find(|f| f.number == number).map(|f| f.bytes(what)).transpose()?.map(<[u8]>::to_vec))
    };
    let Some(type_proto) = field(value_info, VALUE_INFO_TYPE, "ValueInfoProto")? else { return Ok(None) };
    let Some(tensor) = field(&type_proto, TYPE_TENSOR, "TypeProto")? else { return Ok(None) };
    let mut declared = Declared { elem: 0, dims: None, dim_names: Vec::new() };
    for f in wire::parse(&tensor, "TypeProto.Tensor")? {
        match f.number {
            TENSOR_TYPE_ELEM_TYPE => declared.elem = f.varint("TypeProto.Tensor")?,
            TENSOR_TYPE_SHAPE => {
                let mut dims = Vec::new();
                for d in wire::parse(f.bytes("TypeProto.Tensor")?, "TensorShapeProto")? {
                    if d.number == SHAPE_DIM {
                        let dim = wire::parse(d.bytes("TensorShapeProto")?, "Dimension")?;
                        let value = dim.iter().find(|g| g.number == DIM_VALUE);
                        dims.push(value.map(|g| g.varint("Dimension")).transpose()?);
                        let name = dim.iter().find(|g| g.number == DIM_PARAM);
                        declared
                            .dim_names
                            .push(name.map(|g| g.string("Dimension")).transpose()?.unwrap_or("").to_owned());
                    }
                }
                declared.dims = Some(dims);
            }
            _ => {}
        }
    }
    Ok(Some(declared))
}

mod weights;
pub use weights::{by_weights, declared_io};

#[cfg(test)]
mod tests;

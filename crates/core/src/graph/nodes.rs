//! A graph as the node edits read it (each value's producer and readers, small constants, declared
//! dims) and write it back (new nodes in place of the old, what no longer exists dropped).

use std::collections::{HashMap, HashSet};

use super::proto::{bytes_field, edit_message, read_node, read_tensor, value_info_name, Edit, Node};
use super::RewriteError;
use crate::onnx::fields::*;
use crate::onnx::wire::{self, Field, Value};

pub(super) const GRAPH_PROTO: &str = "GraphProto";

/// The fewest inputs and outputs ONNX gives each operator the finder reads by position: a node with
/// fewer (a malformed custom graph) is refused with an error instead of read past its end.
const ARITY: [(&str, usize, usize); 11] = [
    ("Split", 1, 1),
    ("MatMul", 2, 1),
    ("Softmax", 1, 1),
    ("Transpose", 1, 1),
    ("Reshape", 2, 1),
    ("Mul", 2, 1),
    ("Div", 2, 1),
    ("Slice", 1, 1),
    ("Shape", 1, 1),
    ("Concat", 1, 1),
    ("Constant", 0, 1),
];

fn check_arity(node: &Node) -> Result<(), RewriteError> {
    let Some(&(op, inputs, outputs)) = ARITY.iter().find(|(op, ..)| node.is_onnx(op)) else { return Ok(()) };
    if node.inputs.len() < inputs || node.outputs.len() < outputs {
        return Err(RewriteError::Protobuf {
            what: "NodeProto",
            detail: format!(
                "node {} {:?} ({op}) has {} inputs and {} outputs, where ONNX's {op} takes at least {inputs} and {outputs}",
                node.index,
                node.name,
                node.inputs.len(),
                node.outputs.len()
            ),
        });
    }
    Ok(())
}

/// What the node edits read of a graph: its nodes and where each value comes from and goes.
pub(super) struct Graph<'a> {
    pub(super) nodes: Vec<Node<'a>>,
    pub(super) producer: HashMap<&'a str, usize>,
    pub(super) consumers: HashMap<&'a str, Vec<usize>>,
    pub(super) outputs: HashSet<&'a str>,
    /// Values of the small constants (inline initializers and `Constant` nodes), as f64.
    pub(super) constants: HashMap<&'a str, Vec<f64>>,
    /// Declared dims (`value_info`, graph inputs and outputs); `None` for a symbolic one.
    pub(super) dims: HashMap<&'a str, Vec<Option<u64>>>,
}

/// The GraphProto with `kept` in place of its nodes, without the initializers and declared shapes
/// of what no longer exists, and `tensors` added.
pub(super) fn write_nodes(
    graph: &Graph,
    graph_fields: &[Field],
    kept: &[&NewNode],
    tensors: &[Vec<u8>],
    graph_len: usize,
) -> Result<Vec<u8>, RewriteError> {
    let produced: HashSet<&str> = kept.iter().flat_map(|n| n.outputs.iter().map(String::as_str)).collect();
    let read: HashSet<&str> = kept.iter().flat_map(|n| n.inputs.iter().map(String::as_str)).collect();
    let mut out = Vec::with_capacity(graph_len + 4096);
    let mut nodes_written = false;
    for f in graph_fields {
        match f.number {
            GRAPH_NODE if !nodes_written => {
                for n in kept {
                    wire::put_bytes_field(&mut out, GRAPH_NODE, &n.bytes);
                }
                nodes_written = true;
            }
            GRAPH_NODE => {}
            // Constants only the fused nodes read (their scale factors, the key's shape pieces).
            GRAPH_INITIALIZER => {
                let name = read_tensor(f.bytes(GRAPH_PROTO)?)?.name;
                let orphaned = graph.consumers.contains_key(name.as_str())
                    && !read.contains(name.as_str())
                    && !graph.outputs.contains(name.as_str());
                if !orphaned {
                    out.extend_from_slice(f.raw);
                }
            }
            // Declared shapes of values that no longer exist would name nothing.
            GRAPH_VALUE_INFO => {
                let name = value_info_name(f.bytes(GRAPH_PROTO)?)?;
                if produced.contains(name) || !graph.producer.contains_key(name) {
                    out.extend_from_slice(f.raw);
                }
            }
            _ => out.extend_from_slice(f.raw),
        }
    }
    for t in tensors {
        wire::put_bytes_field(&mut out, GRAPH_INITIALIZER, t);
    }
    Ok(out)
}

/// The name of an initializer (a TensorProto), borrowed from its bytes.
pub(super) fn initializer_name(bytes: &[u8]) -> Result<&str, RewriteError> {
    for f in wire::parse(bytes, "TensorProto")? {
        if f.number == TENSOR_NAME {
            return Ok(f.string("TensorProto")?);
        }
    }
    Ok("")
}

impl<'a> Graph<'a> {
    pub(super) fn read(fields: &[Field<'a>]) -> Result<Graph<'a>, RewriteError> {
        const WHAT: &str = "GraphProto";
        let mut graph = Graph {
            nodes: Vec::new(),
            producer: HashMap::new(),
            consumers: HashMap::new(),
            outputs: HashSet::new(),
            constants: HashMap::new(),
            dims: HashMap::new(),
        };
        for f in fields {
            match f.number {
                GRAPH_NODE => {
                    let node = read_node(f.bytes(WHAT)?, graph.nodes.len())?;
                    check_arity(&node)?;
                    let index = graph.nodes.len();
                    for output in node.outputs.iter().filter(|o| !o.is_empty()) {
                        graph.producer.insert(output, index);
                    }
                    for input in node.inputs.iter().filter(|i| !i.is_empty()) {
                        graph.consumers.entry(input).or_default().push(index);
                    }
                    if node.is_onnx("Constant") && node.outputs.len() == 1 {
                        let value = node.attributes.iter().find(|a| a.name == "value");
                        let tensor = value.and_then(|a| a.fields.iter().find(|f| f.number == ATTR_T));
                        if let Some(values) = tensor.and_then(|t| t.bytes(WHAT).ok()).and_then(small_values) {
                            graph.constants.insert(node.outputs[0], values);
                        }
                    }
                    graph.nodes.push(node);
                }
                GRAPH_INITIALIZER => {
                    let bytes = f.bytes(WHAT)?;
                    if let Some(values) = small_values(bytes) {
                        // The name's bytes live in `bytes`; read it again to borrow it from there.
                        let name = wire::parse(bytes, "TensorProto")?
                            .iter()
                            .find(|g| g.number == TENSOR_NAME)
                            .map(|g| g.string("TensorProto"))
                            .transpose()?
                            .unwrap_or("");
                        graph.constants.insert(name, values);
                    }
                }
                GRAPH_OUTPUT | GRAPH_INPUT | GRAPH_VALUE_INFO => {
                    let bytes = f.bytes(WHAT)?;
                    let name = value_info_name(bytes)?;
                    if f.number == GRAPH_OUTPUT {
                        graph.outputs.insert(name);
                    }
                    if let Some(dims) = declared_dims(bytes) {
                        graph.dims.insert(name, dims);
                    }
                }
                _ => {}
            }
        }
        Ok(graph)
    }

    pub(super) fn producer(&self, value: &str) -> Option<&Node<'a>> {
        self.producer.get(value).map(|&i| &self.nodes[i])
    }

    /// `value`'s only reader, when it has exactly one and is not a graph output.
    pub(super) fn only_consumer(&self, value: &str) -> Option<usize> {
        match self.consumers.get(value).map(Vec::as_slice) {
            Some(&[i]) if !self.outputs.contains(value) => Some(i),
            _ => None,
        }
    }

    /// The single value of a constant, if `value` is one.
    pub(super) fn scalar(&self, value: &str) -> Option<f64> {
        match self.constants.get(value).map(Vec::as_slice) {
            Some(&[v]) => Some(v),
            _ => None,
        }
    }

    pub(super) fn constant_is(&self, value: &str, expected: &[i64]) -> bool {
        self.constants.get(value).is_some_and(|v| {
            v.len() == expected.len() && v.iter().zip(expected).all(|(a, &b)| *a == b as f64)
        })
    }
}

impl Node<'_> {
    pub(super) fn name_or_output(&self) -> &str {
        if self.name.is_empty() {
            self.outputs.first().copied().unwrap_or("")
        } else {
            self.name
        }
    }

    pub(super) fn ints_attribute(&self, name: &str) -> Option<Vec<i64>> {
        let a = self.attributes.iter().find(|a| a.name == name)?;
        let mut values = Vec::new();
        for f in a.fields.iter().filter(|f| f.number == ATTR_INTS) {
            match f.value {
                Value::Varint(v) => values.push(v as i64),
                Value::Bytes(b) => values
                    .extend(wire::packed_varints(b, "AttributeProto").ok()?.into_iter().map(|v| v as i64)),
                _ => return None,
            }
        }
        Some(values)
    }
}

/// A node of the graph being written, and which original node it is.
pub(super) struct NewNode {
    pub(super) original: Option<usize>,
    pub(super) bytes: Vec<u8>,
    pub(super) inputs: Vec<String>,
    pub(super) outputs: Vec<String>,
}

impl NewNode {
    pub(super) fn kept(node: &Node) -> NewNode {
        NewNode {
            original: Some(node.index),
            bytes: node.bytes.to_vec(),
            inputs: node.inputs.iter().map(|s| s.to_string()).collect(),
            outputs: node.outputs.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub(super) fn new(
        name: &str,
        (domain, op_type): (&str, &str),
        inputs: &[&str],
        outputs: &[&str],
        attributes: Vec<Vec<u8>>,
    ) -> NewNode {
        let mut n = Vec::new();
        for i in inputs {
            wire::put_bytes_field(&mut n, NODE_INPUT, i.as_bytes());
        }
        for o in outputs {
            wire::put_bytes_field(&mut n, NODE_OUTPUT, o.as_bytes());
        }
        wire::put_bytes_field(&mut n, NODE_NAME, name.as_bytes());
        wire::put_bytes_field(&mut n, NODE_OP_TYPE, op_type.as_bytes());
        for a in attributes {
            wire::put_bytes_field(&mut n, NODE_ATTRIBUTE, &a);
        }
        if !domain.is_empty() {
            wire::put_bytes_field(&mut n, NODE_DOMAIN, domain.as_bytes());
        }
        NewNode {
            original: None,
            bytes: n,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub(super) fn reshape(name: &str, output: &str, input: &str, shape: &str) -> NewNode {
        NewNode::new(name, ("", "Reshape"), &[input, shape], &[output], Vec::new())
    }
}

/// The original indices of the nodes whose outputs something reads, walking back from the graph's
/// outputs through `nodes` (in topological order).
pub(super) fn used(nodes: &[NewNode], outputs: &HashSet<&str>) -> HashSet<usize> {
    let mut needed: HashSet<&str> = outputs.iter().copied().collect();
    let mut used = HashSet::new();
    for node in nodes.iter().rev() {
        if node.outputs.is_empty() || node.outputs.iter().any(|o| needed.contains(o.as_str())) {
            if let Some(i) = node.original {
                used.insert(i);
            }
            needed.extend(node.inputs.iter().map(String::as_str).filter(|i| !i.is_empty()));
        }
    }
    used
}

/// The values of a tensor of at most a few elements stored in the graph (float or integer), as f64.
pub(super) fn small_values(bytes: &[u8]) -> Option<Vec<f64>> {
    const MAX: usize = 8;
    let tensor = read_tensor(bytes).ok()?;
    if tensor.external.is_some() || tensor.segmented {
        return None;
    }
    let mut values = Vec::new();
    for f in wire::parse(bytes, "TensorProto").ok()? {
        match (f.number, f.value, tensor.data_type) {
            (TENSOR_RAW_DATA, Value::Bytes(raw), data_type) => {
                let size = match data_type {
                    FLOAT16 => 2,
                    FLOAT | INT32 => 4,
                    INT64 | DOUBLE => 8,
                    _ => return None,
                };
                if raw.len() % size != 0 || raw.len() / size > MAX {
                    return None;
                }
                for c in raw.chunks_exact(size) {
                    values.push(match data_type {
                        FLOAT16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
                        FLOAT => f32::from_le_bytes(c.try_into().ok()?) as f64,
                        INT32 => i32::from_le_bytes(c.try_into().ok()?) as f64,
                        INT64 => i64::from_le_bytes(c.try_into().ok()?) as f64,
                        _ => f64::from_le_bytes(c.try_into().ok()?),
                    });
                }
            }
            (TENSOR_INT64_DATA, Value::Varint(v), INT64) => values.push(v as i64 as f64),
            (TENSOR_INT64_DATA, Value::Bytes(b), INT64) => values
                .extend(wire::packed_varints(b, "TensorProto").ok()?.into_iter().map(|v| v as i64 as f64)),
            (TENSOR_FLOAT_DATA, Value::Fixed32(v), FLOAT) => values.push(f32::from_bits(v) as f64),
            (TENSOR_FLOAT_DATA, Value::Bytes(b), FLOAT) if b.len() % 4 == 0 => {
                values.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64))
            }
            (TENSOR_INT32_DATA | TENSOR_DOUBLE_DATA, ..) => return None,
            _ => {}
        }
        if values.len() > MAX {
            return None;
        }
    }
    let elements: u64 = tensor.dims.iter().product();
    (elements as usize == values.len()).then_some(values)
}

/// The dims a ValueInfoProto declares for a tensor (`None` for a symbolic or missing dim).
fn declared_dims(bytes: &[u8]) -> Option<Vec<Option<u64>>> {
    let find = |bytes: &[u8], number: u64, what: &'static str| -> Option<Vec<u8>> {
        wire::parse(bytes, what)
            .ok()?
            .iter()
            .find(|f| f.number == number)?
            .bytes(what)
            .ok()
            .map(<[u8]>::to_vec)
    };
    let type_proto = find(bytes, VALUE_INFO_TYPE, "ValueInfoProto")?;
    let tensor = find(&type_proto, TYPE_TENSOR, "TypeProto")?;
    let shape = find(&tensor, TENSOR_TYPE_SHAPE, "TypeProto.Tensor")?;
    let mut dims = Vec::new();
    for f in wire::parse(&shape, "TensorShapeProto").ok()?.iter().filter(|f| f.number == SHAPE_DIM) {
        let dim = wire::parse(f.bytes("TensorShapeProto").ok()?, "Dimension").ok()?;
        dims.push(dim.iter().find(|g| g.number == DIM_VALUE).and_then(|g| g.varint("Dimension").ok()));
    }
    Some(dims)
}

pub(super) fn int64s_tensor(name: &str, values: &[i64]) -> Vec<u8> {
    let mut t = Vec::new();
    wire::put_varint_field(&mut t, TENSOR_DIMS, values.len() as u64);
    wire::put_varint_field(&mut t, TENSOR_DATA_TYPE, INT64);
    wire::put_bytes_field(&mut t, TENSOR_NAME, name.as_bytes());
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    wire::put_bytes_field(&mut t, TENSOR_RAW_DATA, &raw);
    t
}

/// `node` reading and writing the values of `renamed` under their new names, named `name`; every other
/// field as it was.
pub(super) fn with_values(
    node: &Node,
    name: &str,
    renamed: &HashMap<&str, String>,
) -> Result<Vec<u8>, RewriteError> {
    const WHAT: &str = "NodeProto";
    let mut out = edit_message(node.bytes, WHAT, |f| {
        Ok(match f.number {
            NODE_INPUT | NODE_OUTPUT => match renamed.get(f.string(WHAT)?) {
                Some(new) => Edit::Replace(bytes_field(f.number, new.as_bytes())),
                None => Edit::Keep,
            },
            NODE_NAME => Edit::Drop,
            _ => Edit::Keep,
        })
    })?
    .unwrap_or_else(|| node.bytes.to_vec());
    wire::put_bytes_field(&mut out, NODE_NAME, name.as_bytes());
    Ok(out)
}

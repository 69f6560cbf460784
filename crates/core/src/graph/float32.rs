//! The float16 → float32 rewrite ([`rewrite`]): read the graph, refuse what it cannot prove, decide where
//! each float16 tensor goes, and write the graph back with every other field copied as it was.
//!
//! Why: ONNX Runtime's WebGPU kernels compile every program that reads or writes a float16 tensor, a
//! Gather or a Cast included, with `enable f16;` and refuse to run it without `shader-f16`
//! (`core/providers/webgpu/shader_helper.cc`). Many adapters lack it (Linux with NVIDIA over Vulkan,
//! Android, SwiftShader) and ORT has no switch to compute float16 graphs in float32, so the pack's
//! float16-activation graphs are rewritten once, after the download, and their weights converted.

use std::collections::{HashMap, HashSet};

use super::ops::{self, Kind};
use super::proto::*;
use super::{
    f16_to_f32_vec, EmbeddingLookup, LookupPolicy, NewFile, Options, Plan, Range, Rewrite, RewriteError,
    TensorCopy,
};
use crate::onnx::fields::*;
use crate::onnx::wire::{self, Field, Value};

/// Attribute names that hold a dtype in some operator: one of them naming float16 on an operator
/// whose table entry does not list it is refused rather than left.
const DTYPE_ATTRIBUTE_NAMES: &[&str] = &["to", "dtype", "output_dtype", "stash_type"];

/// External-data alignment of the new files.
const ALIGN: u64 = 64;

/// A float16 TensorProto as float32: inline data converted into `raw_data`, or the external-data
/// entries replaced by `target`.
fn convert_tensor(bytes: &[u8], target: Option<&Range>) -> Result<Vec<u8>, RewriteError> {
    const WHAT: &str = "TensorProto";
    let t = read_tensor(bytes)?;
    if t.segmented {
        return Err(t.error("it is segmented (TensorProto.segment)"));
    }
    let mut halves = Vec::new();
    let mut out = edit_message(bytes, WHAT, |f| {
        Ok(match f.number {
            TENSOR_DATA_TYPE => Edit::Replace(varint_field(TENSOR_DATA_TYPE, FLOAT)),
            TENSOR_RAW_DATA => {
                halves.extend_from_slice(f.bytes(WHAT)?);
                Edit::Drop
            }
            TENSOR_INT32_DATA => {
                // float16 in int32_data: one value's bits per element.
                let values = match f.value {
                    Value::Bytes(b) => wire::packed_varints(b, WHAT)?,
                    _ => vec![f.varint(WHAT)?],
                };
                halves.extend(values.into_iter().flat_map(|v| (v as u16).to_le_bytes()));
                Edit::Drop
            }
            TENSOR_FLOAT_DATA => return Err(t.error("it is float16 but has float_data")),
            TENSOR_EXTERNAL_DATA if target.is_some() => Edit::Drop,
            _ => Edit::Keep,
        })
    })?
    .unwrap_or_else(|| bytes.to_vec());
    match target {
        Some(r) => {
            for (key, value) in [
                ("location", r.file.clone()),
                ("offset", r.offset.to_string()),
                ("length", r.length.to_string()),
            ] {
                out.extend(bytes_field(TENSOR_EXTERNAL_DATA, &entry(key, &value)));
            }
        }
        None => {
            if t.external.is_some() {
                return Err(t.error("it is stored as external data where only inline data can be converted"));
            }
            let expected = t.f16_bytes()?;
            if halves.len() as u64 != expected {
                return Err(t.error(format!(
                    "it holds {} bytes of float16 data for {} elements",
                    halves.len(),
                    t.elements()?
                )));
            }
            out.extend(bytes_field(TENSOR_RAW_DATA, &f16_to_f32_vec(&halves)?));
        }
    }
    Ok(out)
}

/// The operator's rule, or the refusal that names it.
fn check_node(node: &Node) -> Result<Kind, RewriteError> {
    // Subgraphs first: `If`, `Loop` and `Scan` are refused for them, not as unknown operators.
    for a in &node.attributes {
        for f in &a.fields {
            let subgraph = match f.number {
                ATTR_G | ATTR_GRAPHS => true,
                ATTR_TYPE => matches!(f.value, Value::Varint(ATTR_TYPE_GRAPH | ATTR_TYPE_GRAPHS)),
                _ => false,
            };
            if subgraph {
                return Err(node.error(format!(
                    "attribute `{}` is a subgraph; graphs inside nodes are not rewritten",
                    a.name
                )));
            }
        }
    }
    let kind = ops::kind(node.domain, node.op_type).ok_or_else(|| {
        node.error(
            "the operator is not in the list of operators known to compute the same function in float32",
        )
    })?;
    for a in &node.attributes {
        for f in &a.fields {
            let float16 =
                |bytes: &[u8]| -> Result<bool, RewriteError> { Ok(read_tensor(bytes)?.data_type == FLOAT16) };
            let reason = match f.number {
                ATTR_TP | ATTR_TYPE_PROTOS => Some("is a type, which the rewrite does not read"),
                ATTR_T => {
                    let t = read_tensor(f.bytes("AttributeProto")?)?;
                    if t.data_type != FLOAT16 {
                        None
                    } else if !(kind == Kind::TensorAttr && a.name == "value") {
                        Some("holds a float16 tensor, which this operator's rewrite does not convert")
                    } else if t.external.is_some() {
                        Some("holds a float16 tensor stored as external data")
                    } else {
                        None
                    }
                }
                ATTR_TENSORS => float16(f.bytes("AttributeProto")?)?
                    .then_some("holds float16 tensors, which the rewrite does not convert"),
                ATTR_SPARSE_TENSOR | ATTR_SPARSE_TENSORS => {
                    (sparse_values(f.bytes("AttributeProto")?)?.data_type == FLOAT16)
                        .then_some("holds a float16 sparse tensor, which the rewrite does not convert")
                }
                ATTR_I => (DTYPE_ATTRIBUTE_NAMES.contains(&a.name)
                    && f.value == Value::Varint(FLOAT16)
                    && !matches!(kind, Kind::DtypeAttrs(names) if names.contains(&a.name)))
                .then_some("names float16, and this operator's rewrite does not handle it"),
                _ => None,
            };
            if let Some(reason) = reason {
                return Err(node.error(format!("attribute `{}` {reason}", a.name)));
            }
        }
    }
    Ok(kind)
}

/// The node with its dtype attributes and float16 value tensors rewritten (`None`: unchanged).
fn rewrite_node(node: &Node, kind: Kind) -> Result<Option<Vec<u8>>, RewriteError> {
    let mut attributes = node.attributes.iter();
    edit_message(node.bytes, "NodeProto", |f| {
        if f.number != NODE_ATTRIBUTE {
            return Ok(Edit::Keep);
        }
        let a = attributes.next().expect("one Attribute per attribute field");
        let edited = edit_message(f.bytes("NodeProto")?, "AttributeProto", |af| {
            Ok(match (kind, af.number) {
                (Kind::DtypeAttrs(names), ATTR_I)
                    if names.contains(&a.name) && af.value == Value::Varint(FLOAT16) =>
                {
                    Edit::Replace(varint_field(ATTR_I, FLOAT))
                }
                (Kind::TensorAttr, ATTR_T) if a.name == "value" => {
                    let bytes = af.bytes("AttributeProto")?;
                    if read_tensor(bytes)?.data_type == FLOAT16 {
                        Edit::Replace(bytes_field(ATTR_T, &convert_tensor(bytes, None)?))
                    } else {
                        Edit::Keep
                    }
                }
                _ => Edit::Keep,
            })
        })?;
        Ok(edited.map_or(Edit::Keep, |new| Edit::Replace(bytes_field(NODE_ATTRIBUTE, &new))))
    })
}

fn sparse_values(bytes: &[u8]) -> Result<Tensor, RewriteError> {
    for f in wire::parse(bytes, "SparseTensorProto")? {
        if f.number == SPARSE_VALUES {
            return read_tensor(f.bytes("SparseTensorProto")?);
        }
    }
    Ok(Tensor { name: String::new(), data_type: 0, dims: Vec::new(), external: None, segmented: false })
}

/// A TypeProto with float16 element types made float32, however deeply nested.
fn rewrite_type(bytes: &[u8]) -> Result<Option<Vec<u8>>, RewriteError> {
    const WHAT: &str = "TypeProto";
    let nested = |bytes: &[u8], inner: u64, what: &'static str| {
        edit_message(bytes, what, |f| {
            Ok(if f.number == inner {
                rewrite_type(f.bytes(what)?)?.map_or(Edit::Keep, |t| Edit::Replace(bytes_field(inner, &t)))
            } else {
                Edit::Keep
            })
        })
    };
    edit_message(bytes, WHAT, |f| {
        let edited = match f.number {
            TYPE_TENSOR | TYPE_SPARSE_TENSOR => edit_message(f.bytes(WHAT)?, "TypeProto.Tensor", |t| {
                Ok(if t.number == TENSOR_TYPE_ELEM_TYPE && t.value == Value::Varint(FLOAT16) {
                    Edit::Replace(varint_field(TENSOR_TYPE_ELEM_TYPE, FLOAT))
                } else {
                    Edit::Keep
                })
            })?,
            TYPE_SEQUENCE => nested(f.bytes(WHAT)?, SEQUENCE_ELEM_TYPE, "TypeProto.Sequence")?,
            TYPE_MAP => nested(f.bytes(WHAT)?, MAP_VALUE_TYPE, "TypeProto.Map")?,
            TYPE_OPTIONAL => nested(f.bytes(WHAT)?, OPTIONAL_ELEM_TYPE, "TypeProto.Optional")?,
            _ => None,
        };
        Ok(edited.map_or(Edit::Keep, |new| Edit::Replace(bytes_field(f.number, &new))))
    })
}

fn rewrite_value_info(bytes: &[u8]) -> Result<Option<Vec<u8>>, RewriteError> {
    edit_message(bytes, "ValueInfoProto", |f| {
        Ok(if f.number == VALUE_INFO_TYPE {
            rewrite_type(f.bytes("ValueInfoProto")?)?
                .map_or(Edit::Keep, |t| Edit::Replace(bytes_field(VALUE_INFO_TYPE, &t)))
        } else {
            Edit::Keep
        })
    })
}

/// A graph input `name` of element type `elem_type` (an ONNX `DataType`) shaped like `ids` plus
/// `trailing` dims.
pub(super) fn lookup_input(
    name: &str,
    elem_type: u64,
    ids: &[u8],
    trailing: &[u64],
) -> Result<Vec<u8>, RewriteError> {
    let mut tensor = varint_field(TENSOR_TYPE_ELEM_TYPE, elem_type);
    if let Some(dims) = shape_dims(ids)? {
        let mut shape: Vec<u8> = dims.concat();
        for &d in trailing {
            shape.extend(bytes_field(SHAPE_DIM, &varint_field(DIM_VALUE, d)));
        }
        tensor.extend(bytes_field(TENSOR_TYPE_SHAPE, &shape));
    }
    let mut info = bytes_field(VALUE_INFO_NAME, name.as_bytes());
    info.extend(bytes_field(VALUE_INFO_TYPE, &bytes_field(TYPE_TENSOR, &tensor)));
    Ok(info)
}

/// The Gathers that read `table` (none else may), or why the table cannot leave the graph.
pub(super) fn lookup_gathers<'n>(
    table: &Tensor,
    nodes: &'n [Node],
    inputs: &HashMap<&str, &[u8]>,
    initializers: &HashSet<&str>,
    outputs: &HashSet<&str>,
) -> Result<Vec<&'n Node<'n>>, String> {
    if table.external.is_none() {
        return Err("it is stored inside the graph".into());
    }
    if table.dims.is_empty() {
        return Err("it is a scalar".into());
    }
    if outputs.contains(table.name.as_str()) {
        return Err("it is a graph output".into());
    }
    let mut gathers = Vec::new();
    for node in nodes.iter().filter(|n| n.inputs.contains(&table.name.as_str())) {
        let who = format!(
            "node {} {:?} ({}::{})",
            node.index,
            node.name,
            ops::domain_name(node.domain),
            node.op_type
        );
        if !node.is_onnx("Gather") || node.inputs.iter().skip(1).any(|i| *i == table.name) {
            return Err(format!("{who} reads it, and only Gathers of its rows can be looked up"));
        }
        if node.int_attribute("axis").unwrap_or(0) != 0 {
            return Err(format!("{who} gathers along another axis than 0"));
        }
        let ids = node.inputs.get(1).copied().unwrap_or("");
        if !inputs.contains_key(ids) || initializers.contains(ids) {
            return Err(format!("{who} takes its indices from {ids:?}, which is not a graph input"));
        }
        if node.outputs.len() != 1 || outputs.contains(node.outputs[0]) {
            return Err(format!("{who} has an output that is a graph output"));
        }
        gathers.push(node);
    }
    if gathers.is_empty() {
        return Err("no node reads it".into());
    }
    Ok(gathers)
}

/// Rewrites a float16-activation ONNX model (a ModelProto, its weights outside) into a float32 one,
/// with the [`Plan`] that converts its external weights. It reads only the graph protobuf.
///
/// What changes: every float16 declared type (inputs, outputs, `value_info`, nested types) becomes
/// float32; so do `Cast(to=FLOAT16)` and the other dtype attributes of listed operators, and float16
/// `Constant` and `ConstantOfShape` values. Float16 initializers become float32: inline ones in the
/// graph, external ones in new files ([`Options::shard_name`], at most [`Options::max_shard_bytes`]
/// each, tensors 64-byte aligned). Integer and float32 tensors keep pointing at their original files,
/// and every other field, unknown ones included, is copied byte for byte. The result must pass
/// [`remaining_float16`].
///
/// What is refused, naming the node and the reason: an operator not in
/// [`supported_operators`](super::supported_operators), a subgraph attribute (`If`, `Loop`, `Scan`), a
/// float16 tensor attribute other than those constants' values or one stored externally, a type
/// attribute; sparse initializers, model-local functions and training info; and a tensor over
/// [`Limits`](super::Limits) that [`LookupPolicy`] does not take out of the graph.
pub fn rewrite(model: &[u8], options: &Options) -> Result<Rewrite, RewriteError> {
    let fields = wire::parse(model, "ModelProto")?;
    let mut graph = None;
    for f in &fields {
        match f.number {
            MODEL_GRAPH if graph.is_some() => return Err(RewriteError::Model("it has two graphs".into())),
            MODEL_GRAPH => graph = Some(f.bytes("ModelProto")?),
            MODEL_FUNCTIONS => {
                return Err(RewriteError::Model(
                    "it has model-local functions (ModelProto.functions), which are not rewritten; inline them when exporting"
                        .into(),
                ))
            }
            MODEL_TRAINING_INFO => {
                return Err(RewriteError::Model("it has training info (ModelProto.training_info), which is not rewritten".into()))
            }
            _ => {}
        }
    }
    let graph = graph.ok_or_else(|| RewriteError::Model("it has no graph".into()))?;
    let (new_graph, plan) = rewrite_graph(graph, options)?;
    let out = with_graph(&fields, &new_graph);
    let left = remaining_float16(&out)?;
    if !left.is_empty() {
        return Err(RewriteError::Leftover(left.join("; ")));
    }
    Ok(Rewrite { graph: out, plan })
}

/// What the rewrites read of a GraphProto.
pub(super) struct GraphParts<'a> {
    pub(super) nodes: Vec<Node<'a>>,
    /// Each initializer with the index of its field in the graph, in graph order.
    pub(super) initializers: Vec<(usize, Tensor)>,
    /// The graph's inputs by name, with their ValueInfoProto's bytes.
    pub(super) inputs: HashMap<&'a str, &'a [u8]>,
    pub(super) outputs: HashSet<&'a str>,
    /// The first sparse initializer's bytes, if the graph has one.
    pub(super) sparse: Option<&'a [u8]>,
}

/// Reads the nodes, initializers, inputs and outputs of a GraphProto's `fields`.
pub(super) fn read_graph<'a>(
    fields: &[Field<'a>],
    what: &'static str,
) -> Result<GraphParts<'a>, RewriteError> {
    let mut graph = GraphParts {
        nodes: Vec::new(),
        initializers: Vec::new(),
        inputs: HashMap::new(),
        outputs: HashSet::new(),
        sparse: None,
    };
    for (i, f) in fields.iter().enumerate() {
        match f.number {
            GRAPH_NODE => graph.nodes.push(read_node(f.bytes(what)?, graph.nodes.len())?),
            GRAPH_INITIALIZER => graph.initializers.push((i, read_tensor(f.bytes(what)?)?)),
            GRAPH_SPARSE_INITIALIZER => {
                graph.sparse.get_or_insert(f.bytes(what)?);
            }
            GRAPH_INPUT => {
                let b = f.bytes(what)?;
                graph.inputs.insert(value_info_name(b)?, b);
            }
            GRAPH_OUTPUT => {
                graph.outputs.insert(value_info_name(f.bytes(what)?)?);
            }
            _ => {}
        }
    }
    Ok(graph)
}

pub(super) const GRAPH_PROTO: &str = "GraphProto";

/// The GraphProto `graph` rewritten, and the plan that completes it.
fn rewrite_graph(graph: &[u8], options: &Options) -> Result<(Vec<u8>, Plan), RewriteError> {
    let read = read_checked(graph)?;
    let taken = take_lookups(&read, options)?;
    let placed = place_converted(&read, &taken.removed_tables, options)?;
    let written = write_graph(&read, &taken, &placed.targets, graph.len())?;
    Ok(written.finish(taken, placed))
}

/// A graph read for [`rewrite_graph`], every node checked.
struct Checked<'a> {
    fields: Vec<Field<'a>>,
    nodes: Vec<Node<'a>>,
    /// Each node's rule, in node order.
    kinds: Vec<Kind>,
    /// The initializers' field indices, in graph order.
    order: Vec<usize>,
    /// The initializers by field index.
    tensors: HashMap<usize, Tensor>,
    inputs: HashMap<&'a str, &'a [u8]>,
    outputs: HashSet<&'a str>,
}

/// Refuses a sparse initializer and any node the rewrite has no rule for, before anything is decided.
fn read_checked(graph: &[u8]) -> Result<Checked<'_>, RewriteError> {
    let fields = wire::parse(graph, GRAPH_PROTO)?;
    let GraphParts { nodes, initializers, inputs, outputs, sparse } = read_graph(&fields, GRAPH_PROTO)?;
    if let Some(sparse) = sparse {
        return Err(RewriteError::Tensor {
            name: sparse_values(sparse)?.name,
            reason: "it is a sparse initializer, which the rewrite does not convert".into(),
        });
    }
    let order = initializers.iter().map(|(i, _)| *i).collect();
    let tensors = initializers.into_iter().collect();
    let kinds = nodes.iter().map(check_node).collect::<Result<Vec<_>, _>>()?;
    Ok(Checked { fields, nodes, kinds, order, tensors, inputs, outputs })
}

/// The tables that leave the graph, and what that changes.
#[derive(Default)]
struct Taken {
    lookups: Vec<EmbeddingLookup>,
    removed_tables: HashSet<String>,
    /// The removed Gathers' node indices.
    removed_nodes: HashSet<usize>,
    /// The new graph inputs' ValueInfoProtos.
    new_inputs: Vec<Vec<u8>>,
    /// GPU bytes the conversion adds, less those of the tables taken out.
    extra_gpu: i64,
}

/// Decides, in graph order, which float16 tables leave the graph (as `options.lookup` says) and
/// refuses any tensor that would fit no GPU buffer.
fn take_lookups(read: &Checked, options: &Options) -> Result<Taken, RewriteError> {
    let initializer_names: HashSet<&str> = read.tensors.values().map(|t| t.name.as_str()).collect();
    let limits = options.limits;
    let mut taken = Taken::default();
    for i in &read.order {
        let t = &read.tensors[i];
        let converted = t.data_type == FLOAT16;
        let after = gpu_bytes(t)?;
        let fits = limits.fits(after);
        let wanted = match options.lookup {
            LookupPolicy::Always => true,
            LookupPolicy::WhenTooLarge => !fits,
            LookupPolicy::Never => false,
        };
        if converted && wanted {
            match lookup_gathers(t, &read.nodes, &read.inputs, &initializer_names, &read.outputs) {
                Ok(gathers) => {
                    taken.take(t, &gathers, &read.inputs)?;
                    continue;
                }
                Err(why) if !fits => return Err(too_large(t, after, limits.max_tensor_bytes(), Some(why))),
                Err(_) => {}
            }
        }
        if !fits {
            return Err(too_large(t, after, limits.max_tensor_bytes(), None));
        }
        if converted {
            taken.extra_gpu += t.f16_bytes()? as i64;
        }
    }
    Ok(taken)
}

/// The bytes `t` takes on the GPU after the rewrite: float16 ones twice theirs, others their
/// external length (inline ones count as 0).
fn gpu_bytes(t: &Tensor) -> Result<u64, RewriteError> {
    Ok(if t.data_type == FLOAT16 {
        t.f16_bytes()? * 2
    } else {
        match &t.external {
            Some(External { length: Some(l), .. }) => *l,
            _ => 0,
        }
    })
}

/// The refusal of a tensor of `after` bytes on the GPU, over `max`; `lookup_refused` says why it
/// could not leave the graph, where that was tried.
fn too_large(t: &Tensor, after: u64, max: u64, lookup_refused: Option<String>) -> RewriteError {
    t.error(match lookup_refused {
        Some(why) => format!(
            "its float32 form ({after} bytes) does not fit one GPU buffer ({max} bytes), and it cannot be looked up outside the graph: {why}"
        ),
        None if t.data_type == FLOAT16 => format!(
            "its float32 form ({after} bytes) does not fit one GPU buffer ({max} bytes), and lookups outside the graph are off"
        ),
        None => format!("it is not converted and its {after} bytes already do not fit one GPU buffer ({max} bytes)"),
    })
}

impl Taken {
    /// Takes the float16 table `t` out: each of its `gathers` becomes a float32 graph input.
    fn take(
        &mut self,
        t: &Tensor,
        gathers: &[&Node],
        inputs: &HashMap<&str, &[u8]>,
    ) -> Result<(), RewriteError> {
        let ext = t.external.as_ref().expect("lookup tables are external");
        let row_elements = t.dims[1..].iter().product::<u64>();
        for g in gathers {
            let ids = g.inputs[1];
            self.new_inputs.push(lookup_input(g.outputs[0], FLOAT, inputs[ids], &t.dims[1..])?);
            self.lookups.push(EmbeddingLookup {
                input: g.outputs[0].to_owned(),
                ids_input: ids.to_owned(),
                table: t.name.clone(),
                source: Range { file: ext.file.clone(), offset: ext.offset, length: t.f16_bytes()? },
                rows: t.dims[0],
                row_elements,
            });
            self.removed_nodes.insert(g.index);
        }
        self.removed_tables.insert(t.name.clone());
        self.extra_gpu -= t.f16_bytes()? as i64;
        Ok(())
    }
}

/// Where the converted external tensors go.
#[derive(Default)]
struct Placed {
    copies: Vec<TensorCopy>,
    new_files: Vec<NewFile>,
    /// Each converted external initializer's new range, by field index.
    targets: HashMap<usize, Range>,
}

/// Places the converted external tensors that stay in the graph, in graph order, in new files.
fn place_converted(
    read: &Checked,
    removed_tables: &HashSet<String>,
    options: &Options,
) -> Result<Placed, RewriteError> {
    let mut placed = Placed::default();
    for i in &read.order {
        let t = &read.tensors[i];
        let (Some(ext), FLOAT16) = (&t.external, t.data_type) else { continue };
        if removed_tables.contains(&t.name) {
            continue;
        }
        let length = t.f16_bytes()? * 2;
        if length > options.max_shard_bytes {
            return Err(t.error(format!(
                "its float32 form ({length} bytes) is larger than a new external-data file may be ({} bytes)",
                options.max_shard_bytes
            )));
        }
        let target = placed.allocate(length, options);
        placed.copies.push(TensorCopy {
            tensor: t.name.clone(),
            source: Range { file: ext.file.clone(), offset: ext.offset, length: length / 2 },
            target: target.clone(),
        });
        placed.targets.insert(*i, target);
    }
    Ok(placed)
}

impl Placed {
    /// `length` bytes after the last file's end, aligned, or at the start of a new file where they
    /// would make it larger than `options.max_shard_bytes`.
    fn allocate(&mut self, length: u64, options: &Options) -> Range {
        let mut offset = self.new_files.last().map_or(0, |f| f.size.div_ceil(ALIGN) * ALIGN);
        if self.new_files.is_empty() || offset + length > options.max_shard_bytes {
            self.new_files.push(NewFile { name: options.shard_name(self.new_files.len()), size: 0 });
            offset = 0;
        }
        let file = self.new_files.last_mut().expect("a file was just pushed");
        file.size = offset + length;
        Range { file: file.name.clone(), offset, length }
    }
}

/// The rewritten graph, and what writing it recorded for the plan.
#[derive(Default)]
struct Written {
    out: Vec<u8>,
    float32_io: Vec<String>,
    inline_converted: usize,
    /// The files the new graph reads, in first-use order.
    graph_files: Vec<String>,
    /// The files the original graph read, in first-use order.
    original_files: Vec<String>,
}

/// Writes the graph field by field, every field it does not change copied as it was, then the
/// lookups' new inputs.
fn write_graph(
    read: &Checked,
    taken: &Taken,
    targets: &HashMap<usize, Range>,
    graph_len: usize,
) -> Result<Written, RewriteError> {
    let new_input_names: HashSet<&str> = taken.lookups.iter().map(|l| l.input.as_str()).collect();
    let mut written = Written { out: Vec::with_capacity(graph_len + graph_len / 4), ..Written::default() };
    let mut node_index = 0;
    for (i, f) in read.fields.iter().enumerate() {
        match f.number {
            GRAPH_NODE => {
                let (node, kind) = (&read.nodes[node_index], read.kinds[node_index]);
                node_index += 1;
                if !taken.removed_nodes.contains(&node.index) {
                    written.node(f, node, kind)?;
                }
            }
            GRAPH_INITIALIZER => {
                written.initializer(f, &read.tensors[&i], targets.get(&i), &taken.removed_tables)?
            }
            GRAPH_INPUT | GRAPH_OUTPUT | GRAPH_VALUE_INFO => {
                written.value_info(f, &taken.removed_tables, &new_input_names)?
            }
            _ => written.out.extend_from_slice(f.raw),
        }
    }
    for input in &taken.new_inputs {
        wire::put_bytes_field(&mut written.out, GRAPH_INPUT, input);
    }
    Ok(written)
}

impl Written {
    fn node(&mut self, f: &Field, node: &Node, kind: Kind) -> Result<(), RewriteError> {
        match rewrite_node(node, kind)? {
            Some(new) => wire::put_bytes_field(&mut self.out, GRAPH_NODE, &new),
            None => self.out.extend_from_slice(f.raw),
        }
        Ok(())
    }

    /// Also records the files the initializer is read from, before and after.
    fn initializer(
        &mut self,
        f: &Field,
        t: &Tensor,
        target: Option<&Range>,
        removed_tables: &HashSet<String>,
    ) -> Result<(), RewriteError> {
        if let Some(ext) = &t.external {
            push_new(&mut self.original_files, &ext.file);
        }
        if removed_tables.contains(&t.name) {
            return Ok(());
        }
        let file = match (&t.external, target) {
            (_, Some(target)) => Some(&target.file),
            (Some(ext), None) => Some(&ext.file),
            (None, None) => None,
        };
        if let Some(file) = file {
            push_new(&mut self.graph_files, file);
        }
        if t.data_type == FLOAT16 {
            if t.external.is_none() {
                self.inline_converted += 1;
            }
            let converted = convert_tensor(f.bytes(GRAPH_PROTO)?, target)?;
            wire::put_bytes_field(&mut self.out, GRAPH_INITIALIZER, &converted);
        } else {
            self.out.extend_from_slice(f.raw);
        }
        Ok(())
    }

    /// Drops the removed tables' inputs and any value info of a new input; records the graph inputs
    /// and outputs made float32.
    fn value_info(
        &mut self,
        f: &Field,
        removed_tables: &HashSet<String>,
        new_input_names: &HashSet<&str>,
    ) -> Result<(), RewriteError> {
        let bytes = f.bytes(GRAPH_PROTO)?;
        let name = value_info_name(bytes)?;
        if (f.number == GRAPH_INPUT && removed_tables.contains(name))
            || (f.number == GRAPH_VALUE_INFO && new_input_names.contains(name))
        {
            return Ok(());
        }
        match rewrite_value_info(bytes)? {
            Some(new) => {
                if f.number != GRAPH_VALUE_INFO {
                    self.float32_io.push(name.to_owned());
                }
                wire::put_bytes_field(&mut self.out, f.number, &new);
            }
            None => self.out.extend_from_slice(f.raw),
        }
        Ok(())
    }

    /// The graph and its plan.
    fn finish(self, taken: Taken, placed: Placed) -> (Vec<u8>, Plan) {
        let Written { out, float32_io, inline_converted, graph_files, original_files } = self;
        let unused_files = original_files.into_iter().filter(|f| !graph_files.contains(f)).collect();
        let Placed { copies, new_files, .. } = placed;
        let plan = Plan {
            extra_disk_bytes: new_files.iter().map(|f| f.size).sum(),
            stale_bytes: copies
                .iter()
                .filter(|c| graph_files.contains(&c.source.file))
                .map(|c| c.source.length)
                .sum(),
            copies,
            new_files,
            graph_files,
            unused_files,
            lookups: taken.lookups,
            float32_io,
            inline_converted,
            extra_gpu_bytes: taken.extra_gpu,
        };
        (out, plan)
    }
}

/// Adds `file` to `files` unless it is there already.
fn push_new(files: &mut Vec<String>, file: &str) {
    if !files.iter().any(|f| f == file) {
        files.push(file.to_owned());
    }
}

/// Every place where a model still says float16: declared types, initializers, dtype attributes and
/// tensor attributes of its graph. Empty for a graph [`rewrite`] returned.
pub fn remaining_float16(model: &[u8]) -> Result<Vec<String>, RewriteError> {
    let mut found = Vec::new();
    for f in wire::parse(model, "ModelProto")? {
        if f.number != MODEL_GRAPH {
            continue;
        }
        for g in wire::parse(f.bytes("ModelProto")?, "GraphProto")? {
            let bytes = match g.value {
                Value::Bytes(b) => b,
                _ => continue,
            };
            match g.number {
                GRAPH_INPUT | GRAPH_OUTPUT | GRAPH_VALUE_INFO if rewrite_value_info(bytes)?.is_some() => {
                    found.push(format!("the type of {:?}", value_info_name(bytes)?));
                }
                GRAPH_INITIALIZER => {
                    let t = read_tensor(bytes)?;
                    if t.data_type == FLOAT16 {
                        found.push(format!("initializer {:?}", t.name));
                    }
                }
                GRAPH_NODE => {
                    let node = read_node(bytes, 0)?;
                    for a in &node.attributes {
                        for af in &a.fields {
                            let float16 = match af.number {
                                ATTR_I => {
                                    DTYPE_ATTRIBUTE_NAMES.contains(&a.name)
                                        && af.value == Value::Varint(FLOAT16)
                                }
                                ATTR_T | ATTR_TENSORS => {
                                    read_tensor(af.bytes("AttributeProto")?)?.data_type == FLOAT16
                                }
                                _ => false,
                            };
                            if float16 {
                                found.push(format!(
                                    "attribute `{}` of node {:?} ({})",
                                    a.name, node.name, node.op_type
                                ));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(found)
}

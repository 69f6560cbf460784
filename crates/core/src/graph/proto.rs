//! The pieces of an ONNX graph every edit reads and writes: nodes, tensors, value infos and the
//! model's graph field, over the wire format of [`crate::onnx`]; and a message copied with edits.

use super::{ops, RewriteError};
use crate::onnx::fields::*;
use crate::onnx::wire::{self, Field, Value};
use crate::pack::validate_relative_path;

/// What to do with one field of a message being copied.
pub(super) enum Edit {
    Keep,
    Drop,
    Replace(Vec<u8>),
}

/// Copies a message, applying `edit` to each field. `None` when nothing changed.
pub(super) fn edit_message(
    bytes: &[u8],
    what: &'static str,
    mut edit: impl FnMut(&Field) -> Result<Edit, RewriteError>,
) -> Result<Option<Vec<u8>>, RewriteError> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut changed = false;
    for field in wire::parse(bytes, what)? {
        match edit(&field)? {
            Edit::Keep => out.extend_from_slice(field.raw),
            Edit::Drop => changed = true,
            Edit::Replace(new) => {
                changed = true;
                out.extend_from_slice(&new);
            }
        }
    }
    Ok(changed.then_some(out))
}

pub(super) fn bytes_field(number: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 6);
    wire::put_bytes_field(&mut out, number, payload);
    out
}

pub(super) fn varint_field(number: u64, v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    wire::put_varint_field(&mut out, number, v);
    out
}

pub(super) fn entry(key: &str, value: &str) -> Vec<u8> {
    let mut e = bytes_field(ENTRY_KEY, key.as_bytes());
    e.extend(bytes_field(ENTRY_VALUE, value.as_bytes()));
    e
}

/// An initializer (or attribute tensor) as far as the rewrite needs it.
pub(super) struct Tensor {
    pub(super) name: String,
    pub(super) data_type: u64,
    pub(super) dims: Vec<u64>,
    pub(super) external: Option<External>,
    pub(super) segmented: bool,
}

pub(super) struct External {
    pub(super) file: String,
    pub(super) offset: u64,
    pub(super) length: Option<u64>,
}

impl Tensor {
    pub(super) fn error(&self, reason: impl Into<String>) -> RewriteError {
        RewriteError::Tensor { name: self.name.clone(), reason: reason.into() }
    }

    pub(super) fn elements(&self) -> Result<u64, RewriteError> {
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| self.error("its dims overflow"))
    }

    /// Bytes of its float16 data, checked against its external `length` when it has one.
    pub(super) fn f16_bytes(&self) -> Result<u64, RewriteError> {
        let bytes = self.elements()?.checked_mul(2).ok_or_else(|| self.error("its dims overflow"))?;
        if let Some(External { length: Some(length), .. }) = &self.external {
            if *length != bytes {
                return Err(self.error(format!(
                    "its external data is {length} bytes long, but {} float16 elements take {bytes}",
                    self.elements()?
                )));
            }
        }
        Ok(bytes)
    }
}

pub(super) fn read_tensor(bytes: &[u8]) -> Result<Tensor, RewriteError> {
    const WHAT: &str = "TensorProto";
    let mut t =
        Tensor { name: String::new(), data_type: 0, dims: Vec::new(), external: None, segmented: false };
    let (mut external, mut location, mut offset, mut length) = (false, None, None, None);
    for f in wire::parse(bytes, WHAT)? {
        match (f.number, f.value) {
            (TENSOR_DIMS, Value::Varint(d)) => t.dims.push(d),
            (TENSOR_DIMS, Value::Bytes(b)) => t.dims.extend(wire::packed_varints(b, WHAT)?),
            (TENSOR_DATA_TYPE, _) => t.data_type = f.varint(WHAT)?,
            (TENSOR_NAME, _) => t.name = f.string(WHAT)?.to_owned(),
            (TENSOR_SEGMENT, _) => t.segmented = true,
            (TENSOR_DATA_LOCATION, _) => external = f.varint(WHAT)? == DATA_LOCATION_EXTERNAL,
            (TENSOR_EXTERNAL_DATA, _) => {
                let (key, value) = string_entry(f.bytes(WHAT)?)?;
                match key {
                    "location" => location = Some(value),
                    "offset" => offset = Some(value),
                    "length" => length = Some(value),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    if external {
        let number = |v: Option<&str>, what: &str| -> Result<Option<u64>, RewriteError> {
            v.map(|v| {
                v.parse::<u64>()
                    .map_err(|_| t.error(format!("its external-data {what} {v:?} is not a number")))
            })
            .transpose()
        };
        let location = location.ok_or_else(|| t.error("it is external but has no location"))?;
        let file = validate_relative_path(location).map_err(|e| t.error(e.to_string()))?.to_owned();
        t.external = Some(External {
            file,
            offset: number(offset, "offset")?.unwrap_or(0),
            length: number(length, "length")?,
        });
    }
    Ok(t)
}

pub(super) fn string_entry(bytes: &[u8]) -> Result<(&str, &str), RewriteError> {
    const WHAT: &str = "StringStringEntryProto";
    let (mut key, mut value) = ("", "");
    for f in wire::parse(bytes, WHAT)? {
        match f.number {
            ENTRY_KEY => key = f.string(WHAT)?,
            ENTRY_VALUE => value = f.string(WHAT)?,
            _ => {}
        }
    }
    Ok((key, value))
}

/// One node, read.
pub(super) struct Node<'a> {
    pub(super) index: usize,
    pub(super) bytes: &'a [u8],
    pub(super) name: &'a str,
    pub(super) op_type: &'a str,
    pub(super) domain: &'a str,
    pub(super) inputs: Vec<&'a str>,
    pub(super) outputs: Vec<&'a str>,
    pub(super) attributes: Vec<Attribute<'a>>,
}

pub(super) struct Attribute<'a> {
    pub(super) name: &'a str,
    pub(super) fields: Vec<Field<'a>>,
}

impl Node<'_> {
    pub(super) fn error(&self, reason: impl Into<String>) -> RewriteError {
        RewriteError::Node {
            index: self.index,
            name: self.name.to_owned(),
            op: format!("{}::{}", ops::domain_name(self.domain), self.op_type),
            reason: reason.into(),
        }
    }

    pub(super) fn is_onnx(&self, op_type: &str) -> bool {
        matches!(self.domain, "" | "ai.onnx") && self.op_type == op_type
    }

    pub(super) fn int_attribute(&self, name: &str) -> Option<u64> {
        let a = self.attributes.iter().find(|a| a.name == name)?;
        a.fields.iter().find(|f| f.number == ATTR_I).and_then(|f| f.varint("AttributeProto").ok())
    }
}

pub(super) fn read_node(bytes: &[u8], index: usize) -> Result<Node<'_>, RewriteError> {
    const WHAT: &str = "NodeProto";
    let mut node = Node {
        index,
        bytes,
        name: "",
        op_type: "",
        domain: "",
        inputs: Vec::new(),
        outputs: Vec::new(),
        attributes: Vec::new(),
    };
    for f in wire::parse(bytes, WHAT)? {
        match f.number {
            NODE_INPUT => node.inputs.push(f.string(WHAT)?),
            NODE_OUTPUT => node.outputs.push(f.string(WHAT)?),
            NODE_NAME => node.name = f.string(WHAT)?,
            NODE_OP_TYPE => node.op_type = f.string(WHAT)?,
            NODE_DOMAIN => node.domain = f.string(WHAT)?,
            NODE_ATTRIBUTE => {
                let fields = wire::parse(f.bytes(WHAT)?, "AttributeProto")?;
                let mut name = "";
                for a in &fields {
                    if a.number == ATTR_NAME {
                        name = a.string("AttributeProto")?;
                    }
                }
                node.attributes.push(Attribute { name, fields });
            }
            _ => {}
        }
    }
    Ok(node)
}

pub(super) fn value_info_name(bytes: &[u8]) -> Result<&str, RewriteError> {
    for f in wire::parse(bytes, "ValueInfoProto")? {
        if f.number == VALUE_INFO_NAME {
            return Ok(f.string("ValueInfoProto")?);
        }
    }
    Ok("")
}

/// The dims (raw Dimension fields) of a tensor-typed ValueInfoProto, if it has a shape.
pub(super) fn shape_dims(value_info: &[u8]) -> Result<Option<Vec<&[u8]>>, RewriteError> {
    for f in wire::parse(value_info, "ValueInfoProto")? {
        if f.number != VALUE_INFO_TYPE {
            continue;
        }
        for t in wire::parse(f.bytes("ValueInfoProto")?, "TypeProto")? {
            if t.number != TYPE_TENSOR {
                continue;
            }
            for s in wire::parse(t.bytes("TypeProto")?, "TypeProto.Tensor")? {
                if s.number == TENSOR_TYPE_SHAPE {
                    let dims = wire::parse(s.bytes("TypeProto.Tensor")?, "TensorShapeProto")?;
                    return Ok(Some(dims.iter().filter(|d| d.number == SHAPE_DIM).map(|d| d.raw).collect()));
                }
            }
        }
    }
    Ok(None)
}

/// The model of `fields` (a parsed ModelProto) with `graph` in place of its graph, every other field
/// copied as it was.
/// The GraphProto of a ModelProto's `fields` (its first graph).
pub(super) fn model_graph<'a>(fields: &[Field<'a>]) -> Result<&'a [u8], RewriteError> {
    match fields.iter().find(|f| f.number == MODEL_GRAPH) {
        Some(f) => Ok(f.bytes("ModelProto")?),
        None => Err(RewriteError::Model("it has no graph".into())),
    }
}

pub(super) fn with_graph(fields: &[Field], graph: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(fields.iter().map(|f| f.raw.len()).sum::<usize>() + graph.len());
    for f in fields {
        if f.number == MODEL_GRAPH {
            wire::put_bytes_field(&mut out, MODEL_GRAPH, graph);
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    out
}

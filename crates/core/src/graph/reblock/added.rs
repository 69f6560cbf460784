//! The nodes and initializers [`super::to_block_32`] adds in front of the graph: the repeats of
//! scales and zero points, B's padding dropped, and the tensors computed into the data file.

use super::{int_attribute, ComputedData, Plan};
use crate::graph::proto::{bytes_field, entry};
use crate::onnx::fields::*;
use crate::onnx::wire;

/// The nodes and constant initializers added in front of the re-blocked nodes.
#[derive(Default)]
pub(super) struct Added {
    pub(super) nodes: Vec<Vec<u8>>,
    pub(super) tensors: Vec<Vec<u8>>,
}

impl Added {
    /// Adds `op_type(inputs) -> prefix + name` (default domain, integer attributes); the output name.
    fn node(
        &mut self,
        prefix: &str,
        name: &str,
        op_type: &str,
        inputs: &[&str],
        attributes: &[(&str, u64)],
    ) -> String {
        let output = format!("{prefix}{name}");
        let mut n = Vec::new();
        for i in inputs {
            wire::put_bytes_field(&mut n, NODE_INPUT, i.as_bytes());
        }
        wire::put_bytes_field(&mut n, NODE_OUTPUT, output.as_bytes());
        wire::put_bytes_field(&mut n, NODE_NAME, output.as_bytes());
        wire::put_bytes_field(&mut n, NODE_OP_TYPE, op_type.as_bytes());
        for (attribute, value) in attributes {
            n.extend(bytes_field(NODE_ATTRIBUTE, &int_attribute(attribute, *value)));
        }
        self.nodes.push(n);
        output
    }

    /// Adds a constant initializer `prefix + name` with little-endian `raw` data; its name.
    fn constant(&mut self, prefix: &str, name: &str, data_type: u64, dims: &[u64], raw: Vec<u8>) -> String {
        let name = format!("{prefix}{name}");
        let mut t = Vec::new();
        for d in dims {
            wire::put_varint_field(&mut t, TENSOR_DIMS, *d);
        }
        wire::put_varint_field(&mut t, TENSOR_DATA_TYPE, data_type);
        wire::put_bytes_field(&mut t, TENSOR_NAME, name.as_bytes());
        wire::put_bytes_field(&mut t, TENSOR_RAW_DATA, &raw);
        self.tensors.push(t);
        name
    }

    /// Adds an initializer `prefix + name` whose `values` are appended to `data` and read from there;
    /// its name.
    pub(super) fn computed(
        &mut self,
        prefix: &str,
        name: &str,
        data_type: u64,
        dims: &[u64],
        values: Vec<u8>,
        data: &mut ComputedData,
    ) -> String {
        let name = format!("{prefix}{name}");
        let offset = data.append(&values);
        let mut t = Vec::new();
        for d in dims {
            wire::put_varint_field(&mut t, TENSOR_DIMS, *d);
        }
        wire::put_varint_field(&mut t, TENSOR_DATA_TYPE, data_type);
        wire::put_bytes_field(&mut t, TENSOR_NAME, name.as_bytes());
        for (key, value) in [
            ("location", data.location.to_owned()),
            ("offset", offset.to_string()),
            ("length", values.len().to_string()),
        ] {
            wire::put_bytes_field(&mut t, TENSOR_EXTERNAL_DATA, &entry(key, &value));
        }
        wire::put_varint_field(&mut t, TENSOR_DATA_LOCATION, DATA_LOCATION_EXTERNAL);
        self.tensors.push(t);
        name
    }

    fn int64s(&mut self, prefix: &str, name: &str, values: &[u64]) -> String {
        let raw = values.iter().flat_map(|v| (*v as i64).to_le_bytes()).collect();
        self.constant(prefix, name, INT64, &[values.len() as u64], raw)
    }

    pub(super) fn reshape(&mut self, prefix: &str, name: &str, input: &str, shape: &[u64]) -> String {
        let shape = self.int64s(prefix, &format!("{name}_shape"), shape);
        self.node(prefix, name, "Reshape", &[input, &shape], &[])
    }

    /// The first `keep` columns of a 2-D `input`.
    pub(super) fn slice_columns(&mut self, prefix: &str, name: &str, input: &str, keep: u64) -> String {
        let starts = self.int64s(prefix, &format!("{name}_starts"), &[0]);
        let ends = self.int64s(prefix, &format!("{name}_ends"), &[keep]);
        let axes = self.int64s(prefix, &format!("{name}_axes"), &[1]);
        self.node(prefix, name, "Slice", &[input, &starts, &ends, &axes], &[])
    }

    /// `input`, one value per old block of each column ([N, blocks] or flat), with every value
    /// repeated `times` and each column cut to `keep` values: [N, keep].
    pub(super) fn repeat_blocks(
        &mut self,
        prefix: &str,
        name: &str,
        input: &str,
        plan: &Plan,
        times: u64,
        keep: u64,
    ) -> String {
        let column = self.reshape(prefix, &format!("{name}_per_block"), input, &[plan.n, plan.blocks, 1]);
        let repeat = self.int64s(prefix, &format!("{name}_repeat"), &[1, 1, times]);
        let repeated = self.node(prefix, &format!("{name}_repeated"), "Expand", &[&column, &repeat], &[]);
        let flat = self.reshape(prefix, &format!("{name}_flat"), &repeated, &[plan.n, plan.blocks * times]);
        if plan.blocks * times == keep {
            flat
        } else {
            self.slice_columns(prefix, name, &flat, keep)
        }
    }

    /// 4-bit zero points ([N, ceil(blocks / 2)] bytes, low nibble first) as one uint8 byte per old block
    /// holding its nibble twice (`z * 17`): [N, blocks]. Computed in int32, which every ONNX Runtime
    /// build has `Mod`, `Div` and `Mul` kernels for.
    pub(super) fn unpack_nibbles(&mut self, prefix: &str, input: &str, plan: &Plan) -> String {
        let bytes = plan.blocks.div_ceil(2);
        let wide = self.node(prefix, "zp_int", "Cast", &[input], &[("to", INT32)]);
        let column = self.reshape(prefix, "zp_bytes", &wide, &[plan.n, bytes, 1]);
        let sixteen = self.constant(prefix, "zp_16", INT32, &[], 16i32.to_le_bytes().to_vec());
        let low = self.node(prefix, "zp_low", "Mod", &[&column, &sixteen], &[]);
        let high = self.node(prefix, "zp_high", "Div", &[&column, &sixteen], &[]);
        let pairs = self.node(prefix, "zp_pairs", "Concat", &[&low, &high], &[("axis", 2)]);
        let nibbles = self.reshape(prefix, "zp_nibbles", &pairs, &[plan.n, bytes * 2]);
        let nibbles = if bytes * 2 == plan.blocks {
            nibbles
        } else {
            self.slice_columns(prefix, "zp_blocks", &nibbles, plan.blocks)
        };
        let seventeen = self.constant(prefix, "zp_17", INT32, &[], 17i32.to_le_bytes().to_vec());
        let doubled = self.node(prefix, "zp_doubled", "Mul", &[&nibbles, &seventeen], &[]);
        self.node(prefix, "zp_per_block", "Cast", &[&doubled], &[("to", UINT8)])
    }
}

//! Field numbers of the messages of `onnx.proto` that the readers and the rewrites touch, and the enum
//! values they compare with. Named `<MESSAGE>_<FIELD>`.

// ModelProto.
pub(crate) const MODEL_GRAPH: u64 = 7;
pub(crate) const MODEL_OPSET_IMPORT: u64 = 8;
pub(crate) const MODEL_TRAINING_INFO: u64 = 20;
pub(crate) const MODEL_FUNCTIONS: u64 = 25;
// OperatorSetIdProto.
pub(crate) const OPSET_DOMAIN: u64 = 1;
pub(crate) const OPSET_VERSION: u64 = 2;
// GraphProto.
pub(crate) const GRAPH_NODE: u64 = 1;
pub(crate) const GRAPH_INITIALIZER: u64 = 5;
pub(crate) const GRAPH_INPUT: u64 = 11;
pub(crate) const GRAPH_OUTPUT: u64 = 12;
pub(crate) const GRAPH_VALUE_INFO: u64 = 13;
pub(crate) const GRAPH_SPARSE_INITIALIZER: u64 = 15;
// NodeProto.
pub(crate) const NODE_INPUT: u64 = 1;
pub(crate) const NODE_OUTPUT: u64 = 2;
pub(crate) const NODE_NAME: u64 = 3;
pub(crate) const NODE_OP_TYPE: u64 = 4;
pub(crate) const NODE_ATTRIBUTE: u64 = 5;
pub(crate) const NODE_DOMAIN: u64 = 7;
// AttributeProto.
pub(crate) const ATTR_NAME: u64 = 1;
pub(crate) const ATTR_F: u64 = 2;
pub(crate) const ATTR_I: u64 = 3;
pub(crate) const ATTR_S: u64 = 4;
pub(crate) const ATTR_T: u64 = 5;
pub(crate) const ATTR_INTS: u64 = 8;
pub(crate) const ATTR_G: u64 = 6;
pub(crate) const ATTR_TENSORS: u64 = 10;
pub(crate) const ATTR_GRAPHS: u64 = 11;
pub(crate) const ATTR_TP: u64 = 14;
pub(crate) const ATTR_TYPE_PROTOS: u64 = 15;
pub(crate) const ATTR_TYPE: u64 = 20;
pub(crate) const ATTR_SPARSE_TENSOR: u64 = 22;
pub(crate) const ATTR_SPARSE_TENSORS: u64 = 23;
// AttributeProto.AttributeType.
pub(crate) const ATTR_TYPE_FLOAT: u64 = 1;
pub(crate) const ATTR_TYPE_INT: u64 = 2;
pub(crate) const ATTR_TYPE_GRAPH: u64 = 5;
pub(crate) const ATTR_TYPE_GRAPHS: u64 = 10;
// TensorProto.
pub(crate) const TENSOR_DIMS: u64 = 1;
pub(crate) const TENSOR_DATA_TYPE: u64 = 2;
pub(crate) const TENSOR_SEGMENT: u64 = 3;
pub(crate) const TENSOR_FLOAT_DATA: u64 = 4;
pub(crate) const TENSOR_INT32_DATA: u64 = 5;
pub(crate) const TENSOR_INT64_DATA: u64 = 7;
pub(crate) const TENSOR_NAME: u64 = 8;
pub(crate) const TENSOR_RAW_DATA: u64 = 9;
pub(crate) const TENSOR_DOUBLE_DATA: u64 = 10;
pub(crate) const TENSOR_EXTERNAL_DATA: u64 = 13;
pub(crate) const TENSOR_DATA_LOCATION: u64 = 14;
// TensorProto.DataLocation.
pub(crate) const DATA_LOCATION_EXTERNAL: u64 = 1;
// SparseTensorProto.
pub(crate) const SPARSE_VALUES: u64 = 1;
// StringStringEntryProto.
pub(crate) const ENTRY_KEY: u64 = 1;
pub(crate) const ENTRY_VALUE: u64 = 2;
// ValueInfoProto.
pub(crate) const VALUE_INFO_NAME: u64 = 1;
pub(crate) const VALUE_INFO_TYPE: u64 = 2;
// TypeProto.
pub(crate) const TYPE_TENSOR: u64 = 1;
pub(crate) const TYPE_SEQUENCE: u64 = 4;
pub(crate) const TYPE_MAP: u64 = 5;
pub(crate) const TYPE_SPARSE_TENSOR: u64 = 8;
pub(crate) const TYPE_OPTIONAL: u64 = 9;
// TypeProto.Tensor.
pub(crate) const TENSOR_TYPE_ELEM_TYPE: u64 = 1;
pub(crate) const TENSOR_TYPE_SHAPE: u64 = 2;
// TypeProto.Sequence, .Map, .Optional.
pub(crate) const SEQUENCE_ELEM_TYPE: u64 = 1;
pub(crate) const MAP_VALUE_TYPE: u64 = 2;
pub(crate) const OPTIONAL_ELEM_TYPE: u64 = 1;
// TensorShapeProto, and its Dimension.
pub(crate) const SHAPE_DIM: u64 = 1;
pub(crate) const DIM_VALUE: u64 = 1;
pub(crate) const DIM_PARAM: u64 = 2;

// TensorProto.DataType.
pub(crate) const FLOAT: u64 = 1;
pub(crate) const UINT8: u64 = 2;
pub(crate) const INT8: u64 = 3;
pub(crate) const INT32: u64 = 6;
pub(crate) const INT64: u64 = 7;
pub(crate) const BOOL: u64 = 9;
pub(crate) const FLOAT16: u64 = 10;
pub(crate) const DOUBLE: u64 = 11;
pub(crate) const BFLOAT16: u64 = 16;

//! The operators the rewrite accepts, and how each one's dtype is decided.
//!
//! An operator is listed only when, once every float16 tensor feeding it is float32, it computes the
//! same function in float32: its float outputs take their type from its float inputs (one type
//! variable, as ONNX's type constraints say), or from an attribute listed here and rewritten
//! (`Cast.to`, `EyeLike.dtype`, ...), or from a tensor attribute that is converted (`Constant.value`,
//! `ConstantOfShape.value`). Anything else is refused, naming the node.

/// How a listed operator's output dtype is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// From its inputs only.
    Agnostic,
    /// From its inputs, or from these integer attributes holding a `TensorProto.DataType`; a value of
    /// FLOAT16 becomes FLOAT.
    DtypeAttrs(&'static [&'static str]),
    /// From a tensor attribute (`value`), converted when it is float16.
    TensorAttr,
}

use Kind::*;

/// The ONNX domain (`""` or `ai.onnx`). Opset versions do not matter: no listed operator changed how
/// it decides its dtype across versions.
const ONNX: &[(&str, Kind)] = &[
    ("Abs", Agnostic),
    ("Acos", Agnostic),
    ("Add", Agnostic),
    ("And", Agnostic),
    ("ArgMax", Agnostic),
    ("ArgMin", Agnostic),
    ("Asin", Agnostic),
    ("Atan", Agnostic),
    ("AveragePool", Agnostic),
    ("BatchNormalization", Agnostic),
    ("Bernoulli", DtypeAttrs(&["dtype"])),
    ("Cast", DtypeAttrs(&["to"])),
    ("CastLike", Agnostic),
    ("Ceil", Agnostic),
    ("Clip", Agnostic),
    ("Concat", Agnostic),
    ("Constant", TensorAttr),
    ("ConstantOfShape", TensorAttr),
    ("Conv", Agnostic),
    ("ConvTranspose", Agnostic),
    ("Cos", Agnostic),
    ("Cosh", Agnostic),
    ("CumSum", Agnostic),
    ("DepthToSpace", Agnostic),
    ("DequantizeLinear", DtypeAttrs(&["output_dtype"])),
    ("Div", Agnostic),
    ("Dropout", Agnostic),
    ("Einsum", Agnostic),
    ("Elu", Agnostic),
    ("Equal", Agnostic),
    ("Erf", Agnostic),
    ("Exp", Agnostic),
    ("Expand", Agnostic),
    ("EyeLike", DtypeAttrs(&["dtype"])),
    ("Flatten", Agnostic),
    ("Floor", Agnostic),
    ("Gather", Agnostic),
    ("GatherElements", Agnostic),
    ("GatherND", Agnostic),
    ("Gelu", Agnostic),
    ("Gemm", Agnostic),
    ("GlobalAveragePool", Agnostic),
    ("GlobalMaxPool", Agnostic),
    ("Greater", Agnostic),
    ("GreaterOrEqual", Agnostic),
    ("GroupNormalization", DtypeAttrs(&["stash_type"])),
    ("HardSigmoid", Agnostic),
    ("HardSwish", Agnostic),
    ("Identity", Agnostic),
    ("InstanceNormalization", Agnostic),
    ("IsInf", Agnostic),
    ("IsNaN", Agnostic),
    ("LayerNormalization", DtypeAttrs(&["stash_type"])),
    ("LeakyRelu", Agnostic),
    ("Less", Agnostic),
    ("LessOrEqual", Agnostic),
    ("Log", Agnostic),
    ("LogSoftmax", Agnostic),
    ("MatMul", Agnostic),
    ("Max", Agnostic),
    ("MaxPool", Agnostic),
    ("Mean", Agnostic),
    ("Min", Agnostic),
    ("Mish", Agnostic),
    ("Mod", Agnostic),
    ("Mul", Agnostic),
    ("Neg", Agnostic),
    ("NonZero", Agnostic),
    ("Not", Agnostic),
    ("OneHot", Agnostic),
    ("Or", Agnostic),
    ("Pad", Agnostic),
    ("Pow", Agnostic),
    ("PRelu", Agnostic),
    ("QuantizeLinear", DtypeAttrs(&["output_dtype"])),
    ("RandomNormal", DtypeAttrs(&["dtype"])),
    ("RandomNormalLike", DtypeAttrs(&["dtype"])),
    ("RandomUniform", DtypeAttrs(&["dtype"])),
    ("RandomUniformLike", DtypeAttrs(&["dtype"])),
    ("Range", Agnostic),
    ("Reciprocal", Agnostic),
    ("ReduceL2", Agnostic),
    ("ReduceMax", Agnostic),
    ("ReduceMean", Agnostic),
    ("ReduceMin", Agnostic),
    ("ReduceProd", Agnostic),
    ("ReduceSum", Agnostic),
    ("ReduceSumSquare", Agnostic),
    ("Relu", Agnostic),
    ("Reshape", Agnostic),
    ("Resize", Agnostic),
    ("RMSNormalization", DtypeAttrs(&["stash_type"])),
    ("Round", Agnostic),
    ("ScatterElements", Agnostic),
    ("ScatterND", Agnostic),
    ("Selu", Agnostic),
    ("Shape", Agnostic),
    ("Sigmoid", Agnostic),
    ("Sign", Agnostic),
    // ONNX Runtime registers this contrib operator in the ONNX domain.
    ("SimplifiedLayerNormalization", DtypeAttrs(&["stash_type"])),
    ("Sin", Agnostic),
    ("Sinh", Agnostic),
    ("Size", Agnostic),
    ("Slice", Agnostic),
    ("Softmax", Agnostic),
    ("Softplus", Agnostic),
    ("Softsign", Agnostic),
    ("SpaceToDepth", Agnostic),
    ("Split", Agnostic),
    ("Sqrt", Agnostic),
    ("Squeeze", Agnostic),
    ("Sub", Agnostic),
    ("Sum", Agnostic),
    ("Tan", Agnostic),
    ("Tanh", Agnostic),
    ("Tile", Agnostic),
    ("TopK", Agnostic),
    ("Transpose", Agnostic),
    ("Trilu", Agnostic),
    ("Unsqueeze", Agnostic),
    ("Where", Agnostic),
    ("Xor", Agnostic),
];

/// ONNX Runtime's contrib domain (`com.microsoft`): what a Qwen3 or FLUX.2 export through ONNX
/// Runtime's transformer optimizer and `MatMulNBitsQuantizer` uses. Each one's float inputs and
/// outputs share one type variable `T` (MatMulNBits: `A`, `scales`, a float `zero_points` and `bias`
/// share `T1`; `B` stays uint8).
const MICROSOFT: &[(&str, Kind)] = &[
    ("Attention", Agnostic),
    ("BiasAdd", Agnostic),
    ("BiasGelu", Agnostic),
    ("FastGelu", Agnostic),
    ("FusedMatMul", Agnostic),
    ("Gelu", Agnostic),
    ("GroupQueryAttention", Agnostic),
    ("MatMulNBits", Agnostic),
    ("MultiHeadAttention", Agnostic),
    ("QuickGelu", Agnostic),
    ("RotaryEmbedding", Agnostic),
    ("SimplifiedLayerNormalization", DtypeAttrs(&["stash_type"])),
    ("SkipLayerNormalization", Agnostic),
    ("SkipSimplifiedLayerNormalization", Agnostic),
];

/// The domain as shown in messages: `ai.onnx` for the default one.
pub(crate) fn domain_name(domain: &str) -> &str {
    if domain.is_empty() {
        "ai.onnx"
    } else {
        domain
    }
}

/// How `domain::op_type` decides its dtype, or `None` when it is not supported.
pub(crate) fn kind(domain: &str, op_type: &str) -> Option<Kind> {
    let table = match domain {
        "" | "ai.onnx" => ONNX,
        "com.microsoft" => MICROSOFT,
        _ => return None,
    };
    table.iter().find(|(name, _)| *name == op_type).map(|&(_, kind)| kind)
}

/// Every supported operator as `domain::op_type`, for documentation and messages.
///
/// The list covers the fixture packs' operators, what a Qwen3 or FLUX.2 export through ONNX Runtime's
/// optimizer and `MatMulNBitsQuantizer` uses (`com.microsoft` norms, `MatMulNBits`, rotary embedding,
/// attention and Gelu variants), and the other ONNX operators whose dtype follows their inputs.
/// `tests/reference/check_converted.py` runs the common ones converted on ONNX Runtime; the attention
/// contrib operators are listed by their type constraints but not run there (their CPU kernels'
/// float16 support varies).
pub fn supported_operators() -> Vec<String> {
    ONNX.iter()
        .map(|(op, _)| format!("ai.onnx::{op}"))
        .chain(MICROSOFT.iter().map(|(op, _)| format!("com.microsoft::{op}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted_and_unique() {
        for table in [ONNX, MICROSOFT] {
            for pair in table.windows(2) {
                assert!(pair[0].0.to_lowercase() < pair[1].0.to_lowercase(), "{} / {}", pair[0].0, pair[1].0);
            }
        }
    }

    #[test]
    fn lookups() {
        assert_eq!(kind("", "Cast"), Some(DtypeAttrs(&["to"])));
        assert_eq!(kind("ai.onnx", "MatMul"), Some(Agnostic));
        assert_eq!(kind("com.microsoft", "MatMulNBits"), Some(Agnostic));
        assert_eq!(kind("com.microsoft", "MatMul"), None);
        assert_eq!(kind("", "If"), None);
        assert_eq!(kind("custom", "Cast"), None);
        assert!(supported_operators().contains(&"com.microsoft::GroupQueryAttention".to_string()));
    }
}

//! A graph cut into pieces of about equal weights, for a stage whose weights do not fit beside its
//! work: the transformer, streamed a piece at a time (`imagine_ort::Chain::streamed`).

use super::*;
use crate::session::{DType, Dim, TensorInfo};

/// `model` cut into `parts` pieces of consecutive nodes whose initializers weigh about the same, each
/// [`Piece`]'s `bytes` being its initializers' (an initializer read on both sides of a cut is in both
/// pieces). Unlike [`split`], nothing is sized or computed again: every value a later piece reads is
/// passed to it, so a cut is allowed only where each value crossing it has a declared element type
/// (the piece's graph must declare its inputs and outputs). One piece, the model as it was, for
/// `parts` of 1 or a graph with no allowed cut.
pub fn by_weights(model: &[u8], parts: u32) -> Result<Vec<Piece>, SplitError> {
    let graph = Graph::structure(model)?;
    let n = graph.nodes.len();
    let weights = graph.weights_before();
    let total = weights[n];
    let allowed = graph.cuts_passing_declared();
    let mut cuts = vec![0];
    for k in 1..u64::from(parts.max(1)) {
        let target = total / u64::from(parts) * k;
        let after = *cuts.last().expect("starts with 0");
        // Every piece reads some weights of its own.
        let nearest = (after + 1..n)
            .filter(|&c| allowed[c] && weights[c] > weights[after] && weights[c] < total)
            .min_by_key(|&c| weights[c].abs_diff(target));
        if let Some(c) = nearest {
            cuts.push(c);
        }
    }
    cuts.push(n);
    if cuts.len() <= 2 {
        return Ok(vec![Piece {
            model: model.to_vec(),
            inputs: graph.inputs.iter().map(|s| s.to_string()).collect(),
            outputs: graph.outputs.iter().map(|s| s.to_string()).collect(),
            nodes: 0..n,
            bytes: total,
        }]);
    }
    cuts.windows(2)
        .map(|w| {
            let plan = graph.plan(w[0], w[1]);
            Ok(Piece {
                model: graph.write(&plan)?,
                inputs: plan.inputs.iter().map(|s| s.to_string()).collect(),
                outputs: plan.outputs.iter().map(|s| s.to_string()).collect(),
                bytes: graph.weights_of(&plan),
                nodes: plan.own,
            })
        })
        .collect()
}

/// The graph inputs (not initializers) and outputs `model` declares, as ONNX Runtime reports them: what
/// a streamed chain takes and gives without making a session to ask.
pub fn declared_io(model: &[u8]) -> Result<(Vec<TensorInfo>, Vec<TensorInfo>), SplitError> {
    let graph = Graph::structure(model)?;
    let infos = |names: &[&str]| -> Result<Vec<TensorInfo>, SplitError> {
        names.iter().map(|name| tensor_info(name, graph.declared.get(name).copied())).collect()
    };
    Ok((infos(&graph.inputs)?, infos(&graph.outputs)?))
}

/// The tensor `name` as its ValueInfoProto declares it: element type by ONNX Runtime's name, dims fixed
/// or named (an unnamed symbolic dim has an empty name).
fn tensor_info(name: &str, value_info: Option<&[u8]>) -> Result<TensorInfo, SplitError> {
    let declared = value_info.map(declared_type).transpose()?.flatten();
    let Some(Declared { elem, dims, dim_names }) = declared else {
        return Err(SplitError::Model(format!("it does not declare {name:?} as a tensor")));
    };
    let shape = dims
        .unwrap_or_default()
        .into_iter()
        .zip(dim_names)
        .map(|(dim, name)| dim.map_or(Dim::Symbolic(name), |d| Dim::Fixed(d as i64)))
        .collect();
    Ok(TensorInfo { name: name.to_owned(), dtype: DType::from_name(elem_name(elem)), shape })
}

/// ONNX Runtime Web's name of an ONNX element type.
fn elem_name(elem: u64) -> &'static str {
    match elem {
        FLOAT => "float32",
        UINT8 => "uint8",
        INT8 => "int8",
        INT32 => "int32",
        INT64 => "int64",
        BOOL => "bool",
        FLOAT16 => "float16",
        DOUBLE => "float64",
        _ => "unknown",
    }
}

impl<'a> Graph<'a> {
    /// For each `c` in `0..=n`, the bytes of the initializers first read by a node before `c`.
    fn weights_before(&self) -> Vec<u64> {
        let mut seen = HashSet::new();
        let mut before = Vec::with_capacity(self.nodes.len() + 1);
        let mut sum = 0;
        before.push(0);
        for node in &self.nodes {
            for &name in &node.inputs {
                if self.initializers.contains(name) && seen.insert(name) {
                    sum += self.infos.get(name).map_or(0, Info::bytes);
                }
            }
            before.push(sum);
        }
        before
    }

    /// The bytes of the initializers `plan`'s nodes read.
    fn weights_of(&self, plan: &Plan) -> u64 {
        let read: HashSet<&str> = plan
            .nodes
            .iter()
            .flat_map(|&i| self.nodes[i].inputs.iter().copied())
            .filter(|i| self.initializers.contains(i))
            .collect();
        read.iter().map(|i| self.infos.get(i).map_or(0, Info::bytes)).sum()
    }

    /// Whether a cut may go before node `c`, for `c` in `0..=n`: every value a node before it produces
    /// and a node from it on reads is declared with its element type.
    fn cuts_passing_declared(&self) -> Vec<bool> {
        let n = self.nodes.len();
        let mut undeclared = vec![0i64; n + 2];
        for (name, &p) in &self.producer {
            let Some(&u) = self.last_use.get(name).filter(|&&u| u > p) else { continue };
            let typed = self.declared.get(name).and_then(|b| declared_type(b).ok().flatten());
            if typed.is_none_or(|d| d.elem == 0) {
                undeclared[p + 1] += 1;
                undeclared[u + 1] -= 1;
            }
        }
        let mut crossing = 0;
        (0..=n)
            .map(|c| {
                crossing += undeclared[c];
                c == 0 || c == n || crossing == 0
            })
            .collect()
    }
}

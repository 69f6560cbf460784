//! `clip::as_max_min` on small graphs: which nodes replace each `Clip`. That they compute what `Clip`
//! does is checked on ONNX Runtime (`tools/export/tests/test_clip.py`).

use super::*;
use crate::graph::clip::as_max_min;

/// `y = Clip(x, inputs[1..])` after `Neg`, with `lo` and `hi` as initializers.
fn clipped(bounds: &[&str], attributes: &[Vec<u8>]) -> Vec<u8> {
    let dims = [Dim::Param("n")];
    let mut inputs = vec!["negated"];
    inputs.extend_from_slice(bounds);
    model_with_opset(
        &[
            (GRAPH_INPUT, value_info("x", FLOAT, &dims)),
            (GRAPH_INITIALIZER, raw_tensor("lo", &[], FLOAT, &floats(&[-1.0]))),
            (GRAPH_INITIALIZER, raw_tensor("hi", &[], FLOAT, &floats(&[2.0]))),
            (GRAPH_NODE, node("neg", "", "Neg", &["x"], &["negated"], &[])),
            (GRAPH_NODE, node("clamp", "", "Clip", &inputs, &["y"], attributes)),
            (GRAPH_OUTPUT, value_info("y", FLOAT, &dims)),
        ],
        Some(17),
    )
}

fn initializer_names(model: &[u8]) -> Vec<String> {
    graph_fields(model, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap().name).collect()
}

fn node_of(op: &str, inputs: &[&str], outputs: &[&str]) -> (String, Vec<String>, Vec<String>) {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    (op.to_owned(), strings(inputs), strings(outputs))
}

#[test]
fn a_clip_with_both_bounds_becomes_max_with_the_lower_then_min_with_the_upper() {
    let (edited, n) = as_max_min(&clipped(&["lo", "hi"], &[])).unwrap();
    assert_eq!(n, 1);
    let low = "y/imagine_at_least_min";
    assert_eq!(
        nodes(&edited),
        [
            node_of("Neg", &["x"], &["negated"]),
            node_of("Max", &["negated", "lo"], &[low]),
            node_of("Min", &[low, "hi"], &["y"]),
        ]
    );
    // The bounds are still read, so they stay; the graph's output keeps its name and declaration.
    assert_eq!(initializer_names(&edited), ["lo", "hi"]);
    assert_eq!(graph_fields(&edited, GRAPH_OUTPUT).len(), 1);
}

#[test]
fn a_missing_bound_leaves_its_step_out() {
    let (upper_only, n) = as_max_min(&clipped(&["", "hi"], &[])).unwrap();
    assert_eq!(n, 1);
    assert_eq!(nodes(&upper_only)[1..], [node_of("Min", &["negated", "hi"], &["y"])]);

    let (lower_only, _) = as_max_min(&clipped(&["lo"], &[])).unwrap();
    assert_eq!(nodes(&lower_only)[1..], [node_of("Max", &["negated", "lo"], &["y"])]);

    let (unbounded, _) = as_max_min(&clipped(&[], &[])).unwrap();
    assert_eq!(nodes(&unbounded)[1..], [node_of("Identity", &["negated"], &["y"])]);
}

#[test]
fn a_clip_with_attribute_bounds_or_no_clip_leaves_the_model_as_it_was() {
    // Before opset 11, Clip's bounds are attributes.
    let attribute_bounds = clipped(&[], &[attr_int("min", 0)]);
    assert_eq!(as_max_min(&attribute_bounds).unwrap(), (attribute_bounds.clone(), 0));

    let no_clip = model_with_opset(
        &[
            (GRAPH_INPUT, value_info("x", FLOAT, &[Dim::Value(2)])),
            (GRAPH_NODE, node("neg", "", "Neg", &["x"], &["y"], &[])),
            (GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Value(2)])),
        ],
        Some(17),
    );
    assert_eq!(as_max_min(&no_clip).unwrap(), (no_clip.clone(), 0));
}

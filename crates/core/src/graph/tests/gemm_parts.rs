//! `gemm_parts::by_rows` on small graphs: which `Gemm`s are cut, into which rows, and where each part's
//! weights are read. That the parts compute what the whole `Gemm` does is checked on ONNX Runtime
//! (`tools/export/tests/test_gemm_parts.py`).

use super::*;
use crate::graph::gemm_parts::by_rows;

const N: u64 = 10;
const K: u64 = 4;

/// `y = Gemm(x, w, bias)` (`transB` as given) with `w` [N, K] float32 in `weights.bin` from byte 64,
/// and the bias (when named) an initializer of `bias_dims`.
fn gemm(trans_b: u64, bias_dims: Option<&[u64]>) -> Vec<u8> {
    let mut fields = vec![
        (GRAPH_INPUT, value_info("x", FLOAT, &[Dim::Param("m"), Dim::Value(K)])),
        (GRAPH_INITIALIZER, external_tensor("w", &[N, K], FLOAT, "weights.bin", 64, N * K * 4)),
    ];
    let mut inputs = vec!["x", "w"];
    if let Some(dims) = bias_dims {
        let count = dims.iter().product::<u64>();
        let values: Vec<f32> = (0..count).map(|i| i as f32).collect();
        fields.push((GRAPH_INITIALIZER, raw_tensor("bias", dims, FLOAT, &floats(&values))));
        inputs.push("bias");
    }
    let attributes = [attr_int("transB", trans_b), attr_float("alpha", 0.5)];
    fields.push((GRAPH_NODE, node("project", "", "Gemm", &inputs, &["y"], &attributes)));
    fields.push((GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Param("m"), Dim::Value(N)])));
    model_with_opset(&fields, Some(17))
}

fn attr_float(name: &str, v: f32) -> Vec<u8> {
    let mut a = msg(&[(1, name.as_bytes())]);
    a.push(0x15); // field 2 (f), fixed32
    a.extend_from_slice(&v.to_le_bytes());
    put_varint_field(&mut a, 20, 1); // FLOAT
    a
}

fn initializers(model: &[u8]) -> HashMap<String, Vec<u8>> {
    graph_fields(model, GRAPH_INITIALIZER).into_iter().map(|t| (read_tensor(&t).unwrap().name, t)).collect()
}

#[test]
fn heavy_weights_are_cut_into_equal_ranges_of_rows_read_from_the_same_file() {
    // 160 bytes of weights, at most 64 a part: 3 parts of 4, 4 and 2 rows.
    let (edited, n) = by_rows(&gemm(1, None), 64).unwrap();
    assert_eq!(n, 1);
    let parts = ["project/imagine_rows_0_4", "project/imagine_rows_4_8", "project/imagine_rows_8_10"];
    let outputs: Vec<String> = parts.iter().map(|p| format!("{p}/output")).collect();
    let mut expected: Vec<_> = parts
        .iter()
        .zip(&outputs)
        .map(|(p, o)| ("Gemm".to_owned(), vec!["x".to_owned(), format!("{p}/w")], vec![o.clone()]))
        .collect();
    expected.push(("Concat".to_owned(), outputs.clone(), vec!["y".to_owned()]));
    assert_eq!(nodes(&edited), expected);

    let tensors = initializers(&edited);
    assert!(!tensors.contains_key("w"), "the whole weights are no longer read");
    for (part, (start, rows)) in parts.iter().zip([(0, 4), (4, 4), (8, 2)]) {
        let t = &tensors[&format!("{part}/w")];
        assert_eq!(read_tensor(t).unwrap().dims, [rows, K]);
        let row = K * 4;
        assert_eq!(
            entries(t),
            [
                ("location".to_owned(), "weights.bin".to_owned()),
                ("offset".to_owned(), (64 + start * row).to_string()),
                ("length".to_owned(), (rows * row).to_string()),
            ]
        );
    }
    // Each part keeps the node's attributes; the Concat joins the columns.
    let written = graph_fields(&edited, GRAPH_NODE);
    let first = read_node(&written[0], 0).unwrap();
    assert_eq!(first.int_attribute("transB"), Some(1));
    assert!(first.attributes.iter().any(|a| a.name == "alpha"));
    assert_eq!(read_node(&written[3], 3).unwrap().int_attribute("axis"), Some(1));
    assert_eq!(graph_fields(&edited, GRAPH_OUTPUT).len(), 1);
}

#[test]
fn a_bias_per_column_is_cut_with_the_rows_and_a_single_one_is_read_whole() {
    let (edited, n) = by_rows(&gemm(1, Some(&[N])), 80).unwrap();
    assert_eq!(n, 1);
    let tensors = initializers(&edited);
    let bias = &tensors["project/imagine_rows_5_10/bias"];
    assert_eq!(read_tensor(bias).unwrap().dims, [5]);
    assert_eq!(raw_data(bias), floats(&[5.0, 6.0, 7.0, 8.0, 9.0]));
    assert_eq!(nodes(&edited)[1].1, ["x", "project/imagine_rows_5_10/w", "project/imagine_rows_5_10/bias"]);

    let (shared, n) = by_rows(&gemm(1, Some(&[1])), 80).unwrap();
    assert_eq!(n, 1);
    assert_eq!(nodes(&shared)[1].1, ["x", "project/imagine_rows_5_10/w", "bias"]);
    assert!(initializers(&shared).contains_key("bias"));
}

#[test]
fn gemms_it_cannot_cut_row_by_row_or_light_ones_stay() {
    let light = gemm(1, None);
    assert_eq!(by_rows(&light, 160).unwrap(), (light.clone(), 0), "within the limit");
    // Without transB a row of B is an input row, not an output column.
    let untransposed = gemm(0, None);
    assert_eq!(by_rows(&untransposed, 64).unwrap(), (untransposed.clone(), 0));
    // A bias of another shape than one per column (here a row broadcast over [1, N]) is not cut.
    let row_bias = gemm(1, Some(&[1, N]));
    assert_eq!(by_rows(&row_bias, 64).unwrap(), (row_bias.clone(), 0));
}

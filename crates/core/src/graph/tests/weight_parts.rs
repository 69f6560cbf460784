//! `weight_parts::by_rows` on small graphs: which `Gemm`s and `MatMulNBits` are cut, into which rows,
//! and where each part's weights are read. That the parts compute what the whole node does is checked
//! on ONNX Runtime (`tools/export/tests/test_weight_parts.py`).

use super::*;
use crate::graph::weight_parts::{self, Op};
use crate::onnx::fields::INT32;

fn by_rows(model: &[u8], max_part_bytes: u64) -> Result<(Vec<u8>, usize), RewriteError> {
    weight_parts::by_rows(model, max_part_bytes, Op::Gemm)
}

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
        .zip(["0_4", "4_8", "8_10"])
        .map(|((_, o), rows)| {
            ("Gemm".to_owned(), vec!["x".to_owned(), format!("w/imagine_rows_{rows}")], vec![o.clone()])
        })
        .collect();
    expected.push(("Concat".to_owned(), outputs.clone(), vec!["y".to_owned()]));
    assert_eq!(nodes(&edited), expected);

    let tensors = initializers(&edited);
    assert!(!tensors.contains_key("w"), "the whole weights are no longer read");
    for (start, rows) in [(0, 4), (4, 4), (8, 2)] {
        let t = &tensors[&format!("w/imagine_rows_{start}_{}", start + rows)];
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
    let bias = &tensors["bias/imagine_rows_5_10"];
    assert_eq!(read_tensor(bias).unwrap().dims, [5]);
    assert_eq!(raw_data(bias), floats(&[5.0, 6.0, 7.0, 8.0, 9.0]));
    assert_eq!(nodes(&edited)[1].1, ["x", "w/imagine_rows_5_10", "bias/imagine_rows_5_10"]);

    let (shared, n) = by_rows(&gemm(1, Some(&[1])), 80).unwrap();
    assert_eq!(n, 1);
    assert_eq!(nodes(&shared)[1].1, ["x", "w/imagine_rows_5_10", "bias"]);
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

const DATA: &str = "weights.data";

/// `MatMulNBits` nodes of 12 columns (K 64, block 32, 8 bits: 2 blocks of 32 bytes a row), one per
/// name in `names`, each reading input `a` and the same weights (B and scales in `DATA`, zero points
/// inline), and `extra` inputs after those (`g_idx`, bias), under opset `opset`.
fn matmuls(names: &[&str], extra: &[&str], extra_tensors: Vec<Vec<u8>>, opset: u64) -> Vec<u8> {
    let attrs = [attr_int("K", 64), attr_int("N", 12), attr_int("bits", 8), attr_int("block_size", 32)];
    let mut inputs = vec!["a", "B", "scales", "zp"];
    inputs.extend(extra);
    let mut fields = vec![(GRAPH_INPUT, value_info("a", FLOAT, &[Dim::Param("m"), Dim::Value(64)]))];
    for name in names {
        let node = node(name, "com.microsoft", "MatMulNBits", &inputs, &[&format!("{name}_y")], &attrs);
        fields.push((GRAPH_NODE, node));
        fields.push((
            GRAPH_OUTPUT,
            value_info(&format!("{name}_y"), FLOAT, &[Dim::Param("m"), Dim::Value(12)]),
        ));
    }
    fields.push((GRAPH_INITIALIZER, external_tensor("B", &[12, 2, 32], UINT8, DATA, 1000, 768)));
    fields.push((GRAPH_INITIALIZER, external_tensor("scales", &[24], FLOAT, DATA, 2000, 96)));
    fields.push((GRAPH_INITIALIZER, raw_tensor("zp", &[12, 2], UINT8, &(0..24).collect::<Vec<u8>>())));
    fields.extend(extra_tensors.into_iter().map(|t| (GRAPH_INITIALIZER, t)));
    model_with_opset(&fields, Some(opset))
}

/// Reads a node's int attribute as ONNX's int64.
fn signed(model: &[u8], index: usize, name: &str) -> Option<i64> {
    let written = graph_fields(model, GRAPH_NODE);
    read_node(&written[index], index).unwrap().int_attribute(name).map(|v| v as i64)
}

#[test]
fn a_heavy_matmul_nbits_is_cut_into_rows_of_its_weights_scales_and_zero_points() {
    // 768 bytes of B, at most 300 a part: 3 parts of 4 rows (256 bytes each).
    let (edited, n) =
        weight_parts::by_rows(&matmuls(&["project"], &[], Vec::new(), 18), 300, Op::MatMulNBits).unwrap();
    assert_eq!(n, 1);
    let rows = ["0_4", "4_8", "8_12"];
    let mut expected: Vec<_> = rows
        .iter()
        .map(|r| {
            let inputs = [
                "a".to_owned(),
                format!("B/imagine_rows_{r}"),
                format!("scales/imagine_rows_{r}"),
                format!("zp/imagine_rows_{r}"),
            ];
            ("MatMulNBits".to_owned(), inputs.to_vec(), vec![format!("project/imagine_rows_{r}/output")])
        })
        .collect();
    expected.push((
        "Concat".to_owned(),
        rows.iter().map(|r| format!("project/imagine_rows_{r}/output")).collect(),
        vec!["project_y".to_owned()],
    ));
    assert_eq!(nodes(&edited), expected);
    // Each part computes its 4 columns; the Concat joins the last axis, whatever the rank.
    for i in 0..3 {
        assert_eq!(signed(&edited, i, "N"), Some(4));
        assert_eq!(signed(&edited, i, "K"), Some(64));
        assert_eq!(signed(&edited, i, "bits"), Some(8));
    }
    assert_eq!(signed(&edited, 3, "axis"), Some(-1));

    let tensors = initializers(&edited);
    assert!(!tensors.contains_key("B") && !tensors.contains_key("scales") && !tensors.contains_key("zp"));
    for (part, start) in rows.iter().zip([0u64, 4, 8]) {
        let b = &tensors[&format!("B/imagine_rows_{part}")];
        assert_eq!(read_tensor(b).unwrap().dims, [4, 2, 32]);
        let at = |offset: u64, length: u64| {
            [
                ("location".to_owned(), DATA.to_owned()),
                ("offset".to_owned(), offset.to_string()),
                ("length".to_owned(), length.to_string()),
            ]
        };
        assert_eq!(entries(b), at(1000 + start * 64, 256));
        let scales = &tensors[&format!("scales/imagine_rows_{part}")];
        assert_eq!(read_tensor(scales).unwrap().dims, [8]);
        assert_eq!(entries(scales), at(2000 + start * 8, 32));
        let zp = &tensors[&format!("zp/imagine_rows_{part}")];
        assert_eq!(raw_data(zp), (start as u8 * 2..start as u8 * 2 + 8).collect::<Vec<u8>>());
    }
}

#[test]
fn nodes_reading_the_same_weights_share_their_parts() {
    // Two copies of one projection, as `rows` leaves them per chunk of tokens: each cut, the rows of
    // each part written once.
    let (edited, n) =
        weight_parts::by_rows(&matmuls(&["chunk0", "chunk1"], &[], Vec::new(), 18), 400, Op::MatMulNBits)
            .unwrap();
    assert_eq!(n, 2);
    let written: Vec<String> =
        graph_fields(&edited, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap().name).collect();
    assert_eq!(written.len(), 6, "{written:?}");
    assert_eq!(nodes(&edited)[0].1, nodes(&edited)[3].1, "both chunks read the same part");
    // Gemms are another pass: MatMulNBits are not cut by it, nor Gemms by this one.
    let model = matmuls(&["project"], &[], Vec::new(), 18);
    assert_eq!(by_rows(&model, 300).unwrap(), (model.clone(), 0));
    let gemm = gemm(1, None);
    assert_eq!(weight_parts::by_rows(&gemm, 64, Op::MatMulNBits).unwrap(), (gemm.clone(), 0));
}

#[test]
fn a_matmul_nbits_bias_is_cut_and_one_it_cannot_cut_stays() {
    let bias = raw_tensor("bias", &[12], FLOAT, &floats(&(0..12).map(|i| i as f32).collect::<Vec<_>>()));
    let with_bias = matmuls(&["project"], &["", "bias"], vec![bias], 18);
    let (edited, n) = weight_parts::by_rows(&with_bias, 400, Op::MatMulNBits).unwrap();
    assert_eq!(n, 1);
    assert_eq!(nodes(&edited)[1].1[5], "bias/imagine_rows_6_12");
    assert_eq!(
        raw_data(&initializers(&edited)["bias/imagine_rows_6_12"]),
        floats(&[6.0, 7.0, 8.0, 9.0, 10.0, 11.0])
    );

    let light = matmuls(&["project"], &[], Vec::new(), 18);
    assert_eq!(
        weight_parts::by_rows(&light, 768, Op::MatMulNBits).unwrap(),
        (light.clone(), 0),
        "within the limit"
    );
    // A g_idx maps K's rows to groups: not one row per column.
    let g_idx = raw_tensor("g_idx", &[64], INT32, &[0; 256]);
    let grouped = matmuls(&["project"], &["g_idx"], vec![g_idx], 18);
    assert_eq!(weight_parts::by_rows(&grouped, 300, Op::MatMulNBits).unwrap(), (grouped.clone(), 0));
    // Before opset 11 a Concat takes no negative axis.
    let old = matmuls(&["project"], &[], Vec::new(), 10);
    assert_eq!(weight_parts::by_rows(&old, 300, Op::MatMulNBits).unwrap(), (old.clone(), 0));
}

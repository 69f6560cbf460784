//! `MatMulNBits` re-blocked to 32.

use super::*;

// ------------------------------------------------------------------------------------------------
// MatMulNBits re-blocked to 32 (`reblock`). What the re-blocked graphs compute, against the originals
// on ONNX Runtime, is checked in tools/export/tests/test_matmul_blocks.py.

/// A model of one `MatMulNBits` (K, N, bits, block) importing the default opset `opset`, its B external,
/// 4-bit zero points inline; `extra` nodes after it.
fn matmul_nbits_model(k: u64, n: u64, bits: u64, block: u64, opset: u64, extra: &[Vec<u8>]) -> Vec<u8> {
    let blocks = k.div_ceil(block);
    let blob = block * bits / 8;
    let attrs = [attr_int("K", k), attr_int("N", n), attr_int("bits", bits), attr_int("block_size", block)];
    let mut fields = vec![
        (GRAPH_INITIALIZER, external_tensor("B", &[n, blocks, blob], UINT8, "w.data", 64, n * blocks * blob)),
        (
            GRAPH_INITIALIZER,
            raw_tensor("scales", &[n, blocks], FLOAT, &floats(&vec![0.5; (n * blocks) as usize])),
        ),
        (
            GRAPH_INITIALIZER,
            raw_tensor("zp", &[n, blocks.div_ceil(2)], UINT8, &vec![0x98; (n * blocks.div_ceil(2)) as usize]),
        ),
        (GRAPH_NODE, node("mm", "com.microsoft", "MatMulNBits", &["a", "B", "scales", "zp"], &["y"], &attrs)),
        (GRAPH_INPUT, value_info("a", FLOAT, &[Dim::Param("m"), Dim::Value(k)])),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Param("m"), Dim::Value(n)])),
    ];
    fields.extend(extra.iter().map(|e| (GRAPH_NODE, e.clone())));
    let mut m = model(&fields);
    let mut opset_import = msg(&[(1, b"")]);
    put_varint_field(&mut opset_import, 2, opset);
    put_bytes_field(&mut m, 8, &opset_import);
    m
}

fn matmul_nbits_node(model: &[u8]) -> (Vec<String>, u64) {
    let nodes = graph_fields(model, GRAPH_NODE);
    let mm = nodes.iter().map(|n| read_node(n, 0).unwrap()).find(|n| n.op_type == "MatMulNBits").unwrap();
    let inputs = mm.inputs.iter().map(|i| (*i).to_owned()).collect();
    (inputs, mm.int_attribute("block_size").unwrap())
}

#[test]
fn matmul_nbits_of_block_128_becomes_block_32_with_b_untouched() {
    let m = matmul_nbits_model(256, 4, 4, 128, 21, &[]);
    let (out, changed) = crate::graph::reblock::to_block_32(&m).unwrap();
    assert_eq!(changed, 1);
    let (inputs, block) = matmul_nbits_node(&out);
    assert_eq!(block, 32);
    // B is read where it was, as [N, K / 32, 16 bytes]; scales and zero points come from added nodes.
    assert_eq!(inputs[..2], ["a", "B"]);
    assert!(
        inputs[2].starts_with("imagine_block32_") && inputs[3].starts_with("imagine_block32_"),
        "{inputs:?}"
    );
    let b = graph_fields(&out, GRAPH_INITIALIZER)
        .iter()
        .map(|t| read_tensor(t).unwrap())
        .find(|t| t.name == "B")
        .unwrap();
    assert_eq!(b.dims, [4, 8, 16]);
    let external = b.external.unwrap();
    assert_eq!((external.file.as_str(), external.offset, external.length), ("w.data", 64, Some(4 * 2 * 64)));
    // The added nodes come first (they read only initializers), and every node keeps its unknown fields.
    let nodes = graph_fields(&out, GRAPH_NODE);
    let ops: Vec<String> = nodes.iter().map(|n| read_node(n, 0).unwrap().op_type.to_owned()).collect();
    assert_eq!(ops.last().map(String::as_str), Some("MatMulNBits"));
    assert!(ops.iter().filter(|o| *o == "Expand").count() == 2, "{ops:?}");
    assert!(nodes.last().unwrap().ends_with(UNKNOWN));
    // Every name an added node reads is an initializer or an earlier node's output.
    let mut known: Vec<String> =
        graph_fields(&out, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap().name).collect();
    known.push("a".into());
    for n in &nodes {
        let n = read_node(n, 0).unwrap();
        for i in &n.inputs {
            assert!(known.iter().any(|k| k == i), "{} reads {i}, which nothing made before it", n.name);
        }
        known.extend(n.outputs.iter().map(|o| (*o).to_owned()));
    }
}

#[test]
fn matmul_nbits_that_cannot_be_reblocked_stay() {
    let unchanged = |m: Vec<u8>, why: &str| {
        let (out, changed) = crate::graph::reblock::to_block_32(&m).unwrap();
        assert_eq!((changed, out == m), (0, true), "{why}");
    };
    unchanged(matmul_nbits_model(256, 4, 4, 32, 21, &[]), "block 32 already");
    unchanged(matmul_nbits_model(256, 4, 4, 16, 21, &[]), "a block below 32");
    unchanged(matmul_nbits_model(256, 4, 2, 128, 21, &[]), "2 bits");
    unchanged(matmul_nbits_model(256, 4, 4, 128, 12, &[]), "an opset without Slice and Expand as used");
    let other = node("other", "", "Identity", &["B"], &["b2"], &[]);
    unchanged(matmul_nbits_model(256, 4, 4, 128, 21, &[other]), "another node reads B");
    let attrs = [attr_int("K", 256), attr_int("N", 4), attr_int("bits", 4), attr_int("block_size", 128)];
    let g_idx = node("mm", "com.microsoft", "MatMulNBits", &["a", "B", "scales", "", "g"], &["y"], &attrs);
    unchanged(matmul_nbits_model(256, 4, 4, 128, 21, &[g_idx]), "a node with g_idx (and B read twice)");
}

#[test]
fn a_k_that_is_not_a_multiple_of_the_block_slices_the_padding_off() {
    // K 64 in blocks of 128: one padded block per column; blocks of 32: two, 32 bytes of each column.
    let (out, changed) =
        crate::graph::reblock::to_block_32(&matmul_nbits_model(64, 4, 4, 128, 21, &[])).unwrap();
    assert_eq!(changed, 1);
    let (inputs, block) = matmul_nbits_node(&out);
    assert_eq!(block, 32);
    assert!(inputs[1].starts_with("imagine_block32_"), "{inputs:?}");
    let b = graph_fields(&out, GRAPH_INITIALIZER)
        .iter()
        .map(|t| read_tensor(t).unwrap())
        .find(|t| t.name == "B")
        .unwrap();
    assert_eq!(b.dims, [4, 1, 64], "the stored B is read as it is");
}

#[test]
fn computed_scales_and_zero_points_repeat_each_block_in_a_data_file_of_their_own() {
    // K 256, N 4, 4 bits, block 128: 2 blocks of 128 per column, 8 of 32. Scales inline (0.5 each),
    // zero points inline 0x98: block 0's nibble 8, block 1's 9.
    let m = matmul_nbits_model(256, 4, 4, 128, 21, &[]);
    assert_eq!(
        crate::graph::reblock::sources_to_read(&m).unwrap(),
        [],
        "inline scales and zero points need no read"
    );
    let mut data = Vec::new();
    let out = crate::graph::reblock::to_block_32_computed(
        &m,
        &HashMap::new(),
        crate::graph::reblock::COMPUTED_DATA,
        &mut |b| data.extend_from_slice(b),
    )
    .unwrap();
    assert_eq!((out.changed, out.data_length), (1, data.len() as u64));
    let (inputs, block) = matmul_nbits_node(&out.graph);
    assert_eq!(block, 32);
    let tensors: Vec<_> =
        graph_fields(&out.graph, GRAPH_INITIALIZER).iter().map(|t| read_tensor(t).unwrap()).collect();
    let find = |name: &str| tensors.iter().find(|t| t.name == name).unwrap();
    let (scales, zero_points) = (find(&inputs[2]), find(&inputs[3]));
    assert_eq!((scales.data_type, scales.dims.as_slice()), (FLOAT, &[4, 8][..]));
    assert_eq!((zero_points.data_type, zero_points.dims.as_slice()), (UINT8, &[4, 4][..]));
    let at = |t: &Tensor| {
        let e = t.external.as_ref().unwrap();
        assert_eq!(e.file, crate::graph::reblock::COMPUTED_DATA);
        &data[e.offset as usize..(e.offset + e.length.unwrap()) as usize]
    };
    assert_eq!(at(scales), floats(&[0.5; 32]));
    assert_eq!(
        at(zero_points),
        [0x88, 0x88, 0x99, 0x99].repeat(4),
        "each byte: two blocks of 32, one old nibble"
    );
    assert_eq!(find(&inputs[3]).external.as_ref().unwrap().offset % 64, 0, "aligned");
    // No node is added for ONNX Runtime to fold.
    assert_eq!(graph_fields(&out.graph, GRAPH_NODE).len(), 1);
}

/// One int8 `MatMulNBits` of block 128 (K 256, N 4) whose scales are external (4 x 2 blocks of float32,
/// bytes 1024..1056 of `w.data`), without zero points; opset 21.
fn external_scales_model() -> Vec<u8> {
    let attrs = [attr_int("K", 256), attr_int("N", 4), attr_int("bits", 8), attr_int("block_size", 128)];
    let mut m = model(&[
        (GRAPH_INITIALIZER, external_tensor("B", &[4, 2, 128], UINT8, "w.data", 0, 1024)),
        (GRAPH_INITIALIZER, external_tensor("scales", &[4, 2], FLOAT, "w.data", 1024, 32)),
        (GRAPH_NODE, node("mm", "com.microsoft", "MatMulNBits", &["a", "B", "scales"], &["y"], &attrs)),
        (GRAPH_INPUT, value_info("a", FLOAT, &[Dim::Param("m"), Dim::Value(256)])),
        (GRAPH_OUTPUT, value_info("y", FLOAT, &[Dim::Param("m"), Dim::Value(4)])),
    ]);
    let mut opset_import = msg(&[(1, b"")]);
    put_varint_field(&mut opset_import, 2, 21);
    put_bytes_field(&mut m, 8, &opset_import);
    m
}

#[test]
fn computed_scales_are_read_from_external_data_and_fall_back_to_nodes_without_it() {
    let m = external_scales_model();
    let wanted = crate::graph::reblock::sources_to_read(&m).unwrap();
    let range = crate::graph::reblock::DataRange { location: "w.data".into(), offset: 1024, length: 32 };
    assert_eq!(wanted, std::slice::from_ref(&range));
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let computed = |read: &HashMap<_, _>| {
        let mut data = Vec::new();
        let out = crate::graph::reblock::to_block_32_computed(
            &m,
            read,
            crate::graph::reblock::COMPUTED_DATA,
            &mut |b| data.extend_from_slice(b),
        )
        .unwrap();
        (out, data)
    };
    let (out, data) = computed(&HashMap::from([(range.clone(), floats(&values))]));
    assert_eq!(out.changed, 1);
    // Column c's blocks 2c and 2c + 1, each 4 times (8 bits: 4 blocks of 32 in one of 128).
    let expected: Vec<f32> = (0..8).flat_map(|i| [i as f32; 4]).collect();
    assert_eq!(data, floats(&expected));
    // Bytes of another length, or none: the scales come from nodes, as `to_block_32` makes them.
    for read in [HashMap::from([(range, floats(&values[..4]))]), HashMap::new()] {
        let (out, data) = computed(&read);
        assert_eq!((out.changed, out.data_length, data.len()), (1, 0, 0));
        assert_eq!(out.graph, crate::graph::reblock::to_block_32(&m).unwrap().0);
    }
}

#[test]
fn the_stored_form_names_its_own_data_file_and_its_size_is_known_before_the_weights() {
    use crate::graph::reblock::{stored_bytes, ReblockedGraph};
    let m = external_scales_model();
    let (onnx, data_name) = ReblockedGraph::names("transformer.f32.onnx");
    assert_eq!((onnx.as_str(), data_name.as_str()), ("transformer.f32.b32.onnx", "transformer.f32.b32.data"));
    let range = crate::graph::reblock::DataRange { location: "w.data".into(), offset: 1024, length: 32 };
    let read = HashMap::from([(range, floats(&(0..8).map(|i| i as f32).collect::<Vec<_>>()))]);
    let mut data = Vec::new();
    let out = crate::graph::reblock::to_block_32_computed(&m, &read, &data_name, &mut |b| {
        data.extend_from_slice(b)
    })
    .unwrap();
    let locations: Vec<String> =
        crate::pack::external_data_locations(&out.graph).unwrap().into_iter().map(|f| f.location).collect();
    assert_eq!(locations, ["w.data", "transformer.f32.b32.data"]);
    // Known from the graph alone, to the byte: what the space check charges is what is written.
    assert_eq!(stored_bytes("transformer.f32.onnx", &m).unwrap(), out.graph.len() as u64 + data.len() as u64);
    // A graph with nothing to re-block stores nothing.
    let (unchanged, _) =
        crate::graph::reblock::to_block_32(&matmul_nbits_model(64, 4, 4, 32, 21, &[])).unwrap();
    assert_eq!(stored_bytes("decoder.onnx", &unchanged).unwrap(), 0);
}

#[test]
fn accuracy_level_is_set_on_every_matmul_nbits_once() {
    let level = |m: &[u8]| {
        let nodes = graph_fields(m, GRAPH_NODE);
        let mm = nodes.iter().map(|n| read_node(n, 0).unwrap()).find(|n| n.op_type == "MatMulNBits").unwrap();
        let count = mm.attributes.iter().filter(|a| a.name == "accuracy_level").count();
        (mm.int_attribute("accuracy_level"), count, mm.int_attribute("block_size"))
    };
    let m = matmul_nbits_model(256, 4, 4, 128, 21, &[node("id", "", "Identity", &["y"], &["z"], &[])]);
    assert_eq!(level(&m), (None, 0, Some(128)));
    let (four, changed) = crate::graph::reblock::with_accuracy_level(&m, 4).unwrap();
    assert_eq!((changed, level(&four)), (1, (Some(4), 1, Some(128))));
    let (again, _) = crate::graph::reblock::with_accuracy_level(&four, 0).unwrap();
    assert_eq!(level(&again), (Some(0), 1, Some(128)), "replaced, not added twice");
    assert_eq!(graph_fields(&again, GRAPH_NODE).len(), 2, "other nodes stay");
    assert_eq!(crate::graph::reblock::with_accuracy_level(&model(&[]), 4).unwrap().1, 0);
}

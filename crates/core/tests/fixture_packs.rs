//! The pack contract read from the generated fixture packs (`tests/fixtures/packs`), which honour the
//! real pack's names, dtypes and external-data layout.

use std::path::PathBuf;

use imagine_core::pack::{
    declares_float16, external_data_locations, largest_external_tensor, parse_manifest, Graph,
};

fn pack(variant: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/packs").join(variant)
}

fn graph_bytes(variant: &str, graph: Graph) -> Vec<u8> {
    let path = pack(variant).join(graph.file_name());
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run tests/fixtures/make_packs.py)", path.display()))
}

#[test]
fn float16_is_detected_from_declared_io() {
    for graph in Graph::ALL {
        assert!(!declares_float16(&graph_bytes("f32", graph)).unwrap(), "{graph:?} f32");
    }
    assert!(declares_float16(&graph_bytes("f16", Graph::TextEncoder)).unwrap());
    assert!(declares_float16(&graph_bytes("f16", Graph::Transformer)).unwrap());
    // The real pack's decoder is float32 even where the other graphs are float16.
    assert!(!declares_float16(&graph_bytes("f16", Graph::Decoder)).unwrap());
}

#[test]
fn sharded_graphs_reference_exactly_their_manifest_shards() {
    for graph in [Graph::TextEncoder, Graph::Transformer] {
        let manifest = std::fs::read(pack("f32").join(graph.manifest_name())).unwrap();
        let mut shards = parse_manifest(&manifest).unwrap();
        assert!(shards.len() >= 2, "{graph:?} has {} shards", shards.len());
        let mut locations: Vec<String> = external_data_locations(&graph_bytes("f32", graph))
            .unwrap()
            .into_iter()
            .map(|f| f.file)
            .collect();
        // ORT matches external data by name, so order does not matter.
        shards.sort();
        locations.sort();
        assert_eq!(locations, shards);
    }
}

#[test]
fn unsharded_decoder_names_its_data_file_in_the_graph() {
    assert!(!pack("f32").join(Graph::Decoder.manifest_name()).exists());
    let files = external_data_locations(&graph_bytes("f32", Graph::Decoder)).unwrap();
    assert_eq!(files.iter().map(|f| f.location.as_str()).collect::<Vec<_>>(), ["vae_decoder.onnx.data"]);
}

#[test]
fn largest_external_tensor_is_read_from_the_graph() {
    // The f32 text encoder's biggest external initializer is its 151,936-entry float32 id table.
    assert_eq!(largest_external_tensor(&graph_bytes("f32", Graph::TextEncoder)).unwrap(), 151_936 * 4);
}

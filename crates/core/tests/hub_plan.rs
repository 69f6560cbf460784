//! Planning a pack download from a Hub listing, with the fixture packs (`tests/fixtures/packs`) as the
//! repo: real ONNX graphs whose external data the plan must find, plus files that are not the pack.

use std::path::PathBuf;

use imagine_core::api::{PackFile, PackSource};
use imagine_core::hub::{self, GraphFiles, HubError};
use imagine_core::pack::Graph;
use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn pack(variant: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/packs").join(variant)
}

/// A `GET /api/models/{repo}/tree/{commit}?recursive=true` body for a repo holding the fixture pack
/// `variant` plus a README, samples and a file of another variant. As on the Hub, `.json` and `.md`
/// files are stored in git, the rest in LFS.
fn tree_json(variant: &str) -> String {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(pack(variant))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files.push(("README.md".into(), b"# A pack\n".to_vec()));
    files.push(("samples/sample.png".into(), vec![0x89, b'P', b'N', b'G', 1, 2, 3]));
    files.push(("transformer_q4.onnx".into(), vec![0; 10]));
    let mut entries =
        vec![serde_json::json!({"type": "directory", "oid": "d".repeat(40), "size": 0, "path": "samples"})];
    for (path, bytes) in files {
        let git_oid = hub::git_blob_oid(&bytes);
        let mut entry =
            serde_json::json!({"type": "file", "path": path, "size": bytes.len(), "oid": git_oid});
        if !path.ends_with(".json") && !path.ends_with(".md") {
            let sha256 = hub::hex(&Sha256::digest(&bytes).into());
            entry["lfs"] = serde_json::json!({"oid": sha256, "size": bytes.len(), "pointerSize": 134});
            // The git oid of an LFS file is its pointer's, not the content's.
            entry["oid"] = serde_json::json!("e".repeat(40));
        }
        entries.push(entry);
    }
    serde_json::to_string(&entries).unwrap()
}

fn source() -> PackSource {
    PackSource::default().validate().unwrap()
}

/// What the worker downloads before planning: each graph and its manifest, checked.
fn download_graphs(variant: &str, listing: &[PackFile]) -> Vec<GraphFiles> {
    hub::graph_files(&source(), COMMIT, listing)
        .unwrap()
        .into_iter()
        .map(|(graph, onnx, manifest)| {
            let onnx_bytes = std::fs::read(pack(variant).join(&onnx.path)).unwrap();
            hub::verify_small(&onnx, &onnx_bytes).unwrap();
            let manifest = manifest.map(|m| {
                let bytes = std::fs::read(pack(variant).join(&m.path)).unwrap();
                hub::verify_small(&m, &bytes).unwrap();
                bytes
            });
            GraphFiles { graph, onnx: onnx_bytes, manifest }
        })
        .collect()
}

/// The float32 fixture's graphs and listing, with `manifest` as the transformer's manifest.
fn with_transformer_manifest(manifest: &[u8]) -> (Vec<GraphFiles>, Vec<PackFile>) {
    let mut graphs = download_graphs("f32", &hub::parse_tree(tree_json("f32").as_bytes()).unwrap());
    graphs[1].manifest = Some(manifest.to_vec());
    let listing = hub::parse_tree(tree_json("f32").as_bytes())
        .unwrap()
        .into_iter()
        .map(|f| {
            if f.path == "transformer_q8.manifest.json" {
                PackFile { size: manifest.len() as u64, git_oid: Some(hub::git_blob_oid(manifest)), ..f }
            } else {
                f
            }
        })
        .collect();
    (graphs, listing)
}

#[test]
fn plan_is_exactly_the_pack_in_pipeline_order() {
    for variant in ["f32", "f16", "f32-vae32"] {
        let listing = hub::parse_tree(tree_json(variant).as_bytes()).unwrap();
        let graphs = download_graphs(variant, &listing);
        let plan = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap();
        let paths: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "text_encoder_q4.onnx",
                "text_encoder_q4.manifest.json",
                "text_encoder_q4-00000.data",
                "text_encoder_q4-00001.data",
                "transformer_q8.onnx",
                "transformer_q8.manifest.json",
                "transformer_q8-00000.data",
                "transformer_q8-00001.data",
                "vae_decoder.onnx",
                "vae_decoder.onnx.data",
            ],
            "{variant}"
        );
        // Exactly the fixture directory: no README, samples or other variants.
        let mut on_disk: Vec<(String, u64)> = std::fs::read_dir(pack(variant))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().into_string().unwrap(), e.metadata().unwrap().len())
            })
            .collect();
        on_disk.sort();
        let mut planned: Vec<(String, u64)> = plan.files.iter().map(|f| (f.path.clone(), f.size)).collect();
        planned.sort();
        assert_eq!(planned, on_disk, "{variant}");
        assert_eq!(plan.total_bytes, on_disk.iter().map(|(_, s)| s).sum::<u64>());
        assert_eq!((plan.commit.as_str(), &plan.source), (COMMIT, &source()));
        // Data files carry their SHA-256, manifests their git blob id.
        for f in &plan.files {
            assert_eq!(f.sha256.is_some(), !f.path.ends_with(".json"), "{}", f.path);
            assert_eq!(f.git_oid.is_some(), f.path.ends_with(".json"), "{}", f.path);
        }
    }
}

#[test]
fn missing_shard_names_file_and_commit() {
    let listing: Vec<PackFile> = hub::parse_tree(tree_json("f32").as_bytes())
        .unwrap()
        .into_iter()
        .filter(|f| f.path != "transformer_q8-00001.data")
        .collect();
    let graphs = download_graphs("f32", &listing);
    let e = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap_err();
    assert!(matches!(&e, HubError::MissingFile { file, .. } if file == "transformer_q8-00001.data"), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "cgb/flux2-klein-4b-onnx-webgpu at commit {COMMIT} has no transformer_q8-00001.data, which \
             transformer_q8.manifest.json needs; the pack is incomplete"
        )
    );
    // The unsharded decoder's data file is named only by the graph.
    let listing: Vec<PackFile> = hub::parse_tree(tree_json("f32").as_bytes())
        .unwrap()
        .into_iter()
        .filter(|f| f.path != "vae_decoder.onnx.data")
        .collect();
    let e = hub::plan(&source(), COMMIT, &listing, &download_graphs("f32", &listing)).unwrap_err();
    assert!(e.to_string().contains("has no vae_decoder.onnx.data, which vae_decoder.onnx needs"), "{e}");
}

#[test]
fn missing_graph_asks_whether_it_is_a_pack() {
    let listing: Vec<PackFile> = hub::parse_tree(tree_json("f32").as_bytes())
        .unwrap()
        .into_iter()
        .filter(|f| f.path != Graph::TextEncoder.file_name())
        .collect();
    let e = hub::graph_files(&source(), COMMIT, &listing).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cgb/flux2-klein-4b-onnx-webgpu has no text_encoder_q4.onnx at commit {COMMIT}: is it a FLUX.2 \
             klein ONNX pack?"
        )
    );
}

#[test]
fn plan_refuses_graph_bytes_that_are_not_the_listed_ones() {
    let listing = hub::parse_tree(tree_json("f32").as_bytes()).unwrap();
    let mut graphs = download_graphs("f32", &listing);
    // Another variant's text encoder: same name, other bytes.
    graphs[0].onnx = std::fs::read(pack("f16").join(Graph::TextEncoder.file_name())).unwrap();
    let e = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap_err();
    assert!(matches!(e, HubError::Size { .. } | HubError::Hash { .. }), "{e:?}");

    let mut graphs = download_graphs("f32", &listing);
    graphs[1].manifest = None;
    let e = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap_err();
    assert!(matches!(&e, HubError::GraphBytes { file, .. } if file == "transformer_q8.manifest.json"), "{e}");

    let mut graphs = download_graphs("f32", &listing);
    graphs.pop();
    let e = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap_err();
    assert!(matches!(&e, HubError::GraphBytes { file, .. } if file == "vae_decoder.onnx"), "{e}");
}

#[test]
fn pack_files_hash_the_same_streamed_and_resumed() {
    // The largest fixture file through the resumable hasher, with a restart from a saved checkpoint
    // mid-file, as the worker does it.
    let listing = hub::parse_tree(tree_json("f32").as_bytes()).unwrap();
    let file = listing.iter().find(|f| f.path == "text_encoder_q4-00000.data").unwrap();
    let bytes = std::fs::read(pack("f32").join(&file.path)).unwrap();
    let mut hasher = hub::ResumableSha256::new();
    for chunk in bytes[..300_001].chunks(65_537) {
        hasher.update(chunk);
    }
    let checkpoint = hasher.aligned_checkpoint();
    let json = serde_json::to_string(&checkpoint).unwrap();
    let mut resumed = hub::ResumableSha256::from_checkpoint(&serde_json::from_str(&json).unwrap()).unwrap();
    resumed.update(&bytes[checkpoint.offset as usize..]);
    assert_eq!(resumed.offset(), file.size);
    hub::verify_sha256(file, &resumed.finalize()).unwrap();
}

#[test]
fn a_needed_file_without_any_hash_is_refused() {
    let listing: Vec<PackFile> = hub::parse_tree(tree_json("f32").as_bytes())
        .unwrap()
        .into_iter()
        .map(|f| {
            if f.path == "transformer_q8-00001.data" {
                PackFile { sha256: None, git_oid: None, ..f }
            } else {
                f
            }
        })
        .collect();
    let e = hub::plan(&source(), COMMIT, &listing, &download_graphs("f32", &listing)).unwrap_err();
    assert!(matches!(&e, HubError::Unverifiable { file } if file == "transformer_q8-00001.data"), "{e:?}");
    assert!(e.to_string().contains("cannot be verified"), "{e}");
}

#[test]
fn a_pack_file_named_like_the_download_record_is_refused() {
    // A manifest that names one of the download record's slots as a shard.
    let manifest =
        br#"{"shards":[{"path":"transformer_q8-00000.data"},{"path":"download-a.json"}]}"#.to_vec();
    let (graphs, mut listing) = with_transformer_manifest(&manifest);
    listing.push(PackFile {
        path: "download-a.json".into(),
        size: 2,
        sha256: None,
        git_oid: Some(hub::git_blob_oid(b"{}")),
    });
    let e = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap_err();
    assert!(e.to_string().contains("download-a.json") && e.to_string().contains("reserved"), "{e}");
}

#[test]
fn a_graph_or_manifest_listed_beyond_any_pack_is_refused_before_it_is_fetched() {
    let listed_at = |path: &str, size: u64| -> Vec<PackFile> {
        hub::parse_tree(tree_json("f32").as_bytes())
            .unwrap()
            .into_iter()
            .map(|f| if f.path == path { PackFile { size, ..f } } else { f })
            .collect()
    };
    // graph_files is what the worker fetches, so refusing there means nothing was read.
    let e = hub::graph_files(&source(), COMMIT, &listed_at("transformer_q8.onnx", 10 << 30)).unwrap_err();
    assert!(
        matches!(&e, HubError::TooLargeToRead { file, cap, .. } if file == "transformer_q8.onnx" && *cap == hub::MAX_GRAPH_BYTES),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "the Hub lists transformer_q8.onnx at 10.7 GB, over the 67.1 MB allowed for a pack's graph or \
         manifest (the published pack's are a few MB), so it was not downloaded"
    );
    let e = hub::graph_files(&source(), COMMIT, &listed_at("text_encoder_q4.manifest.json", 2 << 20))
        .unwrap_err();
    assert!(
        matches!(&e, HubError::TooLargeToRead { file, .. } if file == "text_encoder_q4.manifest.json"),
        "{e}"
    );
    // At the caps, still accepted.
    hub::graph_files(&source(), COMMIT, &listed_at("transformer_q8.onnx", hub::MAX_GRAPH_BYTES)).unwrap();
    hub::graph_files(&source(), COMMIT, &listed_at("transformer_q8.manifest.json", hub::MAX_MANIFEST_BYTES))
        .unwrap();
}

#[test]
fn a_pack_file_in_a_sub_folder_is_refused_when_planning() {
    // A manifest that names a shard in a sub-folder, which the repo does hold.
    let manifest =
        br#"{"shards":[{"path":"transformer_q8-00000.data"},{"path":"shards/more.data"}]}"#.to_vec();
    let (graphs, mut listing) = with_transformer_manifest(&manifest);
    listing.push(PackFile {
        path: "shards/more.data".into(),
        size: 4,
        sha256: Some("a".repeat(64)),
        git_oid: None,
    });
    let e = hub::plan(&source(), COMMIT, &listing, &graphs).unwrap_err();
    assert!(matches!(&e, HubError::SubFolder { file, .. } if file == "shards/more.data"), "{e:?}");
    assert_eq!(
        e.to_string(),
        "transformer_q8.manifest.json names shards/more.data, which is in a sub-folder: a pack's files must \
         all be at the top of the repo"
    );
}

//! Loading a stage's graph: the stored re-blocked form when there is a good one, else the pack's
//! graph re-blocked while loading; its external data opened from OPFS; the embedding tables looked
//! up outside it; the decoder cut into a chain of pieces when the plan asks.

use super::*;
use futures_util::StreamExt;

/// A stage's loaded graph: one session, or a chain of pieces.
pub(super) enum Loaded {
    Whole(Session),
    Chain(ort::Chain),
}

impl Loaded {
    /// How many sessions (1 for a whole graph).
    pub(super) fn pieces(&self) -> u32 {
        match self {
            Loaded::Whole(_) => 1,
            Loaded::Chain(chain) => chain.len() as u32,
        }
    }

    /// How many values a streamed chain copied to the GPU itself, over all its runs.
    pub(super) fn uploaded_values(&self) -> u32 {
        match self {
            Loaded::Whole(_) => 0,
            Loaded::Chain(chain) => chain.uploaded_values(),
        }
    }

    pub(super) fn inputs(&self) -> Vec<TensorInfo> {
        match self {
            Loaded::Whole(session) => session.inputs(),
            Loaded::Chain(chain) => chain.inputs(),
        }
    }

    pub(super) fn outputs(&self) -> Vec<TensorInfo> {
        match self {
            Loaded::Whole(session) => session.outputs(),
            Loaded::Chain(chain) => chain.outputs(),
        }
    }

    pub(super) async fn run(
        &self,
        feeds: &[(&str, &ort::Tensor)],
        wanted: &[&str],
    ) -> Result<Vec<ort::Tensor>, OrtError> {
        match self {
            Loaded::Whole(session) => session.run(feeds, wanted).await,
            Loaded::Chain(chain) => chain.run(feeds, wanted).await,
        }
    }

    /// ORT's profile of a whole graph (a chain is never profiled: `profile` loads stages whole).
    pub(super) async fn end_profiling(&self) -> Result<String, OrtError> {
        match self {
            Loaded::Whole(session) => session.end_profiling().await,
            Loaded::Chain(_) => Ok(String::new()),
        }
    }

    pub(super) async fn release(self) -> Result<(), OrtError> {
        match self {
            Loaded::Whole(session) => session.release().await,
            Loaded::Chain(chain) => chain.release().await,
        }
    }
}

/// `bytes` (the graph `name`) cut into pieces of at most `max` bytes for `params`' image
/// (`imagine_core::graph::split`), as `(graph, inputs, outputs)`; none where it cannot be cut,
/// which is logged: the graph then runs whole.
pub(super) fn pieces(
    name: &str,
    bytes: &[u8],
    params: &GenerateParams,
    max: u64,
) -> Vec<(Vec<u8>, Vec<String>, Vec<String>)> {
    use imagine_core::graph::split;
    let cut = split::latent_channels(bytes).and_then(|channels| {
        // The decoder reads packed tokens at 1/16 of the image, or the unpatchified latent at 1/8.
        let factor = if channels == Some(imagine_core::latents::TOKEN_CHANNELS as u64) { 16 } else { 8 };
        split::split(bytes, u64::from(params.height / factor), u64::from(params.width / factor), max)
    });
    match cut {
        Ok(pieces) => pieces.into_iter().map(|p| (p.model, p.inputs, p.outputs)).collect(),
        Err(e) => {
            web_sys::console::warn_1(
                &format!("imagine: {name} runs whole: it could not be cut ({e})").into(),
            );
            Vec::new()
        }
    }
}

/// `bytes` (the graph `name`) cut into `parts` pieces of about equal weights
/// (`imagine_core::graph::split::by_weights`), as [`pieces`] gives them, with the inputs and outputs
/// the graph declares; `None` where it cannot be cut (logged: the graph then runs whole).
pub(super) fn pieces_by_weights(name: &str, bytes: &[u8], parts: u32) -> Option<StreamedPieces> {
    use imagine_core::graph::split;
    let cut = split::by_weights(bytes, parts).and_then(|pieces| Ok((pieces, split::declared_io(bytes)?)));
    match cut {
        Ok((pieces, io)) if pieces.len() > 1 => {
            Some((pieces.into_iter().map(|p| (p.model, p.inputs, p.outputs)).collect(), io))
        }
        Ok(_) => None,
        Err(e) => {
            web_sys::console::warn_1(
                &format!("imagine: {name} runs whole: it could not be cut by its weights ({e})").into(),
            );
            None
        }
    }
}

/// A graph's pieces (`(graph, inputs, outputs)`), and the whole graph's declared inputs and outputs.
pub(super) type StreamedPieces =
    (Vec<(Vec<u8>, Vec<String>, Vec<String>)>, (Vec<TensorInfo>, Vec<TensorInfo>));

/// The graph `graph` runs as on WebGPU `adapter` (`None`: the wasm backend): `(file name, bytes, tables
/// to look up)`. On a WebGPU adapter without `shader-f16`, a float16 graph runs as the pack's float32
/// conversion made for this adapter's limits; without one it is refused before anything is loaded.
pub(super) async fn choose_graph(
    record: &opfs::PackRecord,
    dir: &web_sys::FileSystemDirectoryHandle,
    graph: Graph,
    adapter: Option<gpu::AdapterInfo>,
) -> Result<(String, Vec<u8>, Vec<(EmbeddingLookup, web_sys::File)>), StageWorkerError> {
    let name = graph.file_name();
    let bytes = opfs::read(dir, &name).await?;
    let Some(adapter) = adapter else {
        return Ok((name, bytes, Vec::new()));
    };
    let needs_f16 = pack::declares_float16(&bytes)
        .map_err(|source| StageWorkerError::Graph { graph: name.clone(), source })?;
    if adapter.has_f16 || !needs_f16 {
        return Ok((name, bytes, Vec::new()));
    }
    let converted = record
        .conversion
        .as_ref()
        .filter(|c| c.limits == adapter.limits)
        .and_then(|c| c.graph(graph))
        .ok_or(GpuError::NoF16 { what: name })?;
    let mut lookups = Vec::new();
    for lookup in &converted.lookups {
        lookups.push((lookup.clone(), open_external(dir, &converted.onnx, &lookup.source.file).await?));
    }
    Ok((converted.onnx.clone(), opfs::read(dir, &converted.onnx).await?, lookups))
}

/// Pieces of a stored form hashed at once: the browser hashes on other threads, and reads the next
/// pieces meanwhile.
const HASHED_AT_ONCE: usize = 8;

/// A stored re-blocked form whose lengths are right, its checksums still to check.
pub(super) struct UncheckedForm {
    /// `<commit>:<file>`, as [`StageTiming::checked_form`] records it.
    pub(super) key: String,
    onnx_len: u64,
    onnx_digest: [u8; 32],
    data: web_sys::File,
}

/// The stored re-blocked graph of `stored` (its bytes), once the lengths of its files are checked
/// against the record; with the checksums still to check where `checksums`. Why not, if they differ
/// (or cannot be read).
pub(super) async fn stored_form(
    dir: &web_sys::FileSystemDirectoryHandle,
    stored: &reblock::ReblockedGraph,
    key: String,
    checksums: bool,
) -> Result<(Vec<u8>, Option<UncheckedForm>), String> {
    let onnx = opfs::read(dir, &stored.onnx).await.map_err(|e| e.to_string())?;
    let data = opfs::file(dir, &stored.data).await.map_err(|e| e.to_string())?;
    stored.check(onnx.len() as u64, data.size() as u64, None).map_err(|e| e.to_string())?;
    if !checksums {
        return Ok((onnx, None));
    }
    let mut onnx_digest = imagine_core::hub::ResumableSha256::new();
    onnx_digest.update(&onnx);
    let unchecked =
        UncheckedForm { key, onnx_len: onnx.len() as u64, onnx_digest: onnx_digest.finalize(), data };
    Ok((onnx, Some(unchecked)))
}

impl UncheckedForm {
    /// Checks the form's checksums against `stored`, the data a piece at a time: its key once they
    /// are right, why not if they differ (or cannot be read).
    pub(super) async fn check(self, stored: &reblock::ReblockedGraph) -> Result<String, String> {
        let UncheckedForm { key, onnx_len, onnx_digest, data } = self;
        let data_len = data.size() as u64;
        // Each piece hashed by the browser (`js::sha256`), several at once, so that reading the next
        // pieces overlaps hashing.
        let read = |e: JsError| OpfsError::js(opfs::Op::Read, stored.data.as_str(), e).to_string();
        let hash_piece = |offset: u64| {
            let data = &data;
            async move {
                let end = (offset + reblock::DIGEST_PIECE_BYTES).min(data_len);
                let slice =
                    data.slice_with_f64_and_f64(offset as f64, end as f64).map_err(|e| read(e.into()))?;
                let piece = JsFuture::from(slice.array_buffer()).await.map_err(|e| read(e.into()))?;
                crate::platform::js::sha256(&piece).await.map_err(read)
            }
        };
        let offsets = (0..data_len).step_by(reblock::DIGEST_PIECE_BYTES as usize);
        let mut hashes = futures_util::stream::iter(offsets.map(hash_piece)).buffered(HASHED_AT_ONCE);
        let mut data_digest = reblock::PieceDigest::new();
        while let Some(hashed) = hashes.next().await {
            data_digest.piece(&hashed?);
        }
        stored
            .check(onnx_len, data_len, Some((&onnx_digest, &data_digest.finalize())))
            .map_err(|e| e.to_string())?;
        Ok(key)
    }
}

/// Opens `file`, which `graph` needs.
pub(super) async fn open_external(
    dir: &web_sys::FileSystemDirectoryHandle,
    graph: &str,
    file: &str,
) -> Result<web_sys::File, StageWorkerError> {
    opfs::file(dir, file).await.map_err(|e| external_data_error(graph, file, e))
}

pub(super) fn external_data_error(graph: &str, file: &str, source: opfs::OpfsError) -> StageWorkerError {
    StageWorkerError::ExternalData {
        graph: graph.to_owned(),
        file: file.to_owned(),
        source: Box::new(source),
    }
}

/// The inputs of the tables that left the graph, named: the rows of the ids fed, read from each
/// table's file (each distinct row once); the float32 conversion's tables converted to float32.
pub(super) async fn look_up(
    lookups: &[(EmbeddingLookup, web_sys::File)],
    tables: &[(TableLookup, web_sys::File)],
    feeds: &[(&str, &Tensor)],
) -> Result<Vec<(String, ort::Tensor)>, SessionError> {
    let ids_of = |ids_input: &str, table: &str| match feeds.iter().find(|(name, _)| *name == ids_input) {
        Some((_, Tensor { dims, data: TensorData::Int64(ids) })) => Ok((dims, ids)),
        _ => Err(SessionError(format!("no int64 `{ids_input}` fed to look `{table}` up"))),
    };
    let failed = |e: imagine_core::graph::LookupError| SessionError(e.to_string());
    let mut inputs = Vec::new();
    for (lookup, file) in lookups {
        let (dims, ids) = ids_of(&lookup.ids_input, &lookup.table)?;
        let rows = read_rows(file, ids.iter().map(|&id| lookup.row_range(id))).await?;
        let values = lookup.gather(ids, |offset, out| copy_row(&rows, offset, out)).map_err(failed)?;
        let mut shape = dims.clone();
        shape.push(lookup.row_elements as i64);
        inputs.push((lookup.input.clone(), ort::Tensor::from_f32(&values, &shape).map_err(session_error)?));
    }
    for (table, file) in tables {
        let (dims, ids) = ids_of(&table.ids_input, &table.table)?;
        let rows = read_rows(file, ids.iter().map(|&id| table.row_range(id))).await?;
        let bytes = table.gather(ids, |offset, out| copy_row(&rows, offset, out)).map_err(failed)?;
        let tensor = ort::Tensor::from_bytes(table.elem_type, &bytes, &table.input_dims(dims));
        inputs.push((table.input.clone(), tensor.map_err(session_error)?));
    }
    Ok(inputs)
}

/// `bytes` (the graph `name`, its external-data locations stored as `files` in `dir`) re-blocked to 32
/// with the repeated scales and zero points computed here, and the data file ORT then needs beside the
/// others: the computed tensors, each copied out of this worker's wasm memory as it is made (which never
/// shrinks) and handed to ORT where they are, in JS memory, until the session is created.
pub(super) async fn reblock(
    name: &str,
    bytes: &[u8],
    dir: &web_sys::FileSystemDirectoryHandle,
    files: &HashMap<String, String>,
) -> Result<(Vec<u8>, Option<ExternalData>), StageWorkerError> {
    let edit_failed = |source| StageWorkerError::GraphEdit { graph: name.to_owned(), source };
    let mut opened: HashMap<&str, web_sys::File> = HashMap::new();
    let mut reads = Vec::new();
    for range in reblock::sources_to_read(bytes).map_err(edit_failed)? {
        // A location the graph names but the pack does not list is left to the nodes' fallback.
        let Some(file) = files.get(&range.location) else { continue };
        if !opened.contains_key(file.as_str()) {
            opened.insert(file, open_external(dir, name, file).await?);
        }
        let failed =
            move |e: JsValue| external_data_error(name, file, OpfsError::js(opfs::Op::Read, file, e));
        let end = range.offset + range.length;
        let slice =
            opened[file.as_str()].slice_with_f64_and_f64(range.offset as f64, end as f64).map_err(failed)?;
        // A few hundred small reads (one per node's scales or zero points), all in flight at once.
        reads.push(async move {
            let buffer = JsFuture::from(slice.array_buffer()).await.map_err(failed)?;
            Ok::<_, StageWorkerError>((range, Uint8Array::new(&buffer).to_vec()))
        });
    }
    let read: HashMap<_, _> = futures_util::future::try_join_all(reads).await?.into_iter().collect();
    let parts = js_sys::Array::new();
    let reblocked = reblock::to_block_32_computed(bytes, &read, reblock::COMPUTED_DATA, &mut |chunk| {
        parts.push(&Uint8Array::from(chunk));
    })
    .map_err(edit_failed)?;
    if reblocked.data_length == 0 {
        return Ok((reblocked.graph, None));
    }
    Ok((reblocked.graph, Some(ExternalData { path: reblock::COMPUTED_DATA.to_owned(), data: parts.into() })))
}

/// Each distinct row of `ranges` read from `file`, by its offset.
pub(super) async fn read_rows(
    file: &web_sys::File,
    ranges: impl Iterator<Item = Result<Range, imagine_core::graph::LookupError>>,
) -> Result<std::collections::HashMap<u64, Vec<u8>>, SessionError> {
    let mut rows = std::collections::HashMap::new();
    for range in ranges {
        let range = range.map_err(|e| SessionError(e.to_string()))?;
        if rows.contains_key(&range.offset) {
            continue;
        }
        let read = |e: JsValue| SessionError(format!("reading {}: {}", range.file, JsError::from(e)));
        let end = range.offset + range.length;
        let slice = file.slice_with_f64_and_f64(range.offset as f64, end as f64).map_err(read)?;
        let buffer = JsFuture::from(slice.array_buffer()).await.map_err(read)?;
        rows.insert(range.offset, Uint8Array::new(&buffer).to_vec());
    }
    Ok(rows)
}

pub(super) fn copy_row(
    rows: &std::collections::HashMap<u64, Vec<u8>>,
    offset: u64,
    out: &mut [u8],
) -> Result<(), String> {
    match rows.get(&offset) {
        Some(row) if row.len() == out.len() => {
            out.copy_from_slice(row);
            Ok(())
        }
        _ => Err(format!("the row at byte {offset} is cut short")),
    }
}

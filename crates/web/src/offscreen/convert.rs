//! Converting a verified float16 pack to float32 for an adapter without `shader-f16`, in the download
//! worker, in the staging slot, before the pack is installed (the rewrite itself is
//! `imagine_core::graph`).
//!
//! * Resumable: each new file is written in increasing order, flushed, and its length saved in
//!   `conversion.json` (`ConversionState`) every [`CHECKPOINT_BYTES`]; a resumed conversion cuts the
//!   file back to that length and goes on. A state of another commit or other limits, or one that
//!   cannot be read, starts the conversion over.
//! * Verified: the conversion is a pure function of the pack's verified bytes, so once a file is
//!   written every byte of it is read back and compared with the conversion recomputed from the
//!   source (and its padding with zeros); the graph is read back and compared with the rewrite's
//!   output. A file that differs is converted again once, then the install stops. Nothing needs to
//!   be trusted from before an interruption, and no hash of our own output has to be stored.
//! * Installed with the pack: the `ConversionRecord` goes into the pack record in the one
//!   `state.json` write that installs the pack, so a half-converted pack is never installed; the
//!   files live in the slot and go with it.

use std::collections::HashMap;

use imagine_core::api::FileProgress;
use imagine_core::graph::pack_conversion::{
    converted_graph_name, ConversionRecord, ConversionState, GraphPlan, CONVERSION_STATE_FILE,
    PIECE_SOURCE_BYTES,
};
use imagine_core::graph::{f16_to_f32, Limits, NewFile, Piece, RewriteError};
use imagine_core::message::{arg, Localize, Message};
use thiserror::Error;
use web_sys::FileSystemDirectoryHandle;

use crate::platform::opfs::{self, OpfsError, SyncFile};

/// Float32 bytes between two saved states.
const CHECKPOINT_BYTES: u64 = 16 << 20;

/// Why a conversion stopped.
#[derive(Debug, Error)]
pub enum ConvertError {
    /// Reading a float16 source, or writing a float32 file or the saved state, in OPFS.
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// A graph or a piece of weights that cannot be converted as planned.
    #[error(transparent)]
    Rewrite(#[from] RewriteError),
    /// A graph of the pack that cannot be read as the planner read it.
    #[error("{graph}: {source}")]
    Graph {
        /// The graph's file name.
        graph: String,
        /// Why.
        source: imagine_core::pack::PackError,
    },
    /// A file made for this GPU (converted or re-blocked) that read back differently twice.
    #[error(
        "{0}, made for this GPU, read back differently from what was written, twice: the disk may be failing"
    )]
    Corrupt(String),
    /// A source file shorter than the graph says.
    #[error("{file} ends before byte {end}, where the graph's tensor {tensor} ends")]
    ShortSource {
        /// The float16 source file.
        file: String,
        /// The byte offset the tensor ends at.
        end: u64,
        /// The tensor's name in the graph.
        tensor: String,
    },
}

/// Progress: bytes written of the total, per file.
pub struct ConvertProgress {
    /// Float32 bytes written so far, all files together.
    pub done_bytes: u64,
    /// Float32 bytes to write in all.
    pub total_bytes: u64,
    /// Each new file (rewritten graph or float32 weights): its size, bytes written, and whether it is done.
    pub files: Vec<FileProgress>,
}

/// The saved progress of converting `commit` for `limits` in `dir`, if that is what was converted there.
async fn saved_state(
    dir: &FileSystemDirectoryHandle,
    commit: &str,
    limits: Limits,
) -> Option<ConversionState> {
    let bytes = opfs::read(dir, CONVERSION_STATE_FILE).await.ok()?;
    serde_json::from_slice::<ConversionState>(&bytes).ok().filter(|state| state.is_for(commit, limits))
}

/// Each new file of `plans` with what `state` says of it.
fn files_progress(plans: &[GraphPlan], state: &ConversionState) -> Vec<FileProgress> {
    let mut files: Vec<FileProgress> = plans
        .iter()
        .flat_map(|p| {
            let graph = FileProgress {
                path: converted_graph_name(p.graph),
                size: p.rewrite.graph.len() as u64,
                done_bytes: 0,
                verified: false,
            };
            p.rewrite.plan.new_files.iter().map(new_file_progress).chain(std::iter::once(graph))
        })
        .collect();
    for f in &mut files {
        f.verified = state.verified.contains(&f.path);
        f.done_bytes =
            if f.verified { f.size } else { state.written.get(&f.path).copied().unwrap_or(0).min(f.size) };
    }
    files
}

/// Bytes an earlier attempt at converting `plans` of `commit` for `limits` saved in `dir`: on disk
/// already, so not to be found room for again.
pub async fn written_bytes(
    dir: &FileSystemDirectoryHandle,
    commit: &str,
    plans: &[GraphPlan],
    limits: Limits,
) -> u64 {
    saved_state(dir, commit, limits)
        .await
        .map_or(0, |state| files_progress(plans, &state).iter().map(|f| f.done_bytes).sum())
}

/// Converts `plans` for `limits` into `dir` (the staging slot of `commit`), resuming from the saved
/// state; `report` is called after every piece. The record to install with the pack.
pub async fn convert(
    dir: &FileSystemDirectoryHandle,
    commit: &str,
    plans: &[GraphPlan],
    limits: Limits,
    mut report: impl FnMut(&ConvertProgress),
) -> Result<ConversionRecord, ConvertError> {
    let state = saved_state(dir, commit, limits).await.unwrap_or_else(|| ConversionState {
        commit: commit.to_owned(),
        limits: Some(limits),
        ..Default::default()
    });
    let state_file = SyncFile::open(dir, CONVERSION_STATE_FILE).await?;
    let files = files_progress(plans, &state);
    let mut job = Job { dir, state, state_file, sources: HashMap::new(), files, report: &mut report };
    job.save()?;
    job.report_now();
    for plan in plans {
        for (new, pieces) in plan.file_pieces(PIECE_SOURCE_BYTES) {
            if job.state.verified.contains(&new.name) {
                continue;
            }
            job.data_file(plan, new, &pieces).await?;
        }
        let name = converted_graph_name(plan.graph);
        if !job.state.verified.contains(&name) {
            job.graph(&name, &plan.rewrite.graph).await?;
        }
    }
    // The state stays until the swap removes it with the download record: a restart before the swap
    // finds every file verified and goes straight to it.
    drop(job.sources);
    drop(job.state_file);
    Ok(ConversionRecord::new(plans, limits))
}

fn new_file_progress(f: &NewFile) -> FileProgress {
    FileProgress { path: f.name.clone(), size: f.size, done_bytes: 0, verified: false }
}

struct Job<'a, R: FnMut(&ConvertProgress)> {
    dir: &'a FileSystemDirectoryHandle,
    state: ConversionState,
    state_file: SyncFile,
    sources: HashMap<String, SyncFile>,
    files: Vec<FileProgress>,
    report: &'a mut R,
}

impl<R: FnMut(&ConvertProgress)> Job<'_, R> {
    /// Saves the state (the previous one stays readable until the write is whole: a torn state is
    /// unreadable, which starts the conversion over, and that is always correct).
    fn save(&self) -> Result<(), OpfsError> {
        let bytes = opfs::json_bytes(&self.state, CONVERSION_STATE_FILE)?;
        self.state_file.truncate(0)?;
        self.state_file.write_at(&bytes, 0)?;
        self.state_file.flush()
    }

    fn progress(&mut self, name: &str, done: u64, verified: bool) {
        if let Some(f) = self.files.iter_mut().find(|f| f.path == name) {
            f.done_bytes = done.min(f.size);
            f.verified = verified;
        }
        self.report_now();
    }

    fn report_now(&mut self) {
        let progress = ConvertProgress {
            done_bytes: self.files.iter().map(|f| f.done_bytes).sum(),
            total_bytes: self.files.iter().map(|f| f.size).sum(),
            files: self.files.clone(),
        };
        (self.report)(&progress);
    }

    async fn source(&mut self, name: &str) -> Result<&SyncFile, OpfsError> {
        if !self.sources.contains_key(name) {
            let file = SyncFile::open(self.dir, name).await?;
            self.sources.insert(name.to_owned(), file);
        }
        Ok(&self.sources[name])
    }

    /// Reads a piece's float16 source and returns its float32 form.
    async fn converted(&mut self, plan: &GraphPlan, piece: &Piece) -> Result<Vec<u8>, ConvertError> {
        let mut half = vec![0; piece.source.length as usize];
        let source = self.source(&piece.source.file).await?;
        let read = source.read_at(&mut half, piece.source.offset)?;
        if read != half.len() {
            return Err(ConvertError::ShortSource {
                file: piece.source.file.clone(),
                end: piece.source.offset + piece.source.length,
                tensor: plan.rewrite.plan.copies[piece.copy].tensor.clone(),
            });
        }
        let mut float = vec![0; half.len() * 2];
        f16_to_f32(&half, &mut float)?;
        Ok(float)
    }

    /// Writes (or resumes) one new external-data file, then verifies it; converts it again once if it
    /// does not verify.
    async fn data_file(
        &mut self,
        plan: &GraphPlan,
        new: &NewFile,
        pieces: &[Piece],
    ) -> Result<(), ConvertError> {
        for attempt in 0..2 {
            let file = SyncFile::open(self.dir, &new.name).await?;
            // Bytes past the saved length are not trusted: cut back to it.
            let start = self.state.written.get(&new.name).copied().unwrap_or(0).min(new.size);
            file.truncate(start)?;
            let mut saved_at = start;
            for piece in pieces.iter().filter(|p| p.target.offset + p.target.length > start) {
                let float = self.converted(plan, piece).await?;
                file.write_at(&float, piece.target.offset)?;
                let end = piece.target.offset + piece.target.length;
                if end - saved_at >= CHECKPOINT_BYTES {
                    file.flush()?;
                    self.state.written.insert(new.name.clone(), end);
                    self.save()?;
                    saved_at = end;
                }
                self.progress(&new.name, end, false);
            }
            // The gaps between tensors and the tail are zeros (the file grows with zeros).
            file.truncate(new.size)?;
            file.flush()?;
            self.state.written.insert(new.name.clone(), new.size);
            self.save()?;
            self.progress(&new.name, new.size, false);
            if self.verify(plan, &file, new, pieces).await? {
                self.state.verified.push(new.name.clone());
                self.save()?;
                self.progress(&new.name, new.size, true);
                opfs::failpoint("convert:file-done").await;
                return Ok(());
            }
            if attempt == 0 {
                self.state.written.insert(new.name.clone(), 0);
                self.save()?;
            }
        }
        Err(ConvertError::Corrupt(new.name.clone()))
    }

    /// Whether `file` holds exactly the conversion of its pieces, with zeros between them.
    async fn verify(
        &mut self,
        plan: &GraphPlan,
        file: &SyncFile,
        new: &NewFile,
        pieces: &[Piece],
    ) -> Result<bool, ConvertError> {
        if file.size()? != new.size {
            return Ok(false);
        }
        let mut on_disk = Vec::new();
        let mut covered = 0;
        for piece in pieces {
            if !self.zeros(file, covered, piece.target.offset)? {
                return Ok(false);
            }
            let float = self.converted(plan, piece).await?;
            on_disk.resize(float.len(), 0);
            if file.read_at(&mut on_disk, piece.target.offset)? != float.len() || on_disk != float {
                return Ok(false);
            }
            covered = piece.target.offset + piece.target.length;
        }
        Ok(self.zeros(file, covered, new.size)?)
    }

    /// Whether `file` holds zeros from `from` to `to` (alignment padding: at most 63 bytes a gap).
    fn zeros(&self, file: &SyncFile, from: u64, to: u64) -> Result<bool, OpfsError> {
        if to <= from {
            return Ok(true);
        }
        let mut gap = vec![1u8; (to - from) as usize];
        Ok(file.read_at(&mut gap, from)? == gap.len() && gap.iter().all(|b| *b == 0))
    }

    /// Writes the float32 graph and reads it back.
    async fn graph(&mut self, name: &str, bytes: &[u8]) -> Result<(), ConvertError> {
        for _ in 0..2 {
            let file = SyncFile::create(self.dir, name).await?;
            file.write_at(bytes, 0)?;
            file.flush()?;
            let mut back = vec![0; bytes.len()];
            if file.size()? == bytes.len() as u64
                && file.read_at(&mut back, 0)? == bytes.len()
                && back == bytes
            {
                file.close()?;
                self.state.verified.push(name.to_owned());
                self.save()?;
                self.progress(name, bytes.len() as u64, true);
                opfs::failpoint("convert:file-done").await;
                return Ok(());
            }
        }
        Err(ConvertError::Corrupt(name.to_owned()))
    }
}

impl Localize for ConvertError {
    fn message(&self) -> Message {
        match self {
            ConvertError::Opfs(e) => e.message(),
            ConvertError::Rewrite(_) | ConvertError::Graph { .. } => Message::text(self),
            ConvertError::Corrupt(file) => Message::new("errConvertCorrupt", [arg(file)]),
            ConvertError::ShortSource { file, end, tensor } => {
                Message::new("errConvertShortSource", [arg(file), arg(end), arg(tensor)])
            }
        }
    }
}

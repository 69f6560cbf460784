//! One download: each file fetched from where it stopped, checked against its listed length and
//! hash, and written to OPFS in blocks.

use super::*;
use imagine_core::api::PackFile;

thread_local! {
    /// Answered when the offscreen document allows the swap ([`DownloadCommand::Swap`]).
    pub(super) static SWAP_ALLOWED: RefCell<Option<oneshot::Sender<()>>> = const { RefCell::new(None) };
}

/// No job runs: the verified pack may replace the installed one.
pub(super) fn allow_swap() {
    if let Some(allow) = SWAP_ALLOWED.with_borrow_mut(Option::take) {
        let _ = allow.send(());
    }
}

/// A download under way: where its files go, its record, and its progress reports.
pub(super) struct Download {
    pub(super) dir: FileSystemDirectoryHandle,
    pub(super) source: PackSource,
    pub(super) record: DownloadRecord,
    pub(super) store: RecordStore,
    pub(super) report: Reporter,
    pub(super) hasher: HashWorker,
}

impl Download {
    pub(super) async fn save(&mut self) -> Result<(), DownloadError> {
        Ok(self.store.save(&self.dir, &self.record).await?)
    }

    /// Streams file `index`, resuming from its recorded prefix, until it is verified.
    pub(super) async fn file(&mut self, index: usize) -> Result<(), DownloadError> {
        let planned = self.record.files[index].file.clone();
        let url = hub::resolve_url(&self.source, &self.record.commit, &planned.path);
        let mut mismatches = 0;
        let mut failures = 0;
        loop {
            let file = SyncFile::open(&self.dir, &planned.path).await?;
            let start = self.cut_to_resume(index, &file).await?;
            let saved_before = saved_offset(&self.record.files[index]);
            match self.stream(&file, &url, start, index).await {
                Ok(()) => {}
                Err(error) if !error.is_transient() => return Err(error),
                Err(error) => {
                    // Progress is a checkpoint saved further on: a server that always cuts the response
                    // before the next checkpoint makes none, however many bytes it sends.
                    let progressed = saved_offset(&self.record.files[index]) > saved_before;
                    failures = if progressed { 1 } else { failures + 1 };
                    if failures >= hub::MAX_ATTEMPTS_WITHOUT_PROGRESS {
                        return Err(DownloadError::GaveUp { last: Box::new(error), attempts: failures });
                    }
                    drop(file);
                    sleep_ms(hub::backoff_ms(failures - 1, random_unit())).await;
                    continue;
                }
            }
            if let Err(mismatch) = self.verify(index, &planned, &file).await? {
                // A corrupt file is downloaded again once, from the start. The record says so before the
                // file is cut.
                mismatches += 1;
                self.record.files[index].restart();
                self.save().await?;
                file.truncate(0)?;
                drop(file);
                if mismatches > 1 {
                    return Err(DownloadError::Corrupt(mismatch));
                }
                continue;
            }
            let entry = &mut self.record.files[index];
            entry.verified = true;
            entry.done = planned.size;
            entry.hash = None;
            file.close()?;
            self.save().await?;
            self.report.record(&self.record);
            return Ok(());
        }
    }

    /// Cuts file `index` back to where its download resumes, and sets the hash worker to that point;
    /// the offset. Bytes past the last checkpoint are never trusted. A file shorter than its checkpoint
    /// lost bytes the record counts, so it starts over.
    async fn cut_to_resume(&mut self, index: usize, file: &SyncFile) -> Result<u64, DownloadError> {
        let mut checkpoint = self.record.files[index].resume().checkpoint().filter(|c| c.offset > 0);
        let on_disk = file.size()?;
        if checkpoint.as_ref().is_some_and(|c| c.offset > on_disk) {
            self.record.files[index].restart();
            self.save().await?;
            checkpoint = None;
        }
        let start = checkpoint.as_ref().map_or(0, |c| c.offset);
        self.hasher.reset(checkpoint.as_ref()).await?;
        self.record.files[index].done = start;
        file.truncate(start)?;
        Ok(start)
    }

    /// Checks file `index`, all on disk, against the listing's `planned`: by the SHA-256 the hash worker
    /// took as it was written (read back from disk where it was restarted), or by its git blob id for a
    /// file stored in git (no LFS SHA-256). The outer error is of reading it; the inner, a mismatch.
    async fn verify(
        &mut self,
        index: usize,
        planned: &PackFile,
        file: &SyncFile,
    ) -> Result<Result<(), HubError>, DownloadError> {
        let mut digest = self.hasher.finish().await?;
        if self.record.files[index].restarted {
            let mut hasher = hub::ResumableSha256::new();
            read_on_disk(file, planned.size, |bytes| hasher.update(bytes))?;
            digest = hasher.finalize();
        }
        let mut verified = hub::verify_sha256(planned, &digest);
        if planned.sha256.is_none() {
            let mut hasher = hub::GitBlobHasher::new(planned.size);
            read_on_disk(file, planned.size, |bytes| hasher.update(bytes))?;
            verified = hub::verify_git_oid(planned, &hasher.finalize());
        }
        Ok(verified)
    }

    /// One request: appends the response to `file` from `start`, saving the record every checkpoint.
    /// A 200 where a range was asked for restarts the file. Long because it is one loop over the body
    /// whose every way out but the hash worker's failure must end the same way (below it).
    pub(super) async fn stream(
        &mut self,
        file: &SyncFile,
        url: &str,
        start: u64,
        index: usize,
    ) -> Result<(), DownloadError> {
        let (path, size) = (self.record.files[index].file.path.clone(), self.record.files[index].file.size);
        if start == size {
            // Every byte was saved before an interruption; only the verification is left.
            return Ok(());
        }
        let (response, mut watch) = hub_client::fetch(url, (start > 0).then_some(start)).await?;
        check_status(&response, url)?;
        check_length(&response, url, &path, size)?;
        let mut offset = self.resumed_at(&response, file, url, start, index).await?;
        let mut ends_early = range_ends_early(&response, size);
        let body = response.body().ok_or_else(|| DownloadError::NoBody { url: url.to_owned() })?;
        let mut reader = BodyReader::new(body);
        let mut asked_at = offset;
        let result = loop {
            let buffer = self.hasher.buffer().await?;
            let (buffer, length, more) = match reader.fill(buffer, &watch).await {
                Ok(block) => block,
                Err(e) => {
                    break Err(match watch.stall(url) {
                        Some(stalled) => stalled.into(),
                        None => DownloadError::Interrupted { path: path.clone(), source: e.into() },
                    })
                }
            };
            if length > 0 {
                if offset + u64::from(length) > size {
                    break Err(DownloadError::TooLong { url: url.to_owned(), path: path.clone(), size });
                }
                let block = Uint8Array::new_with_byte_offset_and_length(&buffer, 0, length);
                if let Err(e) = file.write_js_at(&block, offset) {
                    break Err(e.into());
                }
                self.hasher.hash(buffer, length)?;
                offset += u64::from(length);
                self.record.files[index].done = offset;
            } else {
                self.hasher.give_back(buffer);
            }
            // A checkpoint is asked for once the bytes it will cover are flushed; the download goes on
            // while the hash worker catches up, and the record is saved when the answer comes.
            if offset - asked_at >= CHECKPOINT_BYTES && !self.hasher.checkpoint_asked() {
                if let Err(e) = file.flush() {
                    break Err(e.into());
                }
                self.hasher.ask_checkpoint()?;
                asked_at = offset;
            }
            if let Some(checkpoint) = self.hasher.take_checkpoint()? {
                if let Err(e) = self.save_checkpoint(index, checkpoint).await {
                    break Err(e);
                }
            }
            self.report.maybe(&self.record);
            if !more {
                if offset == size {
                    break Ok(());
                }
                // A 206 of part of the range asked for came whole: the rest is asked for from there.
                if ends_early == Some(offset) {
                    match continue_from(url, &path, size, offset).await {
                        Ok((next_reader, next_watch, next_end)) => {
                            (reader, watch, ends_early) = (next_reader, next_watch, next_end);
                            continue;
                        }
                        Err(e) => break Err(e),
                    }
                }
                // Any other body that ends cleanly is the server's whole answer: asking again gets the same.
                break Err(DownloadError::TooShort { url: url.to_owned(), path: path.clone(), offset, size });
            }
        };
        if result.is_err() {
            reader.cancel();
            // The checkpoint asked for before the failure covers bytes already on disk: keep them if
            // it can be saved (the failure is what gets reported either way).
            if self.hasher.checkpoint_asked() {
                if let Ok(checkpoint) = self.hasher.wait_checkpoint().await {
                    self.save_checkpoint(index, checkpoint)
                        .await
                        .warn_on_error("saving the checkpoint before the failure");
                }
            }
        }
        result
    }

    /// Where the response to a request from `start` writes file `index`: `start`, or 0 where a server
    /// answered a range with the whole file (the record says so before the file is cut, so it never
    /// describes bytes the file does not hold); a 206 of another range is refused.
    async fn resumed_at(
        &mut self,
        response: &web_sys::Response,
        file: &SyncFile,
        url: &str,
        start: u64,
        index: usize,
    ) -> Result<u64, DownloadError> {
        if start == 0 {
            return Ok(0);
        }
        let range = response.headers().get("content-range").ok().flatten();
        if response.status() == 206 && !range.as_deref().is_some_and(|r| hub::range_matches(r, start)) {
            return Err(DownloadError::RangeMismatch { url: url.to_owned(), start });
        }
        if response.status() == 206 {
            return Ok(start);
        }
        self.record.files[index].restart();
        self.save().await?;
        self.hasher.reset(None).await?;
        file.truncate(0)?;
        Ok(0)
    }

    /// Saves the record with file `index` done up to `checkpoint`.
    pub(super) async fn save_checkpoint(
        &mut self,
        index: usize,
        checkpoint: HashCheckpoint,
    ) -> Result<(), DownloadError> {
        let entry = &mut self.record.files[index];
        let done = entry.done;
        entry.save(checkpoint);
        let saved = self.save().await;
        self.record.files[index].done = done;
        saved
    }
}

/// The next request of a file whose last response was a 206 that stopped at `offset`, before its end:
/// the body from `offset` on, its watch, and where its own range stops early. Only a 206 from `offset`
/// is taken; anything else fails (transiently), and the file goes on from its last checkpoint.
pub(super) async fn continue_from(
    url: &str,
    path: &str,
    size: u64,
    offset: u64,
) -> Result<(BodyReader, hub_client::IdleWatch, Option<u64>), DownloadError> {
    let (response, watch) = hub_client::fetch(url, Some(offset)).await?;
    check_status(&response, url)?;
    check_length(&response, url, path, size)?;
    let range = response.headers().get("content-range").ok().flatten();
    if response.status() != 206 || !range.as_deref().is_some_and(|r| hub::range_matches(r, offset)) {
        watch.abort();
        return Err(DownloadError::RangeMismatch { url: url.to_owned(), start: offset });
    }
    let ends_early = range_ends_early(&response, size);
    let body = response.body().ok_or_else(|| DownloadError::NoBody { url: url.to_owned() })?;
    Ok((BodyReader::new(body), watch, ends_early))
}

/// Where a 206 response's range stops, when that is before the end of the file (see
/// [`hub::range_ends_early`]).
pub(super) fn range_ends_early(response: &web_sys::Response, size: u64) -> Option<u64> {
    if response.status() != 206 {
        return None;
    }
    let range = response.headers().get("content-range").ok().flatten()?;
    hub::range_ends_early(&range, size)
}

/// The offset of the last checkpoint saved for a file.
pub(super) fn saved_offset(entry: &hub::FileRecord) -> u64 {
    entry.hash.as_ref().map_or(0, |c| c.offset)
}

/// Refuses a response whose headers announce another length for the file than the listing's `size`
/// (the total of a `Content-Range`, or the `Content-Length` of a whole, unencoded body): retrying does
/// not change what a server stores.
pub(super) fn check_length(
    response: &web_sys::Response,
    url: &str,
    path: &str,
    size: u64,
) -> Result<(), DownloadError> {
    let headers = response.headers();
    let header = |name: &str| headers.get(name).ok().flatten();
    let announced = match (response.status(), header("content-range"), header("content-encoding")) {
        (206, Some(range), _) => hub::parse_content_range(&range).ok().and_then(|(_, _, total)| total),
        (200, _, None) => header("content-length").and_then(|n| n.trim().parse::<u64>().ok()),
        _ => None,
    };
    match announced {
        Some(total) if total != size => {
            Err(DownloadError::OtherLength { url: url.to_owned(), path: path.to_owned(), total, size })
        }
        _ => Ok(()),
    }
}

/// Feeds the first `size` bytes of `file`, as they are on disk, to `consume`, a block at a time.
pub(super) fn read_on_disk(
    file: &SyncFile,
    size: u64,
    mut consume: impl FnMut(&[u8]),
) -> Result<(), OpfsError> {
    let mut buffer = vec![0; WRITE_BYTES];
    let mut offset = 0;
    while offset < size {
        let want = (size - offset).min(WRITE_BYTES as u64) as usize;
        let read = file.read_at(&mut buffer[..want], offset)?;
        if read == 0 {
            break;
        }
        consume(&buffer[..read]);
        offset += read as u64;
    }
    Ok(())
}

/// Reads a response body into the buffers it is given, a block at a time. Where the body is a byte
/// stream (Chromium's fetch bodies are) the bytes land in the buffer itself ("bring your own buffer"),
/// so a multi-GB download allocates nothing per chunk and copies nothing in this worker.
pub(super) enum BodyReader {
    Byob(ReadableStreamByobReader),
    Chunks { reader: ReadableStreamDefaultReader, carry: Option<Uint8Array> },
}

impl BodyReader {
    pub(super) fn new(body: web_sys::ReadableStream) -> Self {
        match ReadableStreamByobReader::new(&body) {
            Ok(reader) => BodyReader::Byob(reader),
            Err(_) => BodyReader::Chunks { reader: body.get_reader().unchecked_into(), carry: None },
        }
    }

    /// Fills `buffer` with the next bytes: `(buffer, bytes in it, whether more follow)`. The buffer
    /// comes back as a new object (reading transfers it), full unless the body ended. Each read that
    /// brings something tells `watch`, which ends the request when none does for the idle timeout.
    pub(super) async fn fill(
        &mut self,
        mut buffer: ArrayBuffer,
        watch: &hub_client::IdleWatch,
    ) -> Result<(ArrayBuffer, u32, bool), JsValue> {
        // Only the wait for the server counts as silence, not the time spent writing and hashing.
        watch.touch();
        let capacity = buffer.byte_length();
        let mut filled = 0u32;
        match self {
            BodyReader::Byob(reader) => loop {
                let view = Uint8Array::new_with_byte_offset_and_length(&buffer, filled, capacity - filled);
                let result = JsFuture::from(reader.read_with_array_buffer_view(&view)).await?;
                watch.touch();
                if let Some(value) = get(&result, "value").dyn_ref::<Uint8Array>() {
                    buffer = value.buffer();
                    filled += value.length();
                }
                if get(&result, "done").as_bool().unwrap_or(true) {
                    return Ok((buffer, filled, false));
                }
                if filled == capacity {
                    return Ok((buffer, filled, true));
                }
            },
            BodyReader::Chunks { reader, carry } => {
                let target = Uint8Array::new(&buffer);
                while filled < capacity {
                    let chunk = match carry.take() {
                        Some(chunk) => chunk,
                        None => {
                            let result = JsFuture::from(reader.read()).await?;
                            watch.touch();
                            if get(&result, "done").as_bool().unwrap_or(true) {
                                return Ok((buffer, filled, false));
                            }
                            get(&result, "value").unchecked_into()
                        }
                    };
                    let take = chunk.length().min(capacity - filled);
                    target.set(&chunk.subarray(0, take), filled);
                    filled += take;
                    if take < chunk.length() {
                        *carry = Some(chunk.subarray(take, chunk.length()));
                    }
                }
                Ok((buffer, filled, true))
            }
        }
    }

    pub(super) fn cancel(&self) {
        let _ = match self {
            BodyReader::Byob(reader) => reader.cancel(),
            BodyReader::Chunks { reader, .. } => reader.cancel(),
        };
    }
}

//! The download's record (alternately in two OPFS slots), its progress reports, and the swap that
//! puts a verified pack in place.

use super::*;

/// The download record in OPFS, saved alternately to two slots.
pub(super) struct RecordStore {
    pub(super) record: Option<DownloadRecord>,
    pub(super) sequence: u64,
    pub(super) slots: Option<[SyncFile; 2]>,
}

impl RecordStore {
    pub(super) async fn load(staging: Slot) -> RecordStore {
        let mut best: Option<StoredRecord> = None;
        if let Ok(dir) = opfs::slot_dir(staging, false).await {
            for slot in RECORD_SLOTS {
                let stored = opfs::read(&dir, slot)
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<StoredRecord>(&b).ok());
                if let Some(stored) = stored {
                    if best.as_ref().is_none_or(|b| stored.sequence > b.sequence) {
                        best = Some(stored);
                    }
                }
            }
        }
        let sequence = best.as_ref().map_or(0, |b| b.sequence);
        RecordStore { record: best.map(|b| b.record), sequence, slots: None }
    }

    /// The graphs and manifests an earlier attempt already verified.
    pub(super) async fn kept_small_files(&self, staging: Slot) -> KeptFiles {
        let mut kept = KeptFiles::default();
        let (Some(record), Ok(dir)) = (&self.record, opfs::slot_dir(staging, false).await) else {
            return kept;
        };
        kept.commit = record.commit.clone();
        for file in record.files.iter().filter(|f| f.verified && f.file.size < CHECKPOINT_BYTES) {
            if let Ok(bytes) = opfs::read(&dir, &file.file.path).await {
                kept.files.insert(file.file.path.clone(), bytes);
            }
        }
        kept
    }

    pub(super) async fn save(
        &mut self,
        dir: &FileSystemDirectoryHandle,
        record: &DownloadRecord,
    ) -> Result<(), OpfsError> {
        self.sequence += 1;
        let stored = StoredRecord { sequence: self.sequence, record: record.clone() };
        let slot = (self.sequence % 2) as usize;
        let bytes = opfs::json_bytes(&stored, RECORD_SLOTS[slot])?;
        let slots = match &mut self.slots {
            Some(slots) => slots,
            // Kept open for the whole download: a save is then three synchronous calls.
            none => {
                let [a, b] = RECORD_SLOTS;
                none.insert([SyncFile::open(dir, a).await?, SyncFile::open(dir, b).await?])
            }
        };
        let file = &slots[slot];
        file.truncate(0)?;
        file.write_at(&bytes, 0)?;
        file.flush()
    }
}

/// Installs the verified pack of the `staging` slot in one write of the pack state, then empties the
/// previous pack's slot for the next download (see [`imagine_core::storage`]). Every step may be
/// interrupted and repeated: until the state is written the old pack is installed and this download
/// resumes to here; after it, the new pack is installed and a resumed download finds it so.
pub(super) async fn swap(
    staging: Slot,
    record: &DownloadRecord,
    conversion: Option<ConversionRecord>,
    block32: Option<ReblockedRecord>,
) -> Result<PackRecord, DownloadError> {
    let files = record.files.iter().map(|f| f.file.clone()).collect();
    let mut installed = PackRecord::new(record.source.clone(), record.commit.clone(), files);
    installed.conversion = conversion;
    installed.block32 = block32;
    opfs::failpoint("swap:before-state").await;
    // One writer of the pack state at a time: a store of re-blocked forms or a deletion that read the
    // state before this write could otherwise write back what it read.
    let lock = opfs::lock_pack_state().await;
    let state = opfs::pack_state().await?;
    if state.staging != staging {
        return Err(DownloadError::StorageChanged);
    }
    let swapped = state.swapped(installed.clone());
    opfs::write_pack_state(&swapped).await?;
    drop(lock);
    opfs::failpoint("swap:after-state").await;
    opfs::clear_slot(swapped.staging).await?;
    let dir = opfs::slot_dir(staging, false).await?;
    for name in RECORD_SLOTS.into_iter().chain([CONVERSION_STATE_FILE]) {
        opfs::remove(&dir, name).await?;
    }
    Ok(installed)
}

/// Posts progress to the offscreen document, at most every [`REPORT_EVERY_MS`].
pub(super) struct Reporter {
    pub(super) state: DownloadState,
    pub(super) rate: RateMeter,
    pub(super) last_ms: f64,
}

impl Reporter {
    pub(super) fn new() -> Self {
        Reporter { state: DownloadState::Checking, rate: RateMeter::new(), last_ms: f64::NEG_INFINITY }
    }

    pub(super) fn post(progress: DownloadProgress) {
        send(&DownloadReport::Progress { progress });
    }

    /// Reports now.
    pub(super) fn record(&mut self, record: &DownloadRecord) {
        self.last_ms = now_ms();
        self.rate.push(self.last_ms, record.done_bytes());
        Self::post(record.to_progress(self.state, &self.rate, None));
    }

    /// Reports the conversion's progress, at most every [`REPORT_EVERY_MS`] until it is done.
    pub(super) fn converting(&mut self, source: &PackSource, commit: &str, p: &ConvertProgress) {
        let first = self.state != DownloadState::Converting;
        self.state = DownloadState::Converting;
        if !first && now_ms() - self.last_ms < REPORT_EVERY_MS && p.done_bytes < p.total_bytes {
            return;
        }
        self.last_ms = now_ms();
        Self::post(DownloadProgress {
            state: DownloadState::Converting,
            source: source.clone(),
            commit: Some(commit.to_owned()),
            total_bytes: p.total_bytes,
            done_bytes: p.done_bytes,
            files: p.files.clone(),
            bytes_per_second: 0.0,
            seconds_left: None,
            error: None,
            message: None,
        });
    }

    /// Reports if the last report is old enough.
    pub(super) fn maybe(&mut self, record: &DownloadRecord) {
        if now_ms() - self.last_ms >= REPORT_EVERY_MS {
            self.record(record);
        }
    }
}

pub(super) fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

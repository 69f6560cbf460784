//! The gallery: every finished image, kept on this machine with the parameters that made it.
//!
//! ```text
//! gallery/<id>.png    the image (its text chunks carry prompt, seed, size, steps, schedule)
//! gallery/index.json  a GalleryIndex: the items (oldest first) and the user's limit, written whole
//! exports/gallery.zip the last export (every PNG plus gallery.json), replaced by the next one
//! ```
//!
//! The id is the job's id, so a job's image and its gallery entry are the same file. The service
//! worker writes the PNG first and the index after it, and removes an item from the index before its
//! PNG, so the index never names a PNG that is not there (a PNG the index does not name is picked up
//! by the next rebuild). An index that is missing or unreadable is rebuilt from the PNGs' text chunks
//! ([`GalleryIndex::rebuild`]).
//!
//! Limits ([`GalleryLimit`]): a cap on the number of images and on their bytes; when either is
//! exceeded the oldest images go first, never one that a page is showing ([`viewed_ids`]) and never
//! the newest or an image of its batch ([`batch_of`]).

use std::io::Write;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::Timings;
use crate::image::ImageParams;
use crate::message::{arg, quoted, Localize, Message};

/// The gallery's directory at the OPFS root.
pub const GALLERY_DIR: &str = "gallery";
/// The index in [`GALLERY_DIR`].
pub const INDEX_FILE: &str = "index.json";
/// The directory of the export at the OPFS root.
pub const EXPORT_DIR: &str = "exports";
/// The export's file in [`EXPORT_DIR`].
pub const EXPORT_FILE: &str = "gallery.zip";
/// The parameters of every image, in the export.
pub const EXPORT_INDEX: &str = "gallery.json";
/// The most items one `galleryList` returns.
pub const MAX_PAGE: u32 = 500;
/// Items per `galleryList` when the request does not say.
pub const DEFAULT_PAGE: u32 = 60;
/// What a `galleryLimit` may set.
pub const MAX_ITEMS_RANGE: (u32, u32) = (1, 10_000);
/// Bytes: 1 MB to 64 GB, decimal, as every size the pages show (the options page takes it in MB).
pub const MAX_BYTES_RANGE: (u64, u64) = (1_000_000, 64_000_000_000);

/// Why a gallery request was refused, or the index could not be read.
#[derive(Debug, Error, PartialEq)]
pub enum GalleryError {
    #[error("gallery id {0:?} is not allowed: ids are 1 to 64 letters, digits, '-' or '_'")]
    BadId(String),
    #[error("there is no image {0:?} in the gallery")]
    NotFound(String),
    #[error("{field} {value} is not allowed: use {min} to {max}")]
    OutOfRange { field: &'static str, value: i64, min: u64, max: u64 },
    #[error("the gallery index is unreadable: {0}")]
    Corrupt(String),
    #[error("the export could not be written: {0}")]
    Export(String),
}

/// One image of the gallery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GalleryItem {
    /// The job id; the file is `<id>.png`.
    pub id: String,
    /// What made it (in the JSON, its keys among these).
    #[serde(flatten)]
    pub image: ImageParams,
    /// Milliseconds since the Unix epoch.
    pub created: f64,
    /// Size of the PNG.
    pub bytes: u64,
    /// Where the time went (absent for an item rebuilt from its PNG).
    #[serde(default)]
    pub timings: Option<Timings>,
    /// The commit of the pack that made it (absent for an item rebuilt from its PNG).
    #[serde(default)]
    pub pack_commit: Option<String>,
}

/// The caps the user sets; the oldest images are dropped past either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GalleryLimit {
    pub max_items: u32,
    pub max_bytes: u64,
}

impl Default for GalleryLimit {
    fn default() -> Self {
        GalleryLimit { max_items: 500, max_bytes: 2_000_000_000 }
    }
}

impl GalleryLimit {
    /// `self` with the fields a request gives, checked.
    pub fn with(self, max_items: Option<i64>, max_bytes: Option<i64>) -> Result<GalleryLimit, GalleryError> {
        let mut limit = self;
        if let Some(value) = max_items {
            let (min, max) = MAX_ITEMS_RANGE;
            limit.max_items = u32::try_from(value).ok().filter(|v| (min..=max).contains(v)).ok_or(
                GalleryError::OutOfRange { field: "maxItems", value, min: min.into(), max: max.into() },
            )?;
        }
        if let Some(value) = max_bytes {
            let (min, max) = MAX_BYTES_RANGE;
            limit.max_bytes = u64::try_from(value)
                .ok()
                .filter(|v| (min..=max).contains(v))
                .ok_or(GalleryError::OutOfRange { field: "maxBytes", value, min, max })?;
        }
        Ok(limit)
    }
}

/// Checks an id before it becomes a file name.
pub fn validate_id(id: &str) -> Result<&str, GalleryError> {
    let ok = (1..=64).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(id)
    } else {
        Err(GalleryError::BadId(id.to_owned()))
    }
}

/// The id of image `index` of a job's batch: the job's id for the first (or only) one.
pub fn image_id(job: &str, index: u32) -> String {
    match index {
        0 => job.to_owned(),
        _ => format!("{job}-{index}"),
    }
}

/// The job whose batch image `id` is, as [`image_id`] made it: `id` without a `-<index>` ending.
pub fn batch_of(id: &str) -> &str {
    match id.rsplit_once('-') {
        Some((job, index)) if !job.is_empty() && index.parse::<u32>().is_ok_and(|i| i > 0) => job,
        _ => id,
    }
}

/// The PNG's file name in [`GALLERY_DIR`].
pub fn image_file(id: &str) -> String {
    format!("{id}.png")
}

/// The id of a file in [`GALLERY_DIR`], if it is an image's.
pub fn id_of_file(name: &str) -> Option<&str> {
    name.strip_suffix(".png").and_then(|id| validate_id(id).ok())
}

/// The images pages are showing, from the URLs of the extension's open pages: a page shows image `x`
/// when its query has `view=x` (the gallery's large view) or `job=x` (the result page).
pub fn viewed_ids<'a>(urls: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut ids = Vec::new();
    for url in urls {
        let url = url.split('#').next().unwrap_or_default();
        let Some((_, query)) = url.split_once('?') else { continue };
        for pair in query.split('&') {
            if let Some(("view" | "job", id)) = pair.split_once('=') {
                if validate_id(id).is_ok() && !ids.iter().any(|i| i == id) {
                    ids.push(id.to_owned());
                }
            }
        }
    }
    ids
}

/// A `galleryList` query, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListQuery {
    /// Case-insensitive substring of the prompt; empty matches all.
    pub text: String,
    pub offset: u32,
    pub limit: u32,
}

impl ListQuery {
    /// From the request's fields.
    pub fn new(
        text: Option<String>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> Result<ListQuery, GalleryError> {
        let offset = match offset {
            None => 0,
            Some(v) => u32::try_from(v).map_err(|_| GalleryError::OutOfRange {
                field: "offset",
                value: v,
                min: 0,
                max: u32::MAX.into(),
            })?,
        };
        let limit = match limit {
            None => DEFAULT_PAGE,
            Some(v) => u32::try_from(v)
                .ok()
                .filter(|l| (1..=MAX_PAGE).contains(l))
                .ok_or(GalleryError::OutOfRange { field: "limit", value: v, min: 1, max: MAX_PAGE.into() })?,
        };
        Ok(ListQuery { text: text.unwrap_or_default().trim().to_owned(), offset, limit })
    }
}

/// The index file: every item, oldest first, and the limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GalleryIndex {
    pub version: u32,
    #[serde(default)]
    pub limit: GalleryLimit,
    pub items: Vec<GalleryItem>,
}

/// What a rebuild could not use.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub file: String,
    pub reason: String,
}

/// How much of the start of a PNG a rebuild reads: its text chunks come before the image data (as
/// [`crate::image::encode_png`] writes them), and a prompt of 20,000 characters takes at most 80 KB.
pub const PNG_HEAD_BYTES: u64 = 256 << 10;

/// A PNG found in [`GALLERY_DIR`] during a rebuild: what its start says, not its bytes, so a rebuild
/// holds one file's head at a time however large the gallery.
#[derive(Debug, Clone)]
pub struct FoundImage {
    pub file: String,
    /// The file's size.
    pub bytes: u64,
    /// The file's last change (ms since the epoch): the image's time when the index is lost.
    pub modified: f64,
    /// Its parameters, or why it is not an image of ours.
    pub meta: Result<ImageParams, String>,
}

impl FoundImage {
    /// The file `file` of `bytes` bytes, from its first [`PNG_HEAD_BYTES`] (`head`, fewer when the file
    /// is shorter).
    pub fn read(file: String, head: &[u8], bytes: u64, modified: f64) -> FoundImage {
        FoundImage { file, bytes, modified, meta: crate::image::read_png_meta(head) }
    }
}

impl GalleryIndex {
    /// The current format.
    pub const VERSION: u32 = 1;

    /// Reads an index file.
    pub fn parse(bytes: &[u8]) -> Result<GalleryIndex, GalleryError> {
        let index: GalleryIndex =
            serde_json::from_slice(bytes).map_err(|e| GalleryError::Corrupt(e.to_string()))?;
        if index.version != Self::VERSION {
            return Err(GalleryError::Corrupt(format!(
                "version {} (this version reads {})",
                index.version,
                Self::VERSION
            )));
        }
        Ok(index)
    }

    /// The index file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&GalleryIndex { version: Self::VERSION, ..self.clone() })
            .expect("the index serializes")
    }

    /// An index of the images found, with `limit`: each PNG's parameters from its text chunks; files
    /// that are not Imagine's PNGs are skipped, with the reason.
    pub fn rebuild(found: Vec<FoundImage>, limit: GalleryLimit) -> (GalleryIndex, Vec<Skipped>) {
        let mut items = Vec::new();
        let mut skipped = Vec::new();
        for image in found {
            let Some(id) = id_of_file(&image.file) else {
                skipped.push(Skipped { file: image.file, reason: "not an image's file name".into() });
                continue;
            };
            match image.meta {
                Ok(meta) => items.push(GalleryItem {
                    id: id.to_owned(),
                    image: meta,
                    created: image.modified,
                    bytes: image.bytes,
                    timings: None,
                    pack_commit: None,
                }),
                Err(reason) => skipped.push(Skipped { file: image.file, reason }),
            }
        }
        items.sort_by(|a, b| a.created.total_cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
        (GalleryIndex { version: Self::VERSION, limit, items }, skipped)
    }

    /// Adds an item as the newest (replacing one with the same id).
    pub fn add(&mut self, item: GalleryItem) {
        self.items.retain(|i| i.id != item.id);
        self.items.push(item);
    }

    /// Removes an item.
    pub fn remove(&mut self, id: &str) -> Option<GalleryItem> {
        let at = self.items.iter().position(|i| i.id == id)?;
        Some(self.items.remove(at))
    }

    /// An item by id.
    pub fn get(&self, id: &str) -> Result<&GalleryItem, GalleryError> {
        self.items.iter().find(|i| i.id == id).ok_or_else(|| GalleryError::NotFound(id.to_owned()))
    }

    /// Bytes of all PNGs.
    pub fn bytes_used(&self) -> u64 {
        self.items.iter().map(|i| i.bytes).sum()
    }

    /// The items matching `query`, newest first, one page of them; and how many match.
    pub fn list(&self, query: &ListQuery) -> (Vec<GalleryItem>, u32) {
        let needle = query.text.to_lowercase();
        let matching: Vec<&GalleryItem> = self
            .items
            .iter()
            .rev()
            .filter(|i| needle.is_empty() || i.image.prompt.to_lowercase().contains(&needle))
            .collect();
        let page =
            matching.iter().skip(query.offset as usize).take(query.limit as usize).map(|i| (*i).clone());
        (page.collect(), matching.len() as u32)
    }

    /// Drops the oldest items until the limit holds, skipping those in `keep` and the newest item's
    /// batch (the newest and the images of its job before it: a batch's images are still the job's
    /// results, read from here); returns what was dropped (whose PNGs the caller removes).
    pub fn evict(&mut self, keep: &[String]) -> Vec<GalleryItem> {
        let limit = self.limit;
        let mut count = self.items.len() as u64;
        let mut bytes = self.bytes_used();
        let newest_batch = self.items.last().map(|i| batch_of(&i.id).to_owned());
        let mut dropped = Vec::new();
        let mut kept = Vec::with_capacity(self.items.len());
        for item in std::mem::take(&mut self.items) {
            let over = count > u64::from(limit.max_items) || bytes > limit.max_bytes;
            let protected = keep.contains(&item.id) || newest_batch.as_deref() == Some(batch_of(&item.id));
            if over && !protected {
                count -= 1;
                bytes -= item.bytes;
                dropped.push(item);
            } else {
                kept.push(item);
            }
        }
        self.items = kept;
        dropped
    }
}

/// The export: a zip of every image's PNG and [`EXPORT_INDEX`] (the items' parameters), made a piece at
/// a time so that a gallery at its limit (gigabytes) is never in memory whole: [`ExportZip::add`] takes
/// one PNG and gives back the bytes to append to the file, [`ExportZip::finish`] the last ones. The zip
/// is written front to back, never patched: each entry's sizes and CRC follow its data (a data
/// descriptor). PNGs are stored, not deflated: they are compressed already.
pub struct ExportZip {
    zip: zip::ZipWriter<zip::write::StreamWriter<Pending>>,
    pending: Pending,
    items: Vec<GalleryItem>,
}

/// What the zip writer wrote since the last piece was taken.
#[derive(Clone, Default)]
struct Pending(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl Write for Pending {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Pending {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.borrow_mut())
    }
}

impl Default for ExportZip {
    fn default() -> Self {
        Self::new()
    }
}

impl ExportZip {
    pub fn new() -> ExportZip {
        let pending = Pending::default();
        ExportZip { zip: zip::ZipWriter::new_stream(pending.clone()), pending, items: Vec::new() }
    }

    fn options(created: f64) -> zip::write::SimpleFileOptions {
        zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip_time(created))
    }

    /// Adds `item`'s PNG; the bytes to append to the file now (about the PNG's size).
    pub fn add(&mut self, item: &GalleryItem, png: &[u8]) -> Result<Vec<u8>, GalleryError> {
        self.zip.start_file(export_name(item), Self::options(item.created)).map_err(export_error)?;
        self.zip.write_all(png).map_err(|e| GalleryError::Export(e.to_string()))?;
        self.items.push(item.clone());
        Ok(self.pending.take())
    }

    /// Adds [`EXPORT_INDEX`] and the zip's directory: the last bytes to append.
    pub fn finish(mut self) -> Result<Vec<u8>, GalleryError> {
        let newest = self.items.iter().map(|i| i.created).fold(0.0, f64::max);
        self.zip.start_file(EXPORT_INDEX, Self::options(newest)).map_err(export_error)?;
        let json = serde_json::to_vec_pretty(&self.items).expect("items serialize");
        self.zip.write_all(&json).map_err(|e| GalleryError::Export(e.to_string()))?;
        self.zip.finish().map_err(export_error)?;
        Ok(self.pending.take())
    }
}

fn export_error(e: zip::result::ZipError) -> GalleryError {
    GalleryError::Export(e.to_string())
}

/// An image's name in the export.
pub fn export_name(item: &GalleryItem) -> String {
    image_file(&item.id)
}

/// Milliseconds since the epoch as a zip (MS-DOS, UTC) time; 1980-01-01 for anything earlier.
fn zip_time(ms: f64) -> zip::DateTime {
    let secs = (ms / 1000.0).max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    zip::DateTime::from_date_and_time(year as u16, month as u8, day as u8, h as u8, m as u8, s as u8)
        .unwrap_or_default()
}

impl Localize for GalleryError {
    fn message(&self) -> Message {
        match self {
            GalleryError::BadId(id) => Message::new("errGalleryBadId", [quoted(id)]),
            GalleryError::NotFound(id) => Message::new("errGalleryNotFound", [quoted(id)]),
            GalleryError::OutOfRange { field, value, min, max } => {
                Message::new("errGalleryOutOfRange", [arg(field), arg(value), arg(min), arg(max)])
            }
            GalleryError::Corrupt(detail) => Message::new("errGalleryCorrupt", [arg(detail)]),
            GalleryError::Export(detail) => Message::new("errGalleryExport", [arg(detail)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::image::encode_png;

    fn item(id: &str, prompt: &str, created: f64, bytes: u64) -> GalleryItem {
        GalleryItem {
            id: id.into(),
            image: ImageParams {
                prompt: prompt.into(),
                seed: 1,
                width: 256,
                height: 256,
                steps: 4,
                schedule: "empirical".into(),
            },
            created,
            bytes,
            timings: None,
            pack_commit: Some("abc".into()),
        }
    }

    fn index(items: Vec<GalleryItem>, limit: GalleryLimit) -> GalleryIndex {
        GalleryIndex { version: GalleryIndex::VERSION, limit, items }
    }

    fn ids(items: &[GalleryItem]) -> Vec<&str> {
        items.iter().map(|i| i.id.as_str()).collect()
    }

    #[test]
    fn lists_newest_first_with_a_case_insensitive_prompt_search_and_pages() {
        let g = index(
            vec![
                item("a", "A Red Fox", 1.0, 10),
                item("b", "blue sky", 2.0, 10),
                item("c", "red ÄPFEL", 3.0, 10),
            ],
            GalleryLimit::default(),
        );
        let all = ListQuery::new(None, None, None).unwrap();
        assert_eq!(ids(&g.list(&all).0), ["c", "b", "a"]);
        let red = ListQuery::new(Some(" RED ".into()), None, None).unwrap();
        let (items, total) = g.list(&red);
        assert_eq!((ids(&items), total), (vec!["c", "a"], 2));
        let umlaut = ListQuery::new(Some("äpfel".into()), None, None).unwrap();
        assert_eq!(ids(&g.list(&umlaut).0), ["c"]);
        let page = ListQuery::new(None, Some(1), Some(1)).unwrap();
        assert_eq!((ids(&g.list(&page).0), g.list(&page).1), (vec!["b"], 3));
    }

    #[test]
    fn bad_queries_and_limits_name_the_field_and_what_is_allowed() {
        let e = ListQuery::new(None, None, Some(0)).unwrap_err();
        assert_eq!(e.to_string(), "limit 0 is not allowed: use 1 to 500");
        assert!(ListQuery::new(None, Some(-1), None).unwrap_err().to_string().starts_with("offset -1"));
        let e = GalleryLimit::default().with(Some(0), None).unwrap_err();
        assert_eq!(e.to_string(), "maxItems 0 is not allowed: use 1 to 10000");
        let e = GalleryLimit::default().with(None, Some(5)).unwrap_err();
        assert_eq!(e.to_string(), "maxBytes 5 is not allowed: use 1000000 to 64000000000");
        let limit = GalleryLimit::default().with(Some(3), None).unwrap();
        assert_eq!(limit, GalleryLimit { max_items: 3, max_bytes: GalleryLimit::default().max_bytes });
        assert!(validate_id("../x").is_err());
        assert!(validate_id("").is_err());
        assert_eq!(validate_id("0123abcd"), Ok("0123abcd"));
    }

    #[test]
    fn eviction_drops_the_oldest_first_but_never_a_viewed_one_or_the_newest() {
        let items = || (0..5).map(|n| item(&format!("i{n}"), "p", n as f64, 100)).collect::<Vec<_>>();
        let mut g = index(items(), GalleryLimit { max_items: 3, max_bytes: 1 << 30 });
        assert_eq!(ids(&g.evict(&[])), ["i0", "i1"]);
        assert_eq!(ids(&g.items), ["i2", "i3", "i4"]);

        let mut g = index(items(), GalleryLimit { max_items: 3, max_bytes: 1 << 30 });
        assert_eq!(ids(&g.evict(&["i0".into()])), ["i1", "i2"]);
        assert_eq!(ids(&g.items), ["i0", "i3", "i4"]);

        // By bytes: 250 allows two of 100.
        let mut g = index(items(), GalleryLimit { max_items: 100, max_bytes: 250 });
        assert_eq!(ids(&g.evict(&[])), ["i0", "i1", "i2"]);

        // A cap of one with the newest viewed elsewhere: the newest stays anyway.
        let mut g = index(items(), GalleryLimit { max_items: 1, max_bytes: 1 << 30 });
        g.evict(&["i1".into()]);
        assert_eq!(ids(&g.items), ["i1", "i4"]);
    }

    #[test]
    fn a_batch_never_evicts_its_own_images() {
        // Two older images, then a batch of three (ids as image_id makes them) at a cap of one.
        let mut g = index(
            vec![item("old0", "p", 0.0, 100), item("old1", "p", 1.0, 100)],
            GalleryLimit { max_items: 1, max_bytes: 1 << 30 },
        );
        for n in 0..3 {
            g.add(item(&image_id("0123abcd", n), "p", 2.0 + f64::from(n), 100));
            g.evict(&[]);
        }
        assert_eq!(ids(&g.items), ["0123abcd", "0123abcd-1", "0123abcd-2"]);
        // The next job's image is what lets the batch go, oldest first.
        g.add(item("4567cdef", "p", 9.0, 100));
        assert_eq!(ids(&g.evict(&[])), ["0123abcd", "0123abcd-1", "0123abcd-2"]);
        // Another job whose id merely starts alike is not of the batch.
        assert_eq!(batch_of("0123abcd-2"), "0123abcd");
        assert_eq!(batch_of("0123abcd"), "0123abcd");
        assert_eq!(batch_of("0123abcd-x"), "0123abcd-x");
        assert_eq!(batch_of("0123abcd-0"), "0123abcd-0");
        assert_eq!(batch_of("-1"), "-1");
    }

    #[test]
    fn viewed_ids_come_from_view_and_job_in_page_urls() {
        let urls = [
            "chrome-extension://x/gallery.html?view=abc#top",
            "chrome-extension://x/result.html?job=0123&other=1",
            "chrome-extension://x/popup.html",
            "chrome-extension://x/gallery.html?view=../etc",
        ];
        assert_eq!(viewed_ids(urls), ["abc", "0123"]);
    }

    fn png(prompt: &str, seed: u64) -> Vec<u8> {
        let meta = ImageParams {
            prompt: prompt.into(),
            seed,
            width: 2,
            height: 1,
            steps: 3,
            schedule: "linear-shift".into(),
        };
        encode_png(&[0; 8], 2, 1, &meta).unwrap()
    }

    /// One sequence on purpose: the PNGs found, the index rebuilt from them, then each field of each
    /// item checked in turn (long, but each step reads the one before).
    #[test]
    fn a_lost_index_is_rebuilt_from_the_pngs_text_chunks() {
        assert!(matches!(GalleryIndex::parse(b"{not json"), Err(GalleryError::Corrupt(_))));
        let found = |file: &str, bytes: &[u8], modified| {
            FoundImage::read(file.into(), bytes, bytes.len() as u64, modified)
        };
        let found = vec![
            found("b.png", &png("second «ü»", 7), 20.0),
            found("a.png", &png("first", u64::MAX), 10.0),
            found("junk.png", b"not a png", 5.0),
            found("index.json.tmp", &[], 5.0),
        ];
        let (g, skipped) = GalleryIndex::rebuild(found, GalleryLimit::default());
        assert_eq!(ids(&g.items), ["a", "b"]);
        let b = g.get("b").unwrap();
        assert_eq!(
            (b.image.prompt.as_str(), b.image.seed, b.image.width, b.image.height, b.image.steps),
            ("second «ü»", 7, 2, 1, 3)
        );
        assert_eq!(b.image.schedule, "linear-shift");
        assert_eq!(g.get("a").unwrap().image.seed, u64::MAX);
        assert_eq!(
            skipped.iter().map(|s| s.file.as_str()).collect::<Vec<_>>(),
            ["junk.png", "index.json.tmp"]
        );
        assert_eq!(GalleryIndex::parse(&g.to_bytes()).unwrap(), g);
    }

    #[test]
    fn a_rebuild_needs_only_the_head_of_each_png() {
        // A large image (noise does not compress) with the longest prompt there may be, in characters
        // of four bytes.
        let (width, height) = (512, 512);
        let mut state = 1u32;
        let rgba: Vec<u8> = (0..width * height * 4)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        let prompt = "𝄞".repeat(20_000);
        let meta = ImageParams {
            prompt: prompt.clone(),
            seed: 5,
            width,
            height,
            steps: 4,
            schedule: "empirical".into(),
        };
        let png = encode_png(&rgba, width, height, &meta).unwrap();
        assert!(png.len() as u64 > 2 * PNG_HEAD_BYTES, "{}", png.len());
        let head = &png[..PNG_HEAD_BYTES as usize];
        let (g, skipped) = GalleryIndex::rebuild(
            vec![FoundImage::read("big.png".into(), head, png.len() as u64, 1.0)],
            GalleryLimit::default(),
        );
        assert_eq!(skipped, []);
        let item = g.get("big").unwrap();
        assert_eq!(
            (item.image.prompt.as_str(), item.image.seed, item.image.width),
            (prompt.as_str(), 5, 512)
        );
        assert_eq!(item.bytes, png.len() as u64);
    }

    #[test]
    fn the_export_is_written_a_piece_per_image_and_holds_every_png_and_their_parameters() {
        use std::io::Cursor;
        let a = (item("a", "first", 1_700_000_000_000.0, 0), png("first", 1));
        let b = (item("b", "second", 1_700_000_100_000.0, 0), vec![7u8; 300_000]);
        let mut export = ExportZip::new();
        let mut file = Vec::new();
        for (item, png) in [&a, &b] {
            let piece = export.add(item, png).unwrap();
            // Each piece is about its own image: nothing of the earlier ones is kept to be written later.
            assert!(
                piece.len() >= png.len() && piece.len() < png.len() + 200,
                "{} for {}",
                piece.len(),
                png.len()
            );
            file.extend(piece);
        }
        let last = export.finish().unwrap();
        assert!(last.len() < 2_000, "{}", last.len());
        file.extend(last);
        let mut zip = zip::ZipArchive::new(Cursor::new(file)).unwrap();
        assert_eq!(zip.len(), 3);
        for (item, png) in [&a, &b] {
            let mut entry = zip.by_name(&export_name(item)).unwrap();
            assert_eq!(entry.compression(), zip::CompressionMethod::Stored);
            let mut read = Vec::new();
            entry.read_to_end(&mut read).unwrap();
            assert_eq!(&read, png);
        }
        let mut json = String::new();
        zip.by_name(EXPORT_INDEX).unwrap().read_to_string(&mut json).unwrap();
        let items: Vec<GalleryItem> = serde_json::from_str(&json).unwrap();
        assert_eq!(items, vec![a.0, b.0]);
        // 2023-11-14 22:13:20 UTC.
        let t = zip_time(1_700_000_000_000.0);
        assert_eq!(
            (t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second()),
            (2023, 11, 14, 22, 13, 20)
        );
    }
}

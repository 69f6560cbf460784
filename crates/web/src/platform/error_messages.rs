//! The `_locales` message of every error of this crate ([`Localize`]), so pages and notifications say
//! them in the user's language. Each arm says what the variant's `#[error]` text says, with the same
//! values as arguments; causes that are errors of ours are nested messages, what a browser API, ORT or
//! a library said stays as it is. `i18n`'s tests render a sample of each variant with
//! `_locales/en` and compare it with its `Display`. In one module, so the keys are reviewed together.

use imagine_core::gpu_memory::gigabytes;
use imagine_core::message::{arg, cause, number, Arg, Localize, Message};
use imagine_core::storage::{PACKS_DIR, STATE_FILE};

use crate::background::service_worker::ServiceWorkerError;
use crate::offscreen::convert::ConvertError;
use crate::offscreen::document::OffscreenError;
use crate::offscreen::download::DownloadError;
use crate::offscreen::hasher::HashError;
use crate::offscreen::stage_worker::StageWorkerError;
use crate::platform::gallery_store::GalleryStoreError;
use crate::platform::gpu::GpuError;
use crate::platform::hub_client::FetchError;
use crate::platform::js::JsError;
use crate::platform::opfs::{Op, OpfsError};
use crate::platform::prompt_encoder::EncoderLoadError;
use crate::platform::protocol::ProtocolError;

/// `"<what>: <detail>"`, the shape of many messages.
fn detail(what: Arg, detail: Arg) -> Message {
    Message::new("errFileDetail", [what, detail])
}

impl Op {
    /// The operation on `name`, as [`Op::on`] says it.
    pub fn message(self, name: &str) -> Message {
        let key = match self {
            Op::Open => "errOpOpen",
            Op::OpenForWriting => "errOpOpenForWriting",
            Op::Read => "errOpRead",
            Op::ReadSize => "errOpReadSize",
            Op::Write => "errOpWrite",
            Op::Truncate => "errOpTruncate",
            Op::Flush => "errOpFlush",
            Op::Remove => "errOpRemove",
            Op::Estimate => "errOpEstimate",
        };
        Message::new(key, [arg(name)])
    }
}

impl Localize for OpfsError {
    fn message(&self) -> Message {
        match self {
            OpfsError::Failed { op, name, source } => detail(Arg::Message(op.message(name)), arg(source)),
            OpfsError::QuotaExceeded { op, name, detail: text } => {
                detail(Arg::Message(op.message(name)), arg(text))
            }
            OpfsError::Encode { .. } => Message::text(self),
            OpfsError::UnreadableState(e) => {
                Message::new("errOpfsUnreadableState", [arg(format!("{PACKS_DIR}/{STATE_FILE}")), arg(e)])
            }
            OpfsError::StillOpen { op, name, seconds, source } => {
                Message::new("errOpfsStillOpen", [Arg::Message(op.message(name)), arg(seconds), arg(source)])
            }
        }
    }
}

impl Localize for JsError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

impl Localize for ProtocolError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

impl Localize for FetchError {
    fn message(&self) -> Message {
        match self {
            FetchError::Unreachable { url, source } => {
                Message::new("errFetchUnreachable", [arg(url), arg(source)])
            }
            FetchError::NotFound { url } => Message::new("errFetchNotFound", [arg(url)]),
            FetchError::Http { url, status } => Message::new("errFetchHttp", [arg(url), arg(status)]),
            FetchError::Interrupted { url, source } => {
                Message::new("errInterrupted", [arg(url), arg(source)])
            }
            FetchError::TooLarge { url, cap } => Message::new("errFetchTooLarge", [arg(url), arg(cap)]),
            FetchError::TooManyPages { repo, pages } => {
                Message::new("errFetchTooManyPages", [arg(repo), arg(pages)])
            }
            FetchError::Stalled { url, seconds } => Message::new("errFetchStalled", [arg(url), arg(seconds)]),
            FetchError::ListingTooLarge { repo, cap } => {
                Message::new("errFetchListingTooLarge", [arg(repo), arg(cap)])
            }
            FetchError::GaveUp { last, attempts } => {
                Message::new("errFetchGaveUp", [cause(last.as_ref()), arg(attempts)])
            }
            FetchError::Hub(e) => e.message(),
            FetchError::Graph { graph, source } => detail(arg(graph), cause(source)),
            FetchError::Conversion(e) => Message::new("errFetchConversion", [cause(e)]),
            FetchError::Js(e) => e.message(),
        }
    }
}

impl Localize for DownloadError {
    fn message(&self) -> Message {
        match self {
            DownloadError::Hub(e) => e.message(),
            DownloadError::Fetch(e) => e.message(),
            DownloadError::Opfs(e) => e.message(),
            DownloadError::NoSpace(e) => Message::new("errDownloadNoSpace", [cause(e)]),
            DownloadError::Hash(e) => e.message(),
            DownloadError::Gpu(e) => e.message(),
            DownloadError::Convert(e) => e.message(),
            DownloadError::Protocol(e) => e.message(),
            DownloadError::RangeMismatch { url, start } => {
                Message::new("errDownloadRangeMismatch", [arg(url), arg(start)])
            }
            DownloadError::NoBody { url } => Message::new("errDownloadNoBody", [arg(url)]),
            DownloadError::Interrupted { path, source } => {
                Message::new("errInterrupted", [arg(path), arg(source)])
            }
            DownloadError::TooLong { url, path, size } => {
                Message::new("errDownloadTooLong", [arg(url), arg(size), arg(path)])
            }
            DownloadError::TooShort { url, path, offset, size } => {
                Message::new("errDownloadTooShort", [arg(url), arg(path), arg(offset), arg(size)])
            }
            DownloadError::OtherLength { url, path, total, size } => {
                Message::new("errDownloadOtherLength", [arg(url), arg(path), arg(total), arg(size)])
            }
            DownloadError::GaveUp { last, attempts } => {
                Message::new("errDownloadGaveUp", [cause(last.as_ref()), arg(attempts)])
            }
            DownloadError::Corrupt(e) => Message::new("errDownloadCorrupt", [cause(e)]),
            DownloadError::StorageChanged => Message::new("errDownloadStorageChanged", []),
            DownloadError::Internal(_) => Message::text(self),
        }
    }
}

impl Localize for HashError {
    fn message(&self) -> Message {
        match self {
            HashError::Checkpoint(e) => e.message(),
            HashError::Protocol(e) => e.message(),
            HashError::Reported(e) => e.message(),
            HashError::Stopped => Message::new("errHashStopped", []),
            HashError::Silent { seconds } => Message::new("errHashSilent", [arg(seconds)]),
            // Between our own workers: a bug, said as it is.
            HashError::NoData
            | HashError::NoBuffer
            | HashError::Unasked { .. }
            | HashError::Unexpected { .. } => Message::text(self),
        }
    }
}

impl Localize for GpuError {
    fn message(&self) -> Message {
        // Not exhaustive on purpose: a variant added or removed there must not break this list; a new
        // one is shown in English until it gets its key.
        #[allow(unreachable_patterns)]
        match self {
            GpuError::NoWebGpu => Message::new("errGpuNoWebGpu", []),
            GpuError::Adapter(e) => Message::new("errGpuAdapter", [arg(e)]),
            GpuError::NoAdapter => Message::new("errGpuNoAdapter", []),
            GpuError::NoF16 { what } => Message::new("errGpuNoF16", [arg(what)]),
            GpuError::Limit { limit, largest_tensor, available } => {
                Message::new("errGpuLimit", [arg(largest_tensor), arg(limit), arg(available)])
            }
            other => Message::text(other),
        }
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

impl Localize for GalleryStoreError {
    fn message(&self) -> Message {
        match self {
            GalleryStoreError::Gallery(e) => e.message(),
            GalleryStoreError::Opfs(e) => e.message(),
        }
    }
}

impl Localize for ServiceWorkerError {
    fn message(&self) -> Message {
        match self {
            ServiceWorkerError::Foreign => Message::new("errSwForeign", []),
            ServiceWorkerError::EventSent => Message::new("errSwEventSent", []),
            ServiceWorkerError::NotARequest(e) => Message::new("errSwNotARequest", [arg(e)]),
            ServiceWorkerError::Source(e) => e.message(),
            ServiceWorkerError::Backend(name) => Message::new("errSwBackend", [arg(format!("{name:?}"))]),
            ServiceWorkerError::Params(e) => e.message(),
            ServiceWorkerError::NoDownload("pause") => Message::new("errSwNoDownloadToPause", []),
            ServiceWorkerError::NoDownload("resume") => Message::new("errSwNoDownloadToResume", []),
            ServiceWorkerError::NoDownload(_) => Message::text(self),
            ServiceWorkerError::Installing => Message::new("errSwInstalling", []),
            ServiceWorkerError::NoPack => Message::new("errSwNoPack", []),
            ServiceWorkerError::Fetch(e) => e.message(),
            ServiceWorkerError::Opfs(e) => e.message(),
            ServiceWorkerError::OffscreenNotOpened(e) => Message::new("errSwOffscreenNotOpened", [arg(e)]),
            ServiceWorkerError::Refused(e) => e.message(),
            ServiceWorkerError::NoAnswer => Message::new("errSwNoAnswer", []),
            ServiceWorkerError::Js(e) => e.message(),
            ServiceWorkerError::Image(_) => Message::text(self),
            ServiceWorkerError::Gallery(e) => e.message(),
            ServiceWorkerError::NotKept(e) => Message::new("errSwNotKept", [cause(e)]),
            ServiceWorkerError::PrivateGone => Message::new("errSwPrivateGone", []),
            ServiceWorkerError::Unkept { error, seed } => {
                Message::new("errSwUnkept", [cause(error), arg(seed)])
            }
            ServiceWorkerError::NotRecorded(e) => Message::new("errSwNotRecorded", [arg(e)]),
            ServiceWorkerError::JobLost => Message::new("errSwJobLost", []),
            ServiceWorkerError::Offline(e) => Message::new("errSwOffline", [cause(e)]),
            ServiceWorkerError::OtherDownload { running } => {
                Message::new("errSwOtherDownload", [arg(running)])
            }
            ServiceWorkerError::JobRunning => Message::new("errSwJobRunning", []),
            ServiceWorkerError::GpuMemory(e) => e.message(),
            ServiceWorkerError::Gpu(e) => e.message(),
        }
    }
}

impl Localize for StageWorkerError {
    fn message(&self) -> Message {
        // Not exhaustive on purpose, like `GpuError`'s.
        #[allow(unreachable_patterns)]
        match self {
            StageWorkerError::NoPack => Message::new("errStageNoPack", []),
            StageWorkerError::Opfs(e) => e.message(),
            StageWorkerError::Graph { graph, source } => detail(arg(graph), cause(source)),
            StageWorkerError::GraphEdit { graph, source } => detail(arg(graph), arg(source)),
            StageWorkerError::ExternalData { graph, file, source } => {
                Message::new("errStageExternalData", [arg(graph), arg(file), cause(source.as_ref())])
            }
            StageWorkerError::Gpu(e) => e.message(),
            StageWorkerError::Load { graph, source } => {
                Message::new("errStageLoad", [arg(graph), arg(source)])
            }
            StageWorkerError::Stage(e) => e.message(),
            other => Message::text(other),
        }
    }
}

impl Localize for EncoderLoadError {
    fn message(&self) -> Message {
        match self {
            EncoderLoadError::Fetch { path, source } => {
                detail(Arg::Message(Op::Read.message(path)), arg(source))
            }
            EncoderLoadError::Status { path, status } => {
                detail(Arg::Message(Op::Read.message(path)), arg(format!("HTTP {status}")))
            }
            EncoderLoadError::Tokenizer(e) => Message::new("errOffscreenTokenizer", [cause(e)]),
        }
    }
}

impl Localize for OffscreenError {
    fn message(&self) -> Message {
        match self {
            OffscreenError::Js(e) => e.message(),
            OffscreenError::Protocol(e) => e.message(),
            OffscreenError::Opfs(e) => e.message(),
            OffscreenError::Reported(e) => e.message(),
            OffscreenError::Crashed { script, message } => {
                Message::new("errOffscreenCrashed", [arg(script), arg(message)])
            }
            OffscreenError::StageStopped => Message::new("errOffscreenStageStopped", []),
            OffscreenError::Stalled { stage, seconds } => Message::new(
                "errOffscreenStageStalled",
                [Arg::Message(Message::new(stage.message_key(), [])), arg(seconds)],
            ),
            OffscreenError::Encoder(e) => e.message(),
            OffscreenError::Prompt(e) => Message::new("errOffscreenPrompt", [cause(e)]),
            OffscreenError::OutOfMemory { budget: None, cause: inner, .. } => {
                Message::new("errOffscreenOutOfMemoryUnknown", [cause(inner.as_ref())])
            }
            OffscreenError::OutOfMemory { budget: Some(budget), largest_square, cause: inner } => {
                Message::new(
                    "errOffscreenOutOfMemory",
                    [
                        number(gigabytes(*budget)),
                        cause(inner.as_ref()),
                        Arg::Message(fits_message(*largest_square)),
                    ],
                )
            }
            OffscreenError::NoRoom { need, budget, largest_square, cause: inner } => {
                let fits = fits_message(*largest_square);
                Message::new(
                    "errOffscreenNoRoom",
                    [
                        number(gigabytes(*need)),
                        number(gigabytes(*budget)),
                        cause(inner.as_ref()),
                        Arg::Message(fits),
                    ],
                )
            }
            // Between the service worker, the offscreen document and the workers: a bug, as it is.
            OffscreenError::NotFromServiceWorker
            | OffscreenError::BadCommand(_)
            | OffscreenError::WrongOutput(_)
            | OffscreenError::NoOutput => Message::text(self),
        }
    }
}

/// What sizes fit, as the memory messages end.
fn fits_message(largest_square: Option<u32>) -> Message {
    match largest_square {
        Some(side) => Message::new("gpuFitsUpTo", [arg(side)]),
        None => Message::new("gpuFitsNone", []),
    }
}

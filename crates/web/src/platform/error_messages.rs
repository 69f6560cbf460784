//! The `_locales` message ([`Localize`]) of the errors of `platform`, so pages and notifications say
//! them in the user's language; each context's own errors have theirs beside their enum, built from
//! the helpers here. Each arm says what the variant's `#[error]` text says, with the same values as
//! arguments; causes that are errors of ours are nested messages, what a browser API, ORT or a library
//! said stays as it is. `i18n`'s tests render a sample of each variant with `_locales/en` and compare
//! it with its `Display`.

use imagine_core::message::{arg, cause, Arg, Localize, Message};
use imagine_core::storage::{PACKS_DIR, STATE_FILE};

use crate::platform::gpu::GpuError;
use crate::platform::hub_client::FetchError;
use crate::platform::js::JsError;
use crate::platform::opfs::{Op, OpfsError};
use crate::platform::prompt_encoder::EncoderLoadError;
use crate::platform::protocol::ProtocolError;

/// `"<what>: <detail>"`, the shape of many messages.
pub(crate) fn detail(what: Arg, detail: Arg) -> Message {
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

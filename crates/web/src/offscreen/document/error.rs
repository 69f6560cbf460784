//! Why a command, a job or an install failed in the offscreen document, and what the pages say of it.

use super::*;

/// Why a command, a job or an install failed in the offscreen document.
#[derive(Debug, Error)]
pub enum OffscreenError {
    /// A command came from another sender than the service worker (a page); it is refused.
    #[error("offscreen: commands are taken from the service worker only")]
    NotFromServiceWorker,
    /// A message for this document that is not an [`OffscreenCommand`].
    #[error("offscreen: bad command: {0}")]
    BadCommand(ProtocolError),
    /// A worker could not be started or linked.
    #[error(transparent)]
    Js(#[from] JsError),
    /// A message to or from a worker.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// Reading or writing the pack's files or the embedding cache in OPFS.
    #[error(transparent)]
    Opfs(#[from] OpfsError),
    /// What a worker reported (its own typed error, as text: it crossed `postMessage`).
    #[error("{0}")]
    Reported(ErrorText),
    /// A worker threw an error it did not catch (its `error` event).
    #[error("{script} crashed: {message}")]
    Crashed {
        /// The worker's script (`stage-worker.js`, `download-worker.js`, ...).
        script: String,
        /// The error event's message.
        message: String,
    },
    /// The stage worker's inbox closed without a report: it is gone.
    #[error("the stage worker stopped unexpectedly")]
    StageStopped,
    /// A stage reported nothing for longer than it may ([`QuietTimes::stall_limit_ms`]); its worker
    /// was ended.
    #[error("the {} made no progress for {seconds} s and was stopped", .stage.name())]
    Stalled {
        /// The stage that went quiet.
        stage: Stage,
        /// Its stall limit, in seconds.
        seconds: u64,
    },
    /// A stage worker's `Done` carried another stage's output (a bug); the stage it was asked for.
    #[error("internal: the {} worker handed on another stage's output", .0.name())]
    WrongOutput(Stage),
    /// A stage handed on no buffer where the next one needs it (a bug).
    #[error("internal: a stage handed on nothing")]
    NoOutput,
    /// The prompt encoder could not be made from the files shipped with the extension.
    #[error(transparent)]
    Encoder(#[from] EncoderLoadError),
    /// The prompt could not be tokenized.
    #[error("encoding the prompt failed: {0}")]
    Prompt(PromptError),
    /// A job the memory plan had no room for failed: it says so, with what would fit.
    #[error(
        "This image needs about {} GB of GPU memory and Imagine may use {} GB on this GPU, so it failed \
         ({cause}). {}",
        gigabytes(*need), gigabytes(*budget), fits_text(*largest_square)
    )]
    NoRoom {
        /// What the leanest plan needs, in bytes.
        need: u64,
        /// The budget, in bytes.
        budget: u64,
        /// The largest square size that fits, if any.
        largest_square: Option<u32>,
        /// How it failed.
        cause: Box<OffscreenError>,
    },
    /// The GPU ran out of memory where the plan said the job would fit, and once more after it was
    /// made again smaller: it says so, with what would fit.
    #[error("{}", out_of_memory_text(*budget, *largest_square, cause))]
    OutOfMemory {
        /// The budget it was last tried within, in bytes, where known.
        budget: Option<u64>,
        /// The largest square size that fits, if any.
        largest_square: Option<u32>,
        /// How it failed.
        cause: Box<OffscreenError>,
    },
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

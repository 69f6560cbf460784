//! The core's prompt encoder (the tokenizer and the chat template), made from the files shipped with
//! the extension: the offscreen document tokenizes prompts with it, the studio counts their tokens.

use imagine_core::{PromptEncoder, PromptError};
use js_sys::Uint8Array;
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::platform::js::JsError;

#[wasm_bindgen]
extern "C" {
    /// `DecompressionStream`, a readable and writable pair (web-sys has it among its unstable APIs).
    type DecompressionStream;

    #[wasm_bindgen(constructor, catch)]
    fn new(format: &str) -> Result<DecompressionStream, JsValue>;
}

/// Why the prompt encoder could not be made.
#[derive(Debug, Error)]
pub enum EncoderLoadError {
    /// A file shipped with the extension could not be read.
    #[error("reading {path}: {source}")]
    Fetch {
        /// Its path in the extension.
        path: &'static str,
        /// `fetch`'s or the body's error.
        source: JsError,
    },
    /// A file shipped with the extension answered with an error status (missing from the build).
    #[error("reading {path}: HTTP {status}")]
    Status {
        /// Its path in the extension.
        path: &'static str,
        /// The HTTP status.
        status: u16,
    },
    /// The files could not be made into a [`PromptEncoder`].
    #[error("loading the tokenizer failed: {0}")]
    Tokenizer(PromptError),
}

/// The prompt encoder, from `tokenizer/` of the extension. The tokenizer (11 MB of JSON) ships
/// gzipped: a fifth of the size, and Firefox's add-on linter refuses JSON files above 5 MB.
pub async fn load() -> Result<PromptEncoder, EncoderLoadError> {
    let tokenizer = fetch_bytes("tokenizer/tokenizer.json.gz", true).await?;
    let config = fetch_bytes("tokenizer/tokenizer_config.json", false).await?;
    PromptEncoder::new(&tokenizer, &config).map_err(EncoderLoadError::Tokenizer)
}

/// A file shipped with the extension, ungzipped when `gzipped`.
async fn fetch_bytes(path: &'static str, gzipped: bool) -> Result<Vec<u8>, EncoderLoadError> {
    let failed = |e: JsValue| EncoderLoadError::Fetch { path, source: e.into() };
    let window = web_sys::window().ok_or_else(|| failed(JsValue::from_str("no window")))?;
    let response = JsFuture::from(window.fetch_with_str(path)).await.map_err(failed)?;
    let mut response: web_sys::Response = response.unchecked_into();
    if !response.ok() {
        return Err(EncoderLoadError::Status { path, status: response.status() });
    }
    if gzipped {
        let body = response.body().ok_or_else(|| failed(JsValue::from_str("no body")))?;
        let gunzip = DecompressionStream::new("gzip").map_err(failed)?;
        let plain = body.pipe_through(gunzip.unchecked_ref());
        response = web_sys::Response::new_with_opt_readable_stream(Some(&plain)).map_err(failed)?;
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(failed)?).await.map_err(failed)?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

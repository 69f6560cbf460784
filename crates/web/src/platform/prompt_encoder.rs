//! The core's prompt encoder (the tokenizer and the chat template), made from the files shipped with
//! the extension: the offscreen document tokenizes prompts with it, the studio counts their tokens.

use imagine_core::{PromptEncoder, PromptError};
use js_sys::Uint8Array;
use thiserror::Error;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::platform::js::JsError;

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

/// The prompt encoder, from `tokenizer/` of the extension.
pub async fn load() -> Result<PromptEncoder, EncoderLoadError> {
    let tokenizer = fetch_bytes("tokenizer/tokenizer.json").await?;
    let config = fetch_bytes("tokenizer/tokenizer_config.json").await?;
    PromptEncoder::new(&tokenizer, &config).map_err(EncoderLoadError::Tokenizer)
}

/// A file shipped with the extension.
async fn fetch_bytes(path: &'static str) -> Result<Vec<u8>, EncoderLoadError> {
    let failed = |e: JsValue| EncoderLoadError::Fetch { path, source: e.into() };
    let window = web_sys::window().ok_or_else(|| failed(JsValue::from_str("no window")))?;
    let response = JsFuture::from(window.fetch_with_str(path)).await.map_err(failed)?;
    let response: web_sys::Response = response.unchecked_into();
    if !response.ok() {
        return Err(EncoderLoadError::Status { path, status: response.status() });
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(failed)?).await.map_err(failed)?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

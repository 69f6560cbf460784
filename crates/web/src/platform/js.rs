//! Small helpers for crossing the JS boundary.

use js_sys::{Object, Reflect, JSON};
use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;
use wasm_bindgen::prelude::*;

use crate::platform::opfs::OpfsError;
use crate::platform::protocol::ProtocolError;

/// An error thrown or rejected by JS (a browser API, a promise), as the Rust side keeps it: its
/// message, and its `name` (`NotFoundError`, `QuotaExceededError`, ...) when it has one.
#[derive(Debug, Clone, Error)]
#[error("{message}")]
pub struct JsError {
    /// The error's `name`, when it is an object that has one.
    pub name: Option<String>,
    /// The error's `message`, the string thrown, or the value as JS prints it.
    pub message: String,
}

impl JsError {
    /// Whether the error's `name` is `name`.
    pub fn is(&self, name: &str) -> bool {
        self.name.as_deref() == Some(name)
    }
}

impl From<JsValue> for JsError {
    fn from(value: JsValue) -> Self {
        JsError::from(&value)
    }
}

impl From<&JsValue> for JsError {
    fn from(value: &JsValue) -> Self {
        let message = value
            .dyn_ref::<js_sys::Error>()
            .map(|e| String::from(e.message()))
            .or_else(|| value.as_string())
            .unwrap_or_else(|| format!("{value:?}"));
        JsError { name: get(value, "name").as_string(), message }
    }
}

/// The SHA-256 of `data` (an `ArrayBuffer` or a view of one), computed by the browser
/// (`crypto.subtle`: far faster than SHA-256 in wasm, and off this thread).
pub async fn sha256(data: &JsValue) -> Result<[u8; 32], JsError> {
    let subtle = get(&get(&js_sys::global(), "crypto"), "subtle");
    let digest: js_sys::Function = get(&subtle, "digest")
        .dyn_into()
        .map_err(|_| JsError { name: None, message: "crypto.subtle.digest is missing".to_owned() })?;
    let hashed = digest.call2(&subtle, &"SHA-256".into(), data)?;
    let hashed = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(hashed)).await?;
    <[u8; 32]>::try_from(js_sys::Uint8Array::new(&hashed).to_vec())
        .map_err(|_| JsError { name: None, message: "a SHA-256 digest of another length".to_owned() })
}

/// Converts a Rust value to a plain JS object (through JSON, so u64 sizes stay numbers). The types
/// sent are plain data that always serialize; one that did not would be logged and sent as `undefined`
/// rather than kill the context.
pub fn to_js<T: Serialize>(value: &T) -> JsValue {
    let text = serde_json::to_string(value).map_err(|e| JsValue::from_str(&e.to_string()));
    text.and_then(|text| JSON::parse(&text))
        .log_error("converting a value to JS")
        .unwrap_or(JsValue::UNDEFINED)
}

/// Converts a plain JS object to a Rust value.
pub fn from_js<T: DeserializeOwned>(value: &JsValue) -> Result<T, ProtocolError> {
    let text = JSON::stringify(value).map_err(JsError::from)?;
    let text = text.as_string().unwrap_or_default();
    Ok(serde_json::from_str(&text)?)
}

/// Reads `object[key]`; `undefined` when absent.
pub fn get(object: &JsValue, key: &str) -> JsValue {
    Reflect::get(object, &key.into()).unwrap_or(JsValue::UNDEFINED)
}

/// Reads `object[key]` as a string.
pub fn get_string(object: &JsValue, key: &str) -> Option<String> {
    get(object, key).as_string()
}

/// Reads `object[key]` as a number.
pub fn get_f64(object: &JsValue, key: &str) -> Option<f64> {
    get(object, key).as_f64()
}

/// Builds a plain JS object field by field.
pub struct Obj(Object);

impl Obj {
    /// An empty object.
    pub fn new() -> Self {
        Obj(Object::new())
    }

    /// Sets `key` to `value`.
    pub fn set(self, key: &str, value: impl Into<JsValue>) -> Self {
        // Defining a property on a fresh plain object cannot fail.
        let _ = Reflect::set(&self.0, &key.into(), &value.into());
        self
    }

    /// The object built.
    pub fn build(self) -> JsValue {
        self.0.into()
    }
}

impl Default for Obj {
    fn default() -> Self {
        Self::new()
    }
}

/// A fresh random u64 from `crypto.getRandomValues`.
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    let crypto = get(&js_sys::global(), "crypto").unchecked_into::<web_sys::Crypto>();
    if crypto.get_random_values_with_u8_array(&mut bytes).log_error("crypto.getRandomValues").is_some() {
        return u64::from_le_bytes(bytes);
    }
    // It refuses only more than 64 KiB at once, never these 8 bytes. Should it fail all the same,
    // `Math.random` is random enough for what this draws (seeds, job ids, retry jitter).
    let half = || (js_sys::Math::random() * 4_294_967_296.0) as u64;
    (half() << 32) | half()
}

/// Milliseconds from `performance.now()`.
pub fn now_ms() -> f64 {
    performance().now()
}

/// When this context (page or worker) was created, in milliseconds since the Unix epoch.
pub fn time_origin_ms() -> f64 {
    performance().time_origin()
}

fn performance() -> web_sys::Performance {
    get(&js_sys::global(), "performance").unchecked_into()
}

/// Waits `ms` milliseconds (any context: window, worker or service worker).
pub async fn sleep_ms(ms: u64) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        let set_timeout: js_sys::Function = get(&global, "setTimeout").unchecked_into();
        let _ = set_timeout.call2(&global, &resolve, &JsValue::from_f64(ms as f64));
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// The outcome of a `catch` binding that returns a promise (most `chrome.*` calls): its throw or its
/// rejection as the error, else what it resolved to.
pub async fn settled(call: Result<js_sys::Promise, JsValue>) -> Result<JsValue, JsValue> {
    wasm_bindgen_futures::JsFuture::from(call?).await
}

/// An error that [`LogError`] can log: a JS value as the console shows it (an `Error` with its stack),
/// or one of this crate's errors as its text.
pub trait Loggable {
    /// What goes to the console after the context.
    fn console_value(&self) -> JsValue;
}

impl Loggable for JsValue {
    fn console_value(&self) -> JsValue {
        self.clone()
    }
}

/// `Loggable` by their `Display` text; each context names its own errors beside them. Listed one by
/// one: a blanket impl over `Display` would overlap the one for `JsValue`.
macro_rules! loggable_by_display {
    ($($error:ty),* $(,)?) => {
        $(impl $crate::platform::js::Loggable for $error {
            fn console_value(&self) -> wasm_bindgen::JsValue {
                wasm_bindgen::JsValue::from_str(&self.to_string())
            }
        })*
    };
}
pub(crate) use loggable_by_display;

loggable_by_display!(
    JsError,
    ProtocolError,
    OpfsError,
    crate::platform::gpu::GpuError,
    imagine_ort::OrtError
);

/// For a `Result` whose failure changes nothing for the caller but must not pass unseen (a `chrome.*`
/// call, a storage write, a `postMessage`, closing a file or a page): logs the error in the context's
/// console as `imagine: <context>:` and the error, where `let _ =` would drop it silently.
pub trait LogError<T> {
    /// Logs a failure with `console.error`; the value, if it succeeded.
    fn log_error(self, context: &str) -> Option<T>;

    /// Logs a failure with `console.warn`, for failures that are expected now and then; the value, if
    /// it succeeded.
    fn warn_on_error(self, context: &str) -> Option<T>;
}

impl<T, E: Loggable> LogError<T> for Result<T, E> {
    fn log_error(self, context: &str) -> Option<T> {
        self.map_err(|e| {
            web_sys::console::error_2(&format!("imagine: {context}:").into(), &e.console_value())
        })
        .ok()
    }

    fn warn_on_error(self, context: &str) -> Option<T> {
        self.map_err(|e| web_sys::console::warn_2(&format!("imagine: {context}:").into(), &e.console_value()))
            .ok()
    }
}

/// Whether the extension API `chrome.<name>` exists in this browser (Chrome's `offscreen` and
/// `sidePanel` do not in Firefox).
pub fn has_api(name: &str) -> bool {
    let chrome = get(&js_sys::global(), "chrome");
    !chrome.is_undefined() && !get(&chrome, name).is_undefined()
}

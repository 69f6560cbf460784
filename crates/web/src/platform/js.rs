//! Small helpers for crossing the JS boundary.

use js_sys::{Object, Reflect, JSON};
use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;
use wasm_bindgen::prelude::*;

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

/// Converts a Rust value to a plain JS object (through JSON, so u64 sizes stay numbers).
pub fn to_js<T: Serialize>(value: &T) -> JsValue {
    let text = serde_json::to_string(value).expect("API types always serialize");
    JSON::parse(&text).expect("serde_json writes valid JSON")
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
    pub fn new() -> Self {
        Obj(Object::new())
    }

    pub fn set(self, key: &str, value: impl Into<JsValue>) -> Self {
        // Defining a property on a fresh plain object cannot fail.
        let _ = Reflect::set(&self.0, &key.into(), &value.into());
        self
    }

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
    crypto.get_random_values_with_u8_array(&mut bytes).expect("crypto.getRandomValues is always available");
    u64::from_le_bytes(bytes)
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

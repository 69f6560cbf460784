//! The wasm module of the Imagine extension.
//!
//! Every browser context loads this same module through a thin JS shim in `extension/` and calls the
//! entry point of its own Rust module:
//!
//! | context | shim | module | entries |
//! |---|---|---|---|
//! | service worker | `sw.js` | [`background::service_worker`], [`background::notify`] | `serviceWorkerMessage`, `serviceWorkerInstalled`, `serviceWorkerStartup`, `serviceWorkerWake`, `serviceWorkerMenuClick`, `serviceWorkerCommand`, `serviceWorkerWindowRemoved`, `serviceWorkerNotificationClick` |
//! | offscreen document | `offscreen.js` | [`offscreen::document`] | `offscreenCommand` |
//! | stage worker | `stage-worker.js` | [`offscreen::stage_worker`] | `stageWorkerMain` |
//! | download worker | `download-worker.js` | [`offscreen::download`] | `downloadWorkerMain` |
//! | hash worker (beside the download worker) | `hash-worker.js` | [`offscreen::hasher`] | `hashWorkerMain` |
//! | popup | `popup.js` | [`pages::popup`] | `popupMain`, `popupEvent` |
//! | result page | `result.js` | [`pages::result_page`] | `resultPageMain`, `resultPageEvent` |
//! | gallery page | `gallery.js` | [`pages::gallery_page`] | `galleryPageMain`, `galleryPageEvent`, `galleryStorageChanged` |
//! | options page | `options.js` | [`pages::options_page`] | `optionsPageMain`, `optionsPageEvent` |
//! | studio (side panel, or a tab) | `studio.js` | [`pages::studio`] | `studioMain`, `studioEvent`, `studioStorageChanged` |
//!
//! The folders follow the contexts: [`background`] (the service worker), [`offscreen`] (the offscreen
//! document and its workers), [`pages`] (the extension's pages) and [`platform`] (what they all build
//! on). The internal channels between them are typed in [`platform::protocol`]. The pipeline itself lives in
//! `imagine-core` (no web dependency) and ORT in `imagine-ort`.

// The workspace denies `missing_docs` (Cargo.toml). `unwrap_used` is denied here rather than there
// because xtask's tests unwrap; a panic in wasm silently kills the service worker or worker it
// happens in, so errors must be handled, propagated or logged (`platform::js::LogError`). `expect`
// panics the same way.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Tests may unwrap: a failing unwrap is a failing test, with the value in its message.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod background;
pub mod offscreen;
pub mod pages;
pub mod platform;

#[cfg(test)]
mod locale_tests;

use wasm_bindgen::prelude::*;

/// Runs once per context when the module is instantiated.
#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

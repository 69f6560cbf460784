//! The wasm module of the Imagine extension.
//!
//! Every browser context loads this same module through a thin JS shim in `extension/` and calls the
//! entry point of its own Rust module:
//!
//! | context | shim | module | entries |
//! |---|---|---|---|
//! | service worker | `sw.js` | [`service_worker`], [`notify`] | `serviceWorkerMessage`, `serviceWorkerInstalled`, `serviceWorkerStartup`, `serviceWorkerWake`, `serviceWorkerMenuClick`, `serviceWorkerCommand`, `serviceWorkerNotificationClick` |
//! | offscreen document | `offscreen.js` | [`offscreen`] | `offscreenCommand` |
//! | stage worker | `stage-worker.js` | [`stage_worker`] | `stageWorkerMain` |
//! | download worker | `download-worker.js` | [`download`] | `downloadWorkerMain` |
//! | hash worker (beside the download worker) | `hash-worker.js` | [`hasher`] | `hashWorkerMain` |
//! | popup | `popup.js` | [`popup`] | `popupMain`, `popupEvent` |
//! | result page | `result.js` | [`result_page`] | `resultPageMain`, `resultPageEvent` |
//! | gallery page | `gallery.js` | [`gallery_page`] | `galleryPageMain`, `galleryPageEvent` |
//! | options page | `options.js` | [`options_page`] | `optionsPageMain`, `optionsPageEvent` |
//! | studio (side panel, or a tab) | `studio.js` | [`studio`] | `studioMain`, `studioEvent`, `studioStorageChanged` |
//!
//! The internal channels between them are typed in [`protocol`]. The pipeline itself lives in
//! `imagine-core` (no web dependency) and ORT in `imagine-ort`.

pub mod chrome;
pub mod convert;
pub mod download;
pub mod gallery_page;
pub mod gallery_store;
pub mod gpu;
pub mod hasher;
pub mod hub_client;
pub mod i18n;
pub mod js;
pub mod messaging;
pub mod notify;
pub mod offscreen;
pub mod opfs;
pub mod options_page;
pub mod popup;
pub mod protocol;
pub mod result_page;
pub mod service_worker;
pub mod settings;
pub mod stage_worker;
pub mod studio;
pub mod view;

use wasm_bindgen::prelude::*;

/// Runs once per context when the module is instantiated.
#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

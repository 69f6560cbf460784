//! `chrome.storage`, typed: each key is declared once, as a [`Key`] with its area and the type of its
//! value, and read, written and removed only through it. The keys the pages share are here; the
//! service worker's own records (jobs, the download) are in `background::records`. ARCHITECTURE.md,
//! "What is stored where", lists them all.
//!
//! Names: the settings the pages share start with `imagine.`; the service worker's records and the
//! pages' own state keep the short names they were first stored under (renaming one would lose what a
//! user has stored).

use std::borrow::Cow;
use std::marker::PhantomData;

use imagine_core::api::{PackPlan, PackSource};
use imagine_core::estimate::TimingStore;
use imagine_core::gpu_memory::{GpuMemorySetting, Probe};
use serde::de::DeserializeOwned;
use serde::Serialize;
use wasm_bindgen::JsValue;

use crate::platform::chrome;
use crate::platform::js::{from_js, get, settled, to_js, JsError, LogError, Obj};
use crate::platform::protocol::{StudioFocus, ToolbarOpens};
use crate::platform::settings::{Defaults, Reuse};

/// A page's own `localStorage` entry whose value is a `T`, as JSON: read and written synchronously
/// (a page restores its form before it draws), by this extension's pages only. Declared where the
/// page that owns it is.
pub struct PageKey<T> {
    name: &'static str,
    value: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> PageKey<T> {
    /// The entry `name`.
    pub const fn new(name: &'static str) -> Self {
        PageKey { name, value: PhantomData }
    }

    fn storage() -> Option<web_sys::Storage> {
        web_sys::window()?.local_storage().ok().flatten()
    }

    /// The stored value; `None` when there is none or it is not a `T`.
    pub fn get(&self) -> Option<T> {
        let text = Self::storage()?.get_item(self.name).ok().flatten()?;
        serde_json::from_str(&text).ok()
    }

    /// Stores `value`; a failure (storage full or refused) is logged.
    pub fn set(&self, value: &T) {
        let (Some(storage), Ok(text)) = (Self::storage(), serde_json::to_string(value)) else { return };
        storage.set_item(self.name, &text).warn_on_error(&format!("saving {}", self.name));
    }
}

/// Where a key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `chrome.storage.local`: kept across browser restarts.
    Local,
    /// `chrome.storage.session`: in memory, gone when the browser closes.
    Session,
}

/// A `chrome.storage` key whose value is a `T`, as JSON.
pub struct Key<T> {
    area: Area,
    name: Cow<'static, str>,
    value: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> Key<T> {
    /// A key of `chrome.storage.local`.
    pub const fn local(name: &'static str) -> Self {
        Key { area: Area::Local, name: Cow::Borrowed(name), value: PhantomData }
    }

    /// A key of `chrome.storage.session`.
    pub const fn session(name: &'static str) -> Self {
        Key { area: Area::Session, name: Cow::Borrowed(name), value: PhantomData }
    }

    /// A key of `chrome.storage.session` whose name is made at run time (one per job, say).
    pub fn session_named(name: String) -> Self {
        Key { area: Area::Session, name: Cow::Owned(name), value: PhantomData }
    }

    /// The key's name, as `chrome.storage.onChanged` reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stored value; `None` when there is none, or when it cannot be read as a `T`.
    pub async fn get(&self) -> Option<T> {
        let read = match self.area {
            Area::Local => chrome::local_get(&self.name().into()),
            Area::Session => chrome::session_get(&self.name().into()),
        };
        let items = settled(read).await.ok()?;
        let value = get(&items, self.name());
        if value.is_undefined() {
            return None;
        }
        from_js(&value).ok()
    }

    /// Stores `value`.
    pub async fn set(&self, value: &T) -> Result<(), JsError> {
        let items = Obj::new().set(self.name(), to_js(value)).build();
        let write = match self.area {
            Area::Local => chrome::local_set(&items),
            Area::Session => chrome::session_set(&items),
        };
        settled(write).await?;
        Ok(())
    }

    /// Stores `value`; a failure is logged, for values that only save work (a cache, a page's state).
    pub async fn set_or_log(&self, value: &T) {
        self.set(value).await.log_error(&format!("storing {}", self.name()));
    }

    /// Removes the key; a failure is logged.
    pub async fn remove_or_log(&self) {
        self.remove().await.log_error(&format!("removing {}", self.name()));
    }

    /// Removes the key.
    pub async fn remove(&self) -> Result<(), JsError> {
        let key = JsValue::from(self.name());
        let remove = match self.area {
            Area::Local => chrome::local_remove(&key),
            Area::Session => chrome::session_remove(&key),
        };
        settled(remove).await?;
        Ok(())
    }
}

/// The generation settings a new prompt starts with (options page → popup, studio).
pub const DEFAULTS: Key<Defaults> = Key::local("imagine.defaults");
/// The pack source the options page saved (→ popup's download form).
pub const SOURCE: Key<PackSource> = Key::local("imagine.source");
/// The last download plan a page asked for (popup's "Check the download size"): its sizes are what the
/// device verdict says on every page (`pages/setup.rs`).
pub const PLAN: Key<PackPlan> = Key::session("imagine.plan");
/// Seconds the model stays loaded after the last image (options page, `keepLoaded` → service worker).
pub const KEEP_LOADED: Key<u32> = Key::local("imagine.keepLoaded");
/// The GPU memory a job may use: Auto (the probe's) or a size (options page → service worker).
pub const GPU_MEMORY: Key<GpuMemorySetting> = Key::local("imagine.gpuMemory");
/// What the probe found on the last adapter it ran on (service worker).
pub const GPU_PROBE: Key<Probe> = Key::local("imagine.gpuProbe");
/// Whether text selected in a private window makes images kept like any other (options page →
/// service worker).
pub const KEEP_PRIVATE: Key<bool> = Key::local("imagine.keepPrivate");
/// A gallery image's settings to reuse (gallery → the next page that makes images, which removes it).
pub const REUSE: Key<Reuse> = Key::session("imagine.reuse");
/// What the studio should show (service worker → studio, which also follows its changes).
pub const STUDIO_FOCUS: Key<StudioFocus> = Key::session("studioFocus");
/// What the toolbar button opens (studio → service worker, which applies it at start-up).
pub const TOOLBAR: Key<ToolbarOpens> = Key::local("toolbarOpens");
/// Per-stage timings of finished runs by image size, for the studio's estimate.
pub const STUDIO_TIMINGS: Key<TimingStore> = Key::local("studioTimings");

//! The user's settings the pages share: the defaults a new prompt starts with and the pack source (set
//! on the options page, read by the popup and the studio), the settings of a gallery image to reuse,
//! how long the model stays loaded, and the host permission a pack source other than the Hub needs.
//! Where they are stored is `platform::storage`.

use imagine_core::api::{GenerateRequest, PackSource};
use imagine_core::image::ImageParams;
use imagine_core::params::DEFAULT_KEEP_LOADED_SECONDS;
use imagine_core::ParamError;
use serde::{Deserialize, Serialize};
use wasm_bindgen_futures::JsFuture;

use crate::platform::chrome;
use crate::platform::js::{LogError, Obj};
use crate::platform::storage;

/// The generation settings a new prompt starts with. Not an [`ImageParams`]: there is no prompt or
/// seed yet (each image draws its own), and its JSON in `chrome.storage` keeps the keys it has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Defaults {
    /// Image width in pixels (a multiple of 16, as `generate` takes it).
    pub width: u32,
    /// Image height in pixels (a multiple of 16).
    pub height: u32,
    /// Denoising steps.
    pub steps: u32,
    /// The sigma schedule's API name (`empirical`, `linear-shift`).
    pub schedule: String,
    /// When the options page saved them (milliseconds since the epoch; 0: the built-in ones): the
    /// studio takes them over its own last settings when they are newer.
    #[serde(default)]
    pub saved_at_ms: f64,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults { width: 512, height: 512, steps: 4, schedule: "empirical".into(), saved_at_ms: 0.0 }
    }
}

impl Defaults {
    /// Checks the values as `generate` would (so a saved default is always one `generate` accepts).
    pub fn validate(
        width: Option<i64>,
        height: Option<i64>,
        steps: Option<i64>,
        schedule: String,
    ) -> Result<Defaults, ParamError> {
        let request =
            GenerateRequest { width, height, steps, schedule: Some(schedule), ..Default::default() };
        let params = request.validate(0)?;
        Ok(Defaults {
            width: params.width,
            height: params.height,
            steps: params.steps,
            schedule: params.schedule.name().to_owned(),
            saved_at_ms: 0.0,
        })
    }

    /// A `generate` request for `prompt` with these settings and a random seed.
    pub fn request(&self, prompt: String) -> GenerateRequest {
        GenerateRequest {
            prompt,
            width: Some(self.width.into()),
            height: Some(self.height.into()),
            steps: Some(self.steps.into()),
            schedule: Some(self.schedule.clone()),
            ..Default::default()
        }
    }
}

/// A gallery image's prompt and settings, for the next page that makes images: its parameters as
/// the gallery keeps them (the seed a decimal string in storage, as a JS number would round it).
pub type Reuse = ImageParams;

/// The saved defaults, or the built-in ones.
pub async fn defaults() -> Defaults {
    storage::DEFAULTS.get().await.unwrap_or_default()
}

/// How long the model stays loaded after the last image, in seconds (`keepLoaded`).
pub async fn keep_loaded_seconds() -> u32 {
    storage::KEEP_LOADED.get().await.unwrap_or(DEFAULT_KEEP_LOADED_SECONDS)
}

/// Whether images made from text selected in a private window are kept in the gallery (and notified)
/// like any other; by default they are not (`GenerateRequest::private`).
pub async fn keep_private() -> bool {
    storage::KEEP_PRIVATE.get().await.unwrap_or(false)
}

/// Takes the settings the gallery left, if any (once: they are removed).
pub async fn take_reuse() -> Option<Reuse> {
    let reuse = storage::REUSE.get().await;
    if reuse.is_some() {
        storage::REUSE.remove_or_log().await;
    }
    reuse
}

/// Asks for access to a pack source's host, its checked origin only ([`PackSource::host_permission`]),
/// when it is not the Hub (whose hosts the manifest grants). Must be called synchronously within the
/// click that asks for the download (Chrome's rule for permission requests); the promise resolves once
/// the user answered.
pub fn request_host_permission(source: &PackSource) -> Option<js_sys::Promise> {
    let origins = js_sys::Array::of1(&source.host_permission()?.into());
    chrome::permissions_request(&Obj::new().set("origins", origins).build()).ok()
}

/// Gives back the host permissions granted for pack sources that no longer need them: neither the
/// installed pack's source nor a download's (`in_use`).
pub async fn forget_unused_host_permissions(in_use: &[PackSource]) {
    let in_use: Vec<String> = in_use.iter().filter_map(PackSource::host_permission).collect();
    let strings = |value: wasm_bindgen::JsValue| -> Vec<String> {
        js_sys::Array::from(&value).iter().filter_map(|v| v.as_string()).collect()
    };
    let required = strings(crate::platform::js::get(&chrome::runtime_get_manifest(), "host_permissions"));
    let Ok(granted) = crate::platform::js::settled(chrome::permissions_get_all()).await else { return };
    let granted = strings(crate::platform::js::get(&granted, "origins"));
    let unused = imagine_core::hub::unused_host_permissions(&granted, &in_use, &required);
    if unused.is_empty() {
        return;
    }
    let origins: js_sys::Array = unused.iter().map(|o| wasm_bindgen::JsValue::from_str(o)).collect();
    crate::platform::js::settled(chrome::permissions_remove(&Obj::new().set("origins", origins).build()))
        .await
        .log_error("giving back unused host permissions");
}

/// Waits for the answer to [`request_host_permission`]. Refused or failed is not an error: the
/// download may still work if the mirror allows CORS.
pub async fn host_permission_answered(permission: Option<js_sys::Promise>) {
    if let Some(permission) = permission {
        JsFuture::from(permission).await.warn_on_error("asking for the host permission");
    }
}

#[cfg(test)]
mod tests {
    use imagine_core::api::Seed;

    use super::*;

    /// What the gallery stored for the next page before a reuse was an `ImageParams` (keys in the order
    /// they had then) reads as it did, and is written with the same keys and values.
    #[test]
    fn a_stored_reuse_reads_and_writes_as_before() {
        let old = r#"{"prompt":"a fox","width":256,"height":512,"steps":1,"seed":"18446744073709551615","schedule":"empirical"}"#;
        let reuse: Reuse = serde_json::from_str(old).unwrap();
        let request = reuse.request();
        assert_eq!(
            (request.prompt.as_str(), request.width, request.height, request.steps),
            ("a fox", Some(256), Some(512), Some(1))
        );
        assert_eq!(request.seed, Some(Seed::Text("18446744073709551615".into())));
        assert_eq!(request.schedule.as_deref(), Some("empirical"));
        let value = |json: &str| serde_json::from_str::<serde_json::Value>(json).unwrap();
        assert_eq!(value(&serde_json::to_string(&reuse).unwrap()), value(old));
    }
}

//! Notifications from the service worker: an image or the model download ended while no page of the
//! extension was open to show it. Clicking one opens the studio at that image.

use imagine_core::api::Event;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::platform::chrome;
use crate::platform::i18n;
use crate::platform::js::{settled, JsError, LogError, Obj};
use crate::platform::protocol::StudioFocus;
use crate::platform::side_panel;

/// Notification ids: `imagine-job-<job>` for an image, this one for the download.
const JOB_PREFIX: &str = "imagine-job-";
const DOWNLOAD_ID: &str = "imagine-download";
/// Longest prompt quoted in a notification; the studio shows the whole one.
const QUOTED_CHARS: usize = 120;

/// Whether any page of the extension is open (a tab, the popup, the side panel): then it shows the
/// outcome itself, and no notification is needed.
async fn page_open() -> Result<bool, JsError> {
    let kinds = js_sys::Array::of3(&"TAB".into(), &"POPUP".into(), &"SIDE_PANEL".into());
    let filter = Obj::new().set("contextTypes", kinds).build();
    let contexts = JsFuture::from(chrome::runtime_get_contexts(&filter)?).await?;
    Ok(js_sys::Array::from(&contexts).length() > 0)
}

/// What to say about an event when nobody is looking: (id, title, message), or `None`.
fn notification_for(event: &Event) -> Option<(String, String, String)> {
    match event {
        Event::Result(result) => {
            // A batch ends with its last image; a private one leaves no trace in the system's notifications.
            if result.index + 1 < result.count || result.private {
                return None;
            }
            let title = if result.count > 1 {
                i18n::t_args("notifyImagesReady", &[&result.count.to_string()])
            } else {
                i18n::t("notifyImageReady")
            };
            Some((format!("{JOB_PREFIX}{}", result.job), title, quote(&result.image.prompt)))
        }
        Event::Failed { job, error, message } => Some((
            format!("{JOB_PREFIX}{job}"),
            i18n::t("notifyImageFailed"),
            i18n::error_text(error, message.as_ref()),
        )),
        Event::PackInstalled { .. } => Some((
            DOWNLOAD_ID.to_owned(),
            i18n::t("notifyModelInstalled"),
            i18n::t("notifyModelInstalledText"),
        )),
        // Offline, the download is tried again by itself: that is no end to notify of.
        Event::PackFailed { offline: true, .. } => None,
        Event::PackFailed { error, message, .. } => Some((
            DOWNLOAD_ID.to_owned(),
            i18n::t("notifyDownloadStopped"),
            i18n::error_text(error, message.as_ref()),
        )),
        _ => None,
    }
}

fn quote(prompt: &str) -> String {
    let mut text: String = prompt.chars().take(QUOTED_CHARS).collect();
    if prompt.chars().count() > QUOTED_CHARS {
        text.push('\u{2026}');
    }
    text
}

/// Shows a notification for `event` if it ends something and no page
/// of the extension is open. Notifications are plain text (Chrome does not render HTML in them).
pub async fn after_event(event: &Event) {
    let Some((id, title, message)) = notification_for(event) else { return };
    if page_open().await.unwrap_or(true) {
        return;
    }
    let options = Obj::new()
        .set("type", "basic")
        .set("iconUrl", chrome::runtime_get_url("icons/icon128.png"))
        .set("title", title)
        .set("message", message)
        .build();
    match chrome::notifications_create(&id, &options) {
        Ok(promise) => {
            if let Err(e) = JsFuture::from(promise).await {
                web_sys::console::error_1(&e);
            }
        }
        Err(e) => web_sys::console::error_1(&e),
    }
}

/// `chrome.notifications.onClicked`: opens the studio at the notification's image (or at nothing, for
/// the download). `panel` resolves to whether the side panel opened from the click; if it did not,
/// the studio opens in a tab.
#[wasm_bindgen(js_name = serviceWorkerNotificationClick)]
pub fn service_worker_notification_click(id: String, panel: js_sys::Promise) -> js_sys::Promise {
    wasm_bindgen_futures::future_to_promise(async move {
        let job = id.strip_prefix(JOB_PREFIX).map(str::to_owned);
        if job.is_none() && id != DOWNLOAD_ID {
            return Ok(JsValue::UNDEFINED);
        }
        let opened = JsFuture::from(panel).await.ok().and_then(|v| v.as_bool()).unwrap_or(false);
        let tab = job.as_ref().map_or("studio.html".to_owned(), |job| format!("studio.html?job={job}"));
        side_panel::show(StudioFocus { job, ..Default::default() }, opened, &tab).await;
        settled(chrome::notifications_clear(&id)).await.log_error(&format!("clearing the notification {id}"));
        Ok(JsValue::UNDEFINED)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_prompts_are_cut_with_an_ellipsis() {
        assert_eq!(quote("a cat"), "a cat");
        let long = "x".repeat(200);
        assert_eq!(quote(&long).chars().count(), QUOTED_CHARS + 1);
        assert!(quote(&long).ends_with('\u{2026}'));
    }

    #[test]
    fn a_private_image_is_not_notified() {
        let result = |private: bool| -> Event {
            serde_json::from_value(serde_json::json!({
                "type": "result", "job": "j", "png": "", "prompt": "a private fox", "seed": "1", "width": 256,
                "height": 256, "steps": 1, "schedule": "empirical", "tokenCount": 1, "truncated": false,
                "trace": null, "timings": null, "private": private,
            }))
            .unwrap()
        };
        assert_eq!(notification_for(&result(true)), None);
    }
}

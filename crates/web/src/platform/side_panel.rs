//! Opening the studio at a job (the side panel, or a tab when it cannot open) and the toolbar button's
//! choice between the studio and the quick-prompt popup: used by the service worker, the popup and the
//! gallery. Chrome's side panel is `chrome.sidePanel`; Firefox's is its sidebar (`sidebarAction`),
//! which the toolbar button cannot be set to open: there the background opens it on the button's click
//! (`sw.js`) while no popup is set.

use wasm_bindgen_futures::{spawn_local, JsFuture};

use crate::platform::chrome;
use crate::platform::js::{random_u64, settled, LogError, Obj};
use crate::platform::protocol::{StudioFocus, ToolbarOpens};
use crate::platform::storage;

/// Shows `focus` in the studio: `opened` says whether the side panel opened from the user's gesture;
/// otherwise `fallback` (a page of the extension) opens in a new tab.
pub async fn show(mut focus: StudioFocus, opened: bool, fallback: &str) {
    focus.nonce = random_u64() >> 11;
    storage::STUDIO_FOCUS.set_or_log(&focus).await;
    if !opened {
        let url = chrome::runtime_get_url(fallback);
        settled(chrome::tabs_create(&Obj::new().set("url", url).build())).await.log_error("opening a tab");
    }
}

/// The toolbar button's choice, as stored (the studio by default).
pub async fn toolbar_choice() -> ToolbarOpens {
    storage::TOOLBAR.get().await.unwrap_or_default()
}

/// Makes the toolbar button open the studio (side panel) or the quick-prompt popup. The service worker
/// applies the choice again on install and start-up, so it holds whatever Chrome keeps of it across a
/// restart.
pub async fn apply_toolbar(choice: ToolbarOpens) {
    let studio = choice == ToolbarOpens::Studio;
    let behavior = Obj::new().set("openPanelOnActionClick", studio).build();
    let popup = Obj::new().set("popup", if studio { "" } else { "popup.html" }).build();
    let mut calls = Vec::new();
    if has_side_panel() {
        calls.push(chrome::side_panel_set_panel_behavior(&behavior));
    }
    calls.push(chrome::action_set_popup(&popup));
    for call in calls {
        let done = match call {
            Ok(promise) => JsFuture::from(promise).await.map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            web_sys::console::warn_1(&e);
        }
    }
}

/// Opens the studio in the side panel from a click in a page (the click is the gesture Chrome asks
/// for; the call must happen before anything is awaited), else in a tab. Used by the popup and the
/// gallery ("Reuse").
pub fn open_from_click(then: impl FnOnce() + 'static) {
    let opening = if has_side_panel() {
        chrome::side_panel_open(&Obj::new().set("windowId", chrome::WINDOW_ID_CURRENT).build())
    } else {
        chrome::sidebar_action_open()
    };
    spawn_local(async move {
        let opened = match opening {
            Ok(promise) => JsFuture::from(promise).await.is_ok(),
            Err(_) => false,
        };
        if !opened {
            let url = chrome::runtime_get_url("studio.html");
            settled(chrome::tabs_create(&Obj::new().set("url", url).build()))
                .await
                .log_error("opening the studio in a tab");
        }
        then();
    });
}

/// Whether this is Chrome's side panel (`chrome.sidePanel`) rather than Firefox's sidebar.
fn has_side_panel() -> bool {
    crate::platform::js::has_api("sidePanel")
}

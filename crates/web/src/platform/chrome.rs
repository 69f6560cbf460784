//! The few `chrome.*` extension APIs the contexts use, bound directly (no polyfill).

use js_sys::Promise;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    /// `chrome.runtime.sendMessage(message)`: to every other extension context; resolves to the first reply.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "runtime"], js_name = sendMessage)]
    pub fn runtime_send_message(message: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.runtime.id` (read through [`runtime_id`]).
    #[wasm_bindgen(js_namespace = ["chrome", "runtime"], js_name = id, thread_local_v2)]
    static RUNTIME_ID: String;

    /// `chrome.runtime.getURL(path)`: the `chrome-extension://` URL of a file of the extension.
    #[wasm_bindgen(js_namespace = ["chrome", "runtime"], js_name = getURL)]
    pub fn runtime_get_url(path: &str) -> String;

    /// `chrome.runtime.getContexts(filter)`: the extension's open contexts (to find the offscreen document).
    #[wasm_bindgen(catch, js_namespace = ["chrome", "runtime"], js_name = getContexts)]
    pub fn runtime_get_contexts(filter: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.offscreen.createDocument(parameters)`: opens the offscreen document (one at most).
    #[wasm_bindgen(catch, js_namespace = ["chrome", "offscreen"], js_name = createDocument)]
    pub fn offscreen_create_document(parameters: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.contextMenus.removeAll()`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "contextMenus"], js_name = removeAll)]
    pub fn context_menus_remove_all() -> Result<Promise, JsValue>;

    /// `chrome.contextMenus.create(properties)`: returns the item's id, not a promise.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "contextMenus"], js_name = create)]
    pub fn context_menus_create(properties: &JsValue) -> Result<JsValue, JsValue>;

    /// `chrome.tabs.create(properties)`: opens a tab.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "tabs"], js_name = create)]
    pub fn tabs_create(properties: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.storage.session.get(keys)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "session"], js_name = get)]
    pub fn session_get(keys: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.storage.session.set(items)`: rejects when the session area is full.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "session"], js_name = set)]
    pub fn session_set(items: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.storage.session.remove(keys)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "session"], js_name = remove)]
    pub fn session_remove(keys: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.storage.local.get(keys)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "local"], js_name = get)]
    pub fn local_get(keys: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.storage.local.set(items)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "local"], js_name = set)]
    pub fn local_set(items: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.storage.local.remove(keys)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "storage", "local"], js_name = remove)]
    pub fn local_remove(keys: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.alarms.create(name, info)`: (re)starts the alarm `name`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "alarms"], js_name = create)]
    pub fn alarms_create(name: &str, info: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.alarms.clear(name)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "alarms"], js_name = clear)]
    pub fn alarms_clear(name: &str) -> Result<Promise, JsValue>;

    /// `chrome.action.setBadgeText(details)`: the text on the toolbar button.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "action"], js_name = setBadgeText)]
    pub fn action_set_badge_text(details: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.action.openPopup()`: the toolbar button's popup.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "action"], js_name = openPopup)]
    pub fn action_open_popup() -> Result<Promise, JsValue>;

    /// `chrome.permissions.request(permissions)`: asks the user; only within a user gesture.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "permissions"], js_name = request)]
    pub fn permissions_request(permissions: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.permissions.getAll()`: the permissions the extension holds now.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "permissions"], js_name = getAll)]
    pub fn permissions_get_all() -> Result<Promise, JsValue>;

    /// `chrome.permissions.remove(permissions)`: gives optional permissions back.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "permissions"], js_name = remove)]
    pub fn permissions_remove(permissions: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.runtime.getManifest()`.
    #[wasm_bindgen(js_namespace = ["chrome", "runtime"], js_name = getManifest)]
    pub fn runtime_get_manifest() -> JsValue;

    /// `chrome.notifications.create(id, options)`: shows (or replaces) the notification `id`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "notifications"], js_name = create)]
    pub fn notifications_create(id: &str, options: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.notifications.clear(id)`.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "notifications"], js_name = clear)]
    pub fn notifications_clear(id: &str) -> Result<Promise, JsValue>;

    /// `sidePanel.open()`: only within a user gesture (a click in a page, a menu click, a shortcut).
    #[wasm_bindgen(catch, js_namespace = ["chrome", "sidePanel"], js_name = open)]
    pub fn side_panel_open(options: &JsValue) -> Result<Promise, JsValue>;

    /// Firefox's `sidebarAction.open()` (its side panel): only within a user gesture.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "sidebarAction"], js_name = open)]
    pub fn sidebar_action_open() -> Result<Promise, JsValue>;

    /// `chrome.sidePanel.setPanelBehavior(behavior)`: whether the toolbar button opens the side panel.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "sidePanel"], js_name = setPanelBehavior)]
    pub fn side_panel_set_panel_behavior(behavior: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.action.setPopup(details)`: the page the toolbar button opens (`""`: none).
    #[wasm_bindgen(catch, js_namespace = ["chrome", "action"], js_name = setPopup)]
    pub fn action_set_popup(details: &JsValue) -> Result<Promise, JsValue>;

    /// `chrome.windows.getAll(query)`: the browser's windows, the private (incognito) ones included
    /// where the user allowed the extension in them.
    #[wasm_bindgen(catch, js_namespace = ["chrome", "windows"], js_name = getAll)]
    pub fn windows_get_all(query: &JsValue) -> Result<Promise, JsValue>;
}

/// `chrome.windows.WINDOW_ID_CURRENT`: the window the calling page is in (the last focused one for the
/// service worker).
pub const WINDOW_ID_CURRENT: i32 = -2;

/// `chrome.runtime.id`: this extension's id.
pub fn runtime_id() -> String {
    RUNTIME_ID.with(String::clone)
}

//! The gallery page: every kept image as a grid, newest first, searchable by prompt; a large view
//! with the parameters; reuse (in whatever the toolbar button opens: the studio or the popup), delete
//! one or all, export all as a zip. A single delete can be taken back for [`UNDO_MS`]: the image
//! leaves the grid at once and is deleted when that time is up (or the page closes).
//!
//! While the large view is open the page's URL carries `?view=<id>`, which is how the service worker
//! knows not to drop that image when the gallery is over its limit (`gallery::viewed_ids`). Thumbnails
//! are read straight from the PNG files in OPFS (same origin), so no image is copied through messages
//! to draw the grid; every change goes through the message API.

use std::cell::RefCell;

use imagine_core::api::{Event, GalleryListRequest, Reply, Request};
use imagine_core::gallery::{self, GalleryItem, EXPORT_DIR, EXPORT_FILE, GALLERY_DIR};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::spawn_local;
use web_sys::{HtmlAnchorElement, HtmlButtonElement, HtmlElement, HtmlImageElement, HtmlInputElement};

use crate::pages::view::{
    self, child, document, dom, element, fill_definitions, from_template, on, on_item_click, set_text,
    set_visible, show_png,
};
use crate::platform::i18n::{self, t, t_args, TimeUnit};
use crate::platform::js::{from_js, get, settled, sleep_ms, to_js, LogError};
use crate::platform::messaging::request;
use crate::platform::opfs;
use crate::platform::protocol::ToolbarOpens;
use crate::platform::settings::Reuse;
use crate::platform::side_panel::{self, toolbar_choice};
use crate::platform::storage;

/// How long "Undo" is offered after a single delete, before the image is deleted for good.
const UNDO_MS: u64 = 6_000;

#[derive(Default)]
struct State {
    /// The image deleted on this page, still offered back ("Undo"): hidden here, not yet deleted.
    pending_delete: Option<GalleryItem>,
    /// The gallery's use as last listed (before a pending deletion): count, bytes, its limit.
    usage: Option<(u32, u64, imagine_core::gallery::GalleryLimit)>,
    /// What the grid shows, newest first.
    items: Vec<GalleryItem>,
    /// Object URLs of the thumbnails, revoked when the grid is redrawn.
    urls: Vec<String>,
    /// The item in the large view.
    viewing: Option<GalleryItem>,
    /// Bumped on each reload, so an older reply that arrives late is dropped.
    generation: u32,
    /// What the toolbar button opens, and so what "Reuse" fills: known before the click, in which the
    /// side panel must be opened before anything is awaited.
    toolbar: ToolbarOpens,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Entry point of `gallery.js`.
#[wasm_bindgen(js_name = galleryPageMain)]
pub fn gallery_page_main() {
    i18n::localize_page();
    on("search", "input", |_| spawn_local(reload()));
    on("more", "click", |_| spawn_local(load_more()));
    on("export", "click", |_| spawn_local(export()));
    on("clear", "click", |_| ask_clear());
    on("confirm-yes", "click", |_| {
        dialog("confirm").close();
        spawn_local(clear());
    });
    on("confirm-no", "click", |_| dialog("confirm").close());
    on("reuse", "click", |_| reuse());
    on("delete", "click", |_| spawn_local(delete_viewed()));
    on("undo", "click", |_| spawn_local(undo()));
    // Closed within the undo time: the deletion is sent as the page goes (not awaited: it is on its way
    // before the page is gone).
    let flush = Closure::<dyn Fn()>::new(|| {
        if let Some(item) = STATE.with_borrow_mut(|s| s.pending_delete.take()) {
            crate::platform::chrome::runtime_send_message(&to_js(&Request::GalleryDelete { id: item.id }))
                .log_error("deleting the image as the page closes");
        }
    });
    if let Some(window) = web_sys::window() {
        window
            .add_event_listener_with_callback("pagehide", flush.as_ref().unchecked_ref())
            .log_error("no pagehide listener");
    }
    flush.forget();
    on("viewer-close", "click", |_| dialog("viewer").close());
    on("viewer", "close", |_| viewer_closed());
    on_item_click("grid", ".thumb[data-id]", |thumb| {
        if let Some(id) = thumb.get_attribute("data-id") {
            spawn_local(open(id));
        }
    });
    spawn_local(async {
        // Before the large view can open, and so before "Reuse" can be clicked.
        let toolbar = toolbar_choice().await;
        STATE.with_borrow_mut(|s| s.toolbar = toolbar);
        reload().await;
        let view = web_sys::window()
            .and_then(|w| w.location().search().ok())
            .and_then(|search| web_sys::UrlSearchParams::new_with_str(&search).ok())
            .and_then(|params| params.get("view"));
        if let Some(id) = view {
            open(id).await;
        }
    });
}

/// `chrome.runtime.onMessage` on the gallery page: a new image shows up at once, one deleted elsewhere
/// goes (and its large view with it).
#[wasm_bindgen(js_name = galleryPageEvent)]
pub fn gallery_page_event(message: JsValue) {
    let event = from_js::<Event>(&message);
    if let Ok(Event::GalleryDeleted { ids, all }) = &event {
        let viewed = STATE.with_borrow(|s| s.viewing.as_ref().map(|i| i.id.clone()));
        if viewed.is_some_and(|id| *all || ids.contains(&id)) {
            dialog("viewer").close();
        }
        // This page's own deletions have left its grid already.
        if STATE.with_borrow(|s| s.items.iter().any(|item| *all || ids.contains(&item.id))) {
            spawn_local(reload_keeping_focus());
        }
    }
    if let Ok(Event::Result(result)) = event {
        // The service worker stores the image when it gets the same event: wait until it is listed.
        spawn_local(async move {
            for _ in 0..20 {
                reload().await;
                // A search the new prompt may not match: one reload is all it needs.
                if query().is_some() || STATE.with_borrow(|s| s.items.iter().any(|i| i.id == result.job)) {
                    return;
                }
                sleep_ms(250).await;
            }
        });
    }
}

/// `chrome.storage.onChanged` on the gallery page: follows the toolbar button's choice, which the
/// studio may change while this page is open.
#[wasm_bindgen(js_name = galleryStorageChanged)]
pub fn gallery_storage_changed(changes: JsValue, area: String) {
    let change = get(&changes, storage::TOOLBAR.name());
    if area != "local" || change.is_undefined() {
        return;
    }
    // Removed, it is the default again.
    let toolbar = from_js::<ToolbarOpens>(&get(&change, "newValue")).unwrap_or_default();
    STATE.with_borrow_mut(|s| s.toolbar = toolbar);
}

fn dialog(id: &str) -> web_sys::HtmlDialogElement {
    element(id)
}

fn show_error(error: Option<&str>) {
    set_text("gallery-error", error.unwrap_or_default());
    set_visible("gallery-error", error.is_some());
}

fn query() -> Option<String> {
    Some(element::<HtmlInputElement>("search").value()).filter(|q| !q.trim().is_empty())
}

/// Redraws the grid from the first page.
async fn reload() {
    let generation = STATE.with_borrow_mut(|s| {
        s.generation += 1;
        for url in s.urls.drain(..) {
            web_sys::Url::revoke_object_url(&url).log_error("releasing a thumbnail");
        }
        s.items.clear();
        s.generation
    });
    element::<HtmlElement>("grid").set_text_content(None);
    fetch_page(generation, 0).await;
}

async fn load_more() {
    let (generation, offset) = STATE.with_borrow(|s| (s.generation, s.items.len()));
    fetch_page(generation, offset as i64).await;
}

async fn fetch_page(generation: u32, offset: i64) {
    let list = GalleryListRequest { query: query(), offset: Some(offset), limit: None };
    let page = match request(&Request::GalleryList(list)).await {
        Reply::Gallery(page) => page,
        Reply::Error { error, message } => {
            return view::show_error_in("gallery-error", Some((&error, message.as_ref())))
        }
        other => return show_error(Some(&format!("{other:?}"))),
    };
    if STATE.with_borrow(|s| s.generation) != generation {
        return;
    }
    show_error(None);
    STATE.with_borrow_mut(|s| s.usage = Some((page.count, page.bytes_used, page.limit)));
    show_usage();
    let pending = STATE.with_borrow(|s| s.pending_delete.as_ref().map(|item| item.id.clone()));
    let items: Vec<GalleryItem> =
        page.items.into_iter().filter(|item| Some(&item.id) != pending.as_ref()).collect();
    for item in &items {
        add_thumbnail(item);
    }
    let shown = STATE.with_borrow_mut(|s| {
        s.items.extend(items);
        s.items.len()
    });
    set_visible("empty", page.count == 0);
    set_visible("more", (shown as u32) < page.total);
    if page.count > 0 && page.total == 0 {
        set_text("usage", &t_args("galleryNoMatch", &[&page.count.to_string()]));
    }
}

/// "3 images, 421 KB used...", as the gallery will be once a deletion still offered back is done.
fn show_usage() {
    let Some((count, bytes, limit)) = STATE.with_borrow(|s| {
        let (count, bytes, limit) = s.usage?;
        let pending = s.pending_delete.as_ref().map_or((0, 0), |item| (1, item.bytes));
        Some((count.saturating_sub(pending.0), bytes.saturating_sub(pending.1), limit))
    }) else {
        return;
    };
    set_text(
        "usage",
        &t_args(
            "galleryUsage",
            &[
                &i18n::count_images(count),
                &i18n::bytes(bytes),
                &i18n::count_images(limit.max_items),
                &i18n::bytes(limit.max_bytes),
            ],
        ),
    );
}

fn add_thumbnail(item: &GalleryItem) {
    let card = from_template("card-template");
    dom::set_attr(&child::<HtmlElement>(&card, ".thumb"), "data-id", &item.id);
    let img: HtmlImageElement = child(&card, "img");
    // The prompt is set as an attribute's text, never parsed as HTML.
    img.set_alt(&item.image.prompt);
    img.set_width(item.image.width);
    img.set_height(item.image.height);
    dom::append(&element::<HtmlElement>("grid"), &card);
    let id = item.id.clone();
    spawn_local(async move {
        let Ok(dir) = opfs::dir(GALLERY_DIR, false).await else { return };
        let Ok(file) = opfs::file(&dir, &gallery::image_file(&id)).await else { return };
        if let Ok(url) = web_sys::Url::create_object_url_with_blob(&file) {
            img.set_src(&url);
            STATE.with_borrow_mut(|s| s.urls.push(url));
        }
    });
}

/// Opens the large view of `id`.
async fn open(id: String) {
    let (item, png) = match request(&Request::GalleryImage { id: id.clone() }).await {
        Reply::GalleryImage { item, png } => (item, png),
        Reply::Error { error, message } => {
            return view::show_error_in("gallery-error", Some((&error, message.as_ref())))
        }
        _ => return,
    };
    show_png("viewer-image", "viewer-save", &png, &item.image.prompt, item.image.seed);
    set_text("viewer-prompt", &item.image.prompt);
    set_text("viewer-status", "");
    show_params(&item);
    set_view_url(Some(&item.id));
    STATE.with_borrow_mut(|s| s.viewing = Some(item));
    let viewer = dialog("viewer");
    if !viewer.open() {
        viewer.show_modal().log_error("opening the large view");
    }
}

fn show_params(item: &GalleryItem) {
    let list = element::<HtmlElement>("viewer-params");
    list.set_text_content(None);
    // In the page's language (its messages'), not the browser's default locale.
    let created = js_sys::Date::new(&JsValue::from_f64(item.created)).to_locale_string(
        &t("pageLanguage"),
        &crate::platform::js::Obj::new().set("dateStyle", "medium").set("timeStyle", "short").build(),
    );
    let mut rows = vec![
        (t("seed"), item.image.seed.to_string()),
        (t("gallerySize"), format!("{} \u{00d7} {}", item.image.width, item.image.height)),
        (t("steps"), item.image.steps.to_string()),
        (t("schedule"), crate::pages::view::schedule_name(&item.image.schedule)),
        (t("galleryCreated"), String::from(created)),
        (t("galleryFileSize"), i18n::bytes(item.bytes)),
    ];
    if let Some(timings) = &item.timings {
        rows.push((t("galleryTime"), i18n::duration(timings.total_ms / 1000.0, TimeUnit::Seconds, 1)));
    }
    fill_definitions(&list, rows);
    // Which model version made it: for a bug report, not for the eye (behind "Details").
    let technical = element::<HtmlElement>("viewer-technical");
    technical.set_text_content(None);
    if let Some(commit) = &item.pack_commit {
        fill_definitions(&technical, vec![(t("galleryPack"), commit.chars().take(12).collect())]);
    }
    crate::pages::view::set_visible("viewer-more", item.pack_commit.is_some());
}

/// Puts `?view=<id>` in the page's URL (or takes it out), without reloading.
fn set_view_url(id: Option<&str>) {
    let Some(window) = web_sys::window() else { return };
    let url = match id {
        Some(id) => format!("gallery.html?view={id}"),
        None => "gallery.html".to_owned(),
    };
    if let Ok(history) = window.history() {
        history.replace_state_with_url(&JsValue::NULL, "", Some(&url)).log_error("marking the viewed image");
    }
}

fn viewer_closed() {
    set_view_url(None);
    let id = STATE.with_borrow_mut(|s| s.viewing.take().map(|i| i.id));
    // Focus goes back to the thumbnail the view was opened from.
    if let Some(id) = id {
        if let Ok(Some(button)) = document().query_selector(&format!("button.thumb[data-id=\"{id}\"]")) {
            dom::focus(&button.unchecked_into::<HtmlElement>());
        }
    }
}

/// "Reuse prompt and settings": leaves them for the page the toolbar button opens and opens it. The
/// studio is opened at once (the side panel, within the click, else a tab) and takes them when they
/// are stored; the popup is opened once they are stored, where the browser allows it (otherwise they
/// wait there).
fn reuse() {
    let Some(item) = STATE.with_borrow(|s| s.viewing.clone()) else { return };
    let reuse: Reuse = item.image;
    let toolbar = STATE.with_borrow(|s| s.toolbar);
    if toolbar == ToolbarOpens::Studio {
        side_panel::open_from_click(|| {});
    }
    spawn_local(async move {
        if let Err(e) = storage::REUSE.set(&reuse).await {
            set_text("viewer-status", &e.to_string());
            return;
        }
        match toolbar {
            ToolbarOpens::Studio => set_text("viewer-status", &t("galleryReusedStudio")),
            ToolbarOpens::Popup => {
                set_text("viewer-status", &t("galleryReused"));
                settled(crate::platform::chrome::action_open_popup())
                    .await
                    .warn_on_error("opening the popup");
            }
        }
    });
}

/// "Delete" in the large view: the image leaves the grid at once, "Undo" is offered for [`UNDO_MS`],
/// then it is deleted. An earlier deletion still offered back is carried out first.
async fn delete_viewed() {
    let Some(item) = STATE.with_borrow(|s| s.viewing.clone()) else { return };
    let id = item.id.clone();
    commit_delete().await;
    let index = STATE.with_borrow_mut(|s| {
        s.pending_delete = Some(item);
        let index = s.items.iter().position(|i| i.id == id);
        s.items.retain(|i| i.id != id);
        index.unwrap_or(0)
    });
    show_usage();
    dialog("viewer").close();
    if let Ok(Some(thumb)) = document().query_selector(&format!("#grid button.thumb[data-id=\"{id}\"]")) {
        if let Some(card) = thumb.parent_element() {
            card.remove();
        }
    }
    set_visible("undo-bar", true);
    // The thumbnail the view was opened from is gone: the focus goes to the one that took its place
    // (or the last), else to "Undo".
    let thumbs = document().query_selector_all("#grid button.thumb").ok();
    let near = thumbs.and_then(|t| t.item((index as u32).min(t.length().saturating_sub(1))));
    match near {
        Some(thumb) => focus(thumb.unchecked_into()),
        None => focus(element("undo")),
    }
    sleep_ms(UNDO_MS).await;
    if STATE.with_borrow(|s| s.pending_delete.as_ref().is_some_and(|item| item.id == id)) {
        commit_delete().await;
    }
}

/// Deletes the image still offered back, if any.
async fn commit_delete() {
    let Some(item) = STATE.with_borrow_mut(|s| s.pending_delete.take()) else { return };
    set_visible("undo-bar", false);
    match request(&Request::GalleryDelete { id: item.id }).await {
        Reply::Error { error, message } => {
            view::show_error_in("gallery-error", Some((&error, message.as_ref())))
        }
        _ => reload_keeping_focus().await,
    }
}

/// "Undo": the image deleted last comes back, with the focus on it.
async fn undo() {
    let Some(item) = STATE.with_borrow_mut(|s| s.pending_delete.take()) else { return };
    let id = item.id;
    set_visible("undo-bar", false);
    reload().await;
    match document().query_selector(&format!("#grid button.thumb[data-id=\"{id}\"]")) {
        Ok(Some(thumb)) => focus(thumb.unchecked_into()),
        _ => focus(element("search")),
    }
}

/// Redraws the grid, the focus staying on the thumbnail it was on (if that is still there).
async fn reload_keeping_focus() {
    let focused = document().active_element().and_then(|e| e.get_attribute("data-id"));
    reload().await;
    if let Some(id) = focused {
        if let Ok(Some(thumb)) = document().query_selector(&format!("#grid button.thumb[data-id=\"{id}\"]")) {
            focus(thumb.unchecked_into());
        }
    }
}

fn focus(element: HtmlElement) {
    dom::focus(&element);
}

fn ask_clear() {
    let count = STATE.with_borrow(|s| s.items.len());
    if count == 0 && query().is_none() {
        return;
    }
    set_text("confirm-text", &t("galleryClearQuestion"));
    let confirm = dialog("confirm");
    confirm.show_modal().log_error("asking before deleting all");
    // The safe choice has the focus.
    dom::focus(&element::<HtmlButtonElement>("confirm-no"));
}

async fn clear() {
    match request(&Request::GalleryClear {}).await {
        Reply::Error { error, message } => {
            view::show_error_in("gallery-error", Some((&error, message.as_ref())))
        }
        _ => reload().await,
    }
    dom::focus(&element::<HtmlButtonElement>("export"));
}

/// Asks for the zip, then hands it to the browser's download and removes the OPFS copy.
async fn export() {
    set_text("usage", &t("galleryExporting"));
    let (file, images) = match request(&Request::GalleryExport {}).await {
        Reply::GalleryExport { file, images, .. } => (file, images),
        Reply::Error { error, message } => {
            return view::show_error_in("gallery-error", Some((&error, message.as_ref())))
        }
        _ => return,
    };
    let saved = async {
        let dir = opfs::dir(EXPORT_DIR, false).await?;
        let bytes = opfs::read(&dir, EXPORT_FILE).await?;
        opfs::remove(&dir, EXPORT_FILE).await?;
        Ok::<_, opfs::OpfsError>(bytes)
    };
    let bytes = match saved.await {
        Ok(bytes) => bytes,
        Err(e) => return show_error(Some(&format!("{file}: {e}"))),
    };
    let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(bytes.as_slice()));
    let options = web_sys::BlobPropertyBag::new();
    options.set_type("application/zip");
    let Ok(blob) = web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &options) else {
        return;
    };
    let Ok(url) = web_sys::Url::create_object_url_with_blob(&blob) else { return };
    if let Ok(link) = document().create_element("a") {
        let link: HtmlAnchorElement = link.unchecked_into();
        link.set_href(&url);
        link.set_download("imagine-gallery.zip");
        link.click();
    }
    set_text(
        "usage",
        &t_args("galleryExported", &[&i18n::count_images(images), &i18n::bytes(bytes.len() as u64)]),
    );
    STATE.with_borrow_mut(|s| s.urls.push(url));
}

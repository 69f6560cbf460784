//! The offscreen document, the page the workers run in, opened by the background. Chrome opens it with
//! `chrome.offscreen`; Firefox has no offscreen documents, but its background is itself a page (an event
//! page), so the same `offscreen.html` is opened there as an iframe. Messages, senders and workers are
//! the same in both.

use js_sys::Array;
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;

use crate::platform::chrome;
use crate::platform::js::{JsError, Obj};

const PAGE: &str = "offscreen.html";

/// Whether this browser has offscreen documents; where not (Firefox), the background is a page.
fn has_offscreen_api() -> bool {
    crate::platform::js::has_api("offscreen")
}

/// Whether Firefox's background page holds the offscreen document's frame.
fn has_frame() -> bool {
    let document = web_sys::window().and_then(|w| w.document());
    document.is_some_and(|d| d.query_selector(&format!("iframe[src='{PAGE}']")).ok().flatten().is_some())
}

/// Whether the offscreen document is open (it may still be loading).
pub async fn exists() -> Result<bool, JsError> {
    if !has_offscreen_api() {
        return Ok(has_frame());
    }
    let filter = Obj::new().set("contextTypes", Array::of1(&"OFFSCREEN_DOCUMENT".into())).build();
    let contexts = JsFuture::from(chrome::runtime_get_contexts(&filter)?).await?;
    Ok(Array::from(&contexts).length() > 0)
}

/// Opens the offscreen document; resolves once it has loaded (its listener takes messages then).
/// Callers make sure only one opening runs at a time.
pub async fn open() -> Result<(), JsError> {
    if !has_offscreen_api() {
        return open_frame().await;
    }
    let parameters = Obj::new()
        .set("url", PAGE)
        .set("reasons", Array::of1(&"WORKERS".into()))
        .set("justification", "Runs the image model in dedicated workers (WebGPU) and stores the model pack.")
        .build();
    match JsFuture::from(chrome::offscreen_create_document(&parameters)?).await {
        Ok(_) => Ok(()),
        // Another context created it meanwhile.
        Err(e) => match JsError::from(e) {
            e if e.message.contains("single offscreen document") => Ok(()),
            e => Err(e),
        },
    }
}

async fn open_frame() -> Result<(), JsError> {
    let no_page =
        || JsError::from(JsValue::from_str("the background has neither chrome.offscreen nor a page"));
    let document = web_sys::window().and_then(|w| w.document()).ok_or_else(no_page)?;
    let body = document.body().ok_or_else(no_page)?;
    let frame = document.create_element("iframe")?;
    let loaded = js_sys::Promise::new(&mut |resolve, _| {
        let _ = frame.add_event_listener_with_callback("load", &resolve);
    });
    frame.set_attribute("src", PAGE)?;
    body.append_child(&frame)?;
    JsFuture::from(loaded).await?;
    Ok(())
}

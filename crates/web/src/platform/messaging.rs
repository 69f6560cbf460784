//! Sending the public API's messages (`imagine_core::api`) between contexts, and telling senders apart.
//! The internal channels are typed in `crate::platform::protocol`.

use imagine_core::api::{Event, Reply, Request, Sender};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::platform::chrome;
use crate::platform::js::{from_js, get_string, to_js, JsError};
use crate::platform::protocol::ProtocolError;

/// Sends a message to every other extension context and waits for the first reply.
pub async fn send(message: &JsValue) -> Result<JsValue, JsError> {
    let promise = chrome::runtime_send_message(message)?;
    Ok(JsFuture::from(promise).await?)
}

/// Broadcasts an event to the service worker and every open page. Nobody listening is not an error.
pub async fn broadcast(event: &Event) {
    let _ = send(&to_js(event)).await;
}

/// Sends a request of the message API (from a page) and returns the service worker's reply.
pub async fn request(request: &Request) -> Reply {
    match send(&to_js(request)).await.map_err(ProtocolError::from).and_then(|reply| from_js(&reply)) {
        Ok(reply) => reply,
        Err(error) => Reply::error(&error),
    }
}

/// Who sent a message (`runtime.onMessage`'s `sender`).
pub fn sender(sender: &JsValue) -> Sender {
    let own_id = crate::platform::chrome::runtime_id();
    let own_origin = crate::platform::chrome::runtime_get_url("");
    let (id, url) = (get_string(sender, "id"), get_string(sender, "url"));
    Sender::classify(&own_id, &own_origin, id.as_deref(), url.as_deref())
}

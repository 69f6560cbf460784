//! What every context builds on: the `chrome.*` and JS bindings, the typed messages between contexts,
//! localized text and errors, the offscreen document (Chrome's, or an iframe in Firefox), stored
//! settings and gallery, WebGPU adapter facts, OPFS, and the Hub client.

pub mod chrome;
pub mod error_messages;
pub mod gpu;
pub mod hub_client;
pub mod i18n;
pub mod js;
pub mod messaging;
pub mod offscreen;
pub mod opfs;
pub mod prompt_encoder;
pub mod protocol;
pub mod settings;
pub mod side_panel;
pub mod storage;

//! The extension's pages: the studio (side panel or tab), the popup, the gallery, the options page and
//! the result page, on one small view layer.

pub mod form_check;
pub mod gallery_page;
pub mod gpu_fit;
pub mod options_page;
pub mod popup;
pub mod result_page;
pub mod setup;
pub mod studio;
pub mod view;

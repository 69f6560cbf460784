//! The service worker: the one typed message API, the job queue and its records, the download intent
//! and its alarms, the gallery in OPFS, the context menu, the toolbar badge, and notifications.

pub mod gallery_store;
pub mod gpu_memory;
pub mod notify;
pub mod records;
pub mod service_worker;

//! Talking to a Hugging Face Hub (or a mirror with its API) from any context: resolve a revision to a
//! commit, list the files at that commit, fetch the pack's small files, and compute the plan.
//! Requests never use the HTTP cache: the pack goes to OPFS, and a 2 GB shard must not be stored twice.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use imagine_core::api::{ConversionCost, PackFile, PackPlan, PackSource};
use imagine_core::graph::pack_conversion::{self, GraphPlan, PackConversionError};
use imagine_core::graph::Limits;
use imagine_core::hub::{self, GraphFiles, HubError};
use imagine_core::pack::{Graph, PackError};
use js_sys::{Function, Promise, Uint8Array};
use thiserror::Error;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortController, AbortSignal, Headers, RequestInit, Response};

use crate::platform::js::{get, now_ms, random_u64, sleep_ms, JsError};

/// Why a request to the Hub failed. [`FetchError::is_transient`] says whether retrying may help.
#[derive(Debug, Error)]
pub enum FetchError {
    /// The request never got an answer (transient).
    #[error("could not reach {url} ({source}): offline, or the server is down?")]
    Unreachable {
        /// The URL asked for.
        url: String,
        /// `fetch`'s rejection.
        source: JsError,
    },
    /// A 404 (fatal).
    #[error("{url} was not found (HTTP 404)")]
    NotFound {
        /// The URL asked for.
        url: String,
    },
    /// Another status than success: transient for 408, 429 and 5xx, fatal otherwise.
    #[error("{url} answered HTTP {status}")]
    Http {
        /// The URL asked for.
        url: String,
        /// The HTTP status of the answer.
        status: u16,
    },
    /// The body stopped coming (transient).
    #[error("downloading {url} was interrupted: {source}")]
    Interrupted {
        /// The URL whose body was being read.
        url: String,
        /// The failed read's error.
        source: JsError,
    },
    /// Nothing came, neither the answer nor more of its body, for the idle timeout, with the connection
    /// open (transient: the request is made again).
    #[error("{url} sent nothing for {seconds} s, so the request was given up")]
    Stalled {
        /// The URL asked for.
        url: String,
        /// The idle timeout that ran out, in seconds.
        seconds: u64,
    },
    /// An answer larger than it may be (fatal).
    #[error("{url} sent more than the {cap} bytes allowed for it")]
    TooLarge {
        /// The URL asked for.
        url: String,
        /// The most bytes allowed for it (its listed size, or a cap for Hub JSON).
        cap: u64,
    },
    /// A file list longer than any pack's (fatal).
    #[error("the file list of {repo} goes on past {pages} pages")]
    TooManyPages {
        /// The Hub repository (`owner/name`).
        repo: String,
        /// The most pages read ([`hub::MAX_TREE_PAGES`]).
        pages: usize,
    },
    /// A file list larger than any pack's, all pages together (fatal).
    #[error(
        "the file list of {repo} holds more than the {cap} bytes allowed for it, all pages together (a \
         pack's lists a few dozen files in a few kB)"
    )]
    ListingTooLarge {
        /// The Hub repository (`owner/name`).
        repo: String,
        /// The most bytes allowed ([`hub::MAX_LISTING_BYTES`]).
        cap: u64,
    },
    /// Transient failures of one Hub request in a row; `last` is the last of them (fatal).
    #[error("{last}; gave up after {attempts} attempts")]
    GaveUp {
        /// The last attempt's failure.
        last: Box<FetchError>,
        /// How many attempts were made.
        attempts: u32,
    },
    /// An answer that is not what the Hub sends, or a file that breaks the plan (fatal).
    #[error(transparent)]
    Hub(#[from] HubError),
    /// A fetched graph that breaks the pack contract (fatal).
    #[error("{graph}: {source}")]
    Graph {
        /// The graph's file name.
        graph: String,
        /// What of the contract it breaks.
        source: PackError,
    },
    /// A float16 pack that cannot be converted to float32 for this GPU (fatal).
    #[error("this GPU has no shader-f16, and the pack cannot be converted to float32 for it: {0}")]
    Conversion(#[from] PackConversionError),
    /// The request could not be made (fatal).
    #[error(transparent)]
    Js(#[from] JsError),
}

impl FetchError {
    /// Whether retrying after a pause may help: the network, a 5xx, a 429. A 404, a 403 or a
    /// malformed answer stay what they are.
    pub fn is_transient(&self) -> bool {
        match self {
            FetchError::Unreachable { .. } | FetchError::Interrupted { .. } | FetchError::Stalled { .. } => {
                true
            }
            FetchError::Http { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }
}

/// How long a request may receive nothing (neither its answer's headers nor more of its body) before it
/// is given up and made again. Nothing is lost by it: a download goes on from its last checkpoint. Long
/// enough for a CDN's first byte of a cold file, short enough that no install waits on a silent server
/// for more than a minute per attempt (with the watch's granularity, at most 37.5 s).
pub const IDLE_TIMEOUT_MS: u64 = 30_000;

/// A file in the OPFS root that shortens [`IDLE_TIMEOUT_MS`] to the milliseconds it holds, so a test
/// need not wait half a minute for each silent server (only the extension writes its OPFS; see
/// `opfs::failpoint` for the same kind of hook).
const IDLE_TIMEOUT_FILE: &str = "idle-timeout-ms";

/// [`IDLE_TIMEOUT_MS`], or less when a test asked for it ([`IDLE_TIMEOUT_FILE`]).
async fn idle_timeout_ms() -> u64 {
    let asked = crate::platform::opfs::test_setting_u64(IDLE_TIMEOUT_FILE).await;
    asked.map_or(IDLE_TIMEOUT_MS, |ms| ms.clamp(100, IDLE_TIMEOUT_MS))
}

/// Gives up on a request once nothing has come for the idle timeout: aborting it makes a pending
/// `fetch` or body read fail at once. Without it a server that sends headers (or some bytes) and then
/// nothing, with the connection open, would hold the install for ever. One timer per request, checking
/// four times per timeout, rather than one per read.
pub struct IdleWatch {
    controller: AbortController,
    last: Rc<Cell<f64>>,
    fired: Rc<Cell<bool>>,
    idle_ms: u64,
    interval: JsValue,
    _tick: Closure<dyn FnMut()>,
}

impl IdleWatch {
    fn start(idle_ms: u64) -> Result<IdleWatch, JsError> {
        let controller = AbortController::new()?;
        let last = Rc::new(Cell::new(now_ms()));
        let fired = Rc::new(Cell::new(false));
        let tick = {
            let (controller, last, fired) = (controller.clone(), last.clone(), fired.clone());
            Closure::<dyn FnMut()>::new(move || {
                if !fired.get() && now_ms() - last.get() >= idle_ms as f64 {
                    fired.set(true);
                    controller.abort();
                }
            })
        };
        let global = js_sys::global();
        let set_interval: Function = get(&global, "setInterval").unchecked_into();
        let every = JsValue::from_f64((idle_ms / 4).max(25) as f64);
        let interval = set_interval.call2(&global, tick.as_ref(), &every)?;
        Ok(IdleWatch { controller, last, fired, idle_ms, interval, _tick: tick })
    }

    /// Something came: the silence starts again from now.
    pub fn touch(&self) {
        self.last.set(now_ms());
    }

    fn signal(&self) -> AbortSignal {
        self.controller.signal()
    }

    /// The stall, when this watch gave the request up (what made it fail, rather than the network).
    pub fn stall(&self, url: &str) -> Option<FetchError> {
        self.fired
            .get()
            .then(|| FetchError::Stalled { url: url.to_owned(), seconds: self.idle_ms.div_ceil(1000) })
    }

    /// A failure of the request as a stall when this watch gave it up, else as `otherwise` says.
    fn explain(&self, url: &str, otherwise: impl FnOnce() -> FetchError) -> FetchError {
        self.stall(url).unwrap_or_else(otherwise)
    }

    /// Ends the request: its connection is closed, whatever is still pending fails.
    pub fn abort(&self) {
        self.controller.abort();
    }
}

impl Drop for IdleWatch {
    fn drop(&mut self) {
        let global = js_sys::global();
        let clear_interval: Function = get(&global, "clearInterval").unchecked_into();
        let _ = clear_interval.call1(&global, &self.interval);
    }
}

/// `GET url`, from byte `from` on when given; the response is returned whatever its status, with the
/// watch that gives it up when it goes silent (touch it as the body comes). A response that was
/// redirected elsewhere than `https://` (or `http://` on this machine) is refused unread.
pub async fn fetch(url: &str, from: Option<u64>) -> Result<(Response, IdleWatch), FetchError> {
    let watch = IdleWatch::start(idle_timeout_ms().await)?;
    let init = RequestInit::new();
    init.set_cache(web_sys::RequestCache::NoStore);
    init.set_signal(Some(&watch.signal()));
    if let Some(from) = from {
        let headers = Headers::new().map_err(JsError::from)?;
        headers.set("Range", &format!("bytes={from}-")).map_err(JsError::from)?;
        init.set_headers(&headers);
    }
    let global = js_sys::global();
    let fetch: Function = get(&global, "fetch").unchecked_into();
    let promise: Promise = fetch.call2(&global, &url.into(), &init).map_err(JsError::from)?.unchecked_into();
    let response: Response = match JsFuture::from(promise).await {
        Ok(response) => response.unchecked_into(),
        Err(e) => {
            return Err(
                watch.explain(url, || FetchError::Unreachable { url: url.to_owned(), source: e.into() })
            )
        }
    };
    watch.touch();
    if response.redirected() {
        if let Err(refused) = hub::check_redirect(url, &response.url()) {
            watch.abort();
            return Err(refused.into());
        }
    }
    Ok((response, watch))
}

/// The most a Hub API answer other than the file list (a revision) may hold; the file list, all pages
/// together, is held to [`hub::MAX_LISTING_BYTES`]. A larger answer is refused rather than held in memory.
pub const MAX_API_BYTES: u64 = 16 << 20;

/// The whole body of a successful `GET url`, refused past `cap` bytes.
pub async fn fetch_bytes(url: &str, cap: u64) -> Result<Vec<u8>, FetchError> {
    fetch_page(url, cap).await.map(|(bytes, _)| bytes)
}

/// The whole body of a successful `GET url` (at most `cap` bytes), and its `Link` header (how paginated
/// lists go on). A transient failure (the network, a 5xx, a stall) is tried again after a backoff, as a
/// download is, up to [`hub::MAX_ATTEMPTS_WITHOUT_PROGRESS`] attempts.
async fn fetch_page(url: &str, cap: u64) -> Result<(Vec<u8>, Option<String>), FetchError> {
    let mut attempts = 0;
    loop {
        match fetch_page_once(url, cap).await {
            Err(error) if error.is_transient() => {
                attempts += 1;
                if attempts >= hub::MAX_ATTEMPTS_WITHOUT_PROGRESS {
                    return Err(FetchError::GaveUp { last: Box::new(error), attempts });
                }
                let jitter = (random_u64() >> 11) as f64 / (1u64 << 53) as f64;
                sleep_ms(hub::backoff_ms(attempts - 1, jitter)).await;
            }
            done => return done,
        }
    }
}

async fn fetch_page_once(url: &str, cap: u64) -> Result<(Vec<u8>, Option<String>), FetchError> {
    let (response, watch) = fetch(url, None).await?;
    check_status(&response, url)?;
    let link = response.headers().get("link").ok().flatten();
    Ok((read_capped(&response, &watch, url, cap).await?, link))
}

/// Reads a body, refusing it as soon as it goes past `cap` bytes (before reading it, when its
/// `Content-Length` says so).
async fn read_capped(
    response: &Response,
    watch: &IdleWatch,
    url: &str,
    cap: u64,
) -> Result<Vec<u8>, FetchError> {
    let too_large = || FetchError::TooLarge { url: url.to_owned(), cap };
    let announced = response.headers().get("content-length").ok().flatten();
    if announced.and_then(|n| n.trim().parse::<u64>().ok()).is_some_and(|n| n > cap) {
        watch.abort();
        return Err(too_large());
    }
    let Some(body) = response.body() else { return Ok(Vec::new()) };
    let reader: web_sys::ReadableStreamDefaultReader = body.get_reader().unchecked_into();
    let mut bytes = Vec::new();
    loop {
        let chunk = JsFuture::from(reader.read()).await.map_err(|e| {
            watch.explain(url, || FetchError::Interrupted { url: url.to_owned(), source: e.into() })
        })?;
        watch.touch();
        if get(&chunk, "done").as_bool().unwrap_or(true) {
            return Ok(bytes);
        }
        let value: Uint8Array = get(&chunk, "value").unchecked_into();
        if bytes.len() as u64 + u64::from(value.length()) > cap {
            let _ = reader.cancel();
            return Err(too_large());
        }
        let start = bytes.len();
        bytes.resize(start + value.length() as usize, 0);
        value.copy_to(&mut bytes[start..]);
    }
}

/// Classifies a response status: success, worth a retry, or fatal.
pub fn check_status(response: &Response, url: &str) -> Result<(), FetchError> {
    let url = url.to_owned();
    match response.status() {
        200..=299 => Ok(()),
        404 => Err(FetchError::NotFound { url }),
        status => Err(FetchError::Http { url, status }),
    }
}

/// The commit a revision points at, and every file listed at that commit.
pub async fn resolve(source: &PackSource) -> Result<(String, Vec<PackFile>), FetchError> {
    let revision = fetch_bytes(&hub::revision_url(source), MAX_API_BYTES).await?;
    let commit = hub::parse_revision(&revision)?;
    let listing = list(source, &commit).await?;
    Ok((commit, listing))
}

/// Every file listed at `commit`.
async fn list(source: &PackSource, commit: &str) -> Result<Vec<PackFile>, FetchError> {
    // The Hub pages long lists; every page is read before anything is planned, all of them within
    // MAX_LISTING_BYTES.
    let mut pages = Vec::new();
    let mut listed = 0;
    let mut next = Some(hub::tree_url(source, commit));
    while let Some(url) = next {
        if pages.len() == hub::MAX_TREE_PAGES {
            return Err(FetchError::TooManyPages { repo: source.repo.clone(), pages: hub::MAX_TREE_PAGES });
        }
        // A page may hold what the pages before it left of the list's cap.
        let (page, link) = fetch_page(&url, hub::MAX_LISTING_BYTES - listed).await.map_err(|e| match e {
            FetchError::TooLarge { .. } => {
                FetchError::ListingTooLarge { repo: source.repo.clone(), cap: hub::MAX_LISTING_BYTES }
            }
            e => e,
        })?;
        listed += page.len() as u64;
        pages.push(page);
        next = link.map(|link| hub::next_page(&link, &source.endpoint)).transpose()?.flatten();
    }
    let pages: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    Ok(hub::parse_tree_pages(&pages)?)
}

/// Fetches one small file of the pack at `commit` and checks it against the listing.
pub async fn fetch_verified(
    source: &PackSource,
    commit: &str,
    file: &PackFile,
) -> Result<Vec<u8>, FetchError> {
    let bytes = fetch_bytes(&hub::resolve_url(source, commit, &file.path), file.size).await?;
    hub::verify_small(file, &bytes)?;
    Ok(bytes)
}

/// Small files of an earlier attempt, already verified, with the commit they belong to.
#[derive(Debug, Default)]
pub struct KeptFiles {
    /// The commit the files were fetched at; at another commit none of them is used.
    pub commit: String,
    /// The files' bytes by their path in the repository.
    pub files: HashMap<String, Vec<u8>>,
}

/// The plan of an install, fetching the graphs and manifests (small files) it is derived from: at
/// `pinned` when given (a download under way continues at the commit it started from, even if the
/// revision moved since; the revision's commit if that one is gone from the Hub), else at the commit
/// the revision points at. Files in `kept` are reused when they belong to the same commit, so a resume
/// does not fetch them again.
pub async fn plan(
    source: &PackSource,
    pinned: Option<&str>,
    kept: &KeptFiles,
) -> Result<(PackPlan, Vec<GraphFiles>), FetchError> {
    let (commit, listing) = match pinned {
        Some(commit) => match list(source, commit).await {
            Ok(listing) => (commit.to_owned(), listing),
            Err(FetchError::NotFound { .. }) => resolve(source).await?,
            Err(e) => return Err(e),
        },
        None => resolve(source).await?,
    };
    let kept = |path: &str| if kept.commit == commit { kept.files.get(path).cloned() } else { None };
    let mut graphs = Vec::new();
    for (graph, onnx, manifest) in hub::graph_files(source, &commit, &listing)? {
        let onnx = match kept(&onnx.path) {
            Some(bytes) => bytes,
            None => fetch_verified(source, &commit, &onnx).await?,
        };
        let manifest = match manifest {
            Some(file) => Some(match kept(&file.path) {
                Some(bytes) => bytes,
                None => fetch_verified(source, &commit, &file).await?,
            }),
            None => None,
        };
        graphs.push(GraphFiles { graph, onnx, manifest });
    }
    let plan = hub::plan(source, &commit, &listing, &graphs)?;
    Ok((plan, graphs))
}

/// Whether any graph of the pack needs `shader-f16`, and its largest single tensor in bytes.
pub fn device_needs(graphs: &[GraphFiles]) -> Result<(bool, u64), FetchError> {
    let mut needs_f16 = false;
    let mut largest = 0;
    for files in graphs {
        let broken = |source| FetchError::Graph { graph: Graph::file_name(files.graph), source };
        needs_f16 |= imagine_core::pack::declares_float16(&files.onnx).map_err(broken)?;
        largest = largest.max(imagine_core::pack::largest_external_tensor(&files.onnx).map_err(broken)?);
    }
    Ok((needs_f16, largest))
}

/// The float32 rewrites of the pack's float16 graphs for an adapter without `shader-f16` with
/// `limits` (refused, naming the graph, node and operator, when a graph cannot be rewritten).
pub fn conversion_plans(
    graphs: &[GraphFiles],
    plan: &PackPlan,
    limits: Limits,
) -> Result<Vec<GraphPlan>, FetchError> {
    let bytes: Vec<(Graph, &[u8])> = graphs.iter().map(|g| (g.graph, g.onnx.as_slice())).collect();
    let listed: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
    Ok(pack_conversion::plan_pack(&bytes, limits, &listed)?)
}

/// What converting costs on disk and on the GPU.
pub fn conversion_cost(graphs: &[GraphFiles], plan: &PackPlan, plans: &[GraphPlan]) -> ConversionCost {
    let bytes: Vec<(Graph, &[u8])> = graphs.iter().map(|g| (g.graph, g.onnx.as_slice())).collect();
    let sizes: HashMap<&str, u64> = plan.files.iter().map(|f| (f.path.as_str(), f.size)).collect();
    pack_conversion::cost(plans, &bytes, &sizes)
}

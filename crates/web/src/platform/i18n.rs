//! Text shown to users, from `_locales/<lang>/messages.json` through `chrome.i18n`.
//!
//! Static page text is marked in the HTML (`data-i18n` for text, `data-i18n-placeholder`,
//! `data-i18n-title`, `data-i18n-aria-label` for attributes) and filled by [`localize_page`] at
//! startup; text made at run time goes through [`t`] / [`t_args`]. Every key used must exist in the English
//! file, and every locale must have the same keys (tested in `locale_tests`), so a missing string is a test
//! failure, not a blank control. Errors made elsewhere (service worker, workers, the core) come with an
//! `imagine_core::message::Message` beside their English text; [`error_text`] shows it. A message that
//! says something else in Firefox (how to get WebGPU there, where its shortcuts are set) has Firefox's
//! wording under `<key>Firefox`, which Firefox shows instead.

use imagine_core::message::{Arg, Localize, Message};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::platform::js::{LogError, Obj};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = ["chrome", "i18n"], js_name = getMessage)]
    fn get_message(name: &str, substitutions: &JsValue) -> String;

    #[wasm_bindgen(js_namespace = Intl, js_name = NumberFormat)]
    type NumberFormat;
    #[wasm_bindgen(constructor, js_namespace = Intl, js_class = "NumberFormat", catch)]
    fn new(locale: &str, options: &JsValue) -> Result<NumberFormat, JsValue>;
    #[wasm_bindgen(method)]
    fn format(this: &NumberFormat, value: f64) -> String;
}

/// `chrome.i18n.getMessage`, Firefox's wording first in Firefox; `""` for an unknown key.
fn lookup(key: &str, substitutions: &JsValue) -> String {
    if in_firefox() {
        let firefox = get_message(&format!("{key}Firefox"), substitutions);
        if !firefox.is_empty() {
            return firefox;
        }
    }
    get_message(key, substitutions)
}

/// Whether this is Firefox, whose extension pages are `moz-extension:` ones.
fn in_firefox() -> bool {
    crate::platform::chrome::runtime_get_url("").starts_with("moz-extension:")
}

/// The message `key` in the browser's language (English where that language has no file).
pub fn t(key: &str) -> String {
    t_args(key, &[])
}

/// "1 image" or "N images", in the page's language (`chrome.i18n` has no plurals).
pub fn count_images(count: impl Into<u64>) -> String {
    match count.into() {
        1 => t("countImageOne"),
        n => t_args("countImages", &[&n.to_string()]),
    }
}

/// "1 step" or "N steps", in the page's language.
pub fn count_steps(count: u32) -> String {
    match count {
        1 => t("countStepOne"),
        n => t_args("countSteps", &[&n.to_string()]),
    }
}

/// `text`, a number written in English ("6.5 GB"), with its decimal point as the browser's language
/// writes it ("6,5 GB" in German), and a no-break space before its unit: a line never ends between
/// "+0,9" and "GB".
pub fn number(text: &str) -> String {
    let text = text.replace(' ', "\u{a0}");
    // From the messages, not `getUILanguage`: Chrome may show one language's messages while it reports
    // another (headless with `--lang`).
    match t("numberDecimalPoint").as_str() {
        "." | "numberDecimalPoint" => text,
        point => text.replacen('.', point, 1),
    }
}

/// The unit of a [`duration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// "s".
    Seconds,
    /// "min".
    Minutes,
    /// "h".
    Hours,
}

/// A duration as the pages write it: `value` through `Intl.NumberFormat` in the page's language
/// (its decimal mark, exactly `fraction_digits` after it), then the unit's symbol after a no-break
/// space ("12,9 s" in German): a line never ends between the number and its unit.
pub fn duration(value: f64, unit: TimeUnit, fraction_digits: u8) -> String {
    let symbol = t(match unit {
        TimeUnit::Seconds => "unitSeconds",
        TimeUnit::Minutes => "unitMinutes",
        TimeUnit::Hours => "unitHours",
    });
    let digits = u32::from(fraction_digits);
    let options =
        Obj::new().set("minimumFractionDigits", digits).set("maximumFractionDigits", digits).build();
    // The messages' language, as for `number`; Intl knows every language Chrome has messages in.
    let number = NumberFormat::new(&t("pageLanguage"), &options)
        .map(|format| format.format(value))
        .unwrap_or_else(|_| format!("{value:.prec$}", prec = fraction_digits as usize));
    format!("{number}\u{a0}{symbol}")
}

/// A size in bytes as the pages show them ([`imagine_core::hub::format_bytes`], in the page's
/// language's decimal point).
pub fn bytes(bytes: u64) -> String {
    match bytes {
        1 => t("sizeOneByte"),
        0..1000 => t_args("sizeBytes", &[&bytes.to_string()]),
        _ => number(&imagine_core::hub::format_bytes(bytes)),
    }
}

/// The message `key` with `$1`, `$2`, ... replaced by `args`.
pub fn t_args(key: &str, args: &[&str]) -> String {
    let substitutions: js_sys::Array = args.iter().map(|a| JsValue::from_str(a)).collect();
    let text = lookup(key, &substitutions);
    // `getMessage` answers "" for an unknown key; show the key so the gap is visible, not a blank.
    if text.is_empty() {
        key.to_owned()
    } else {
        text
    }
}

/// `message` (an error made in the service worker, a worker or the core) in the browser's language;
/// `None` if the locale lacks one of its keys. Arguments are shown as they are, nested messages
/// localized in turn.
pub fn message(message: &Message) -> Option<String> {
    let args = message
        .args
        .iter()
        .map(|a| match a {
            Arg::Text(text) => Some(text.clone()),
            Arg::Number { number } => Some(self::number(number)),
            Arg::Message(m) => self::message(m),
        })
        .collect::<Option<Vec<String>>>()?;
    let substitutions: js_sys::Array = args.iter().map(|a| JsValue::from_str(a)).collect();
    Some(lookup(&message.key, &substitutions)).filter(|text| !text.is_empty())
}

/// What a page shows for an error: its message in the browser's language, or the English `error` when
/// there is no message (a state stored by an older version) or a key is missing; as a sentence.
pub fn error_text(error: &str, message: Option<&Message>) -> String {
    sentence(&message.and_then(self::message).unwrap_or_else(|| error.to_owned()))
}

/// The sentence a person reads for an error whose own text is technical (a URL, what the browser
/// said, an HTTP status), as a message key; `None` where the error's text is that sentence. The
/// technical text goes behind a "Details" disclosure ([`crate::pages::view::show_error`]).
pub fn plain_key(message: &Message) -> Option<&'static str> {
    let mut keys = Vec::new();
    collect_keys(message, &mut keys);
    let has = |key: &str| keys.iter().any(|k| k == key);
    if has("errSwOffline") {
        Some("plainOffline")
    } else if has("errFetchNotFound") {
        Some("plainNotFound")
    } else if has("errFetchUnreachable") || has("errInterrupted") || has("errFetchStalled") {
        Some("plainUnreachable")
    } else if has("errFetchHttp") || has("errFetchTooLarge") {
        Some("plainServerError")
    } else if [
        "errHubRedirect",
        "errDownloadRangeMismatch",
        "errDownloadNoBody",
        "errDownloadTooLong",
        "errDownloadTooShort",
        "errDownloadOtherLength",
    ]
    .iter()
    .any(|key| has(key))
    {
        Some("plainServerFiles")
    } else if [
        "errText",
        "errFileDetail",
        "errStageExternalData",
        "errSwNotRecorded",
        "errSwOffscreenNotOpened",
        "errGpuAdapter",
    ]
    .iter()
    .any(|key| has(key))
    {
        // What the browser itself said, in its words and language.
        Some("plainBrowser")
    } else {
        None
    }
}

fn collect_keys(message: &Message, keys: &mut Vec<String>) {
    keys.push(message.key.clone());
    for arg in &message.args {
        if let Arg::Message(inner) = arg {
            collect_keys(inner, keys);
        }
    }
}

/// `text` as a sentence: a capital first letter and a full stop at the end. Error messages start
/// small and end open, since one is often quoted inside another ("could not read x: <why>").
pub fn sentence(text: &str) -> String {
    let text = text.trim();
    let mut chars = text.chars();
    let Some(first) = chars.next() else { return String::new() };
    let mut sentence: String = first.to_uppercase().chain(chars).collect();
    if !sentence.ends_with(['.', '!', '?', '\u{2026}']) {
        sentence.push('.');
    }
    sentence
}

/// An error of ours (checked in the page itself) in the browser's language.
pub fn error(error: &(impl Localize + ?Sized)) -> String {
    error_text(&error.to_string(), Some(&error.message()))
}

const ATTRIBUTES: [(&str, &str); 3] = [
    ("data-i18n-placeholder", "placeholder"),
    ("data-i18n-title", "title"),
    ("data-i18n-aria-label", "aria-label"),
];

/// Fills every marked element of the current page and sets `<html lang>` to the language of its
/// messages.
pub fn localize_page() {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else { return };
    if let Some(html) = document.document_element() {
        html.set_attribute("lang", &t("pageLanguage")).log_error("setting the page's language");
    }
    for_each(&document, "[data-i18n]", |element| {
        if let Some(key) = element.get_attribute("data-i18n") {
            element.set_text_content(Some(&t(&key)));
        }
    });
    for (marker, attribute) in ATTRIBUTES {
        for_each(&document, &format!("[{marker}]"), |element| {
            if let Some(key) = element.get_attribute(marker) {
                element.set_attribute(attribute, &t(&key)).log_error("translating an attribute");
            }
        });
    }
}

fn for_each(document: &web_sys::Document, selector: &str, mut f: impl FnMut(&web_sys::Element)) {
    let Ok(list) = document.query_selector_all(selector) else { return };
    for i in 0..list.length() {
        if let Some(element) = list.item(i).and_then(|n| n.dyn_into::<web_sys::Element>().ok()) {
            f(&element);
        }
    }
}

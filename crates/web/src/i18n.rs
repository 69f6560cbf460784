//! Text shown to users, from `_locales/<lang>/messages.json` through `chrome.i18n`.
//!
//! Static page text is marked in the HTML (`data-i18n` for text, `data-i18n-placeholder`,
//! `data-i18n-title`, `data-i18n-aria-label` for attributes) and filled by [`localize_page`] at
//! startup; text made at run time goes through [`t`] / [`t_args`]. Every key used must exist in the
//! English file, and every locale must have the same keys (tested below), so a missing string is a
//! test failure, not a blank control.

use imagine_core::message::{Arg, Localize, Message};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = ["chrome", "i18n"], js_name = getMessage)]
    fn get_message(name: &str, substitutions: &JsValue) -> String;

    #[wasm_bindgen(js_namespace = ["chrome", "i18n"], js_name = getUILanguage)]
    fn get_ui_language() -> String;
}

/// The message `key` in the browser's language (English where that language has no file).
pub fn t(key: &str) -> String {
    t_args(key, &[])
}

/// The message `key` with `$1`, `$2`, ... replaced by `args`.
pub fn t_args(key: &str, args: &[&str]) -> String {
    let substitutions: js_sys::Array = args.iter().map(|a| JsValue::from_str(a)).collect();
    let text = get_message(key, &substitutions);
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
            Arg::Message(m) => self::message(m),
        })
        .collect::<Option<Vec<String>>>()?;
    let substitutions: js_sys::Array = args.iter().map(|a| JsValue::from_str(a)).collect();
    Some(get_message(&message.key, &substitutions)).filter(|text| !text.is_empty())
}

/// What a page shows for an error: its message in the browser's language, or the English `error` when
/// there is no message (a state stored by an older version) or a key is missing.
pub fn error_text(error: &str, message: Option<&Message>) -> String {
    message.and_then(self::message).unwrap_or_else(|| error.to_owned())
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

/// Fills every marked element of the current page and sets `<html lang>` to the UI language.
pub fn localize_page() {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else { return };
    if let Some(html) = document.document_element() {
        let _ = html.set_attribute("lang", &get_ui_language());
    }
    for_each(&document, "[data-i18n]", |element| {
        if let Some(key) = element.get_attribute("data-i18n") {
            element.set_text_content(Some(&t(&key)));
        }
    });
    for (marker, attribute) in ATTRIBUTES {
        for_each(&document, &format!("[{marker}]"), |element| {
            if let Some(key) = element.get_attribute(marker) {
                let _ = element.set_attribute(attribute, &t(&key));
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

#[cfg(test)]
mod tests {
    //! The locale files against each other and against every key the code and pages use.

    use std::collections::BTreeSet;
    use std::fs;
    use std::path::{Path, PathBuf};

    fn extension_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../extension")
    }

    fn keys(lang: &str) -> BTreeSet<String> {
        let path = extension_dir().join("_locales").join(lang).join("messages.json");
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let object = value.as_object().expect("messages.json is an object");
        for (key, entry) in object {
            assert!(entry.get("message").and_then(|m| m.as_str()).is_some(), "{lang}: {key} has no message");
        }
        object.keys().cloned().collect()
    }

    fn locales() -> Vec<String> {
        let mut langs: Vec<String> = fs::read_dir(extension_dir().join("_locales"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        langs.sort();
        langs
    }

    /// Every quoted string after `marker` up to the next quote; the marker must not follow a name
    /// character, so that a call of `t` matches and one of `set` does not.
    fn quoted_after(text: &str, marker: &str) -> Vec<String> {
        text.match_indices(marker)
            .filter(|(i, _)| !text[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.'))
            .filter_map(|(i, _)| text[i + marker.len()..].split('"').next().map(str::to_owned))
            .collect()
    }

    fn used_keys() -> BTreeSet<(String, String)> {
        let mut used = BTreeSet::new();
        for entry in fs::read_dir(extension_dir()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "html") {
                let text = fs::read_to_string(&path).unwrap();
                for marker in [
                    "data-i18n=\"",
                    "data-i18n-placeholder=\"",
                    "data-i18n-title=\"",
                    "data-i18n-aria-label=\"",
                ] {
                    for key in quoted_after(&text, marker) {
                        used.insert((path.display().to_string(), key));
                    }
                }
            }
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let text = fs::read_to_string(&path).unwrap();
            for marker in ["t(\"", "t_args(\""] {
                for key in quoted_after(&text, marker) {
                    used.insert((path.display().to_string(), key));
                }
            }
        }
        let manifest =
            fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifest.json")).unwrap();
        for key in quoted_after(&manifest, "__MSG_") {
            used.insert(("manifest.json".into(), key.trim_end_matches("__").to_owned()));
        }
        used
    }

    #[test]
    fn at_least_two_locales_with_the_same_keys() {
        let langs = locales();
        assert!(langs.len() >= 2 && langs.contains(&"en".to_owned()), "locales: {langs:?}");
        let english = keys("en");
        for lang in &langs {
            let other = keys(lang);
            let missing: Vec<_> = english.difference(&other).collect();
            let extra: Vec<_> = other.difference(&english).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{lang}: missing {missing:?}, not in en {extra:?}"
            );
        }
    }

    #[test]
    fn every_key_used_is_in_english() {
        let english = keys("en");
        let unknown: Vec<_> = used_keys().into_iter().filter(|(_, key)| !english.contains(key)).collect();
        assert!(unknown.is_empty(), "keys used but not in _locales/en/messages.json: {unknown:?}");
    }

    #[test]
    fn the_test_finds_keys_in_pages_code_and_manifest() {
        let used: BTreeSet<String> = used_keys().into_iter().map(|(_, key)| key).collect();
        assert!(used.contains("extName") && used.contains("extDescription"), "{used:?}");
    }
}

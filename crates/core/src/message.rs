//! User-visible text as data: a `_locales` message key and its arguments, so that the page that
//! shows an error can say it in the user's language. Errors keep their English `Display` (logs, tests,
//! the API's `error` field) and give the same text as a [`Message`] through [`Localize`]; a test in
//! `imagine-web` renders each variant's message with `_locales/en` and compares it with `Display`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A message key of `_locales/<lang>/messages.json` and the values of its `$1`..`$9`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Message {
    /// The key (`errParamSteps`).
    pub key: String,
    /// `$1`, `$2`, ... in order.
    #[serde(default)]
    pub args: Vec<Arg>,
}

/// One argument: text shown as it is (a file name, a count, what a browser API said), a message of
/// its own (the cause inside a wrapping error), itself localized, or a number with a fraction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Arg {
    /// Shown as it is.
    Text(String),
    /// Localized in turn.
    Message(Message),
    /// A number written in English ("6.5 GB", "+0.9 GB"): a page writes its decimal point as its
    /// language does ("6,5 GB" in German).
    Number {
        /// The text, with a `.` before the fraction.
        number: String,
    },
}

/// The key of [`Message::text`]: its one argument is the whole text, not translated.
pub const TEXT_KEY: &str = "errText";

/// The key of [`quoted`]: its one argument between the language's quote marks.
pub const QUOTED_KEY: &str = "quotedValue";

impl Message {
    /// The message `key` with `args`.
    pub fn new(key: &str, args: impl IntoIterator<Item = Arg>) -> Message {
        Message { key: key.to_owned(), args: args.into_iter().collect() }
    }

    /// Text without a translation (an internal error, or what a library said): shown as it is.
    pub fn text(text: impl fmt::Display) -> Message {
        Message::new(TEXT_KEY, [arg(text)])
    }

    /// The text, given `lookup` from a key to its message (`None` for a key it lacks): `$1`..`$9`
    /// replaced by the arguments (nested messages rendered the same way), `$$` by `$`.
    pub fn render(&self, lookup: &impl Fn(&str) -> Option<String>) -> Option<String> {
        let template = lookup(&self.key)?;
        let args = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Text(text) | Arg::Number { number: text } => Some(text.clone()),
                Arg::Message(m) => m.render(lookup),
            })
            .collect::<Option<Vec<_>>>()?;
        let mut out = String::with_capacity(template.len());
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek().copied()) {
                ('$', Some('$')) => {
                    chars.next();
                    out.push('$');
                }
                ('$', Some(d @ '1'..='9')) => {
                    chars.next();
                    let i = d as usize - '1' as usize;
                    out.push_str(args.get(i).map_or("", String::as_str));
                }
                _ => out.push(c),
            }
        }
        Some(out)
    }

    /// Every key this message uses, its own and its nested messages'.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys = vec![self.key.as_str()];
        for a in &self.args {
            if let Arg::Message(m) = a {
                keys.extend(m.keys());
            }
        }
        keys
    }
}

/// A text argument.
pub fn arg(value: impl fmt::Display) -> Arg {
    Arg::Text(value.to_string())
}

/// A number argument ([`Arg::Number`]): `value` written in English, its decimal point localized by the
/// page.
pub fn number(value: impl fmt::Display) -> Arg {
    Arg::Number { number: value.to_string() }
}

/// A value quoted in the text (a repo, a name someone typed): a nested [`QUOTED_KEY`] message, so that
/// each language puts its own quote marks around it ("a b" in English, „a b“ in German). Escaped as
/// `{value:?}` escapes it, which the English `Display` of such errors writes.
pub fn quoted(value: &str) -> Arg {
    let escaped = format!("{value:?}");
    let inner = &escaped[1..escaped.len() - 1];
    Arg::Message(Message::new(QUOTED_KEY, [Arg::Text(inner.to_owned())]))
}

/// A nested message argument: the cause's own message.
pub fn cause(error: &impl Localize) -> Arg {
    Arg::Message(error.message())
}

/// An error that can be said in the user's language: [`Localize::message`] says the same as `Display`.
pub trait Localize: fmt::Display {
    /// The key and arguments of this error's text.
    fn message(&self) -> Message;
}

/// An error that crossed a channel as data: its English text and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorText {
    /// In English.
    pub error: String,
    /// For the page's language; absent where a JS shim reports its own failure (then `error` is
    /// shown as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
}

impl ErrorText {
    /// Both forms of `error`.
    pub fn of(error: &(impl Localize + ?Sized)) -> ErrorText {
        ErrorText { error: error.to_string(), message: Some(error.message()) }
    }
}

impl fmt::Display for ErrorText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

impl std::error::Error for ErrorText {}

impl Localize for ErrorText {
    fn message(&self) -> Message {
        self.message.clone().unwrap_or_else(|| Message::text(&self.error))
    }
}

impl Localize for serde_json::Error {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_render_nested_arguments_and_dollars() {
        let lookup = |key: &str| match key {
            "outer" => Some("$1; gave up after $2 tries ($$5)".to_owned()),
            "inner" => Some("could not reach $1".to_owned()),
            _ => None,
        };
        let inner = Message::new("inner", [arg("https://x")]);
        let outer = Message::new("outer", [Arg::Message(inner), arg(6)]);
        assert_eq!(outer.render(&lookup).unwrap(), "could not reach https://x; gave up after 6 tries ($5)");
        assert_eq!(outer.keys(), ["outer", "inner"]);
        let json = serde_json::to_string(&outer).unwrap();
        assert_eq!(json, r#"{"key":"outer","args":[{"key":"inner","args":["https://x"]},"6"]}"#);
        assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), outer);
        assert_eq!(Message::new("missing", []).render(&lookup), None);
    }

    #[test]
    fn a_quoted_value_takes_the_languages_quote_marks_escaped_as_debug_escapes_it() {
        let english = |key: &str| match key {
            "k" => Some("repo $1 is refused".to_owned()),
            QUOTED_KEY => Some("\"$1\"".to_owned()),
            _ => None,
        };
        let german = |key: &str| match key {
            "k" => Some("Repo $1 ist abgelehnt".to_owned()),
            QUOTED_KEY => Some("\u{201e}$1\u{201c}".to_owned()),
            _ => None,
        };
        let m = Message::new("k", [quoted("a b")]);
        assert_eq!(m.render(&english).unwrap(), format!("repo {:?} is refused", "a b"));
        assert_eq!(m.render(&german).unwrap(), "Repo \u{201e}a b\u{201c} ist abgelehnt");
        assert_eq!(m.keys(), ["k", QUOTED_KEY]);
        let odd = "say \"hi\"\n";
        let m = Message::new("k", [quoted(odd)]);
        assert_eq!(m.render(&english).unwrap(), format!("repo {odd:?} is refused"));
    }

    #[test]
    fn a_number_renders_as_written_and_keeps_its_kind_through_json() {
        let lookup = |_: &str| Some("$1 of $2".to_owned());
        let m = Message::new("k", [number("6.5 GB"), arg("7")]);
        assert_eq!(m.render(&lookup).unwrap(), "6.5 GB of 7");
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"key":"k","args":[{"number":"6.5 GB"},"7"]}"#);
        assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), m);
    }
}

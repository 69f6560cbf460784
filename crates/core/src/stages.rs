//! The three graphs of one generation, driven through a [`Session`]: the text encoder
//! ([`encode_prompt`]), the transformer's denoising loop ([`denoise`]) and the VAE decoder
//! ([`decode`]), then the picture ([`encode_image`]).
//!
//! Each stage first checks what the graph declares (input and output names, element types, ranks
//! and the fixed sizes the pipeline relies on) and then what the run returns, so a pack that breaks
//! the contract fails with a [`StageError`] naming the graph, the input or output, what it declares
//! and what is expected, rather than deep inside the runtime or as a wrong picture. A declared shape
//! that is absent is not checked (the run still is); symbolic sizes match anything.
//!
//! Numerics (what the reference in `tests/reference/` does, compared bit for bit by the e2e tests):
//! the latents stay f32 between steps; each step feeds them, and `timestep = sigma`, in the float type
//! the graph declares (f16 rounded to nearest even), and updates them with [`euler_step`] in f32.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::Stage;
use crate::image::{encode_png, to_rgba8, ImageError, ImageParams};
use crate::latents::{
    euler_step, image_ids, initial_noise, text_ids, unpack_tokens, unpatchify, LengthError, ID_AXES,
    TOKEN_CHANNELS, VAE_CHANNELS,
};
use crate::message::{arg, Localize, Message};
use crate::pack::Graph;
use crate::params::Backend;
use crate::prompt::{EncodedPrompt, MAX_TOKENS};
use crate::schedule::Schedule;
use crate::session::{DType, Dim, FloatType, Session, SessionError, Tensor, TensorInfo};

/// How much a stage computes between two reports at `pixels`, relative to a 512x512 image: the text
/// encoder's is fixed (512 tokens); a transformer step grows with its tokens and with their attention
/// (tokens squared); the decoder with the pixels and with its attention over every latent pixel.
pub fn quiet_work(stage: Stage, pixels: u64) -> f64 {
    let grown = |ratio: f64| (ratio + ratio * ratio) / 2.0;
    match stage {
        Stage::TextEncoder => 1.0,
        Stage::Transformer => grown((pixels as f64 / 256.0 + 512.0) / (262_144.0 / 256.0 + 512.0)),
        Stage::Decoder => grown(pixels as f64 / 262_144.0),
    }
}

/// The longest a stage went without reporting, on one backend, in jobs that finished, per class of
/// image size ([`QuietTimes::size_class`]): what its stall limit scales with. Kept across restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QuietTimes {
    entries: Vec<QuietTime>,
}

/// One of [`QuietTimes`]'s entries.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct QuietTime {
    stage: Stage,
    backend: Backend,
    /// The size class's pixels.
    pixels: u64,
    longest_ms: f64,
}

impl QuietTimes {
    /// Images are classed by their pixels rounded up to a power of two: 512x512 and 1024x1024 fall in
    /// classes of their own, 768x1024 with 1024x1024.
    pub fn size_class(pixels: u64) -> u64 {
        pixels.max(1).next_power_of_two()
    }

    /// Keeps that `stage` on `backend` went `quiet_ms` without a report in a job of `pixels` that
    /// finished; whether that changed what is kept.
    pub fn note(&mut self, stage: Stage, backend: Backend, pixels: u64, quiet_ms: f64) -> bool {
        if !quiet_ms.is_finite() || quiet_ms < 0.0 {
            return false;
        }
        let pixels = Self::size_class(pixels);
        match self.entries.iter_mut().find(|e| (e.stage, e.backend, e.pixels) == (stage, backend, pixels)) {
            Some(e) if e.longest_ms >= quiet_ms => false,
            Some(e) => {
                e.longest_ms = quiet_ms;
                true
            }
            None => {
                self.entries.push(QuietTime { stage, backend, pixels, longest_ms: quiet_ms });
                true
            }
        }
    }

    /// How long `stage` on `backend` may report nothing in a job of `pixels` before it is ended as
    /// stalled: five times the longest quiet seen in any size class, scaled by the work from that
    /// class's to this size ([`quiet_work`]), at least a minute; while nothing has been seen, ten
    /// minutes scaled by the work from 512x512 (a cold load of the full-size pack on a slow disk and GPU
    /// takes a few minutes at most). A hang found this way is a worker that will never answer: a kernel
    /// that never returns, a read that never settles.
    pub fn stall_limit_ms(&self, stage: Stage, backend: Backend, pixels: u64) -> f64 {
        const UNMEASURED_MS: f64 = 600_000.0;
        const AT_LEAST_MS: f64 = 60_000.0;
        let work = quiet_work(stage, pixels);
        let scaled = self
            .entries
            .iter()
            .filter(|e| (e.stage, e.backend) == (stage, backend))
            .map(|e| 5.0 * e.longest_ms * (work / quiet_work(stage, e.pixels)).max(1.0))
            .fold(None, |most: Option<f64>, ms| Some(most.map_or(ms, |m| m.max(ms))));
        match scaled {
            Some(ms) => ms.max(AT_LEAST_MS),
            None => UNMEASURED_MS * work.max(1.0),
        }
    }
}

/// The smallest stall limit a test may set (the OPFS file `stall-limit-ms`): less, 0 included, would
/// end every stage before its first report, and is refused.
pub const MIN_TEST_STALL_LIMIT_MS: u64 = 1_000;

/// Width of one text token's embedding (three Qwen3 layers of 2560, concatenated).
pub const EMBED_WIDTH: usize = 7680;

/// Whether a value is a graph input or output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// An input.
    Input,
    /// An output.
    Output,
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Port::Input => "input",
            Port::Output => "output",
        })
    }
}

/// What one dimension of a declared shape must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Any size (named as the pack card names it).
    Any(&'static str),
    /// This size, when the graph fixes it.
    Fixed(i64),
}

/// Why a stage refused a graph or failed to run it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StageError {
    /// The graph does not declare an input or output the stage feeds or reads.
    #[error("{} has no {port} named `{name}` (it declares: {})", .graph.file_name(), .declared.join(", "))]
    Missing {
        /// The graph.
        graph: Graph,
        /// Input or output.
        port: Port,
        /// The name looked for.
        name: String,
        /// Every input and output the graph declares, inputs first.
        declared: Vec<String>,
    },
    /// A declared input or output of another element type.
    #[error("{}: {port} `{name}` is {}, expected {expected}", .graph.file_name(), .declared.name())]
    DType {
        /// The graph.
        graph: Graph,
        /// Input or output.
        port: Port,
        /// The input or output.
        name: String,
        /// The type it declares.
        declared: DType,
        /// The types the stage accepts.
        expected: &'static str,
    },
    /// A declared shape of another rank, or with another fixed size where the stage needs one.
    #[error(
        "{}: {port} `{name}` has shape {}, expected {}",
        .graph.file_name(),
        shape_text(.declared),
        expected_text(.expected)
    )]
    Shape {
        /// The graph.
        graph: Graph,
        /// Input or output.
        port: Port,
        /// The input or output.
        name: String,
        /// The shape it declares.
        declared: Vec<Dim>,
        /// The shape the stage needs.
        expected: Vec<Expected>,
    },
    /// A graph (the decoder) that declares more or fewer than one input or output.
    #[error("{} declares {count} {port}s, expected one", .graph.file_name())]
    Count {
        /// The graph.
        graph: Graph,
        /// Inputs or outputs.
        port: Port,
        /// How many it declares.
        count: usize,
    },
    /// A decoder input that takes neither the packed 128-channel nor the unpatchified 32-channel
    /// latents.
    #[error(
        "{}: input `{name}` has shape {}; the decoder must take [batch, 128, height, width] (packed \
         latents) or [batch, 32, height, width] (unpatchified latents)",
        .graph.file_name(),
        shape_text(.declared)
    )]
    DecoderInput {
        /// The graph.
        graph: Graph,
        /// The input.
        name: String,
        /// The shape it declares.
        declared: Vec<Dim>,
    },
    /// A run returned an output of another shape than the stage needs.
    #[error("{}: output `{name}` has shape {found:?}, expected {expected:?}", .graph.file_name())]
    OutputShape {
        /// The graph.
        graph: Graph,
        /// The output.
        name: String,
        /// The shape returned.
        found: Vec<i64>,
        /// The shape needed.
        expected: Vec<i64>,
    },
    /// A run returned integers where the stage reads floats.
    #[error("{}: output `{name}` is {}, expected float32 or float16", .graph.file_name(), .found.name())]
    OutputType {
        /// The graph.
        graph: Graph,
        /// The output.
        name: String,
        /// The type returned.
        found: DType,
    },
    /// The session failed, or returned fewer outputs than asked for.
    #[error("running {} failed: {error}", .graph.file_name())]
    Run {
        /// The graph.
        graph: Graph,
        /// What the session said.
        #[source]
        error: SessionError,
    },
    /// A stage's input from the stage before (embeddings, latents) of the wrong length: a bug
    /// between the stages, not in the pack.
    #[error(transparent)]
    Length(#[from] LengthError),
    /// The picture could not be made.
    #[error(transparent)]
    Image(#[from] ImageError),
}

fn shape_text(dims: &[Dim]) -> String {
    let dims: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Symbolic(name) if name.is_empty() => "?".to_owned(),
            Dim::Symbolic(name) => name.clone(),
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

fn expected_text(dims: &[Expected]) -> String {
    let dims: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Expected::Any(name) => (*name).to_owned(),
            Expected::Fixed(n) => n.to_string(),
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// The declared input or output `name` of `graph`, its shape checked against `shape`.
fn declared<'s>(
    session: &'s impl Session,
    graph: Graph,
    port: Port,
    name: &str,
    shape: &[Expected],
) -> Result<&'s TensorInfo, StageError> {
    let values = match port {
        Port::Input => session.inputs(),
        Port::Output => session.outputs(),
    };
    let info = values.iter().find(|v| v.name == name).ok_or_else(|| StageError::Missing {
        graph,
        port,
        name: name.to_owned(),
        declared: session.inputs().iter().chain(session.outputs()).map(|v| v.name.clone()).collect(),
    })?;
    check_shape(graph, port, info, shape)?;
    Ok(info)
}

/// Checks the rank and the fixed sizes of a declared shape; an undeclared shape passes.
fn check_shape(graph: Graph, port: Port, info: &TensorInfo, expected: &[Expected]) -> Result<(), StageError> {
    let fits = |(dim, want): (&Dim, &Expected)| match (dim, want) {
        // A negative fixed size is ONNX's "unknown".
        (Dim::Fixed(n), Expected::Fixed(m)) => *n < 0 || n == m,
        _ => true,
    };
    let matches = info.shape.len() == expected.len() && info.shape.iter().zip(expected).all(fits);
    if info.shape.is_empty() || matches {
        return Ok(());
    }
    Err(StageError::Shape {
        graph,
        port,
        name: info.name.clone(),
        declared: info.shape.clone(),
        expected: expected.to_vec(),
    })
}

/// The float type of a declared value: float32 or float16, anything else breaks the contract.
fn float_type(graph: Graph, port: Port, info: &TensorInfo) -> Result<FloatType, StageError> {
    match info.dtype {
        DType::Float32 => Ok(FloatType::Float32),
        DType::Float16 => Ok(FloatType::Float16),
        ref other => Err(StageError::DType {
            graph,
            port,
            name: info.name.clone(),
            declared: other.clone(),
            expected: "float32 or float16",
        }),
    }
}

fn require_int64(graph: Graph, port: Port, info: &TensorInfo) -> Result<(), StageError> {
    if info.dtype == DType::Int64 {
        return Ok(());
    }
    Err(StageError::DType {
        graph,
        port,
        name: info.name.clone(),
        declared: info.dtype.clone(),
        expected: "int64",
    })
}

/// Runs `graph` and checks that every output asked for came back.
async fn run(
    session: &mut impl Session,
    graph: Graph,
    feeds: &[(&str, &Tensor)],
    fetches: &[&str],
) -> Result<Vec<Tensor>, StageError> {
    let outputs = session.run(feeds, fetches).await.map_err(|error| StageError::Run { graph, error })?;
    if outputs.len() != fetches.len() {
        let error = SessionError(format!(
            "it returned {} outputs for the {} asked for",
            outputs.len(),
            fetches.len()
        ));
        return Err(StageError::Run { graph, error });
    }
    Ok(outputs)
}

/// The f32 values of the output `name`, which must have shape `expected`.
fn float_values(graph: Graph, name: &str, output: Tensor, expected: &[i64]) -> Result<Vec<f32>, StageError> {
    if output.dims != expected {
        return Err(StageError::OutputShape {
            graph,
            name: name.to_owned(),
            found: output.dims,
            expected: expected.to_vec(),
        });
    }
    let found = output.dtype();
    output.into_f32().ok_or_else(|| StageError::OutputType { graph, name: name.to_owned(), found })
}

/// The first tensor of a [`run`]'s outputs (there is one per fetch).
fn first(outputs: Vec<Tensor>) -> Tensor {
    outputs.into_iter().next().expect("run checks that every fetch has an output")
}

/// Stage 1, the text encoder: `prompt_embeds` `[1, tokens, 7680]` of an encoded prompt, as f32.
pub async fn encode_prompt(
    session: &mut impl Session,
    prompt: &EncodedPrompt,
) -> Result<Vec<f32>, StageError> {
    let graph = Graph::TextEncoder;
    let tokens = [Expected::Any("batch"), Expected::Any("sequence")];
    let s = &*session;
    for name in ["input_ids", "attention_mask"] {
        require_int64(graph, Port::Input, declared(s, graph, Port::Input, name, &tokens)?)?;
    }
    let embeds_shape =
        [Expected::Any("batch"), Expected::Any("sequence"), Expected::Fixed(EMBED_WIDTH as i64)];
    float_type(graph, Port::Output, declared(s, graph, Port::Output, "prompt_embeds", &embeds_shape)?)?;

    let length = prompt.input_ids.len() as i64;
    let ids = Tensor::from_i64(prompt.input_ids.clone(), &[1, length]);
    let mask = Tensor::from_i64(prompt.attention_mask.clone(), &[1, length]);
    let outputs =
        run(session, graph, &[("input_ids", &ids), ("attention_mask", &mask)], &["prompt_embeds"]).await?;
    float_values(graph, "prompt_embeds", first(outputs), &[1, length, EMBED_WIDTH as i64])
}

/// What the denoising loop needs to know of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenoiseParams {
    /// Image width in pixels, a multiple of 16.
    pub width: u32,
    /// Image height in pixels, a multiple of 16.
    pub height: u32,
    /// Euler steps.
    pub steps: u32,
    /// The noise seed.
    pub seed: u64,
    /// How sigmas are spaced.
    pub schedule: Schedule,
}

/// What the denoising loop hands on.
#[derive(Debug, Clone, PartialEq)]
pub struct Denoised {
    /// The `steps + 1` sigmas used.
    pub sigmas: Vec<f32>,
    /// The initial latents, packed tokens `[N, 128]`.
    pub noise: Vec<f32>,
    /// The final latents, packed tokens `[N, 128]`.
    pub latents: Vec<f32>,
    /// The transformer's output at the first step, `[N, 128]` (for the trace).
    pub first_velocity: Vec<f32>,
    /// The position ids fed as `img_ids`, `[N, 4]` (for the trace).
    pub img_ids: Vec<i64>,
    /// The position ids fed as `txt_ids`, `[512, 4]` (for the trace).
    pub txt_ids: Vec<i64>,
}

/// The float types of the transformer's latents, prompt embeddings and timestep, once each port
/// [`denoise`] feeds or reads is checked to be declared as it is used.
fn transformer_floats(session: &impl Session) -> Result<(FloatType, FloatType, FloatType), StageError> {
    let graph = Graph::Transformer;
    let image =
        [Expected::Any("batch"), Expected::Any("image_sequence"), Expected::Fixed(TOKEN_CHANNELS as i64)];
    let text = [Expected::Any("batch"), Expected::Any("text_sequence"), Expected::Fixed(EMBED_WIDTH as i64)];
    let image_ids_shape =
        [Expected::Any("batch"), Expected::Any("image_sequence"), Expected::Fixed(ID_AXES as i64)];
    let text_ids_shape =
        [Expected::Any("batch"), Expected::Any("text_sequence"), Expected::Fixed(ID_AXES as i64)];
    let float =
        float_type(graph, Port::Input, declared(session, graph, Port::Input, "hidden_states", &image)?)?;
    let text_float = float_type(
        graph,
        Port::Input,
        declared(session, graph, Port::Input, "encoder_hidden_states", &text)?,
    )?;
    let time_shape = [Expected::Any("batch")];
    let time_float =
        float_type(graph, Port::Input, declared(session, graph, Port::Input, "timestep", &time_shape)?)?;
    require_int64(graph, Port::Input, declared(session, graph, Port::Input, "img_ids", &image_ids_shape)?)?;
    require_int64(graph, Port::Input, declared(session, graph, Port::Input, "txt_ids", &text_ids_shape)?)?;
    float_type(graph, Port::Output, declared(session, graph, Port::Output, "noise_pred", &image)?)?;
    Ok((float, text_float, time_float))
}

/// Stage 2, the transformer: from the seed's noise, `steps` Euler steps conditioned on the prompt
/// embeddings (`[512, 7680]`, from [`encode_prompt`]). `on_step` is called after each step with the
/// number of steps done.
pub async fn denoise(
    session: &mut impl Session,
    embeddings: Vec<f32>,
    params: &DenoiseParams,
    mut on_step: impl FnMut(u32),
) -> Result<Denoised, StageError> {
    let graph = Graph::Transformer;
    let expected_len = MAX_TOKENS * EMBED_WIDTH;
    if embeddings.len() != expected_len {
        let found = embeddings.len();
        return Err(LengthError { what: "the prompt embeddings", expected: expected_len, found }.into());
    }
    let (float, text_float, time_float) = transformer_floats(session)?;

    let tokens = (params.height / 16) as usize * (params.width / 16) as usize;
    let latent_dims = [1, tokens as i64, TOKEN_CHANNELS as i64];
    let text_tokens = MAX_TOKENS as i64;
    let sigmas = params.schedule.sigmas(tokens as u32, params.steps);
    let noise = initial_noise(params.seed, params.width, params.height);
    let context = Tensor::from_f32(text_float, &embeddings, &[1, text_tokens, EMBED_WIDTH as i64]);
    drop(embeddings);
    let (img_ids_fed, txt_ids_fed) = (image_ids(params.height, params.width), text_ids());
    let img_ids = Tensor::from_i64(img_ids_fed.clone(), &[1, tokens as i64, ID_AXES as i64]);
    let txt_ids = Tensor::from_i64(txt_ids_fed.clone(), &[1, text_tokens, ID_AXES as i64]);

    let mut latents = noise.clone();
    let mut first_velocity = Vec::new();
    for step in 0..params.steps as usize {
        let x = Tensor::from_f32(float, &latents, &latent_dims);
        let t = Tensor::from_f32(time_float, &[sigmas[step]], &[1]);
        let feeds = [
            ("hidden_states", &x),
            ("encoder_hidden_states", &context),
            ("timestep", &t),
            ("img_ids", &img_ids),
            ("txt_ids", &txt_ids),
        ];
        let outputs = run(session, graph, &feeds, &["noise_pred"]).await?;
        let velocity = float_values(graph, "noise_pred", first(outputs), &latent_dims)?;
        euler_step(&mut latents, &velocity, sigmas[step], sigmas[step + 1])?;
        if step == 0 {
            first_velocity = velocity;
        }
        on_step(step as u32 + 1);
    }
    Ok(Denoised { sigmas, noise, latents, first_velocity, img_ids: img_ids_fed, txt_ids: txt_ids_fed })
}

/// Stage 3, the VAE decoder: the final latents (packed tokens `[N, 128]`) in the layout the decoder
/// declares (`[1, 128, h, w]` unpacked, or `[1, 32, 2h, 2w]` unpatchified), decoded to the sample
/// `[3, height, width]`.
pub async fn decode(
    session: &mut impl Session,
    latents: &[f32],
    width: u32,
    height: u32,
) -> Result<Vec<f32>, StageError> {
    let graph = Graph::Decoder;
    let (h, w) = ((height / 16) as usize, (width / 16) as usize);
    let [input] = session.inputs() else {
        return Err(StageError::Count { graph, port: Port::Input, count: session.inputs().len() });
    };
    let input = input.clone();
    let float = float_type(graph, Port::Input, &input)?;
    let [output] = session.outputs() else {
        return Err(StageError::Count { graph, port: Port::Output, count: session.outputs().len() });
    };
    let output = output.clone();
    float_type(graph, Port::Output, &output)?;
    let sample_shape =
        [Expected::Any("batch"), Expected::Fixed(3), Expected::Any("height"), Expected::Any("width")];
    check_shape(graph, Port::Output, &output, &sample_shape)?;

    const PACKED: i64 = TOKEN_CHANNELS as i64;
    const UNPATCHIFIED: i64 = VAE_CHANNELS as i64;
    let (values, dims) = match input.shape.as_slice() {
        [_, Dim::Fixed(PACKED), _, _] => (unpack_tokens(latents, h, w)?, [1, PACKED, h as i64, w as i64]),
        [_, Dim::Fixed(UNPATCHIFIED), _, _] => {
            let packed = unpack_tokens(latents, h, w)?;
            (unpatchify(&packed, h, w)?, [1, UNPATCHIFIED, 2 * h as i64, 2 * w as i64])
        }
        _ => return Err(StageError::DecoderInput { graph, name: input.name, declared: input.shape }),
    };
    let latent = Tensor::from_f32(float, &values, &dims);
    drop(values);
    let outputs = run(session, graph, &[(input.name.as_str(), &latent)], &[output.name.as_str()]).await?;
    float_values(graph, &output.name, first(outputs), &[1, 3, i64::from(height), i64::from(width)])
}

/// The decoder's sample `[3, height, width]` as a PNG carrying `meta` (its size is the image's).
pub fn encode_image(sample: &[f32], meta: &ImageParams) -> Result<Vec<u8>, StageError> {
    let rgba = to_rgba8(sample, meta.width, meta.height)?;
    Ok(encode_png(&rgba, meta.width, meta.height, meta)?)
}

/// A failed run (what ORT said is an argument) is translated; a graph that breaks the contract is
/// shown as it is.
impl Localize for StageError {
    fn message(&self) -> Message {
        match self {
            StageError::Run { graph, error } => {
                Message::new("errStageRun", [arg(graph.file_name()), arg(error)])
            }
            other => Message::text(other),
        }
    }
}

//! The three stages against a fake session: what they feed a graph, what they make of its answer,
//! and how they refuse a graph that breaks the pack contract.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use half::f16;
use imagine_core::image::ImageParams;
use imagine_core::latents::{image_ids, initial_noise, text_ids, to_f16, unpack_tokens, unpatchify};
use imagine_core::pack::Graph;
use imagine_core::prompt::{EncodedPrompt, MAX_TOKENS};
use imagine_core::stages::{self, DenoiseParams, Port, StageError, EMBED_WIDTH};
use imagine_core::{euler_step, DType, Dim, Schedule, Session, SessionError, Tensor, TensorData, TensorInfo};

/// Runs a future that never waits (the fake session answers at once).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the stage waited on something other than the fake session"),
    }
}

type Respond = Box<dyn FnMut(&[(&str, &Tensor)]) -> Result<Vec<Tensor>, SessionError>>;

/// A graph that declares what the test says and answers each run with `respond`, recording the
/// feeds of every run.
struct FakeSession {
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    respond: Respond,
    runs: Vec<Vec<(String, Tensor)>>,
}

impl FakeSession {
    fn new(
        inputs: Vec<TensorInfo>,
        outputs: Vec<TensorInfo>,
        respond: impl FnMut(&[(&str, &Tensor)]) -> Result<Vec<Tensor>, SessionError> + 'static,
    ) -> Self {
        FakeSession { inputs, outputs, respond: Box::new(respond), runs: Vec::new() }
    }

    /// The tensor fed as `name` in run `run`.
    fn fed(&self, run: usize, name: &str) -> &Tensor {
        let feeds = &self.runs[run];
        &feeds.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not fed")).1
    }
}

impl Session for FakeSession {
    fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }

    async fn run(
        &mut self,
        feeds: &[(&str, &Tensor)],
        fetches: &[&str],
    ) -> Result<Vec<Tensor>, SessionError> {
        assert_eq!(fetches.len(), 1, "every stage fetches one output");
        self.runs.push(feeds.iter().map(|(n, t)| ((*n).to_owned(), (*t).clone())).collect());
        (self.respond)(feeds)
    }
}

/// A declared value; `shape` is comma-separated, numbers fixed and words symbolic ("" for none).
fn info(name: &str, dtype: DType, shape: &str) -> TensorInfo {
    let shape = shape
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.trim().parse().map_or_else(|_| Dim::Symbolic(d.trim().to_owned()), Dim::Fixed))
        .collect();
    TensorInfo { name: name.to_owned(), dtype, shape }
}

fn f32_tensor(values: Vec<f32>, dims: &[i64]) -> Tensor {
    Tensor { dims: dims.to_vec(), data: TensorData::Float32(values) }
}

fn f32_values(tensor: &Tensor) -> &[f32] {
    match &tensor.data {
        TensorData::Float32(values) => values,
        other => panic!("expected float32, got {:?}", other_type(other)),
    }
}

fn other_type(data: &TensorData) -> DType {
    Tensor { dims: vec![], data: data.clone() }.dtype()
}

fn i64_values(tensor: &Tensor) -> &[i64] {
    match &tensor.data {
        TensorData::Int64(values) => values,
        other => panic!("expected int64, got {:?}", other_type(other)),
    }
}

// ---------------------------------------------------------------------------------------------
// Text encoder

fn encoded_prompt() -> EncodedPrompt {
    let token_count = 7;
    EncodedPrompt {
        input_ids: (0..MAX_TOKENS as i64).map(|i| if i < token_count { 100 + i } else { 151643 }).collect(),
        attention_mask: (0..MAX_TOKENS as i64).map(|i| i64::from(i < token_count)).collect(),
        token_count: token_count as usize,
        truncated: false,
    }
}

fn text_encoder(
    embeds: DType,
    respond: impl FnMut(&[(&str, &Tensor)]) -> Result<Vec<Tensor>, SessionError> + 'static,
) -> FakeSession {
    FakeSession::new(
        vec![
            info("input_ids", DType::Int64, "batch, sequence"),
            info("attention_mask", DType::Int64, "batch, sequence"),
        ],
        vec![info("prompt_embeds", embeds, "batch, sequence, 7680")],
        respond,
    )
}

/// Embedding `k` of the fake text encoder, exact in f16.
fn embedding(k: usize) -> f32 {
    (k % 13) as f32 * 0.25 - 1.5
}

fn embeds_f16(_: &[(&str, &Tensor)]) -> Result<Vec<Tensor>, SessionError> {
    let values = (0..MAX_TOKENS * EMBED_WIDTH).map(|k| f16::from_f32(embedding(k))).collect();
    Ok(vec![Tensor {
        dims: vec![1, MAX_TOKENS as i64, EMBED_WIDTH as i64],
        data: TensorData::Float16(values),
    }])
}

#[test]
fn text_encoder_feeds_ids_and_mask_and_widens_f16_embeddings() {
    let prompt = encoded_prompt();
    let mut session = text_encoder(DType::Float16, embeds_f16);
    let embeddings = block_on(stages::encode_prompt(&mut session, &prompt)).unwrap();
    assert_eq!(embeddings.len(), MAX_TOKENS * EMBED_WIDTH);
    assert!(embeddings.iter().enumerate().all(|(k, &v)| v == embedding(k)));
    assert_eq!(session.runs.len(), 1);
    for (name, values) in [("input_ids", &prompt.input_ids), ("attention_mask", &prompt.attention_mask)] {
        let fed = session.fed(0, name);
        assert_eq!(fed.dims, [1, MAX_TOKENS as i64], "{name}");
        assert_eq!(i64_values(fed), values.as_slice(), "{name}");
    }
}

fn encode_error(mut session: FakeSession) -> StageError {
    block_on(stages::encode_prompt(&mut session, &encoded_prompt())).unwrap_err()
}

#[test]
fn text_encoder_refuses_a_graph_without_an_input() {
    let mut session = text_encoder(DType::Float32, embeds_f16);
    session.inputs.retain(|v| v.name != "attention_mask");
    let error = encode_error(session);
    let StageError::Missing { graph, port, name, .. } = &error else { panic!("{error:?}") };
    assert_eq!((*graph, *port, name.as_str()), (Graph::TextEncoder, Port::Input, "attention_mask"));
    assert_eq!(
        error.to_string(),
        format!(
            "{} has no input named `attention_mask` (it declares: input_ids, prompt_embeds)",
            Graph::TextEncoder.file_name()
        )
    );
}

#[test]
fn text_encoder_refuses_float_ids() {
    let mut session = text_encoder(DType::Float32, embeds_f16);
    session.inputs[0].dtype = DType::Float32;
    let error = encode_error(session);
    let StageError::DType { port, name, declared, expected, .. } = &error else { panic!("{error:?}") };
    assert_eq!(
        (*port, name.as_str(), declared, *expected),
        (Port::Input, "input_ids", &DType::Float32, "int64")
    );
    assert!(error.to_string().contains("input `input_ids` is float32, expected int64"), "{error}");
}

#[test]
fn text_encoder_refuses_int_embeddings() {
    let error = encode_error(text_encoder(DType::Int64, embeds_f16));
    assert!(
        matches!(&error, StageError::DType { port: Port::Output, expected: "float32 or float16", .. }),
        "{error:?}"
    );
}

#[test]
fn text_encoder_refuses_embeddings_of_another_rank_or_width() {
    for shape in ["batch, 7680", "batch, sequence, 4096"] {
        let mut session = text_encoder(DType::Float16, embeds_f16);
        session.outputs[0] = info("prompt_embeds", DType::Float16, shape);
        let error = encode_error(session);
        assert!(matches!(&error, StageError::Shape { port: Port::Output, .. }), "{shape}: {error:?}");
        assert!(
            error.to_string().contains(&format!(
                "output `prompt_embeds` has shape [{shape}], expected [batch, sequence, 7680]"
            )),
            "{error}"
        );
    }
    // An undeclared shape is not checked.
    let mut session = text_encoder(DType::Float16, embeds_f16);
    session.outputs[0].shape.clear();
    block_on(stages::encode_prompt(&mut session, &encoded_prompt())).unwrap();
}

#[test]
fn text_encoder_refuses_embeddings_of_the_wrong_size() {
    let error = encode_error(text_encoder(DType::Float32, |_| {
        Ok(vec![f32_tensor(vec![0.0; 512 * 100], &[1, 512, 100])])
    }));
    let StageError::OutputShape { found, expected, .. } = &error else { panic!("{error:?}") };
    assert_eq!((found.as_slice(), expected.as_slice()), (&[1, 512, 100][..], &[1, 512, 7680][..]));
}

#[test]
fn text_encoder_reports_a_failed_run() {
    let mut session = text_encoder(DType::Float32, |_| Err(SessionError("out of memory".into())));
    let error = block_on(stages::encode_prompt(&mut session, &encoded_prompt())).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("running {} failed: out of memory", Graph::TextEncoder.file_name())
    );
    // A session that answers without the output asked for.
    let error = encode_error(text_encoder(DType::Float32, |_| Ok(vec![])));
    assert!(matches!(error, StageError::Run { graph: Graph::TextEncoder, .. }), "{error:?}");
}

// ---------------------------------------------------------------------------------------------
// Transformer

const VELOCITY: f32 = 0.5;

fn transformer(float: DType) -> FakeSession {
    let dtype = float.clone();
    FakeSession::new(
        vec![
            info("hidden_states", float.clone(), "batch, image_sequence, 128"),
            info("encoder_hidden_states", float.clone(), "batch, text_sequence, 7680"),
            info("timestep", float.clone(), "batch"),
            info("img_ids", DType::Int64, "batch, image_sequence, 4"),
            info("txt_ids", DType::Int64, "batch, text_sequence, 4"),
        ],
        vec![info("noise_pred", float, "batch, image_sequence, 128")],
        // A constant velocity, in the graph's type, of the latents' shape.
        move |feeds| {
            let hidden = feeds.iter().find(|(name, _)| *name == "hidden_states").expect("hidden_states fed");
            let dims = hidden.1.dims.clone();
            let n: i64 = dims.iter().product();
            let data = match dtype {
                DType::Float16 => TensorData::Float16(vec![f16::from_f32(VELOCITY); n as usize]),
                _ => TensorData::Float32(vec![VELOCITY; n as usize]),
            };
            Ok(vec![Tensor { dims, data }])
        },
    )
}

fn denoise_params() -> DenoiseParams {
    DenoiseParams { width: 256, height: 320, steps: 4, seed: 7, schedule: Schedule::Empirical }
}

fn embeddings() -> Vec<f32> {
    (0..MAX_TOKENS * EMBED_WIDTH).map(embedding).collect()
}

#[test]
fn transformer_takes_euler_steps_along_the_velocity() {
    for float in [DType::Float32, DType::Float16] {
        let params = denoise_params();
        let mut session = transformer(float.clone());
        let mut steps_reported = Vec::new();
        let denoised =
            block_on(stages::denoise(&mut session, embeddings(), &params, |step| steps_reported.push(step)))
                .unwrap();
        let tokens = (256 / 16) * (320 / 16);
        assert_eq!(steps_reported, [1, 2, 3, 4]);
        assert_eq!(denoised.sigmas, Schedule::Empirical.sigmas(tokens as u32, 4));
        assert_eq!(denoised.noise, initial_noise(7, 256, 320));
        assert_eq!(denoised.latents.len(), tokens * 128);

        // x_final = x0 + (sigma_last - sigma_0) * v, up to f32 rounding over the steps ...
        let (first, last) = (denoised.sigmas[0], denoised.sigmas[4]);
        for (x, x0) in denoised.latents.iter().zip(&denoised.noise) {
            assert!((x - (x0 + (last - first) * VELOCITY)).abs() < 1e-5, "{float:?}: {x} from {x0}");
        }
        // ... and bit for bit what the Euler steps give, which the e2e reference comparison needs.
        let mut expected = denoised.noise.clone();
        let velocity = vec![VELOCITY; expected.len()];
        let mut fed_latents = Vec::new();
        for step in 0..4 {
            fed_latents.push(expected.clone());
            euler_step(&mut expected, &velocity, denoised.sigmas[step], denoised.sigmas[step + 1]).unwrap();
        }
        assert_eq!(denoised.latents, expected, "{float:?}");

        // Each step feeds the latents before it and its sigma, in the graph's type.
        assert_eq!(session.runs.len(), 4);
        for (step, latents) in fed_latents.iter().enumerate() {
            let x = session.fed(step, "hidden_states");
            let t = session.fed(step, "timestep");
            assert_eq!(x.dims, [1, tokens as i64, 128]);
            assert_eq!(t.dims, [1]);
            match float {
                DType::Float16 => {
                    assert_eq!(x.data, TensorData::Float16(to_f16(latents)), "step {step}");
                    assert_eq!(t.data, TensorData::Float16(to_f16(&[denoised.sigmas[step]])));
                }
                _ => {
                    assert_eq!(f32_values(x), latents.as_slice(), "step {step}");
                    assert_eq!(f32_values(t), [denoised.sigmas[step]]);
                }
            }
        }
        let context = session.fed(0, "encoder_hidden_states");
        assert_eq!(context.dims, [1, 512, 7680]);
        assert_eq!(context.dtype(), float);
        let img_ids = session.fed(0, "img_ids");
        assert_eq!(
            (img_ids.dims.as_slice(), i64_values(img_ids)),
            (&[1, tokens as i64, 4][..], &image_ids(320, 256)[..])
        );
        let txt_ids = session.fed(0, "txt_ids");
        assert_eq!((txt_ids.dims.as_slice(), i64_values(txt_ids)), (&[1, 512, 4][..], &text_ids()[..]));
    }
}

fn denoise_error(mut session: FakeSession) -> StageError {
    block_on(stages::denoise(&mut session, embeddings(), &denoise_params(), |_| {})).unwrap_err()
}

#[test]
fn transformer_refuses_contract_breaks() {
    let mut session = transformer(DType::Float32);
    session.inputs.retain(|v| v.name != "timestep");
    let error = denoise_error(session);
    assert!(
        matches!(&error, StageError::Missing { graph: Graph::Transformer, name, .. } if name == "timestep"),
        "{error:?}"
    );

    let mut session = transformer(DType::Float32);
    session.inputs[3].dtype = DType::Float32;
    let error = denoise_error(session);
    assert!(
        matches!(&error, StageError::DType { name, expected: "int64", .. } if name == "img_ids"),
        "{error:?}"
    );

    let mut session = transformer(DType::Float32);
    session.inputs[0].dtype = DType::Other("bfloat16".into());
    let error = denoise_error(session);
    assert!(
        error.to_string().contains("input `hidden_states` is bfloat16, expected float32 or float16"),
        "{error}"
    );

    let mut session = transformer(DType::Float32);
    session.inputs[2] = info("timestep", DType::Float32, "batch, 1");
    let error = denoise_error(session);
    assert!(matches!(&error, StageError::Shape { name, .. } if name == "timestep"), "{error:?}");

    let mut session = transformer(DType::Float32);
    session.inputs[0] = info("hidden_states", DType::Float32, "batch, image_sequence, 64");
    let error = denoise_error(session);
    assert!(matches!(&error, StageError::Shape { name, .. } if name == "hidden_states"), "{error:?}");
}

#[test]
fn transformer_refuses_a_velocity_of_the_wrong_size() {
    let session = FakeSession {
        respond: Box::new(|feeds| {
            let dims = &feeds[0].1.dims;
            Ok(vec![f32_tensor(vec![0.0; (dims[1] * 64) as usize], &[1, dims[1], 64])])
        }),
        ..transformer(DType::Float32)
    };
    let error = denoise_error(session);
    let StageError::OutputShape { name, expected, .. } = &error else { panic!("{error:?}") };
    assert_eq!((name.as_str(), expected.as_slice()), ("noise_pred", &[1, 320, 128][..]));
}

#[test]
fn transformer_refuses_embeddings_of_the_wrong_length() {
    let mut session = transformer(DType::Float32);
    let error =
        block_on(stages::denoise(&mut session, vec![0.0; 100 * EMBED_WIDTH], &denoise_params(), |_| {}))
            .unwrap_err();
    assert!(matches!(error, StageError::Length(_)), "{error:?}");
    assert!(session.runs.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Decoder

const WIDTH: u32 = 256;
const HEIGHT: u32 = 320;

fn latents() -> Vec<f32> {
    let tokens = (WIDTH / 16 * HEIGHT / 16) as usize;
    (0..tokens * 128).map(|k| (k % 101) as f32 / 50.0 - 1.0).collect()
}

fn sample_value(k: usize) -> f32 {
    (k % 17) as f32 / 8.0 - 1.0
}

/// A decoder whose input `input` has `channels` channels, returning a known sample.
fn decoder(input: &str, channels: &str) -> FakeSession {
    FakeSession::new(
        vec![info(input, DType::Float32, &format!("batch, {channels}, height, width"))],
        vec![info("sample", DType::Float32, "batch, 3, 16*height, 16*width")],
        |_| {
            let n = (3 * WIDTH * HEIGHT) as usize;
            Ok(vec![f32_tensor(
                (0..n).map(sample_value).collect(),
                &[1, 3, i64::from(HEIGHT), i64::from(WIDTH)],
            )])
        },
    )
}

#[test]
fn decoder_takes_the_layout_it_declares() {
    let (h, w) = ((HEIGHT / 16) as usize, (WIDTH / 16) as usize);
    let unpacked = unpack_tokens(&latents(), h, w).unwrap();
    for (input, channels, dims, values) in [
        ("packed_latent", "128", [1, 128, h as i64, w as i64], unpacked.clone()),
        ("latent", "32", [1, 32, 2 * h as i64, 2 * w as i64], unpatchify(&unpacked, h, w).unwrap()),
    ] {
        let mut session = decoder(input, channels);
        let sample = block_on(stages::decode(&mut session, &latents(), WIDTH, HEIGHT)).unwrap();
        assert!(sample.iter().enumerate().all(|(k, &v)| v == sample_value(k)), "{input}");
        let fed = session.fed(0, input);
        assert_eq!(fed.dims, dims, "{input}");
        assert_eq!(f32_values(fed), values.as_slice(), "{input}");
    }
}

fn decode_error(mut session: FakeSession) -> StageError {
    block_on(stages::decode(&mut session, &latents(), WIDTH, HEIGHT)).unwrap_err()
}

#[test]
fn decoder_refuses_neither_128_nor_32_channels() {
    for channels in ["64", "channels"] {
        let error = decode_error(decoder("latent", channels));
        let StageError::DecoderInput { graph, name, .. } = &error else { panic!("{error:?}") };
        assert_eq!((*graph, name.as_str()), (Graph::Decoder, "latent"));
        assert!(
            error
                .to_string()
                .contains(&format!("input `latent` has shape [batch, {channels}, height, width]")),
            "{error}"
        );
    }
    let mut session = decoder("latent", "32");
    session.inputs[0].shape.truncate(3);
    assert!(matches!(decode_error(session), StageError::DecoderInput { .. }));
}

#[test]
fn decoder_refuses_contract_breaks() {
    let mut session = decoder("latent", "32");
    session.inputs.push(info("scale", DType::Float32, ""));
    let error = decode_error(session);
    assert!(matches!(error, StageError::Count { port: Port::Input, count: 2, .. }), "{error:?}");
    assert_eq!(error.to_string(), format!("{} declares 2 inputs, expected one", Graph::Decoder.file_name()));

    let mut session = decoder("latent", "32");
    session.inputs[0].dtype = DType::Int64;
    assert!(matches!(decode_error(session), StageError::DType { port: Port::Input, .. }));

    let mut session = decoder("latent", "32");
    session.outputs[0] = info("sample", DType::Float32, "batch, 4, height, width");
    assert!(matches!(decode_error(session), StageError::Shape { port: Port::Output, .. }));
}

#[test]
fn decoder_refuses_a_sample_of_the_wrong_size() {
    let session = FakeSession {
        respond: Box::new(|_| Ok(vec![f32_tensor(vec![0.0; 3 * 128 * 160], &[1, 3, 160, 128])])),
        ..decoder("packed_latent", "128")
    };
    let error = decode_error(session);
    let StageError::OutputShape { name, found, expected, .. } = &error else { panic!("{error:?}") };
    assert_eq!(name, "sample");
    assert_eq!((found.as_slice(), expected.as_slice()), (&[1, 3, 160, 128][..], &[1, 3, 320, 256][..]));
}

#[test]
fn image_is_a_png_of_the_sample() {
    let meta = ImageParams {
        prompt: "a cat".into(),
        seed: 1,
        width: 4,
        height: 2,
        steps: 4,
        schedule: "empirical".into(),
    };
    let png = stages::encode_image(&[0.0; 3 * 8], &meta).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let error = stages::encode_image(&[0.0; 3 * 7], &meta).unwrap_err();
    assert!(matches!(error, StageError::Image(_)), "{error:?}");
}

#[test]
fn the_stall_limit_scales_with_the_work_and_what_was_seen() {
    use imagine_core::api::Stage;
    use imagine_core::stages::QuietTimes;
    use imagine_core::Backend;
    const SMALL: u64 = 512 * 512;
    const HUGE: u64 = 1536 * 1536;
    let mut seen = QuietTimes::default();
    // Nothing seen: ten minutes at 512x512, more for more work.
    assert_eq!(seen.stall_limit_ms(Stage::Decoder, Backend::WebGpu, SMALL), 600_000.0);
    assert!(seen.stall_limit_ms(Stage::Decoder, Backend::WebGpu, HUGE) > 600_000.0);
    // A 10 s decode at 512x512: a minute there (five times 10 s is less), and a 1536x1536 decode, 9 times
    // the pixels and more for its attention, gets more than 9 times as long.
    assert!(seen.note(Stage::Decoder, Backend::WebGpu, SMALL, 10_000.0));
    assert_eq!(seen.stall_limit_ms(Stage::Decoder, Backend::WebGpu, SMALL), 60_000.0);
    assert!(seen.stall_limit_ms(Stage::Decoder, Backend::WebGpu, HUGE) > 9.0 * 5.0 * 10_000.0);
    // What a larger class saw holds for smaller ones too; other stages and backends are apart.
    assert!(seen.note(Stage::Decoder, Backend::WebGpu, HUGE, 100_000.0));
    assert_eq!(seen.stall_limit_ms(Stage::Decoder, Backend::WebGpu, SMALL), 500_000.0);
    assert!(!seen.note(Stage::Decoder, Backend::WebGpu, HUGE, 50_000.0), "shorter: nothing changes");
    assert!(!seen.note(Stage::Decoder, Backend::WebGpu, SMALL, f64::NAN));
    assert_eq!(seen.stall_limit_ms(Stage::Decoder, Backend::Wasm, SMALL), 600_000.0);
    assert_eq!(seen.stall_limit_ms(Stage::TextEncoder, Backend::WebGpu, HUGE), 600_000.0);
    // Kept across restarts as JSON.
    let kept: QuietTimes = serde_json::from_str(&serde_json::to_string(&seen).unwrap()).unwrap();
    assert_eq!(kept, seen);
    assert_eq!(QuietTimes::size_class(768 * 1024), QuietTimes::size_class(1024 * 1024));
    assert_ne!(QuietTimes::size_class(SMALL), QuietTimes::size_class(1024 * 1024));
}

//! Attention fused into ONNX Runtime's `MultiHeadAttention` for its WebGPU flash attention, or
//! computed in chunks of query rows so that its scores fit ONNX Runtime Web's buffer cache.
//!
//! # Why
//!
//! The exporter writes the transformer's attention node by node, as PyTorch decomposes scaled
//! dot-product attention: the query and the key each scaled by `head_size^-1/4`, the key transposed
//! (as a `Reshape` to 3-D, a swap and a `Reshape` back), `MatMul`, `Softmax`, `MatMul` with the value.
//! ONNX Runtime Web runs that as it is: at 1024x1024 each layer writes and reads back 24 heads x 4608 x
//! 4608 scores, 1.02 GB in float16, and the attention's `MatMul` and `Softmax` took about 0.3 s of GPU
//! time of each step (BENCHMARKS.md). `com.microsoft` `MultiHeadAttention` computes the same function,
//! and ONNX Runtime's WebGPU kernel runs it as flash attention on adapters with subgroups: the scores
//! never leave the GPU's workgroup memory.
//!
//! # What
//!
//! [`fuse_attention`] finds each softmax attention whose parts it can prove and replaces it with
//! `Reshape`s of query, key and value from `[batch, sequence, heads, head_size]` to
//! `[batch, sequence, heads * head_size]` (the same bytes), one `MultiHeadAttention` (`num_heads` and
//! `scale` from the graph: the product of the scalar factors on the query, the key and the scores) and
//! a `Reshape` of its output back, under the name the rest of the graph reads. The nodes that fed only
//! the fused ones (the scaling, the transposes, the key's shape arithmetic) go with them. What it
//! proves: `Softmax` over the last axis of `MatMul(Transpose(q), Kᵀ)`, optionally scaled, with a key
//! transposed in one of the ways above and a value `Transpose(v)` (both from the same layout), read
//! only by `MatMul` with the value whose result is only transposed back; the heads and the head size
//! declared statically and the same for all three. Anything else (a mask added to the scores, a
//! causal attention, another layout) stays as it is.
//!
//! # When, and why it is off
//!
//! Only when a job asks for it (`fuseAttention`, a benchmark's switch), while the transformer loads on
//! WebGPU: it changes the graph's nodes only, not its weights, and takes milliseconds, so nothing is
//! stored. Measured on an NVIDIA H200 in Chromium 148 with ONNX Runtime Web 1.30 (BENCHMARKS.md): the
//! image is as exact (the first transformer output at cosine 0.999997 of the graph's; the image within
//! 1 level of the reference), but ONNX Runtime's flash attention takes 708 ms of GPU time a step at
//! 1024x1024 where the exported `MatMul`s and `Softmax` take about 300, so steps are 1.17x (512x512)
//! and 1.29x (1024x1024) slower. The decoder's one attention (a single head over every latent pixel)
//! is never fused: ONNX Runtime's `MultiHeadAttention` overflows a tensor size on it at 1024x1024 (and
//! on SwiftShader, fused, it moved the tiny pack's image up to 43 levels from the reference). So it
//! stays a switch, to measure again with each ONNX Runtime release.
//!
//! Tests: `tools/export/tests/test_attention_fusion.py` (on ONNX Runtime's CPU: the tiny transformers
//! fused compute what they computed, each way of writing the key and the scale fuses, a mask or
//! undeclared heads leave the graph as it was), the unit tests in `f32_rewrite/tests.rs`, and in the browser
//! `real-arch-bench.test.mjs` (the tiny transformer fused on WebGPU: its first output against the
//! graph's).
//!
//! # Chunks along the query axis, for the memory plan
//!
//! Unfused, each layer's scores are `heads x tokens x tokens` (1.02 GB in float16 at 1024x1024), and
//! ONNX Runtime Web allocates them afresh every layer: its WebGPU buffer cache keeps buffers only up to
//! [`ORT_LARGEST_CACHED_BUFFER`]. [`chunk_attention`] takes the attentions the same finder proves and
//! computes each in `C` parts of the query's rows: the query `[batch, heads, sequence, head_size]` as the
//! first `MatMul` reads it is cut along the sequence (`Split` with `num_outputs` from opset 18, which
//! ONNX Runtime's kernels cut into parts of `ceil(n / C)`, the last smaller, as ONNX defines it whenever
//! `n > (C - 1)^2`; `Slice`s of the same rows from `Shape` for opsets 13 to 17), each part goes through
//! copies of the original `MatMul`, scaling, `Softmax` and `MatMul` with the value (the key's and value's
//! side, transposes and scalings, stay as they are), and `Concat` puts the parts back along the sequence
//! under the name the rest of the graph reads. Softmax is per query row, so it is the same function,
//! with scores `C` times smaller; [`chunks_for`] picks `C` so that they fit the cache's largest bucket.
//!
//! Tests: `tools/export/tests/test_attention_chunks.py` (the tiny transformers chunked, on ONNX
//! Runtime's CPU and ONNX Runtime Web's wasm, against the graph as exported) and the unit tests in
//! `f32_rewrite/tests.rs`.

use crate::f32_rewrite::RewriteError;

/// `model` (a ModelProto) with every attention [`crate::attention`] can prove fused into
/// `MultiHeadAttention`, and how many; the model as it was and 0 when there is none.
pub fn fuse_attention(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    crate::f32_rewrite::attention::fuse_attention(model)
}

/// `model` with every attention the same finder proves computed in `chunks` parts along the query's
/// sequence axis (see [`crate::attention`]), and how many; the model as it was and 0 when `chunks <= 1`
/// or there is none.
pub fn chunk_attention(model: &[u8], chunks: u32) -> Result<(Vec<u8>, usize), RewriteError> {
    crate::f32_rewrite::attention::chunk_attention(model, chunks)
}

/// The largest bucket of ONNX Runtime Web's WebGPU buffer cache (160 MiB): larger buffers are created
/// and destroyed at every use instead of reused.
pub const ORT_LARGEST_CACHED_BUFFER: u64 = 167_772_160;

/// The fewest chunks `C` that keep one chunk's scores, `heads x ceil(tokens / C) x tokens` elements of
/// `bytes_per_element`, at or under `max_scores_bytes`; `tokens` (a row a chunk) when even one row is
/// over, 1 when there is nothing to cut.
pub fn chunks_for(heads: u64, tokens: u64, bytes_per_element: u64, max_scores_bytes: u64) -> u32 {
    let row = u128::from(heads) * u128::from(tokens) * u128::from(bytes_per_element);
    if row == 0 {
        return 1;
    }
    // ceil(tokens / C) <= rows exactly when C >= ceil(tokens / rows).
    let rows = (u128::from(max_scores_bytes) / row).max(1);
    u32::try_from(u128::from(tokens).div_ceil(rows)).unwrap_or(u32::MAX)
}

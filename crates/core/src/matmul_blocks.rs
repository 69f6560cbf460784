//! `MatMulNBits` re-blocked to 32 for ONNX Runtime Web's WebGPU kernels (issue 19).
//!
//! # Why
//!
//! ONNX Runtime Web 1.30 has a tiled WebGPU kernel for `MatMulNBits` on inputs of 4 rows or more (a
//! prompt's 512 tokens, an image's latents) only for block size 32. Any other block size falls back to
//! a kernel made for one row at a time, which dispatches one workgroup of 128 threads for every row
//! and 8 output columns. The published pack and the exporter quantize with block 128. Measured with
//! one int4 `MatMulNBits` (K 128, N 2560, 512 rows, float32): 97 s at block 128 and 0.57 s at block 32
//! on SwiftShader in Chromium 156, which left the tiny text encoder of the browser tests running for
//! over ten minutes; on an NVIDIA H200 the full-size transformer's step takes 2.96 s at block 128 and
//! 0.60 s at block 32.
//!
//! # What
//!
//! [`to_block_32`] rewrites every `MatMulNBits` whose block size is a power of two above 32 to block
//! 32, exactly: each block of 32 takes the scale and zero point of the block it was part of, so the
//! node computes the same function. Only the graph protobuf is edited, in memory, before a WebGPU
//! session is created, as [`crate::table_lookup`] does; nothing on disk changes.
//!
//! * B keeps its bytes. A block of 32 is the old block cut in pieces, so when K is a multiple of the
//!   old block only B's dims change (`[N, K / 32, 4 * bits]`) and its external data is read as
//!   before. Otherwise (only the tiny test graphs, whose K can be 64) a Reshape and a Slice drop the
//!   padding at the end of each column.
//! * Scales and zero points are repeated by nodes added in front of the graph (Reshape, Expand,
//!   Reshape, Slice; 4-bit zero points unpacked first). They read only initializers, so ONNX Runtime's
//!   constant folding computes them once, while it creates the session. What that costs: the repeated
//!   scales and zero points are held in the worker's memory while the session is created, 4 times
//!   those of block 128 (for the published pack, float16 scales: about 6 % of the transformer's int8
//!   weights, 12 % of the text encoder's int4 ones).
//!
//! Nodes it cannot prove it handles stay as they are: 2-bit weights, `g_idx`, a B that is not a uint8
//! initializer of the documented shape or that another node reads too, scales or zero points that are
//! not initializers of one value per block. The wasm backend is left alone: its kernels have no such cliff.
//! Tests: `f32_rewrite/tests.rs` and `tools/export/tests/test_matmul_blocks.py` (the re-blocked tiny
//! graphs against the originals on ONNX Runtime).

use crate::f32_rewrite::RewriteError;

pub use crate::f32_rewrite::reblock::TARGET_BLOCK;

/// Rewrites every `MatMulNBits` of `model` (a ModelProto, weights outside or inline) whose block size
/// is a power of two above 32 to block 32; the new model and how many nodes changed. The model comes
/// back as it was, and 0, when none qualifies.
pub fn to_block_32(model: &[u8]) -> Result<(Vec<u8>, usize), RewriteError> {
    crate::f32_rewrite::reblock::to_block_32(model)
}

//! Latent-space tensors: position ids, initial noise, the Euler step, and the unpacking that turns
//! the transformer's tokens back into what the VAE decoder takes.
//!
//! Layouts (batch 1 throughout; h = H/16, w = W/16, N = h·w):
//!
//! * tokens `[N, 128]`: token `i*w + j` is latent cell (row i, column j); inside a token, channel
//!   `c*4 + dy*2 + dx` is VAE channel c at pixel offset (dy, dx) of the 2x2 patch;
//! * unpacked `[128, h, w]`: the same values channel-first;
//! * unpatchified `[32, 2h, 2w]`: the VAE's own latent.
//!
//! Noise is drawn channel-first in `[128, h, w]` order from ChaCha20 and then packed, as upstream
//! draws `randn((1,128,h,w))` and packs it. Seed parity with PyTorch is not a goal; determinism is:
//! the generator and the normal sampler are pinned crate versions, and `rand_distr` uses `libm`, so
//! the same seed gives bit-identical noise natively and in wasm.

use half::f16;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use thiserror::Error;

use crate::prompt::MAX_TOKENS;

/// Channels of one image token (32 VAE channels times the 2x2 patch).
pub const TOKEN_CHANNELS: usize = 128;
/// Channels of the VAE latent.
pub const VAE_CHANNELS: usize = 32;
/// Axes of a position id: (t, h, w, l).
pub const ID_AXES: usize = 4;

/// A buffer whose length does not fit the layout asked for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what} has {found} values where {expected} were expected")]
pub struct LengthError {
    /// Which buffer.
    pub what: &'static str,
    /// The length the layout needs.
    pub expected: usize,
    /// The length given.
    pub found: usize,
}

fn check_len(what: &'static str, found: usize, expected: usize) -> Result<(), LengthError> {
    if found == expected {
        Ok(())
    } else {
        Err(LengthError { what, expected, found })
    }
}

/// `txt_ids` `[512, 4]`: row j = (0, 0, 0, j). Text positions live on the last axis.
pub fn text_ids() -> Vec<i64> {
    (0..MAX_TOKENS as i64).flat_map(|j| [0, 0, 0, j]).collect()
}

/// `img_ids` `[N, 4]` for an image of `height` x `width` pixels: row `i*w + j` = (0, i, j, 0) with
/// h = height/16, w = width/16.
pub fn image_ids(height: u32, width: u32) -> Vec<i64> {
    let (h, w) = (i64::from(height / 16), i64::from(width / 16));
    (0..h).flat_map(|i| (0..w).flat_map(move |j| [0, i, j, 0])).collect()
}

/// Initial latents `[N, 128]` (packed tokens) for `seed`: standard normals drawn as f32 from
/// `ChaCha20Rng::seed_from_u64(seed)` in `[128, h, w]` order, then packed.
pub fn initial_noise(seed: u64, width: u32, height: u32) -> Vec<f32> {
    let (h, w) = ((height / 16) as usize, (width / 16) as usize);
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let channel_first: Vec<f32> =
        (0..TOKEN_CHANNELS * h * w).map(|_| StandardNormal.sample(&mut rng)).collect();
    pack(&channel_first, h * w)
}

/// `[128, n]` -> `[n, 128]`.
fn pack(channel_first: &[f32], n: usize) -> Vec<f32> {
    let mut tokens = vec![0.0; channel_first.len()];
    for (c, plane) in channel_first.chunks_exact(n).enumerate() {
        for (t, &v) in plane.iter().enumerate() {
            tokens[t * TOKEN_CHANNELS + c] = v;
        }
    }
    tokens
}

/// One Euler step of the flow: `x += (sigma_next - sigma) * v`, in f32.
pub fn euler_step(x: &mut [f32], v: &[f32], sigma: f32, sigma_next: f32) -> Result<(), LengthError> {
    check_len("the velocity", v.len(), x.len())?;
    let dt = sigma_next - sigma;
    for (x, v) in x.iter_mut().zip(v) {
        *x += dt * v;
    }
    Ok(())
}

/// f32 values to f16, round to nearest even: the transformer takes its latents, timestep and text
/// embeddings in f16, while the latents stay f32 between steps.
pub fn to_f16(values: &[f32]) -> Vec<f16> {
    values.iter().map(|&v| f16::from_f32(v)).collect()
}

/// f16 values (the text encoder's and transformer's outputs) to f32.
pub fn from_f16(values: &[f16]) -> Vec<f32> {
    values.iter().map(|&v| v.to_f32()).collect()
}

/// Tokens `[h*w, 128]` -> channel-first `[128, h, w]`, the decoder's 128-channel input.
pub fn unpack_tokens(tokens: &[f32], h: usize, w: usize) -> Result<Vec<f32>, LengthError> {
    let n = h * w;
    check_len("the packed latents", tokens.len(), n * TOKEN_CHANNELS)?;
    let mut out = vec![0.0; tokens.len()];
    for (t, token) in tokens.chunks_exact(TOKEN_CHANNELS).enumerate() {
        for (c, &v) in token.iter().enumerate() {
            out[c * n + t] = v;
        }
    }
    Ok(out)
}

/// `[128, h, w]` -> `[32, 2h, 2w]`: pixel (2i+dy, 2j+dx) of channel c is channel `c*4 + dy*2 + dx`
/// at (i, j). The decoder's input when it asks for 32 channels.
pub fn unpatchify(latent128: &[f32], h: usize, w: usize) -> Result<Vec<f32>, LengthError> {
    check_len("the unpacked latents", latent128.len(), TOKEN_CHANNELS * h * w)?;
    let (h2, w2) = (2 * h, 2 * w);
    let mut out = vec![0.0; latent128.len()];
    for c in 0..VAE_CHANNELS {
        for dy in 0..2 {
            for dx in 0..2 {
                let plane = &latent128[(c * 4 + dy * 2 + dx) * h * w..][..h * w];
                for i in 0..h {
                    for j in 0..w {
                        out[c * h2 * w2 + (2 * i + dy) * w2 + (2 * j + dx)] = plane[i * w + j];
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_ids_layout() {
        let ids = text_ids();
        assert_eq!(ids.len(), 512 * 4);
        assert_eq!(&ids[..8], &[0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&ids[511 * 4..], &[0, 0, 0, 511]);
    }

    #[test]
    fn image_ids_layout() {
        // 32x48 pixels: h = 2, w = 3.
        let ids = image_ids(32, 48);
        #[rustfmt::skip]
        assert_eq!(ids, vec![
            0, 0, 0, 0,  0, 0, 1, 0,  0, 0, 2, 0,
            0, 1, 0, 0,  0, 1, 1, 0,  0, 1, 2, 0,
        ]);
        assert_eq!(image_ids(512, 512).len(), 1024 * 4);
    }

    #[test]
    fn noise_is_reproducible_and_standard_normal() {
        let a = initial_noise(42, 512, 512);
        assert_eq!(a.len(), 1024 * 128);
        assert_eq!(a, initial_noise(42, 512, 512));
        assert_ne!(a, initial_noise(43, 512, 512));
        let n = a.len() as f64;
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = a.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 1.0).abs() < 0.01, "std {}", var.sqrt());
    }

    #[test]
    fn noise_is_drawn_channel_first_then_packed() {
        // 256x512 pixels: h = 16, w = 32, N = 512.
        let (h, w) = (16, 32);
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let draws: Vec<f32> = (0..128 * h * w).map(|_| StandardNormal.sample(&mut rng)).collect();
        let tokens = initial_noise(7, 512, 256);
        // Token t, channel c is draw number c*N + t.
        for (t, c) in [(0, 0), (0, 1), (1, 0), (511, 127), (37, 90)] {
            assert_eq!(tokens[t * 128 + c], draws[c * h * w + t]);
        }
        assert_eq!(unpack_tokens(&tokens, h, w).unwrap(), draws);
    }

    /// Pins the generator: a change of rand_chacha, rand_core or rand_distr that changes the noise
    /// for a seed must be a deliberate decision (it changes every image for that seed).
    #[test]
    fn noise_values_are_pinned() {
        let tokens = initial_noise(0, 256, 256);
        // Token 0, channels 0..3: draws 0, N and 2N.
        assert_eq!(&tokens[..3], &[-1.1388171, 0.7421404, 0.33951908], "noise for seed 0 changed");
    }

    #[test]
    fn euler_step_updates_in_place() {
        let mut x = vec![1.0, 2.0];
        euler_step(&mut x, &[2.0, -4.0], 1.0, 0.75).unwrap();
        assert_eq!(x, vec![0.5, 3.0]);
        assert_eq!(
            euler_step(&mut x, &[1.0], 1.0, 0.5),
            Err(LengthError { what: "the velocity", expected: 2, found: 1 })
        );
    }

    #[test]
    fn f16_round_trip() {
        let h = to_f16(&[1.0, -0.5, 0.958_085_4, 70000.0]);
        assert_eq!(h[2], f16::from_f32(0.958_085_4));
        assert_eq!(from_f16(&h), vec![1.0, -0.5, 0.958_007_8, f32::INFINITY]);
    }

    #[test]
    fn unpack_small() {
        // h = 1, w = 2: two tokens of 128 channels; value = token*1000 + channel.
        let tokens: Vec<f32> = (0..2).flat_map(|t| (0..128).map(move |c| (t * 1000 + c) as f32)).collect();
        let out = unpack_tokens(&tokens, 1, 2).unwrap();
        assert_eq!(&out[..4], &[0.0, 1000.0, 1.0, 1001.0]);
        assert_eq!(out[2 * 127 + 1], 1127.0);
        assert!(unpack_tokens(&tokens, 2, 2).is_err());
    }

    #[test]
    fn unpatchify_small() {
        // h = 1, w = 2; value = channel*10 + column.
        let latent: Vec<f32> = (0..128).flat_map(|k| (0..2).map(move |j| (k * 10 + j) as f32)).collect();
        let out = unpatchify(&latent, 1, 2).unwrap();
        assert_eq!(out.len(), 32 * 2 * 4);
        // VAE channel 0, a 2x4 image: row dy, column 2j+dx holds channel dy*2+dx at column j.
        assert_eq!(&out[..8], &[0.0, 10.0, 1.0, 11.0, 20.0, 30.0, 21.0, 31.0]);
        // VAE channel 31: channels 124..=127.
        assert_eq!(&out[31 * 8..], &[1240.0, 1250.0, 1241.0, 1251.0, 1260.0, 1270.0, 1261.0, 1271.0]);
        assert!(unpatchify(&latent[1..], 1, 2).is_err());
    }
}

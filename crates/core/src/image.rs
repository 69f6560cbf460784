//! The decoder's sample to pixels, and pixels to a PNG that says how it was made.
//!
//! Pixels follow diffusers' post-processing: `round(clamp(x/2 + 0.5, 0, 1) * 255)` in f32, where the
//! rounding is numpy's `np.round`, i.e. half to even ([`f32::round_ties_even`]), not Rust's
//! [`f32::round`] (half away from zero). The two differ only on exact .5 values, but the reference is
//! numpy. NaN becomes 0.
//!
//! The PNG carries the generation parameters in text chunks so an image can be reproduced from the
//! file alone: `prompt` as iTXt (UTF-8), the others as tEXt (ASCII), and `Software` = `Imagine`.

use crate::api::{GenerateRequest, Seed};
use crate::message::{Localize, Message};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The `Software` text chunk's value.
pub const SOFTWARE: &str = "Imagine";

/// Why an image could not be made.
#[derive(Debug, Error)]
pub enum ImageError {
    /// A buffer whose length does not match the image size.
    #[error("{what} has {found} values but a {width}x{height} image needs {expected}")]
    Size {
        /// Which buffer.
        what: &'static str,
        /// Image width.
        width: u32,
        /// Image height.
        height: u32,
        /// The length the size needs.
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// The PNG encoder failed.
    #[error("the PNG could not be encoded: {0}")]
    Png(#[from] png::EncodingError),
}

fn check_size(
    what: &'static str,
    found: usize,
    channels: usize,
    width: u32,
    height: u32,
) -> Result<(), ImageError> {
    let expected = channels * width as usize * height as usize;
    if found == expected {
        Ok(())
    } else {
        Err(ImageError::Size { what, width, height, expected, found })
    }
}

/// The decoder's sample `[3, height, width]` (channel-first, about -1..1) as RGBA8, alpha 255.
pub fn to_rgba8(sample: &[f32], width: u32, height: u32) -> Result<Vec<u8>, ImageError> {
    check_size("the decoded sample", sample.len(), 3, width, height)?;
    let plane = width as usize * height as usize;
    let (r, rest) = sample.split_at(plane);
    let (g, b) = rest.split_at(plane);
    let mut rgba = Vec::with_capacity(plane * 4);
    for ((&r, &g), &b) in r.iter().zip(g).zip(b) {
        rgba.extend_from_slice(&[to_u8(r), to_u8(g), to_u8(b), 255]);
    }
    Ok(rgba)
}

/// One value: `round_half_even(clamp(x/2 + 0.5, 0, 1) * 255)`; NaN -> 0.
fn to_u8(x: f32) -> u8 {
    // `as` saturates and maps NaN to 0.
    ((x / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round_ties_even() as u8
}

/// An image's parameters: what made it, as its PNG's text chunks, its `result` event, the gallery's
/// index and a reused image's settings record them. Structs that carry more flatten it
/// (`#[serde(flatten)]`), so their JSON has these six keys among their own, as before they shared it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageParams {
    /// The prompt as the user gave it.
    pub prompt: String,
    /// The noise seed, in JSON a decimal string (a JS number would round it).
    #[serde(with = "crate::params::decimal")]
    pub seed: u64,
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Denoising steps.
    pub steps: u32,
    /// Schedule name (`empirical`, `linear-shift`).
    pub schedule: String,
}

impl ImageParams {
    /// A `generate` request for the same image again: this prompt, seed, size, steps and schedule.
    pub fn request(&self) -> GenerateRequest {
        GenerateRequest {
            prompt: self.prompt.clone(),
            width: Some(self.width.into()),
            height: Some(self.height.into()),
            steps: Some(self.steps.into()),
            seed: Some(Seed::Text(self.seed.to_string())),
            schedule: Some(self.schedule.clone()),
            ..Default::default()
        }
    }

    /// The `(keyword, text)` pairs written as tEXt chunks (ASCII), in file order.
    fn latin1_chunks(&self) -> [(&'static str, String); 6] {
        [
            ("seed", self.seed.to_string()),
            ("width", self.width.to_string()),
            ("height", self.height.to_string()),
            ("steps", self.steps.to_string()),
            ("schedule", self.schedule.clone()),
            ("Software", SOFTWARE.to_owned()),
        ]
    }
}

/// RGBA8 pixels to a PNG with `meta` in text chunks.
pub fn encode_png(rgba: &[u8], width: u32, height: u32, meta: &ImageParams) -> Result<Vec<u8>, ImageError> {
    check_size("the RGBA image", rgba.len(), 4, width, height)?;
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgba);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.add_itxt_chunk("prompt".to_owned(), meta.prompt.clone())?;
    for (keyword, text) in meta.latin1_chunks() {
        // A schedule name outside Latin-1 would fail here; validated names are ASCII.
        encoder.add_text_chunk(keyword.to_owned(), text)?;
    }
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgba)?;
    writer.finish()?;
    Ok(out)
}

/// The generation parameters of a PNG written by [`encode_png`], from its text chunks (read without
/// decoding the pixels); the error says what is missing.
pub fn read_png_meta(bytes: &[u8]) -> Result<ImageParams, String> {
    let reader =
        png::Decoder::new(std::io::Cursor::new(bytes)).read_info().map_err(|e| format!("not a PNG: {e}"))?;
    let info = reader.info();
    let text = |keyword: &str| {
        info.uncompressed_latin1_text.iter().find(|c| c.keyword == keyword).map(|c| c.text.clone())
    };
    if text("Software").as_deref() != Some(SOFTWARE) {
        return Err(format!("not made by {SOFTWARE} (no Software text chunk)"));
    }
    let number = |keyword: &str| {
        text(keyword).and_then(|t| t.parse::<u64>().ok()).ok_or_else(|| format!("no {keyword} text chunk"))
    };
    let prompt = info
        .utf8_text
        .iter()
        .find(|c| c.keyword == "prompt")
        .and_then(|c| c.get_text().ok())
        .ok_or("no prompt text chunk")?;
    let small =
        |keyword: &str| number(keyword).and_then(|n| u32::try_from(n).map_err(|e| format!("{keyword}: {e}")));
    Ok(ImageParams {
        prompt,
        seed: number("seed")?,
        width: small("width")?,
        height: small("height")?,
        steps: small("steps")?,
        schedule: text("schedule").ok_or("no schedule text chunk")?,
    })
}

/// The pack contract's details are not translated: the text is shown as it is.
impl Localize for ImageError {
    fn message(&self) -> Message {
        Message::text(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_conversion_rounds_half_to_even_and_clamps() {
        assert_eq!(to_u8(-1.0), 0);
        assert_eq!(to_u8(1.0), 255);
        assert_eq!(to_u8(-5.0), 0);
        assert_eq!(to_u8(5.0), 255);
        assert_eq!(to_u8(f32::NAN), 0);
        assert_eq!(to_u8(0.0), 128); // 127.5 -> 128 (even)
                                     // x such that (x/2+0.5)*255 is exactly 0.5, 1.5, 2.5 in f32: ties go to even.
        for (v, want) in [(0.5f32, 0u8), (1.5, 2), (2.5, 2), (3.5, 4)] {
            let x = (v / 255.0 - 0.5) * 2.0;
            let scaled = (x / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0;
            if scaled == v {
                assert_eq!(to_u8(x), want, "{v}");
            }
        }
        assert_eq!(to_u8(0.004), 128); // 128.01
        assert_eq!(to_u8(-0.004), 127); // 126.99
    }

    #[test]
    fn rgba_is_interleaved_with_opaque_alpha() {
        // 2x1 image: R = [-1, 1], G = [0, 1], B = [1, -1].
        let sample = [-1.0, 1.0, 0.0, 1.0, 1.0, -1.0];
        assert_eq!(to_rgba8(&sample, 2, 1).unwrap(), vec![0, 128, 255, 255, 255, 255, 0, 255]);
        assert!(matches!(to_rgba8(&sample, 2, 2), Err(ImageError::Size { expected: 12, found: 6, .. })));
    }

    #[test]
    fn png_round_trip_with_metadata() {
        let (width, height) = (3, 2);
        let rgba: Vec<u8> = (0..width * height * 4).map(|i| (i * 7) as u8).collect();
        let meta = ImageParams {
            prompt: "a cat 猫 🐈‍⬛ «ünïcode»\nline two".into(),
            seed: u64::MAX,
            width,
            height,
            steps: 4,
            schedule: "linear-shift".into(),
        };
        let png_bytes = encode_png(&rgba, width, height, &meta).unwrap();

        let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes.clone())).read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let frame = reader.next_frame(&mut buf).unwrap();
        assert_eq!((frame.width, frame.height), (width, height));
        assert_eq!(frame.color_type, png::ColorType::Rgba);
        assert_eq!(&buf[..frame.buffer_size()], &rgba[..]);

        let info = reader.info();
        let itxt: Vec<(String, String)> =
            info.utf8_text.iter().map(|c| (c.keyword.clone(), c.get_text().unwrap())).collect();
        assert_eq!(itxt, vec![("prompt".to_owned(), meta.prompt.clone())]);
        let text: Vec<(&str, &str)> =
            info.uncompressed_latin1_text.iter().map(|c| (c.keyword.as_str(), c.text.as_str())).collect();
        assert_eq!(read_png_meta(&png_bytes), Ok(meta.clone()));
        assert_eq!(
            text,
            vec![
                ("seed", "18446744073709551615"),
                ("width", "3"),
                ("height", "2"),
                ("steps", "4"),
                ("schedule", "linear-shift"),
                ("Software", "Imagine"),
            ]
        );
    }

    #[test]
    fn png_refuses_wrong_buffer_size() {
        let meta = ImageParams {
            prompt: String::new(),
            seed: 0,
            width: 2,
            height: 2,
            steps: 1,
            schedule: "empirical".into(),
        };
        assert!(matches!(encode_png(&[0; 15], 2, 2, &meta), Err(ImageError::Size { .. })));
    }
}

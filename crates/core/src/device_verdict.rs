//! What will happen on this device, said once for the options page, the popup and the studio: whether
//! the GPU runs the published model as it is or converted to 32-bit floats (and what that costs on
//! disk), whether the adapter is a software renderer, and how big the download is. The pages only
//! render the [`Message`]s; the decision is here so that they cannot disagree.
//!
//! The sizes are the pack's plan where a page has one (the user asked for the size, or a download
//! runs); before that, the published pack's measured figures, said as "about".

use crate::api::PackPlan;
use crate::message::{arg, number, Arg, Message};

/// The published pack's download at the commit measured in BENCHMARKS.md (2.20 + 4.14 + 0.20 GB).
pub const PUBLISHED_PACK_BYTES: u64 = 6_530_000_000;
/// What converting the published pack to float32 added on disk there (the plan said 892,370,085 B).
pub const PUBLISHED_F32_EXTRA_BYTES: u64 = 892_370_085;

/// What the WebGPU adapter offers that decides how the model runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterFacts {
    /// `shader-f16`: the float16 graphs run as published.
    pub shader_f16: bool,
    /// The software renderer the adapter is (`SwiftShader`, `llvmpipe`, ...), if it is one.
    pub software_renderer: Option<String>,
}

/// The software renderer an adapter with this `GPUAdapterInfo` is, if any: such an adapter runs the
/// model on the CPU, minutes per image.
pub fn software_renderer(architecture: &str, description: &str, is_fallback: bool) -> Option<String> {
    let description = description.to_ascii_lowercase();
    if architecture.eq_ignore_ascii_case("swiftshader") || description.contains("swiftshader") {
        Some("SwiftShader".into())
    } else if description.contains("llvmpipe") {
        Some("llvmpipe".into())
    } else if is_fallback {
        Some("fallback adapter".into())
    } else {
        None
    }
}

/// The sizes of the pack as known to a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackFigures {
    /// Bytes downloaded.
    pub download_bytes: u64,
    /// Bytes the float32 conversion adds, where this device lacks `shader-f16`; `None` where the plan
    /// says it needs none.
    pub f32_extra_bytes: Option<u64>,
    /// From this device's plan (`false`: the published pack's figures, said as "about").
    pub planned: bool,
}

impl PackFigures {
    /// The published pack's figures, before any plan was asked for.
    pub fn published() -> PackFigures {
        PackFigures {
            download_bytes: PUBLISHED_PACK_BYTES,
            f32_extra_bytes: Some(PUBLISHED_F32_EXTRA_BYTES),
            planned: false,
        }
    }

    /// The figures of the installed pack: its size and what its float32 conversion added, if it was
    /// converted.
    pub fn installed(bytes: u64, converted_bytes: Option<u64>) -> PackFigures {
        PackFigures { download_bytes: bytes, f32_extra_bytes: converted_bytes, planned: true }
    }

    /// The figures of `plan`, as the service worker made it for this device (`conversion` present
    /// exactly when its GPU lacks `shader-f16` and the pack has float16 graphs).
    pub fn from_plan(plan: &PackPlan) -> PackFigures {
        PackFigures {
            download_bytes: plan.total_bytes,
            f32_extra_bytes: plan.conversion.map(|c| c.extra_disk_bytes),
            planned: true,
        }
    }
}

/// How the model runs here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// No WebGPU adapter: no image can be made in this browser.
    NoWebGpu,
    /// With `shader-f16` (or a pack without float16 graphs): as downloaded.
    AsPublished,
    /// Without `shader-f16`, a pack without float16 graphs: nothing to convert.
    NothingToConvert,
    /// Without `shader-f16`: converted once at download, `extra_bytes` more on disk.
    Converted {
        /// Bytes the conversion adds on disk.
        extra_bytes: u64,
    },
}

/// The verdict for this device and pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// How the model runs.
    pub runs: Runs,
    /// The adapter is this software renderer: very slow.
    pub software_renderer: Option<String>,
    /// The sizes it is about.
    pub figures: PackFigures,
}

impl Verdict {
    /// The verdict for `adapter` (`None`: no WebGPU adapter) and the pack's `figures`.
    pub fn new(adapter: Option<&AdapterFacts>, figures: PackFigures) -> Verdict {
        let runs = match adapter {
            None => Runs::NoWebGpu,
            Some(a) if a.shader_f16 => Runs::AsPublished,
            // A plan made on this very device knows whether the pack needs converting at all.
            Some(_) => match figures.f32_extra_bytes {
                Some(extra_bytes) => Runs::Converted { extra_bytes },
                None if figures.planned => Runs::NothingToConvert,
                None => Runs::Converted { extra_bytes: PUBLISHED_F32_EXTRA_BYTES },
            },
        };
        Verdict { runs, software_renderer: adapter.and_then(|a| a.software_renderer.clone()), figures }
    }

    /// Whether an image can be made here at all.
    pub fn can_run(&self) -> bool {
        self.runs != Runs::NoWebGpu
    }

    /// What happens to the model on this GPU, in one sentence.
    pub fn summary(&self) -> Message {
        match self.runs {
            Runs::NoWebGpu => Message::new("verdictNoWebGpu", []),
            Runs::AsPublished => Message::new("verdictAsPublished", []),
            Runs::NothingToConvert => Message::new("verdictNothingToConvert", []),
            Runs::Converted { extra_bytes } => {
                Message::new("verdictConverted", [self.size("+", extra_bytes)])
            }
        }
    }

    /// A warning that images will be very slow: the adapter is a software renderer.
    pub fn warning(&self) -> Option<Message> {
        let renderer = self.software_renderer.as_ref().filter(|_| self.can_run())?;
        Some(Message::new("verdictSoftware", [arg(renderer)]))
    }

    /// What is downloaded: the model and its size.
    pub fn download(&self) -> Message {
        Message::new("verdictDownload", [self.size("", self.figures.download_bytes)])
    }

    /// `bytes` in GB after `sign`, "about" unless from this device's plan.
    fn size(&self, sign: &str, bytes: u64) -> Arg {
        let size = format!("{sign}{}", crate::hub::format_bytes(bytes));
        if self.figures.planned {
            number(size)
        } else {
            Arg::Message(Message::new("verdictAbout", [number(size)]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ConversionCost, PackSource};

    fn adapter(shader_f16: bool, software: Option<&str>) -> AdapterFacts {
        AdapterFacts { shader_f16, software_renderer: software.map(str::to_owned) }
    }

    fn plan(total_bytes: u64, conversion: Option<u64>) -> PackPlan {
        PackPlan {
            source: PackSource::default(),
            commit: "c".repeat(40),
            files: Vec::new(),
            total_bytes,
            conversion: conversion.map(|extra_disk_bytes| ConversionCost { extra_disk_bytes, gpu_bytes: 1 }),
        }
    }

    fn about(size: &str) -> Arg {
        Arg::Message(Message::new("verdictAbout", [number(size)]))
    }

    #[test]
    fn without_shader_f16_the_model_is_converted_at_the_plans_cost() {
        let v = Verdict::new(
            Some(&adapter(false, None)),
            PackFigures::from_plan(&plan(6_530_000_000, Some(892_370_085))),
        );
        assert_eq!(v.runs, Runs::Converted { extra_bytes: 892_370_085 });
        assert_eq!(v.summary(), Message::new("verdictConverted", [number("+892 MB")]));
        assert_eq!(v.download(), Message::new("verdictDownload", [number("6.5 GB")]));
        assert_eq!(v.warning(), None);
        assert!(v.can_run());
    }

    #[test]
    fn before_a_plan_the_published_figures_are_said_as_about() {
        let v = Verdict::new(Some(&adapter(false, None)), PackFigures::published());
        assert_eq!(v.summary(), Message::new("verdictConverted", [about("+892 MB")]));
        assert_eq!(v.download(), Message::new("verdictDownload", [about("6.5 GB")]));
    }

    #[test]
    fn with_shader_f16_or_a_pack_without_float16_it_runs_as_published() {
        let f16 = Verdict::new(Some(&adapter(true, None)), PackFigures::published());
        assert_eq!(f16.summary(), Message::new("verdictAsPublished", []));
        // A plan made here without a conversion, or a pack installed without one: the pack has no
        // float16 graph to convert.
        for figures in [PackFigures::from_plan(&plan(10, None)), PackFigures::installed(10, None)] {
            let float32_pack = Verdict::new(Some(&adapter(false, None)), figures);
            assert_eq!(float32_pack.runs, Runs::NothingToConvert);
            assert_eq!(float32_pack.summary(), Message::new("verdictNothingToConvert", []));
        }
        let converted =
            Verdict::new(Some(&adapter(false, None)), PackFigures::installed(10, Some(900_000_000)));
        assert_eq!(converted.summary(), Message::new("verdictConverted", [number("+900 MB")]));
    }

    #[test]
    fn a_software_renderer_is_warned_about_and_no_webgpu_cannot_run() {
        let slow = Verdict::new(Some(&adapter(false, Some("SwiftShader"))), PackFigures::published());
        assert_eq!(slow.warning(), Some(Message::new("verdictSoftware", [arg("SwiftShader")])));
        let none = Verdict::new(None, PackFigures::published());
        assert!(!none.can_run());
        assert_eq!(none.summary(), Message::new("verdictNoWebGpu", []));
        assert_eq!(none.warning(), None);
    }

    #[test]
    fn software_renderers_are_recognised() {
        assert_eq!(software_renderer("swiftshader", "", false).as_deref(), Some("SwiftShader"));
        assert_eq!(software_renderer("", "Google SwiftShader", false).as_deref(), Some("SwiftShader"));
        assert_eq!(
            software_renderer("", "llvmpipe (LLVM 15.0.6, 256 bits)", false).as_deref(),
            Some("llvmpipe")
        );
        assert_eq!(software_renderer("", "", true).as_deref(), Some("fallback adapter"));
        assert_eq!(software_renderer("hopper", "NVIDIA H200", false), None);
    }
}

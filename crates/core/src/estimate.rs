//! The studio's time estimate: each stage's wall-clock time of earlier images on this machine, kept per
//! image size, and what is left of an image at a progress report. Plain arithmetic: the studio stores
//! the runs in `chrome.storage` and words the result.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::{Progress, Stage};

/// Runs kept per size for the estimate.
pub const KEPT_RUNS: usize = 5;

/// Wall-clock time of each stage of one finished image, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageTimes {
    /// From the request to the first transformer report.
    pub encode_ms: f64,
    /// Loading the transformer (its report of step 0 to step 1).
    pub load_ms: f64,
    /// One denoising step.
    pub step_ms: f64,
    /// From the decoder's report to the image.
    pub decode_ms: f64,
}

impl StageTimes {
    /// The mean of `runs` (none: `None`).
    pub fn mean(runs: &[StageTimes]) -> Option<StageTimes> {
        if runs.is_empty() {
            return None;
        }
        let n = runs.len() as f64;
        let sum = |f: fn(&StageTimes) -> f64| runs.iter().map(f).sum::<f64>() / n;
        Some(StageTimes {
            encode_ms: sum(|t| t.encode_ms),
            load_ms: sum(|t| t.load_ms),
            step_ms: sum(|t| t.step_ms),
            decode_ms: sum(|t| t.decode_ms),
        })
    }

    /// Milliseconds left of an image at `progress` (`None`: not started), `in_stage_ms` after the
    /// report, with `steps` steps.
    pub fn left_ms(&self, progress: Option<&Progress>, in_stage_ms: f64, steps: u32) -> f64 {
        let steps_ms = |n: u32| self.step_ms * f64::from(n);
        let left = match progress {
            None => self.encode_ms - in_stage_ms + self.load_ms + steps_ms(steps) + self.decode_ms,
            Some(p) => match p.stage {
                Stage::TextEncoder => {
                    self.encode_ms - in_stage_ms + self.load_ms + steps_ms(steps) + self.decode_ms
                }
                Stage::Transformer if p.step == 0 => {
                    self.load_ms - in_stage_ms + steps_ms(steps) + self.decode_ms
                }
                Stage::Transformer => steps_ms(steps.saturating_sub(p.step)) - in_stage_ms + self.decode_ms,
                Stage::Decoder => self.decode_ms - in_stage_ms,
            },
        };
        left.max(0.0)
    }

    /// One whole image.
    pub fn image_ms(&self, steps: u32) -> f64 {
        self.encode_ms + self.load_ms + self.step_ms * f64::from(steps) + self.decode_ms
    }
}

/// How far one image is, 0..1, by stage (when there is no estimate yet).
pub fn stage_fraction(progress: Option<&Progress>) -> f64 {
    match progress {
        None => 0.0,
        Some(p) => match p.stage {
            Stage::TextEncoder => 0.05,
            Stage::Transformer => 0.1 + 0.8 * f64::from(p.step) / f64::from(p.steps.max(1)),
            Stage::Decoder => 0.92,
        },
    }
}

/// The key of a size in the stored timings.
pub fn size_key(width: u32, height: u32) -> String {
    format!("{width}x{height}")
}

/// Stored timings: size key -> the last runs.
pub type TimingStore = BTreeMap<String, Vec<StageTimes>>;

/// Adds a run, keeping the last [`KEPT_RUNS`] per size.
pub fn remember(store: &mut TimingStore, key: String, run: StageTimes) {
    let runs = store.entry(key).or_default();
    runs.push(run);
    if runs.len() > KEPT_RUNS {
        runs.drain(..runs.len() - KEPT_RUNS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A progress report as the API sends it (so the test does not depend on every field).
    fn p(stage: &str, step: u32) -> Progress {
        serde_json::from_value(serde_json::json!({"stage": stage, "step": step, "steps": 4})).unwrap()
    }

    #[test]
    fn estimates_follow_the_stages() {
        let t = StageTimes { encode_ms: 1000.0, load_ms: 2000.0, step_ms: 500.0, decode_ms: 1000.0 };
        assert_eq!(t.image_ms(4), 6000.0);
        assert_eq!(t.left_ms(None, 0.0, 4), 6000.0);
        assert_eq!(t.left_ms(Some(&p("transformer", 0)), 500.0, 4), 4500.0);
        assert_eq!(t.left_ms(Some(&p("transformer", 2)), 100.0, 4), 1900.0);
        assert_eq!(t.left_ms(Some(&p("decoder", 1)), 5000.0, 4), 0.0);
        let mean = StageTimes::mean(&[t, StageTimes { step_ms: 1500.0, ..t }]).unwrap();
        assert_eq!(mean.step_ms, 1000.0);
        assert_eq!(StageTimes::mean(&[]), None);
    }

    #[test]
    fn only_the_last_runs_are_kept() {
        let mut store = TimingStore::new();
        for i in 0..8 {
            remember(
                &mut store,
                "512x512".into(),
                StageTimes { step_ms: f64::from(i), ..Default::default() },
            );
        }
        let runs = &store["512x512"];
        assert_eq!(runs.len(), KEPT_RUNS);
        assert_eq!(runs[0].step_ms, 3.0);
    }

    #[test]
    fn the_fraction_without_history_moves_by_stage() {
        let fractions = [
            stage_fraction(None),
            stage_fraction(Some(&p("textEncoder", 1))),
            stage_fraction(Some(&p("transformer", 2))),
            stage_fraction(Some(&p("decoder", 1))),
        ];
        assert!(fractions.windows(2).all(|w| w[0] < w[1]), "{fractions:?}");
    }
}

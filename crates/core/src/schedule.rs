//! The sigma schedule of the denoising loop.
//!
//! FLUX.2 klein is a flow-matching model: the transformer is called once per step at a noise level
//! `sigma` (1 = pure noise, 0 = image), and the schedule says which sigmas. It is
//! `linspace(1, 1/n, n)` bent by the exponential time shift `e^mu / (e^mu + (1/sigma - 1))`, with a
//! final 0 appended; the rules below differ only in `mu`.
//!
//! * [`Schedule::Empirical`] (default): upstream's `compute_empirical_mu(N, n)` (diffusers'
//!   `Flux2KleinPipeline`, Black Forest Labs' `flux2/sampling.py`), which the distilled model was
//!   trained with. Above 4300 image tokens it ignores the step count, so mu drops discontinuously;
//!   that is upstream's formula, reproduced on purpose.
//! * [`Schedule::LinearShift`]: FLUX.1's `calculate_shift` (0.5 at 256 tokens to 1.15 at 4096), what
//!   the pack's card and demo use.
//!
//! The arithmetic mirrors diffusers: mu in f64 (Python floats), `linspace` in f64 then cast to f32,
//! and the shift in f32 (numpy applies a Python float to a float32 array in float32).

/// A named rule for the sigma schedule. See the module docs. Serialized by its API name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Upstream klein's `compute_empirical_mu`; the default.
    #[default]
    Empirical,
    /// FLUX.1's `calculate_shift`, as on the pack's card.
    LinearShift,
}

impl Schedule {
    /// Every schedule, in the order the API lists them.
    pub const ALL: [Schedule; 2] = [Schedule::Empirical, Schedule::LinearShift];

    /// The schedule called `name` in the message API (`empirical`, `linear-shift`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The name used in the message API and in PNG metadata.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Empirical => "empirical",
            Schedule::LinearShift => "linear-shift",
        }
    }

    /// The time-shift parameter for `image_tokens` = (H/16)·(W/16) tokens and `steps` steps.
    pub fn mu(self, image_tokens: u32, steps: u32) -> f64 {
        let n_tokens = f64::from(image_tokens);
        match self {
            Schedule::Empirical => {
                let (a1, b1) = (8.73809524e-05, 1.89833333);
                let (a2, b2) = (0.00016927, 0.45666666);
                if image_tokens > 4300 {
                    return a2 * n_tokens + b2;
                }
                let m_200 = a2 * n_tokens + b2;
                let m_10 = a1 * n_tokens + b1;
                let a = (m_200 - m_10) / 190.0;
                let b = m_200 - 200.0 * a;
                a * f64::from(steps) + b
            }
            Schedule::LinearShift => {
                let (base_len, max_len) = (256.0, 4096.0);
                let (base_shift, max_shift) = (0.5, 1.15);
                let m = (max_shift - base_shift) / (max_len - base_len);
                let b = base_shift - m * base_len;
                n_tokens * m + b
            }
        }
    }

    /// The `steps + 1` sigmas of a run, from 1 down to a final 0.0.
    ///
    /// `steps` is at least 1 after validation; 0 steps gives just `[0.0]`.
    pub fn sigmas(self, image_tokens: u32, steps: u32) -> Vec<f32> {
        let exp_mu = self.mu(image_tokens, steps).exp() as f32;
        let mut sigmas: Vec<f32> = linspace(1.0, 1.0 / f64::from(steps), steps)
            .into_iter()
            .map(|s| {
                let s = s as f32;
                exp_mu / (exp_mu + (1.0 / s - 1.0))
            })
            .collect();
        sigmas.push(0.0);
        sigmas
    }
}

/// numpy's `linspace(start, stop, num)` (endpoint included), in f64 and element for element:
/// `start + i * step`, with the last element set to `stop` exactly.
fn linspace(start: f64, stop: f64, num: u32) -> Vec<f64> {
    match num {
        0 => Vec::new(),
        1 => vec![start],
        _ => {
            let step = (stop - start) / f64::from(num - 1);
            let mut v: Vec<f64> = (0..num).map(|i| f64::from(i) * step + start).collect();
            v[num as usize - 1] = stop;
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_close(got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= tol, "{got:?} vs {want:?} (tolerance {tol})");
        }
    }

    /// Every row of reference-pipeline.md Part B §4 (empirical mu, 4 steps).
    #[test]
    fn empirical_matches_reference_table() {
        #[rustfmt::skip]
        let rows: [(u32, u32, f64, [f32; 5], f32); 6] = [
            (512, 512, 2.030690, [1.0, 0.958085, 0.883982, 0.717497, 0.0], 1e-6),
            (768, 768, 2.139227, [1.0, 0.962234, 0.894658, 0.738969, 0.0], 1e-6),
            (1024, 1024, 2.291180, [1.0, 0.967384, 0.908144, 0.767200, 0.0], 1e-6),
            (1024, 1088, 1.193328, [1.0, 0.9082, 0.7673, 0.5237, 0.0], 1e-4),
            (1344, 1024, 1.366651, [1.0, 0.9217, 0.7968, 0.5666, 0.0], 1e-4),
            (1536, 1536, 2.016659, [1.0, 0.957518, 0.882535, 0.714644, 0.0], 1e-6),
        ];
        for (w, h, mu, sigmas, tol) in rows {
            let n = (w / 16) * (h / 16);
            let got_mu = Schedule::Empirical.mu(n, 4);
            // The table gives mu to 6 decimals, but its two rows above 4300 tokens are off the
            // formula by 1.7e-6 and 1.1e-5 (their sigmas, to 4 decimals, agree); hence 2e-5 there.
            let mu_tol = if n > 4300 { 2e-5 } else { 1e-6 };
            assert!((got_mu - mu).abs() < mu_tol, "{w}x{h}: mu {got_mu} vs {mu}");
            assert_close(&Schedule::Empirical.sigmas(n, 4), &sigmas, tol);
        }
    }

    /// Bit for bit what diffusers computes (numpy float32), from `np.linspace(1, 1/n, n)
    /// .astype(np.float32)` shifted with `math.exp(mu)` as in `FlowMatchEulerDiscreteScheduler`.
    #[test]
    fn matches_numpy_float32() {
        let cases: [(Schedule, u32, u32, &[f64]); 12] = [
            (
                Schedule::Empirical,
                1024,
                4,
                &[1.0, 0.9580853581428528, 0.8839818835258484, 0.7174965739250183, 0.0],
            ),
            (Schedule::Empirical, 256, 1, &[1.0, 0.0]),
            (
                Schedule::Empirical,
                4096,
                8,
                &[
                    1.0,
                    0.9854254722595215,
                    0.9666411280632019,
                    0.9415147304534912,
                    0.906182587146759,
                    0.8528416752815247,
                    0.7630144953727722,
                    0.5798067450523376,
                    0.0,
                ],
            ),
            (Schedule::Empirical, 5376, 3, &[1.0, 0.8869349956512451, 0.6622897386550903, 0.0]),
            (
                Schedule::Empirical,
                9216,
                7,
                &[
                    1.0,
                    0.9782981872558594,
                    0.9494514465332031,
                    0.909235954284668,
                    0.8492814898490906,
                    0.7503291368484497,
                    0.5559890866279602,
                    0.0,
                ],
            ),
            (
                Schedule::Empirical,
                2304,
                50,
                &[
                    1.0,
                    0.9967559576034546,
                    0.9933990836143494,
                    0.9899232983589172,
                    0.9863223433494568,
                    0.9825891256332397,
                    0.9787163138389587,
                    0.9746959209442139,
                    0.9705194234848022,
                    0.9661773443222046,
                    0.9616599082946777,
                    0.9569560885429382,
                    0.9520541429519653,
                    0.9469413757324219,
                    0.9416037201881409,
                    0.9360261559486389,
                    0.9301919937133789,
                    0.9240832924842834,
                    0.917680025100708,
                    0.9109604954719543,
                    0.9039005637168884,
                    0.8964738249778748,
                    0.8886507749557495,
                    0.8803989291191101,
                    0.8716820478439331,
                    0.8624595999717712,
                    0.85268634557724,
                    0.8423115015029907,
                    0.8312775492668152,
                    0.8195198178291321,
                    0.8069645166397095,
                    0.7935277819633484,
                    0.7791132926940918,
                    0.7636103630065918,
                    0.7468910217285156,
                    0.7288059592247009,
                    0.7091808915138245,
                    0.6878103613853455,
                    0.6644505262374878,
                    0.6388103365898132,
                    0.6105385422706604,
                    0.5792081356048584,
                    0.5442942976951599,
                    0.5051450133323669,
                    0.4609399139881134,
                    0.4106318950653076,
                    0.3528634309768677,
                    0.28584209084510803,
                    0.20715129375457764,
                    0.11345259845256805,
                    0.0,
                ],
            ),
            (
                Schedule::LinearShift,
                1024,
                4,
                &[1.0, 0.8492348194122314, 0.652489423751831, 0.38494473695755005, 0.0],
            ),
            (Schedule::LinearShift, 256, 1, &[1.0, 0.0]),
            (
                Schedule::LinearShift,
                4096,
                8,
                &[
                    1.0,
                    0.956723690032959,
                    0.9045307636260986,
                    0.8403487801551819,
                    0.7595109343528748,
                    0.654566764831543,
                    0.5128441452980042,
                    0.31090107560157776,
                    0.0,
                ],
            ),
            (Schedule::LinearShift, 5376, 3, &[1.0, 0.8869355320930481, 0.6622908115386963, 0.0]),
            (
                Schedule::LinearShift,
                9216,
                7,
                &[
                    1.0,
                    0.9782983660697937,
                    0.9494518041610718,
                    0.9092365503311157,
                    0.8492825031280518,
                    0.7503305077552795,
                    0.555990993976593,
                    0.0,
                ],
            ),
            (
                Schedule::LinearShift,
                2304,
                50,
                &[
                    1.0,
                    0.9913240671157837,
                    0.982445240020752,
                    0.9733563661575317,
                    0.9640499949455261,
                    0.9545180201530457,
                    0.9447523951530457,
                    0.9347440600395203,
                    0.9244842529296875,
                    0.9139630794525146,
                    0.903170645236969,
                    0.8920961022377014,
                    0.8807284235954285,
                    0.8690557479858398,
                    0.8570655584335327,
                    0.8447448015213013,
                    0.8320796489715576,
                    0.819055438041687,
                    0.8056566119194031,
                    0.7918668389320374,
                    0.7776687145233154,
                    0.7630437612533569,
                    0.7479726672172546,
                    0.7324344515800476,
                    0.7164071798324585,
                    0.6998674273490906,
                    0.6827901005744934,
                    0.6651486754417419,
                    0.6469146609306335,
                    0.6280577182769775,
                    0.6085453033447266,
                    0.5883427262306213,
                    0.5674126744270325,
                    0.5457150936126709,
                    0.5232070088386536,
                    0.49984219670295715,
                    0.4755707085132599,
                    0.45033881068229675,
                    0.4240882396697998,
                    0.3967561423778534,
                    0.36827418208122253,
                    0.3385683298110962,
                    0.3075578808784485,
                    0.2751550078392029,
                    0.2412637174129486,
                    0.20577916502952576,
                    0.16858620941638947,
                    0.12955841422080994,
                    0.08855663239955902,
                    0.045427169650793076,
                    0.0,
                ],
            ),
        ];
        for (schedule, n, steps, want) in cases {
            let want: Vec<f32> = want.iter().map(|&x| x as f32).collect();
            assert_eq!(schedule.sigmas(n, steps), want, "{schedule:?} {n} tokens {steps} steps");
        }
    }

    #[test]
    fn empirical_mu_drops_above_4300_tokens() {
        assert!(Schedule::Empirical.mu(4300, 4) > 2.3);
        assert!(Schedule::Empirical.mu(4301, 4) < 1.2);
        // Above 4300 tokens the step count is ignored.
        assert_eq!(Schedule::Empirical.mu(5000, 4), Schedule::Empirical.mu(5000, 50));
    }

    /// The pack card's numbers: mu 0.63 and [1, 0.849, 0.652, 0.385, 0] at 1024 tokens, 4 steps.
    #[test]
    fn linear_shift_matches_pack_card() {
        assert!((Schedule::LinearShift.mu(1024, 4) - 0.63).abs() < 1e-12);
        assert_close(&Schedule::LinearShift.sigmas(1024, 4), &[1.0, 0.849, 0.652, 0.385, 0.0], 5e-4);
        assert!((Schedule::LinearShift.mu(256, 1) - 0.5).abs() < 1e-12);
        assert!((Schedule::LinearShift.mu(4096, 1) - 1.15).abs() < 1e-12);
    }

    #[test]
    fn sigmas_have_steps_plus_one_values_from_one_to_zero() {
        for steps in 1..=50 {
            for schedule in Schedule::ALL {
                let s = schedule.sigmas(1024, steps);
                assert_eq!(s.len(), steps as usize + 1);
                assert_eq!(s[0], 1.0);
                assert_eq!(*s.last().unwrap(), 0.0);
                assert!(s.windows(2).all(|w| w[0] > w[1]), "{schedule:?} {steps}: {s:?}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for s in Schedule::ALL {
            assert_eq!(Schedule::from_name(s.name()), Some(s));
        }
        assert_eq!(Schedule::from_name("Empirical"), None);
        assert_eq!(Schedule::default(), Schedule::Empirical);
    }

    #[test]
    fn linspace_is_numpys() {
        assert_eq!(linspace(1.0, 0.25, 4), vec![1.0, 0.75, 0.5, 0.25]);
        assert_eq!(linspace(1.0, 1.0, 1), vec![1.0]);
    }
}

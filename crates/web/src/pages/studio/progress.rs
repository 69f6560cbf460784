//! The run on screen: its progress as a bar by stage with the time so far and an estimate from
//! earlier runs on this machine, Cancel, and the per-stage times it leaves for the next estimate.

use super::*;

/// The job on screen.
pub(super) struct Run {
    pub(super) job: String,
    pub(super) count: u32,
    pub(super) steps: u32,
    pub(super) width: u32,
    pub(super) height: u32,
    /// When the request was sent (`performance.now()`); `None` when the page opened on a running job
    /// (its timings are then not recorded).
    pub(super) started: Option<f64>,
    /// When the page began following it.
    pub(super) followed: f64,
    /// A private job: its timings are not kept.
    pub(super) private: bool,
    pub(super) progress: Option<Progress>,
    /// The image the progress is about (0-based).
    pub(super) image: u32,
    /// When the last progress report came.
    pub(super) progress_at: f64,
    /// Marks for this run's per-stage timings: first transformer report, step 1, decoder report.
    pub(super) transformer_at: Option<f64>,
    pub(super) step1_at: Option<f64>,
    pub(super) decoder_at: Option<f64>,
    /// The furthest the bar has been: it never goes back, although the estimate behind it can grow
    /// (a stage that overran its estimate, then the next stage's estimate taken whole).
    pub(super) shown: f64,
    pub(super) ended: bool,
}

impl Run {
    /// A run of `job` followed from now; `started`: when its request was sent, if from this page.
    pub(super) fn new(
        job: String,
        count: u32,
        steps: u32,
        (width, height): (u32, u32),
        started: Option<f64>,
    ) -> Run {
        let now = now_ms();
        Run {
            job,
            count,
            steps,
            width,
            height,
            started,
            followed: now,
            private: false,
            progress: None,
            image: 0,
            progress_at: now,
            transformer_at: None,
            step1_at: None,
            decoder_at: None,
            shown: 0.0,
            ended: false,
        }
    }
}

pub(super) fn begin_run(run: Run) {
    let count = run.count as usize;
    with(|s| {
        s.run = Some(run);
        s.results.start(count);
    });
    set_running(true);
    set_visible("run", true);
    // The last image stays on screen, with its actions, until this run's first one arrives.
    set_text("progress", &i18n::t("starting"));
    view::show_stages(None);
    render_progress();
}

pub(super) fn set_running(running: bool) {
    element::<HtmlButtonElement>("generate").set_disabled(running);
    set_visible("cancel", running);
    for id in ["again", "variations"] {
        element::<HtmlButtonElement>(id).set_disabled(running);
    }
}

pub(super) async fn cancel() {
    let job = with(|s| s.run.as_ref().filter(|r| !r.ended).map(|r| r.job.clone()));
    if let Some(job) = job {
        request(&Request::Cancel { job }).await;
    }
}

pub(super) fn on_progress(progress: Progress) {
    let now = now_ms();
    with(|s| {
        let Some(run) = s.run.as_mut() else { return };
        if progress.images > run.count {
            run.count = progress.images;
            s.results.grow(progress.images as usize);
        }
        run.image = progress.image;
        run.steps = progress.steps.max(run.steps);
        if run.image == 0 {
            if progress.stage == Stage::Transformer && run.transformer_at.is_none() {
                run.transformer_at = Some(now);
            }
            if progress.stage == Stage::Transformer && progress.step == 1 && run.step1_at.is_none() {
                run.step1_at = Some(now);
            }
            if progress.stage == Stage::Decoder && run.decoder_at.is_none() {
                run.decoder_at = Some(now);
            }
        }
        run.progress = Some(progress.clone());
        run.progress_at = now;
    });
    view::show_stages(Some(&progress));
    let (image, count) = with(|s| s.run.as_ref().map_or((0, 1), |r| (r.image, r.count)));
    let mut text = describe(&progress);
    if count > 1 {
        text = i18n::t_args("studioImageOf", &[&(image + 1).to_string(), &count.to_string(), &text]);
    }
    set_text("progress", &text);
    render_progress();
}

pub(super) fn on_result(result: GenerateResult) {
    let ended = with(|s| s.run.is_none() || s.results.arrive(result));
    show_results();
    if ended {
        record_timings();
        end_run(true);
        spawn_local(scroll_to_result());
    }
}

/// Brings the finished result into view: a side panel is short, the form alone can fill it, and the
/// image would come below it unseen. The whole result when it fits (its actions at the bottom), else
/// its top, the image first; measured once the image is decoded, which is what gives it its height.
pub(super) async fn scroll_to_result() {
    let image = element::<web_sys::HtmlImageElement>("image");
    // A selected grid image that cannot be decoded still leaves the rest worth showing.
    let _ = JsFuture::from(image.decode()).await;
    let result = element::<HtmlElement>("result");
    let room = web_sys::window().and_then(|w| w.inner_height().ok()?.as_f64()).unwrap_or(0.0);
    result.scroll_into_view_with_bool(result.get_bounding_client_rect().height() > room);
}

pub(super) fn end_run(done: bool) {
    with(|s| {
        if let Some(run) = s.run.as_mut() {
            run.ended = true;
        }
    });
    set_running(false);
    // Whatever ended it, there is no time left to count down.
    set_text("timing", "");
    if done {
        set_text("progress", &i18n::t("progressDone"));
        view::show_fraction(1.0);
        set_visible("run", false);
    }
}

pub(super) fn record_timings() {
    let sample = with(|s| {
        let run = s.run.as_ref()?;
        let started = run.started?;
        // A private run leaves nothing on this machine, not even how long it took.
        if run.count != 1 || run.private {
            return None;
        }
        let (transformer, step1, decoder) = (run.transformer_at?, run.step1_at?, run.decoder_at?);
        let steps = f64::from(run.steps.max(1));
        let times = StageTimes {
            encode_ms: transformer - started,
            load_ms: 0.0_f64.max(step1 - transformer - (decoder - step1) / steps),
            step_ms: (decoder - step1) / (steps - 1.0).max(1.0),
            decode_ms: now_ms() - decoder,
        };
        remember(&mut s.timings, size_key(run.width, run.height), times);
        Some(s.timings.clone())
    });
    if let Some(timings) = sample {
        spawn_local(async move { storage::STUDIO_TIMINGS.set_or_log(&timings).await });
    }
}

/// Every second while a job runs: the bar, the elapsed time and the estimate.
pub(super) fn tick() {
    if with(|s| s.run.as_ref().is_some_and(|r| !r.ended)) {
        render_progress();
    }
}

pub(super) fn render_progress() {
    let now = now_ms();
    let view = with(|s| {
        let run = s.run.as_mut().filter(|r| !r.ended)?;
        let history = StageTimes::mean(s.timings.get(&size_key(run.width, run.height)).map_or(&[], |v| v));
        let elapsed = now - run.started.unwrap_or(run.followed);
        let in_stage = now - if run.progress.is_some() { run.progress_at } else { run.followed };
        let images_left = run.count.saturating_sub(run.image + 1);
        let left = history.map(|h| {
            h.left_ms(run.progress.as_ref(), in_stage, run.steps)
                + f64::from(images_left) * (h.image_ms(run.steps) - h.encode_ms)
        });
        let own = match left {
            Some(left) if elapsed + left > 0.0 => elapsed / (elapsed + left),
            _ => stage_fraction(run.progress.as_ref()),
        };
        let fraction = (f64::from(run.image) + own.min(1.0)) / f64::from(run.count.max(1));
        run.shown = run.shown.max(fraction.min(1.0));
        Some((run.shown, elapsed, left))
    });
    let Some((fraction, elapsed, left)) = view else { return };
    view::show_fraction(fraction);
    let mut timing = view::describe_elapsed(elapsed);
    if let Some(left) = left {
        timing.push_str(" \u{00b7} ");
        timing.push_str(&view::describe_time_left(left / 1000.0));
    }
    set_text("timing", &timing);
}

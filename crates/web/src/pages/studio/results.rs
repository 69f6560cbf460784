//! The studio's results: one slot per image of the batch on screen, filled as the images arrive; the
//! selected one large with its parameters and save link, the batch as a grid of thumbnails (`#grid`,
//! one delegated listener, each thumbnail's slot in `data-index`), and copying the shown PNG.

use imagine_core::api::GenerateResult;
use imagine_core::gallery;
use wasm_bindgen::prelude::*;
use web_sys::{HtmlButtonElement, HtmlElement, HtmlImageElement};

use crate::pages::view::{child, document, dom, element, from_template, set_text, set_visible, show_png};
use crate::platform::i18n;

/// The batch on screen. A new run's batch replaces it only when its first image arrives: until then,
/// and if the run is cancelled or fails, the last images stay on screen with their actions.
#[derive(Debug, Clone, Default)]
pub struct Results {
    slots: Vec<Option<GenerateResult>>,
    selected: usize,
    /// The size of the batch a run has started, none of whose images has arrived yet.
    next: Option<usize>,
}

impl Results {
    pub const fn new() -> Self {
        Results { slots: Vec::new(), selected: 0, next: None }
    }

    /// A new batch of `count` images, none arrived yet: it replaces the one on screen with its first image.
    pub fn start(&mut self, count: usize) {
        self.next = Some(count);
    }

    /// A batch that has ended: every image there, the first selected.
    pub fn finished(&mut self, results: Vec<GenerateResult>) {
        self.slots = results.into_iter().map(Some).collect();
        self.selected = 0;
        self.next = None;
    }

    /// Makes room for `count` images (a job followed midway learns its count late).
    pub fn grow(&mut self, count: usize) {
        if let Some(next) = self.next.as_mut() {
            *next = (*next).max(count);
        } else if self.slots.len() < count {
            self.slots.resize(count, None);
        }
    }

    /// Puts `result` in its slot and selects it while the selected slot is still empty or nothing
    /// before it has come; true when every slot is filled.
    pub fn arrive(&mut self, result: GenerateResult) -> bool {
        if let Some(count) = self.next.take() {
            self.slots = vec![None; count];
            self.selected = 0;
        }
        self.grow((result.count as usize).max(1));
        let slot = (result.index as usize).min(self.slots.len() - 1);
        self.slots[slot] = Some(result);
        if self.slots.iter().take(self.selected + 1).all(Option::is_none)
            || self.slots[self.selected].is_none()
        {
            self.selected = slot;
        }
        self.slots.iter().all(Option::is_some)
    }

    /// Forgets the images deleted from the gallery (`all`: every image kept there; a private one never
    /// was); whether one is left to show.
    pub fn forget(&mut self, deleted: &[String], all: bool) -> bool {
        let gone = |r: &GenerateResult| {
            !r.private && (all || deleted.iter().any(|id| *id == gallery::image_id(&r.job, r.index)))
        };
        let shown = self.selected().cloned();
        self.slots.retain(|slot| slot.as_ref().is_some_and(|r| !gone(r)));
        self.selected = shown
            .and_then(|shown| self.slots.iter().position(|slot| slot.as_ref() == Some(&shown)))
            .unwrap_or(0);
        !self.slots.is_empty()
    }

    /// Selects slot `index`, if its image is there.
    pub fn select(&mut self, index: usize) {
        if self.slots.get(index).is_some_and(Option::is_some) {
            self.selected = index;
        }
    }

    /// The image shown large.
    pub fn selected(&self) -> Option<&GenerateResult> {
        self.slots.get(self.selected)?.as_ref()
    }

    /// Shows the selected image large, with its parameters, and the batch as a grid when it has more
    /// than one image.
    pub fn show(&self) {
        let Some(result) = self.selected() else { return };
        set_visible("result", true);
        show_png("image", "save-png", &result.png, &result.image.prompt, result.image.seed);
        // The image's own prompt (the box may hold another by now): what "Again" and "4 variations" use.
        set_text("result-prompt", &result.image.prompt);
        let mut meta = i18n::t_args(
            "studioMeta",
            &[
                &format!("{}\u{00d7}{}", result.image.width, result.image.height),
                &i18n::count_steps(result.image.steps),
                &crate::pages::view::schedule_name(&result.image.schedule),
                &result.image.seed.to_string(),
            ],
        );
        if result.truncated {
            meta.push(' ');
            meta.push_str(&i18n::t_args("studioTruncated", &[&result.token_count.to_string()]));
        }
        set_text("meta", &meta);
        let grid = element::<HtmlElement>("grid");
        grid.set_text_content(None);
        set_visible("grid", self.slots.len() > 1);
        if self.slots.len() > 1 {
            for (i, slot) in self.slots.iter().enumerate() {
                dom::append(&grid, &self.thumbnail(i, slot.as_ref()));
            }
        }
    }

    /// Slot `index`'s button in the grid (`#thumb-template`): its image, or disabled while it is being
    /// made.
    fn thumbnail(&self, index: usize, result: Option<&GenerateResult>) -> HtmlButtonElement {
        let button: HtmlButtonElement = from_template("thumb-template").unchecked_into();
        let selected = index == self.selected;
        if selected {
            button.set_class_name("thumb selected");
        }
        dom::set_attr(&button, "data-index", &index.to_string());
        dom::set_attr(&button, "aria-pressed", if selected { "true" } else { "false" });
        let img: HtmlImageElement = child(&button, "img");
        match result {
            Some(r) => {
                dom::set_attr(
                    &button,
                    "aria-label",
                    &i18n::t_args("studioShowSeed", &[&r.image.seed.to_string()]),
                );
                img.set_src(&format!("data:image/png;base64,{}", r.png));
            }
            None => {
                img.remove();
                button.set_disabled(true);
                dom::set_attr(&button, "aria-label", &i18n::t("studioPending"));
            }
        }
        button
    }
}

/// The slot of a grid thumbnail that was clicked.
pub fn thumbnail_index(thumb: &web_sys::Element) -> Option<usize> {
    thumb.get_attribute("data-index")?.parse().ok()
}

/// Keeps the keyboard focus on thumbnail `index` once the grid was drawn anew.
pub fn focus_thumbnail(index: usize) {
    let chosen = document().query_selector(&format!("#grid .thumb[data-index=\"{index}\"]"));
    if let Ok(Some(button)) = chosen {
        dom::focus(&button.unchecked_into::<HtmlElement>());
    }
}

#[cfg(test)]
mod tests {
    use imagine_core::image::ImageParams;

    use super::*;

    fn result(index: u32, count: u32) -> GenerateResult {
        GenerateResult {
            job: "j".into(),
            png: String::new(),
            image: ImageParams {
                prompt: "a cat".into(),
                seed: (40 + index).into(),
                width: 512,
                height: 512,
                steps: 4,
                schedule: "flux2".into(),
            },
            token_count: 14,
            truncated: false,
            trace: None,
            timings: None,
            index,
            count,
            private: false,
        }
    }

    #[test]
    fn the_first_image_to_arrive_is_shown_until_the_first_slot_fills() {
        let mut results = Results::new();
        results.start(3);
        assert!(results.selected().is_none());
        assert!(!results.arrive(result(1, 3)));
        assert_eq!(results.selected().map(|r| r.index), Some(1));
        assert!(!results.arrive(result(0, 3)));
        assert_eq!(results.selected().map(|r| r.index), Some(1), "a shown image stays shown");
        results.select(2);
        assert_eq!(results.selected().map(|r| r.index), Some(1), "slot 2 has no image yet");
        assert!(results.arrive(result(2, 3)));
        results.select(2);
        assert_eq!(results.selected().map(|r| r.index), Some(2));
    }

    #[test]
    fn the_last_images_stay_until_the_next_run_has_one() {
        let mut results = Results::new();
        results.finished(vec![result(0, 2), result(1, 2)]);
        results.select(1);
        results.start(4);
        results.grow(4);
        assert_eq!(results.selected().map(|r| r.image.seed), Some(41), "shown while the next run starts");
        assert!(!results.arrive(result(2, 4)));
        assert_eq!(results.selected().map(|r| r.index), Some(2));
        assert_eq!(results.slots.len(), 4);
    }

    #[test]
    fn images_deleted_from_the_gallery_leave_the_grid() {
        let mut results = Results::new();
        results.finished(vec![result(0, 3), result(1, 3), result(2, 3)]);
        results.select(2);
        assert!(results.forget(&["j-1".into()], false));
        assert_eq!(results.slots.len(), 2);
        assert_eq!(results.selected().map(|r| r.index), Some(2), "the shown image stays shown");
        assert!(results.forget(&["j-2".into()], false));
        assert_eq!(results.selected().map(|r| r.index), Some(0));
        assert!(!results.forget(&["j".into()], false), "nothing left to show");
        results.finished(vec![GenerateResult { private: true, ..result(0, 1) }]);
        assert!(results.forget(&[], true), "a private image was never in the gallery");
    }

    #[test]
    fn a_job_followed_midway_grows_to_its_count() {
        let mut results = Results::new();
        results.start(1);
        assert!(!results.arrive(result(3, 4)));
        assert_eq!(results.selected().map(|r| r.index), Some(3));
        results.finished(vec![result(0, 2), result(1, 2)]);
        assert_eq!(results.selected().map(|r| r.index), Some(0));
    }
}

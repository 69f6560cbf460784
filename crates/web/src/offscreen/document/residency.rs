//! Residency: which stages stay loaded between jobs, for how long, and telling the pages.

use super::*;

/// The stages loaded (or loading) now, in pipeline order.
pub(super) fn loaded_stages(state: &State) -> Vec<Stage> {
    [Stage::TextEncoder, Stage::Transformer, Stage::Decoder]
        .into_iter()
        .filter(|stage| state.current.iter().any(|current| current.stage == *stage))
        .collect()
}

/// Tells every page which stages are loaded now, if that changed since it was last told. Called as
/// workers start and end; the check runs once the current task is done, so a burst is told once.
pub(super) fn announce_residency() {
    spawn_local(async {
        let residency = STATE.with_borrow_mut(|state| {
            let loaded = loaded_stages(state);
            (state.announced_loaded != loaded).then(|| {
                state.announced_loaded = loaded.clone();
                Residency { seconds: state.keep_loaded_seconds, loaded }
            })
        });
        if let Some(residency) = residency {
            broadcast(&Event::Residency(residency)).await;
        }
    });
}

/// Starts the idle period: the resident stages are unloaded once it has lasted `keepLoaded` seconds
/// (at once for 0), unless a job starts first.
pub(super) fn unload_later() {
    let (epoch, seconds) = STATE.with_borrow_mut(|state| {
        state.idle_epoch += 1;
        (state.idle_epoch, state.keep_loaded_seconds)
    });
    let expired = move || {
        if STATE.with_borrow(|state| state.idle_epoch == epoch && state.running.is_none()) {
            unload();
        }
    };
    if seconds == 0 {
        expired();
    } else {
        spawn_local(async move {
            crate::platform::js::sleep_ms(u64::from(seconds) * 1000).await;
            expired();
        });
    }
}

/// Terminates the resident workers, which frees their sessions' memory.
pub(super) fn unload() {
    let resident = STATE.with_borrow_mut(|state| std::mem::take(&mut state.resident));
    // Dropped outside the borrow: dropping a `StageRun` updates the state.
    drop(resident);
}

//! Rate: the download rate and time left, over a sliding window.

use std::collections::VecDeque;

/// The download rate over the last few seconds, from `(time, total bytes done)` samples. A sliding
/// window rather than an average since the start, so the estimate follows a link that speeds up or
/// slows down, and ignores time spent paused (call [`reset`](Self::reset) on resume).
#[derive(Debug, Clone)]
pub struct RateMeter {
    window_ms: f64,
    samples: VecDeque<(f64, u64)>,
}

impl Default for RateMeter {
    fn default() -> Self {
        Self::new()
    }
}

impl RateMeter {
    /// The window, in milliseconds.
    pub const WINDOW_MS: f64 = 5000.0;
    /// The newest sample replaces the one before it while that one is closer than this to its
    /// predecessor, so a fast link does not pile up thousands of samples per window.
    const MIN_SPACING_MS: f64 = 100.0;

    /// No samples, a [`Self::WINDOW_MS`] window.
    pub fn new() -> Self {
        RateMeter { window_ms: Self::WINDOW_MS, samples: VecDeque::new() }
    }

    /// Forgets all samples (after a pause, or when a file starts over).
    pub fn reset(&mut self) {
        self.samples.clear();
    }

    /// Adds a sample: at `time_ms` (any monotonic clock, e.g. `performance.now()`), `done_bytes`
    /// of the whole download were done. A sample going back in time or bytes starts over.
    pub fn push(&mut self, time_ms: f64, done_bytes: u64) {
        if !time_ms.is_finite() {
            return;
        }
        if let Some(&(t, b)) = self.samples.back() {
            if time_ms < t || done_bytes < b {
                self.samples.clear();
            }
        }
        let n = self.samples.len();
        if n >= 2 && self.samples[n - 1].0 - self.samples[n - 2].0 < Self::MIN_SPACING_MS {
            self.samples[n - 1] = (time_ms, done_bytes);
        } else {
            self.samples.push_back((time_ms, done_bytes));
        }
        // Keep the newest sample at or before the window's start, so the window is fully spanned.
        while self.samples.len() >= 2 && self.samples[1].0 <= time_ms - self.window_ms {
            self.samples.pop_front();
        }
    }

    /// Bytes per second over the window; 0 before two samples some time apart.
    pub fn bytes_per_second(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(&(t0, b0)), Some(&(t1, b1))) if t1 > t0 => (b1 - b0) as f64 * 1000.0 / (t1 - t0),
            _ => 0.0,
        }
    }

    /// Seconds to download `remaining_bytes` at [`bytes_per_second`](Self::bytes_per_second);
    /// `None` while there is no rate.
    pub fn seconds_left(&self, remaining_bytes: u64) -> Option<f64> {
        let rate = self.bytes_per_second();
        (rate > 0.0).then(|| remaining_bytes as f64 / rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_meter_window() {
        let mut m = RateMeter::new();
        assert_eq!(m.bytes_per_second(), 0.0);
        assert_eq!(m.seconds_left(100), None);
        m.push(0.0, 0);
        assert_eq!(m.bytes_per_second(), 0.0);
        // 1 MB/s for 10 s, sampled every 50 ms.
        for i in 1..=200 {
            m.push(i as f64 * 50.0, i * 50_000);
        }
        assert!((m.bytes_per_second() - 1e6).abs() < 1.0, "{}", m.bytes_per_second());
        assert!(m.samples.len() < 60, "{} samples", m.samples.len());
        // Then 3 MB/s for 10 s: after 10 s the old rate has left the window.
        for i in 1..=100 {
            m.push(10_000.0 + i as f64 * 100.0, 10_000_000 + i * 300_000);
        }
        assert!((m.bytes_per_second() - 3e6).abs() < 1.0, "{}", m.bytes_per_second());
        assert_eq!(m.seconds_left(6_000_000), Some(2.0));
        // Halfway through a change the window mixes both rates.
        for i in 1..=25 {
            m.push(20_000.0 + i as f64 * 100.0, 40_000_000 + i * 100_000);
        }
        let r = m.bytes_per_second();
        assert!(r > 1e6 && r < 3e6, "{r}");
        // Bytes going back (a file restarted) or time going back starts over.
        m.push(30_000.0, 5);
        assert_eq!(m.bytes_per_second(), 0.0);
        m.push(31_000.0, 1005);
        assert_eq!(m.bytes_per_second(), 1000.0);
        m.push(1.0, 2000);
        assert_eq!(m.bytes_per_second(), 0.0);
        m.reset();
        assert_eq!(m.seconds_left(1), None);
        // A stall: no new bytes for the whole window.
        let mut m = RateMeter::new();
        m.push(0.0, 1000);
        m.push(6000.0, 1000);
        assert_eq!(m.bytes_per_second(), 0.0);
        assert_eq!(m.seconds_left(1), None);
    }
}

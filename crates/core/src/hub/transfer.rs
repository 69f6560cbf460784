//! Retries, ranges, storage: backoff between attempts, `Content-Range` checks, free space, sizes for people.

use super::HubError;

/// Attempts at one file in a row that save no new checkpoint before the download fails, waiting
/// [`backoff_ms`] between them (15.5 s in all). A saved checkpoint resets the count, so a long
/// download over a flaky link goes on as long as it moves, and a server that always cuts a response
/// short of the next checkpoint is given up on.
pub const MAX_ATTEMPTS_WITHOUT_PROGRESS: u32 = 6;

/// Milliseconds to wait before retry number `attempt` (0 for the first retry): 500 ms doubling per
/// attempt, capped at 30 s, then shortened by up to 20% with `jitter` (`0..=1`, from the caller's
/// random source, so many clients do not retry in lockstep; out-of-range values are clamped).
pub fn backoff_ms(attempt: u32, jitter: f64) -> u64 {
    const BASE_MS: u64 = 500;
    const CAP_MS: u64 = 30_000;
    let base = BASE_MS.checked_shl(attempt.min(16)).unwrap_or(CAP_MS).min(CAP_MS);
    let jitter = if jitter.is_nan() { 0.0 } else { jitter.clamp(0.0, 1.0) };
    (base as f64 * (1.0 - 0.2 * jitter)).round() as u64
}

/// `(start, end inclusive, total if known)` of a `Content-Range` header: `bytes N-M/T` or
/// `bytes N-M/*`. Refuses `bytes */T` (an unsatisfiable range), `M < N` and `M >= T`.
pub fn parse_content_range(header: &str) -> Result<(u64, u64, Option<u64>), HubError> {
    let refuse = |reason| Err(HubError::ContentRange { header: header.to_owned(), reason });
    let h = header.trim();
    let Some(unit) = h.get(..6) else { return refuse("it does not start with `bytes `") };
    if !unit.eq_ignore_ascii_case("bytes ") {
        return refuse("it does not start with `bytes `");
    }
    let Some((range, total)) = h[6..].trim_start().split_once('/') else {
        return refuse("it has no `/total`");
    };
    let number =
        |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
    let Some((start, end)) = range.split_once('-') else {
        return refuse("it has no `start-end` range");
    };
    let (Some(start), Some(end)) = (number(start), number(end)) else {
        return refuse("its range is not `start-end` in decimal digits");
    };
    if end < start {
        return refuse("its range ends before it starts");
    }
    let total = match total {
        "*" => None,
        t => match number(t) {
            Some(t) if end < t => Some(t),
            Some(_) => return refuse("its range ends past the total size"),
            None => return refuse("its total is neither a number nor `*`"),
        },
    };
    Ok((start, end, total))
}

/// Whether a 206 response's `Content-Range` starts exactly where the staged file ends. Any other
/// answer (another start, or a header that does not parse) must not be appended.
pub fn range_matches(header: &str, expected_start: u64) -> bool {
    parse_content_range(header).is_ok_and(|(start, _, _)| start == expected_start)
}

/// Where a 206 response's range stops (the offset after its last byte) when that is before the end of
/// the file of `size` bytes: a server may answer a part of the range asked for, and once that part has
/// come whole, the rest is asked for from there. `None` when the range runs to the end of the file, or
/// the header does not parse.
pub fn range_ends_early(header: &str, size: u64) -> Option<u64> {
    let (_, end, _) = parse_content_range(header).ok()?;
    let next = end + 1;
    (next < size).then_some(next)
}

/// Checks that `needed_bytes` more fit in the origin's storage (`navigator.storage.estimate()`'s
/// `usage` and `quota`), before downloading anything.
pub fn check_space(needed_bytes: u64, usage: u64, quota: u64) -> Result<(), HubError> {
    let free = quota.saturating_sub(usage);
    if needed_bytes > free {
        return Err(HubError::Space { needed: needed_bytes, free, quota });
    }
    Ok(())
}

/// A size for people, in decimal units as disks are sold, written one way everywhere: one decimal
/// below 100 of the unit, none above (`6.5 GB`, `83.4 GB`, `500 MB`, `4.1 KB`, `12 bytes`).
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    // Each unit starts where the one below would round to 1000 (999.5 MB is `1.0 GB`, not `1000 MB`).
    let (value, unit) = if b >= 999_500_000.0 {
        (b / 1e9, "GB")
    } else if b >= 999_500.0 {
        (b / 1e6, "MB")
    } else if b >= 1e3 {
        (b / 1e3, "KB")
    } else if bytes == 1 {
        return "1 byte".to_owned();
    } else {
        return format!("{bytes} bytes");
    };
    if value >= 99.95 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff() {
        let no_jitter: Vec<u64> = (0..9).map(|a| backoff_ms(a, 0.0)).collect();
        assert_eq!(no_jitter, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert_eq!(backoff_ms(u32::MAX, 0.0), 30_000);
        assert_eq!(backoff_ms(0, 1.0), 400);
        assert_eq!(backoff_ms(10, 1.0), 24_000);
        assert_eq!(backoff_ms(1, 0.5), 900);
        assert_eq!(backoff_ms(1, 7.0), 800);
        assert_eq!(backoff_ms(1, -1.0), 1000);
        assert_eq!(backoff_ms(1, f64::NAN), 1000);
        // The bound the docs state: the waits before giving up add up to 15.5 s.
        let waits: u64 = (0..MAX_ATTEMPTS_WITHOUT_PROGRESS - 1).map(|a| backoff_ms(a, 0.0)).sum();
        assert_eq!(waits, 15_500);
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 0-99/1000").unwrap(), (0, 99, Some(1000)));
        assert_eq!(parse_content_range("bytes 100-999/*").unwrap(), (100, 999, None));
        assert_eq!(parse_content_range(" Bytes 5-5/6 ").unwrap(), (5, 5, Some(6)));
        let big = "bytes 1900000000-1999999999/2000000000";
        assert_eq!(parse_content_range(big).unwrap(), (1_900_000_000, 1_999_999_999, Some(2_000_000_000)));
        for bad in [
            "",
            "bytes",
            "bytes */1000",
            "bytes 5-4/10",
            "bytes 0-10/10",
            "bytes -5/10",
            "bytes 0-/10",
            "bytes 0-9",
            "bytes +1-9/10",
            "bytes 0-9/x",
            "items 0-9/10",
            "bytes 99999999999999999999-1/*",
        ] {
            assert!(matches!(parse_content_range(bad), Err(HubError::ContentRange { .. })), "{bad:?}");
        }
        assert!(range_matches("bytes 512-1023/1024", 512));
        assert!(!range_matches("bytes 0-1023/1024", 512));
        assert!(!range_matches("garbage", 0));
    }

    #[test]
    fn a_range_that_stops_before_the_end_continues_after_it() {
        assert_eq!(range_ends_early("bytes 0-99/1000", 1000), Some(100));
        assert_eq!(range_ends_early("bytes 512-1023/*", 4096), Some(1024));
        assert_eq!(range_ends_early("bytes 500-999/1000", 1000), None);
        assert_eq!(range_ends_early("bytes 0-0/1", 1), None);
        assert_eq!(range_ends_early("garbage", 1000), None);
    }

    #[test]
    fn storage() {
        check_space(100, 0, 100).unwrap();
        check_space(0, 200, 100).unwrap();
        assert_eq!(
            check_space(6_520_000_000, 8_800_000_000, 10_000_000_000).unwrap_err().to_string(),
            "not enough storage: the pack needs 6.5 GB more, 1.2 GB is free (quota 10.0 GB). Free space on \
             the disk, then install again."
        );
        assert!(check_space(1, 200, 100).is_err());
        assert_eq!(format_bytes(0), "0 bytes");
        assert_eq!(format_bytes(1), "1 byte");
        assert_eq!(format_bytes(999), "999 bytes");
        assert_eq!(format_bytes(4_100), "4.1 KB");
        assert_eq!(format_bytes(12_345_678), "12.3 MB");
        assert_eq!(format_bytes(999_999_999), "1.0 GB");
        assert_eq!(format_bytes(999_999), "1.0 MB");
        assert_eq!(format_bytes(999_499), "999 KB");
        assert_eq!(format_bytes(1_000_000_000), "1.0 GB");
        assert_eq!(format_bytes(6_524_000_000), "6.5 GB");
        assert_eq!(format_bytes(83_390_000_000), "83.4 GB");
        assert_eq!(format_bytes(128_000_000_000), "128 GB");
        assert_eq!(format_bytes(500_000_000), "500 MB");
        assert_eq!(format_bytes(99_960_000), "100 MB");
    }
}

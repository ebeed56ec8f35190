//! Hypervisor log lines (pure): when each line was written, and the kubelet's output rules —
//! `sinceTime` filtering, `timestamps` prefixes, `limitBytes` truncation, and the tail.
//!
//! A line's time comes from its own prefix: an RFC 3339 timestamp, firecracker's
//! `2026-08-12T10:00:00.123456789 [id:main] …` (UTC), or cloud-hypervisor's elapsed time since
//! its start, `cloud-hypervisor: 5.123456ms: …`, added to the VMM process's start time. A line
//! without one (a continuation) carries the time of the line before it.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};

/// cloud-hypervisor's `{:.6?}` rendering of a `Duration` (`512.3µs`, `5.12ms`, `1.5s`).
fn parse_elapsed(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "ns" => 1e-9,
        "µs" | "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(v * scale).ok()
}

/// The time line `line` was written at, if its prefix says (`vmm_start` anchors
/// cloud-hypervisor's relative times).
pub fn line_time(line: &str, vmm_start: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    if let Some(rest) = line.strip_prefix("cloud-hypervisor: ") {
        let elapsed = parse_elapsed(rest.split(':').next()?)?;
        // The line is the guest's to write (a firecracker guest's console is the log): an
        // elapsed time past the calendar is no time, not an overflow.
        return vmm_start?.checked_add_signed(chrono::Duration::from_std(elapsed).ok()?);
    }
    let first = line.split_whitespace().next()?;
    if !first.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(first) {
        return Some(t.with_timezone(&Utc));
    }
    NaiveDateTime::parse_from_str(first, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|n| n.and_utc())
}

/// Go's RFC3339Nano (trailing zeros of the fraction trimmed), as the kubelet prints it.
pub fn rfc3339_nano(t: DateTime<Utc>) -> String {
    let s = t.to_rfc3339_opts(SecondsFormat::Nanos, true);
    match s.split_once('.') {
        Some((head, frac)) => {
            let digits = frac.trim_end_matches('Z').trim_end_matches('0');
            if digits.is_empty() {
                format!("{head}Z")
            } else {
                format!("{head}.{digits}Z")
            }
        }
        None => s,
    }
}

/// The byte offset where the last `n` lines of `text` start (a final `\n` does not start
/// an empty line), like `cocoon vm logs --tail`.
pub fn tail_start(text: &[u8], n: u64) -> usize {
    if n == 0 {
        return text.len();
    }
    let end = if text.ends_with(b"\n") {
        text.len() - 1
    } else {
        text.len()
    };
    let mut found = 0;
    for (i, b) in text[..end].iter().enumerate().rev() {
        if *b == b'\n' {
            found += 1;
            if found == n {
                return i + 1;
            }
        }
    }
    0
}

/// Applies the output rules to complete lines, one at a time.
#[derive(Debug, Clone)]
pub struct Emitter {
    since: Option<DateTime<Utc>>,
    timestamps: bool,
    remaining: Option<u64>,
    vmm_start: Option<DateTime<Utc>>,
    last: Option<DateTime<Utc>>,
}

impl Emitter {
    pub fn new(
        since: Option<DateTime<Utc>>,
        timestamps: bool,
        limit_bytes: Option<u64>,
        vmm_start: Option<DateTime<Utc>>,
    ) -> Self {
        Self {
            since,
            timestamps,
            remaining: limit_bytes,
            vmm_start,
            last: None,
        }
    }

    /// The limit is used up: nothing more will be written.
    pub fn done(&self) -> bool {
        self.remaining == Some(0)
    }

    /// The output for one line (without its `\n`); `now` stands in for the time of a line
    /// that has none and follows no timed line.
    pub fn line(&mut self, line: &str, now: DateTime<Utc>, out: &mut Vec<u8>) {
        if self.done() {
            return;
        }
        let time = line_time(line, self.vmm_start).or(self.last);
        if let Some(t) = time {
            self.last = Some(t);
        }
        if let (Some(since), Some(t)) = (self.since, time)
            && t < since
        {
            return;
        }
        let mut rendered = Vec::with_capacity(line.len() + 32);
        if self.timestamps {
            rendered.extend_from_slice(rfc3339_nano(time.unwrap_or(now)).as_bytes());
            rendered.push(b' ');
        }
        rendered.extend_from_slice(line.as_bytes());
        rendered.push(b'\n');
        if let Some(rem) = &mut self.remaining {
            let take = (*rem).min(rendered.len() as u64) as usize;
            rendered.truncate(take);
            *rem -= take as u64;
        }
        out.extend_from_slice(&rendered);
    }

    /// Every complete line of `text` (a trailing partial line is included: the text is final).
    pub fn all(&mut self, text: &str, now: DateTime<Utc>) -> Vec<u8> {
        let mut out = Vec::new();
        for line in text.lines() {
            self.line(line, now, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn line_times_of_each_hypervisor() {
        let start = t("2026-08-12T10:00:00Z");
        assert_eq!(
            line_time(
                "cloud-hypervisor: 1.500000s: <vmm> INFO:vmm/src/lib.rs:1 -- booted",
                Some(start)
            ),
            Some(t("2026-08-12T10:00:01.5Z"))
        );
        assert_eq!(
            line_time("cloud-hypervisor: 250.000000µs: <vmm> INFO", Some(start)),
            Some(t("2026-08-12T10:00:00.00025Z"))
        );
        assert_eq!(line_time("cloud-hypervisor: 3ms: x", None), None, "no anchor");
        assert_eq!(
            line_time(
                "2026-08-12T10:00:02.123456789 [vk-ns-p:main] Running Firecracker v1.7.0",
                None
            ),
            Some(t("2026-08-12T10:00:02.123456789Z"))
        );
        assert_eq!(
            line_time("2026-08-12T12:00:00+02:00 guest says hi", None),
            Some(t("2026-08-12T10:00:00Z"))
        );
        assert_eq!(line_time("   at vmm::run (continuation)", Some(start)), None);
        assert_eq!(line_time("2026 was a year", None), None);
    }

    #[test]
    fn rfc3339_nano_trims_like_go() {
        assert_eq!(rfc3339_nano(t("2026-08-12T10:00:00Z")), "2026-08-12T10:00:00Z");
        assert_eq!(rfc3339_nano(t("2026-08-12T10:00:00.5Z")), "2026-08-12T10:00:00.5Z");
        assert_eq!(
            rfc3339_nano(t("2026-08-12T10:00:00.123456789Z")),
            "2026-08-12T10:00:00.123456789Z"
        );
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        let text = b"a\nb\nc\n";
        assert_eq!(&text[tail_start(text, 1)..], b"c\n");
        assert_eq!(&text[tail_start(text, 2)..], b"b\nc\n");
        assert_eq!(&text[tail_start(text, 9)..], b"a\nb\nc\n");
        assert_eq!(&text[tail_start(text, 0)..], b"");
        assert_eq!(&b"a\nb"[tail_start(b"a\nb", 1)..], b"b", "an unterminated last line");
        assert_eq!(tail_start(b"", 3), 0);
    }

    #[test]
    fn since_timestamps_and_limit() {
        let start = t("2026-08-12T10:00:00Z");
        let now = t("2026-08-12T11:00:00Z");
        let text = "cloud-hypervisor: 1.000000s: boot\n  continued\ncloud-hypervisor: 10.000000s: later\n";
        let mut e = Emitter::new(Some(t("2026-08-12T10:00:05Z")), false, None, Some(start));
        assert_eq!(
            String::from_utf8(e.all(text, now)).unwrap(),
            "cloud-hypervisor: 10.000000s: later\n",
            "the continuation goes with its line"
        );
        let mut e = Emitter::new(None, true, None, Some(start));
        assert_eq!(
            String::from_utf8(e.all(text, now)).unwrap(),
            "2026-08-12T10:00:01Z cloud-hypervisor: 1.000000s: boot\n\
             2026-08-12T10:00:01Z   continued\n\
             2026-08-12T10:00:10Z cloud-hypervisor: 10.000000s: later\n"
        );
        let mut e = Emitter::new(None, false, Some(40), Some(start));
        let out = e.all(text, now);
        assert_eq!(out.len(), 40);
        assert!(e.done());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cloud-hypervisor: 1.000000s: boot\n  cont"
        );
        let mut e = Emitter::new(None, true, None, None);
        assert_eq!(
            String::from_utf8(e.all("untimed\n", now)).unwrap(),
            "2026-08-12T11:00:00Z untimed\n"
        );
    }

    /// A guest prints what it likes on a firecracker serial console (the log): an elapsed time
    /// past the calendar is no time, not a panic that breaks every log request of the pod.
    #[test]
    fn an_elapsed_time_past_the_calendar_is_no_time_not_a_panic() {
        let now = Utc::now();
        for line in [
            "cloud-hypervisor: 9000000000000s: x",
            "cloud-hypervisor: 99999999999999999999s: x",
            "cloud-hypervisor: 1e300s: x",
        ] {
            let time = std::panic::catch_unwind(|| line_time(line, Some(now)));
            assert_eq!(time.ok(), Some(None), "{line}");
        }
        let mut e = Emitter::new(Some(now), true, None, Some(now));
        let out = e.all("cloud-hypervisor: 9000000000000s: x\n", now);
        assert!(
            String::from_utf8(out)
                .unwrap()
                .ends_with(" cloud-hypervisor: 9000000000000s: x\n")
        );
    }
}

//! The `/containerLogs` query (the kubelet's PodLogOptions), parsed and validated (pure).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

/// Where the output starts in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    Seconds(u64),
    Time(DateTime<Utc>),
}

/// The largest `sinceSeconds` taken (10 000 years): the apiserver sets no upper bound, and a
/// time further back than the calendar can count is refused (400) rather than computed.
pub const MAX_SINCE_SECONDS: u64 = 10_000 * 365 * 24 * 3600;

impl Since {
    /// The time the output starts at. Checked arithmetic: an interval further back than the
    /// calendar goes starts at its beginning (the query's parsing refuses such values; this
    /// holds for any caller).
    pub fn resolve(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Since::Seconds(s) => i64::try_from(s)
                .ok()
                .and_then(chrono::Duration::try_seconds)
                .and_then(|back| now.checked_sub_signed(back))
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
            Since::Time(t) => t,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    /// The last N lines (0 = none).
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes (> 0).
    pub limit_bytes: Option<u64>,
    pub since: Option<Since>,
}

/// Go's `strconv.ParseBool`, which the kubelet's query decoding uses.
fn parse_bool(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{name}: invalid value {v:?}: must be a boolean")),
    }
}

fn parse_int(name: &str, v: &str) -> Result<i64, String> {
    v.parse::<i64>()
        .map_err(|_| format!("{name}: invalid value {v:?}: must be an integer"))
}

impl LogQuery {
    /// Parses the query parameters; unknown ones are ignored (as the kubelet does). The error
    /// names the parameter and the rule.
    pub fn parse(params: &HashMap<String, String>) -> Result<Self, String> {
        let mut q = LogQuery::default();
        let mut errors = Vec::new();
        let mut flag = |name: &str| -> bool {
            match params.get(name).map(|v| parse_bool(name, v)) {
                Some(Ok(b)) => b,
                Some(Err(e)) => {
                    errors.push(e);
                    false
                }
                None => false,
            }
        };
        q.follow = flag("follow");
        q.previous = flag("previous");
        q.timestamps = flag("timestamps");
        if let Some(v) = params.get("tailLines") {
            match parse_int("tailLines", v) {
                Ok(n) if n >= 0 => q.tail_lines = Some(n as u64),
                Ok(n) => errors.push(format!(
                    "tailLines: invalid value {n}: must be greater than or equal to 0"
                )),
                Err(e) => errors.push(e),
            }
        }
        if let Some(v) = params.get("limitBytes") {
            match parse_int("limitBytes", v) {
                Ok(n) if n >= 1 => q.limit_bytes = Some(n as u64),
                Ok(n) => errors.push(format!("limitBytes: invalid value {n}: must be greater than 0")),
                Err(e) => errors.push(e),
            }
        }
        let seconds = match params.get("sinceSeconds") {
            Some(v) => match parse_int("sinceSeconds", v) {
                Ok(n) if n < 1 => {
                    errors.push(format!("sinceSeconds: invalid value {n}: must be greater than 0"));
                    None
                }
                Ok(n) if n as u64 > MAX_SINCE_SECONDS => {
                    errors.push(format!(
                        "sinceSeconds: invalid value {n}: must be at most {MAX_SINCE_SECONDS} (10 000 years)"
                    ));
                    None
                }
                Ok(n) => Some(n as u64),
                Err(e) => {
                    errors.push(e);
                    None
                }
            },
            None => None,
        };
        let time = match params.get("sinceTime") {
            Some(v) => match DateTime::parse_from_rfc3339(v) {
                Ok(t) => Some(t.with_timezone(&Utc)),
                Err(_) => {
                    errors.push(format!(
                        "sinceTime: invalid value {v:?}: must be an RFC 3339 time such as 2026-08-12T10:00:00Z"
                    ));
                    None
                }
            },
            None => None,
        };
        match (seconds, time) {
            (Some(_), Some(_)) => errors.push("at most one of sinceTime or sinceSeconds may be specified".into()),
            (Some(s), None) => q.since = Some(Since::Seconds(s)),
            (None, Some(t)) => q.since = Some(Since::Time(t)),
            (None, None) => {}
        }
        if errors.is_empty() {
            Ok(q)
        } else {
            Err(errors.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Result<LogQuery, String> {
        LogQuery::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn a_full_query() {
        let got = q(&[
            ("follow", "true"),
            ("timestamps", "1"),
            ("tailLines", "10"),
            ("limitBytes", "500"),
            ("sinceSeconds", "60"),
            ("unknown", "x"),
        ])
        .unwrap();
        assert_eq!(
            got,
            LogQuery {
                follow: true,
                previous: false,
                timestamps: true,
                tail_lines: Some(10),
                limit_bytes: Some(500),
                since: Some(Since::Seconds(60)),
            }
        );
        let t = q(&[("sinceTime", "2026-08-12T10:00:00+02:00")]).unwrap();
        assert_eq!(t.since, Some(Since::Time("2026-08-12T08:00:00Z".parse().unwrap())));
        assert_eq!(q(&[]).unwrap(), LogQuery::default());
        assert_eq!(q(&[("tailLines", "0")]).unwrap().tail_lines, Some(0));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (pairs, fragment) in [
            (
                vec![("tailLines", "-1")],
                "tailLines: invalid value -1: must be greater than or equal to 0",
            ),
            (
                vec![("tailLines", "ten")],
                "tailLines: invalid value \"ten\": must be an integer",
            ),
            (
                vec![("limitBytes", "0")],
                "limitBytes: invalid value 0: must be greater than 0",
            ),
            (
                vec![("sinceSeconds", "0")],
                "sinceSeconds: invalid value 0: must be greater than 0",
            ),
            (
                vec![("sinceTime", "yesterday")],
                "sinceTime: invalid value \"yesterday\"",
            ),
            (
                vec![("follow", "maybe")],
                "follow: invalid value \"maybe\": must be a boolean",
            ),
            (
                vec![("sinceSeconds", "5"), ("sinceTime", "2026-08-12T10:00:00Z")],
                "at most one of sinceTime or sinceSeconds",
            ),
        ] {
            let err = q(&pairs).unwrap_err();
            assert!(err.contains(fragment), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn since_seconds_counts_back_from_now() {
        let now: DateTime<Utc> = "2026-08-12T10:00:00Z".parse().unwrap();
        assert_eq!(
            Since::Seconds(90).resolve(now),
            "2026-08-12T09:58:30Z".parse::<DateTime<Utc>>().unwrap()
        );
    }

    /// The apiserver sets no upper bound on sinceSeconds: a value past what a date can count
    /// back is the client's mistake (400), never a panic of the handler.
    #[test]
    fn since_seconds_past_the_calendar_is_refused_not_a_panic() {
        let now = Utc::now();
        for secs in [10_000_000_000_000u64, 99_999_999_999_999, u64::MAX] {
            let resolved = std::panic::catch_unwind(|| Since::Seconds(secs).resolve(now));
            assert!(resolved.is_ok(), "sinceSeconds={secs} panics");
        }
        let err = q(&[("sinceSeconds", "99999999999999")]).unwrap_err();
        assert!(err.contains("sinceSeconds: invalid value 99999999999999"), "{err}");
        assert!(q(&[("sinceSeconds", "315360000")]).is_ok(), "ten years back is fine");
    }
}

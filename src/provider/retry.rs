//! Retries owed to a failed hibernate or wake (decision 10, behaviour spec §4h "retry.go"):
//! the first after `min`, each next one twice the previous, capped at `max`
//! (15 s, 30 s, 1 m, 2 m, 4 m, 5 m, 5 m … by default).

use std::time::Duration;

/// The delay of the next retry after one scheduled with `previous` (`None`: the first).
pub fn next_delay(previous: Option<Duration>, min: Duration, max: Duration) -> Duration {
    match previous {
        None => min,
        Some(p) => p.saturating_mul(2).min(max).max(min),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_their_cap() {
        let (min, max) = (Duration::from_secs(15), Duration::from_secs(300));
        let mut previous = None;
        let mut seen = Vec::new();
        for _ in 0..8 {
            let d = next_delay(previous, min, max);
            seen.push(d.as_secs());
            previous = Some(d);
        }
        assert_eq!(seen, vec![15, 30, 60, 120, 240, 300, 300, 300]);
        assert_eq!(
            next_delay(Some(Duration::from_secs(1)), min, max),
            min,
            "never below the minimum"
        );
    }
}

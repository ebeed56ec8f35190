//! Kubernetes resource quantities (`4`, `3500m`, `16Gi`, `1e9`, `512M`), parsed exactly into
//! milli-units, and rendered back canonically. Pure.

use std::fmt;

/// A non-negative quantity in milli-units (`1` = 1000, `250m` = 250, `1Ki` = 1 024 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    millis: u128,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a Kubernetes quantity: {why}")]
pub struct QuantityError {
    pub input: String,
    pub why: &'static str,
}

impl Quantity {
    /// From a whole number of units (bytes, cores, pods).
    pub const fn from_units(units: u64) -> Self {
        Self {
            millis: units as u128 * 1000,
        }
    }

    /// From milli-units (millicores).
    pub const fn from_millis(millis: u128) -> Self {
        Self { millis }
    }

    /// Milli-units.
    pub fn millis(self) -> u128 {
        self.millis
    }

    /// Whole units, rounded up (as `resource.Quantity.Value()` does).
    pub fn units_ceil(self) -> u128 {
        self.millis.div_ceil(1000)
    }

    /// `floor(self · (100 − percent) / 100)` at milli precision.
    pub fn minus_percent(self, percent: u8) -> Self {
        let keep = 100u128.saturating_sub(percent as u128);
        Self {
            millis: self.millis * keep / 100,
        }
    }

    /// Parses a Kubernetes quantity. Fractions below a milli-unit round up, as the apiserver does.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let err = |why| QuantityError {
            input: input.to_string(),
            why,
        };
        use vk_policy_support::quantity::{QuantityError as Why, parse_scaled};
        let millis = parse_scaled(input.trim(), 1000).map_err(|why| {
            err(match why {
                Why::Malformed => "expected a decimal number with an optional suffix (n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or eN)",
                Why::Negative => "negative quantities are not accepted here",
                Why::Overflow => "too large",
            })
        })?;
        if millis > u64::MAX as u128 * 1000 {
            return Err(err("too large"));
        }
        Ok(Self { millis })
    }

    /// Canonical rendering for CPU: whole cores when exact, else millicores (`3`, `3200m`).
    pub fn to_cpu_string(self) -> String {
        if self.millis.is_multiple_of(1000) {
            (self.millis / 1000).to_string()
        } else {
            format!("{}m", self.millis)
        }
    }

    /// Canonical rendering for countable/byte resources: the whole number, rounded down.
    pub fn to_units_string(self) -> String {
        (self.millis / 1000).to_string()
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_cpu_string())
    }
}

/// A binary size as a Kubernetes suffix (`2Mi`, `1Gi`), for `hugepages-<size>` resource names.
pub fn binary_size_suffix(bytes: u64) -> String {
    const UNITS: [(&str, u32); 6] = [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    for (unit, shift) in UNITS {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_quantity_forms() {
        for (s, millis) in [
            ("4", 4000u128),
            ("3500m", 3500),
            ("0.5", 500),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("16Gi", 16 * (1u128 << 30) * 1000),
            ("512M", 512_000_000_000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("100u", 1), // rounds up to a milli
            ("+2", 2000),
        ] {
            assert_eq!(Quantity::parse(s).unwrap().millis(), millis, "{s}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for s in ["", "-1", "abc", "1.2.3", "4 cores", "1Xi", ".", "1e99"] {
            assert!(Quantity::parse(s).is_err(), "{s:?} should be rejected");
        }
    }

    #[test]
    fn reserve_floors_at_milli_precision() {
        assert_eq!(Quantity::from_units(4).minus_percent(20).to_cpu_string(), "3200m");
        assert_eq!(Quantity::from_units(10).minus_percent(20).to_cpu_string(), "8");
        assert_eq!(Quantity::from_units(1001).minus_percent(20).to_units_string(), "800");
        assert_eq!(Quantity::from_units(7).minus_percent(0).to_units_string(), "7");
        assert_eq!(Quantity::from_units(7).minus_percent(100).to_units_string(), "0");
    }

    #[test]
    fn hugepage_size_suffixes() {
        assert_eq!(binary_size_suffix(2 << 20), "2Mi");
        assert_eq!(binary_size_suffix(1 << 30), "1Gi");
        assert_eq!(binary_size_suffix(4096), "4Ki");
    }
}

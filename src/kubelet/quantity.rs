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
        Self { millis: units as u128 * 1000 }
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
        Self { millis: self.millis * keep / 100 }
    }

    /// Parses a Kubernetes quantity. Fractions below a milli-unit round up, as the apiserver does.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let err = |why| QuantityError { input: input.to_string(), why };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s.starts_with('-') {
            return Err(err("negative quantities are not accepted here"));
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, suffix) = s.split_at(num_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err("expected a decimal number"));
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let digits = format!("{int_part}{frac_part}");
        if digits.len() > 30 {
            return Err(err("too many digits"));
        }
        let mantissa: u128 = digits.parse().map_err(|_| err("expected a decimal number"))?;
        // value = mantissa · 10^exp10 · 2^exp2
        let mut exp10: i32 = -(frac_part.len() as i32);
        let mut exp2: u32 = 0;
        match suffix {
            "" => {}
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            other => {
                let exp = other
                    .strip_prefix(['e', 'E'])
                    .and_then(|e| e.parse::<i32>().ok())
                    .ok_or_else(|| err("unknown suffix (use n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or eN)"))?;
                if !(-30..=30).contains(&exp) {
                    return Err(err("exponent out of range"));
                }
                exp10 += exp;
            }
        }
        exp10 += 3; // to milli-units
        let scaled = mantissa.checked_mul(1u128 << exp2).ok_or_else(|| err("too large"))?;
        let millis = if exp10 >= 0 {
            10u128.checked_pow(exp10 as u32).and_then(|p| scaled.checked_mul(p)).ok_or_else(|| err("too large"))?
        } else {
            let div = 10u128.checked_pow((-exp10) as u32).ok_or_else(|| err("too small"))?;
            scaled.div_ceil(div)
        };
        if millis > u64::MAX as u128 * 1000 {
            return Err(err("too large"));
        }
        Ok(Self { millis })
    }

    /// Canonical rendering for CPU: whole cores when exact, else millicores (`3`, `3200m`).
    pub fn to_cpu_string(self) -> String {
        if self.millis.is_multiple_of(1000) { (self.millis / 1000).to_string() } else { format!("{}m", self.millis) }
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

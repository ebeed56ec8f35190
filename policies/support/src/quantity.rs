//! Kubernetes resource quantities (`500m`, `2`, `1.5Gi`, `4e3`), parsed exactly and rounded up
//! the way the API machinery's `MilliValue` / `Value` do.

/// Why a string is not an acceptable quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantityError {
    /// Not of the form `<number><suffix>`.
    Malformed,
    /// A negative amount (no resource can be negative).
    Negative,
    /// Too large to represent.
    Overflow,
}

impl QuantityError {
    pub fn describe(self) -> &'static str {
        match self {
            QuantityError::Malformed => "is not a Kubernetes quantity (e.g. 500m, 2, 1.5Gi)",
            QuantityError::Negative => "is negative",
            QuantityError::Overflow => "is too large",
        }
    }
}

/// The quantity in thousandths, rounded up (`500m` → 500, `1` → 1000, `1u` → 1).
pub fn parse_milli(text: &str) -> Result<u64, QuantityError> {
    scaled_ceil(text, 1000)
}

/// The quantity in whole units, rounded up (`4Gi` → 4294967296, `1.5k` → 1500, `100m` → 1).
pub fn parse_units(text: &str) -> Result<u64, QuantityError> {
    scaled_ceil(text, 1)
}

/// ceil(quantity × multiplier), for callers that need more range than `u64` (milli-bytes).
pub fn parse_scaled(text: &str, multiplier: u128) -> Result<u128, QuantityError> {
    let parsed = split(text)?;
    let mut numerator = parsed.digits.checked_mul(multiplier).ok_or(QuantityError::Overflow)?;
    numerator = numerator
        .checked_mul(parsed.binary_factor)
        .ok_or(QuantityError::Overflow)?;
    let mut denominator: u128 = 1;
    let exponent = parsed.decimal_exponent - parsed.fraction_digits;
    if exponent >= 0 {
        numerator = numerator.checked_mul(pow10(exponent)?).ok_or(QuantityError::Overflow)?;
    } else {
        denominator = pow10(-exponent)?;
    }
    if parsed.negative && numerator != 0 {
        return Err(QuantityError::Negative);
    }
    Ok(numerator.div_ceil(denominator))
}

/// ceil(quantity × multiplier) as an exact rational computation.
fn scaled_ceil(text: &str, multiplier: u128) -> Result<u64, QuantityError> {
    u64::try_from(parse_scaled(text, multiplier)?).map_err(|_| QuantityError::Overflow)
}

struct Parsed {
    negative: bool,
    /// All significant digits as one integer (`1.25` → 125).
    digits: u128,
    /// How many of those digits were after the decimal point.
    fraction_digits: i32,
    binary_factor: u128,
    decimal_exponent: i32,
}

fn split(text: &str) -> Result<Parsed, QuantityError> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(QuantityError::Malformed);
    }
    let mut digits: u128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(u128::from(b - b'0')))
            .ok_or(QuantityError::Overflow)?;
    }
    let fraction_digits = i32::try_from(fraction.len()).map_err(|_| QuantityError::Overflow)?;
    let (binary_factor, decimal_exponent) = suffix_scale(suffix)?;
    Ok(Parsed {
        negative,
        digits,
        fraction_digits,
        binary_factor,
        decimal_exponent,
    })
}

/// (binary multiplier, power of ten) of a suffix.
fn suffix_scale(suffix: &str) -> Result<(u128, i32), QuantityError> {
    let binary = |power: u32| Ok((1u128 << (10 * power), 0));
    match suffix {
        "" => Ok((1, 0)),
        "n" => Ok((1, -9)),
        "u" => Ok((1, -6)),
        "m" => Ok((1, -3)),
        "k" => Ok((1, 3)),
        "M" => Ok((1, 6)),
        "G" => Ok((1, 9)),
        "T" => Ok((1, 12)),
        "P" => Ok((1, 15)),
        "E" => Ok((1, 18)),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Malformed);
            }
            let value: i32 = digits.parse().map_err(|_| QuantityError::Overflow)?;
            Ok((1, value))
        }
        _ => Err(QuantityError::Malformed),
    }
}

fn pow10(exponent: i32) -> Result<u128, QuantityError> {
    let exponent = u32::try_from(exponent).map_err(|_| QuantityError::Overflow)?;
    10u128.checked_pow(exponent).ok_or(QuantityError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities_become_millicores_rounded_up() {
        for (text, milli) in [
            ("500m", 500),
            ("1", 1000),
            ("2", 2000),
            ("5m", 5),
            ("300", 300_000),
            ("0.5", 500),
            ("1.0001", 1001),
            ("100u", 1),
            ("1e3", 1_000_000),
            ("0", 0),
            ("+1", 1000),
            (".5", 500),
        ] {
            assert_eq!(parse_milli(text), Ok(milli), "{text}");
        }
    }

    #[test]
    fn memory_quantities_become_bytes() {
        for (text, bytes) in [
            ("4Gi", 4_294_967_296),
            ("1.5Gi", 1_610_612_736),
            ("512Mi", 536_870_912),
            ("1G", 1_000_000_000),
            ("128974848", 128_974_848),
            ("129e6", 129_000_000),
            ("123Ki", 125_952),
            ("100m", 1),
            ("1E", 1_000_000_000_000_000_000),
        ] {
            assert_eq!(parse_units(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn bad_quantities_are_rejected_with_a_kind() {
        for text in ["", "abc", "1.2.3", "Gi", "1Gb", "1e", "1e+", "--1", "1 Gi", "."] {
            assert_eq!(parse_units(text), Err(QuantityError::Malformed), "{text:?}");
        }
        assert_eq!(parse_units("-1"), Err(QuantityError::Negative));
        assert_eq!(parse_units("-0"), Ok(0));
        assert_eq!(parse_units("99999999999Ei"), Err(QuantityError::Overflow));
        assert_eq!(parse_units("1e400"), Err(QuantityError::Overflow));
    }
}

//! Kubernetes resource quantities → byte counts (behaviour spec §4d: `4Gi` → `4294967296`).
//!
//! Grammar (k8s `resource.Quantity`): `[+-]digits[.digits][suffix]` where suffix is a binary SI suffix
//! (`Ki Mi Gi Ti Pi Ei`), a decimal SI suffix (`n u m "" k M G T P E`) or a decimal exponent (`e3`, `E-2`).
//! Fractions round **up** to a whole byte, as `Quantity.Value()` does.

/// Parses a quantity into a whole number of units (bytes). `None` for invalid, negative or overflowing input.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return None;
    }
    let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_end);
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return None;
    }
    // mantissa / 10^frac_digits
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    let frac_digits = frac_part.len() as i32;

    // value = mantissa * mult_num / mult_den
    let (mult_num, mut dec_exp): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        other => {
            let exp = other.strip_prefix('e').or_else(|| other.strip_prefix('E'))?;
            if exp.is_empty() {
                return None;
            }
            (1, exp.parse::<i32>().ok()?)
        }
    };
    dec_exp -= frac_digits;
    let mut num = mantissa.checked_mul(mult_num)?;
    let mut den: u128 = 1;
    if dec_exp >= 0 {
        if dec_exp > 30 {
            return if num == 0 { Some(0) } else { None };
        }
        num = num.checked_mul(10u128.checked_pow(dec_exp as u32)?)?;
    } else {
        if -dec_exp > 38 {
            return Some(if num == 0 { 0 } else { 1 });
        }
        den = 10u128.pow((-dec_exp) as u32);
    }
    let value = num.div_ceil(den);
    u64::try_from(value).ok()
}

/// The CLI argument for a size: the byte count when `s` parses, else `s` unchanged (cocoon then reports it).
pub fn to_byte_arg(s: &str) -> String {
    parse_quantity(s).map(|b| b.to_string()).unwrap_or_else(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_suffixes() {
        assert_eq!(parse_quantity("4Gi"), Some(4294967296));
        assert_eq!(parse_quantity("20Gi"), Some(21474836480));
        assert_eq!(parse_quantity("512Mi"), Some(536870912));
        assert_eq!(parse_quantity("1Ki"), Some(1024));
        assert_eq!(parse_quantity("1.5Gi"), Some(1610612736));
        assert_eq!(parse_quantity("1Ei"), Some(1 << 60));
    }

    #[test]
    fn decimal_suffixes_and_exponents() {
        assert_eq!(parse_quantity("1G"), Some(1_000_000_000));
        assert_eq!(parse_quantity("128974848"), Some(128974848));
        assert_eq!(parse_quantity("129e6"), Some(129_000_000));
        assert_eq!(parse_quantity("123M"), Some(123_000_000));
        assert_eq!(parse_quantity("1k"), Some(1000));
        assert_eq!(parse_quantity("1E2"), Some(100));
        assert_eq!(parse_quantity("+5"), Some(5));
        assert_eq!(parse_quantity("0"), Some(0));
    }

    #[test]
    fn fractions_round_up() {
        assert_eq!(parse_quantity("1500m"), Some(2));
        assert_eq!(parse_quantity("1m"), Some(1));
        assert_eq!(parse_quantity("0.1"), Some(1));
        assert_eq!(parse_quantity(".5Ki"), Some(512));
        assert_eq!(parse_quantity("1n"), Some(1));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "Gi", "-1Gi", "4GB", "4 Gi", "1.2.3", "e3", "4gi", "1e", "abc"] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
        assert_eq!(parse_quantity("100Ei"), None, "overflow must not wrap");
    }

    #[test]
    fn byte_arg_passes_unparseable_through() {
        assert_eq!(to_byte_arg("4Gi"), "4294967296");
        assert_eq!(to_byte_arg("4GB"), "4GB");
    }
}

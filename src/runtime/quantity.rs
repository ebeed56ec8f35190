//! Kubernetes resource quantities → byte counts for cocoon's flags (`4Gi` → `4294967296`; an
//! unparsable string passes through, as the Go daemon passed it).
//!
//! Grammar (k8s `resource.Quantity`): `[+-]digits[.digits][suffix]` where suffix is a binary SI suffix
//! (`Ki Mi Gi Ti Pi Ei`), a decimal SI suffix (`n u m "" k M G T P E`) or a decimal exponent (`e3`, `E-2`).
//! Fractions round **up** to a whole byte, as `Quantity.Value()` does.

/// Parses a quantity into a whole number of units (bytes). `None` for invalid, negative or
/// overflowing input. The grammar lives in `vk_policy_support::quantity`, shared with the policies.
pub fn parse_quantity(s: &str) -> Option<u64> {
    vk_policy_support::quantity::parse_units(s.trim()).ok()
}

/// The CLI argument for a size: the byte count when `s` parses, else `s` unchanged (cocoon then reports it).
pub fn to_byte_arg(s: &str) -> String {
    parse_quantity(s)
        .map(|b| b.to_string())
        .unwrap_or_else(|| s.to_string())
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

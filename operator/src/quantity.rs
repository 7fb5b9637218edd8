//! Kubernetes memory quantities (`80Gi`, `512M`, `1.5Gi`, `2e9`) as bytes.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::Error;

const SUFFIXES: [(&str, f64); 13] = [
    ("Ki", 1024.0),
    ("Mi", 1048576.0),
    ("Gi", 1073741824.0),
    ("Ti", 1099511627776.0),
    ("Pi", 1125899906842624.0),
    ("Ei", 1152921504606846976.0),
    ("k", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
    ("P", 1e15),
    ("E", 1e18),
    ("m", 1e-3),
];

/// Bytes in a memory quantity, rounded down.
pub fn bytes(q: &Quantity) -> Result<u64, Error> {
    parse_bytes(&q.0)
}

/// Bytes in a quantity string, rounded down.
pub fn parse_bytes(s: &str) -> Result<u64, Error> {
    let bad = || Error::InvalidSpec(format!("invalid memory quantity {s:?}"));
    let s = s.trim();
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(suffix, scale)| s.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((s, 1.0));
    if number.is_empty() || number.starts_with('-') {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    if !value.is_finite() {
        return Err(bad());
    }
    // Integers with binary suffixes are exact in u64 arithmetic; keep them so.
    if let Ok(whole) = number.parse::<u64>()
        && scale >= 1.0
    {
        return whole.checked_mul(scale as u64).ok_or_else(bad);
    }
    Ok((value * scale).floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_fractional() {
        let cases = [
            ("80Gi", Some(80u64 << 30)),
            ("24Gi", Some(24u64 << 30)),
            ("512Mi", Some(512u64 << 20)),
            ("2G", Some(2_000_000_000)),
            ("1.5Gi", Some(1610612736)),
            ("2e9", Some(2_000_000_000)),
            ("1000", Some(1000)),
            ("", None),
            ("-1Gi", None),
            ("lots", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_bytes(input).ok(), want, "{input}");
        }
    }
}

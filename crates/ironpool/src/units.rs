//! Units shared by every layer: sizes as people write them.

/// Parses a size with an optional binary suffix: 512, 16K, 2G, 1.5T. Whole
/// numbers are exact (never through a float, which rounds above 2^53); a
/// fraction is allowed only with a suffix, and is rounded to the byte.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, multiplier) = match text.chars().last().map(|last| last.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 1u64 << 10),
        Some('M') => (&text[..text.len() - 1], 1 << 20),
        Some('G') => (&text[..text.len() - 1], 1 << 30),
        Some('T') => (&text[..text.len() - 1], 1 << 40),
        Some('P') => (&text[..text.len() - 1], 1 << 50),
        Some('B') => (&text[..text.len() - 1], 1),
        _ => (text, 1),
    };
    if !number.is_empty() && number.bytes().all(|byte| byte.is_ascii_digit()) {
        return number
            .parse::<u64>()
            .ok()
            .and_then(|value| value.checked_mul(multiplier))
            .ok_or_else(|| format!("'{text}' is too large (at most {})", u64::MAX));
    }
    if multiplier == 1
        || !number
            .bytes()
            .all(|byte| byte.is_ascii_digit() || byte == b'.')
    {
        return Err(format!(
            "'{text}' is not a size (use e.g. 512, 16K, 2G, 1.5T)"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (use e.g. 512, 16K, 2G)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}' is not a size"));
    }
    let bytes = value * multiplier as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("'{text}' is too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("16K").unwrap(), 16384);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5M").unwrap(), 1536 * 1024);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999P").is_err());
        // Whole numbers are exact, past a float's 53 bits.
        assert_eq!(
            parse_size("9007199254740993").unwrap(),
            9_007_199_254_740_993
        );
        assert_eq!(
            parse_size("99999999999999999").unwrap(),
            99_999_999_999_999_999
        );
        assert!(parse_size("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("1e3K").is_err());
    }
}

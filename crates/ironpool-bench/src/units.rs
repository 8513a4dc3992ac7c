//! Sizes, rates and durations: parsing what an operator types and formatting
//! what the report shows.
//!
//! Sizes use binary multiples throughout (`2G` is 2 GiB), as fio and the
//! `ironpool` CLI do, so a size means the same thing on every command line.

use thiserror::Error;

/// One kibibyte.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;
/// One tebibyte.
pub const TIB: u64 = 1024 * GIB;

/// A size an operator typed that we cannot read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing but a suffix, or nothing at all.
    #[error("size {0:?} has no number (expected e.g. 256M, 2G, 16K or a byte count)")]
    NoNumber(String),
    /// A suffix other than K, M, G, T (optionally followed by `iB` or `B`).
    #[error("size {0:?} has an unknown unit (expected K, M, G or T, binary multiples)")]
    UnknownUnit(String),
    /// The value does not fit in 64 bits.
    #[error("size {0:?} is too large")]
    Overflow(String),
}

/// Parses `256M`, `2G`, `16K`, `1T`, `2GiB`, `512` (bytes) into bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(SizeError::NoNumber(text.to_string()));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| SizeError::Overflow(text.to_string()))?;
    let multiplier = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => KIB,
        "M" | "MB" | "MIB" => MIB,
        "G" | "GB" | "GIB" => GIB,
        "T" | "TB" | "TIB" => TIB,
        _ => return Err(SizeError::UnknownUnit(text.to_string())),
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| SizeError::Overflow(text.to_string()))
}

/// The shortest exact binary-suffixed spelling of a size: `16K`, `2G`,
/// `1536M`, or plain bytes. Used in test names and command lines.
pub fn size_short(bytes: u64) -> String {
    for (unit, suffix) in [(TIB, "T"), (GIB, "G"), (MIB, "M"), (KIB, "K")] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{}", bytes / unit, suffix);
        }
    }
    bytes.to_string()
}

/// A size for people: `2.00 GiB`, `512 MiB`, `16.0 KiB`, `100 B`.
pub fn bytes_human(bytes: f64) -> String {
    let units = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    for (unit, name) in units {
        let unit = unit as f64;
        if bytes >= unit {
            return format!("{} {}", three_digits(bytes / unit), name);
        }
    }
    format!("{bytes:.0} B")
}

/// A bandwidth for people: `3.50 GiB/s`, `812 MiB/s`.
pub fn rate_human(bytes_per_second: f64) -> String {
    format!("{}/s", bytes_human(bytes_per_second))
}

/// A count for people: `15.3k`, `842`, `1.20M`.
pub fn count_human(count: f64) -> String {
    if count >= 1e6 {
        format!("{}M", three_digits(count / 1e6))
    } else if count >= 1e4 {
        format!("{:.1}k", count / 1e3)
    } else if count >= 1e3 {
        format!("{:.2}k", count / 1e3)
    } else {
        format!("{count:.0}")
    }
}

/// A latency for people, from nanoseconds: `65.2 us`, `1.66 ms`, `2.10 s`.
pub fn latency_human(nanoseconds: f64) -> String {
    if nanoseconds >= 1e9 {
        format!("{} s", three_digits(nanoseconds / 1e9))
    } else if nanoseconds >= 1e6 {
        format!("{} ms", three_digits(nanoseconds / 1e6))
    } else {
        format!("{} us", three_digits(nanoseconds / 1e3))
    }
}

/// A wall-clock duration for people: `45 s`, `3 min 05 s`, `1 h 02 min`.
pub fn duration_human(seconds: f64) -> String {
    let total = seconds.max(0.0).round() as u64;
    let (hours, minutes, secs) = (total / 3600, (total / 60) % 60, total % 60);
    if hours > 0 {
        format!("{hours} h {minutes:02} min")
    } else if minutes > 0 {
        format!("{minutes} min {secs:02} s")
    } else {
        format!("{secs} s")
    }
}

/// A ratio as the report writes it: `0.85x`.
pub fn ratio_human(ratio: f64) -> String {
    format!("{ratio:.2}x")
}

/// A UTC calendar time `2026-11-21 23:55 UTC` from Unix seconds, without a
/// date-time dependency.
pub fn utc_human(unix_seconds: u64) -> String {
    let seconds_of_day = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(unix_seconds / 86_400);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        seconds_of_day / 3600,
        (seconds_of_day / 60) % 60
    )
}

/// The proleptic Gregorian date (year, month, day) `days` days after
/// 1970-01-01: counted in 400-year eras (146097 days each) of years starting
/// on March 1, so the leap day ends a year (Howard Hinnant's days-to-civil
/// algorithm). Shared with the CLI's status dates.
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Days from 0000-03-01 to 1970-01-01.
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March: 0 is March, 11 is February.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Three significant digits: `3.50`, `81.2`, `812`.
fn three_digits(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("2G"), Ok(2 * GIB));
        assert_eq!(parse_size("256M"), Ok(256 * MIB));
        assert_eq!(parse_size("16k"), Ok(16 * KIB));
        assert_eq!(parse_size("2GiB"), Ok(2 * GIB));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(matches!(parse_size("G"), Err(SizeError::NoNumber(_))));
        assert!(matches!(parse_size("3X"), Err(SizeError::UnknownUnit(_))));
        assert!(matches!(
            parse_size("99999999999T"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(size_short(16 * KIB), "16K");
        assert_eq!(size_short(1536 * MIB), "1536M");
        assert_eq!(size_short(1000), "1000");
        assert_eq!(bytes_human(2.0 * GIB as f64), "2.00 GiB");
        assert_eq!(rate_human(812.0 * MIB as f64), "812 MiB/s");
        assert_eq!(count_human(15_300.0), "15.3k");
        assert_eq!(count_human(1_234.0), "1.23k");
        assert_eq!(count_human(842.0), "842");
        assert_eq!(count_human(1_200_000.0), "1.20M");
        assert_eq!(latency_human(65_200.0), "65.2 us");
        assert_eq!(latency_human(1_663_000.0), "1.66 ms");
        assert_eq!(duration_human(185.0), "3 min 05 s");
        assert_eq!(ratio_human(0.854), "0.85x");
    }

    #[test]
    fn formats_utc() {
        assert_eq!(utc_human(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_human(1_795_305_355), "2026-11-21 23:55 UTC");
        assert_eq!(utc_human(951_782_400), "2000-02-29 00:00 UTC");
    }
}

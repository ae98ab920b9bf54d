//! Go-style durations (`"15s"`, `"1m30s"`, `"250ms"`), parsed and printed exactly as Go's
//! `time.ParseDuration` and `Duration.String` do, because Consul clients send and read them.

use std::fmt::Write as _;
use std::time::Duration;

/// A duration string Go would reject; the message is Go's own text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DurationError(String);

const NS: u128 = 1;
const US: u128 = 1_000;
const MS: u128 = 1_000_000;
const SEC: u128 = 1_000_000_000;
const MIN: u128 = 60 * SEC;
const HOUR: u128 = 60 * MIN;
/// Fraction digits read (Go's `leadingFraction` stops where its uint64 would overflow).
const MAX_FRACTION_DIGITS: usize = 19;

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// Parses a Go duration into signed nanoseconds.
pub fn parse_go_duration_ns(input: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError(format!("time: invalid duration {}", quote(input)));
    let mut s = input;
    let negative = match s.as_bytes().first() {
        Some(b'-') => {
            s = &s[1..];
            true
        }
        Some(b'+') => {
            s = &s[1..];
            false
        }
        _ => false,
    };
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &s[..int_len];
        s = &s[int_len..];
        let mut frac_part = "";
        if let Some(rest) = s.strip_prefix('.') {
            let frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &rest[..frac_len];
            s = &rest[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = s
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(s.len(), |(i, _)| i);
        let unit = &s[..unit_len];
        s = &s[unit_len..];
        let scale = match unit {
            "" => {
                return Err(DurationError(format!(
                    "time: missing unit in duration {}",
                    quote(input)
                )));
            }
            "ns" => NS,
            "us" | "µs" | "μs" => US,
            "ms" => MS,
            "s" => SEC,
            "m" => MIN,
            "h" => HOUR,
            other => {
                return Err(DurationError(format!(
                    "time: unknown unit {} in duration {}",
                    quote(other),
                    quote(input)
                )));
            }
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        // Like Go, only the first 19 fraction digits count; that also keeps the fraction
        // times the largest unit (an hour in ns) far inside a u128.
        let mut divisor = 1u128;
        let mut frac_value = 0u128;
        for digit in frac_part.bytes().take(MAX_FRACTION_DIGITS) {
            divisor *= 10;
            frac_value = frac_value * 10 + u128::from(digit - b'0');
        }
        let value = whole
            .checked_mul(scale)
            .and_then(|v| v.checked_add(frac_value * scale / divisor))
            .ok_or_else(invalid)?;
        total = total.checked_add(value).ok_or_else(invalid)?;
        if total > i64::MAX as u128 {
            return Err(invalid());
        }
    }
    let total = total as i64;
    Ok(if negative { -total } else { total })
}

/// Parses a non-negative Go duration.
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let ns = parse_go_duration_ns(input)?;
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError(format!("time: invalid duration {}", quote(input))))
}

/// A JSON number as Go turns it into a `time.Duration` (int64 nanoseconds): any fraction is
/// dropped, and a value outside int64's range, which Go would turn into garbage and Go clients
/// could not read back, is refused with Go's decoding text.
pub fn duration_ns_from_json(n: &serde_json::Number) -> Result<i64, DurationError> {
    /// 2^63: the first value past int64.
    const I64_END: f64 = 9_223_372_036_854_775_808.0;
    let refused = || {
        DurationError(format!(
            "json: cannot unmarshal number {n} into Go value of type time.Duration"
        ))
    };
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    if n.is_u64() {
        return Err(refused());
    }
    match n.as_f64() {
        Some(f) if (-I64_END..I64_END).contains(&f) => Ok(f as i64),
        _ => Err(refused()),
    }
}

fn push_fraction(out: &mut String, value: u128, unit: u128) {
    let whole = value / unit;
    let frac = value % unit;
    write!(out, "{whole}").expect("writing to a String cannot fail");
    if frac != 0 {
        let width = unit.ilog10() as usize;
        let digits = format!("{frac:0width$}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

/// Formats a duration the way Go's `Duration.String` does (`1h0m0s`, `1.5s`, `250ms`, `0s`).
pub fn format_go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    let mut out = String::new();
    if ns == 0 {
        return "0s".to_owned();
    }
    if ns < SEC {
        let (unit, suffix) = if ns < US {
            (NS, "ns")
        } else if ns < MS {
            (US, "µs")
        } else {
            (MS, "ms")
        };
        push_fraction(&mut out, ns, unit);
        out.push_str(suffix);
        return out;
    }
    let hours = ns / HOUR;
    let minutes = (ns % HOUR) / MIN;
    let rest = ns % MIN;
    if hours > 0 {
        write!(out, "{hours}h").expect("writing to a String cannot fail");
    }
    if hours > 0 || minutes > 0 {
        write!(out, "{minutes}m").expect("writing to a String cannot fail");
    }
    push_fraction(&mut out, rest, SEC);
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let cases = [
            ("0", 0),
            ("15s", 15 * SEC),
            ("1m30s", 90 * SEC),
            ("250ms", 250 * MS),
            ("1h", HOUR),
            ("1.5s", 1500 * MS),
            (".5s", 500 * MS),
            ("10000ms", 10 * SEC),
            ("3us", 3 * US),
            ("3µs", 3 * US),
            ("7ns", 7),
            ("1h2m3s4ms", HOUR + 2 * MIN + 3 * SEC + 4 * MS),
        ];
        for (text, ns) in cases {
            assert_eq!(parse_go_duration_ns(text), Ok(ns as i64), "{text}");
        }
        assert_eq!(parse_go_duration_ns("-2s"), Ok(-2_000_000_000));
    }

    #[test]
    fn errors_use_go_text() {
        assert_eq!(
            parse_go_duration_ns("10z").unwrap_err().to_string(),
            r#"time: unknown unit "z" in duration "10z""#
        );
        assert_eq!(
            parse_go_duration_ns("10").unwrap_err().to_string(),
            r#"time: missing unit in duration "10""#
        );
        assert_eq!(
            parse_go_duration_ns("").unwrap_err().to_string(),
            r#"time: invalid duration """#
        );
        assert_eq!(
            parse_go_duration_ns("s").unwrap_err().to_string(),
            r#"time: invalid duration "s""#
        );
        assert!(parse_go_duration("-1s").is_err());
    }

    /// Regression: a fraction of 30 digits times the unit, or a fraction added to the largest
    /// whole number of hours a u128 holds, overflowed (a panic in debug builds, a wrong
    /// duration in release builds) instead of parsing or being refused.
    #[test]
    fn long_fractions_and_huge_values_do_not_overflow() {
        assert_eq!(
            parse_go_duration_ns("0.999999999999999999999999999999h"),
            Ok(3_599_999_999_999)
        );
        assert_eq!(
            parse_go_duration_ns("0.9999999999999999999999999999999s"),
            Ok(999_999_999)
        );
        assert!(parse_go_duration_ns("94522879700260684295381835.9999999h").is_err());
    }

    #[test]
    fn json_numbers_must_fit_go_durations() {
        let number = |text: &str| -> serde_json::Number { serde_json::from_str(text).unwrap() };
        assert_eq!(
            duration_ns_from_json(&number("15000000000")),
            Ok(15 * SEC as i64)
        );
        assert_eq!(duration_ns_from_json(&number("2.9")), Ok(2));
        assert_eq!(duration_ns_from_json(&number("-5")), Ok(-5));
        assert_eq!(
            duration_ns_from_json(&number("9223372036854775807")),
            Ok(i64::MAX)
        );
        for text in [
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "1e30",
            "1.79e308",
            "-1e19",
        ] {
            let err = duration_ns_from_json(&number(text))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("json: cannot unmarshal number ")
                    && err.ends_with(" into Go value of type time.Duration"),
                "{text}: {err}"
            );
        }
    }

    /// Go-shaped durations (sign, digits, fraction, unit; up to three parts) of any length,
    /// with now and then a piece Go has no place for, or any characters at all.
    fn duration_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::collection::vec;
        use proptest::prelude::*;
        use proptest::sample::select;
        let digits = || vec(select(b"0123456789".to_vec()), 0..40);
        let unit = select(vec![
            "h", "m", "s", "ms", "us", "µs", "μs", "ns", "", "z", "mss", ".",
        ]);
        let part =
            (digits(), proptest::option::of(digits()), unit).prop_map(|(int, frac, unit)| {
                let mut text = String::from_utf8(int).expect("ASCII digits");
                if let Some(frac) = frac {
                    text.push('.');
                    text.push_str(&String::from_utf8(frac).expect("ASCII digits"));
                }
                text + unit
            });
        let sign = select(vec!["", "", "-", "+"]);
        prop_oneof![
            4 => (sign, vec(part, 1..4)).prop_map(|(sign, parts)| format!("{sign}{}", parts.concat())),
            1 => vec(any::<char>(), 0..12).prop_map(String::from_iter),
        ]
    }

    proptest::proptest! {
        /// Any text parses to a duration or is refused with Go's kind of message, never a panic.
        #[test]
        fn any_text_parses_or_is_refused(text in duration_text()) {
            if let Err(e) = parse_go_duration_ns(&text) {
                proptest::prop_assert!(e.to_string().starts_with("time: "), "{}", e);
            }
        }

        /// What we print reads back as the same duration, across Go's whole range.
        #[test]
        fn printed_durations_read_back(ns in 0..=i64::MAX as u64) {
            let printed = format_go_duration(Duration::from_nanos(ns));
            proptest::prop_assert_eq!(parse_go_duration_ns(&printed), Ok(ns as i64), "{}", printed);
        }
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (0, "0s"),
            (24 * HOUR, "24h0m0s"),
            (10 * SEC, "10s"),
            (1500 * MS, "1.5s"),
            (250 * MS, "250ms"),
            (1500 * US, "1.5ms"),
            (2 * US, "2µs"),
            (5, "5ns"),
            (MIN + 5 * SEC, "1m5s"),
            (HOUR + 200 * MS, "1h0m0.2s"),
        ];
        for (ns, text) in cases {
            assert_eq!(
                format_go_duration(Duration::from_nanos(ns as u64)),
                text,
                "{ns}"
            );
        }
    }
}

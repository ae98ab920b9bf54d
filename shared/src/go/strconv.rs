//! Go's `strconv`: `ParseUint` and `ParseBool` as Consul's handlers call them, and `Quote`,
//! which their error texts use.

/// Go's `strconv.ParseUint(s, 10, 64)`: ASCII digits only (no sign), with its error texts.
/// Like Go, it reports overflow as soon as it happens, before looking at later characters.
pub fn parse_uint(s: &str) -> Result<u64, String> {
    let syntax = || format!("strconv.ParseUint: parsing {}: invalid syntax", quote(s));
    if s.is_empty() {
        return Err(syntax());
    }
    let mut n: u64 = 0;
    for c in s.bytes() {
        if !c.is_ascii_digit() {
            return Err(syntax());
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(c - b'0')))
            .ok_or_else(|| {
                format!(
                    "strconv.ParseUint: parsing {}: value out of range",
                    quote(s)
                )
            })?;
    }
    Ok(n)
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.Quote`: printable characters as they are, the rest escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                if (c as u32) > 0xffff {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                } else {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uints_parse_like_go() {
        assert_eq!(parse_uint("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_uint("x").unwrap_err(),
            r#"strconv.ParseUint: parsing "x": invalid syntax"#
        );
        assert_eq!(
            parse_uint("").unwrap_err(),
            r#"strconv.ParseUint: parsing "": invalid syntax"#
        );
        assert_eq!(
            parse_uint("+5").unwrap_err(),
            r#"strconv.ParseUint: parsing "+5": invalid syntax"#
        );
        assert_eq!(
            parse_uint("18446744073709551616").unwrap_err(),
            r#"strconv.ParseUint: parsing "18446744073709551616": value out of range"#
        );
        assert_eq!(
            parse_uint("99999999999999999999x").unwrap_err(),
            r#"strconv.ParseUint: parsing "99999999999999999999x": value out of range"#
        );
        assert_eq!(quote("a\"b\\\n\u{1}é"), r#""a\"b\\\n\x01é""#);
    }

    #[test]
    fn bools_parse_like_go() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("yes"), None);
        assert_eq!(parse_bool(""), None);
    }
}

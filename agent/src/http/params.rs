//! Query-string handling with Consul's rules: flags are switched on by presence whatever their
//! value, blocking parameters (`index`, `wait`) and consistency modes are validated here once.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;

use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::go::strconv::{parse_bool, parse_uint};
use vigil_shared::rpc::{Consistency, QueryOptions};

use super::error::ApiError;

/// Longest a blocking query may wait (`max_query_time`).
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Wait used when `index` is given without `wait` (`default_query_time`).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// The decoded query string, in order.
#[derive(Debug, Clone, Default)]
pub struct Params {
    pairs: Vec<(String, String)>,
}

/// A handler's query string, as the client sent it.
impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Params, Infallible> {
        let OriginalUri(uri) = OriginalUri::from_request_parts(parts, state).await?;
        Ok(Params::parse(uri.query()))
    }
}

impl Params {
    pub fn parse(query: Option<&str>) -> Params {
        Params {
            pairs: query
                .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default(),
        }
    }

    /// Whether the parameter is present (Consul's presence-based flags).
    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == name)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeatable parameter, in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.pairs
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Consul's `getBoolQueryParam`: absent is false, present without a value is true, and
    /// any other value must be a Go bool (`strconv.ParseBool`); `Err` carries the bad value.
    pub fn bool(&self, name: &str) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(false),
            Some("") => Ok(true),
            Some(v) => parse_bool(v).ok_or_else(|| v.to_owned()),
        }
    }

    /// A uint64 parameter; a bad one gets Go's `strconv.ParseUint` message with a 500, as
    /// Consul answers.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|v| parse_uint(v).map_err(ApiError::server))
            .transpose()
    }

    /// The query string re-encoded with keys sorted, as Go's `url.Values.Encode` prints it.
    pub fn encoded_sorted(&self) -> String {
        let mut pairs = self.pairs.clone();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    pub fn pretty(&self) -> bool {
        self.has("pretty")
    }

    /// Consistency mode and blocking options for a read.
    pub fn query_options(&self) -> Result<QueryOptions, ApiError> {
        let stale = self.has("stale");
        let consistent = self.has("consistent");
        if stale && consistent {
            return Err(ApiError::bad_request(
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ));
        }
        let consistency = if stale {
            Consistency::Stale
        } else if consistent {
            Consistency::Consistent
        } else {
            Consistency::Default
        };
        let min_index = match self.get("index") {
            None | Some("") => 0,
            Some(v) => parse_uint(v).map_err(|_| ApiError::bad_request("Invalid index"))?,
        };
        let wait = match self.get("wait") {
            None | Some("") => DEFAULT_WAIT,
            Some(v) => {
                let d =
                    parse_go_duration(v).map_err(|_| ApiError::bad_request("Invalid wait time"))?;
                if d.is_zero() {
                    DEFAULT_WAIT
                } else {
                    d.min(MAX_WAIT)
                }
            }
        };
        // The backend adds Consul's jitter, and answers by `wait + wait/16` whatever happens.
        Ok(QueryOptions {
            consistency,
            min_index,
            wait_ms: wait.as_millis() as u64,
        })
    }
}

/// Go's `url.QueryEscape`: unreserved bytes as they are, space as `+`, the rest `%XX`.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Percent-decodes a URL path segment (`+` stays a plus, unlike in query strings). Bytes that
/// are not UTF-8 are an error rather than U+FFFD, so two different paths never decode alike.
pub fn decode_path(raw: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_presence_based_and_reencoded_sorted() {
        let p = Params::parse(Some("release=b&recurse=false&acquire=a%20x&cas=0"));
        assert!(p.has("recurse"));
        assert_eq!(p.get("acquire"), Some("a x"));
        assert_eq!(
            p.encoded_sorted(),
            "acquire=a+x&cas=0&recurse=false&release=b"
        );
    }

    #[test]
    fn blocking_options_validate() {
        assert!(Params::parse(Some("index=x")).query_options().is_err());
        assert!(Params::parse(Some("wait=5z")).query_options().is_err());
        assert!(
            Params::parse(Some("stale&consistent"))
                .query_options()
                .is_err()
        );
        let o = Params::parse(Some("index=5&wait=1600s"))
            .query_options()
            .unwrap();
        assert_eq!(o.min_index, 5);
        assert_eq!(o.wait_ms, 600_000, "clamped to 10 min");
    }

    #[test]
    fn bools_parse_like_consuls_get_bool_query_param() {
        let p = Params::parse(Some("a&b=true&c=0&d=maybe&e=T"));
        assert_eq!(p.bool("a"), Ok(true));
        assert_eq!(p.bool("b"), Ok(true));
        assert_eq!(p.bool("c"), Ok(false));
        assert_eq!(p.bool("d"), Err("maybe".to_owned()));
        assert_eq!(p.bool("e"), Ok(true));
        assert_eq!(p.bool("absent"), Ok(false));
    }

    #[test]
    fn reencodes_like_go_query_escape() {
        let p = Params::parse(Some("release=a~b*c&acquire=x%2Fy"));
        assert_eq!(p.encoded_sorted(), "acquire=x%2Fy&release=a~b%2Ac");
    }

    #[test]
    fn decodes_paths() {
        assert_eq!(decode_path("a%2Fb+c%20d").unwrap(), "a/b+c d");
        assert_eq!(decode_path("100%").unwrap(), "100%");
        assert_eq!(decode_path("%EF%BF%BD").unwrap(), "\u{fffd}");
        assert!(decode_path("%FF").is_err());
        assert!(decode_path("%FE").is_err());
    }
}

//! `/v1/operator/keyring`: Consul's gossip key rotation. `GET` lists the keys every live member
//! holds, `POST` installs a key on every member, `PUT` makes it their primary, `DELETE` removes
//! it; the work is in [`crate::gossip::keyring`]. One pool is reported, the LAN pool of our one
//! datacenter. A refusal or a member that did not answer is Consul's 500 with Go's multierror
//! text: the pool's verdict, then each refusing member's message.

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::agent::KeyringPoolJson;
use vigil_shared::api::decode_case_insensitive;
use vigil_shared::go::strconv::{parse_bool, quote as go_quote};

use super::Ctx;
use super::body::RequestBody;
use super::error::ApiError;
use super::params::Params;
use crate::DATACENTER;
use crate::gossip::{KeyOp, KeyResponse};

/// Consul's largest `?relay-factor`.
const MAX_RELAY_FACTOR: i64 = 5;

/// The body of a change: `{"Key": "<base64>"}`, the name matched case-insensitively.
#[derive(Deserialize, Default)]
#[serde(default)]
struct KeyBody {
    key: String,
}

/// Go's `go-multierror` text for `errors` (what Consul's HTTP layer prints).
fn multierror(errors: &[String]) -> String {
    match errors {
        [one] => format!("1 error occurred:\n\t* {one}\n\n"),
        many => {
            let points: Vec<String> = many.iter().map(|e| format!("* {e}")).collect();
            format!(
                "{} errors occurred:\n\t{}\n\n",
                many.len(),
                points.join("\n\t")
            )
        }
    }
}

/// Our pool's failure as Consul reports it: the verdict, then each member's message.
fn pool_error(verdict: &str, messages: &BTreeMap<String, String>) -> ApiError {
    let mut errors = vec![format!("{DATACENTER} (LAN) error: {verdict}")];
    errors.extend(messages.iter().map(|(node, m)| format!("{node}: {m}")));
    ApiError::server(multierror(&errors))
}

/// Go's `base64.StdEncoding.DecodeString`, with Go's error text.
fn decode_key(key: &str) -> Result<Vec<u8>, String> {
    BASE64.decode(key).map_err(|e| {
        let at = match e {
            base64::DecodeError::InvalidByte(at, _)
            | base64::DecodeError::InvalidLastSymbol(at, _) => at,
            // Go stops at the start of the incomplete last quantum.
            base64::DecodeError::InvalidLength(len) => len - len % 4,
            base64::DecodeError::InvalidPadding => key.len(),
        };
        format!("illegal base64 data at input byte {at}")
    })
}

/// Consul's checks of `?relay-factor` and `?local-only`. Relaying answers through other
/// members is not needed here (the asker repeats its request until each member answered), so a
/// valid relay factor changes nothing.
fn check_params(params: &Params, method: &Method) -> Result<(), ApiError> {
    if let Some(relay) = params.get("relay-factor").filter(|r| !r.is_empty()) {
        let n: i64 = relay.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "Error parsing relay factor: strconv.Atoi: parsing {}: invalid syntax",
                go_quote(relay)
            ))
        })?;
        if !(0..=MAX_RELAY_FACTOR).contains(&n) {
            return Err(ApiError::bad_request(
                "Invalid relay-factor: Relay factor must be in range: [0, 5]",
            ));
        }
    }
    if let Some(local) = params.get("local-only").filter(|l| !l.is_empty()) {
        let local = parse_bool(local).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Error parsing local-only: strconv.ParseBool: parsing {}: invalid syntax",
                go_quote(local)
            ))
        })?;
        if local && method != Method::GET {
            return Err(ApiError::bad_request(
                "Invalid use of local-only: local-only can only be set for list requests",
            ));
        }
    }
    Ok(())
}

/// `GET|POST|PUT|DELETE /v1/operator/keyring[?relay-factor=N][&local-only=B]`.
pub async fn keyring(
    cx: Ctx,
    method: Method,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    let access = if method == Method::GET {
        Access::Read
    } else {
        Access::Write
    };
    cx.check(Resource::Keyring, access, "")?;
    let key = if method == Method::GET || body.is_empty() {
        String::new()
    } else {
        decode_case_insensitive::<KeyBody>(&body, &[])
            .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?
            .key
    };
    check_params(&cx.params, &method)?;
    let op = if method == Method::GET {
        KeyOp::List
    } else {
        let bytes = decode_key(&key).map_err(|e| pool_error(&e, &BTreeMap::new()))?;
        match method {
            Method::POST => KeyOp::Install(bytes),
            Method::PUT => KeyOp::Use(bytes),
            _ => KeyOp::Remove(bytes),
        }
    };
    let list = op == KeyOp::List;
    let response: KeyResponse = cx
        .state
        .gossip
        .keyring(op)
        .await
        .map_err(|e| ApiError::server(e.to_string()))?;
    if let Some(verdict) = response.error() {
        return Err(pool_error(&verdict, &response.messages));
    }
    if !list {
        return Ok(StatusCode::OK.into_response());
    }
    let pool = KeyringPoolJson {
        wan: false,
        datacenter: DATACENTER.to_owned(),
        segment: String::new(),
        keys: response.keys,
        primary_keys: response.primary_keys,
        num_nodes: response.num_nodes,
    };
    Ok(cx.json(&[pool]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_gos() {
        assert_eq!(
            multierror(&["a".to_owned()]),
            "1 error occurred:\n\t* a\n\n"
        );
        assert_eq!(
            multierror(&["a".to_owned(), "b".to_owned()]),
            "2 errors occurred:\n\t* a\n\t* b\n\n"
        );
        assert_eq!(
            decode_key("abc!").unwrap_err(),
            "illegal base64 data at input byte 3"
        );
        assert_eq!(
            decode_key("abcde").unwrap_err(),
            "illegal base64 data at input byte 4"
        );
        assert_eq!(decode_key("").unwrap(), Vec::<u8>::new());
    }
}

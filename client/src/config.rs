//! How a client reaches an agent: its address and scheme, the TLS files that verify it and
//! identify us, and the ACL token, read from the environment as Consul's clients read it.
//!
//! Each setting comes from the first that is set of: an explicit value (a command-line flag),
//! `VIGIL_<NAME>`, `CONSUL_<NAME>` (so `VIGIL_` wins), then the default. Names: `HTTP_ADDR`
//! (`host:port`, `http://…`, `https://…`, or `unix:///path` for an agent serving its API on a
//! Unix socket), `HTTP_SSL` (true: https unless the address names
//! a scheme), `CACERT`, `CLIENT_CERT`, `CLIENT_KEY`, `HTTP_TOKEN`, `HTTP_TOKEN_FILE`.
//!
//! Invariant: the token never reaches a log or an error message; its `Debug` is redacted.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::{Client, ClientError, DEFAULT_HTTP_ADDR};

/// An ACL token (`X-Consul-Token`). Printed as `Token(redacted)`, never its value.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// `None` for an empty (or all-blank) token, which means no token.
    pub fn new(token: &str) -> Option<Token> {
        let token = token.trim();
        (!token.is_empty()).then(|| Token(token.to_owned()))
    }

    /// The secret itself, to put in a request header.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(redacted)")
    }
}

impl FromStr for Token {
    type Err = String;

    fn from_str(s: &str) -> Result<Token, String> {
        Token::new(s).ok_or_else(|| "the token is empty".to_owned())
    }
}

/// Everything needed to build a [`Client`]. Fields left `None` fall back to the environment in
/// [`ClientConfig::from_env`]; [`ClientConfig::build`] uses them as they are.
#[derive(Debug, Clone, Default)]
pub struct ClientConfig {
    /// `host:port`, `http://host:port`, `https://host:port` or `unix:///path` [default:
    /// 127.0.0.1:8500].
    pub addr: Option<String>,
    /// HTTPS for an address without a scheme (`CONSUL_HTTP_SSL=true`).
    pub https: bool,
    /// The CA certificate (PEM) that signed the agent's certificate (`CONSUL_CACERT`).
    pub ca_file: Option<PathBuf>,
    /// Our client certificate (PEM) for an agent with `--verify-incoming-https`.
    pub client_cert: Option<PathBuf>,
    /// The key of `client_cert` (PEM).
    pub client_key: Option<PathBuf>,
    /// Sent as `X-Consul-Token` on every request.
    pub token: Option<Token>,
}

/// `VIGIL_<name>`, else `CONSUL_<name>`, ignoring empty values.
fn env(name: &str) -> Option<String> {
    ["VIGIL_", "CONSUL_"].iter().find_map(|prefix| {
        std::env::var(format!("{prefix}{name}"))
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
}

/// Go's `strconv.ParseBool`, as Consul reads `CONSUL_HTTP_SSL`.
fn parse_bool(name: &str, value: &str) -> Result<bool, ClientError> {
    let value = value.trim();
    vigil_shared::go::strconv::parse_bool(value)
        .ok_or_else(|| ClientError::BadConfig(format!("{name}: {value:?} is not a boolean")))
}

impl ClientConfig {
    /// Fills every setting not given yet from the environment (`VIGIL_` over `CONSUL_`).
    pub fn from_env(mut self) -> Result<ClientConfig, ClientError> {
        if self.addr.is_none() {
            self.addr = env("HTTP_ADDR");
        }
        if !self.https
            && let Some(ssl) = env("HTTP_SSL")
        {
            self.https = parse_bool("HTTP_SSL", &ssl)?;
        }
        let path = |name: &str| env(name).map(PathBuf::from);
        self.ca_file = self.ca_file.or_else(|| path("CACERT"));
        self.client_cert = self.client_cert.or_else(|| path("CLIENT_CERT"));
        self.client_key = self.client_key.or_else(|| path("CLIENT_KEY"));
        if self.token.is_none() {
            self.token = match env("HTTP_TOKEN") {
                Some(token) => Token::new(&token),
                None => match env("HTTP_TOKEN_FILE") {
                    Some(file) => {
                        let text = std::fs::read_to_string(&file).map_err(|e| {
                            ClientError::BadConfig(format!("reading the token file {file}: {e}"))
                        })?;
                        Token::new(&text)
                    }
                    None => None,
                },
            };
        }
        Ok(self)
    }

    /// The agent's base URL, `scheme://host:port` with no trailing slash (`http://localhost`
    /// for a Unix socket).
    pub fn base_url(&self) -> Result<String, ClientError> {
        if self.unix_socket().is_some() {
            return Ok("http://localhost".to_owned());
        }
        let addr = self.addr.as_deref().unwrap_or(DEFAULT_HTTP_ADDR);
        let addr = addr.trim().trim_end_matches('/');
        if addr.is_empty() || addr.starts_with("unix:") {
            return Err(ClientError::BadAddress(addr.to_owned()));
        }
        if let Some((scheme, rest)) = addr.split_once("://") {
            if !matches!(scheme, "http" | "https") || rest.is_empty() {
                return Err(ClientError::BadAddress(addr.to_owned()));
            }
            return Ok(addr.to_owned());
        }
        let scheme = if self.https { "https" } else { "http" };
        Ok(format!("{scheme}://{addr}"))
    }

    /// The socket of a `unix:///path` address (plain HTTP, as Consul's clients speak there).
    pub fn unix_socket(&self) -> Option<PathBuf> {
        let path = self.addr.as_deref()?.trim().strip_prefix("unix://")?;
        (!path.is_empty()).then(|| PathBuf::from(path))
    }

    /// A client for the agent as configured.
    pub fn build(&self) -> Result<Client, ClientError> {
        let base = self.base_url()?;
        let socket = self.unix_socket();
        let mut builder = reqwest::Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(90))
            .tcp_nodelay(true);
        if let Some(socket) = &socket {
            builder = builder.unix_socket(socket.as_path());
        } else if base.starts_with("https://") {
            builder = self.tls(builder)?;
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::BadConfig(format!("{base}: {e}")))?;
        Ok(Client::from_parts(http, base, socket, self.token.clone()))
    }

    /// HTTPS: trust only the CA given (a Vigil agent's certificate comes from `vigil tls`), and
    /// present our certificate when one is given.
    fn tls(&self, builder: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder, ClientError> {
        let ca_file = self.ca_file.as_deref().ok_or_else(|| {
            ClientError::BadConfig(
                "HTTPS needs the CA certificate that signed the agent's (CONSUL_CACERT or --ca-file)"
                    .to_owned(),
            )
        })?;
        let bad = |path: &Path, e: &dyn fmt::Display| {
            ClientError::BadConfig(format!("{}: {e}", path.display()))
        };
        let read = |path: &Path| std::fs::read(path).map_err(|e| bad(path, &e));
        let roots =
            reqwest::Certificate::from_pem_bundle(&read(ca_file)?).map_err(|e| bad(ca_file, &e))?;
        if roots.is_empty() {
            return Err(bad(ca_file, &"no certificate found"));
        }
        let mut builder = builder.use_rustls_tls().tls_built_in_root_certs(false);
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let mut pem = read(cert)?;
                pem.push(b'\n');
                pem.extend(read(key)?);
                let identity = reqwest::Identity::from_pem(&pem).map_err(|e| bad(cert, &e))?;
                builder = builder.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(ClientError::BadConfig(
                    "a client certificate needs its key, and a key its certificate \
                     (CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY)"
                        .to_owned(),
                ));
            }
        }
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_comes_from_the_address_else_from_the_https_switch() {
        let config = |addr: &str, https: bool| ClientConfig {
            addr: Some(addr.to_owned()),
            https,
            ..ClientConfig::default()
        };
        assert_eq!(config("h:1", false).base_url().unwrap(), "http://h:1");
        assert_eq!(config("h:1", true).base_url().unwrap(), "https://h:1");
        assert_eq!(
            config("https://h:1/", false).base_url().unwrap(),
            "https://h:1"
        );
        assert_eq!(config("http://h:1", true).base_url().unwrap(), "http://h:1");
        assert!(config("ftp://h:1", false).base_url().is_err());
        let unix = config("unix:///run/vigil/http.sock", false);
        assert_eq!(unix.base_url().unwrap(), "http://localhost");
        assert_eq!(
            unix.unix_socket(),
            Some(PathBuf::from("/run/vigil/http.sock"))
        );
        assert!(config("unix://", false).base_url().is_err());
        assert_eq!(
            ClientConfig::default().base_url().unwrap(),
            "http://127.0.0.1:8500"
        );
    }

    #[test]
    fn https_without_a_ca_is_refused_with_a_reason() {
        let config = ClientConfig {
            addr: Some("https://127.0.0.1:1".to_owned()),
            ..ClientConfig::default()
        };
        let err = config.build().err().expect("no CA");
        assert!(err.to_string().contains("CONSUL_CACERT"), "{err}");
    }

    #[test]
    fn tokens_are_never_printed() {
        let config = ClientConfig {
            token: Token::new("s3cr3t-token"),
            ..ClientConfig::default()
        };
        assert!(!format!("{config:?}").contains("s3cr3t"));
        assert_eq!(Token::new("  "), None);
        assert_eq!(config.token.unwrap().secret(), "s3cr3t-token");
    }
}

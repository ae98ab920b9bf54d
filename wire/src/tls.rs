//! Certificates and the TLS side of the QUIC transport: the cluster CA and the server/client
//! certificates it signs (`vigil tls ...`, or throwaway ones for `--dev`), and the rustls/quinn
//! configurations built from them (QUIC RPC, and the agent's HTTPS API). Invariants: every
//! rustls config is built with the ring provider passed explicitly (never a process default);
//! the RPC's are TLS 1.3 only, mutual authentication against our CA only, no session resumption
//! and no 0-RTT; the HTTPS API's also speaks TLS 1.2 and asks for a client certificate only
//! with `verify_incoming`. A peer's [`Role`] comes from its
//! verified certificate: only the exact DNS SAN `server.<dc>.<domain>` makes it a server
//! (Consul's `verify_server_hostname`); a node-specific name `<node>.server.<dc>.<domain>`
//! also names the server's node, and node names never contain dots, so no client certificate
//! can carry a server name.

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::crypto::tls13::{Hkdf, OkmBlock};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The ALPN protocol id of Vigil's RPC: requests from agents and servers to servers.
pub const ALPN_RPC: &[u8] = b"vigil-rpc/2";
/// The ALPN protocol id of raft's messages between servers; only a server certificate may
/// open a connection that speaks it.
pub const ALPN_RAFT: &[u8] = b"vigil-raft/1";
/// The ALPN protocol id the HTTPS API offers (Consul's API speaks HTTP/1.1 only).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";
/// Consul's `domain`, with Vigil's default.
pub const DEFAULT_DOMAIN: &str = "vigil";
/// The datacenter used when none is given.
pub const DEFAULT_DATACENTER: &str = "dc1";
/// File name of the CA certificate written by [`create_ca`].
pub const CA_CERT_FILE: &str = "vigil-agent-ca.pem";
/// File name of the CA private key written by [`create_ca`].
pub const CA_KEY_FILE: &str = "vigil-agent-ca-key.pem";

/// A connection with no packet from the peer for this long is dead. The effective value is the
/// smaller of both peers' settings.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keep-alive pings, well under half the idle timeout so one lost ping does not kill a
/// healthy connection.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Bidirectional streams a peer may have open at once (one per in-flight RPC, including
/// blocking queries that wait for minutes).
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Bytes a peer may send on one connection, over all its streams, before they are read: what
/// a connection can make its receiver buffer, whatever its streams' windows add up to.
pub const CONNECTION_RECEIVE_WINDOW: u32 = 4 * 1024 * 1024;

/// Lifetime of a CA created by [`create_ca`] (Consul: 5 years).
const CA_LIFETIME: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// Lifetime of a certificate created by [`create_cert`] or [`CertificateAuthority::issue`]
/// (Consul: 1 year).
const CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// `not_before` is backdated this much to tolerate small clock differences between nodes.
const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// Domain-separation label for the stateless-reset key derived from our private key.
const RESET_KEY_LABEL: &[u8] = b"vigil quic stateless reset key v1";

/// What a node is allowed to do, as proven by its certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A server: may take part in raft and serve every RPC.
    Server,
    /// A client agent: may only call the client-facing RPCs, each on behalf of a token.
    Client,
    /// A user's certificate for the HTTPS API and the CLI (`cli.<dc>.<domain>`, Consul's
    /// `-cli`): the RPC endpoint refuses it outright. So is any certificate of our CA that names
    /// neither a server nor a client agent.
    Cli,
}

impl Role {
    /// The name used in SANs and file names (`server`, `client`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
            Role::Cli => "cli",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why certificates could not be created or loaded, or a TLS configuration built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file to be created exists already; remove it or choose another directory.
    #[error("{}: already exists, refusing to overwrite it", path.display())]
    AlreadyExists { path: PathBuf },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A PEM input does not hold what it should (no certificate, no key, or garbage).
    #[error("{what}: {reason}")]
    InvalidPem { what: String, reason: String },
    /// The private key does not belong to the certificate it was given with.
    #[error("{what}: the private key does not match the certificate")]
    KeyMismatch { what: String },
    /// A node name that cannot be part of a certificate name: it would be read as another name
    /// (a dot would let `--client --node server` yield `server.client.<dc>.<domain>`).
    #[error(
        "invalid node name {name:?} for a certificate: node names must be non-empty, contain no dots, and not be \"server\" or \"client\""
    )]
    InvalidNodeName { name: String },
    /// A certificate could not be generated or signed.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the certificate chain or key.
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built (e.g. no usable CA certificate).
    #[error("building the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The rustls configuration cannot carry QUIC (TLS 1.3 cipher suite missing).
    #[error("TLS configuration unusable for QUIC: {0}")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

/// The only crypto provider Vigil uses. Passed explicitly to every builder so a second provider
/// compiled into the process (e.g. aws-lc through some dependency) can never cause a panic.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The transport settings shared by both sides of every connection.
fn transport_config() -> TransportConfig {
    let mut transport = TransportConfig::default();
    let idle_ms = u32::try_from(IDLE_TIMEOUT.as_millis()).unwrap_or(u32::MAX);
    transport.max_idle_timeout(Some(IdleTimeout::from(VarInt::from_u32(idle_ms))));
    transport.keep_alive_interval(Some(KEEP_ALIVE_INTERVAL));
    transport.max_concurrent_bidi_streams(VarInt::from_u32(MAX_CONCURRENT_STREAMS));
    transport.max_concurrent_uni_streams(VarInt::from_u32(0));
    transport.receive_window(VarInt::from_u32(CONNECTION_RECEIVE_WINDOW));
    transport
}

/// Consul-style names for `role` in `datacenter` and `domain`: `server.dc1.vigil`.
fn role_name(role: Role, datacenter: &str, domain: &str) -> String {
    format!("{}.{datacenter}.{domain}", role.as_str())
}

/// Sets the validity window to [now - skew, now + lifetime].
fn set_validity(params: &mut CertificateParams, lifetime: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let now = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + lifetime;
}

/// Checks that `key` belongs to the leaf (first) certificate of `chain`.
fn check_key_matches(
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    what: &str,
) -> Result<(), TlsError> {
    match rustls::sign::CertifiedKey::from_der(chain.to_vec(), key.clone_key(), &provider()) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            what: what.to_owned(),
        }),
        Err(e) => Err(TlsError::Rustls(e)),
    }
}

/// The cluster certificate authority: signs server and client certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    cert_pem: String,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Generates a new CA (ECDSA P-256, valid 5 years) for `domain`.
    pub fn generate(domain: &str) -> Result<CertificateAuthority, TlsError> {
        let mut unique = [0u8; 8];
        // A random suffix keeps the subject names of successive CAs apart (rotation).
        provider()
            .secure_random
            .fill(&mut unique)
            .map_err(|e| TlsError::Rustls(rustls::Error::from(e)))?;
        let suffix: String = unique.iter().map(|b| format!("{b:02x}")).collect();

        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Vigil Agent CA {suffix}"));
        params
            .distinguished_name
            .push(DnType::OrganizationalUnitName, domain);
        set_validity(&mut params, CA_LIFETIME);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        // Going through PEM gives an owned `Issuer`, exactly as a reloaded CA would be.
        CertificateAuthority::from_pem(&ca.pem(), &ca.key().serialize_pem())
    }

    /// Loads a CA from its PEM certificate and PEM private key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<CertificateAuthority, TlsError> {
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| {
            TlsError::InvalidPem {
                what: "CA certificate".to_owned(),
                reason: e.to_string(),
            }
        })?;
        let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::InvalidPem {
            what: "CA private key".to_owned(),
            reason: e.to_string(),
        })?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        check_key_matches(std::slice::from_ref(&cert), &key_der, "CA")?;
        let issuer = Issuer::from_ca_cert_der(&cert, key)?;
        Ok(CertificateAuthority {
            issuer,
            cert,
            cert_pem: cert_pem.to_owned(),
        })
    }

    /// Loads a CA from the files written by [`create_ca`].
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<CertificateAuthority, TlsError> {
        let cert_pem = read_string(cert_file)?;
        let key_pem = read_string(key_file)?;
        CertificateAuthority::from_pem(&cert_pem, &key_pem)
    }

    /// The CA certificate in PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key in PEM (PKCS#8).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a certificate for `role` in memory and returns it, with this CA as the only root.
    pub fn issue(
        &self,
        role: Role,
        datacenter: &str,
        domain: &str,
        node: Option<&str>,
    ) -> Result<TlsMaterial, TlsError> {
        let (cert, key) = self.sign_leaf(role, datacenter, domain, node)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        TlsMaterial::new(
            vec![self.cert.clone()],
            vec![cert.der().clone()],
            key,
            "issued certificate",
        )
    }

    /// Signs a new leaf certificate with a fresh key. Server certificates name
    /// `server.<dc>.<domain>` (and `<node>.server.<dc>.<domain>` when a node is given),
    /// `localhost` and 127.0.0.1; client certificates `client.<dc>.<domain>`, `localhost` and
    /// 127.0.0.1 (as Consul's: a client agent serves its HTTPS API on loopback too). Both carry
    /// the serverAuth and clientAuth usages, so either can sit on both sides of mTLS (a client
    /// agent's endpoint also accepts connections).
    fn sign_leaf(
        &self,
        role: Role,
        datacenter: &str,
        domain: &str,
        node: Option<&str>,
    ) -> Result<(rcgen::Certificate, KeyPair), TlsError> {
        let name = role_name(role, datacenter, domain);
        let mut sans = vec![name.clone()];
        if let Some(node) = node {
            check_node_name(node)?;
            sans.push(format!("{node}.{name}"));
        }
        sans.push("localhost".to_owned());
        sans.push("127.0.0.1".to_owned());
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, CERT_LIFETIME);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert, key))
    }
}

/// Refuses node names that would make a certificate name read as another one.
fn check_node_name(node: &str) -> Result<(), TlsError> {
    if node.is_empty()
        || node.contains('.')
        || node == "server"
        || node == "client"
        || node == "cli"
    {
        return Err(TlsError::InvalidNodeName {
            name: node.to_owned(),
        });
    }
    Ok(())
}

/// Writes a new CA to `dir` as [`CA_CERT_FILE`] and [`CA_KEY_FILE`] (key readable by the owner
/// only). Refuses to overwrite either file. Returns the paths of the certificate and the key.
pub fn create_ca(dir: &Path, domain: &str) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(TlsError::AlreadyExists { path: path.clone() });
        }
    }
    let ca = CertificateAuthority::generate(domain)?;
    write_new(&cert_path, ca.cert_pem(), false)?;
    write_new(&key_path, &ca.key_pem(), true)?;
    Ok((cert_path, key_path))
}

/// Signs a certificate for `role` with the CA in `ca_cert_path`/`ca_key_path` and writes it to
/// `dir` as `<dc>-<role>-<domain>-<n>.pem` and `<dc>-<role>-<domain>-<n>-key.pem`, `n` being the
/// first number for which neither file exists (Consul's naming). Returns the paths of the
/// certificate and the key.
pub fn create_cert(
    dir: &Path,
    ca_cert_path: &Path,
    ca_key_path: &Path,
    role: Role,
    datacenter: &str,
    domain: &str,
    node: Option<&str>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let ca = CertificateAuthority::load(ca_cert_path, ca_key_path)?;
    let (cert, key) = ca.sign_leaf(role, datacenter, domain, node)?;
    let prefix = format!("{datacenter}-{}-{domain}", role.as_str());
    let (cert_path, key_path) = (0u32..)
        .map(|n| {
            (
                dir.join(format!("{prefix}-{n}.pem")),
                dir.join(format!("{prefix}-{n}-key.pem")),
            )
        })
        .find(|(cert, key)| !cert.exists() && !key.exists())
        .ok_or_else(|| TlsError::AlreadyExists {
            path: dir.join(format!("{prefix}-*.pem")),
        })?;
    write_new(&cert_path, &cert.pem(), false)?;
    write_new(&key_path, &key.serialize_pem(), true)?;
    Ok((cert_path, key_path))
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

fn read_string(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Creates `path` (which must not exist) holding `contents`; `private` files are mode 0600.
fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), TlsError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let io_error = |source: io::Error| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            TlsError::AlreadyExists {
                path: path.to_owned(),
            }
        } else {
            TlsError::Io {
                path: path.to_owned(),
                source,
            }
        }
    };
    let mut file = options.open(path).map_err(io_error)?;
    file.write_all(contents.as_bytes()).map_err(io_error)?;
    file.sync_all().map_err(io_error)
}

/// Everything a node needs for mutual TLS: the CA certificates it trusts, its own certificate
/// chain and private key, and the name it expects on servers it dials.
pub struct TlsMaterial {
    /// Trusted CAs; more than one while a CA is being rotated.
    roots: Vec<CertificateDer<'static>>,
    /// Our certificate first, then the issuing CA, as sent to peers.
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// The DNS names of our own certificate; our role is whether they include `server_name`.
    names: Vec<String>,
    /// `server.<dc>.<domain>`: every server certificate carries it, so dialing any server
    /// verifies against this one name (Consul's `verify_server_hostname`), and a peer is a
    /// server only if its certificate carries exactly this name.
    server_name: String,
}

impl Clone for TlsMaterial {
    fn clone(&self) -> Self {
        TlsMaterial {
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            names: self.names.clone(),
            server_name: self.server_name.clone(),
        }
    }
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("role", &self.role())
            .field("server_name", &self.server_name)
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl TlsMaterial {
    /// Loads PEM files: the CA certificate(s), our certificate (optionally followed by its
    /// chain) and our private key. The server name to verify is derived from our own
    /// certificate (`server.X` or `client.X` → `server.X`); see [`TlsMaterial::with_server_name`].
    pub fn load(ca_file: &Path, cert_file: &Path, key_file: &Path) -> Result<Self, TlsError> {
        let pem_error = |path: &Path, reason: String| TlsError::InvalidPem {
            what: path.display().to_string(),
            reason,
        };
        let roots = CertificateDer::pem_slice_iter(&read_file(ca_file)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(ca_file, e.to_string()))?;
        let chain = CertificateDer::pem_slice_iter(&read_file(cert_file)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(cert_file, e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(&read_file(key_file)?)
            .map_err(|e| pem_error(key_file, e.to_string()))?;
        if roots.is_empty() {
            return Err(pem_error(ca_file, "no certificate found".to_owned()));
        }
        if chain.is_empty() {
            return Err(pem_error(cert_file, "no certificate found".to_owned()));
        }
        TlsMaterial::new(roots, chain, key, &cert_file.display().to_string())
    }

    /// Throwaway material for `--dev` and tests: a fresh in-memory CA and one certificate
    /// (`server.dc1.vigil`, `localhost`, 127.0.0.1) used both to serve and to dial.
    pub fn dev() -> Result<Self, TlsError> {
        CertificateAuthority::generate(DEFAULT_DOMAIN)?.issue(
            Role::Server,
            DEFAULT_DATACENTER,
            DEFAULT_DOMAIN,
            None,
        )
    }

    /// Builds material from parsed parts, appending the first root to the chain when the chain
    /// is a lone leaf, and checking that the key belongs to the leaf.
    fn new(
        roots: Vec<CertificateDer<'static>>,
        mut chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        what: &str,
    ) -> Result<Self, TlsError> {
        check_key_matches(&chain, &key, what)?;
        let names = chain
            .first()
            .and_then(|leaf| dns_names(leaf))
            .ok_or_else(|| TlsError::InvalidPem {
                what: what.to_owned(),
                reason: "cannot read the certificate's subject alternative names".to_owned(),
            })?;
        // The role name (`server.dc1.vigil`, `client.dc1.vigil`) is the shortest of the names
        // starting with a role: node-specific names add a label in front of it.
        let server_name = names
            .iter()
            .filter_map(|name| {
                name.strip_prefix("server.")
                    .or_else(|| name.strip_prefix("client."))
                    .or_else(|| name.strip_prefix("cli."))
            })
            .min_by_key(|suffix| suffix.len())
            .map_or_else(
                || role_name(Role::Server, DEFAULT_DATACENTER, DEFAULT_DOMAIN),
                |suffix| format!("server.{suffix}"),
            );
        if chain.len() == 1
            && let Some(root) = roots.first()
        {
            chain.push(root.clone());
        }
        Ok(TlsMaterial {
            roots,
            chain,
            key,
            names,
            server_name,
        })
    }

    /// The role our own certificate proves.
    pub fn role(&self) -> Role {
        identity_from_names(&self.names, &self.server_name).role
    }

    /// The name servers we dial must present (`server.<dc>.<domain>`); pass it to
    /// `Endpoint::connect`.
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// Overrides the server name derived from our certificate (e.g. from the agent's
    /// `datacenter` and `domain` settings).
    pub fn with_server_name(mut self, server_name: impl Into<String>) -> Self {
        self.server_name = server_name.into();
        self
    }

    fn root_store(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for root in &self.roots {
            roots.add(root.clone())?;
        }
        Ok(roots)
    }

    /// The accepting side: requires a client certificate signed by our CA, offers ALPN
    /// [`ALPN_RPC`] and [`ALPN_RAFT`], TLS 1.3 only, no resumption, no 0-RTT.
    pub fn server_config(&self) -> Result<quinn::ServerConfig, TlsError> {
        let provider = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.root_store()?),
            provider.clone(),
        )
        .build()?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        tls.alpn_protocols = vec![ALPN_RPC.to_vec(), ALPN_RAFT.to_vec()];
        tls.max_early_data_size = 0;
        tls.send_tls13_tickets = 0;
        tls.session_storage = Arc::new(NoServerSessionStorage {});
        let mut config =
            quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }

    /// The dialing side of [`ALPN_RPC`]: verifies servers against our CA (name checked at
    /// connect time, see [`TlsMaterial::server_name`]) and presents our own certificate.
    pub fn client_config(&self) -> Result<quinn::ClientConfig, TlsError> {
        self.client_config_for(ALPN_RPC)
    }

    /// [`TlsMaterial::client_config`] for raft's own connections ([`ALPN_RAFT`]).
    pub fn raft_client_config(&self) -> Result<quinn::ClientConfig, TlsError> {
        self.client_config_for(ALPN_RAFT)
    }

    fn client_config_for(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.root_store()?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        tls.enable_early_data = false;
        tls.resumption = rustls::client::Resumption::disabled();
        let mut config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }

    /// The HTTPS API's server side (`--https-addr`): our certificate chain, TLS 1.2 and 1.3
    /// (what HTTP clients such as curl, Go's and Python's speak), ALPN `http/1.1`. With
    /// `verify_incoming` (Consul's `verify_incoming_https`) a client must present a certificate
    /// signed by our CA, else the handshake fails; without it none is asked for.
    pub fn https_server_config(
        &self,
        verify_incoming: bool,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let builder = if verify_incoming {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(self.root_store()?), provider)
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut tls = builder.with_single_cert(self.chain.clone(), self.key.clone_key())?;
        tls.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(Arc::new(tls))
    }

    /// Endpoint settings that let a node restarted on the same address reset its peers' stale
    /// connections at once, instead of leaving every call on them to time out until the idle
    /// timeout: the stateless-reset key is derived from our private key (so the new process
    /// computes the same reset tokens), and connection ids are not tied to a per-process key
    /// (quinn's default generator makes the new process drop such packets silently).
    pub fn endpoint_config(&self) -> quinn::EndpointConfig {
        let mut config =
            quinn::EndpointConfig::new(Arc::new(ResetKey::derive(self.key.secret_der())));
        config.cid_generator(|| Box::new(RandomConnectionIds::new()));
        config
    }
}

/// Length of our QUIC connection ids (quinn's default).
const CONNECTION_ID_LEN: usize = 8;

/// Connection ids from the OS random number generator, which any endpoint accepts as possibly
/// its own; an unknown one is answered with a stateless reset (rate-limited by quinn, never
/// larger than the packet that caused it).
struct RandomConnectionIds {
    random: &'static dyn rustls::crypto::SecureRandom,
}

impl RandomConnectionIds {
    fn new() -> RandomConnectionIds {
        RandomConnectionIds {
            random: rustls::crypto::ring::default_provider().secure_random,
        }
    }
}

impl quinn::ConnectionIdGenerator for RandomConnectionIds {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut id = [0u8; CONNECTION_ID_LEN];
        // The same source TLS draws its keys from; if it fails, no handshake could work either.
        self.random
            .fill(&mut id)
            .expect("the OS random number generator failed");
        quinn::ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        CONNECTION_ID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// HMAC-SHA256 key for QUIC stateless-reset tokens, computed with the ring provider's HKDF
/// (rustls does not expose its HMAC directly).
struct ResetKey {
    hkdf: &'static dyn Hkdf,
    key: OkmBlock,
}

impl ResetKey {
    fn derive(secret: &[u8]) -> ResetKey {
        let hkdf = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
            .tls13()
            .map(|suite| suite.hkdf_provider)
            .expect("TLS13_AES_128_GCM_SHA256 is a TLS 1.3 suite");
        let key = hkdf
            .extract_from_secret(Some(RESET_KEY_LABEL), secret)
            .expand_block(&[b"reset"]);
        ResetKey { hkdf, key }
    }

    fn tag(&self, data: &[u8]) -> rustls::crypto::hmac::Tag {
        self.hkdf.hmac_sign(&self.key, data)
    }
}

impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], signature_out: &mut [u8]) {
        let tag = self.tag(data);
        let n = signature_out.len().min(tag.as_ref().len());
        signature_out[..n].copy_from_slice(&tag.as_ref()[..n]);
    }

    fn signature_len(&self) -> usize {
        self.tag(&[]).as_ref().len()
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        let tag = self.tag(data);
        let expected = tag.as_ref();
        // Constant time: fold every byte difference before deciding.
        let diff = expected
            .iter()
            .zip(signature)
            .fold(expected.len() ^ signature.len(), |acc, (a, b)| {
                acc | usize::from(a ^ b)
            });
        if diff == 0 {
            Ok(())
        } else {
            Err(quinn::crypto::CryptoError)
        }
    }
}

/// Who a verified peer certificate says its holder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub role: Role,
    /// The node a server certificate was issued for (`<node>.server.<dc>.<domain>`), if any.
    pub node: Option<String>,
}

/// A server carries exactly `server_name` (`server.<dc>.<domain>`), a client agent exactly
/// `client.<dc>.<domain>`; anything else, including names that merely start with `server.` and
/// a CLI certificate's `cli.<dc>.<domain>`, may call no RPC.
fn identity_from_names(names: &[String], server_name: &str) -> PeerIdentity {
    if !names.iter().any(|name| name == server_name) {
        let client_name = server_name
            .strip_prefix("server.")
            .map(|suffix| format!("client.{suffix}"));
        let client = client_name.is_some_and(|client| names.contains(&client));
        return PeerIdentity {
            role: if client { Role::Client } else { Role::Cli },
            node: None,
        };
    }
    let node = names.iter().find_map(|name| {
        let node = name.strip_suffix(server_name)?.strip_suffix('.')?;
        (!node.is_empty() && !node.contains('.')).then(|| node.to_owned())
    });
    PeerIdentity {
        role: Role::Server,
        node,
    }
}

/// The identity a certificate proves against the expected `server_name`. Only meaningful for a
/// certificate already verified against our CA; `None` when its names cannot be read.
pub fn certificate_identity(cert: &CertificateDer<'_>, server_name: &str) -> Option<PeerIdentity> {
    dns_names(cert).map(|names| identity_from_names(&names, server_name))
}

/// The identity of the peer of an established connection, from the certificate chain it
/// presented (verified by the handshake). `None` when it presented none, which our server
/// config never allows.
pub fn peer_identity(connection: &quinn::Connection, server_name: &str) -> Option<PeerIdentity> {
    let identity = connection.peer_identity()?;
    let chain = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certificate_identity(chain.first()?, server_name)
}

/// The DNS subject alternative names of a DER certificate; `None` on anything malformed.
fn dns_names(cert: &[u8]) -> Option<Vec<String>> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let Some(san) = cert.subject_alternative_name().ok()? else {
        return Some(Vec::new());
    };
    Some(
        san.value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                _ => None,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(material: &TlsMaterial) -> &CertificateDer<'static> {
        &material.chain[0]
    }

    fn ip_sans(cert: &[u8]) -> Vec<String> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(cert).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        san.value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::IPAddress(ip) => {
                    let octets: [u8; 4] = (*ip).try_into().ok()?;
                    Some(std::net::Ipv4Addr::from(octets).to_string())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn role_comes_from_the_certificate_names() {
        // A server certificate proves Role::Server, a client certificate Role::Client.
        let ca = CertificateAuthority::generate("vigil").unwrap();
        let server = ca
            .issue(Role::Server, "dc1", "vigil", Some("node-a"))
            .unwrap();
        let client = ca.issue(Role::Client, "dc1", "vigil", None).unwrap();
        let cli = ca.issue(Role::Cli, "dc1", "vigil", None).unwrap();
        assert_eq!(server.role(), Role::Server);
        assert_eq!(client.role(), Role::Client);
        assert_eq!(cli.role(), Role::Cli);
        assert_eq!(
            dns_names(leaf(&cli)).unwrap(),
            ["cli.dc1.vigil", "localhost"]
        );
        assert_eq!(cli.server_name(), "server.dc1.vigil");
        let identity = |m: &TlsMaterial| certificate_identity(leaf(m), "server.dc1.vigil");
        assert_eq!(
            identity(&server),
            Some(PeerIdentity {
                role: Role::Server,
                node: Some("node-a".to_owned())
            })
        );
        assert_eq!(
            identity(&client),
            Some(PeerIdentity {
                role: Role::Client,
                node: None
            })
        );

        // The SAN lists are the Consul ones.
        assert_eq!(
            dns_names(leaf(&server)).unwrap(),
            ["server.dc1.vigil", "node-a.server.dc1.vigil", "localhost"]
        );
        assert_eq!(
            dns_names(leaf(&client)).unwrap(),
            ["client.dc1.vigil", "localhost"]
        );
        // Both serve HTTPS on 127.0.0.1 too.
        for material in [&server, &client] {
            assert_eq!(ip_sans(leaf(material)), ["127.0.0.1"]);
        }

        // Both dial servers by the same name; the chain carries the CA after the leaf.
        assert_eq!(server.server_name(), "server.dc1.vigil");
        assert_eq!(client.server_name(), "server.dc1.vigil");
        assert_eq!(server.chain.len(), 2);
    }

    #[test]
    fn only_the_exact_server_name_makes_a_server() {
        // Names that merely start with `server.` (a client certificate for a node called
        // `server`, or a server name of another datacenter) prove nothing.
        // Only the exact client name makes a client agent; anything else may call no RPC.
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        for (list, role) in [
            (
                names(&["client.dc1.vigil", "server.client.dc1.vigil", "localhost"]),
                Role::Client,
            ),
            (names(&["cli.dc1.vigil", "localhost"]), Role::Cli),
            (names(&["client.dc2.vigil", "localhost"]), Role::Cli),
            (names(&["server.dc2.vigil", "localhost"]), Role::Cli),
            (
                names(&["server.dc1.vigil.evil", "xserver.dc1.vigil"]),
                Role::Cli,
            ),
            (names(&[]), Role::Cli),
        ] {
            assert_eq!(
                identity_from_names(&list, "server.dc1.vigil").role,
                role,
                "{list:?}"
            );
        }
        // The node label of a server certificate is the one right in front of the name.
        let server = names(&[
            "server.dc1.vigil",
            "a.b.server.dc1.vigil",
            "s1.server.dc1.vigil",
        ]);
        assert_eq!(
            identity_from_names(&server, "server.dc1.vigil"),
            PeerIdentity {
                role: Role::Server,
                node: Some("s1".to_owned())
            }
        );
    }

    #[test]
    fn node_names_that_would_forge_a_certificate_name_are_refused() {
        let ca = CertificateAuthority::generate("vigil").unwrap();
        for node in ["server", "client", "cli", "a.server", "", "x.y"] {
            assert!(
                matches!(
                    ca.issue(Role::Client, "dc1", "vigil", Some(node)),
                    Err(TlsError::InvalidNodeName { .. })
                ),
                "{node:?}"
            );
        }
        let client = ca
            .issue(Role::Client, "dc1", "vigil", Some("servers"))
            .unwrap();
        assert_eq!(client.role(), Role::Client);
    }

    #[test]
    fn dev_material_is_a_server_and_builds_both_configs() {
        let dev = TlsMaterial::dev().unwrap();
        assert_eq!(dev.role(), Role::Server);
        assert_eq!(dev.server_name(), "server.dc1.vigil");
        dev.server_config().unwrap();
        dev.client_config().unwrap();
    }

    #[test]
    fn der_reader_rejects_garbage_without_panicking() {
        let cert = TlsMaterial::dev().unwrap().chain[0].to_vec();
        for len in 0..cert.len() {
            // Every truncation is either rejected or parsed; none panics.
            let _ = dns_names(&cert[..len]);
        }
        assert_eq!(dns_names(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(dns_names(b"not a certificate"), None);
    }

    #[test]
    fn reset_key_is_deterministic_per_private_key() {
        use quinn::crypto::HmacKey as _;
        let a = ResetKey::derive(b"key one");
        let again = ResetKey::derive(b"key one");
        let b = ResetKey::derive(b"key two");
        let mut sig_a = vec![0; a.signature_len()];
        let mut sig_again = vec![0; again.signature_len()];
        let mut sig_b = vec![0; b.signature_len()];
        a.sign(b"cid", &mut sig_a);
        again.sign(b"cid", &mut sig_again);
        b.sign(b"cid", &mut sig_b);
        assert_eq!(sig_a.len(), 32);
        assert_eq!(sig_a, sig_again);
        assert_ne!(sig_a, sig_b);
        assert!(a.verify(b"cid", &sig_a).is_ok());
        assert!(a.verify(b"cid", &sig_b).is_err());
        assert!(a.verify(b"cid", &sig_a[..16]).is_err());
    }

    #[test]
    fn pem_round_trip_through_files() {
        let dir = tempfile::tempdir().unwrap();

        // The CA is written once; a second create refuses to overwrite it.
        let (ca_cert, ca_key) = create_ca(dir.path(), "vigil").unwrap();
        assert_eq!(ca_cert, dir.path().join("vigil-agent-ca.pem"));
        assert_eq!(ca_key, dir.path().join("vigil-agent-ca-key.pem"));
        assert!(matches!(
            create_ca(dir.path(), "vigil"),
            Err(TlsError::AlreadyExists { .. })
        ));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&ca_key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "CA key must be private");
        }

        // Certificates take the next free number, Consul style.
        let create = |role| create_cert(dir.path(), &ca_cert, &ca_key, role, "dc1", "vigil", None);
        let (server0, server0_key) = create(Role::Server).unwrap();
        let (server1, _) = create(Role::Server).unwrap();
        let (client0, client0_key) = create(Role::Client).unwrap();
        assert_eq!(server0, dir.path().join("dc1-server-vigil-0.pem"));
        assert_eq!(server0_key, dir.path().join("dc1-server-vigil-0-key.pem"));
        assert_eq!(server1, dir.path().join("dc1-server-vigil-1.pem"));
        assert_eq!(client0, dir.path().join("dc1-client-vigil-0.pem"));
        assert_eq!(client0_key, dir.path().join("dc1-client-vigil-0-key.pem"));

        // Loading gives the right roles, names and usable configs.
        let server = TlsMaterial::load(&ca_cert, &server0, &server0_key).unwrap();
        let client = TlsMaterial::load(&ca_cert, &client0, &client0_key).unwrap();
        assert_eq!(server.role(), Role::Server);
        assert_eq!(client.role(), Role::Client);
        assert_eq!(client.server_name(), "server.dc1.vigil");
        server.server_config().unwrap();
        client.client_config().unwrap();

        // A key that belongs to another certificate is refused.
        assert!(matches!(
            TlsMaterial::load(&ca_cert, &server0, &client0_key),
            Err(TlsError::KeyMismatch { .. })
        ));
        // So is a CA key that does not belong to the CA certificate.
        assert!(matches!(
            create_cert(
                dir.path(),
                &ca_cert,
                &server0_key,
                Role::Client,
                "dc1",
                "vigil",
                None
            ),
            Err(TlsError::KeyMismatch { .. })
        ));
        // And a file that is not PEM.
        assert!(matches!(
            TlsMaterial::load(&ca_cert, &server0_key, &server0_key),
            Err(TlsError::InvalidPem { .. })
        ));
    }

    #[test]
    fn other_datacenters_and_domains_change_the_server_name() {
        let ca = CertificateAuthority::generate("example").unwrap();
        let client = ca.issue(Role::Client, "east", "example", None).unwrap();
        assert_eq!(client.server_name(), "server.east.example");
        let client = client.with_server_name("server.west.example");
        assert_eq!(client.server_name(), "server.west.example");
    }
}

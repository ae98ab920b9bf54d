//! `vigil tls ...`: creates the cluster CA and the server, client and CLI certificates it signs,
//! as files in a directory (Consul's `consul tls ca create` / `consul tls cert create`). The
//! work is done by `vigil_wire::tls`; this module only parses flags and prints what it wrote.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{ArgGroup, Args, Subcommand};
use vigil_wire::tls::{
    CA_CERT_FILE, CA_KEY_FILE, DEFAULT_DATACENTER, DEFAULT_DOMAIN, Role, create_ca, create_cert,
};

#[derive(Debug, Args)]
pub struct TlsCommand {
    #[command(subcommand)]
    pub command: TlsSubcommand,
}

#[derive(Debug, Subcommand)]
pub enum TlsSubcommand {
    /// Manage the certificate authority.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Manage server and client certificates.
    #[command(subcommand)]
    Cert(CertCommand),
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a new certificate authority (vigil-agent-ca.pem and vigil-agent-ca-key.pem).
    Create(CaCreateArgs),
}

#[derive(Debug, Args)]
pub struct CaCreateArgs {
    /// Domain of the cluster; certificates name `<role>.<dc>.<domain>`.
    #[arg(long, default_value = DEFAULT_DOMAIN)]
    pub domain: String,
    /// Directory to write the files to.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Create a certificate signed by the CA (`<dc>-<role>-<domain>-<n>.pem` and its key).
    Create(CertCreateArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("role").required(true).args(["server", "client", "cli"])))]
pub struct CertCreateArgs {
    /// A server certificate (`server.<dc>.<domain>`, localhost, 127.0.0.1).
    #[arg(long)]
    pub server: bool,
    /// A client agent certificate (`client.<dc>.<domain>`, localhost, 127.0.0.1).
    #[arg(long)]
    pub client: bool,
    /// A certificate for the HTTPS API and the CLI (`cli.<dc>.<domain>`): for users, not
    /// agents; the RPC endpoint refuses it.
    #[arg(long)]
    pub cli: bool,
    /// Datacenter the certificate is for.
    #[arg(long, default_value = DEFAULT_DATACENTER)]
    pub dc: String,
    /// Domain of the cluster.
    #[arg(long, default_value = DEFAULT_DOMAIN)]
    pub domain: String,
    /// Node name; adds the SAN `<node>.server.<dc>.<domain>` (or `.client.`).
    #[arg(long)]
    pub node: Option<String>,
    /// CA certificate [default: <dir>/vigil-agent-ca.pem].
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// CA private key [default: <dir>/vigil-agent-ca-key.pem].
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Directory to write the files to.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}

/// Runs a `vigil tls` command, printing one line per file written.
pub fn run(cmd: TlsCommand) -> anyhow::Result<()> {
    match cmd.command {
        TlsSubcommand::Ca(CaCommand::Create(args)) => {
            let (cert, key) =
                create_ca(&args.dir, &args.domain).context("creating the certificate authority")?;
            print_saved(&[&cert, &key]);
        }
        TlsSubcommand::Cert(CertCommand::Create(args)) => {
            let role = if args.server {
                Role::Server
            } else if args.client {
                Role::Client
            } else {
                Role::Cli
            };
            let ca = args.ca.unwrap_or_else(|| args.dir.join(CA_CERT_FILE));
            let ca_key = args.key.unwrap_or_else(|| args.dir.join(CA_KEY_FILE));
            let (cert, key) = create_cert(
                &args.dir,
                &ca,
                &ca_key,
                role,
                &args.dc,
                &args.domain,
                args.node.as_deref(),
            )
            .with_context(|| format!("creating a {role} certificate"))?;
            print_saved(&[&cert, &key]);
        }
    }
    Ok(())
}

/// Prints `==> Saved <path>` like Consul, without a leading `./` for the default directory.
fn print_saved(paths: &[&Path]) {
    for path in paths {
        let shown = path.strip_prefix(".").unwrap_or(path);
        println!("==> Saved {}", shown.display());
    }
}

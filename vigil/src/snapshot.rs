//! `vigil snapshot save|restore|inspect FILE`: Consul's snapshot commands. `save` writes the
//! leader's state as an archive (atomically: a temporary file renamed into place), `restore`
//! replaces the cluster's state with one, `inspect` checks a file and prints what it holds.
//! Every one reads the server's archive format (`save` and `restore` check the archive, `inspect`
//! opens it offline), so this command lives in the binary, which links the server, rather than
//! in `vigil-cli`, which does not.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use vigil_server::snapshot::{Archive, Inspection};

use vigil_cli::cmd::AgentAddr;
use vigil_cli::cmd::operator::call;

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Save the cluster's state to FILE.
    Save(FileArgs),
    /// Replace the cluster's state with FILE's (every LockIndex continues above the current).
    Restore(FileArgs),
    /// Check FILE and print what it holds.
    Inspect { file: PathBuf },
}

#[derive(Debug, Args)]
pub struct FileArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    pub file: PathBuf,
}

pub async fn run(cmd: SnapshotCommand) -> anyhow::Result<i32> {
    match cmd {
        SnapshotCommand::Save(args) => {
            let response = call(&args.agent, reqwest::Method::GET, "/v1/snapshot").await?;
            let index = response
                .headers()
                .get("X-Consul-Index")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("0")
                .to_owned();
            let bytes = response.bytes().await?;
            Archive::decode(&bytes).context("the agent sent a damaged archive")?;
            write_atomically(&args.file, &bytes)?;
            println!("Saved and verified snapshot to index {index}");
            Ok(0)
        }
        SnapshotCommand::Restore(args) => {
            let bytes = std::fs::read(&args.file)
                .with_context(|| format!("reading {}", args.file.display()))?;
            Archive::decode(&bytes).with_context(|| format!("{}", args.file.display()))?;
            let response = args
                .agent
                .client()?
                .request(reqwest::Method::PUT, "/v1/snapshot")
                .body(bytes)
                .send()
                .await?;
            let status = response.status();
            if !status.is_success() {
                let text = response.text().await.unwrap_or_default();
                anyhow::bail!("{status}: {}", text.trim());
            }
            println!("Restored snapshot");
            Ok(0)
        }
        SnapshotCommand::Inspect { file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let archive = Archive::decode(&bytes).with_context(|| format!("{}", file.display()))?;
            let i = Inspection::of(&archive)?;
            println!("Index            {}", i.index);
            println!("Size             {} bytes", i.state_bytes);
            println!("KV entries       {}", i.kv_entries);
            println!("Sessions         {}", i.sessions);
            println!("Nodes            {}", i.nodes);
            println!("Services         {}", i.services);
            println!("Highest LockIndex {}", i.lock_index_floor);
            Ok(0)
        }
    }
}

/// Writes the snapshot readable by the owner only (0600): it holds every key's value.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

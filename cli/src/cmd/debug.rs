//! `vigil debug`: what an operator sends with a bug report, as Consul's `consul debug` gathers
//! it. For `--duration` it follows the agent's log (at debug level, as far as the agent logs
//! it) and takes the metrics every `--interval`; around that it takes the agent's own view, the
//! members, the raft configuration and autopilot's health. Everything goes into a new directory
//! (`--output`, default `vigil-debug-<unix seconds>`), one file each, which is then packed into
//! `<output>.tar.gz` (its entries under the directory's name) and removed, as `consul debug`
//! does; `--archive=false` (Go style: `-archive=false`) keeps the directory instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio::time::Instant;

use super::operator::call;
use super::{AgentAddr, parse_duration};

#[derive(Debug, Args)]
pub struct DebugArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// How long to follow the log and take metrics.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How often to take the metrics.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,
    /// The directory to create [default: vigil-debug-<unix seconds>]; the archive is this path
    /// with `.tar.gz` added.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Pack the directory into `<output>.tar.gz` and remove it (`--archive=false` keeps the
    /// directory).
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub archive: bool,
}

/// The state snapshots taken once: file name and path.
const CAPTURES: [(&str, &str); 5] = [
    ("agent.json", "/v1/agent/self"),
    ("members.json", "/v1/agent/members"),
    ("raft.json", "/v1/operator/raft/configuration"),
    ("autopilot.json", "/v1/operator/autopilot/health"),
    ("checks.json", "/v1/agent/checks"),
];

pub async fn run(args: DebugArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        !args.interval.is_zero(),
        "--interval must be greater than 0"
    );
    let dir = args.output.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("vigil-debug-{now}"))
    });
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, path) in CAPTURES {
        capture(&args.agent, path, &dir.join(file)).await?;
    }
    let mut log = call(
        &args.agent,
        reqwest::Method::GET,
        "/v1/agent/monitor?loglevel=debug",
    )
    .await?;
    let mut lines = Vec::new();
    let end = Instant::now() + args.duration;
    let mut next_metrics = Instant::now();
    let mut taken = 0;
    while Instant::now() < end {
        if Instant::now() >= next_metrics {
            let file = dir.join(format!("metrics-{taken}.json"));
            capture(&args.agent, "/v1/agent/metrics", &file).await?;
            taken += 1;
            next_metrics += args.interval;
        }
        let until = next_metrics.min(end);
        match tokio::time::timeout_at(until, log.chunk()).await {
            Ok(Ok(Some(chunk))) => lines.extend_from_slice(&chunk),
            // The agent stopped, or the stream broke: keep what came.
            Ok(Ok(None) | Err(_)) => break,
            Err(_) => {}
        }
    }
    std::fs::write(dir.join("agent.log"), &lines)
        .with_context(|| format!("writing {}", dir.display()))?;
    if args.archive {
        let archive = archive(&dir)?;
        println!("Saved debug archive: {}", archive.display());
    } else {
        println!("Saved debug information to {}", dir.display());
    }
    Ok(0)
}

/// Packs `dir` into `<dir>.tar.gz` (written to `<dir>.tar.gz.tmp`, synced, renamed into place),
/// then removes `dir`; returns the archive's path.
fn archive(dir: &Path) -> anyhow::Result<PathBuf> {
    let with_suffix = |suffix: &str| {
        let mut name = dir.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    let (path, temp) = (with_suffix(".tar.gz"), with_suffix(".tar.gz.tmp"));
    let base = dir
        .file_name()
        .with_context(|| format!("{} has no file name to archive under", dir.display()))?;
    let write = || -> anyhow::Result<()> {
        let file = std::fs::File::create(&temp)?;
        let gzip = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gzip);
        tar.append_dir_all(base, dir)?;
        tar.into_inner()?.finish()?.sync_all()?;
        std::fs::rename(&temp, &path)?;
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&temp);
        return Err(e.context(format!("writing {}", path.display())));
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(path)
}

/// Writes the agent's answer to `path` into `file` (an error answer is kept too: it is part of
/// the picture).
async fn capture(agent: &AgentAddr, path: &str, file: &Path) -> anyhow::Result<()> {
    let response = agent
        .client()?
        .request(reqwest::Method::GET, path)
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    let body = response.bytes().await?;
    std::fs::write(file, &body).with_context(|| format!("writing {}", file.display()))
}

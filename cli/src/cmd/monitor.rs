//! `vigil monitor` (follow the local agent's log, Consul's `consul monitor`), `vigil info`
//! (the agent's figures by section, Consul's `consul info`) and `vigil reload`.

use clap::Args;
use vigil_shared::api::agent::AgentStatsJson;

use super::AgentAddr;
use super::operator::call;

#[derive(Debug, Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// Lowest level shown: trace, debug, info, warn or err (only what the agent logs at its
    /// own `--log-level` can be shown).
    #[arg(long = "log-level", default_value = "info")]
    pub log_level: String,
}

/// Prints the agent's log lines as they come, until the agent stops or the command is ended.
pub async fn monitor(args: MonitorArgs) -> anyhow::Result<i32> {
    let path = format!("/v1/agent/monitor?loglevel={}", args.log_level);
    let mut response = call(&args.agent, reqwest::Method::GET, &path).await?;
    while let Some(chunk) = response.chunk().await? {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        out.write_all(&chunk)?;
        out.flush()?;
    }
    Ok(0)
}

/// Prints `/v1/agent/self`'s `Stats` as `consul info` does: a section per group, `key = value`.
pub async fn info(agent: AgentAddr) -> anyhow::Result<i32> {
    let me: AgentStatsJson = call(&agent, reqwest::Method::GET, "/v1/agent/self")
        .await?
        .json()
        .await?;
    for (section, figures) in &me.stats {
        println!("{section}:");
        for (key, value) in figures {
            println!("\t{key} = {value}");
        }
    }
    Ok(0)
}

/// `vigil reload`: `PUT /v1/agent/reload`.
pub async fn reload(agent: AgentAddr) -> anyhow::Result<i32> {
    call(&agent, reqwest::Method::PUT, "/v1/agent/reload").await?;
    println!("Configuration reload triggered");
    Ok(0)
}

//! The Jepsen-style checker by command, for runs longer than CI's: a 3-server cluster and 2
//! client agents on loopback, the plan's clients and nemesis for `--minutes` (or `--seconds`),
//! then the report. Exits 1 when it found an anomaly. The last line of a report is the command
//! that runs the same schedule again.
//!
//! `cargo run -p integration-tests --bin vigil-jepsen -- --minutes 30 [--seed N] [--plan faults|rejecting-leader|stale-reads|trusting-fence|shortened-ttl]`
//!
//! Partitions and full disks need root; without it the report lists them as left out.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use integration_tests::jepsen::{self, Plan};

fn plan_from_args() -> anyhow::Result<Plan> {
    let mut name = "faults".to_owned();
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    let mut span = Duration::from_secs(120);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--plan" => name = value()?,
            "--seed" => seed = value()?.parse().context("--seed")?,
            "--seconds" => span = Duration::from_secs(value()?.parse().context("--seconds")?),
            "--minutes" => {
                span = Duration::from_secs(60 * value()?.parse::<u64>().context("--minutes")?);
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    Plan::named(&name, seed, span).with_context(|| format!("no plan named {name:?}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = async {
        let plan = plan_from_args()?;
        integration_tests::build_agent()?;
        jepsen::run(&plan).await
    }
    .await;
    match result {
        Ok(report) => {
            println!("{report}");
            if report.problems() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("vigil-jepsen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

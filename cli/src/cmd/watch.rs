//! `vigil watch -type=TYPE [-key K | -prefix P | -service S [-tag T] [-passingonly] | -state S]
//! [-stale] [HANDLER...]`: Consul's `consul watch`. Without a handler it prints the current data as
//! JSON and exits. With one it blocks on the data and runs the handler through `$SHELL -c` (else
//! /bin/sh) with the data as JSON on stdin and `CONSUL_INDEX` set: once at start, then whenever
//! a blocking read returns data that differs from the last (Consul's watch plan skips equal
//! results). A failing handler is reported and the watch goes on, as Consul's does.
//!
//! Types: `key` (the KV pair, or `null`), `keyprefix` (the pairs under the prefix), `services`
//! (name → tags), `nodes`, `service` (health entries of one service), `checks` (by `-state`,
//! default any, or of `-service`).

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;
use vigil_client::{ReadOpts, next_wait_index};

use super::{AgentAddr, GoArg, clap_flag, go_arg};

/// How long each blocking read waits on the agent.
const WATCH_WAIT: Duration = Duration::from_secs(300);
/// Pause after a failed read before trying again.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WatchType {
    Key,
    Keyprefix,
    Services,
    Nodes,
    Service,
    Checks,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// What to watch.
    #[arg(long = "type", value_enum)]
    pub kind: WatchType,
    /// The key (`-type=key`).
    #[arg(long)]
    pub key: Option<String>,
    /// The prefix (`-type=keyprefix`).
    #[arg(long)]
    pub prefix: Option<String>,
    /// The service (`-type=service`, or `-type=checks` for that service's checks).
    #[arg(long)]
    pub service: Option<String>,
    /// Only instances with this tag (`-type=service`; repeatable).
    #[arg(long)]
    pub tag: Vec<String>,
    /// Only passing instances (`-type=service`).
    #[arg(long)]
    pub passingonly: bool,
    /// Only checks in this state (`-type=checks`): any, passing, warning, critical.
    #[arg(long)]
    pub state: Option<String>,
    /// Let any server answer (Consul's `?stale`).
    #[arg(long)]
    pub stale: bool,
    #[command(flatten)]
    pub addr: AgentAddr,
    /// The handler command; without one the data is printed once.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub handler: Vec<String>,
}

/// `consul watch`'s flags that take a value; the others are booleans.
const VALUE_FLAGS: [&str; 11] = [
    "type",
    "key",
    "prefix",
    "service",
    "tag",
    "state",
    "http-addr",
    "token",
    "ca-file",
    "client-cert",
    "client-key",
];

/// Rewrites `vigil watch`'s arguments written as Go's flag package reads them (`-type=key`,
/// `-key k`, `-stale=false`) into the form the parser reads; flags end at the first argument
/// that is not one, where the handler begins. Other commands' arguments pass unchanged.
pub fn consul_argv(argv: Vec<OsString>) -> Vec<OsString> {
    if argv.get(1).is_none_or(|a| a != "watch") {
        return argv;
    }
    let mut out: Vec<OsString> = argv[..2].to_vec();
    let mut rest = argv[2..].iter();
    while let Some(arg) = rest.next() {
        match go_arg(arg) {
            GoArg::Positional => {
                out.push("--".into());
                out.push(arg.clone());
                out.extend(rest.cloned());
                return out;
            }
            GoArg::EndOfFlags => {
                out.push(arg.clone());
                out.extend(rest.cloned());
                return out;
            }
            GoArg::Flag { name, value } => {
                out.extend(clap_flag(
                    name,
                    value,
                    VALUE_FLAGS.contains(&name),
                    &mut rest,
                ));
            }
        }
    }
    out
}

/// The endpoint and query of a watch.
fn endpoint(args: &WatchArgs) -> anyhow::Result<(String, Vec<(&'static str, String)>)> {
    let needed = |v: &Option<String>, flag: &str| {
        v.clone()
            .filter(|v| !v.is_empty())
            .with_context(|| format!("Must specify a single {flag} to watch"))
    };
    let mut query = Vec::new();
    let path = match args.kind {
        WatchType::Key => format!("/v1/kv/{}", needed(&args.key, "key")?),
        WatchType::Keyprefix => {
            query.push(("recurse", String::new()));
            format!("/v1/kv/{}", needed(&args.prefix, "prefix")?)
        }
        WatchType::Services => "/v1/catalog/services".to_owned(),
        WatchType::Nodes => "/v1/catalog/nodes".to_owned(),
        WatchType::Service => {
            query.extend(args.tag.iter().map(|t| ("tag", t.clone())));
            if args.passingonly {
                query.push(("passing", String::new()));
            }
            format!("/v1/health/service/{}", needed(&args.service, "service")?)
        }
        WatchType::Checks => match (&args.service, &args.state) {
            (Some(_), Some(_)) => bail!("Cannot specify both service and state"),
            (Some(service), None) => format!("/v1/health/checks/{service}"),
            (None, state) => format!("/v1/health/state/{}", state.as_deref().unwrap_or("any")),
        },
    };
    if args.stale {
        query.push(("stale", String::new()));
    }
    Ok((path, query))
}

/// What the handler is given: a key watch's single pair (or `null`); other watches' data as
/// the endpoint answers it (`null` when there is none).
fn shape(kind: WatchType, body: Option<Value>) -> Value {
    match (kind, body) {
        (WatchType::Key, Some(Value::Array(mut pairs))) if !pairs.is_empty() => pairs.remove(0),
        (_, Some(body)) if kind != WatchType::Key => body,
        _ => Value::Null,
    }
}

pub async fn run(args: WatchArgs) -> anyhow::Result<i32> {
    let client = args.addr.client()?;
    let (path, query) = endpoint(&args)?;
    if args.handler.is_empty() {
        let (body, _) = client.get_json(&path, &query, ReadOpts::default()).await?;
        println!("{}", serde_json::to_string_pretty(&shape(args.kind, body))?);
        return Ok(0);
    }
    let mut index = 0;
    let mut last: Option<Value> = None;
    loop {
        let opts = ReadOpts::blocking(index, WATCH_WAIT);
        let (body, meta) = match client.get_json(&path, &query, opts).await {
            Ok(answer) => answer,
            Err(e) => {
                eprintln!("vigil watch: {e}; retrying in {RETRY:?}");
                index = 0;
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        index = next_wait_index(index, meta.index);
        let data = shape(args.kind, body);
        if last.as_ref() == Some(&data) {
            continue;
        }
        if let Err(e) = handle(&args.handler, &data, meta.index).await {
            eprintln!("vigil watch: handler: {e:#}");
        }
        last = Some(data);
    }
}

/// Runs the handler through the shell with `data` on stdin.
async fn handle(handler: &[String], data: &Value, index: u64) -> anyhow::Result<()> {
    let shell = std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| OsString::from("/bin/sh"));
    let mut child = tokio::process::Command::new(shell)
        .arg("-c")
        .arg(handler.join(" "))
        .env("CONSUL_INDEX", index.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .context("starting the handler")?;
    let mut input = child.stdin.take().context("the handler's stdin")?;
    let mut json = serde_json::to_vec_pretty(data)?;
    json.push(b'\n');
    // A handler that does not read its input is fine.
    let _ = input.write_all(&json).await;
    drop(input);
    let status = child.wait().await.context("waiting for the handler")?;
    if !status.success() {
        bail!("exited with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn consuls_command_lines_become_vigils() {
        let rewrite = |args: &str| {
            let argv: Vec<OsString> = args.split(' ').map(OsString::from).collect();
            consul_argv(argv)
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            rewrite("vigil watch -type=key -key a/b -stale=false -passingonly /bin/handler -x"),
            "vigil watch --type=key --key=a/b --passingonly -- /bin/handler -x"
        );
        assert_eq!(
            rewrite("vigil watch --type nodes"),
            "vigil watch --type=nodes"
        );
        assert_eq!(rewrite("vigil kv get -x"), "vigil kv get -x");
    }

    #[test]
    fn a_key_watch_gives_the_pair_or_null() {
        let pair = json!({"Key": "a", "Value": "MQ=="});
        assert_eq!(shape(WatchType::Key, Some(json!([pair.clone()]))), pair);
        assert_eq!(shape(WatchType::Key, None), Value::Null);
        assert_eq!(
            shape(WatchType::Keyprefix, Some(json!([pair.clone()]))),
            json!([pair])
        );
        assert_eq!(shape(WatchType::Nodes, None), Value::Null);
    }
}

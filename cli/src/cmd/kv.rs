//! `vigil kv get|put|delete|export|import`: the KV store from the command line, with `consul kv`'s
//! output (`get` prints the raw value, `export` the `[{"key","flags","value"}]` JSON that `import`
//! reads back).

use std::io::{Read as _, Write as _};

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use vigil_client::ReadOpts;
use vigil_shared::api::DirEntry;

use super::AgentAddr;

#[derive(Debug, Args)]
pub struct KvCommand {
    #[command(subcommand)]
    pub action: KvAction,
    #[command(flatten)]
    pub addr: AgentAddr,
}

#[derive(Debug, Subcommand)]
pub enum KvAction {
    /// Print a key's value (or every `key:value` under a prefix with --recurse).
    Get {
        key: String,
        #[arg(long)]
        recurse: bool,
        /// List key names only.
        #[arg(long)]
        keys: bool,
        /// With --keys: collapse at this separator.
        #[arg(long)]
        separator: Option<String>,
        /// Print the full entries as JSON.
        #[arg(long)]
        detailed: bool,
    },
    /// Write a value (`-` reads it from stdin; none writes an empty value).
    Put {
        key: String,
        value: Option<String>,
        #[arg(long, default_value_t = 0)]
        flags: u64,
        /// Write only if the key's ModifyIndex is this (0: only if absent).
        #[arg(long)]
        cas: Option<u64>,
        /// Acquire the key for this session.
        #[arg(long, conflicts_with_all = ["cas", "release"])]
        acquire: Option<String>,
        /// Release the key held by this session.
        #[arg(long, conflicts_with = "cas")]
        release: Option<String>,
    },
    /// Delete a key (or a whole prefix with --recurse).
    Delete {
        key: String,
        #[arg(long, conflicts_with = "cas")]
        recurse: bool,
        #[arg(long)]
        cas: Option<u64>,
    },
    /// Print every entry under a prefix as `consul kv export` JSON.
    Export {
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Write the entries of `consul kv export` JSON: `@FILE`, `-` for stdin, or the JSON itself.
    Import {
        data: String,
        /// Put every key under this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
    },
}

/// One entry of `consul kv export` and `consul kv import`.
#[derive(Serialize, Deserialize)]
struct Exported {
    key: String,
    flags: u64,
    value: String,
}

pub async fn run(cmd: KvCommand) -> anyhow::Result<i32> {
    let client = cmd.addr.client()?;
    let mut stdout = std::io::stdout().lock();
    match cmd.action {
        KvAction::Get {
            key,
            recurse,
            keys,
            separator,
            detailed,
        } => {
            if keys {
                let (keys, _) = client
                    .kv_keys(&key, separator.as_deref(), ReadOpts::default())
                    .await?;
                for k in keys {
                    writeln!(stdout, "{k}")?;
                }
                return Ok(0);
            }
            let entries = if recurse {
                client.kv_list(&key, ReadOpts::default()).await?.0
            } else {
                match client.kv_get(&key, ReadOpts::default()).await?.0 {
                    Some(entry) => vec![entry],
                    None => {
                        eprintln!("Error! No key exists at: {key}");
                        return Ok(1);
                    }
                }
            };
            if detailed {
                let dirs: Vec<DirEntry> = entries.iter().map(DirEntry::from_entry).collect();
                writeln!(stdout, "{}", serde_json::to_string_pretty(&dirs)?)?;
            } else if recurse {
                for e in entries {
                    write!(stdout, "{}:", e.key)?;
                    stdout.write_all(&e.value)?;
                    writeln!(stdout)?;
                }
            } else {
                stdout.write_all(&entries[0].value)?;
                writeln!(stdout)?;
            }
        }
        KvAction::Put {
            key,
            value,
            flags,
            cas,
            acquire,
            release,
        } => {
            let value = match value.as_deref() {
                Some("-") => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .context("reading the value from stdin")?;
                    buf
                }
                Some(v) => v.as_bytes().to_vec(),
                None => Vec::new(),
            };
            let written = if let Some(session) = acquire {
                client
                    .kv_acquire(&key, &value, flags, &session)
                    .await?
                    .acquired
            } else if let Some(session) = release {
                client.kv_release(&key, &value, flags, &session).await?
            } else if let Some(index) = cas {
                client.kv_cas(&key, &value, flags, index).await?
            } else {
                client.kv_put(&key, &value, flags).await?
            };
            if !written {
                eprintln!("Error! Did not write to {key}");
                return Ok(1);
            }
            writeln!(stdout, "Success! Data written to: {key}")?;
        }
        KvAction::Delete { key, recurse, cas } => {
            let deleted = if recurse {
                client.kv_delete_tree(&key).await?
            } else if let Some(index) = cas {
                client.kv_delete_cas(&key, index).await?
            } else {
                client.kv_delete(&key).await?
            };
            if !deleted {
                eprintln!("Error! Did not delete key {key}: CAS failed");
                return Ok(1);
            }
            writeln!(stdout, "Success! Deleted key: {key}")?;
        }
        KvAction::Export { prefix } => {
            let (entries, _) = client.kv_list(&prefix, ReadOpts::default()).await?;
            let exported: Vec<Exported> = entries
                .into_iter()
                .map(|e| Exported {
                    key: e.key,
                    flags: e.flags,
                    value: BASE64.encode(&e.value),
                })
                .collect();
            let mut out = Vec::new();
            let formatter = serde_json::ser::PrettyFormatter::with_indent(b"\t");
            let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
            exported.serialize(&mut serializer)?;
            stdout.write_all(&out)?;
            writeln!(stdout)?;
        }
        KvAction::Import { data, prefix } => {
            let entries: Vec<Exported> =
                serde_json::from_str(&import_data(&data)?).context("Cannot unmarshal data")?;
            for entry in entries {
                let key = if prefix.is_empty() {
                    entry.key
                } else {
                    format!("{}/{}", prefix.trim_end_matches('/'), entry.key)
                };
                let value = BASE64
                    .decode(&entry.value)
                    .with_context(|| format!("Error base 64 decoding value for key {key}"))?;
                client
                    .kv_put(&key, &value, entry.flags)
                    .await
                    .with_context(|| format!("Error! Failed writing data for key {key}"))?;
                writeln!(stdout, "Imported: {key}")?;
            }
        }
    }
    Ok(0)
}

/// `consul kv import`'s DATA: `@FILE`, `-` for stdin, else the JSON itself.
fn import_data(data: &str) -> anyhow::Result<String> {
    if let Some(file) = data.strip_prefix('@') {
        return std::fs::read_to_string(file)
            .with_context(|| format!("Failed to read file {file}"));
    }
    if data == "-" {
        let mut buf = String::new();
        std::io::stdin()
            .read_to_string(&mut buf)
            .context("Failed to read stdin")?;
        return Ok(buf);
    }
    Ok(data.to_owned())
}

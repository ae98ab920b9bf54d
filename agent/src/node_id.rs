//! This node's UUID in the catalog (Consul's `node_id`): given with `--node-id`, else kept in
//! the data directory across restarts, else (a dev agent, or a client without `--data-dir`) a
//! new random one per start, as Consul does.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use anyhow::Context as _;

/// The file in the data directory that keeps the node's UUID (`node-id` holds the raft ID).
const FILE_NAME: &str = "catalog-node-id";

/// A node ID as Consul takes it: a UUID, kept in lowercase.
pub fn parse(text: &str) -> Result<String, String> {
    uuid::Uuid::parse_str(text.trim())
        .map(|id| id.hyphenated().to_string())
        .map_err(|e| format!("invalid node ID {text:?}: {e}"))
}

/// The node's ID: `given`, else the one kept in `data_dir` (created there the first time).
pub fn resolve(given: Option<&str>, data_dir: Option<&Path>) -> anyhow::Result<String> {
    if let Some(id) = given {
        return Ok(id.to_owned());
    }
    let Some(dir) = data_dir else {
        return Ok(uuid::Uuid::new_v4().to_string());
    };
    let path = dir.join(FILE_NAME);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = uuid::Uuid::new_v4().to_string();
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the data directory {}", dir.display()))?;
            let tmp = dir.join(format!("{FILE_NAME}.tmp"));
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            file.write_all(id.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_id_is_a_uuid_in_lowercase() {
        assert_eq!(
            parse("9A1B0C2D-0000-4000-8000-00000000000F"),
            Ok("9a1b0c2d-0000-4000-8000-00000000000f".to_owned())
        );
        assert!(parse("node-1").is_err());
    }

    #[test]
    fn the_data_directory_keeps_the_id_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let first = resolve(None, Some(dir.path())).unwrap();
        assert_eq!(resolve(None, Some(dir.path())).unwrap(), first);
        assert_ne!(resolve(None, None).unwrap(), first);
        let given = "00000000-0000-4000-8000-000000000001";
        assert_eq!(resolve(Some(given), Some(dir.path())).unwrap(), given);
    }
}

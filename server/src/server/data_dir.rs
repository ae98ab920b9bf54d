//! The data directory and this server's raft ID in it.

use super::*;

pub(super) fn data_dir_error(e: impl std::fmt::Display) -> StartError {
    StartError::DataDir(e.to_string())
}

/// Creates the data directory if needed and makes it private (0700): it holds every key's
/// value, as Consul's does.
pub(super) fn private_data_dir(dir: &std::path::Path) -> Result<(), StartError> {
    std::fs::create_dir_all(dir).map_err(data_dir_error)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(data_dir_error)?;
    }
    Ok(())
}

/// This server's raft ID: random on first start, then read back from the data directory.
pub(super) fn load_or_create_node_id(dir: &std::path::Path) -> Result<NodeId, StartError> {
    private_data_dir(dir)?;
    let path = dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|e| data_dir_error(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id: NodeId = rand::random::<u64>() >> 1;
            let tmp = dir.join("node-id.tmp");
            write_private(&tmp, id.to_string().as_bytes()).map_err(data_dir_error)?;
            std::fs::rename(&tmp, &path).map_err(data_dir_error)?;
            Ok(id)
        }
        Err(e) => Err(data_dir_error(e)),
    }
}

/// Writes `path` readable by the owner only (0600), whatever permissions an older file had.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)?;
    file.sync_all()
}

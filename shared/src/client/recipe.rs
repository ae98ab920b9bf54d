//! A step the recipes with one entry per contender (a semaphore slot, a fair mutex) share:
//! writing that entry, `<prefix>/<session>`, acquired by the contender's own session.

use super::{Client, ClientError, path};

/// Writes `<prefix>/<session>` with `value` and `flags`, acquired by `session`; its key.
pub(crate) async fn contender_entry(
    client: &Client,
    prefix: &str,
    value: &[u8],
    flags: u64,
    session: &str,
) -> Result<String, ClientError> {
    let key = path::join(&[prefix, session]);
    if !client
        .kv_acquire(&key, value, flags, session)
        .await?
        .acquired
    {
        return Err(ClientError::ContenderEntry);
    }
    Ok(key)
}

//! Snapshot archives (`GET/PUT /v1/snapshot`, `vigil snapshot save|restore|inspect`): the whole
//! state machine, gzip-compressed, behind a header that names the format and the raft index it
//! was taken at, and closed by a CRC-32. A truncated, changed or foreign archive is refused
//! before anything is proposed. A restore travels in parts of [`RESTORE_CHUNK`] bytes, one raft
//! entry each (`Op::RestoreChunk`); the last one replaces the state on every server at once.
//!
//! Layout inside the gzip stream: `VIGILSNP`, archive version (1 byte), state encoding version
//! (1 byte, the snapshot file's), raft index (u64 LE), state length (u64 LE), the state
//! (postcard), CRC-32 of everything before it (u32 LE). Archives of the first release (state
//! version 3) are read; a cluster below protocol level 2 writes them, and restores any archive
//! as the first release's servers read it (`crate::state::format`).

use std::io::{Read as _, Write as _};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use vigil_shared::operator::ArchiveError;

use crate::proposer::MAX_COMMAND_BYTES;
use crate::raft::state_store::SNAPSHOT_FORMAT;
use crate::state::StateMachine;
use crate::state::format::FIRST_RELEASE_FORMAT;
use vigil_wire::transport::MAX_FRAME_LEN;

const MAGIC: &[u8; 8] = b"VIGILSNP";
const ARCHIVE_VERSION: u8 = 1;
/// Magic, two versions, index and length.
const HEADER_LEN: usize = 8 + 1 + 1 + 8 + 8;
const CRC_LEN: usize = 4;
/// The largest state a restore takes (uncompressed): what decoding an archive may allocate.
pub const MAX_RESTORE_STATE: usize = 256 * 1024 * 1024;
/// The largest archive (compressed) a restore takes: it travels to the leader in one RPC frame.
pub const MAX_ARCHIVE_BYTES: usize = MAX_FRAME_LEN - 1024 * 1024;
/// A restore's part: one raft entry, with room for the command's own framing.
pub const RESTORE_CHUNK: usize = MAX_COMMAND_BYTES / 2;

/// A checked archive's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The raft index the state was taken at.
    pub index: u64,
    /// The state machine, encoded (what `Op::RestoreSnapshot` carries).
    pub state: Vec<u8>,
    /// The format of `state` ([`StateMachine::format`]).
    pub format: u8,
}

impl Archive {
    /// Takes `state` at raft `index`.
    pub fn of(state: &StateMachine, index: u64) -> Result<Archive, ArchiveError> {
        let format = state.format();
        let state = state
            .encode()
            .map_err(|e| ArchiveError::Decode(e.to_string()))?;
        Ok(Archive {
            index,
            state,
            format,
        })
    }

    /// The archive as a cluster applying protocol `level` restores it: its state in the format
    /// every server of that cluster reads.
    pub fn at_level(self, level: u32) -> Result<Archive, ArchiveError> {
        let state = StateMachine::encoded_at_level(&self.state, level)
            .map_err(|e| ArchiveError::Decode(e.to_string()))?;
        let format = Archive::open(&state)?.format();
        Ok(Archive {
            state,
            format,
            ..self
        })
    }

    /// The gzip-compressed archive.
    pub fn encode(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(HEADER_LEN + self.state.len() + CRC_LEN);
        raw.extend_from_slice(MAGIC);
        raw.push(ARCHIVE_VERSION);
        raw.push(self.format);
        raw.extend_from_slice(&self.index.to_le_bytes());
        raw.extend_from_slice(&(self.state.len() as u64).to_le_bytes());
        raw.extend_from_slice(&self.state);
        let crc = crc32fast::hash(&raw);
        raw.extend_from_slice(&crc.to_le_bytes());
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        // Writing to a Vec cannot fail.
        let _ = gz.write_all(&raw);
        gz.finish().unwrap_or_default()
    }

    /// Checks and opens an archive. Decompresses the header, then at most the state it
    /// declares (up to [`MAX_RESTORE_STATE`]) plus one byte, so a gzip bomb costs nothing.
    pub fn decode(bytes: &[u8]) -> Result<Archive, ArchiveError> {
        let gzip = |e: std::io::Error| ArchiveError::Gzip(e.to_string());
        let mut gz = GzDecoder::new(bytes);
        let mut raw = Vec::new();
        (&mut gz)
            .take(HEADER_LEN as u64)
            .read_to_end(&mut raw)
            .map_err(gzip)?;
        if raw.len() < HEADER_LEN || &raw[..8] != MAGIC {
            return Err(ArchiveError::NotAnArchive);
        }
        let (archive, state) = (raw[8], raw[9]);
        if archive != ARCHIVE_VERSION || !(FIRST_RELEASE_FORMAT..=SNAPSHOT_FORMAT).contains(&state)
        {
            return Err(ArchiveError::Version {
                archive,
                state,
                reads_archive: ARCHIVE_VERSION,
                reads_state: SNAPSHOT_FORMAT,
            });
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let index = u64_at(10);
        let len = usize::try_from(u64_at(18)).unwrap_or(usize::MAX);
        if len > MAX_RESTORE_STATE {
            return Err(ArchiveError::TooLarge {
                size: len,
                limit: MAX_RESTORE_STATE,
            });
        }
        let expected = HEADER_LEN + len + CRC_LEN;
        gz.take((len + CRC_LEN) as u64 + 1)
            .read_to_end(&mut raw)
            .map_err(gzip)?;
        if raw.len() != expected {
            return Err(ArchiveError::Truncated {
                got: raw.len(),
                expected,
            });
        }
        let (body, crc) = raw.split_at(HEADER_LEN + len);
        if crc32fast::hash(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
            return Err(ArchiveError::Checksum);
        }
        let format = raw[9];
        let state = body[HEADER_LEN..].to_vec();
        Archive::open(&state)?;
        Ok(Archive {
            index,
            state,
            format,
        })
    }

    /// The state machine the archive holds.
    pub fn open(state: &[u8]) -> Result<StateMachine, ArchiveError> {
        StateMachine::decode(state).map_err(|e| ArchiveError::Decode(e.to_string()))
    }
}

/// What `vigil snapshot inspect` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    pub index: u64,
    pub state_bytes: usize,
    pub kv_entries: usize,
    pub sessions: usize,
    pub nodes: usize,
    pub services: usize,
    /// Every LockIndex after a restore of this archive is above this.
    pub lock_index_floor: u64,
}

impl Inspection {
    pub fn of(archive: &Archive) -> Result<Inspection, ArchiveError> {
        let state = Archive::open(&archive.state)?;
        Ok(Inspection {
            index: archive.index,
            state_bytes: archive.state.len(),
            kv_entries: state.kv().len(),
            sessions: state.sessions().len(),
            nodes: state.catalog().nodes().count(),
            services: state.catalog().services().count(),
            lock_index_floor: state.kv().highest_lock_index(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_round_trips() {
        let archive = Archive::of(&StateMachine::default(), 42).expect("archive");
        let bytes = archive.encode();
        assert_eq!(Archive::decode(&bytes), Ok(archive));
    }

    #[test]
    fn damaged_archives_are_refused() {
        let bytes = Archive::of(&StateMachine::default(), 7)
            .expect("archive")
            .encode();
        for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(Archive::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(matches!(
            Archive::decode(b"not gzip at all"),
            Err(ArchiveError::Gzip(_))
        ));
        // A changed byte inside the compressed payload: the gzip CRC or ours catches it.
        let mut raw = Vec::new();
        GzDecoder::new(&bytes[..])
            .read_to_end(&mut raw)
            .expect("gunzip");
        let last = raw.len() - CRC_LEN - 1;
        raw[last] ^= 0xff;
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&raw).expect("gzip");
        let changed = gz.finish().expect("gzip");
        assert_eq!(Archive::decode(&changed), Err(ArchiveError::Checksum));
    }

    #[test]
    fn an_archive_of_another_version_is_refused_naming_what_this_build_reads() {
        let mut raw = Vec::new();
        raw.extend_from_slice(MAGIC);
        raw.push(ARCHIVE_VERSION + 1);
        raw.push(SNAPSHOT_FORMAT);
        raw.extend_from_slice(&1u64.to_le_bytes());
        raw.extend_from_slice(&0u64.to_le_bytes());
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&raw).expect("gzip");
        let refused = Archive::decode(&gz.finish().expect("gzip")).expect_err("another version");
        assert_eq!(
            refused,
            ArchiveError::Version {
                archive: ARCHIVE_VERSION + 1,
                state: SNAPSHOT_FORMAT,
                reads_archive: ARCHIVE_VERSION,
                reads_state: SNAPSHOT_FORMAT,
            }
        );
        assert_eq!(
            refused.to_string(),
            format!(
                "snapshot archive has version {}/{SNAPSHOT_FORMAT}; this build reads {ARCHIVE_VERSION}/{SNAPSHOT_FORMAT}",
                ARCHIVE_VERSION + 1
            )
        );
    }

    #[test]
    fn a_state_above_the_limit_is_refused_by_its_declared_size() {
        let mut raw = Vec::new();
        raw.extend_from_slice(MAGIC);
        raw.push(ARCHIVE_VERSION);
        raw.push(SNAPSHOT_FORMAT);
        raw.extend_from_slice(&1u64.to_le_bytes());
        raw.extend_from_slice(&(MAX_RESTORE_STATE as u64 + 1).to_le_bytes());
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&raw).expect("gzip");
        let bytes = gz.finish().expect("gzip");
        assert!(matches!(
            Archive::decode(&bytes),
            Err(ArchiveError::TooLarge { .. })
        ));
    }
}

//! Gossip key rotation, as Serf's key queries (Consul's `/v1/operator/keyring`): an operation
//! (list, install, use, remove) is asked of every live member, each applies it to its own
//! keyring and answers, and the asking member adds the answers up: which keys how many members
//! hold, which they use as primary, who refused and why.
//!
//! Requests and answers travel in `KIND_KEY` packets (kind byte 2) on the gossip socket, sealed
//! like every packet. The asker sends each member the request directly and repeats it every
//! [`TimingProfile::key_query_retry`] to those that have not answered, until all have or
//! [`TimingProfile::key_query_timeout`] passed; a member applies a request once (it remembers
//! the last [`SEEN_REQUESTS`] and answers a repeat with the same answer). Keys travel as raw
//! bytes, so a key of the wrong length is refused by every member, as memberlist does.
//!
//! A changed keyring is saved by its [`KeyringStore`] before the member answers (Consul's
//! `serf/local.keyring`: a JSON list of base64 keys, the primary first); a failed save is that
//! member's failure.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::crypto::{Envelope, Key, Keyring, RingError};
use super::profile::TimingProfile;

/// Requests a member remembers having applied, with their answers.
pub const SEEN_REQUESTS: usize = 64;

/// What a keyring operation does on each member. Versioned by adding variants only. Its
/// `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyOp {
    List,
    /// Add a key (for opening packets).
    Install(Vec<u8>),
    /// Make an installed key the primary (the one packets are sealed with).
    Use(Vec<u8>),
    /// Drop a key that is not the primary.
    Remove(Vec<u8>),
}

impl std::fmt::Debug for KeyOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl KeyOp {
    /// The operation's name, for logs (never the key).
    pub fn name(&self) -> &'static str {
        match self {
            KeyOp::List => "list",
            KeyOp::Install(_) => "install",
            KeyOp::Use(_) => "use",
            KeyOp::Remove(_) => "remove",
        }
    }
}

/// One member's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAnswer {
    /// Why the member refused, or failed to save its keyring.
    pub error: Option<String>,
    /// Its keys, base64, the primary first (answers to `List`).
    pub keys: Vec<String>,
}

/// A keyring packet's payload. Versioned by adding variants only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KeyMessage {
    Request {
        id: u64,
        /// The asker's gossip address: where the answer goes.
        from: SocketAddr,
        op: KeyOp,
    },
    Answer {
        id: u64,
        /// The answering member's gossip address and name.
        addr: SocketAddr,
        node: String,
        answer: NodeAnswer,
    },
}

/// Where a member keeps its keyring between runs.
pub trait KeyringStore: Send {
    fn save(&mut self, ring: &Keyring) -> std::io::Result<()>;
}

/// A keyring file (Consul's `serf/local.keyring` in the data directory).
#[derive(Debug, Clone)]
pub struct KeyringFile {
    path: PathBuf,
}

/// A keyring file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyringFileError {
    #[error("reading the keyring file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the keyring file {path} is not a JSON list of base64 keys of 16, 24 or 32 bytes")]
    Malformed { path: PathBuf },
    #[error("writing the keyring file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl KeyringFile {
    pub fn new(path: impl Into<PathBuf>) -> KeyringFile {
        KeyringFile { path: path.into() }
    }

    /// `serf/local.keyring` under a data directory, as Consul names it.
    pub fn in_data_dir(data_dir: &Path) -> KeyringFile {
        KeyringFile::new(data_dir.join("serf").join("local.keyring"))
    }

    /// The saved ring; `None` when there is no file.
    pub fn load(&self) -> Result<Option<Keyring>, KeyringFileError> {
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(KeyringFileError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let malformed = || KeyringFileError::Malformed {
            path: self.path.clone(),
        };
        let encoded: Vec<String> = serde_json::from_slice(&text).map_err(|_| malformed())?;
        let keys = encoded
            .iter()
            .map(|k| Key::from_base64(k))
            .collect::<Result<Vec<Key>, _>>()
            .map_err(|_| malformed())?;
        Keyring::from_keys(keys).map(Some).ok_or_else(malformed)
    }

    /// The keyring this node starts with, as Consul sets it up: the file when there is one (a
    /// configured key it lacks is only warned about: the file has the rotations since), else
    /// the configured key, written to a new file.
    pub fn initial(
        &self,
        configured: Option<Keyring>,
    ) -> Result<Option<Keyring>, KeyringFileError> {
        match (self.load()?, configured) {
            (Some(saved), Some(configured)) => {
                if !saved.contains(configured.primary()) {
                    tracing::warn!(file = %self.path.display(),
                        "keyring doesn't include key provided with -encrypt, using keyring");
                }
                Ok(Some(saved))
            }
            (Some(saved), None) => Ok(Some(saved)),
            (None, Some(configured)) => {
                self.write(&configured)
                    .map_err(|source| KeyringFileError::Write {
                        path: self.path.clone(),
                        source,
                    })?;
                Ok(Some(configured))
            }
            (None, None) => Ok(None),
        }
    }

    /// Writes the ring atomically (a temporary file renamed over the old one), readable by
    /// the agent's user only (0600, in a 0700 directory), also when a temporary file from an
    /// interrupted write is still there with other permissions.
    fn write(&self, ring: &Keyring) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let keys: Vec<String> = ring.keys().iter().map(Key::to_base64).collect();
        let json = serde_json::to_vec(&keys).map_err(std::io::Error::other)?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut temp = self.path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temp)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(&json)?;
        file.sync_all()?;
        std::fs::rename(&temp, &self.path)
    }
}

impl KeyringStore for KeyringFile {
    fn save(&mut self, ring: &Keyring) -> std::io::Result<()> {
        self.write(ring)
    }
}

/// What the asker learned, in Serf's `KeyResponse` terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyResponse {
    /// Node name → why it refused.
    pub messages: BTreeMap<String, String>,
    /// Live members asked, ourselves included.
    pub num_nodes: usize,
    pub num_resp: usize,
    pub num_err: usize,
    /// Base64 key → how many members hold it.
    pub keys: BTreeMap<String, usize>,
    /// Base64 key → how many members use it as their primary.
    pub primary_keys: BTreeMap<String, usize>,
}

impl KeyResponse {
    fn add(&mut self, node: String, answer: NodeAnswer) {
        self.num_resp += 1;
        if let Some(error) = answer.error {
            self.num_err += 1;
            self.messages.insert(node, error);
        }
        if let Some(primary) = answer.keys.first() {
            *self.primary_keys.entry(primary.clone()).or_default() += 1;
        }
        for key in answer.keys {
            *self.keys.entry(key).or_default() += 1;
        }
    }

    /// Serf's verdict: some member refused, or not every member answered.
    pub fn error(&self) -> Option<String> {
        if self.num_err != 0 {
            Some(format!(
                "{}/{} nodes reported failure",
                self.num_err, self.num_nodes
            ))
        } else if self.num_resp != self.num_nodes {
            Some(format!(
                "{}/{} nodes reported success",
                self.num_resp, self.num_nodes
            ))
        } else {
            None
        }
    }
}

/// Applies `op` to a member's keyring (through its envelope), saving a changed ring; the
/// member's answer. The texts are Serf's and memberlist's.
pub fn apply(
    envelope: &mut Envelope,
    store: &mut Option<Box<dyn KeyringStore>>,
    op: &KeyOp,
) -> NodeAnswer {
    let refuse = |error: String| NodeAnswer {
        error: Some(error),
        keys: Vec::new(),
    };
    let Some(ring) = envelope.keyring_mut() else {
        return refuse(
            match op {
                KeyOp::List => "Keyring is empty (encryption not enabled)",
                _ => "No keyring to modify (encryption not enabled)",
            }
            .to_owned(),
        );
    };
    let key = |bytes: &[u8]| Key::from_slice(bytes).ok_or(RingError::KeySize);
    let changed = match op {
        KeyOp::List => {
            return NodeAnswer {
                error: None,
                keys: ring.keys().iter().map(Key::to_base64).collect(),
            };
        }
        KeyOp::Install(bytes) => key(bytes).map(|k| ring.install(k)),
        KeyOp::Use(bytes) => key(bytes)
            .map_err(|_| RingError::NotInRing)
            .and_then(|k| ring.use_key(&k)),
        // A key that cannot be in the ring is not in it: nothing to do, as in memberlist.
        KeyOp::Remove(bytes) => match Key::from_slice(bytes) {
            Some(k) => ring.remove(&k),
            None => Ok(false),
        },
    };
    match changed {
        Err(e) => refuse(e.to_string()),
        Ok(true) => match store.as_mut().map(|s| s.save(ring)) {
            Some(Err(e)) => refuse(format!("failed to save the keyring: {e}")),
            _ => NodeAnswer {
                error: None,
                keys: Vec::new(),
            },
        },
        Ok(false) => NodeAnswer {
            error: None,
            keys: Vec::new(),
        },
    }
}

/// The requests a member has applied lately, so a repeat gets the same answer.
#[derive(Debug, Default)]
pub struct SeenRequests {
    answers: VecDeque<((SocketAddr, u64), NodeAnswer)>,
}

impl SeenRequests {
    pub fn get(&self, from: SocketAddr, id: u64) -> Option<&NodeAnswer> {
        self.answers
            .iter()
            .find(|(k, _)| *k == (from, id))
            .map(|(_, a)| a)
    }

    pub fn insert(&mut self, from: SocketAddr, id: u64, answer: NodeAnswer) {
        if self.answers.len() == SEEN_REQUESTS {
            self.answers.pop_front();
        }
        self.answers.push_back(((from, id), answer));
    }
}

/// One operation this member asked of the cluster, until every member answered or it timed
/// out.
#[derive(Debug)]
pub struct Query {
    pub op: KeyOp,
    /// Members that have not answered yet: address → name.
    pub waiting: BTreeMap<SocketAddr, String>,
    pub response: KeyResponse,
    pub deadline: Duration,
    pub next_send: Duration,
}

impl Query {
    /// A query of `members` (address → name, ourselves excluded) that we answered ourselves
    /// with `own`, as `me`.
    pub fn new(
        op: KeyOp,
        members: BTreeMap<SocketAddr, String>,
        me: String,
        own: NodeAnswer,
        now: Duration,
        profile: TimingProfile,
    ) -> Query {
        let mut response = KeyResponse {
            num_nodes: members.len() + 1,
            ..KeyResponse::default()
        };
        response.add(me, own);
        Query {
            op,
            waiting: members,
            response,
            deadline: now + profile.key_query_timeout(),
            next_send: now,
        }
    }

    /// Records `addr`'s answer (once; strangers and repeats are ignored).
    pub fn answered(&mut self, addr: SocketAddr, node: String, answer: NodeAnswer) {
        if self.waiting.remove(&addr).is_some() {
            self.response.add(node, answer);
        }
    }

    pub fn done(&self, now: Duration) -> bool {
        self.waiting.is_empty() || now >= self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::generate_key;

    fn key() -> Key {
        Key::from_base64(&generate_key()).unwrap()
    }

    fn bytes(key: &Key) -> Vec<u8> {
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, key.to_base64()).unwrap()
    }

    struct Failing;

    impl KeyringStore for Failing {
        fn save(&mut self, _: &Keyring) -> std::io::Result<()> {
            Err(std::io::Error::other("disk full"))
        }
    }

    #[test]
    fn members_apply_operations_with_serfs_answers() {
        let (old, new) = (key(), key());
        let mut envelope = Envelope::new(Some(Keyring::new(old.clone())));
        let mut store: Option<Box<dyn KeyringStore>> = None;
        let mut run = |op| apply(&mut envelope, &mut store, &op);
        let error = |a: NodeAnswer| a.error.unwrap_or_default();

        assert_eq!(
            error(run(KeyOp::Install(vec![1; 20]))),
            "key size must be 16, 24 or 32 bytes"
        );
        assert_eq!(
            error(run(KeyOp::Use(bytes(&new)))),
            "Requested key is not in the keyring"
        );
        assert_eq!(
            error(run(KeyOp::Remove(bytes(&old)))),
            "Removing the primary key is not allowed"
        );
        assert_eq!(run(KeyOp::Install(bytes(&new))).error, None);
        assert_eq!(run(KeyOp::Use(bytes(&new))).error, None);
        assert_eq!(run(KeyOp::Remove(bytes(&old))).error, None);
        assert_eq!(
            run(KeyOp::Remove(vec![7; 3])).error,
            None,
            "not in the ring"
        );
        assert_eq!(run(KeyOp::List).keys, [new.to_base64()]);

        let mut clear = Envelope::new(None);
        assert_eq!(
            error(apply(&mut clear, &mut None, &KeyOp::List)),
            "Keyring is empty (encryption not enabled)"
        );
        assert_eq!(
            error(apply(&mut clear, &mut None, &KeyOp::Install(bytes(&new)))),
            "No keyring to modify (encryption not enabled)"
        );
    }

    #[test]
    fn a_change_that_cannot_be_saved_is_a_failure() {
        let mut envelope = Envelope::new(Some(Keyring::new(key())));
        let mut store: Option<Box<dyn KeyringStore>> = Some(Box::new(Failing));
        let answer = apply(&mut envelope, &mut store, &KeyOp::Install(bytes(&key())));
        assert_eq!(
            answer.error.as_deref(),
            Some("failed to save the keyring: disk full")
        );
        // Nothing changed: nothing to save, no failure.
        assert_eq!(apply(&mut envelope, &mut store, &KeyOp::List).error, None);
    }

    #[test]
    fn the_file_round_trips_and_wins_over_the_configured_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = KeyringFile::in_data_dir(dir.path());
        assert_eq!(file.initial(None).unwrap(), None);
        let (old, new) = (key(), key());

        // The configured key seeds a new file.
        let ring = file
            .initial(Some(Keyring::new(old.clone())))
            .unwrap()
            .unwrap();
        assert_eq!(ring.keys(), std::slice::from_ref(&old));
        let text = std::fs::read_to_string(dir.path().join("serf/local.keyring")).unwrap();
        assert_eq!(text, format!("[\"{}\"]", old.to_base64()));

        // After a rotation the file wins over the configured (old) key.
        let mut rotated = Keyring::new(new.clone());
        rotated.install(old.clone());
        let mut store = file.clone();
        store.save(&rotated).unwrap();
        assert_eq!(
            file.initial(Some(Keyring::new(old))).unwrap(),
            Some(rotated.clone())
        );
        assert_eq!(file.load().unwrap(), Some(rotated));

        std::fs::write(dir.path().join("serf/local.keyring"), "[\"c2hvcnQ=\"]").unwrap();
        assert!(matches!(
            file.load(),
            Err(KeyringFileError::Malformed { .. })
        ));
    }

    #[test]
    fn the_verdict_is_serfs() {
        let addr = |p| SocketAddr::from(([127, 0, 0, 1], p));
        let members = BTreeMap::from([(addr(1), "b".to_owned()), (addr(2), "c".to_owned())]);
        let ok = NodeAnswer {
            error: None,
            keys: vec!["k2".to_owned(), "k1".to_owned()],
        };
        let mut query = Query::new(
            KeyOp::List,
            members,
            "a".to_owned(),
            ok.clone(),
            Duration::ZERO,
            TimingProfile::Local,
        );
        assert!(!query.done(Duration::ZERO));
        query.answered(addr(1), "b".to_owned(), ok.clone());
        query.answered(addr(1), "b".to_owned(), ok.clone());
        query.answered(addr(9), "stranger".to_owned(), ok);
        assert_eq!(
            query.response.error().as_deref(),
            Some("2/3 nodes reported success")
        );
        assert!(query.done(TimingProfile::Local.key_query_timeout()));
        query.answered(
            addr(2),
            "c".to_owned(),
            NodeAnswer {
                error: Some("no".to_owned()),
                keys: Vec::new(),
            },
        );
        assert!(query.done(Duration::ZERO));
        let response = &query.response;
        assert_eq!(
            response.error().as_deref(),
            Some("1/3 nodes reported failure")
        );
        assert_eq!(
            response.keys,
            BTreeMap::from([("k1".to_owned(), 2), ("k2".to_owned(), 2)])
        );
        assert_eq!(
            response.primary_keys,
            BTreeMap::from([("k2".to_owned(), 2)])
        );
        assert_eq!(
            response.messages,
            BTreeMap::from([("c".to_owned(), "no".to_owned())])
        );
    }
}

//! The state machine's encoding, in the format of either release a rolling upgrade mixes.
//!
//! Format 3 (the first release, `v0.1.0`) is the postcard of the state's first eight fields.
//! Format 4 adds the fields after them (op index, protocol level, latest restore, lock queue
//! request identities) and starts with [`FORMAT_4_TAG`], so a decoder tells the two apart
//! from the bytes alone: snapshot data sent to a follower and the state an `Op::RestoreSnapshot`
//! carries have no version byte of their own.
//!
//! Format 5 is format 4 followed by the lock history, and starts with [`FORMAT_5_TAG`]. Format
//! 4 was written by development builds of level 2 before the lock history; it is still read.
//!
//! A state is written in format 3 while its protocol level is below 2, so a server of the first
//! release reads every snapshot and restore a newer leader sends it (and a newer server rolled
//! back finds a snapshot file it reads), and in format 5 from the level the leader raises once
//! every server runs this release. All are read always. A format-3 state decodes with the
//! later fields empty, as the first release applied: its protocol level is 0; a format-4 one
//! with an empty history.

use serde::{Deserialize, Serialize};
use vigil_shared::autopilot::AutopilotConfig;

use super::StateMachine;
use super::acl::AclStore;
use super::catalog::Catalog;
use super::history::{Decoded, History};
use super::kv::KvStore;
use super::locks::LockTable;
use super::query::QueryStore;
use super::session::SessionStore;

/// The snapshot format of the first release (`v0.1.0`).
pub const FIRST_RELEASE_FORMAT: u8 = 3;
/// The snapshot format this build writes from protocol level 2 on.
pub const FORMAT: u8 = 5;
/// The protocol level from which a state is written in [`FORMAT`].
const FORMAT_5_LEVEL: u32 = 2;
/// How a format-4 encoding starts. A format-3 one starts with the varint length of the KV
/// table, and postcard writes varints canonically: never a continuation byte followed by 0.
const FORMAT_4_TAG: [u8; 2] = [0x80, 0x00];
/// How a format-5 encoding starts (another non-canonical varint start).
const FORMAT_5_TAG: [u8; 2] = [0x81, 0x00];

/// The first release's fields, to write (borrowed).
#[derive(Serialize)]
struct FirstReleaseRef<'a> {
    kv: &'a KvStore,
    sessions: &'a SessionStore,
    #[serde(serialize_with = "super::catalog::first_release::serialize")]
    catalog: &'a Catalog,
    #[serde(serialize_with = "super::query::first_release::serialize")]
    queries: &'a QueryStore,
    locks: &'a LockTable,
    acl: &'a AclStore,
    last_now_ms: u64,
    autopilot: &'a AutopilotConfig,
}

/// The first release's fields, read.
#[derive(Deserialize)]
struct FirstRelease {
    kv: KvStore,
    sessions: SessionStore,
    #[serde(deserialize_with = "super::catalog::first_release::deserialize")]
    catalog: Catalog,
    #[serde(deserialize_with = "super::query::first_release::deserialize")]
    queries: QueryStore,
    locks: LockTable,
    acl: AclStore,
    last_now_ms: u64,
    autopilot: AutopilotConfig,
}

impl StateMachine {
    /// The snapshot format this state is written in ([`StateMachine::encode_into`]).
    pub fn format(&self) -> u8 {
        if self.protocol >= FORMAT_5_LEVEL {
            FORMAT
        } else {
            FIRST_RELEASE_FORMAT
        }
    }

    /// Appends the state's encoding, in [`StateMachine::format`], to `out`.
    pub fn encode_into(&self, out: Vec<u8>) -> Result<Vec<u8>, postcard::Error> {
        if self.format() == FORMAT {
            let mut out = out;
            out.extend_from_slice(&FORMAT_5_TAG);
            let out = postcard::to_extend(self, out)?;
            return postcard::to_extend(&self.history.encoded(), out);
        }
        let first = FirstReleaseRef {
            kv: &self.kv,
            sessions: &self.sessions,
            catalog: &self.catalog,
            queries: &self.queries,
            locks: &self.locks,
            acl: &self.acl,
            last_now_ms: self.last_now_ms,
            autopilot: &self.autopilot,
        };
        postcard::to_extend(&first, out)
    }

    /// The state's encoding, in [`StateMachine::format`].
    pub fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        self.encode_into(Vec::new())
    }

    /// Decodes a state in either format from the start of `bytes`; hands back what follows it.
    pub fn decode_prefix(bytes: &[u8]) -> Result<(StateMachine, &[u8]), postcard::Error> {
        if let Some(rest) = bytes.strip_prefix(&FORMAT_5_TAG) {
            let (mut state, rest) = postcard::take_from_bytes::<StateMachine>(rest)?;
            let (history, rest) = postcard::take_from_bytes::<Decoded>(rest)?;
            state.history = History::from_decoded(history);
            return Ok((state, rest));
        }
        if let Some(rest) = bytes.strip_prefix(&FORMAT_4_TAG) {
            return postcard::take_from_bytes(rest);
        }
        let (first, rest) = postcard::take_from_bytes::<FirstRelease>(bytes)?;
        let FirstRelease {
            kv,
            sessions,
            catalog,
            queries,
            locks,
            acl,
            last_now_ms,
            autopilot,
        } = first;
        let state = StateMachine {
            kv,
            sessions,
            catalog,
            queries,
            locks,
            acl,
            last_now_ms,
            autopilot,
            ..StateMachine::default()
        };
        Ok((state, rest))
    }

    /// Decodes a state in either format from the start of `bytes`, ignoring what follows it
    /// (as the first release's restore did, so servers of both releases take or refuse the
    /// same restore).
    pub fn decode(bytes: &[u8]) -> Result<StateMachine, postcard::Error> {
        StateMachine::decode_prefix(bytes).map(|(state, _)| state)
    }

    /// A state encoded in any format, re-encoded as a cluster applying protocol `level`
    /// carries it in a restore: the first release's format below level 2.
    pub fn encoded_at_level(bytes: &[u8], level: u32) -> Result<Vec<u8>, postcard::Error> {
        let mut state = StateMachine::decode(bytes)?;
        state.protocol = level;
        state.encode()
    }
}

#[cfg(test)]
mod tests {
    use vigil_shared::PROTOCOL;
    use vigil_shared::kv::KvOp;
    use vigil_shared::lock::{LockHold, LockMode, LockOp, LockOutcome};
    use vigil_shared::query::{PreparedQuery, ServiceQuery};
    use vigil_shared::rpc::{Command, Op, Response};

    use super::*;
    use crate::snapshot::Archive;

    /// `GET /v1/snapshot` of a `vigil agent --dev` of the first release (v0.1.0): key
    /// `app/config`, key `app/leader` held by session "one", native lock `db/primary` held by
    /// "one" (token 8) with "two" waiting, service `web`, prepared query `q`.
    const FIRST_RELEASE_ARCHIVE: &[u8] = include_bytes!("testdata/v0.1.0.snap");
    const ONE: &str = "65c8d11a-26de-47aa-8c86-75c019efc47a";
    const TWO: &str = "62e791c7-6b87-4000-ba9b-ee5d7e380446";

    fn first_release_archive() -> Archive {
        Archive::decode(FIRST_RELEASE_ARCHIVE).expect("the first release's archive reads")
    }

    fn apply(sm: &mut StateMachine, index: u64, op: Op) -> Response {
        sm.apply(
            index,
            Command {
                now_ms: sm.now_ms(),
                op,
            },
        )
        .0
    }

    #[test]
    fn the_first_releases_state_decodes_and_is_written_back_byte_for_byte() {
        let archive = first_release_archive();
        assert_eq!(archive.format, FIRST_RELEASE_FORMAT);
        let sm = Archive::open(&archive.state).expect("decode");
        assert_eq!(sm.protocol(), 0);
        assert_eq!(sm.format(), FIRST_RELEASE_FORMAT);
        assert_eq!(
            sm.kv().get("app/config").map(|e| e.value.clone()),
            Some(b"hello".to_vec())
        );
        let leader = sm.kv().get("app/leader").expect("app/leader");
        assert_eq!(leader.session.as_deref(), Some(ONE));
        assert_eq!(sm.sessions().len(), 2);
        assert_eq!(sm.catalog().services().count(), 1);
        assert_eq!(sm.queries().list().count(), 1);
        assert!(matches!(
            sm.locks().hold("db/primary", ONE).0,
            LockHold::Held { token: 8, .. }
        ));
        assert!(matches!(
            sm.locks().hold("db/primary", TWO).0,
            LockHold::Queued { position: 1, .. }
        ));
        // Below level 2 this build writes what the first release wrote (and reads): the same
        // layout (maps of its hash tables may list their entries in another order).
        let bytes = sm.encode().expect("encode");
        assert_eq!(bytes.len(), archive.state.len());
        assert_eq!(StateMachine::decode(&bytes).expect("decode"), sm);
        let again = Archive::of(&sm, archive.index).expect("archive");
        assert_eq!(again.format, FIRST_RELEASE_FORMAT);
        assert_eq!(Archive::decode(&again.encode()).expect("decode"), again);
    }

    #[test]
    fn below_level_2_a_state_is_written_in_the_first_releases_format_and_from_it_in_format_5() {
        let mut sm = Archive::open(&first_release_archive().state).expect("decode");
        // The first release's ops, applied as it applies them: "one" releases, "two" is
        // granted by the same entry.
        let release = Op::Lock(LockOp::Release {
            name: "db/primary".into(),
            session: ONE.into(),
        });
        assert_eq!(
            apply(&mut sm, 20, release),
            Response::Lock(LockOutcome::Released {
                held: true,
                queued: false
            })
        );
        let set = KvOp::Set {
            key: "app/more".into(),
            value: b"v".to_vec(),
            flags: 0,
        };
        apply(&mut sm, 21, Op::Kv(vec![set]));
        let bytes = sm.encode().expect("encode");
        assert_eq!(sm.format(), FIRST_RELEASE_FORMAT);
        assert_ne!(bytes[..2], FORMAT_4_TAG);
        let back = StateMachine::decode(&bytes).expect("decode");
        assert_eq!(back.kv(), sm.kv());
        assert_eq!(back.locks(), sm.locks());
        assert_eq!(back.sessions(), sm.sessions());
        assert!(matches!(
            back.locks().hold("db/primary", TWO).0,
            LockHold::Held {
                mode: LockMode::Exclusive,
                ..
            }
        ));

        // Once the leader raises the level, the state is written in format 5 and every field
        // comes back.
        assert_eq!(
            apply(&mut sm, 22, Op::SetProtocol { level: PROTOCOL }),
            Response::Done
        );
        let set = KvOp::Set {
            key: "app/newer".into(),
            value: b"v".to_vec(),
            flags: 0,
        };
        apply(&mut sm, 23, Op::Kv(vec![set]));
        let bytes = sm.encode().expect("encode");
        assert_eq!(sm.format(), FORMAT);
        assert_eq!(bytes[..2], FORMAT_5_TAG);
        let back = StateMachine::decode(&bytes).expect("decode");
        assert_eq!(back, sm);
        assert_eq!(back.protocol(), PROTOCOL);
        assert_eq!(back.index(), 23);
    }

    #[test]
    fn fields_added_since_the_first_release_are_kept_in_format_5_alone() {
        let mut sm = StateMachine::at_protocol(PROTOCOL);
        let query = PreparedQuery {
            id: "q".into(),
            name: "q".into(),
            service: ServiceQuery {
                service: "web".into(),
                ignore_check_ids: vec!["flaky".into()],
                ..ServiceQuery::default()
            },
            ..PreparedQuery::default()
        };
        let set = Op::SetQueryFull {
            query,
            update: false,
        };
        assert_eq!(apply(&mut sm, 5, set), Response::Done);
        let stored = |sm: &StateMachine| sm.queries().lookup("q").expect("q").clone();
        let bytes = sm.encode().expect("encode");
        let back = StateMachine::decode(&bytes).expect("decode");
        assert_eq!(stored(&back).service.ignore_check_ids, ["flaky"]);
        // Re-encoded for a cluster with first-release servers: the query stays, without them.
        let down = StateMachine::encoded_at_level(&bytes, 1).expect("re-encode");
        assert_ne!(down[..2], FORMAT_4_TAG);
        let back = StateMachine::decode(&down).expect("decode");
        let mut expected = stored(&sm);
        expected.service.ignore_check_ids.clear();
        assert_eq!(stored(&back), expected);
    }

    #[test]
    fn a_restore_travels_in_the_format_the_clusters_level_reads() {
        let first = first_release_archive();
        // An archive of a cluster at level 2, restored into one at level 1 (servers of the
        // first release in it): its state is re-encoded in format 3.
        let mut newer = Archive::open(&first.state).expect("decode");
        apply(&mut newer, 20, Op::SetProtocol { level: PROTOCOL });
        let newer = Archive::of(&newer, 20).expect("archive");
        assert_eq!(newer.format, FORMAT);
        let down = newer.clone().at_level(1).expect("re-encode");
        assert_eq!(down.format, FIRST_RELEASE_FORMAT);
        assert_eq!(down.state.len(), first.state.len());
        assert_eq!(
            Archive::open(&down.state).expect("decode"),
            Archive::open(&first.state).expect("decode")
        );
        // And the first release's archive, restored at level 2, is written in format 5.
        let up = first.clone().at_level(PROTOCOL).expect("re-encode");
        assert_eq!(up.format, FORMAT);
        assert_eq!(up.state[..2], FORMAT_5_TAG);

        // A format-3 restore applied to a cluster at level 2 keeps its level.
        let mut current = StateMachine::at_protocol(PROTOCOL);
        let restore = Op::RestoreSnapshot { state: first.state };
        assert_eq!(apply(&mut current, 30, restore), Response::Done);
        assert_eq!(current.protocol(), PROTOCOL);
        assert!(current.kv().get("app/config").is_some());
    }

    #[test]
    fn a_format_4_state_decodes_with_an_empty_history() {
        let mut sm = StateMachine::at_protocol(PROTOCOL);
        let register = Op::RegisterNode {
            name: "n".into(),
            address: "127.0.0.1".into(),
        };
        apply(&mut sm, 1, register);
        let session = vigil_shared::session::Session {
            id: ONE.into(),
            node: "n".into(),
            ..vigil_shared::session::Session::default()
        };
        apply(&mut sm, 2, Op::CreateSession(session));
        let lock = KvOp::Lock {
            key: "k".into(),
            value: Vec::new(),
            flags: 0,
            session: ONE.into(),
        };
        apply(&mut sm, 3, Op::Kv(vec![lock]));
        assert_eq!(sm.history().len(), 1);
        // What a build of level 2 before the lock history wrote: the state alone.
        let four = postcard::to_extend(&sm, FORMAT_4_TAG.to_vec()).expect("encode");
        let back = StateMachine::decode(&four).expect("decode");
        assert!(back.history().is_empty());
        assert_eq!(back.kv(), sm.kv());
        assert_eq!(back.protocol(), PROTOCOL);
        // Written again, it is format 5, history and all.
        let five = sm.encode().expect("encode");
        assert_eq!(five[..2], FORMAT_5_TAG);
        assert_eq!(StateMachine::decode(&five).expect("decode"), sm);
    }
}

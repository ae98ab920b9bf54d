//! The KV HTTP API (`/v1/kv/<key>`) against a real dev agent: reads, writes, deletes, locks,
//! `X-Consul-Index` semantics and blocking queries, as Consul answers them
//! (docs/consul-compatibility.md#kv, #blocking-queries-and-consistency, #consul-tests-mirrored),
//! with Vigil's deliberate differences (#deliberate-differences: LockIndex never decreases,
//! lock-delay refusals carry `X-Vigil-Lock-Delay`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::{Agent, Reply};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use vigil_shared::go::duration::parse_go_duration;

use crate::common::{arm_lock_delay, assert_not_found, assert_waits_out, b64};

/// Upper bound for anything that should happen promptly (a woken blocking query, say).
const PROMPTLY: Duration = Duration::from_secs(10);

/// A blocking read of `path` parked in the background.
fn park(agent: &Arc<Agent>, path: String) -> JoinHandle<Reply> {
    let agent = Arc::clone(agent);
    tokio::spawn(async move { agent.get(&path).await })
}

/// The answer of a [`park`]ed read, which must come within [`PROMPTLY`] (`why`: what wakes it).
async fn woken(watcher: JoinHandle<Reply>, why: &str) -> Reply {
    tokio::time::timeout(PROMPTLY, watcher)
        .await
        .expect(why)
        .expect("watcher task")
}

fn modify_index(entry: &Value) -> u64 {
    entry["ModifyIndex"].as_u64().expect("ModifyIndex")
}

/// The global KV index: what a listing of the root prefix reports.
async fn kv_index(agent: &Agent) -> u64 {
    let reply = agent.get("/v1/kv/?keys").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.index()
}

fn assert_read_headers(reply: &Reply) {
    assert_eq!(
        reply.header("X-Consul-KnownLeader").as_deref(),
        Some("true")
    );
    assert_eq!(reply.header("X-Consul-LastContact").as_deref(), Some("0"));
    assert!(reply.index() > 0, "X-Consul-Index is never 0");
}

#[tokio::test]
async fn put_get_delete_round_trip_answers_true_and_one_element_arrays() {
    let agent = Agent::dev().await;

    // TestKVSEndpoint_PUT_GET_DELETE: every PUT answers `true`, and a write carries no index.
    let keys = ["baz", "bar", "foo/sub1", "foo/sub2", "zip", "my key"];
    for key in keys {
        let reply = agent
            .put(&format!("/v1/kv/{}", key.replace(' ', "%20")), "test")
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.json(), json!(true));
        assert_eq!(
            reply.header("X-Consul-Index"),
            None,
            "writes carry no index"
        );
    }

    // Each GET is a one-element array in Consul's field order, and its index is the entry's own
    // ModifyIndex; a percent-encoded path names the decoded key.
    for key in keys {
        let reply = agent
            .get(&format!("/v1/kv/{}", key.replace(' ', "%20")))
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.header("Content-Type").as_deref(),
            Some("application/json")
        );
        assert_read_headers(&reply);
        let e = reply.json()[0].clone();
        let m = modify_index(&e);
        assert_eq!(reply.index(), m);
        assert_eq!(
            reply.text(),
            format!(
                r#"[{{"LockIndex":0,"Key":"{key}","Flags":0,"Value":"{}","CreateIndex":{m},"ModifyIndex":{m}}}]"#,
                b64("test")
            )
        );
    }

    // DELETE answers `true`, and the keys are gone: 404 with an empty body.
    for key in keys {
        let path = format!("/v1/kv/{}", key.replace(' ', "%20"));
        let reply = agent.delete(&path).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json(), json!(true));
        let gone = agent.get(&path).await;
        assert_eq!(gone.status, StatusCode::NOT_FOUND);
        assert!(gone.body.is_empty());
    }
}

#[tokio::test]
async fn missing_key_is_404_with_read_headers_and_index_never_zero() {
    let agent = Agent::dev().await;

    // On a fresh agent the KV table index is 0, which must go out as 1
    // (docs/consul-compatibility.md#kv-index: never 0).
    let missing = agent.get("/v1/kv/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.is_empty(), "{}", missing.text());
    assert_read_headers(&missing);
    assert_eq!(missing.index(), 1);

    // Once something is written, a missing key reports the global KV index.
    agent.put_true("/v1/kv/other", "x").await;
    let written = modify_index(&agent.kv_entry("other").await);
    let missing = agent.get("/v1/kv/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_read_headers(&missing);
    assert_eq!(missing.index(), written);

    // `recurse` and `keys` under a prefix with nothing in it are 404 with headers too.
    for query in ["nope/?recurse", "nope/?keys"] {
        let reply = agent.get(&format!("/v1/kv/{query}")).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{query}");
        assert!(reply.body.is_empty());
        assert_read_headers(&reply);
        assert_eq!(reply.index(), written, "{query}");
    }
}

#[tokio::test]
async fn empty_value_reads_back_as_null_and_raw_as_empty_body() {
    let agent = Agent::dev().await;

    // A PUT with no body stores no value: JSON `null`, not "".
    agent.put_true("/v1/kv/empty", Vec::new()).await;
    let e = agent.kv_entry("empty").await;
    assert_eq!(e["Value"], Value::Null);
    assert!(
        !e.as_object().unwrap().contains_key("Session"),
        "Session is omitted when unlocked: {e}"
    );

    // Raw read of an empty value is a 200 with a zero-length body.
    let raw = agent.get("/v1/kv/empty?raw").await;
    assert_eq!(raw.status, StatusCode::OK);
    assert!(raw.body.is_empty());
    assert_eq!(raw.header("Content-Length").as_deref(), Some("0"));

    // Writing a value and then an empty one goes back to null.
    agent.put_true("/v1/kv/empty", "x").await;
    assert_eq!(agent.kv_entry("empty").await["Value"], json!(b64("x")));
    agent.put_true("/v1/kv/empty", Vec::new()).await;
    assert_eq!(agent.kv_entry("empty").await["Value"], Value::Null);
}

#[tokio::test]
async fn raw_get_returns_bytes_with_sandbox_headers_and_normal_get_has_none() {
    let agent = Agent::dev().await;
    let bytes = vec![0u8, 159, 146, 150, 255, b'\n'];
    agent.put_true("/v1/kv/bin", bytes.clone()).await;

    // TestKVSEndpoint_GET_Raw: the exact bytes, text/plain, nosniff, sandbox, exact length.
    let raw = agent.get("/v1/kv/bin?raw").await;
    assert_eq!(raw.status, StatusCode::OK);
    assert_eq!(raw.body, bytes);
    assert_eq!(raw.header("Content-Type").as_deref(), Some("text/plain"));
    assert_eq!(
        raw.header("X-Content-Type-Options").as_deref(),
        Some("nosniff")
    );
    assert_eq!(
        raw.header("Content-Security-Policy").as_deref(),
        Some("sandbox")
    );
    assert_eq!(raw.header("Content-Length"), Some(bytes.len().to_string()));
    assert_read_headers(&raw);

    // TestKVSEndpoint_GET: the JSON answer sets none of the three raw headers.
    let normal = agent.get("/v1/kv/bin").await;
    assert_eq!(normal.status, StatusCode::OK);
    assert_eq!(
        normal.header("Content-Type").as_deref(),
        Some("application/json")
    );
    assert_eq!(normal.header("X-Content-Type-Options"), None);
    assert_eq!(normal.header("Content-Security-Policy"), None);
    assert_eq!(normal.json()[0]["Value"], json!(b64(&bytes)));

    // `raw` is ignored together with `recurse`: JSON comes back.
    let listed = agent.get("/v1/kv/bi?recurse&raw").await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.header("X-Content-Type-Options"), None);
    assert_eq!(listed.json()[0]["Key"], json!("bin"));

    // A raw read of a missing key is still a plain 404.
    let missing = agent.get("/v1/kv/nothing?raw").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.is_empty());
}

#[tokio::test]
async fn recurse_matches_raw_string_prefixes_for_reads_and_deletes() {
    let agent = Agent::dev().await;
    for key in ["foo/b", "foo", "foobar", "foo/a", "fop"] {
        agent.put_true(&format!("/v1/kv/{key}"), key).await;
    }
    let names = |reply: &Reply| -> Vec<String> {
        reply
            .json()
            .as_array()
            .expect("array")
            .iter()
            .map(|e| e["Key"].as_str().unwrap().to_owned())
            .collect()
    };

    // TestKVSEndpoint_Recurse: a raw prefix (`foo` matches `foobar`), sorted by key, values
    // included; the flag is presence-based, so `recurse=false` still recurses.
    for query in ["foo?recurse", "foo?recurse=false"] {
        let reply = agent.get(&format!("/v1/kv/{query}")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            names(&reply),
            ["foo", "foo/a", "foo/b", "foobar"],
            "{query}"
        );
        assert_eq!(reply.json()[1]["Value"], json!(b64("foo/a")));
    }

    // The root prefix lists everything.
    let all = agent.get("/v1/kv/?recurse").await;
    assert_eq!(names(&all), ["foo", "foo/a", "foo/b", "foobar", "fop"]);

    // A recursive DELETE removes exactly that prefix and answers true.
    let reply = agent.delete("/v1/kv/foo/?recurse").await;
    assert_eq!(reply.json(), json!(true));
    let all = agent.get("/v1/kv/?recurse").await;
    assert_eq!(names(&all), ["foo", "foobar", "fop"]);

    // `DELETE /v1/kv/?recurse` wipes the store; listing everything is then a 404.
    let reply = agent.delete("/v1/kv/?recurse").await;
    assert_eq!(reply.json(), json!(true));
    assert_not_found(&agent, "/v1/kv/?recurse").await;
}

#[tokio::test]
async fn keys_lists_names_and_separator_collapses_subtrees() {
    let agent = Agent::dev().await;

    // On an empty store, the root key listing is 200 `[]` (not 404).
    let empty = agent.get("/v1/kv/?keys").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.json(), json!([]));
    assert_read_headers(&empty);

    for key in [
        "test/key1",
        "test/key2",
        "test/sub/key3",
        "test/sub/key4",
        "testing",
    ] {
        agent.put_true(&format!("/v1/kv/{key}"), "v").await;
    }

    // Without a separator, every key under the raw prefix.
    let all = agent.get("/v1/kv/test?keys").await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(
        all.json(),
        json!([
            "test/key1",
            "test/key2",
            "test/sub/key3",
            "test/sub/key4",
            "testing"
        ])
    );

    // TestKVSEndpoint_ListKeys: the separator cuts after the first `/` past the prefix and
    // removes duplicates; the legacy spelling `seperator` works too; `separator` wins.
    let collapsed = json!(["test/key1", "test/key2", "test/sub/"]);
    for query in [
        "test/?keys&separator=/",
        "test/?keys&seperator=/",
        "test/?keys&seperator=k&separator=/",
    ] {
        let reply = agent.get(&format!("/v1/kv/{query}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{query}");
        assert_eq!(reply.json(), collapsed, "{query}");
    }

    // `keys` takes precedence over `recurse`: names, not entries.
    let both = agent.get("/v1/kv/test/sub/?keys&recurse").await;
    assert_eq!(both.json(), json!(["test/sub/key3", "test/sub/key4"]));

    // An unknown non-empty prefix is a 404.
    let unknown = agent.get("/v1/kv/nothing/?keys&separator=/").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body.is_empty());
}

#[tokio::test]
async fn flags_round_trip_and_cas_writes_only_at_the_matching_index() {
    let agent = Agent::dev().await;

    // Flags are an opaque uint64: the full range round-trips.
    agent
        .put_true("/v1/kv/flagged?flags=18446744073709551615", "v")
        .await;
    assert_eq!(
        agent.kv_entry("flagged").await["Flags"],
        json!(u64::MAX),
        "max uint64 flags"
    );

    // TestKVSEndpoint_CAS: cas=0 creates only when the key is absent.
    agent.put_true("/v1/kv/test?flags=50&cas=0", "first").await;
    let first = agent.kv_entry("test").await;
    assert_eq!(first["Flags"], json!(50));
    let m1 = modify_index(&first);
    agent.put_false("/v1/kv/test?cas=0", "again").await;

    // A stale index is refused and changes nothing.
    agent
        .put_false(&format!("/v1/kv/test?flags=42&cas={}", m1 + 1000), "stale")
        .await;
    assert_eq!(agent.kv_entry("test").await, first);

    // The current index writes the value and the flags.
    agent
        .put_true(&format!("/v1/kv/test?flags=42&cas={m1}"), "second")
        .await;
    let second = agent.kv_entry("test").await;
    assert_eq!(second["Flags"], json!(42));
    assert_eq!(second["Value"], json!(b64("second")));
    assert!(modify_index(&second) > m1);
    assert_eq!(second["CreateIndex"], first["CreateIndex"]);

    // The old index is now stale; a cas with N > 0 on a missing key is false, not a create.
    agent.put_false(&format!("/v1/kv/test?cas={m1}"), "x").await;
    agent.put_false("/v1/kv/absent?cas=5", "x").await;
    assert_not_found(&agent, "/v1/kv/absent").await;
}

#[tokio::test]
async fn delete_is_idempotent_and_cas_delete_needs_the_matching_index() {
    let agent = Agent::dev().await;
    agent.put_true("/v1/kv/test", "v").await;
    let m = modify_index(&agent.kv_entry("test").await);

    // TestKVSEndpoint_DELETE_CAS: a wrong index is false and the key stays; cas=0 never
    // deletes an existing key.
    for cas in [m + 1000, 0] {
        let reply = agent.delete(&format!("/v1/kv/test?cas={cas}")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json(), json!(false), "cas={cas}");
        assert_eq!(modify_index(&agent.kv_entry("test").await), m);
    }

    // The right index deletes.
    let reply = agent.delete(&format!("/v1/kv/test?cas={m}")).await;
    assert_eq!(reply.json(), json!(true));
    assert_not_found(&agent, "/v1/kv/test").await;

    // On a missing key, cas-delete is true for any index, and a plain delete is true; neither
    // moves the KV index.
    let before = kv_index(&agent).await;
    for path in ["/v1/kv/test?cas=12345", "/v1/kv/test?cas=0", "/v1/kv/test"] {
        let reply = agent.delete(path).await;
        assert_eq!(reply.json(), json!(true), "{path}");
    }
    assert_eq!(kv_index(&agent).await, before);
}

#[tokio::test]
async fn acquire_and_release_track_the_session_and_lock_index_never_decreases() {
    let agent = Agent::dev().await;
    let s1 = agent.session(r#"{"Name":"one"}"#).await;
    let s2 = agent.session(r#"{"Name":"two"}"#).await;

    // TestKVSEndpoint_AcquireRelease: acquiring a new key creates it locked, LockIndex 1.
    agent
        .put_true(&format!("/v1/kv/lock?acquire={s1}&flags=7"), "held")
        .await;
    let held = agent.kv_entry("lock").await;
    assert_eq!(held["Session"], json!(s1));
    assert_eq!(held["LockIndex"], json!(1));
    assert_eq!(held["Flags"], json!(7));
    assert_eq!(held["CreateIndex"], held["ModifyIndex"]);

    // Another session cannot take it, and its attempt changes nothing.
    let refused = agent
        .put_false(&format!("/v1/kv/lock?acquire={s2}"), "mine")
        .await;
    assert_eq!(
        refused.header("X-Vigil-Lock-Delay"),
        None,
        "not a lock-delay"
    );
    assert_eq!(agent.kv_entry("lock").await, held);

    // The holder re-acquiring updates value and flags but keeps LockIndex.
    agent
        .put_true(&format!("/v1/kv/lock?acquire={s1}&flags=8"), "updated")
        .await;
    let reacquired = agent.kv_entry("lock").await;
    assert_eq!(reacquired["LockIndex"], json!(1));
    assert_eq!(reacquired["Value"], json!(b64("updated")));
    assert_eq!(reacquired["Flags"], json!(8));

    // Vigil's difference: a plain PUT and a cas on a locked key keep the Session AND the
    // LockIndex (Consul would reset LockIndex to 0).
    agent.put_true("/v1/kv/lock", "plain").await;
    let plain = agent.kv_entry("lock").await;
    assert_eq!(plain["Session"], json!(s1));
    assert_eq!(plain["LockIndex"], json!(1));
    assert_eq!(plain["Flags"], json!(0));
    agent
        .put_true(&format!("/v1/kv/lock?cas={}", modify_index(&plain)), "cas")
        .await;
    let cased = agent.kv_entry("lock").await;
    assert_eq!(cased["Session"], json!(s1));
    assert_eq!(cased["LockIndex"], json!(1));

    // Only the holder can release; a release by another session is false and changes nothing.
    agent
        .put_false(&format!("/v1/kv/lock?release={s2}"), "x")
        .await;
    assert_eq!(agent.kv_entry("lock").await, cased);

    // The holder's release clears Session, keeps LockIndex and replaces value and flags with
    // the release request's.
    agent
        .put_true(&format!("/v1/kv/lock?release={s1}&flags=3"), "released")
        .await;
    let released = agent.kv_entry("lock").await;
    assert!(!released.as_object().unwrap().contains_key("Session"));
    assert_eq!(released["LockIndex"], json!(1));
    assert_eq!(released["Value"], json!(b64("released")));
    assert_eq!(released["Flags"], json!(3));
    assert!(modify_index(&released) > modify_index(&cased));

    // A second release is false: the lock is not held.
    agent
        .put_false(&format!("/v1/kv/lock?release={s1}"), "")
        .await;

    // Acquiring again (another session now) increments LockIndex; a bare release then sets the
    // value to null and the flags to 0.
    agent
        .put_true(&format!("/v1/kv/lock?acquire={s2}&flags=9"), "two")
        .await;
    let again = agent.kv_entry("lock").await;
    assert_eq!(again["LockIndex"], json!(2));
    assert_eq!(again["Session"], json!(s2));
    agent
        .put_true(&format!("/v1/kv/lock?release={s2}"), Vec::new())
        .await;
    let bare = agent.kv_entry("lock").await;
    assert_eq!(bare["Value"], Value::Null);
    assert_eq!(bare["Flags"], json!(0));
    assert_eq!(bare["LockIndex"], json!(2));

    // A voluntary release sets no lock-delay: the other session acquires at once.
    agent
        .put_true(&format!("/v1/kv/lock?acquire={s1}"), "back")
        .await;
    assert_eq!(agent.kv_entry("lock").await["LockIndex"], json!(3));
}

#[tokio::test]
async fn acquire_during_lock_delay_answers_false_with_the_remaining_delay() {
    let agent = Agent::dev().await;

    // Destroying the holder releases the key and arms its lock-delay.
    arm_lock_delay(&agent, "leader", "30s").await;
    let released = agent.kv_entry("leader").await;
    assert!(!released.as_object().unwrap().contains_key("Session"));
    assert_eq!(released["LockIndex"], json!(1));

    // A brand-new session is refused with `200 false` plus Vigil's header giving the remaining
    // delay as a Go duration, and nothing is written.
    let s2 = agent.session("{}").await;
    let refused = agent
        .put_false(&format!("/v1/kv/leader?acquire={s2}"), "s2")
        .await;
    let remaining = refused
        .header("X-Vigil-Lock-Delay")
        .expect("X-Vigil-Lock-Delay header on a lock-delay refusal");
    let remaining = parse_go_duration(&remaining).expect("a Go duration");
    assert!(
        remaining > Duration::ZERO && remaining <= Duration::from_secs(30),
        "{remaining:?}"
    );
    assert_eq!(agent.kv_entry("leader").await, released);

    // Lock-delay blocks only acquire: a plain PUT still writes.
    agent.put_true("/v1/kv/leader", "plain").await;
    assert_eq!(agent.kv_entry("leader").await["Value"], json!(b64("plain")));
}

#[tokio::test]
async fn identical_rewrite_is_a_no_op_that_keeps_indexes_and_wakes_nobody() {
    let agent = Arc::new(Agent::dev().await);
    agent.put_true("/v1/kv/same?flags=1", "v").await;
    let original = agent.kv_entry("same").await;
    let m = modify_index(&original);
    let global = kv_index(&agent).await;

    // A blocking reader on the key, with a bounded wait, must not be woken by a no-op write.
    let wait = Duration::from_millis(800);
    let reader = {
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            let started = Instant::now();
            let reply = agent
                .get(&format!("/v1/kv/same?index={m}&wait=800ms"))
                .await;
            (reply, started.elapsed())
        })
    };

    // The same value and flags again: still `true`, but nothing moves.
    agent.put_true("/v1/kv/same?flags=1", "v").await;
    assert_eq!(agent.kv_entry("same").await, original);
    assert_eq!(kv_index(&agent).await, global);

    // The reader ran out its wait and saw the same index.
    let (reply, elapsed) = tokio::time::timeout(PROMPTLY, reader)
        .await
        .expect("blocking read returns after its wait")
        .expect("reader task");
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.index(), m);
    assert!(
        elapsed >= wait,
        "returned after {elapsed:?}, before its wait"
    );

    // A changed field is a real write.
    agent.put_true("/v1/kv/same?flags=2", "v").await;
    assert!(modify_index(&agent.kv_entry("same").await) > m);

    // The same holds for the holder re-acquiring with identical value and flags.
    let s = agent.session("{}").await;
    agent
        .put_true(&format!("/v1/kv/locked?acquire={s}"), "x")
        .await;
    let held = agent.kv_entry("locked").await;
    agent
        .put_true(&format!("/v1/kv/locked?acquire={s}"), "x")
        .await;
    assert_eq!(agent.kv_entry("locked").await, held);
}

#[tokio::test]
async fn index_header_follows_tombstones_for_prefixes_and_the_global_index_for_missing_keys() {
    let agent = Agent::dev().await;
    agent.put_true("/v1/kv/a/1", "1").await;
    let i1 = modify_index(&agent.kv_entry("a/1").await);
    agent.put_true("/v1/kv/a/2", "2").await;
    let i2 = modify_index(&agent.kv_entry("a/2").await);
    agent.put_true("/v1/kv/b", "b").await;
    let i3 = modify_index(&agent.kv_entry("b").await);
    assert!(i1 < i2 && i2 < i3);

    // A prefix read reports the highest ModifyIndex under the prefix, not the global index.
    for query in ["a/?recurse", "a/?keys"] {
        assert_eq!(agent.get(&format!("/v1/kv/{query}")).await.index(), i2);
    }

    // Deleting the newest key under the prefix leaves a tombstone: the prefix index moves up to
    // the delete instead of sliding back to a/1.
    agent.delete("/v1/kv/a/2").await;
    let i4 = kv_index(&agent).await;
    assert!(i4 > i3);
    for query in ["a/?recurse", "a/?keys"] {
        assert_eq!(agent.get(&format!("/v1/kv/{query}")).await.index(), i4);
    }
    let missing = agent.get("/v1/kv/a/2").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.index(), i4);

    // A write elsewhere moves the global index (seen by missing keys) but not the prefix's.
    agent.put_true("/v1/kv/b", "b2").await;
    let i5 = modify_index(&agent.kv_entry("b").await);
    assert_eq!(kv_index(&agent).await, i5);
    assert_eq!(agent.get("/v1/kv/a/?recurse").await.index(), i4);
    assert_eq!(agent.get("/v1/kv/a/2").await.index(), i5);
    assert_eq!(agent.get("/v1/kv/a/1").await.index(), i1, "own ModifyIndex");

    // A recursive delete leaves one tombstone for the prefix: its empty listing is a 404
    // carrying the delete's index.
    agent.delete("/v1/kv/a/?recurse").await;
    let i6 = kv_index(&agent).await;
    assert!(i6 > i5);
    let gone = agent.get("/v1/kv/a/?recurse").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.index(), i6);

    // Deletes that remove nothing change nothing, not even the global index.
    for path in ["/v1/kv/nothing/?recurse", "/v1/kv/a/1", "/v1/kv/zzz?cas=7"] {
        assert_eq!(agent.delete(path).await.json(), json!(true), "{path}");
    }
    assert_eq!(kv_index(&agent).await, i6);
}

#[tokio::test]
async fn blocking_get_on_a_key_is_not_woken_by_writes_below_it() {
    // TestKVS_Issue_1626.
    let agent = Arc::new(Agent::dev().await);
    agent.put_true("/v1/kv/foo", "one").await;
    let m = modify_index(&agent.kv_entry("foo").await);

    // A long blocking read on `foo`, parked at foo's current index.
    let watcher = park(&agent, format!("/v1/kv/foo?index={m}&wait=60s"));

    // A write to `foo/bar` (a key that `foo` is a prefix of) is not a change to `foo`.
    agent.put_true("/v1/kv/foo/bar", "below").await;
    assert!(modify_index(&agent.kv_entry("foo/bar").await) > m);

    // Proof with a bounded wait: a second reader at the same index runs out its wait and sees
    // foo's index unchanged; the long reader is still parked.
    assert_waits_out(&agent, "/v1/kv/foo", m).await;
    assert!(!watcher.is_finished(), "woken by a write to foo/bar");

    // A write to `foo` itself wakes the reader with the new entry.
    agent.put_true("/v1/kv/foo", "two").await;
    let woken = woken(watcher, "a write to foo wakes the reader").await;
    assert_eq!(woken.status, StatusCode::OK);
    assert!(woken.index() > m);
    assert_eq!(woken.json()[0]["Value"], json!(b64("two")));
}

#[tokio::test]
async fn blocking_list_wakes_on_a_write_under_the_prefix_and_times_out_with_the_same_index() {
    // TestKVSEndpoint_List_Blocking.
    let agent = Arc::new(Agent::dev().await);
    agent.put_true("/v1/kv/list/a", "a").await;
    agent.put_true("/v1/kv/other", "o").await;
    let listed = agent.get("/v1/kv/list/?recurse").await;
    let index = listed.index();

    // A recurse read parked at the prefix's index wakes when a key under it is written.
    let watcher = park(
        &agent,
        format!("/v1/kv/list/?recurse&index={index}&wait=60s"),
    );
    agent.put_true("/v1/kv/list/b", "b").await;
    let woken = woken(watcher, "a write under the prefix wakes the list").await;
    assert_eq!(woken.status, StatusCode::OK);
    assert!(woken.index() > index);
    let keys: Vec<String> = woken
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["list/a", "list/b"]);

    // A blocking read with a short wait on a key nobody touches returns after the wait with the
    // same index (a 200 is not proof of a change).
    let m = modify_index(&agent.kv_entry("other").await);
    assert_waits_out(&agent, "/v1/kv/other", m).await;
}

#[tokio::test]
async fn blocking_get_on_a_missing_key_wakes_when_the_key_is_created() {
    let agent = Arc::new(Agent::dev().await);
    agent.put_true("/v1/kv/unrelated", "x").await;

    // The 404 carries the index to block on.
    let missing = agent.get("/v1/kv/later").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let index = missing.index();

    // A reader parked on the missing key gets the entry as soon as it is written.
    let watcher = park(&agent, format!("/v1/kv/later?index={index}&wait=60s"));
    agent.put_true("/v1/kv/later", "here").await;
    let woken = woken(watcher, "creating the key wakes the reader").await;
    assert_eq!(woken.status, StatusCode::OK);
    assert_eq!(woken.json()[0]["Value"], json!(b64("here")));
    assert!(woken.index() > index);
}

/// Consul gives every write its own index, and recipes order contenders by `CreateIndex`: 64
/// concurrent creates (which the leader batches into a few raft entries) get 64 distinct
/// `CreateIndex`es, and each `ModifyIndex` works as a check-and-set token for its key alone.
/// Before, a batch's ops shared its raft index (6 shared values in 64).
#[tokio::test]
async fn concurrent_writes_never_share_an_index() {
    let agent = Arc::new(Agent::dev().await);
    // Every op has an index of its own once the leader has raised the protocol level.
    integration_tests::eventually(PROMPTLY, "protocol level 2", || {
        let agent = Arc::clone(&agent);
        async move {
            let stats = agent.get("/v1/agent/self").await.json();
            (stats["Stats"]["raft"]["protocol_level"] == json!("2")).then_some(())
        }
    })
    .await;
    let writers: Vec<JoinHandle<Reply>> = (0..64)
        .map(|i| {
            let agent = Arc::clone(&agent);
            tokio::spawn(async move { agent.put(&format!("/v1/kv/idx/{i:02}"), "x").await })
        })
        .collect();
    for writer in writers {
        assert_eq!(writer.await.expect("writer").text(), "true");
    }
    let entries = agent.get("/v1/kv/idx/?recurse").await.json();
    let mut creates: Vec<u64> = entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["CreateIndex"].as_u64().expect("CreateIndex"))
        .collect();
    creates.sort_unstable();
    creates.dedup();
    assert_eq!(creates.len(), 64, "{creates:?}");

    // Each ModifyIndex is a cas token for its own key only.
    let first = &entries[0];
    let (key, index) = (first["Key"].as_str().expect("Key"), modify_index(first));
    for other in entries.as_array().expect("entries").iter().skip(1) {
        let path = format!("/v1/kv/{}?cas={index}", other["Key"].as_str().expect("Key"));
        assert_eq!(agent.put(&path, "y").await.text(), "false");
    }
    assert_eq!(
        agent
            .put(&format!("/v1/kv/{key}?cas={index}"), "y")
            .await
            .text(),
        "true"
    );
}

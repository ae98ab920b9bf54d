//! The herd without its cost, through the HTTP API: a KV `?acquire` refused because another
//! session holds the key, or because of its lock-delay, changes nothing and is answered as a
//! read on the leader, with no raft entry. Many acquirers at once: exactly one wins. Acquires
//! racing a release: never two winners. The answer to `?acquire` spares Vigil's lock client the
//! reads Consul's makes: the sequencer of a taken lock, the index to block from after a
//! refusal; and a client without them (Consul's answers) still hands the lock on.

use std::time::Duration;

use futures::future::join_all;
use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Agent, Http};
use reqwest::StatusCode;
use serde_json::json;
use vigil_client::{Client, Lock, LockOptions, ReadOpts};

const ACQUIRERS: usize = 20;
/// Rounds a measurement may take: another raft entry (a leader's duty) may land in one.
const ROUNDS: usize = 5;

/// The last index of the raft log of the server behind `http`.
async fn last_log_index(http: &Http) -> u64 {
    let reply = http.get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Stats"]["raft"]["last_log_index"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("Stats.raft.last_log_index in {}", reply.text()))
}

async fn sessions(http: &Http, n: usize, body: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(http.session(body).await);
    }
    ids
}

/// `?acquire` of `key` by each of `sessions` at once: whether each was granted.
async fn acquire_all(http: &Http, key: &str, sessions: &[String]) -> Vec<bool> {
    let tries = sessions.iter().map(|s| {
        let http = http.clone();
        let path = format!("/v1/kv/{key}?acquire={s}");
        tokio::spawn(async move {
            let reply = http.put(&path, "held").await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            reply.json() == json!(true)
        })
    });
    join_all(tries)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// Runs `refusals` (acquires that must all be refused) until a round of them leaves the raft
/// log where it was; panics if none of [`ROUNDS`] does.
async fn refused_without_raft_entries<F, Fut>(http: &Http, mut refusals: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut moved = Vec::new();
    for _ in 0..ROUNDS {
        let before = last_log_index(http).await;
        refusals().await;
        let after = last_log_index(http).await;
        if after == before {
            return;
        }
        moved.push(after - before);
    }
    panic!("refused acquires moved the raft log by {moved:?} entries");
}

#[tokio::test(flavor = "multi_thread")]
async fn of_many_acquirers_at_once_one_wins_and_the_refused_write_nothing() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let ids = sessions(&http, ACQUIRERS, "{}").await;

    // All at once: exactly one is granted, and holds the key.
    let granted = acquire_all(&http, "herd", &ids).await;
    let winners: Vec<&String> = ids
        .iter()
        .zip(&granted)
        .filter_map(|(id, won)| won.then_some(id))
        .collect();
    assert_eq!(winners.len(), 1, "{granted:?}");
    let winner = winners[0].clone();
    assert_eq!(http.holder("herd").await.as_deref(), Some(winner.as_str()));
    let entry = http.kv_entry("herd").await;

    // While it holds the key, the others are refused without a raft entry, and nothing
    // about the key changes.
    let others: Vec<String> = ids.iter().filter(|id| **id != winner).cloned().collect();
    refused_without_raft_entries(&http, || async {
        let granted = acquire_all(&http, "herd", &others).await;
        assert!(granted.iter().all(|won| !won), "{granted:?}");
    })
    .await;
    assert_eq!(http.kv_entry("herd").await, entry);

    // The holder acquiring again is a write, as in Consul: value and flags change.
    http.put_true(&format!("/v1/kv/herd?acquire={winner}&flags=7"), "again")
        .await;
    let again = http.kv_entry("herd").await;
    assert_eq!(again["Flags"], 7);
    assert!(again["ModifyIndex"].as_u64() > entry["ModifyIndex"].as_u64());
    assert_eq!(again["LockIndex"], entry["LockIndex"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_during_lock_delay_is_refused_without_a_raft_entry() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let holder = http.session(r#"{"LockDelay":"60s"}"#).await;
    let other = http.session("{}").await;
    http.acquire_ok("delayed", &holder).await;
    http.destroy_session(&holder).await;
    assert_eq!(http.holder("delayed").await, None);

    refused_without_raft_entries(&http, || async {
        let reply = http.acquire("delayed", &other).await;
        assert_eq!(reply.json(), json!(false));
        assert!(!reply.lock_delay_remaining().is_zero());
    })
    .await;
    assert_eq!(http.holder("delayed").await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn acquires_racing_a_release_never_grant_two_sessions() {
    let agent = Agent::dev().await;
    let http = agent.http();
    // No lock-delay: a release hands the key straight on.
    let ids = sessions(&http, 8, r#"{"LockDelay":"0s"}"#).await;
    let mut holder = ids[0].clone();
    http.acquire_ok("race", &holder).await;
    for round in 0..10 {
        let others: Vec<String> = ids.iter().filter(|id| **id != holder).cloned().collect();
        let release = {
            let http = http.clone();
            let path = format!("/v1/kv/race?release={holder}");
            tokio::spawn(async move { http.put(&path, "free").await })
        };
        let granted = acquire_all(&http, "race", &others).await;
        assert_eq!(release.await.unwrap().json(), json!(true), "round {round}");
        let winners: Vec<&String> = others
            .iter()
            .zip(&granted)
            .filter_map(|(id, won)| won.then_some(id))
            .collect();
        assert!(winners.len() <= 1, "round {round}: {winners:?}");
        let now = http.holder("race").await;
        assert_eq!(now.as_ref(), winners.first().copied(), "round {round}");
        holder = match now {
            Some(id) => id,
            None => {
                http.acquire_ok("race", &ids[round % ids.len()]).await;
                ids[round % ids.len()].clone()
            }
        };
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_answers_the_sequencer_and_where_to_block_without_a_read() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let client = Client::new(&agent.base).expect("client");
    let holder = http.session(r#"{"LockDelay":"0s"}"#).await;
    let other = http.session("{}").await;

    // Taken: the LockIndex granted and the key's index, as a read of the key says them.
    let taken = client.kv_acquire("k", b"v", 0, &holder).await.unwrap();
    assert!(taken.acquired);
    let entry = http.kv_entry("k").await;
    assert_eq!(taken.lock_index, entry["LockIndex"].as_u64());
    assert_eq!(taken.key_index, entry["ModifyIndex"].as_u64());
    let read = http.get("/v1/kv/k").await;
    assert_eq!(
        taken.key_index.map(|i| i.to_string()),
        read.header("X-Consul-Index")
    );

    // Refused because it is held: the index only when asked (it costs a read).
    let refused = client.kv_acquire("k", b"v", 0, &other).await.unwrap();
    assert!(!refused.acquired);
    assert_eq!((refused.lock_index, refused.key_index), (None, None));
    let refused = client
        .kv_acquire_waiting("k", b"v", 0, &other, Duration::ZERO)
        .await
        .unwrap();
    assert!(!refused.acquired);
    assert_eq!(refused.lock_index, None);
    assert_eq!(refused.lock_delay, None);
    let from = refused.key_index.expect("the index to block from");
    assert!(from >= entry["ModifyIndex"].as_u64().unwrap(), "{from}");

    // Blocking from it misses nothing: the holder's release wakes the read.
    let blocked = {
        let client = client.clone();
        tokio::spawn(async move {
            let opts = ReadOpts::blocking(from, Duration::from_secs(60));
            client.kv_get("k", opts).await.unwrap()
        })
    };
    http.release_ok("k", &holder).await;
    let (pair, meta) = tokio::time::timeout(Duration::from_secs(30), blocked)
        .await
        .expect("the release woke the blocking read")
        .unwrap();
    assert_eq!(pair.and_then(|p| p.session), None);
    assert!(meta.index > from);

    // Another session takes it, then takes it again: the same LockIndex, the key's new index.
    let again = client.kv_acquire("k", b"w", 0, &other).await.unwrap();
    assert!(again.acquired);
    let retaken = client.kv_acquire("k", b"x", 0, &other).await.unwrap();
    assert!(retaken.acquired);
    let entry = http.kv_entry("k").await;
    assert_eq!(retaken.lock_index, again.lock_index);
    assert_eq!(retaken.lock_index, entry["LockIndex"].as_u64());
    assert_eq!(retaken.key_index, entry["ModifyIndex"].as_u64());
    assert!(retaken.key_index > again.key_index);

    // Refused by lock-delay: how long it lasts, and no index (nothing to block on).
    let delayed = http.session(r#"{"LockDelay":"60s"}"#).await;
    client.kv_acquire("d", b"", 0, &delayed).await.unwrap();
    http.destroy_session(&delayed).await;
    let refused = client
        .kv_acquire_waiting("d", b"", 0, &other, Duration::ZERO)
        .await
        .unwrap();
    assert!(!refused.acquired);
    assert!(refused.lock_delay.is_some());
    assert_eq!((refused.lock_index, refused.key_index), (None, None));

    // Refused for another reason (no such session): Consul's answer, no index.
    let missing = "00000000-0000-0000-0000-000000000000";
    let reply = http.put(&format!("/v1/kv/k?acquire={missing}"), "v").await;
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    assert_eq!(reply.header("X-Vigil-Key-Index"), None);
}

/// Each of `locks` taken and released `rounds` times, all at once; never two holders at a
/// time. The `LockIndex` of every acquisition, sorted.
async fn take_turns(locks: Vec<Lock>, rounds: usize) -> Vec<u64> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let holding = Arc::new(AtomicBool::new(false));
    let contenders = locks.into_iter().map(|lock| {
        let holding = Arc::clone(&holding);
        tokio::spawn(async move {
            let mut indexes = Vec::new();
            for _ in 0..rounds {
                let held = lock.acquire().await.unwrap();
                assert!(!holding.swap(true, Ordering::SeqCst), "two holders at once");
                indexes.push(held.lock_index());
                tokio::task::yield_now().await;
                holding.store(false, Ordering::SeqCst);
                held.release().await.unwrap();
            }
            indexes
        })
    });
    let mut indexes: Vec<u64> = join_all(contenders)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    indexes.sort_unstable();
    indexes
}

/// Serves the API of the agent at `upstream` as Consul (or a Vigil agent before these headers)
/// would: requests and answers pass without any `X-Vigil-*` header. Its base URL.
async fn without_vigil_headers(upstream: String) -> String {
    use axum::body::{Body, to_bytes};
    use axum::extract::{Request, State};
    use axum::response::Response;

    async fn pass(State(upstream): State<(reqwest::Client, String)>, req: Request) -> Response {
        let (client, base) = upstream;
        let vigil = |name: &reqwest::header::HeaderName| name.as_str().starts_with("x-vigil-");
        let (parts, body) = req.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut out = client.request(parts.method, format!("{base}{path}"));
        for (name, value) in &parts.headers {
            if !vigil(name) && name != reqwest::header::HOST {
                out = out.header(name, value);
            }
        }
        let body = to_bytes(body, usize::MAX).await.unwrap();
        let answer = out.body(body).send().await.unwrap();
        let mut response = Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            if !vigil(name) {
                response = response.header(name, value);
            }
        }
        let body = answer.bytes().await.unwrap();
        response.body(Body::from(body)).unwrap()
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .fallback(pass)
        .with_state((reqwest::Client::new(), upstream));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lock_client_hands_a_lock_on_through_an_agent_without_vigils_headers() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let bare = without_vigil_headers(agent.base.clone()).await;
    let client = Client::new(&bare).expect("client");
    let session = Http::new(bare.clone()).session("{}").await;
    let taken = client
        .kv_acquire_waiting("probe", b"", 0, &session, Duration::ZERO)
        .await
        .unwrap();
    assert!(taken.acquired);
    assert_eq!(
        (taken.lock_index, taken.key_index),
        (None, None),
        "headers passed"
    );

    // Contenders that each take the lock a few times: every release wakes the others, one
    // wins, the rest are refused and (without the headers) read the key before blocking again.
    let locks = (0..4).map(|_| Lock::new(&client, LockOptions::new("bare/.lock")).unwrap());
    let indexes = take_turns(locks.collect(), 3).await;
    let last = http.kv_entry("bare/.lock").await["LockIndex"]
        .as_u64()
        .unwrap();
    let expected: Vec<u64> = (1..=last).collect();
    assert_eq!(
        indexes, expected,
        "one LockIndex per acquisition, each read right"
    );
}

/// A TCP relay to `upstream` (`http://host:port`), counting the connections it accepts.
async fn counting_relay(
    upstream: &str,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let target = upstream.trim_start_matches("http://").to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let target = target.clone();
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(&target).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    (format!("http://{addr}"), accepted)
}

/// A holder's monitor blocks on the key on a connection of its own. The release wakes that
/// read, and the monitor lets it answer instead of cutting it, so the connection serves the
/// next cycle: a lock taken and handed back over and over (let go by `release` or by a drop)
/// does not cost a connect and an accept each time.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_taken_and_let_go_over_and_over_keeps_its_connections() {
    use std::sync::atomic::Ordering;

    const CYCLES: usize = 60;
    let agent = Agent::dev().await;
    let (relay, accepted) = counting_relay(&agent.base).await;
    let client = Client::new(&relay).expect("client");
    let session = Http::new(relay.clone())
        .session(r#"{"LockDelay": "0s"}"#)
        .await;
    let mut options = LockOptions::new("kept/.lock");
    options.session.reuse = Some(session);
    let lock = Lock::new(&client, options).unwrap();
    let mut indexes = Vec::new();
    for cycle in 0..CYCLES {
        let held = lock.acquire().await.unwrap();
        indexes.push(held.lock_index());
        if cycle % 2 == 0 {
            held.release().await.unwrap();
        } else {
            // A drop releases in the background: waited for, as the session is reused.
            drop(held);
            client.drain_cleanups(Duration::from_secs(10)).await;
        }
    }
    let expected: Vec<u64> = (1..=CYCLES as u64).collect();
    assert_eq!(indexes, expected, "one grant per cycle");
    let opened = accepted.load(Ordering::SeqCst);
    assert!(
        opened <= 6,
        "{opened} connections opened for {CYCLES} lock cycles: the monitors' were closed"
    );
}

/// `PUT ?acquire` asking the agent to wait up to `wait` (a Go duration) for the key, raw.
fn waiting_acquire(
    base: &str,
    key: &str,
    session: &str,
    flags: u64,
    wait: &str,
) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .put(format!(
            "{base}/v1/kv/{key}?acquire={session}&flags={flags}"
        ))
        .header("X-Vigil-Acquire-Wait", wait)
        .header("X-Vigil-Ask-Key-Index", "true")
}

/// What a waiting acquire answered: taken or not, and Vigil's two index headers.
async fn answered(reply: reqwest::Response) -> (bool, Option<u64>, Option<u64>) {
    assert_eq!(reply.status(), StatusCode::OK);
    let index = |name: &str| {
        reply
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse().ok())
    };
    let (lock_index, key_index) = (index("X-Vigil-Lock-Index"), index("X-Vigil-Key-Index"));
    let taken: bool = reply.json().await.unwrap();
    (taken, lock_index, key_index)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_asked_to_wait_waits_in_the_agent_for_the_key() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let holder = http.session(r#"{"LockDelay":"0s"}"#).await;
    let waiter = http.session("{}").await;
    http.acquire_ok("w", &holder).await;

    // Held throughout the wait: refused at its end, not before, with where to block from.
    let asked = tokio::time::Instant::now();
    let reply = waiting_acquire(&agent.base, "w", &waiter, 0, "300ms")
        .send()
        .await
        .unwrap();
    let (taken, lock_index, key_index) = answered(reply).await;
    assert!(
        asked.elapsed() >= Duration::from_millis(300),
        "it did not wait"
    );
    assert!(!taken);
    assert_eq!(lock_index, None);
    let entry = http.kv_entry("w").await;
    assert_eq!(key_index, entry["ModifyIndex"].as_u64());
    assert_eq!(entry["Session"], json!(holder));

    // Freed during the wait: taken then, with its sequencer.
    let waiting = tokio::spawn(
        waiting_acquire(&agent.base, "w", &waiter, 0, "1m")
            .body("mine")
            .send(),
    );
    http.release_ok("w", &holder).await;
    let (taken, lock_index, _) = answered(waiting.await.unwrap().unwrap()).await;
    assert!(taken);
    let entry = http.kv_entry("w").await;
    assert_eq!(entry["Session"], json!(waiter));
    assert_eq!(lock_index, entry["LockIndex"].as_u64());
    assert_eq!(lock_index, Some(2));

    // A lock-delay is waited out in the agent too.
    let delayed = http.session(r#"{"LockDelay":"1s"}"#).await;
    let other = http.session("{}").await;
    http.acquire_ok("d", &delayed).await;
    http.destroy_session(&delayed).await;
    let reply = waiting_acquire(&agent.base, "d", &other, 0, "30s")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.headers().get("X-Vigil-Lock-Delay"), None);
    assert!(
        answered(reply).await.0,
        "taken once the lock-delay was over"
    );

    // A key used with other flags (a semaphore's, say) is not waited for: the client's
    // conflict to see. Nor is bad input accepted.
    http.put_true(&format!("/v1/kv/f?acquire={holder}&flags=7"), "")
        .await;
    let asked = tokio::time::Instant::now();
    let reply = waiting_acquire(&agent.base, "f", &waiter, 3, "1m")
        .send()
        .await
        .unwrap();
    assert!(!answered(reply).await.0);
    assert!(asked.elapsed() < Duration::from_secs(30), "it waited");
    let reply = waiting_acquire(&agent.base, "f", &waiter, 3, "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::BAD_REQUEST);
    assert_eq!(reply.text().await.unwrap(), "Invalid X-Vigil-Acquire-Wait");
}

/// A client that hangs up while its acquire waits in the agent takes the wait with it: the
/// key's next release does not hand it to a session nobody is waiting for.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_acquire_whose_client_hangs_up_takes_nothing() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let holder = http.session(r#"{"LockDelay":"0s"}"#).await;
    let waiter = http.session("{}").await;
    http.acquire_ok("h", &holder).await;

    // The client gives up after 200 ms, the agent's wait would run a minute.
    let gave_up = waiting_acquire(&agent.base, "h", &waiter, 0, "1m")
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    http.release_ok("h", &holder).await;
    let read = http.get("/v1/kv/h").await;
    let index: u64 = read.header("X-Consul-Index").unwrap().parse().unwrap();

    // Nothing takes the key after its release: a blocking read from it sees no change.
    let reply = http.get(&format!("/v1/kv/h?index={index}&wait=2s")).await;
    assert_eq!(reply.header("X-Consul-Index"), Some(index.to_string()));
    assert_eq!(http.kv_entry("h").await["Session"], serde_json::Value::Null);
}

/// Consul-style lock contenders through a Vigil agent: each waits in its acquire, so an
/// acquisition costs its own requests (the first read, the acquire, the holder's watch and its
/// release), not a read and an acquire from every waiter at every release.
#[tokio::test(flavor = "multi_thread")]
async fn lock_waiters_cost_no_requests_per_release() {
    let agent = Agent::dev().await;
    let per_acquisition = lock_requests(&agent.http(), "herd/.lock", 8, 5).await;
    assert!(
        per_acquisition <= 5.0,
        "{per_acquisition:.1} requests per acquisition"
    );
}

/// `contenders` Lock clients through `http`, each on a reused session, taking `key` `rounds`
/// times each (one LockIndex per acquisition, never two holders): the requests they sent per
/// acquisition.
async fn lock_requests(http: &Http, key: &str, contenders: usize, rounds: usize) -> f64 {
    let clients: Vec<Client> = (0..contenders)
        .map(|_| Client::new(&http.base).expect("client"))
        .collect();
    let mut locks = Vec::new();
    for client in &clients {
        let mut options = LockOptions::new(key);
        options.session.reuse = Some(create_session(http, r#"{"LockDelay":"0s"}"#).await);
        locks.push(Lock::new(client, options).unwrap());
    }
    let indexes = take_turns(locks, rounds).await;
    let expected: Vec<u64> = (1..=(contenders * rounds) as u64).collect();
    assert_eq!(indexes, expected, "one LockIndex per acquisition");
    let sent: u64 = clients.iter().map(Client::requests_sent).sum();
    sent as f64 / (contenders * rounds) as f64
}

/// One agent's waiting acquires of a key take turns, and a turn never outlives its request: a
/// waiter behind another still answers at the end of its own wait, and the one behind a
/// client that hung up gets the key at the next release.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_behind_another_is_not_held_up_by_it() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let holder = http.session(r#"{"LockDelay":"0s"}"#).await;
    let (first, second) = (http.session("{}").await, http.session("{}").await);
    http.acquire_ok("t", &holder).await;

    // The first waits long and gives up (its client's timeout); while it waits, the second's
    // short wait ends with a refusal on time, queued or not.
    let gives_up = tokio::spawn(
        waiting_acquire(&agent.base, "t", &first, 0, "1m")
            .timeout(Duration::from_secs(2))
            .send(),
    );
    let asked = tokio::time::Instant::now();
    let reply = waiting_acquire(&agent.base, "t", &second, 0, "300ms")
        .send()
        .await
        .unwrap();
    let (taken, _, key_index) = answered(reply).await;
    assert!(!taken);
    assert!(asked.elapsed() >= Duration::from_millis(300));
    assert!(key_index.is_some());
    assert!(gives_up.await.unwrap().is_err_and(|e| e.is_timeout()));

    // The second waits again; the first's turn went with its client: the release hands the
    // key to the second.
    let waiting = tokio::spawn(waiting_acquire(&agent.base, "t", &second, 0, "1m").send());
    http.release_ok("t", &holder).await;
    let reply = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter got the key at the release")
        .unwrap()
        .unwrap();
    assert!(answered(reply).await.0);
    assert_eq!(http.kv_entry("t").await["Session"], json!(second));
}

/// Through a client agent, whose reads and writes go to the servers over RPC, the waiters of a
/// Consul-style lock wait in their acquires too.
#[tokio::test(flavor = "multi_thread")]
async fn lock_waiters_on_a_client_agent_wait_in_it() {
    let cluster = Cluster::servers(3).clients(1).start().await;
    let per_acquisition = lock_requests(&cluster.client(0).http(), "remote/.lock", 4, 3).await;
    assert!(
        per_acquisition <= 5.0,
        "{per_acquisition:.1} requests per acquisition"
    );
}

/// A client that gives up its waiting acquire and asks again at once, and the same session
/// waiting twice: the release grants the key once, and both of the session's waits answer it
/// with the one LockIndex (a session acquiring what it holds, as Consul answers it).
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_dropped_and_asked_again_at_once_by_the_same_session_is_one_grant() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let holder = http.session(r#"{"LockDelay":"0s"}"#).await;
    let waiter = http.session("{}").await;
    http.acquire_ok("r", &holder).await;

    let dropped = waiting_acquire(&agent.base, "r", &waiter, 0, "1m")
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(dropped.is_err_and(|e| e.is_timeout()));
    let again = || tokio::spawn(waiting_acquire(&agent.base, "r", &waiter, 0, "1m").send());
    let (first, second) = (again(), again());
    http.release_ok("r", &holder).await;
    for waiting in [first, second] {
        let reply = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("answered after the release")
            .unwrap()
            .unwrap();
        let (taken, lock_index, _) = answered(reply).await;
        assert!(taken);
        assert_eq!(lock_index, Some(2), "one grant after the holder's");
    }
    let entry = http.kv_entry("r").await;
    assert_eq!(entry["Session"], json!(waiter));
    assert_eq!(entry["LockIndex"], json!(2));
}

//! No client can exhaust a server: 1,100 idle HTTP connections against a server whose open file
//! limit is 1024 leave it answering and alive (it raises its soft limit to the hard one, caps
//! its HTTP connections below it and closes the longest-idle one to make room), and 16 RPC
//! frames each announcing 64 MiB and half sent leave its memory within 64 MiB of idle.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Http, eventually};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_shared::rpc::calls::{RpcRequest, RpcResponse};
use vigil_wire::tls::Role;
use vigil_wire::transport::{FRAME_VERSION, MAX_FRAME_LEN, client_endpoint};

use crate::common::{PROMPT, exclusive, raise_open_files};

/// Idle connections held against the server, from [`SOURCES`] loopback addresses (each under
/// the per-client cap of 200).
const IDLE_CONNECTIONS: usize = 1100;
const SOURCES: usize = 6;
/// Half-sent frames, each announcing the largest frame there is.
const STALLED_FRAMES: usize = 16;
const MIB: u64 = 1024 * 1024;

/// `/proc/<pid>/status`'s `VmRSS`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS in kB")
        * 1024
}

/// The soft and hard `Max open files` of process `pid`.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let mut numbers = line.split_whitespace().filter_map(|w| w.parse().ok());
    (numbers.next().expect("soft"), numbers.next().expect("hard"))
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list descriptors")
        .count()
}

/// A counter's sum in `/v1/agent/metrics`, by name and labels.
fn counter(metrics: &Value, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics["Counters"]
        .as_array()
        .and_then(|counters| {
            counters.iter().find_map(|m| {
                let matches = m["Name"] == name
                    && labels
                        .iter()
                        .all(|(k, v)| m["Labels"][*k].as_str() == Some(*v));
                matches.then(|| m["Sum"].as_f64().unwrap_or(0.0))
            })
        })
        .unwrap_or(0.0)
}

/// Holds one idle connection from `source` to `target`, opening it again whenever the server
/// closes it, until `stop`; counts connections established.
async fn hold_idle(
    source: [u8; 4],
    target: SocketAddr,
    opened: Arc<AtomicUsize>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::from((source, 0)))
            .expect("bind a loopback address");
        // A connect whose SYN the full accept queue dropped is retried by the kernel for
        // minutes: it must not outlive the test.
        let connected = tokio::select! {
            connected = socket.connect(target) => connected,
            () = stop.cancelled() => return,
        };
        if let Ok(mut stream) = connected {
            opened.fetch_add(1, Ordering::Relaxed);
            let mut byte = [0; 1];
            tokio::select! {
                _ = stream.read(&mut byte) => {}
                () = stop.cancelled() => return,
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A write through `http` answered `true`, retried while the connection it went on is closed
/// under it.
async fn write(http: &Http, key: &str) {
    eventually(PROMPT, &format!("a write of {key}"), || async {
        let reply = http
            .try_request(Method::PUT, &format!("/v1/kv/{key}"), Some(b"v".to_vec()))
            .await
            .ok()?;
        (reply.status == StatusCode::OK && reply.text() == "true").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_past_the_descriptor_limit_leave_the_server_answering() {
    let _heavy = exclusive().await;
    raise_open_files();
    // Phase 1: one server started with a soft open file limit of 512 and a hard one of 1024;
    // it raises the soft one.
    let mut cluster = Cluster::servers(1)
        .server_open_file_limit(512, 1024)
        .start()
        .await;
    let http = cluster.server(0).http();
    let pid = cluster.server(0).pid().expect("the server's pid");
    assert_eq!(open_file_limits(pid), (1024, 1024));
    write(&http, "before").await;

    // Phase 2: 1,100 idle connections, each opened again whenever the server closes it.
    let target: SocketAddr = http
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("the HTTP address");
    let opened = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let holders: Vec<_> = (0..IDLE_CONNECTIONS)
        .map(|i| {
            let source = [127, 0, 0, 2 + (i % SOURCES) as u8];
            tokio::spawn(hold_idle(source, target, Arc::clone(&opened), stop.clone()))
        })
        .collect();
    eventually(PROMPT, "every idle connection opened", || async {
        (opened.load(Ordering::Relaxed) >= IDLE_CONNECTIONS).then_some(())
    })
    .await;

    // The kernel completes a connection before the server accepts it: wait until the server
    // has taken connections past its cap, closing idle ones to make room.
    eventually(PROMPT, "an idle connection closed to make room", || async {
        let reply = http.try_get("/v1/agent/metrics").await?;
        let metrics = (reply.status == StatusCode::OK).then(|| reply.json())?;
        let evicted = counter(
            &metrics,
            "vigil.http.connections_shed",
            &[("reason", "evicted_idle")],
        );
        (evicted > 0.0).then_some(())
    })
    .await;

    // Phase 3: under that pressure the server answers reads and writes and keeps a reserve of
    // descriptors for raft and its files.
    for n in 0..20 {
        write(&http, &format!("during/{n}")).await;
    }
    let reply = eventually(PROMPT, "a read", || async {
        http.try_get("/v1/kv/before?raw").await
    })
    .await;
    assert_eq!(reply.text(), "v");
    let descriptors = open_descriptors(pid);
    assert!(descriptors < 1024 - 128, "{descriptors} descriptors open");

    // Phase 4: the holders stop; the server is alive and serves as before.
    stop.cancel();
    for holder in holders {
        holder.await.expect("holder task");
    }
    assert!(cluster.exited(0).is_none(), "the server exited");
    write(&http, "after").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn half_sent_frames_of_64_mib_leave_memory_within_64_mib_of_idle() {
    let _heavy = exclusive().await;
    // Phase 1: one server, warmed up; its idle memory.
    let cluster = Cluster::servers(1).start().await;
    let server = cluster.server(0);
    let pid = server.pid().expect("the server's pid");
    for n in 0..10 {
        server.put_key(&format!("warm/{n}"), "v").await;
    }
    let idle = rss(pid);

    // Phase 2: a client certificate opens 16 streams on one connection, announces a 64 MiB
    // request on each and sends half of it.
    let tls = cluster.tls_material(Role::Client, "slow");
    let endpoint = client_endpoint(&tls).expect("an endpoint");
    let connection = endpoint
        .connect(cluster.server_rpc(0), tls.server_name())
        .expect("dial")
        .await
        .expect("connect");
    let sent = Arc::new(AtomicU64::new(0));
    let len = u32::try_from(MAX_FRAME_LEN).expect("fits");
    let writers: Vec<_> = (0..STALLED_FRAMES)
        .map(|_| {
            let connection = connection.clone();
            let sent = Arc::clone(&sent);
            tokio::spawn(async move {
                let (mut send, _recv) = connection.open_bi().await.expect("a stream");
                let mut header = vec![FRAME_VERSION];
                header.extend_from_slice(&len.to_be_bytes());
                send.write_all(&header).await.expect("the header");
                let piece = vec![0x5a; MIB as usize];
                for _ in 0..MAX_FRAME_LEN as u64 / MIB / 2 {
                    if send.write_all(&piece).await.is_err() {
                        return;
                    }
                    sent.fetch_add(MIB, Ordering::Relaxed);
                }
                // Half sent: hold the stream open, never finishing the frame.
                std::future::pending::<()>().await;
            })
        })
        .collect();

    // Phase 3: until the senders stall (nothing more accepted for 3 s), the server's memory
    // stays within 64 MiB of idle, though it took at least one half frame.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut peak = idle;
    let (mut last, mut moved) = (0, Instant::now());
    while moved.elapsed() < Duration::from_secs(3) {
        assert!(Instant::now() < deadline, "the senders never stalled");
        peak = peak.max(rss(pid));
        let now = sent.load(Ordering::Relaxed);
        if now != last {
            (last, moved) = (now, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    peak = peak.max(rss(pid));
    println!(
        "RSS idle {} MiB, peak {} MiB; {} MiB sent",
        idle / MIB,
        peak / MIB,
        last / MIB
    );
    assert!(
        last >= MAX_FRAME_LEN as u64 / 2,
        "only {last} bytes were sent"
    );
    assert!(
        peak <= idle + 64 * MIB,
        "RSS went from {idle} to {peak} bytes"
    );

    // Phase 4: meanwhile the server answers HTTP, and RPC from another client.
    let leader = server.get("/v1/status/leader").await;
    assert_eq!(leader.status, StatusCode::OK);
    let probe = cluster.rpc_client(Role::Client, "probe");
    let status = probe
        .call_typed::<RpcRequest, RpcResponse>(
            cluster.server_rpc(0),
            &RpcRequest::Status {},
            PROMPT,
        )
        .await
        .expect("an RPC answer");
    assert!(matches!(status, RpcResponse::Status(_)), "{status:?}");
    for writer in writers {
        writer.abort();
    }
}

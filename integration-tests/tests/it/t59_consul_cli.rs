//! `vigil lock` and `vigil kv import` run with `consul lock`'s and `consul kv import`'s command
//! lines: Go's single-dash flags, the command after the prefix run through a shell, `-shell=false`,
//! `-child-exit-code`, `-pass-stdin`, `-try`; the coordination key deleted on exit unless another
//! holder still uses it (so a prefix once locked with `-n 1` can be a semaphore later); `-token`
//! sent as `X-Consul-Token`; and an export imported back.

use std::process::{Output, Stdio};

use integration_tests::{Agent, binary, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, Command};

use crate::common::{PROMPT, exit_code};

/// `vigil <args>` against `agent`.
fn vigil(agent: &Agent, args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env("CONSUL_HTTP_ADDR", &agent.base)
        .env_remove("VIGIL_HTTP_ADDR")
        .env("SHELL", "/bin/sh")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `vigil <args>` to the end, feeding it `stdin`.
async fn run(agent: &Agent, args: &[&str], stdin: &str) -> Output {
    let mut child = vigil(agent, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vigil");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("write stdin");
    drop(input);
    tokio::time::timeout(PROMPT, child.wait_with_output())
        .await
        .expect("vigil did not exit in time")
        .expect("wait for vigil")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Starts `vigil lock <args>` and waits until it holds the lock on `prefix` (its coordination
/// key exists: only a holder writes it).
async fn holder(agent: &Agent, args: &[&str], prefix: &str) -> Child {
    let child = vigil(agent, args).spawn().expect("spawn vigil lock");
    eventually(PROMPT, "the holder to hold the lock", || async {
        exists(agent, &format!("{prefix}/.lock"))
            .await
            .then_some(())
    })
    .await;
    child
}

async fn exists(agent: &Agent, key: &str) -> bool {
    let status = agent.get(&format!("/v1/kv/{key}")).await.status;
    assert!(
        matches!(status, StatusCode::OK | StatusCode::NOT_FOUND),
        "{key}: {status}"
    );
    status == StatusCode::OK
}

/// SIGTERMs a lock holder and waits for it to exit as its shell does on the signal (143).
async fn terminate(holder: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(holder.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(exit_code(holder).await, 143);
}

#[tokio::test]
async fn consul_lock_command_lines_run_as_consul_runs_them() {
    let agent = Agent::dev().await;

    // Consul's form: the words after the prefix are one shell script, with CONSUL_LOCK_HELD.
    let out = run(
        &agent,
        &[
            "lock",
            "-verbose",
            "jobs",
            "echo",
            "held=$CONSUL_LOCK_HELD;",
            "exit",
            "0",
        ],
        "",
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "held=true\n");

    // The lock's key is gone once the command is done, so the prefix can be a semaphore now.
    assert!(!exists(&agent, "jobs/.lock").await);
    let out = run(&agent, &["lock", "-n=2", "jobs", "echo", "two"], "").await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "two\n");
    assert!(!exists(&agent, "jobs/.lock").await);

    // -shell=false runs the words as they are; a failure keeps its status, or is Consul's 2
    // with -child-exit-code.
    for (args, code) in [
        (&["lock", "-shell=false", "jobs", "sh", "-c", "exit 3"], 3),
        (
            &["lock", "-child-exit-code", "-name", "job", "jobs", "exit 3"],
            2,
        ),
    ] {
        let out = run(&agent, args, "").await;
        assert_eq!(out.status.code(), Some(code), "{out:?}");
    }

    // The command reads stdin only with -pass-stdin.
    let out = run(&agent, &["lock", "jobs", "cat"], "input\n").await;
    assert_eq!(stdout(&out), "");
    let out = run(&agent, &["lock", "-pass-stdin", "jobs", "cat"], "input\n").await;
    assert_eq!(stdout(&out), "input\n");
}

#[tokio::test]
async fn the_coordination_key_outlives_only_its_last_user() {
    let agent = Agent::dev().await;

    // While one holds the lock, -try gives up (Vigil's 124) and leaves the key to the holder.
    let mut first = holder(
        &agent,
        &["lock", "-monitor-retry=3", "mx", "sleep 60"],
        "mx",
    )
    .await;
    let out = run(&agent, &["lock", "-try=300ms", "mx", "true"], "").await;
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(exists(&agent, "mx/.lock").await);
    // A semaphore on a prefix held as a lock is Consul's conflict.
    let out = run(&agent, &["lock", "-n", "2", "mx", "true"], "").await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Existing key does not match semaphore use"),
        "{out:?}"
    );

    // The holder stopped: the key is deleted with it.
    terminate(&mut first).await;
    assert!(!exists(&agent, "mx/.lock").await);

    // A semaphore holder that leaves while another holds keeps `.lock`; the last one deletes it.
    let mut first = holder(&agent, &["lock", "-n=2", "sem", "sleep 60"], "sem").await;
    let out = run(&agent, &["lock", "-n=2", "sem", "true"], "").await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let lock = agent.get("/v1/kv/sem/.lock").await;
    assert_eq!(lock.status, StatusCode::OK);
    terminate(&mut first).await;
    assert!(!exists(&agent, "sem/.lock").await);
    let left = agent.get("/v1/kv/sem?recurse").await;
    assert_eq!(left.status, StatusCode::NOT_FOUND, "{}", left.text());
}

#[tokio::test]
async fn kv_import_reads_back_an_export() {
    let agent = Agent::dev().await;

    // Entries with flags, an empty value and binary data.
    for (key, value, flags) in [
        ("app/a", &b"one"[..], 0),
        ("app/b", b"", 42),
        ("app/c", b"\xff\x00", 7),
    ] {
        let reply = agent
            .put(&format!("/v1/kv/{key}?flags={flags}"), value.to_vec())
            .await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let export = run(&agent, &["kv", "export", "app/"], "").await;
    assert_eq!(export.status.code(), Some(0), "{export:?}");
    let exported: Value = serde_json::from_slice(&export.stdout).expect("export JSON");
    assert_eq!(
        exported[1],
        json!({"key": "app/b", "flags": 42, "value": ""})
    );

    // Imported from stdin under another prefix, and from a file in place.
    let out = run(
        &agent,
        &["kv", "import", "--prefix", "copy", "-"],
        &stdout(&export),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        stdout(&out),
        "Imported: copy/app/a\nImported: copy/app/b\nImported: copy/app/c\n"
    );
    assert_eq!(
        agent.delete("/v1/kv/app?recurse").await.status,
        StatusCode::OK
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("export.json");
    std::fs::write(&file, &export.stdout).expect("write the export");
    let out = run(
        &agent,
        &["kv", "import", &format!("@{}", file.display())],
        "",
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // Both read back as exported.
    let again = run(&agent, &["kv", "export", "app/"], "").await;
    assert_eq!(again.stdout, export.stdout);
    let copy: Value =
        serde_json::from_slice(&run(&agent, &["kv", "export", "copy/"], "").await.stdout)
            .expect("export JSON");
    assert_eq!(
        copy[2],
        json!({"key": "copy/app/c", "flags": 7, "value": "/wA="})
    );

    // Not JSON: an error, nothing written.
    let out = run(&agent, &["kv", "import", "{nope"], "").await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[tokio::test]
async fn the_token_goes_to_the_agent_as_consuls_header() {
    // A stand-in agent that records the request's headers and answers 404.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let served = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.expect("accept");
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::io::AsyncReadExt::read(&mut conn, &mut buf)
                .await
                .expect("read");
            assert!(n > 0, "connection closed before the headers ended");
            request.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await
            .expect("answer");
        String::from_utf8_lossy(&request).to_lowercase()
    });

    // `-token` with Consul's spelling, on `vigil lock`'s command line.
    let mut child = Command::new(binary())
        .args([
            "lock",
            "-token=s3cret",
            "-http-addr",
            &addr,
            "-try=1s",
            "jobs",
            "true",
        ])
        .env_remove("CONSUL_HTTP_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn vigil lock");
    let request = tokio::time::timeout(PROMPT, served)
        .await
        .expect("a request in time")
        .expect("the stand-in agent");
    assert!(
        request.contains("\r\nx-consul-token: s3cret\r\n"),
        "{request}"
    );
    child.kill().await.expect("stop vigil lock");
}

#[tokio::test]
async fn watch_prints_once_or_runs_its_handler_on_every_change() {
    let agent = Agent::dev().await;
    agent.put("/v1/kv/w/a", "one").await;

    // Without a handler: the data once, as JSON (a key watch gives the pair itself).
    let out = run(&agent, &["watch", "-type=key", "-key", "w/a"], "").await;
    assert!(out.status.success(), "{out:?}");
    let pair: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(pair["Key"], json!("w/a"));
    assert_eq!(pair["Value"], json!("b25l"));
    let out = run(&agent, &["watch", "-type=key", "-key=w/none"], "").await;
    assert_eq!(stdout(&out).trim(), "null");
    let out = run(&agent, &["watch", "-type=nodes"], "").await;
    let nodes: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(nodes[0]["Node"], json!("test-node"));

    // With a handler: once at start, then once per change, each with the data on stdin and
    // CONSUL_INDEX set; a write that changes nothing under the prefix runs nothing. A run
    // appends in several writes, so the test counts only runs whose closing line is written.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("calls");
    let handler = format!(
        "(echo \"index=$CONSUL_INDEX\"; cat; echo \"end of run\") >> {}",
        log.display()
    );
    let _watch = vigil(
        &agent,
        &["watch", "-type=keyprefix", "-prefix", "w/", &handler],
    )
    .spawn()
    .expect("spawn vigil watch");
    let calls = |n: usize| {
        let log = log.clone();
        async move {
            eventually(PROMPT, "the handler's runs", || async {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                (text.matches("end of run").count() == n).then_some(text)
            })
            .await
        }
    };
    let first = calls(1).await;
    assert!(first.contains("\"w/a\""), "{first}");
    agent.put("/v1/kv/w/b", "two").await;
    let second = calls(2).await;
    assert!(second.contains("\"w/b\""), "{second}");
    agent.put("/v1/kv/other", "x").await;
    agent.put("/v1/kv/w/b", "three").await;
    let third = calls(3).await;
    assert!(third.contains("dGhyZWU="), "{third}");
}

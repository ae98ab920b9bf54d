//! The HTTP API over HTTPS (`--https-addr`) with the agent's certificate from `vigil tls`:
//! curl, py-consul and the `vigil` CLI (through `CONSUL_HTTP_SSL`, `CONSUL_CACERT`,
//! `CONSUL_CLIENT_CERT`/`KEY` and `https://` addresses) reach it; `--verify-incoming-https`
//! refuses a client without a CA-signed certificate at the handshake; `--http-addr off` serves
//! no plain HTTP. The token reaches the agent as `X-Consul-Token` from `--token`,
//! `VIGIL_HTTP_TOKEN` or `CONSUL_HTTP_TOKEN`, and never the logs; key files are private.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use integration_tests::{Agent, binary, eventually, python_with_py_consul};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;

use crate::common::PROMPT;

/// Every environment variable the client reads, removed so the runner's own cannot leak in.
const CLIENT_ENV: [&str; 14] = [
    "VIGIL_HTTP_ADDR",
    "CONSUL_HTTP_ADDR",
    "VIGIL_HTTP_SSL",
    "CONSUL_HTTP_SSL",
    "VIGIL_CACERT",
    "CONSUL_CACERT",
    "VIGIL_CLIENT_CERT",
    "CONSUL_CLIENT_CERT",
    "VIGIL_CLIENT_KEY",
    "CONSUL_CLIENT_KEY",
    "VIGIL_HTTP_TOKEN",
    "CONSUL_HTTP_TOKEN",
    "VIGIL_HTTP_TOKEN_FILE",
    "CONSUL_HTTP_TOKEN_FILE",
];

/// A CA and, signed by it, a server certificate (names 127.0.0.1) and a client certificate,
/// as `vigil tls` writes them.
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn create() -> Certs {
        let dir = tempfile::tempdir().expect("temp dir");
        for args in [
            &["tls", "ca", "create"][..],
            &["tls", "cert", "create", "--server"],
            &["tls", "cert", "create", "--client"],
        ] {
            let out = std::process::Command::new(binary())
                .current_dir(dir.path())
                .args(args)
                .output()
                .expect("run vigil tls");
            assert!(out.status.success(), "vigil {args:?}: {out:?}");
        }
        Certs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ca(&self) -> PathBuf {
        self.path("vigil-agent-ca.pem")
    }

    fn client(&self) -> (PathBuf, PathBuf) {
        (
            self.path("dc1-client-vigil-0.pem"),
            self.path("dc1-client-vigil-0-key.pem"),
        )
    }

    /// The agent flags that give it the server certificate.
    fn agent_args(&self) -> Vec<String> {
        let arg = |name: &str| self.path(name).display().to_string();
        vec![
            "--ca-file".into(),
            arg("vigil-agent-ca.pem"),
            "--cert-file".into(),
            arg("dc1-server-vigil-0.pem"),
            "--key-file".into(),
            arg("dc1-server-vigil-0-key.pem"),
        ]
    }
}

/// A dev agent with the certificates, HTTPS on a free port and `extra` flags.
async fn https_agent(certs: &Certs, extra: &[&str]) -> Agent {
    let mut args: Vec<String> = ["agent", "--dev", "--node", "tls-node"]
        .iter()
        .chain(&["--rpc-addr", "127.0.0.1:0", "--serf-addr", "127.0.0.1:0"])
        .chain(&["--gossip-profile", "local", "--log-level", "warn"])
        .chain(&["--https-addr", "127.0.0.1:0"])
        .map(|s| (*s).to_owned())
        .collect();
    args.extend(certs.agent_args());
    if !extra.contains(&"--http-addr") {
        args.extend(["--http-addr".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let agent = Agent::spawn(args, None).await;
    assert!(agent.https_addr.is_some(), "the ready line names https=");
    agent
}

fn https_addr(agent: &Agent) -> String {
    agent.https_addr.clone().expect("an HTTPS address")
}

/// `curl -s` of `url` with `args`; its output (the body) when it succeeds.
async fn curl(url: &str, args: &[&Path], flags: &[&str]) -> Output {
    let mut command = Command::new("curl");
    command.args(["-sS", "--max-time", "20"]).args(flags);
    for pair in args.chunks(2) {
        command.arg(pair[0]).arg(pair[1]);
    }
    tokio::time::timeout(PROMPT, command.arg(url).output())
        .await
        .expect("curl finished in time")
        .expect("run curl")
}

/// Runs a py-consul snippet; `Ok(stdout)` or `Err(stderr)`.
async fn py_consul(code: &str, args: &[&str]) -> Result<String, String> {
    let output = python_with_py_consul(&[&["-c", code], args].concat(), PROMPT).await;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// py-consul over HTTPS: put a key, read it back. argv: host port ca [cert key].
const PY_HTTPS_KV: &str = r#"
import sys, consul
host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cert = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else None
c = consul.Consul(host=host, port=port, scheme="https", verify=ca, cert=cert)
assert c.kv.put("py/https", "over tls")
_, item = c.kv.get("py/https")
assert item["Value"] == b"over tls", item
print("py-consul ok")
"#;

/// `vigil <args>` with only the environment `env` for the client.
async fn vigil(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary());
    command.args(args);
    for name in CLIENT_ENV {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    tokio::time::timeout(
        PROMPT,
        command.stdin(Stdio::null()).kill_on_drop(true).output(),
    )
    .await
    .expect("vigil finished in time")
    .expect("run vigil")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn https_serves_the_api_to_curl_py_consul_and_the_cli() {
    let certs = Certs::create();
    let agent = https_agent(&certs, &[]).await;
    let https = https_addr(&agent);
    let ca = certs.ca();

    // curl trusts the agent's certificate through the CA; without it, it refuses the server.
    let out = curl(
        &format!("https://{https}/v1/status/leader"),
        &[Path::new("--cacert"), &ca],
        &[],
    )
    .await;
    assert!(out.status.success(), "curl: {}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with('"'), "{}", text(&out.stdout));
    let untrusted = curl(&format!("https://{https}/v1/status/leader"), &[], &[]).await;
    assert!(!untrusted.status.success(), "curl trusted an unknown CA");

    // Plain HTTP is still served beside it, and /v1/agent/self reports both ports.
    let me = agent.get("/v1/agent/self").await.json();
    let port = |addr: &str| addr.rsplit_once(':').unwrap().1.parse::<i64>().unwrap();
    assert_eq!(me["DebugConfig"]["HTTPSPort"], port(&https));
    assert_eq!(
        me["DebugConfig"]["HTTPPort"],
        port(agent.base.trim_start_matches("http://"))
    );

    // py-consul with scheme="https" and verify=<ca>, with and without a client certificate
    // (this agent does not ask for one).
    let (host, py_port) = https.rsplit_once(':').unwrap();
    let ca_arg = ca.display().to_string();
    let out = py_consul(PY_HTTPS_KV, &[host, py_port, &ca_arg]).await;
    assert!(
        out.as_ref().is_ok_and(|o| o.contains("py-consul ok")),
        "{out:?}"
    );
    let (cert, key) = certs.client();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let out = py_consul(PY_HTTPS_KV, &[host, py_port, &ca_arg, &cert, &key]).await;
    assert!(
        out.as_ref().is_ok_and(|o| o.contains("py-consul ok")),
        "{out:?}"
    );

    // The CLI: CONSUL_HTTP_SSL turns a bare address into https; an https:// address needs no
    // switch; VIGIL_ spellings win over CONSUL_ ones.
    let put = vigil(
        &["kv", "put", "cli/https", "via env"],
        &[
            ("CONSUL_HTTP_ADDR", &https),
            ("CONSUL_HTTP_SSL", "true"),
            ("CONSUL_CACERT", &ca_arg),
        ],
    )
    .await;
    assert!(put.status.success(), "kv put: {}", text(&put.stderr));
    let url = format!("https://{https}");
    let get = vigil(
        &["kv", "get", "cli/https"],
        &[
            ("CONSUL_HTTP_ADDR", "127.0.0.1:1"),
            ("VIGIL_HTTP_ADDR", &url),
            ("CONSUL_CACERT", "/nonexistent/ca.pem"),
            ("VIGIL_CACERT", &ca_arg),
        ],
    )
    .await;
    assert!(get.status.success(), "kv get: {}", text(&get.stderr));
    assert_eq!(text(&get.stdout).trim(), "via env");
    // Commands that stream raw answers go through the same client.
    let info = vigil(&["info", "--http-addr", &url, "--ca-file", &ca_arg], &[]).await;
    assert!(info.status.success(), "info: {}", text(&info.stderr));
    assert!(
        text(&info.stdout).contains("https_addr = "),
        "{}",
        text(&info.stdout)
    );

    // HTTPS without the CA is refused with the reason, not sent in the clear.
    let no_ca = vigil(&["kv", "get", "cli/https"], &[("CONSUL_HTTP_ADDR", &url)]).await;
    assert_eq!(no_ca.status.code(), Some(1));
    assert!(
        text(&no_ca.stderr).contains("CONSUL_CACERT"),
        "{}",
        text(&no_ca.stderr)
    );
}

#[tokio::test]
async fn verify_incoming_https_refuses_clients_without_a_certificate_and_http_can_be_off() {
    let certs = Certs::create();
    // A port the config file asks plain HTTP to use, held by this test all along: the agent
    // starts only because `--http-addr off` wins and it never binds it.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let held_addr = held.local_addr().expect("address");
    let config = certs.path("agent.toml");
    std::fs::write(&config, format!("http_addr = \"{held_addr}\"\n")).expect("config");
    let config_arg = config.display().to_string();
    let agent = https_agent(
        &certs,
        &[
            "--verify-incoming-https",
            "--http-addr",
            "off",
            "--config",
            &config_arg,
        ],
    )
    .await;
    let https = https_addr(&agent);
    let ca = certs.ca();
    let (cert, key) = certs.client();
    let url = format!("https://{https}/v1/agent/self");

    // Without a client certificate the handshake fails; with one signed by the CA it works.
    let refused = curl(&url, &[Path::new("--cacert"), &ca], &[]).await;
    assert!(
        !refused.status.success(),
        "served a client without a certificate"
    );
    let out = curl(
        &url,
        &[
            Path::new("--cacert"),
            &ca,
            Path::new("--cert"),
            &cert,
            Path::new("--key"),
            &key,
        ],
        &[],
    )
    .await;
    assert!(out.status.success(), "curl: {}", text(&out.stderr));
    let me: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(me["DebugConfig"]["HTTPPort"], -1, "plain HTTP reported off");

    // Plain HTTP is off: nothing listens where the config file asked for it.
    drop(held);
    assert!(
        std::net::TcpStream::connect_timeout(&held_addr, Duration::from_secs(5)).is_err(),
        "something serves plain HTTP on {held_addr}"
    );

    // py-consul: refused without a certificate, served with one.
    let (host, port) = https.rsplit_once(':').unwrap();
    let ca_arg = ca.display().to_string();
    let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
    let refused = py_consul(PY_HTTPS_KV, &[host, port, &ca_arg]).await;
    let refusal = refused.expect_err("py-consul served without a certificate");
    assert!(refusal.to_lowercase().contains("ssl"), "{refusal}");
    let out = py_consul(PY_HTTPS_KV, &[host, port, &ca_arg, &cert_arg, &key_arg]).await;
    assert!(
        out.as_ref().is_ok_and(|o| o.contains("py-consul ok")),
        "{out:?}"
    );

    // The CLI with CONSUL_CLIENT_CERT/KEY; without them it fails.
    let env = [
        ("CONSUL_HTTP_ADDR", https.as_str()),
        ("CONSUL_HTTP_SSL", "1"),
        ("CONSUL_CACERT", ca_arg.as_str()),
        ("CONSUL_CLIENT_CERT", cert_arg.as_str()),
        ("CONSUL_CLIENT_KEY", key_arg.as_str()),
    ];
    let put = vigil(&["kv", "put", "mtls/k", "v"], &env).await;
    assert!(put.status.success(), "kv put: {}", text(&put.stderr));
    let members = vigil(&["members"], &env).await;
    assert!(
        members.status.success(),
        "members: {}",
        text(&members.stderr)
    );
    assert!(
        text(&members.stdout).contains("tls-node"),
        "{}",
        text(&members.stdout)
    );
    let without = vigil(&["kv", "get", "mtls/k"], &env[..3]).await;
    assert_eq!(without.status.code(), Some(1), "{without:?}");
}

/// A stand-in agent: answers `count` requests with 200 `{}` and returns each request's head,
/// lowercased.
async fn recording_agent(count: usize) -> (String, tokio::task::JoinHandle<Vec<String>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let served = tokio::spawn(async move {
        let mut heads = Vec::new();
        for _ in 0..count {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.expect("read");
                assert!(n > 0, "connection closed before the headers ended");
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                .await
                .expect("answer");
            heads.push(String::from_utf8_lossy(&request).to_lowercase());
        }
        heads
    });
    (addr, served)
}

#[tokio::test]
async fn the_token_comes_from_the_flag_then_vigil_then_consul_and_is_never_logged() {
    let (addr, served) = recording_agent(3).await;
    let secret = |name: &str| format!("s3cret-{name}");
    let (flag, vigil_token, consul_token) = (secret("flag"), secret("vigil"), secret("consul"));

    // VIGIL_HTTP_TOKEN wins over CONSUL_HTTP_TOKEN; --token over both; commands that make raw
    // requests (reload) send it too. RUST_LOG=trace: nothing may print it.
    let both = [
        ("CONSUL_HTTP_ADDR", addr.as_str()),
        ("CONSUL_HTTP_TOKEN", consul_token.as_str()),
        ("VIGIL_HTTP_TOKEN", vigil_token.as_str()),
        ("RUST_LOG", "trace"),
    ];
    let mut outputs = vec![vigil(&["reload"], &both).await];
    outputs.push(vigil(&["kv", "get", "x"], &both[..2]).await);
    outputs.push(vigil(&["reload", "--token", &flag], &both).await);
    let heads = tokio::time::timeout(PROMPT, served)
        .await
        .expect("three requests in time")
        .expect("the stand-in agent");
    for (head, token) in heads.iter().zip([&vigil_token, &consul_token, &flag]) {
        assert!(
            head.contains(&format!("\r\nx-consul-token: {token}\r\n")),
            "{head}"
        );
    }
    for out in &outputs {
        let printed = format!("{}{}", text(&out.stdout), text(&out.stderr));
        for token in [&flag, &vigil_token, &consul_token] {
            assert!(
                !printed.contains(token.as_str()),
                "token printed: {printed}"
            );
        }
    }
}

#[cfg(unix)]
#[tokio::test]
async fn key_files_are_private_and_the_gossip_key_stays_out_of_the_log() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };

    // `vigil tls` writes keys 0600, certificates 0644.
    let certs = Certs::create();
    for key in [
        "vigil-agent-ca-key.pem",
        "dc1-server-vigil-0-key.pem",
        "dc1-client-vigil-0-key.pem",
    ] {
        assert_eq!(mode(&certs.path(key)), 0o600, "{key}");
    }
    assert_eq!(mode(&certs.ca()), 0o644);

    // A server with a data dir and a gossip key given on the command line, logging at debug.
    let key = text(&vigil(&["keygen"], &[]).await.stdout)
        .trim()
        .to_owned();
    let data = tempfile::tempdir().expect("data dir");
    let log = data.path().join("agent.log");
    let dir = data.path().join("data");
    let mut args: Vec<String> = ["agent", "--server", "--bootstrap-expect", "1"]
        .iter()
        .chain(&["--node", "keys", "--http-addr", "127.0.0.1:0"])
        .chain(&["--rpc-addr", "127.0.0.1:0", "--serf-addr", "127.0.0.1:0"])
        .chain(&["--gossip-profile", "local", "--log-level", "debug"])
        .map(|s| (*s).to_owned())
        .collect();
    args.extend(["--data-dir".into(), dir.display().to_string()]);
    args.extend(["--encrypt".into(), key.clone()]);
    args.extend(certs.agent_args());
    let agent = Agent::spawn(args, Some(&log)).await;
    let keyring = dir.join("serf/local.keyring");
    eventually(PROMPT, "the keyring file", || async {
        keyring.exists().then_some(())
    })
    .await;
    eventually(PROMPT, "the node to be registered", || async {
        (agent.serf_health("keys").await.as_deref() == Some("passing")).then_some(())
    })
    .await;
    assert_eq!(mode(&keyring), 0o600, "serf/local.keyring");
    assert_eq!(mode(&dir.join("node-id")), 0o600, "node-id");
    assert_eq!(mode(&dir), 0o700, "data dir");
    // Every file under it, the raft log's segments included, is the agent user's alone.
    let mut pending = vec![dir.clone()];
    let mut files = 0;
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files += 1;
                assert_eq!(mode(&path) & 0o077, 0, "{}", path.display());
            }
        }
    }
    assert!(files > 3, "only {files} files under the data dir");
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(!logged.is_empty(), "the agent logged nothing at debug");
    assert!(!logged.contains(&key), "the gossip key is in the log");
    agent.terminate().await;
}

//! The web UI in a real browser: headless Chromium driven through chromedriver (Debian's
//! `chromium` and `chromium-driver`, installed by `scripts/install-test-deps.sh`) against a dev
//! agent, everything on 127.0.0.1. Each page must follow the cluster by itself, through its
//! blocking query: a lock taken or handed over through the API shows within a second without
//! any reload, fair-mutex waiters show in queue order, a session destroyed from the UI releases
//! its lock, and a value edited in the UI reads back through the API. A screenshot of each page
//! goes to `target/ui-screenshots/`.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client as WebDriver, ClientBuilder, Locator};
use futures::FutureExt as _;
use hyper_util::client::legacy::connect::HttpConnector;
use integration_tests::{Agent, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_client::{
    Client, ClientError, FairMutex, Held, KvFairMutex, KvFairOptions, Lock, LockOptions,
    QueueOptions,
};

/// A change made through the API must be on screen within this, with no reload.
const LIVE: Duration = Duration::from_secs(1);
/// Loading a page, starting the browser, a lock recipe finishing its acquire.
const SLOW: Duration = Duration::from_secs(20);

/// Finds `name` on `PATH`, or fails the test saying how to install it.
fn installed(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH: the browser tests need Debian's chromium and \
                 chromium-driver packages (run scripts/install-test-deps.sh as root)"
            )
        })
}

/// `target/ui-screenshots/`, beside the `debug/deps/` directory holding this test.
fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test runs from target/<profile>/deps/");
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).expect("create target/ui-screenshots");
    dir
}

/// chromedriver on a free loopback port and one headless Chromium session through it.
struct Browser {
    driver: WebDriver,
    /// Killed on drop; the browser itself is ended by [`Browser::close`].
    _chromedriver: Child,
    base: String,
}

impl Browser {
    async fn start(base: &str) -> Browser {
        let chromium = installed("chromium");
        let chromedriver = installed("chromedriver");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + SLOW;
        loop {
            if let Some(status) = child.try_wait().expect("poll chromedriver") {
                panic!("chromedriver exited at start: {status}");
            }
            let reply = http.get(format!("{url}/status")).send().await;
            let body: Option<Value> = match reply {
                Ok(reply) => reply.json().await.ok(),
                Err(_) => None,
            };
            if body.is_some_and(|b| b["value"]["ready"] == json!(true)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not get ready in {SLOW:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // No traffic beyond loopback: no sync, updates, metrics or safe-browsing lookups.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1440,1000",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-sync",
            "--disable-domain-reliability",
            "--metrics-recording-only",
            "--no-pings",
            "--force-prefers-reduced-motion",
        ];
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("a JSON object literal")
        };
        let driver = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&url)
            .await
            .expect("a Chromium session through chromedriver");
        Browser {
            driver,
            _chromedriver: child,
            base: base.to_owned(),
        }
    }

    /// Loads `/ui/<hash>` and waits for the view's first answer.
    async fn open(&self, hash: &str, view: &str) {
        self.driver
            .goto(&format!("{}/ui/{hash}", self.base))
            .await
            .expect("load the UI");
        self.rendered(view).await;
    }

    /// Waits until the view container `#<view>` has rendered its first answer.
    async fn rendered(&self, view: &str) {
        let css = format!("#{view}[aria-busy=false]");
        eventually(SLOW, &format!("{css} to render"), || async {
            self.driver.find(Locator::Css(&css)).await.ok().map(|_| ())
        })
        .await;
    }

    /// Runs `script` with `css` as its argument: its answer.
    async fn query(&self, script: &str, css: &str) -> Value {
        self.driver
            .execute(script, vec![json!(css)])
            .await
            .expect("run a query script")
    }

    /// `[data-session, text]` of every element matching `css`, in document order, read in one
    /// round trip (so a re-render between two reads cannot mix two answers).
    async fn rows(&self, css: &str) -> Vec<(String, String)> {
        let script = "return [...document.querySelectorAll(arguments[0])]\
                      .map(e => [e.dataset.session ?? '', e.innerText]);";
        serde_json::from_value(self.query(script, css).await).expect("rows as pairs of strings")
    }

    /// How many elements match `css`.
    async fn count(&self, css: &str) -> usize {
        let script = "return document.querySelectorAll(arguments[0]).length;";
        serde_json::from_value(self.query(script, css).await).expect("a count")
    }

    /// The `textContent` of the first element matching `css` (an SVG element's too).
    async fn text_content(&self, css: &str) -> Option<String> {
        let script = "return document.querySelector(arguments[0])?.textContent ?? null;";
        serde_json::from_value(self.query(script, css).await).expect("text or null")
    }

    /// The text of the first element matching `css` (`None`: not there yet).
    async fn text(&self, css: &str) -> Option<String> {
        let element = self.driver.find(Locator::Css(css)).await.ok()?;
        element.text().await.ok()
    }

    async fn click(&self, css: &str) {
        eventually(SLOW, &format!("{css} to be clickable"), || async {
            let element = self.driver.find(Locator::Css(css)).await.ok()?;
            element.click().await.ok()
        })
        .await;
    }

    /// Types `token` into the header's token form and submits it.
    async fn use_token(&self, token: &str) {
        self.click(".token summary").await;
        self.driver
            .find(Locator::Css("#token"))
            .await
            .expect("the token field")
            .send_keys(token)
            .await
            .expect("type the token");
        self.click("#token-form button[type=submit]").await;
    }

    async fn screenshot(&self, name: &str) {
        let png = self.driver.screenshot().await.expect("take a screenshot");
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    async fn close(self) {
        self.driver.close().await.expect("end the browser session");
    }
}

fn lock(client: &Client, key: &str, name: &str) -> Lock {
    let mut opts = LockOptions::new(key);
    opts.session.name = name.to_owned();
    Lock::new(client, opts).expect("lock options")
}

/// The etcd-style fair mutex over KV keys (`FairQueues` in `/v1/vigil/locks`).
fn kv_fair(client: &Client, prefix: &str, name: &str) -> KvFairMutex {
    let mut opts = KvFairOptions::new(prefix);
    opts.session.name = name.to_owned();
    KvFairMutex::new(client, opts).expect("fair mutex options")
}

/// The fair mutex on the server-side lock queue (`Queues` in `/v1/vigil/locks`).
fn queued(client: &Client, name: &str, session_name: &str) -> FairMutex {
    let mut opts = QueueOptions::new(name);
    opts.session.name = session_name.to_owned();
    FairMutex::new(client, opts).expect("queue options")
}

/// `names[0]` takes the lock through `acquire`; the other names then start waiting behind it.
async fn contend<F>(
    names: [&str; 3],
    acquire: impl Fn(&str) -> F,
) -> (Held, Vec<JoinHandle<Result<Held, ClientError>>>)
where
    F: Future<Output = Result<Held, ClientError>> + Send + 'static,
{
    let holder = acquire(names[0]).await.expect("the first contender holds");
    let waiters = names[1..]
        .iter()
        .map(|name| tokio::spawn(acquire(name)))
        .collect();
    (holder, waiters)
}

/// Sessions of `css` rows, in order.
fn sessions(rows: &[(String, String)]) -> Vec<&str> {
    rows.iter().map(|(s, _)| s.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ui_follows_locks_sessions_and_kv_live() {
    let agent = Agent::dev().await;
    let browser = Browser::start(&agent.base).await;
    // Close the browser whatever happens, so no Chromium outlives a failed test.
    let outcome = AssertUnwindSafe(scenario(&agent, &browser))
        .catch_unwind()
        .await;
    browser.close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(agent: &Agent, browser: &Browser) {
    let client = Client::new(&agent.base).expect("client");
    let lock_key = "jobs/billing/.lock";
    let row = format!("tr[data-key=\"{lock_key}\"]");

    // Phase 1: the locks page, filtered to `jobs/`, starts empty.
    browser.open("#/locks?prefix=jobs/", "locks").await;
    let text = browser.text("#locks").await.unwrap_or_default();
    assert!(text.contains("Nothing is locked"), "{text}");

    // Phase 2: a lock taken through the API appears within a second, with its holder.
    let first = lock(&client, lock_key, "billing-worker-1")
        .acquire()
        .await
        .expect("first holder");
    eventually(LIVE, "the new lock on the locks page", || async {
        let rows = browser.rows(&row).await;
        (sessions(&rows) == [first.session()]).then_some(())
    })
    .await;
    let shown = browser.rows(&row).await;
    assert!(shown[0].1.contains("billing-worker-1"), "{shown:?}");
    assert!(shown[0].1.contains("test-node"), "{shown:?}");
    assert!(shown[0].1.contains("passing"), "{shown:?}");

    // Phase 3: after the holder releases, the next holder shows within a second.
    let waiting = {
        let contender = lock(&client, lock_key, "billing-worker-2");
        tokio::spawn(async move { contender.acquire().await.expect("second holder") })
    };
    eventually(SLOW, "a second session waiting for the lock", || async {
        let list = agent.get("/v1/session/list").await.json();
        (list.as_array()?.len() == 2).then_some(())
    })
    .await;
    first.release().await.expect("release");
    let second: Held = tokio::time::timeout(SLOW, waiting)
        .await
        .expect("the waiter acquires")
        .expect("the waiter's task");
    eventually(LIVE, "the next holder on the locks page", || async {
        let rows = browser.rows(&row).await;
        (sessions(&rows) == [second.session()]).then_some(())
    })
    .await;

    // Phase 4: a server-side lock queue shows its holder and its waiters in queue order.
    let compact = "jobs/compact";
    let (compactor, queue_waiters) =
        contend(["compactor-a", "compactor-b", "compactor-c"], |name| {
            let contender = queued(&client, compact, name);
            async move { contender.acquire().await }
        })
        .await;
    let queue_order: Vec<String> = eventually(SLOW, "two queued waiters", || async {
        let report = client.vigil_locks(compact).await.ok()?;
        let queue = &report["Queues"][0];
        let waiters = queue["Waiters"].as_array()?;
        (waiters.len() == 2).then(|| {
            let holder = &queue["Holders"][0];
            [holder]
                .into_iter()
                .chain(waiters)
                .map(session_of)
                .collect()
        })
    })
    .await;
    assert_eq!(queue_order[0], compactor.session());
    let queue_section = format!("section[data-queue=\"{compact}\"]");
    assert_queue_on_page(browser, "the lock queue", &queue_section, &queue_order).await;

    // Phase 5: KV fair-mutex contenders show in CreateIndex order under their holder.
    let reindex = "jobs/reindex";
    let (owner, fair_waiters) = contend(["reindexer-a", "reindexer-b", "reindexer-c"], |name| {
        let contender = kv_fair(&client, reindex, name);
        async move { contender.acquire().await }
    })
    .await;
    let order: Vec<String> = eventually(SLOW, "two fair-mutex waiters", || async {
        let report = client.vigil_locks(reindex).await.ok()?;
        let queue = report["FairQueues"][0]["Queue"].as_array()?.clone();
        (queue.len() == 3).then(|| queue.iter().map(session_of).collect())
    })
    .await;
    assert_eq!(order[0], owner.session());
    let fair_section = format!("section[data-fair=\"{reindex}\"]");
    assert_queue_on_page(browser, "the fair queue", &fair_section, &order).await;
    browser.screenshot("locks").await;

    // Phase 6: the sessions page lists the holder; destroying it there releases its lock.
    browser.click("nav a[data-page=sessions]").await;
    browser.rendered("sessions").await;
    let holder_row = format!("#sessions tr[data-session=\"{}\"]", second.session());
    let listed = browser.text(&holder_row).await.unwrap_or_default();
    assert!(listed.contains(lock_key), "{listed}");
    browser.screenshot("sessions").await;
    browser
        .click(&format!("button[data-destroy=\"{}\"]", second.session()))
        .await;
    browser.click("dialog[open] #confirm-destroy").await;
    eventually(
        SLOW,
        "the lock released by the destroyed session",
        || async {
            let entry = agent.get(&format!("/v1/kv/{lock_key}")).await.json();
            entry[0]["Session"].is_null().then_some(())
        },
    )
    .await;
    eventually(LIVE, "the destroyed session gone from the page", || async {
        browser.rows(&holder_row).await.is_empty().then_some(())
    })
    .await;
    tokio::time::timeout(SLOW, second.lost())
        .await
        .expect("the holder learns it lost the lock");

    // Phase 7: the node page says what its failure would invalidate.
    browser
        .open(&format!("#/nodes/{}", agent.node), "node")
        .await;
    let impact = browser.text("#impact").await.unwrap_or_default();
    assert!(impact.contains(reindex), "{impact}");
    let bound = format!("#impact tr[data-session=\"{}\"]", owner.session());
    assert_eq!(browser.rows(&bound).await.len(), 1, "{impact}");
    browser.open("#/nodes", "nodes").await;
    let node_row = browser
        .text(&format!("tr[data-node=\"{}\"]", agent.node))
        .await
        .unwrap_or_default();
    assert!(node_row.contains("alive"), "{node_row}");
    browser.screenshot("nodes").await;

    // Phase 8: an open key follows writes through the API; a value edited in the UI reads
    // back through the API, flags included.
    let key = "jobs/billing/config";
    let reply = agent.put(&format!("/v1/kv/{key}"), r#"{"batch":10}"#).await;
    assert_eq!(reply.status, StatusCode::OK);
    browser.open(&format!("#/kv/{key}"), "kv-meta").await;
    let editor = browser
        .driver
        .find(Locator::Css("#kv-value"))
        .await
        .expect("the value editor");
    assert_eq!(
        editor.prop("value").await.expect("editor value").as_deref(),
        Some(r#"{"batch":10}"#)
    );
    let reply = agent.put(&format!("/v1/kv/{key}"), r#"{"batch":12}"#).await;
    assert_eq!(reply.status, StatusCode::OK);
    eventually(LIVE, "the editor showing the new value", || async {
        let value = editor.prop("value").await.ok()??;
        (value == r#"{"batch":12}"#).then_some(())
    })
    .await;
    let edited = r#"{"batch": 25, "owner": "billing"}"#;
    editor.clear().await.expect("clear the editor");
    editor.send_keys(edited).await.expect("type the value");
    let flags = browser
        .driver
        .find(Locator::Css("#kv-flags"))
        .await
        .expect("the flags field");
    flags.clear().await.expect("clear flags");
    flags.send_keys("7").await.expect("type flags");
    browser.click("#kv-save").await;
    eventually(SLOW, "the save confirmed", || async {
        let status = browser.text("#kv-status").await?;
        (status == "Saved.").then_some(())
    })
    .await;
    let stored = agent.get(&format!("/v1/kv/{key}")).await.json();
    assert_eq!(stored[0]["Flags"], json!(7));
    let raw = agent.get(&format!("/v1/kv/{key}?raw")).await;
    assert_eq!(raw.text(), edited);
    browser.screenshot("kv").await;

    // Phase 9: a write the agent refuses shows the agent's own message and changes nothing.
    flags.clear().await.expect("clear flags");
    flags
        .send_keys("99999999999999999999999")
        .await
        .expect("type flags");
    browser.click("#kv-save").await;
    let refused = eventually(SLOW, "the refusal shown", || async {
        let status = browser.text("#kv-status").await?;
        status.starts_with("Not saved").then_some(status)
    })
    .await;
    assert!(refused.contains("value out of range"), "{refused}");
    let raw = agent.get(&format!("/v1/kv/{key}?raw")).await;
    assert_eq!(raw.text(), edited);

    // Phase 10: an ACL token typed in the header stays in this tab only.
    browser.use_token("a-token-for-this-tab").await;
    let stored = browser
        .driver
        .execute(
            "return [sessionStorage.getItem('vigil.token'), localStorage.length];",
            vec![],
        )
        .await
        .expect("read the browser's storage");
    assert_eq!(stored, json!(["a-token-for-this-tab", 0]));
    browser.click("#token-clear").await;

    // Phase 11: back on the locks page, both queues move up when their holders leave.
    browser.open("#/locks?prefix=jobs/", "locks").await;
    eventually(SLOW, "the queues before the handovers", || async {
        queue_shown(browser, &queue_section, &queue_order).await?;
        queue_shown(browser, &fair_section, &order).await
    })
    .await;
    compactor.release().await.expect("release the queued lock");
    eventually(LIVE, "the lock queue after a handover", || {
        queue_shown(browser, &queue_section, &queue_order[1..])
    })
    .await;
    owner.release().await.expect("release the fair mutex");
    eventually(LIVE, "the fair queue after a handover", || {
        queue_shown(browser, &fair_section, &order[1..])
    })
    .await;

    // Phase 12: a lock's page charts its history: the billing lock's two holders, the second
    // lost when its session was destroyed (phase 6), and the lock-delay that followed.
    browser.open(&format!("#/lock/{lock_key}"), "lock").await;
    let key_chart = "section[data-kind=key] svg.timeline";
    let parts = |part: &str| format!("{key_chart} [data-part={part}]");
    assert_eq!(browser.count(&parts("hold")).await, 2);
    let lost = format!(
        "{key_chart} g[data-session=\"{}\"] path[data-cause=destroyed]",
        second.session()
    );
    assert_eq!(browser.count(&lost).await, 1);
    assert_eq!(browser.count(&parts("lock-delay")).await, 1);
    let loss = browser
        .text_content(&format!("{key_chart} text.cause"))
        .await;
    assert_eq!(loss.as_deref(), Some("session destroyed"));
    let events: Vec<String> = browser
        .rows("section[data-kind=key] tbody tr")
        .await
        .into_iter()
        .map(|(_, text)| text.split('\t').nth(1).unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        events,
        ["granted", "released", "granted", "lost", "lock-delay"]
    );
    browser.screenshot("lock-history").await;

    // The queue's page, reached from the locks page, follows a handover live: each holder a
    // bar, each waiter's wait before its grant.
    browser.open("#/locks?prefix=jobs/", "locks").await;
    browser
        .click(&format!("{queue_section} a.history-link"))
        .await;
    browser.rendered("lock").await;
    let queue_chart = "section[data-kind=queue] svg.timeline";
    let lanes = format!("{queue_chart} g[data-session]");
    let holds = format!("{queue_chart} rect[data-part=hold]");
    assert_eq!(browser.count(&lanes).await, 2);
    assert_eq!(browser.count(&holds).await, 2);
    let mut queue_waiters = queue_waiters;
    let granted = eventually(SLOW, "the next in the queue granted", || async {
        queue_waiters.iter().position(|task| task.is_finished())
    })
    .await;
    let next: Held = queue_waiters
        .remove(granted)
        .await
        .expect("its task")
        .expect("its grant");
    next.release().await.expect("release the queued lock again");
    eventually(LIVE, "the third holder charted live", || async {
        let shown = (browser.count(&lanes).await, browser.count(&holds).await);
        (shown == (3, 3)).then_some(())
    })
    .await;
    let waits = format!("{queue_chart} rect[data-part=wait]");
    assert_eq!(browser.count(&waits).await, 2);
    browser.screenshot("lock-queue-history").await;
    for task in queue_waiters.into_iter().chain(fair_waiters) {
        task.abort();
    }
}

const ROOT: &str = "9b0c8a52-41d6-4f3e-8e57-2f6d1a0c3b11";

#[tokio::test(flavor = "multi_thread")]
async fn the_ui_shows_what_its_token_may_read_and_the_servers_refusals() {
    let agent = Agent::dev_with(&[
        "--acl-default-policy",
        "deny",
        "--acl-initial-management-token",
        ROOT,
    ])
    .await;
    let root = agent.with_token(ROOT);
    eventually(SLOW, "the initial management token", || async {
        (root.get("/v1/acl/token/self").await.status == StatusCode::OK).then_some(())
    })
    .await;
    // A token that reads and writes app/ and reads every session, but may not destroy them.
    let rules =
        "key_prefix \"app/\" { policy = \"write\" }\nsession_prefix \"\" { policy = \"read\" }";
    let policy = root
        .put(
            "/v1/acl/policy",
            json!({"Name": "app", "Rules": rules}).to_string(),
        )
        .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.text());
    let token = root
        .put(
            "/v1/acl/token",
            json!({"Policies": [{"Name": "app"}]}).to_string(),
        )
        .await
        .json();
    let secret = token["SecretID"].as_str().expect("SecretID").to_owned();
    // Locks under app/ and other/, both held by the management token's sessions.
    let mut held = Vec::new();
    for key in ["app/lock", "other/lock"] {
        let session = root.session(&json!({"Name": key}).to_string()).await;
        let took = root
            .put(&format!("/v1/kv/{key}?acquire={session}"), "x")
            .await;
        assert_eq!(took.json(), json!(true), "{key}");
        held.push(session);
    }

    let browser = Browser::start(&agent.base).await;
    let outcome = AssertUnwindSafe(async {
        // Without a token nothing is readable: the locks page shows nothing held.
        browser.open("#/locks", "locks").await;
        let text = browser.text("#locks").await.unwrap_or_default();
        assert!(text.contains("Nothing is locked"), "{text}");

        // With the app's token, app/lock shows and other/lock does not.
        browser.use_token(&secret).await;
        browser.rendered("locks").await;
        eventually(SLOW, "app/lock on the locks page", || async {
            let rows = browser.rows("tr[data-key=\"app/lock\"]").await;
            (sessions(&rows) == [held[0].as_str()]).then_some(())
        })
        .await;
        assert!(browser.rows("tr[data-key=\"other/lock\"]").await.is_empty());

        // Destroying a session it may only read is refused with the server's message, and
        // the session lives on.
        browser.click("nav a[data-page=sessions]").await;
        browser.rendered("sessions").await;
        browser
            .click(&format!("button[data-destroy=\"{}\"]", held[0]))
            .await;
        browser.click("dialog[open] #confirm-destroy").await;
        let refusal = eventually(SLOW, "the refusal shown", || async {
            let shown = browser
                .driver
                .find(Locator::Css("dialog[open] .dialog-error"))
                .await
                .ok()?;
            let text = shown.text().await.ok()?;
            text.contains("Permission denied").then_some(text)
        })
        .await;
        assert!(refusal.contains("403"), "{refusal}");
        let info = root.get(&format!("/v1/session/info/{}", held[0])).await;
        assert_eq!(info.json()[0]["ID"], held[0].as_str());
    })
    .catch_unwind()
    .await;
    browser.close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The `Session` of a holder or waiter in `/v1/vigil/locks`.
fn session_of(entry: &Value) -> String {
    entry["Session"].as_str().unwrap_or_default().to_owned()
}

/// The waiter rows when the lock section `section` shows `order[0]` holding and the rest
/// waiting in that order (`None` until it does).
async fn queue_shown(
    browser: &Browser,
    section: &str,
    order: &[String],
) -> Option<Vec<(String, String)>> {
    let holders = browser
        .rows(&format!("{section} tr[data-role=holder]"))
        .await;
    let waiters = browser
        .rows(&format!("{section} tr[data-role=waiter]"))
        .await;
    (sessions(&holders) == order[..1] && sessions(&waiters) == order[1..]).then_some(waiters)
}

/// Waits (within [`LIVE`]) for `section` of the locks page to show `order`, then checks that
/// each waiter row starts with its position: 1, 2, …
async fn assert_queue_on_page(browser: &Browser, what: &str, section: &str, order: &[String]) {
    let waiters = eventually(LIVE, &format!("{what} on the locks page"), || {
        queue_shown(browser, section, order)
    })
    .await;
    for (i, (_, text)) in waiters.iter().enumerate() {
        let position = (i + 1).to_string();
        assert!(text.starts_with(&position), "waiter {position}: {text}");
    }
}

//! The agent's own root, as Consul serves it: `GET /` redirects to `/ui/`, which answers 200
//! (so HTTP health checks pointed at the agent itself pass). The page says what the agent is
//! and where its API starts; the web UI will live here.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Vigil</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body>
<main>
<h1>Vigil</h1>
<p>This agent serves Consul's HTTP API under <a href="/v1/agent/self">/v1/</a>.
Locks held and waiting: <a href="/v1/vigil/locks">/v1/vigil/locks</a>.</p>
</main>
</body>
</html>
"#;

/// `GET /`: Consul's 301 to the UI.
pub async fn root() -> Response {
    (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, "/ui/")]).into_response()
}

/// `GET /ui/`.
pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

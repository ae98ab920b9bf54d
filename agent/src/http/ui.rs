//! The web UI, served by every agent as Consul serves its own: `GET /` redirects to `/ui/`,
//! which answers 200 with the app shell (so HTTP checks pointed at the agent itself pass).
//!
//! The UI is plain HTML, CSS and JavaScript modules in `http/ui/`, embedded in the binary with
//! `include_bytes!`: nothing is fetched at run time and there is no build step. Everything it
//! shows comes from the public HTTP API, with the browser's token; routing is hash-based
//! (`/ui/#/locks`), so the server knows only the shell and its assets. Every answer carries an
//! ETag (a hash of the content, computed at compile time) and `Cache-Control: no-cache`, so a
//! browser revalidates with a cheap 304 and never runs the assets of an older binary.

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file, served at `/ui/<name>`.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// FNV-1a of `body`: changes whenever the file does.
    hash: u64,
}

macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("ui/", $name)),
            hash: fnv1a(include_bytes!(concat!("ui/", $name))),
        }
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

const INDEX: Asset = asset!("index.html", HTML);

const ASSETS: &[Asset] = &[
    asset!("style.css", CSS),
    asset!("favicon.svg", SVG),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("cluster.js", JS),
    asset!("locks.js", JS),
    asset!("lock.js", JS),
    asset!("sessions.js", JS),
    asset!("nodes.js", JS),
    asset!("kv.js", JS),
];

/// The page may load only its own files and talk only to its own agent: the token it holds
/// cannot be sent anywhere else, and no inline script can run.
const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// `GET /` (and `/ui`): Consul's 301 to the UI.
pub async fn root() -> Response {
    (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, "/ui/")]).into_response()
}

/// `GET /ui/`: the app shell.
pub async fn index(headers: HeaderMap) -> Response {
    serve(&INDEX, &headers)
}

/// `GET /ui/<file>`: an embedded asset, or 404.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => serve(asset, &headers),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "404 page not found\n",
        )
            .into_response(),
    }
}

fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    let etag = format!("\"{:016x}\"", asset.hash);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let headers = response.headers_mut();
    if let Ok(etag) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if asset.content_type == HTML {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_ui_imports_is_served() {
        let mut texts: Vec<&str> = ASSETS
            .iter()
            .filter(|a| a.content_type == JS || a.content_type == HTML)
            .map(|a| std::str::from_utf8(a.body).expect("UTF-8 asset"))
            .collect();
        texts.push(std::str::from_utf8(INDEX.body).expect("UTF-8 shell"));
        let served = |name: &str| ASSETS.iter().any(|a| a.name == name);
        for text in texts {
            for quote in ["from \"./", "src=\"./", "href=\"./"] {
                for reference in text.split(quote).skip(1) {
                    let name = reference.split('"').next().unwrap_or_default();
                    assert!(served(name), "{name} is referenced but not served");
                }
            }
        }
    }

    #[tokio::test]
    async fn answers_304_to_a_matching_etag() {
        let first = asset(Path("app.js".to_owned()), HeaderMap::new()).await;
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(first.headers()[header::CONTENT_TYPE], JS);
        assert_eq!(first.headers()[header::CACHE_CONTROL], "no-cache");
        let etag = first.headers()[header::ETAG].clone();
        let mut again = HeaderMap::new();
        again.insert(header::IF_NONE_MATCH, etag);
        let second = asset(Path("app.js".to_owned()), again).await;
        assert_eq!(second.status(), StatusCode::NOT_MODIFIED);
        let missing = asset(Path("nope.js".to_owned()), HeaderMap::new()).await;
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn the_shell_forbids_foreign_scripts() {
        let shell = index(HeaderMap::new()).await;
        assert_eq!(shell.headers()[header::CONTENT_TYPE], HTML);
        assert!(
            shell.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .starts_with("default-src 'self'")
        );
    }
}

//! Go's `path.Clean`, as Consul's HTTP router applies it to request paths (`cleanPath`).

/// Go's `cleanPath`: `path.Clean` of the path made absolute, with a trailing slash kept.
pub fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut clean = format!("/{}", segments.join("/"));
    if path.ends_with('/') && clean != "/" {
        clean.push('/');
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_paths_like_go() {
        let cases = [
            ("/v1/kv/app/config", "/v1/kv/app/config"),
            ("/v1/kv//app/config", "/v1/kv/app/config"),
            ("/v1//catalog/services", "/v1/catalog/services"),
            ("/v1/kv/a/../b", "/v1/kv/b"),
            ("/v1/kv/a/./b/", "/v1/kv/a/b/"),
            ("/v1/kv/", "/v1/kv/"),
            ("/v1/kv//", "/v1/kv/"),
            ("/v1/kv/..", "/v1"),
            ("/../..", "/"),
            ("/", "/"),
            ("//", "/"),
            ("/v1/kv/a%2F%2Fb", "/v1/kv/a%2F%2Fb"),
        ];
        for (path, want) in cases {
            assert_eq!(clean(path), want, "{path}");
        }
    }
}

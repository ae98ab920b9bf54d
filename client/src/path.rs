//! Go's `path.Join` and `path.Clean`, because Consul's recipes name their keys with them
//! (`path.Join(prefix, ".lock")` turns `svc/` into `svc/.lock`); byte-compatible key names are
//! what make a Vigil lock and a Consul lock on the same prefix exclude each other.

/// Go's `path.Clean`: collapse `//`, drop `.`, resolve `..`, no trailing slash.
pub fn clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_owned();
    }
    let rooted = p.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment {
            "" | "." => {}
            ".." => match out.last() {
                Some(&last) if last != ".." => {
                    out.pop();
                }
                _ if !rooted => out.push(".."),
                _ => {}
            },
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    if rooted {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".to_owned()
    } else {
        joined
    }
}

/// Go's `path.Join`: the non-empty parts joined by `/`, then cleaned (`""` if all are empty).
pub fn join(parts: &[&str]) -> String {
    let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return String::new();
    }
    clean(&parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_go_path_join() {
        assert_eq!(join(&["svc", ".lock"]), "svc/.lock");
        assert_eq!(join(&["svc/", ".lock"]), "svc/.lock");
        assert_eq!(join(&["a//b/", "c"]), "a/b/c");
        assert_eq!(join(&["a/../b", "c"]), "b/c");
        assert_eq!(join(&["/a", "b"]), "/a/b");
        assert_eq!(join(&["", ""]), "");
        assert_eq!(join(&["..", "x"]), "../x");
        assert_eq!(clean("/../x"), "/x");
        assert_eq!(clean("./"), ".");
    }
}

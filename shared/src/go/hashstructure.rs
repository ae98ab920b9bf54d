//! `github.com/mitchellh/hashstructure` (v1, as Consul 1.8.7 vendors it) with its default
//! options: the hash Consul's agent puts in a service's `ContentHash`. A caller walks its Go
//! struct by hand, one function per kind of Go value:
//!
//! - every hash is 64-bit FNV-1 (not 1a) of some bytes, the hasher reset each time;
//! - a string hashes its bytes; an `int` or `uint` its value widened to 64 bits (`int64`,
//!   `uint64`), little-endian, while a sized integer (`int32`, `uint16`, ...) hashes at its own
//!   width (not built here: no field hashed needs it); a bool the one byte of an `int8` (1 or 0);
//! - a nil pointer or interface hashes as the `int` 0 (default options: `ZeroNil` off);
//! - a slice folds its elements in order ([`ordered`], from 0), so an empty or nil one is 0;
//! - a map XORs the [`ordered`] pair of each key's and value's hash (order does not matter),
//!   so an empty or nil one is 0;
//! - a struct starts from its type name's hash and XORs in, for each exported field not tagged
//!   `hash:"ignore"`, the [`ordered`] pair of the field name's hash and the value's hash.

/// 64-bit FNV-1, as Go's `hash/fnv.New64`.
fn fnv1_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 14_695_981_039_346_656_037;
    const PRIME: u64 = 1_099_511_628_211;
    bytes
        .iter()
        .fold(OFFSET, |h, b| h.wrapping_mul(PRIME) ^ u64::from(*b))
}

/// A Go `string`.
pub fn string(s: &str) -> u64 {
    fnv1_64(s.as_bytes())
}

/// A Go `int` or `int64`, written as an `int64` (a sized integer's own width is not this).
pub fn int(i: i64) -> u64 {
    fnv1_64(&i.to_le_bytes())
}

/// A Go `uint64` (or `uint`).
pub fn uint(u: u64) -> u64 {
    fnv1_64(&u.to_le_bytes())
}

/// A Go `bool`, written as an `int8`.
pub fn bool(b: bool) -> u64 {
    fnv1_64(&[u8::from(b)])
}

/// A nil pointer or interface: the zero `int`.
pub fn nil() -> u64 {
    int(0)
}

/// Two hashes combined where their order matters (`hashUpdateOrdered`).
pub fn ordered(a: u64, b: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    fnv1_64(&bytes)
}

/// A slice or array, from its elements' hashes in order.
pub fn slice(elements: impl IntoIterator<Item = u64>) -> u64 {
    elements.into_iter().fold(0, ordered)
}

/// A map, from its (key hash, value hash) entries in any order.
pub fn map(entries: impl IntoIterator<Item = (u64, u64)>) -> u64 {
    entries.into_iter().fold(0, |h, (k, v)| h ^ ordered(k, v))
}

/// A struct named `type_name`, from its hashed fields (name, value hash) in any order.
pub fn structure<'a>(type_name: &str, fields: impl IntoIterator<Item = (&'a str, u64)>) -> u64 {
    fields.into_iter().fold(string(type_name), |h, (name, v)| {
        h ^ ordered(string(name), v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values are what hashstructure 1.0.0 gives under Go 1.19 for the same values.
    #[test]
    fn scalars_match_go() {
        assert_eq!(string(""), 0xcbf29ce484222325);
        assert_eq!(string("foo"), 0xd8cbc7186ba13533);
        assert_eq!(int(0), 0xa8c7f832281a39c5);
        assert_eq!(int(-1), 0xd65de7467f38b96d);
        assert_eq!(uint(7), 0x43869769eb4f75c8);
        assert_eq!(bool(true), 0xaf63bd4c8601b7de);
        assert_eq!(bool(false), 0xaf63bd4c8601b7df);
        assert_eq!(nil(), int(0));
    }

    #[test]
    fn collections_match_go() {
        assert_eq!(slice([string("a"), string("b")]), 0x25a4fca41fa59b70);
        assert_eq!(slice([string("b"), string("a")]), 0x6f335aa5eccdb706);
        assert_eq!(slice([]), 0);
        let entries = [(string("a"), int(1)), (string("b"), int(2))];
        assert_eq!(map(entries), 0x6febdf1e065882a6);
        assert_eq!(map(entries.into_iter().rev()), 0x6febdf1e065882a6);
        assert_eq!(map([]), 0);
    }

    /// Go's
    /// `type Inner struct { N uint64 }` and
    /// `type Outer struct { Name string; Flag bool; List []string; Set map[string]int;
    /// Ptr *Inner; In Inner; Count int; skip string; Skip string `hash:"ignore"` }`:
    /// the unexported and the ignored field are not handed in.
    #[test]
    fn structs_match_go() {
        let outer = |name: &str, flag, list: &[&str], set: &[(&str, i64)], ptr, inner, count| {
            structure(
                "Outer",
                [
                    ("Name", string(name)),
                    ("Flag", bool(flag)),
                    ("List", slice(list.iter().map(|s| string(s)))),
                    ("Set", map(set.iter().map(|(k, v)| (string(k), int(*v))))),
                    ("Ptr", ptr),
                    ("In", inner),
                    ("Count", int(count)),
                ],
            )
        };
        let inner = |n| structure("Inner", [("N", uint(n))]);
        let zero = outer("", false, &[], &[], nil(), inner(0), 0);
        assert_eq!(zero, 0x25add0d002a17950);
        let full = outer("x", true, &["l"], &[("k", 3)], inner(9), inner(1), -4);
        assert_eq!(full, 0xc4e5cbdc601daf8b);
    }
}

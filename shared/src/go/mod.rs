//! What must match Go byte for byte, because Consul's clients send it or read it: durations
//! (`time.ParseDuration`, `Duration.String`), go-bexpr filters (`?filter=`), `strconv`'s
//! parsers and quoting with their error texts, `path.Clean`, the calendar fields Go's
//! timestamps print, and hashstructure's hash (a service's `ContentHash`). Everything else uses
//! crates.

pub mod duration;
pub mod filter;
pub mod hashstructure;
pub mod path;
pub mod strconv;
pub mod time;

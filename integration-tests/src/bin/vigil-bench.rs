//! `vigil-bench`: Vigil and etcd side by side on this machine (see `integration_tests::bench`
//! and `docs/benchmarks.md`).
//!
//! `cargo run --release -p integration-tests --bin vigil-bench -- [--quick] [--check] [--out DIR]`

use std::process::ExitCode;

use integration_tests::bench::{self, Options};

#[tokio::main]
async fn main() -> ExitCode {
    match Options::parse(std::env::args().skip(1)) {
        Ok(options) => bench::main(&options).await,
        Err(e) => {
            eprintln!("vigil-bench: {e:#}\n{}", Options::USAGE);
            ExitCode::from(2)
        }
    }
}

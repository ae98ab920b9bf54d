//! `vigil-bench`: Vigil and etcd side by side on this machine (see the `vigil_bench` library and
//! `docs/benchmarks.md`).
//!
//! `cargo run --release -p vigil-bench --features etcd -- [--quick] [--check] [--out DIR]
//! [--only WORKLOAD]...`

use std::process::ExitCode;

#[cfg(feature = "etcd")]
#[tokio::main]
async fn main() -> ExitCode {
    use vigil_bench::Options;

    match Options::parse(std::env::args().skip(1)) {
        Ok(options) => vigil_bench::main(&options).await,
        Err(e) => {
            eprintln!("vigil-bench: {e:#}\n{}", Options::usage());
            ExitCode::from(2)
        }
    }
}

/// Without etcd's client there is nothing to compare with: say how to get it.
#[cfg(not(feature = "etcd"))]
fn main() -> ExitCode {
    eprintln!(
        "vigil-bench was built without the `etcd` feature, so it cannot run: every figure is \
         measured against etcd too. Rebuild it with etcd's client (its build needs protoc; \
         scripts/install-etcd.sh installs protoc and etcd):\n\
         \n    cargo run --release -p vigil-bench --features etcd -- [--quick] [--check] [--out DIR]"
    );
    ExitCode::from(2)
}

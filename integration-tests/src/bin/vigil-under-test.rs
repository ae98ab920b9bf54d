//! The `vigil` command built inside this crate, so its tests can spawn real agent processes
//! (Cargo exposes only a crate's own binaries to its tests). Same library code as `vigil`.

fn main() -> anyhow::Result<()> {
    vigil::run::main()
}

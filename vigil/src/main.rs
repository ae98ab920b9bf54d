//! The `vigil` binary; everything lives in the library so tests run the same code.

fn main() -> anyhow::Result<()> {
    vigil::run::main()
}

//! The `vigil-demo` command built inside this crate, so the lock-safety checker's loopback
//! scenario can spawn the bank and the workers (Cargo exposes only a crate's own binaries to its
//! tests). Same library code as `vigil-demo`.

fn main() {
    vigil_demo::main()
}

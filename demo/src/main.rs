//! The `vigil-demo` binary; everything lives in the library so the integration tests run the
//! same code.

fn main() {
    vigil_demo::main()
}

//! Deterministic simulation of a Vigil cluster in one process: N servers (openraft with the
//! real state store, proposer and leader duties; a simulated disk for the log), M clients, a
//! simulated network, all on one thread with tokio's clock paused and every random choice
//! drawn from one seed. A failing seed replays exactly (`vigil-sim --seed N`). docs/design.md,
//! "Deterministic simulation", says what is simulated and what is not.

pub mod check;
pub mod disk;
pub mod gateway;
pub mod linear;
pub mod net;
pub mod run;
pub mod sessions;
pub mod workload;
pub mod world;

pub use run::{Config, Report, run, run_catching};
pub use world::Plant;

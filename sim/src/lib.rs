//! Deterministic simulation of a Vigil cluster (see docs/design.md, "Deterministic simulation").

pub mod linear;

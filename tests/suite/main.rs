//! captune's integration tests, in one binary: linking wgpu, egui and
//! naga once instead of once per file is most of what a clean build of
//! the tests costs. Each module is an area that `scripts/test.sh` runs
//! and times on its own (`cargo test --test suite -- kernels::` runs one).
//!
//! Only the loaders' fuzz (tests/fuzz_loaders.rs) has a binary of its own:
//! its global allocator refuses any allocation over 1 GiB, which would
//! also fail the tests here that load models.

mod common;

mod app;
mod cli;
mod datasets;
mod evaluation;
mod kernels;
mod models;
mod objectives;
mod training;

//! The `captune` binary as a user runs it: commands and their errors, every
//! flag a message names, the packaged crate, and the test command itself.

mod commands;
mod flags;
mod gpu_bench;
mod package;
mod test_command;

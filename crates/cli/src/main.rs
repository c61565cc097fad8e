//! `iscsi`: one binary, one subcommand per job.
fn main() {}

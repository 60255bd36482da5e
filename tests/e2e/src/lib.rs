//! Nothing to link: this crate exists for its test binary (`tests/e2e`), which runs the
//! workspace's real binaries together. It needs `cargo build --workspace` first (`.ci/run` does
//! that), since it finds them with `runr_testkit::workspace_bin`.

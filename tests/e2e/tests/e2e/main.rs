//! Tests that cross binaries: the workspace's real binaries working together, as the platform
//! chains them. One test binary, a module per chain.

mod platform_env;
mod triggers;
mod upload_then_prewarm;

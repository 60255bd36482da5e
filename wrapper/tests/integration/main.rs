//! runr-wrapper's integration tests: ONE test binary (one link step) that starts the real
//! runr-wrapper on free loopback ports with real handlers (bash, python3, C). Add new modules
//! here rather than new files at tests/ top level.

mod admission;
mod cgroup;
mod deadlines;
mod errors;
mod exec;
mod headers;
mod http_mode;
mod lambda;
mod lifecycle;
mod linger;
mod logs;
mod memory;
mod metrics;
mod persistent;
mod proxy;
mod readiness;
mod recycling;
mod replay;
mod result_fd;
mod stress;
mod structured_logs;
mod support;
mod triggers;

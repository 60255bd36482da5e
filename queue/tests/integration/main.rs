//! runr-queue's integration tests, one binary: the real consumer against a real redis-server,
//! delivering to the real runr-wrapper (exec mode, Bash handlers) or to a Python receiver that
//! checks every CloudEvent with the CloudEvents SDK. `cargo build --workspace` first: the
//! wrapper binary is another crate's.

mod cluster;
mod concurrency;
mod config;
mod crash;
mod delivery;
mod join;
mod lifecycle;
mod limits;
mod metrics;
mod outage;
mod redrive;
mod refusals;
mod retries;
mod sentinel;
mod shutdown;
mod stress;
mod support;
mod tls;
mod traces;

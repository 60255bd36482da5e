//! The harness's own suite: every fixture against the real tools it stands in for. One test
//! binary (one link step), a module per fixture.

mod httpd;
mod range_cache;
mod redis_cluster;
mod registry;
mod tls;
mod token;

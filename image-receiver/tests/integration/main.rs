//! runr-image-upload's integration tests, one binary: the real `serve` and `fetch` subcommands
//! and the image pipeline, against real registries (`docker-registry`) and inputs made by real
//! tools.
//!
//! - [`support`]: the receiver under test (`PORT=0`, the port read from its `listening` line)
//!   and JSON over `testkit::http`;
//! - `upload`: the chunk protocol, refusals, restarts, verification, bad configuration;
//! - `image`: every format pushed and pulled back blob by blob, bad inputs, registry trouble,
//!   and an archive uploaded through the chunk API end to end;
//! - `load`: peak memory under 64 concurrent 8 MiB chunks and the push, and concurrent pushes
//!   of many blobs pulled back byte for byte;
//! - `push`: the push held part way by a proxy: its progress in the status, a registry
//!   restarted and a receiver killed in the middle of a blob (the follower's stream before
//!   `complete` too); the overlap rule before a push;
//! - `stream`: blobs pushed while the upload arrives (the follower), before `complete`, and
//!   what falls back to the after-complete pass;
//! - `matrix`: every format of the corpus plain and compressed whole, its
//!   chunks in order, reversed and shuffled, both push modes: the image the same archive
//!   pushes when sent in one piece;
//! - `registry_auth`: a registry behind Bearer-token auth or TLS: the push with the right
//!   credentials or CA, and what a refusal or a certificate problem says.

mod image;
mod load;
mod matrix;
mod push;
mod registry_auth;
mod stream;
mod support;
mod upload;

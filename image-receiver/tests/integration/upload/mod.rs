//! The upload half of `runr-image-upload serve`, end to end against the real binary: the chunk
//! protocol (any order, duplicates, overlaps, concurrency), refusals, resume after SIGKILL,
//! verification and its reopening, stalled chunks and keepalive, and bad configuration.
//!
//! Uploads here are random bytes: they verify, then fail format detection, which is the part
//! of the pipeline that needs no registry. The wasm tests push into a real registry.

mod chunks;
mod clients;
mod config;
mod journal;
mod lifecycle;
mod stalls;

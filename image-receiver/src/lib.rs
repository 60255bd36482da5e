//! runr-image-upload: receives an uploaded image archive (or WebAssembly module) in chunks at
//! their byte offsets, verifies its size and SHA-256, works out what it is and pushes it into
//! the region's OCI registry.
//!
//! Upload half: [`config`] (every variable of `serve`), [`ranges`] (the merged byte ranges
//! held), [`upload`] (data file, state file, running digest, life cycle), [`status`] (what
//! `GET /status` answers), [`server`] (the HTTP API).
//! Image half: [`pipeline`] (what happens to a verified file), [`fetch`] (pull a wasm module).

#![forbid(unsafe_code)]

pub mod archive;
pub mod config;
pub mod fetch;
pub mod formats;
pub mod pipeline;
pub mod push;
pub mod ranges;
pub mod reference;
pub mod server;
pub mod status;
pub mod upload;

//! runr-image-upload: receives an uploaded image archive (or WebAssembly module) in chunks at
//! their byte offsets, verifies its size and SHA-256, works out what it is and pushes it into
//! the region's OCI registry.
//!
//! Upload half: [`config`] (every variable of `serve`), [`ranges`] (the merged byte ranges held).
//! Image half: [`pipeline`] (what happens to a verified file), [`fetch`] (pull a wasm module).

#![forbid(unsafe_code)]

pub mod config;
pub mod fetch;
pub mod pipeline;
pub mod ranges;

//! runr-image-upload: receives an uploaded image archive (or WebAssembly module) in chunks at
//! their byte offsets, verifies its size and SHA-256, works out what it is and pushes it into
//! the region's OCI registry.
//!
//! Two halves that meet in one place, [`serve`], where the processor the upload calls on
//! `complete` is the image pipeline:
//! - the upload half (`upload/`): the merged byte ranges held, the state kept on disk, the
//!   running digest, and the HTTP API the control plane talks to;
//! - the image half ([`image`]): reading spans of the archive in place, detecting the format,
//!   compressing classic layers, pushing into the registry, and `fetch` for wasm modules.
//!
//! Neither half imports the other; [`config`] reads every variable once, above both, and
//! [`progress`] is what the image half counts and the upload half shows of the push, [`prefix`]
//! the contiguous prefix the upload half publishes and the image half's follower reads behind.

#![forbid(unsafe_code)]

pub mod config;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
pub mod image;
pub mod prefix;
pub mod progress;
pub mod serve;
mod upload;

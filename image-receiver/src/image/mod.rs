//! The image half: what a verified upload is and how it gets into the registry.
//!
//! - `span`: the one reader over a span of the archive (a blob, a layer, a document);
//! - `archive`: the tar's own index, read in place;
//! - `formats`: detection from content and the image graph of each format (OCI layout,
//!   classic `docker save`, WebAssembly module);
//! - `compress`: gzip both ways (classic layers before the push, a whole `.tar.gz` upload);
//! - `push`: blobs and manifests into the registry, with retries;
//! - [`follow`]: blobs pushed while the upload arrives, read behind the contiguous prefix;
//! - [`pipeline`]: detect, push, read back: what the upload half's processor runs;
//! - [`fetch`]: pull a pushed wasm module back into a file.

pub(crate) mod archive;
pub(crate) mod compress;
pub mod fetch;
pub mod follow;
pub(crate) mod formats;
pub mod pipeline;
pub(crate) mod push;
pub(crate) mod span;

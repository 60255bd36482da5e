//! `runr-image-upload fetch <reference> <dest-file>`: pulls a WebAssembly module pushed by
//! `serve` back into a file, verifying its digest.

use std::path::Path;

use runr_registry::RegistryConfig;

/// Why a module could not be fetched.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct FetchError {
    /// What went wrong, in user terms.
    pub message: String,
}

/// Pulls the wasm module at `reference` into `dest`, verifying the layer's digest.
pub async fn fetch(
    reference: &str,
    dest: &Path,
    registry: &RegistryConfig,
) -> Result<(), FetchError> {
    let _ = (reference, dest, registry);
    Err(FetchError {
        message: "not implemented yet".into(),
    })
}

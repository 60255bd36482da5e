//! `runr-image-upload fetch <reference> <dest-file>`: pulls a WebAssembly module pushed by
//! `serve` (a CNCF wasm OCI artifact) back into a file, verifying its digest.
//!
//! The module is written to a temporary name next to `dest` and renamed into place only once
//! oci-client has checked its digest, so `dest` never holds a partial or wrong module.

use std::path::Path;

use runr_registry::oci_client::Reference;
use runr_registry::{build_client, is_transient, Backoff, RegistryConfig, Timeouts};
use serde_json::Value;

use crate::image::formats::media;
use runr_base::fmt::error_chain;

use crate::image::push::RETRIES;

/// Layer media types accepted as "the module" (ours, and the older wasm-to-oci one).
const MODULE_TYPES: &[&str] = &[
    media::WASM_LAYER,
    "application/vnd.wasm.content.layer.v1+wasm",
];

/// Why a module could not be fetched.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct FetchError {
    /// What went wrong, in user terms.
    pub message: String,
}

impl FetchError {
    fn new(message: impl Into<String>) -> Self {
        FetchError {
            message: message.into(),
        }
    }
}

/// Pulls the wasm module at `reference` into `dest`, verifying the layer's digest.
pub async fn fetch(
    reference: &str,
    dest: &Path,
    registry: &RegistryConfig,
) -> Result<(), FetchError> {
    let image: Reference = reference
        .parse()
        .map_err(|e| FetchError::new(format!("{reference:?} is not a valid reference: {e}")))?;
    let client = build_client(registry, Timeouts::default(), "runr-image-upload")
        .map_err(|e| FetchError::new(e.to_string()))?;
    let auth = registry.auth();
    let backoff = Backoff::default();
    let accept = [media::OCI_MANIFEST];
    let mut attempt = 0;
    let (bytes, _) = loop {
        match client.pull_manifest_raw(&image, &auth, &accept).await {
            Ok(v) => break v,
            Err(e) if is_transient(&e) && attempt < RETRIES => {
                tokio::time::sleep(backoff.delay(attempt)).await;
                attempt += 1;
            }
            Err(e) => {
                return Err(FetchError::new(format!(
                    "failed to read the manifest of {reference}: {}",
                    error_chain(&e)
                )))
            }
        }
    };
    let manifest: Value = serde_json::from_slice(&bytes)
        .map_err(|e| FetchError::new(format!("the manifest of {reference} is not JSON: {e}")))?;
    let layer = manifest["layers"]
        .as_array()
        .and_then(|layers| {
            layers.iter().find(|l| {
                l["mediaType"]
                    .as_str()
                    .is_some_and(|t| MODULE_TYPES.contains(&t))
            })
        })
        .ok_or_else(|| {
            FetchError::new(format!(
                "{reference} is not a WebAssembly module (no layer of type {})",
                media::WASM_LAYER
            ))
        })?;
    let digest = layer["digest"]
        .as_str()
        .ok_or_else(|| FetchError::new(format!("the module layer of {reference} has no digest")))?
        .to_string();
    let file_name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "module".into());
    let tmp = dest.with_file_name(format!(".{file_name}.partial"));
    let mut attempt = 0;
    loop {
        let out = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| FetchError::new(format!("failed to create {}: {e}", tmp.display())))?;
        match client.pull_blob(&image, digest.as_str(), out).await {
            Ok(()) => break,
            Err(e) if is_transient(&e) && attempt < RETRIES => {
                tokio::time::sleep(backoff.delay(attempt)).await;
                attempt += 1;
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(FetchError::new(format!(
                    "failed to fetch module {digest} of {reference}: {}",
                    error_chain(&e)
                )));
            }
        }
    }
    tokio::fs::rename(&tmp, dest).await.map_err(|e| {
        FetchError::new(format!(
            "failed to move the module to {}: {e}",
            dest.display()
        ))
    })
}

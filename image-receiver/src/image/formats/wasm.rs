//! WebAssembly modules: the whole file is the one layer of a CNCF wasm OCI artifact.

use std::fs::File;
use std::sync::Arc;

use crate::image::span::Span;

/// A WebAssembly module: the whole file is the one layer.
#[derive(Debug)]
pub struct WasmModule {
    /// The module file, open.
    pub file: Arc<File>,
    /// Its bytes.
    pub span: Span,
    /// A component (`wasip2`) rather than a core module (`wasip1`).
    pub component: bool,
}

/// `Some(component)` when `magic`, the file's first bytes, is a WebAssembly header: `\0asm`,
/// then version 1 for a core module (`wasip1`), anything else for a component (`wasip2`).
pub(super) fn header(magic: &[u8]) -> Option<bool> {
    if magic.len() >= 8 && magic[..4] == *b"\0asm" {
        Some(magic[4..8] != [1, 0, 0, 0])
    } else {
        None
    }
}

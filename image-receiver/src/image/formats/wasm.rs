//! WebAssembly modules: the whole file is the one layer of a CNCF wasm OCI artifact.

use std::fs::File;
use std::sync::Arc;

use super::common::FormatError;
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

/// A core module's version bytes after `\0asm` (`wasip1`).
const CORE_VERSION: [u8; 4] = [0x01, 0x00, 0x00, 0x00];
/// A component's (`wasip2`): version 0x0d, layer 1.
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];

/// What `magic`, the file's first (up to 8) bytes, says: `None` when it does not start with
/// `\0asm`; otherwise a core module (`Ok(false)`), a component (`Ok(true)`), or an error naming
/// the version bytes found, which are neither.
pub(super) fn header(magic: &[u8]) -> Option<Result<bool, FormatError>> {
    let version = magic.strip_prefix(b"\0asm")?;
    let version = &version[..version.len().min(4)];
    match version {
        v if v == CORE_VERSION => Some(Ok(false)),
        v if v == COMPONENT_VERSION => Some(Ok(true)),
        v => {
            let found = match v {
                [] => "version bytes (none: the file ends after the magic)".to_string(),
                v if v.len() < 4 => format!("version bytes {} (the file ends there)", spaced(v)),
                v => format!("version bytes {}", spaced(v)),
            };
            Some(Err(FormatError::WasmVersion(found)))
        }
    }
}

/// `02 00 00 00`.
fn spaced(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_bytes() {
        assert!(header(b"\x7fELF\x02\x01\x01\x00").is_none());
        assert!(header(b"\0as").is_none());
        assert!(matches!(header(b"\0asm\x01\0\0\0"), Some(Ok(false))));
        assert!(matches!(header(b"\0asm\x0d\0\x01\0"), Some(Ok(true))));
        for (magic, found) in [
            (&b"\0asm\x02\0\0\0"[..], "version bytes 02 00 00 00"),
            (b"\0asm\x0d\0\x02\0", "version bytes 0d 00 02 00"),
            (b"\0asm\x01", "version bytes 01 (the file ends there)"),
            (
                b"\0asm",
                "version bytes (none: the file ends after the magic)",
            ),
        ] {
            match header(magic) {
                Some(Err(FormatError::WasmVersion(f))) => assert_eq!(f, found),
                other => panic!("{magic:?}: {other:?}"),
            }
        }
    }
}

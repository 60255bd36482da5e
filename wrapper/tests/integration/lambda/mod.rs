//! lambda mode (`RUNR_WRAPPER_MODE=lambda`) against real Lambda clients, never a mock of the
//! Runtime API: Python functions run by awslambdaric from PyPI (events read with
//! aws-lambda-powertools' data classes, an ASGI app behind mangum), a Rust function on the
//! lambda_runtime and lambda_http crates (streaming included), the custom-runtime tutorial's
//! shell bootstrap with curl, and a hand-written runtime for the protocol's corners.

mod api;
mod python;
mod rust;
mod shell;
pub mod support;

use std::path::Path;

/// The text of a fixture in tests/fixtures/lambda.
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lambda")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Request bodies whose sizes straddle pipe, buffer and chunk boundaries; odd ones are binary.
pub fn bodies() -> Vec<Vec<u8>> {
    [
        0usize,
        1,
        100,
        4095,
        4096,
        4097,
        65535,
        65536,
        65537,
        1024 * 1024,
    ]
    .iter()
    .enumerate()
    .map(|(i, &n)| {
        if i % 2 == 1 {
            (0..n).map(|j| (j * 7 + i) as u8).collect()
        } else {
            (0..n).map(|j| b'a' + (j % 26) as u8).collect()
        }
    })
    .collect()
}

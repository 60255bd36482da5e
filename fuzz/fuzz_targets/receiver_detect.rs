//! runr-image-upload's format detection on any upload: wasm version bytes, gzip/xz/zstd whole
//! archives (read through the decoder, at most 1 MiB of it), other compressions named, the tar index, OCI
//! layouts and classic archives with their JSON documents, narrowing by name; an answer or an
//! error, never a panic, and no temporary file left behind. The first byte picks whether the
//! upload has a name.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (name, upload) = match data.split_first() {
        Some((b, rest)) if b % 2 == 1 => (Some("corpus/app:v1"), rest),
        Some((_, rest)) => (None, rest),
        None => (None, data),
    };
    runr_image_upload::fuzz::detect(upload, name);
});

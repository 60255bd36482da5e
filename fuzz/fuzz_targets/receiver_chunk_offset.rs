//! runr-image-upload's `PUT /chunk?offset=N` query parsing: an offset exactly when the first
//! `offset=` value is a plain decimal that fits a u64, and then that number.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(query) = std::str::from_utf8(data) {
        runr_image_upload::fuzz::chunk_offset(query);
    }
});

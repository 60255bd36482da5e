//! runr-image-upload's tar indexer on any bytes an upload can hold: an error or an index whose
//! entries are archive-relative and whose spans (links followed) lie inside the file and read
//! back as its bytes; never a panic, never a link loop.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_image_upload::fuzz::tar_index(data));

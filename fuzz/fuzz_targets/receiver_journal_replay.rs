//! runr-image-upload's state journal replayed from any bytes after its header (a record torn by
//! a kill, a damaged disk): only whole, intact records inside the declared size are applied,
//! replaying the accepted part alone gives the same state, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runr_image_upload::fuzz::journal_replay(data));

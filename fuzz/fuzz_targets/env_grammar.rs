//! The configuration grammar (runr_base::env) never panics on any value an operator (or a
//! templating bug) can put into a variable, and what it prints for a duration reads back as
//! the same duration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runr_base::env::{display_duration, parse_duration, parse_flag, parse_level, parse_port, parse_size};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_flag(text);
    let _ = parse_level(text);
    let _ = parse_port(text);
    let _ = parse_size(text);
    if let Ok(d) = parse_duration(text) {
        let shown = display_duration(d);
        assert_eq!(parse_duration(&shown), Ok(d), "{text:?} -> {shown:?}");
    }
});

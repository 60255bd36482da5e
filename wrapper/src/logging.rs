//! The wrapper's own log lines, on stderr through `tracing`, each starting with `[runr-wrapper]`
//! so the platform's log view can tell them from the function's output (which is forwarded
//! unprefixed by [`program_line`]).

use std::io::Write;

use runr_base::log::LogFormat;

/// The prefix of every line the wrapper itself writes.
pub const PREFIX: &str = "[runr-wrapper]";

/// `[runr-wrapper] [LEVEL ]message key=value`; the level is left out for INFO, which keeps
/// access lines in the spec's shape.
pub const FORMAT: LogFormat = LogFormat {
    prefix: "runr-wrapper",
    info_level: false,
    timestamps: false,
};

/// Installs the global subscriber: stderr, our lines at `level`.
pub fn init(level: tracing::Level) {
    runr_base::log::init(FORMAT, level);
}

/// Writes one line of the user's program (stderr, or a non-JSON stdout line of a persistent
/// worker) to our stderr as it is, as a single write so that concurrent handlers' lines do not
/// interleave mid-line.
pub fn program_line(line: &[u8]) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    // Nothing sensible is left to do when our own stderr is gone.
    let _ = std::io::stderr().lock().write_all(&buf);
}

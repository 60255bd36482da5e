//! The wrapper's own log lines, on stderr through `tracing`, each starting with `[runr-wrapper]`
//! so the platform's log view can tell them from the function's output (which is forwarded
//! unprefixed by [`program_line`]).

use std::fmt;
use std::io::Write;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The prefix of every line the wrapper itself writes.
pub const PREFIX: &str = "[runr-wrapper]";

/// Installs the global subscriber: stderr, `[runr-wrapper] [LEVEL ]message key=value`; the level
/// is omitted for INFO, which keeps access lines in the spec's shape.
pub fn init(level: Level) {
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(Prefixed)
        .try_init();
}

/// Formats an event as one `[runr-wrapper] ...` line.
struct Prefixed;

impl<S, N> FormatEvent<S, N> for Prefixed
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "{PREFIX} ")?;
        let level = *event.metadata().level();
        if level != Level::INFO {
            write!(writer, "{level} ")?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
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

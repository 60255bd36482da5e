//! Log lines on stderr that start with the binary's name in brackets, e.g. `[runr-tick] ERROR ...`,
//! so they stand out next to the function's own output in the project's logs.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// A `tracing-subscriber` event format: `[<prefix>] <LEVEL> <message> <field>=<value>...`.
#[derive(Debug, Clone, Copy)]
pub struct Prefixed(pub &'static str);

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
        write!(writer, "[{}] {} ", self.0, event.metadata().level())?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs the global subscriber: info and above, to stderr, prefixed with `prefix`.
/// A second call (tests) leaves the first subscriber in place.
pub fn init(prefix: &'static str) {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .event_format(Prefixed(prefix))
        .try_init();
}

//! The one log format of the data plane's binaries: one line per event on stderr,
//!
//! ```text
//! [<prefix>] [<timestamp> ][<LEVEL> ]<message> <field>=<value> ...
//! ```
//!
//! with the per-binary choices as parameters ([`LogFormat`]): the prefix (so the platform's log
//! view tells our lines from the function's output), whether INFO is named (the wrapper leaves
//! it out, which keeps its access lines in the spec's shape), and timestamps (for Jobs whose
//! collector adds none). Every message and field value has its control characters escaped
//! ([`crate::fmt::push_escaped`]): text a client or a user program chose can never forge a line.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// How one binary's lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogFormat {
    /// Written in brackets at the start of every line, e.g. `runr-wrapper`.
    pub prefix: &'static str,
    /// Whether INFO lines name their level (other levels always do).
    pub info_level: bool,
    /// Whether lines start with an RFC 3339 UTC timestamp with milliseconds.
    pub timestamps: bool,
}

/// Installs the global subscriber: our own crates' events (targets `runr_*`) at `level`, the
/// libraries' (hyper, reqwest, oci-client chatter) at warn at most. A second call (tests)
/// leaves the first subscriber in place.
pub fn init(format: LogFormat, level: Level) {
    let libraries = if level < Level::WARN {
        level
    } else {
        Level::WARN
    };
    let filter = Targets::new()
        .with_target("runr", level)
        .with_default(libraries);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(format);
    let _ = tracing_subscriber::registry()
        .with(layer)
        .with(filter)
        .try_init();
}

impl<S, N> FormatEvent<S, N> for LogFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str(&self.line(event))
    }
}

impl LogFormat {
    /// The whole line for `event`, newline included.
    fn line(&self, event: &Event<'_>) -> String {
        let mut line = String::with_capacity(128);
        line.push('[');
        line.push_str(self.prefix);
        line.push_str("] ");
        if self.timestamps {
            line.push_str(&crate::fmt::rfc3339_millis(std::time::SystemTime::now()));
            line.push(' ');
        }
        let level = *event.metadata().level();
        if level != Level::INFO || self.info_level {
            let _ = write!(line, "{level} ");
        }
        let mut fields = Fields { line, first: true };
        event.record(&mut fields);
        let mut line = fields.line;
        line.push('\n');
        line
    }
}

/// Writes an event's fields: the message as it is, the others as `name=value`, all escaped.
struct Fields {
    line: String,
    first: bool,
}

impl Fields {
    fn start(&mut self, field: &Field) {
        if !self.first {
            self.line.push(' ');
        }
        self.first = false;
        if field.name() != "message" {
            self.line.push_str(field.name());
            self.line.push('=');
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.start(field);
        crate::fmt::push_escaped(&mut self.line, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.start(field);
        let text = format!("{value:?}");
        crate::fmt::push_escaped(&mut self.line, &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what the format writes, through a real subscriber.
    fn capture(format: LogFormat, emit: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .event_format(format);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const WRAPPER: LogFormat = LogFormat {
        prefix: "runr-wrapper",
        info_level: false,
        timestamps: false,
    };

    #[test]
    fn info_without_level_others_with() {
        let text = capture(WRAPPER, || {
            tracing::info!(addr = %"0.0.0.0:8080", workers = 2, "listening");
            tracing::warn!(error = "boom", "accept failed");
        });
        assert_eq!(
            text,
            "[runr-wrapper] listening addr=0.0.0.0:8080 workers=2\n\
             [runr-wrapper] WARN accept failed error=boom\n"
        );
    }

    #[test]
    fn info_level_and_timestamps_when_asked() {
        let format = LogFormat {
            prefix: "runr-image-upload",
            info_level: true,
            timestamps: true,
        };
        let text = capture(format, || tracing::info!(size = 5, "listening"));
        let rest = text.strip_prefix("[runr-image-upload] ").unwrap();
        let (stamp, rest) = rest.split_once(' ').unwrap();
        assert_eq!(stamp.len(), "2026-12-01T07:31:48.123Z".len(), "{text}");
        assert!(stamp.ends_with('Z') && stamp.contains('T'), "{text}");
        assert_eq!(rest, "INFO listening size=5\n");
    }

    #[test]
    fn client_text_cannot_forge_a_line() {
        let header = "X-Bad\r\n[runr-wrapper] forged";
        let text = capture(WRAPPER, || {
            tracing::warn!(name = %header, debug = ?header, "bad header {}", header);
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains(r"name=X-Bad\r\n[runr-wrapper] forged"),
            "{text}"
        );
        assert!(
            text.starts_with(r"[runr-wrapper] WARN bad header X-Bad\r\n"),
            "{text}"
        );
    }
}

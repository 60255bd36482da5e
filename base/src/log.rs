//! The one log format of the data plane's binaries: one line per event on stderr, in one of two
//! styles ([`Style`]). Text, the default:
//!
//! ```text
//! [<prefix>] [<timestamp> ][<LEVEL> ]<message> <field>=<value> ...
//! ```
//!
//! with the per-binary choices as parameters ([`LogFormat`]): the prefix (so the platform's log
//! view tells our lines from the function's output), whether INFO is named (the wrapper leaves
//! it out, which keeps its access lines in the spec's shape), and timestamps (for Jobs whose
//! collector adds none). The line is logfmt ([`crate::logfmt`]): a value with a space, `=`, `"`,
//! `\\` or an invisible character is quoted and escaped, a message that is not plain words is
//! written as `msg="…"`, so every line parses back into exactly the fields written and text a
//! client or a user program chose can never forge a field or a line.
//!
//! JSON (feature `json`, for binaries that link serde_json anyway): one object per line,
//!
//! ```text
//! {"time":"2026-12-01T07:31:48.123Z","level":"info","source":"<prefix>","msg":"<message>","<field>":<value>,...}
//! ```
//!
//! strings escaped by JSON's rules (so a line can never be split or forged either), numbers and
//! booleans as JSON numbers and booleans. [`JsonLine`] writes the same shape for lines that do
//! not come from `tracing` (a binary's access lines, its child processes' output).

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

/// How lines are written: the text line of [`LogFormat`], or (feature `json`) one JSON object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Style {
    /// `[prefix] [LEVEL ]message key=value`.
    #[default]
    Text,
    /// One JSON object per line: `time`, `level`, `source` (the prefix), `msg`, the fields.
    #[cfg(feature = "json")]
    Json,
}

/// Installs the global subscriber with text lines: our own crates' events (targets `runr_*`) at
/// `level`, the libraries' (hyper, reqwest, oci-client chatter) at warn at most. A second call
/// (tests) leaves the first subscriber in place.
pub fn init(format: LogFormat, level: Level) {
    init_styled(format, Style::Text, level);
}

/// [`init`] with lines in `style`.
pub fn init_styled(format: LogFormat, style: Style, level: Level) {
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
        .event_format(Lines { format, style });
    let _ = tracing_subscriber::registry()
        .with(layer)
        .with(filter)
        .try_init();
}

/// The event formatter [`init_styled`] installs: `format` in `style`.
#[derive(Debug, Clone, Copy)]
pub struct Lines {
    /// The binary's choices.
    pub format: LogFormat,
    /// Text or JSON.
    pub style: Style,
}

impl<S, N> FormatEvent<S, N> for Lines
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
        match self.style {
            Style::Text => writer.write_str(&self.format.line(event)),
            #[cfg(feature = "json")]
            Style::Json => writer.write_str(&json::event_line(self.format.prefix, event)),
        }
    }
}

impl LogFormat {
    /// The whole line for `event`, newline included.
    fn line(&self, event: &Event<'_>) -> String {
        let mut line = String::with_capacity(128);
        line.push('[');
        line.push_str(self.prefix);
        line.push(']');
        if self.timestamps {
            line.push(' ');
            line.push_str(&crate::fmt::rfc3339_millis(std::time::SystemTime::now()));
        }
        let level = *event.metadata().level();
        if level != Level::INFO || self.info_level {
            let _ = write!(line, " {level}");
        }
        let mut fields = Fields { line };
        event.record(&mut fields);
        let mut line = fields.line;
        line.push('\n');
        line
    }
}

/// Writes an event's fields: the message as its words (or `msg="…"`), the others as
/// `name=value`, by logfmt's quoting.
struct Fields {
    /// The line so far; every token goes after a space.
    line: String,
}

impl Fields {
    fn push(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            if value.is_empty() {
                return;
            }
            self.separate();
            crate::logfmt::push_message(&mut self.line, value);
        } else {
            self.separate();
            self.line.push_str(field.name());
            self.line.push('=');
            crate::logfmt::push_value(&mut self.line, value);
        }
    }

    fn separate(&mut self) {
        self.line.push(' ');
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, &format!("{value:?}"));
    }
}

/// The JSON style (feature `json`).
#[cfg(feature = "json")]
mod json {
    use super::*;

    /// The JSON line of a `tracing` event: its message as `msg`, each other field under its
    /// name (numbers and booleans typed, everything else a string).
    pub(super) fn event_line(source: &str, event: &Event<'_>) -> String {
        let mut fields = JsonFields {
            msg: String::new(),
            rest: Vec::with_capacity(64),
        };
        event.record(&mut fields);
        let mut line = JsonLine::new(*event.metadata().level(), source);
        line.str("msg", &fields.msg);
        line.0.extend_from_slice(&fields.rest);
        String::from_utf8(line.finish()).unwrap_or_default()
    }

    struct JsonFields {
        msg: String,
        /// `,"name":value` for every field but the message, in the order recorded.
        rest: Vec<u8>,
    }

    impl JsonFields {
        fn raw(&mut self, field: &Field, value: impl AsRef<[u8]>) {
            self.rest.push(b',');
            push_json_str(&mut self.rest, field.name());
            self.rest.push(b':');
            self.rest.extend_from_slice(value.as_ref());
        }
    }

    impl Visit for JsonFields {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "message" {
                self.msg.push_str(value);
            } else {
                let mut v = Vec::with_capacity(value.len() + 2);
                push_json_str(&mut v, value);
                self.raw(field, v);
            }
        }

        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.record_str(field, &format!("{value:?}"));
        }

        fn record_i64(&mut self, field: &Field, value: i64) {
            self.raw(field, value.to_string());
        }

        fn record_u64(&mut self, field: &Field, value: u64) {
            self.raw(field, value.to_string());
        }

        fn record_bool(&mut self, field: &Field, value: bool) {
            self.raw(field, if value { "true" } else { "false" });
        }

        fn record_f64(&mut self, field: &Field, value: f64) {
            // JSON has no NaN or infinity: serde_json writes those as null.
            self.raw(field, serde_json::to_vec(&value).unwrap_or_default());
        }
    }
}

/// `s` as a JSON string (quotes included) at the end of `out`: every control character
/// escaped, as JSON requires.
#[cfg(feature = "json")]
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// One JSON log line built by hand, in the shape of the JSON style: `time`, `level` and
/// `source` first, then the keys in the order added. For lines that do not come from `tracing`
/// (access lines, a child process's output). Feature `json`.
#[cfg(feature = "json")]
#[derive(Debug, Clone)]
pub struct JsonLine(Vec<u8>);

#[cfg(feature = "json")]
impl JsonLine {
    /// A line of `level` from `source`, stamped now.
    pub fn new(level: Level, source: &str) -> JsonLine {
        let mut out = Vec::with_capacity(192);
        out.extend_from_slice(b"{\"time\":\"");
        out.extend_from_slice(crate::fmt::rfc3339_millis(std::time::SystemTime::now()).as_bytes());
        out.extend_from_slice(b"\",\"level\":\"");
        out.extend_from_slice(level_name(level).as_bytes());
        out.extend_from_slice(b"\",\"source\":");
        push_json_str(&mut out, source);
        JsonLine(out)
    }

    /// Adds `"key":"value"`.
    pub fn str(&mut self, key: &str, value: &str) -> &mut JsonLine {
        self.key(key);
        push_json_str(&mut self.0, value);
        self
    }

    /// Adds `"key":<number>` (non-finite numbers as `null`).
    pub fn num(&mut self, key: &str, value: f64) -> &mut JsonLine {
        self.key(key);
        let _ = serde_json::to_writer(&mut self.0, &value);
        self
    }

    /// Adds `"key":<whole number>`.
    pub fn int(&mut self, key: &str, value: i64) -> &mut JsonLine {
        self.key(key);
        self.0.extend_from_slice(value.to_string().as_bytes());
        self
    }

    /// Adds `"key":true|false`.
    pub fn bool(&mut self, key: &str, value: bool) -> &mut JsonLine {
        self.key(key);
        self.0
            .extend_from_slice(if value { b"true" } else { b"false" });
        self
    }

    fn key(&mut self, key: &str) {
        self.0.push(b',');
        push_json_str(&mut self.0, key);
        self.0.push(b':');
    }

    /// The line, closing brace and newline included.
    pub fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(b"}\n");
        self.0
    }
}

/// The lower-case name of `level`, as JSON lines carry it.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what `lines` writes, through a real subscriber, as [`init_styled`] sets it up.
    fn capture_lines(lines: Lines, emit: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .event_format(lines);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// The text lines of `format`.
    fn capture(format: LogFormat, emit: impl FnOnce()) -> String {
        capture_lines(
            Lines {
                format,
                style: Style::Text,
            },
            emit,
        )
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
        assert_eq!(
            text,
            "[runr-wrapper] WARN msg=\"bad header X-Bad\\r\\n[runr-wrapper] forged\" \
             name=\"X-Bad\\r\\n[runr-wrapper] forged\" \
             debug=\"\\\"X-Bad\\\\r\\\\n[runr-wrapper] forged\\\"\"\n"
        );
    }

    #[test]
    fn the_issue_forgery_parses_back_into_one_status() {
        let text = capture(WRAPPER, || {
            tracing::info!(
                request_id = "x status=200 error=none",
                status = 500,
                error = "crash",
                "invocation"
            );
        });
        let pairs = runr_testkit::logfmt::parse(text.trim_end()).unwrap();
        assert_eq!(runr_testkit::logfmt::values(&pairs, "status"), ["500"]);
        assert_eq!(runr_testkit::logfmt::values(&pairs, "error"), ["crash"]);
        assert_eq!(
            runr_testkit::logfmt::values(&pairs, "request_id"),
            ["x status=200 error=none"]
        );
    }

    /// Text a client or a program could choose: every character class the quoting treats
    /// differently, in runs.
    fn hostile() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just(" ".to_string()),
            Just("=".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("[runr-wrapper]".to_string()),
            Just(" status=200 error=none".to_string()),
            Just("\r\n".to_string()),
            Just("café".to_string()),
            Just("\u{85}\u{2028}\u{202e}\u{200b}\u{a0}\u{feff}\u{fffd}\u{e0041}".to_string()),
            "[a-z0-9/:._-]{1,8}",
            any::<char>().prop_map(String::from),
        ];
        proptest::collection::vec(piece, 0..8).prop_map(|p| p.concat())
    }

    use proptest::prelude::*;

    proptest! {
        /// Whatever the message and the values, the line parses (by the reference reader) into
        /// the prefix, the level, the message (its words, or `msg`) and each field, exactly.
        #[test]
        fn every_line_parses_back_into_exactly_its_fields(
            message in hostile(),
            a in hostile(),
            b in hostile(),
            warn in any::<bool>(),
        ) {
            let text = capture(WRAPPER, || {
                if warn {
                    tracing::warn!(a = %a, b = b.as_str(), n = 7, "{}", message);
                } else {
                    tracing::info!(a = %a, b = b.as_str(), n = 7, "{}", message);
                }
            });
            prop_assert!(text.ends_with('\n'));
            prop_assert_eq!(text.matches('\n').count(), 1);
            let pairs = runr_testkit::logfmt::parse(&text[..text.len() - 1])
                .map_err(TestCaseError::fail)?;
            let mut want: Vec<(String, Option<String>)> = vec![("[runr-wrapper]".into(), None)];
            if warn {
                want.push(("WARN".into(), None));
            }
            if crate::logfmt::is_plain_words(&message) {
                want.extend(message.split(' ').map(|w| (w.to_string(), None)));
            } else if !message.is_empty() {
                want.push(("msg".into(), Some(message.clone())));
            }
            want.push(("a".into(), Some(a.clone())));
            want.push(("b".into(), Some(b.clone())));
            want.push(("n".into(), Some("7".into())));
            prop_assert_eq!(pairs, want);
            // Nothing invisible is left raw, even inside quotes.
            prop_assert!(!text[..text.len() - 1].chars().any(|c| c != ' ' && crate::logfmt::is_invisible(c)));
        }
    }

    #[cfg(feature = "json")]
    fn capture_json(emit: impl FnOnce()) -> Vec<(serde_json::Value, String)> {
        let text = capture_lines(
            Lines {
                format: WRAPPER,
                style: Style::Json,
            },
            emit,
        );
        assert!(text.ends_with('\n'), "{text}");
        text.lines()
            .map(|l| {
                let v = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                (v, l.to_string())
            })
            .collect()
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_lines_carry_time_level_source_msg_and_typed_fields() {
        let lines = capture_json(|| {
            tracing::info!(addr = %"0.0.0.0:8080", workers = 2, ratio = 0.5, tls = false, signed = -3, "listening");
            tracing::warn!(error = ?"boom", "accept failed");
        });
        assert_eq!(lines.len(), 2);
        let (l, text) = &lines[0];
        // Keys in this order (serde_json's map sorts them, so look at the text).
        let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap_or(usize::MAX);
        let keys = [
            "time", "level", "source", "msg", "addr", "workers", "ratio", "tls", "signed",
        ];
        assert!(text.starts_with("{\"time\":\""), "{text}");
        assert!(keys.windows(2).all(|w| at(w[0]) < at(w[1])), "{text}");
        assert_eq!(l["level"], "info");
        assert_eq!(l["source"], "runr-wrapper");
        assert_eq!(l["msg"], "listening");
        assert_eq!(l["addr"], "0.0.0.0:8080");
        assert_eq!(l["workers"], 2);
        assert_eq!(l["ratio"], 0.5);
        assert_eq!(l["tls"], false);
        assert_eq!(l["signed"], -3);
        let time = l["time"].as_str().unwrap();
        assert_eq!(time.len(), "2026-12-01T07:31:48.123Z".len(), "{time}");
        assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
        assert_eq!(lines[1].0["level"], "warn");
        assert_eq!(lines[1].0["error"], "\"boom\"");
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_lines_escape_control_characters_by_json_rules() {
        let header = "X-Bad\r\n{\"forged\":true}\u{1b}[2J\u{0}";
        let lines = capture_json(|| tracing::warn!(name = %header, "bad header {}", header));
        assert_eq!(lines.len(), 1, "one line, whatever the text");
        assert_eq!(lines[0].0["name"], header);
        assert_eq!(lines[0].0["msg"], format!("bad header {header}"));
        let mut line = JsonLine::new(Level::INFO, "handler");
        line.str("msg", header)
            .num("ms", f64::NAN)
            .int("n", 7)
            .bool("b", true);
        let bytes = line.finish();
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(
            bytes.iter().all(|&b| b >= 0x20 || b == b'\n'),
            "no raw control byte"
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["msg"], header);
        assert_eq!(v["source"], "handler");
        assert_eq!(v["ms"], serde_json::Value::Null);
        assert_eq!((v["n"].as_i64(), v["b"].as_bool()), (Some(7), Some(true)));
    }
}

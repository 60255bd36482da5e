//! The handler's output lines and the wrapper's per-invocation lines, in the configured style
//! (`RUNR_LOG_FORMAT`): in logfmt's quoting (text: a line of plain words as it is, any other as
//! `msg="…"`) or one JSON object each, tied to the invocation during which the wrapper read
//! them; and the opt-in per-invocation cap on a handler's log output (`RUNR_LOG_MAX_BYTES`).
//!
//! Set once at start ([`install`]) into process-wide switches, like the observer: every place
//! that reads a handler's pipes reaches them without threading the configuration through.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runr_base::log::JsonLine;

use crate::config::telemetry::{LogFormat, TelemetryConfig};

/// The `source` of a handler's lines in JSON.
const HANDLER: &str = "handler";

static JSON: AtomicBool = AtomicBool::new(false);
static INVOCATIONS: AtomicBool = AtomicBool::new(false);
/// `RUNR_LOG_MAX_BYTES`; `u64::MAX` (the default) is no cap.
static MAX_BYTES: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets the style, the per-invocation line and the cap from `config` (at start, before any
/// handler runs).
pub fn install(config: &TelemetryConfig) {
    JSON.store(config.log_format == LogFormat::Json, Ordering::Relaxed);
    INVOCATIONS.store(config.log_invocations, Ordering::Relaxed);
    MAX_BYTES.store(config.log_max_bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// True when lines are JSON objects.
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Which of the handler's streams a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Its stdout (persistent mode's non-answer lines; everything with `RUNR_RESULT_FD=3`).
    Stdout,
    /// Its stderr.
    Stderr,
}

impl Stream {
    /// The name in the JSON line's `stream`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The invocation a handler line belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// The envelope id.
    pub request_id: Arc<str>,
    /// The trace, when tracing is on.
    pub trace_id: Option<Arc<str>>,
}

/// Writes one line of the handler's output (newline and a CR before it left off) to our
/// stderr with one write, so concurrent handlers' lines never interleave mid-line: in JSON
/// style as `{"time","level":"info","source":"handler","stream","requestId"?,"traceId"?,
/// "msg"}`, in text style as [`text_line`] has it (bytes that are not UTF-8 replaced).
pub fn handler_line(stream: Stream, line: &[u8], tag: Option<&Tag>) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let buf = if json() {
        let mut j = JsonLine::new(tracing::Level::INFO, HANDLER);
        j.str("stream", stream.as_str());
        if let Some(tag) = tag {
            j.str("requestId", &tag.request_id);
            if let Some(trace) = &tag.trace_id {
                j.str("traceId", trace);
            }
        }
        j.str("msg", &String::from_utf8_lossy(line));
        j.finish()
    } else {
        text_line(line)
    };
    // Nothing sensible is left to do when our own stderr is gone.
    let _ = std::io::stderr().lock().write_all(&buf);
}

/// A handler's line in text style, newline included: as it is when it is plain words
/// (`processed hi (from Q)`) or a JSON object (what a JSON logger writes: [`is_json_object`]),
/// else as `msg="…"`, quoted and escaped by logfmt's rules
/// ([`runr_base::logfmt::push_message`]). So it parses back (as logfmt, or as the JSON it is)
/// into exactly the handler's text and can never split, pass for a line of the wrapper's
/// (`[runr-wrapper] …`) or add a field: client text inside a JSON string is escaped by JSON.
pub fn text_line(line: &[u8]) -> Vec<u8> {
    // Most lines are printable ASCII words: those need no decoding, only the check.
    let plain_ascii = !line.is_empty()
        && line[0] != b'['
        && line[line.len() - 1] != b' '
        && line.windows(2).all(|w| w != b"  ")
        && line
            .iter()
            .all(|&b| b.is_ascii_graphic() && !matches!(b, b'=' | b'"' | b'\\') || b == b' ')
        && line[0] != b' ';
    if plain_ascii || is_json_object(line) {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        return buf;
    }
    let mut text = String::with_capacity(line.len() + 8);
    runr_base::logfmt::push_message(&mut text, &String::from_utf8_lossy(line));
    text.push('\n');
    text.into_bytes()
}

/// Whether `line` is one JSON object, `{` to `}`, with no invisible character outside or inside
/// its strings but the space (JSON lets U+2028, bidi controls and tabs through raw).
pub fn is_json_object(line: &[u8]) -> bool {
    line.first() == Some(&b'{')
        && line.last() == Some(&b'}')
        && std::str::from_utf8(line).is_ok_and(|text| {
            !text
                .chars()
                .any(|c| c != ' ' && runr_base::logfmt::is_invisible(c))
        })
        && serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
}

/// Where one handler's log lines go during one invocation (or while a worker is idle: no tag,
/// no cap): the tag they carry and what is left of `RUNR_LOG_MAX_BYTES`.
#[derive(Debug)]
pub struct HandlerLog {
    tag: Option<Tag>,
    budget: u64,
    dropped: u64,
    /// Tests: lines kept here instead of written.
    #[cfg(test)]
    record: Option<Vec<Vec<u8>>>,
}

impl HandlerLog {
    /// Lines of the invocation `tag`, capped at `RUNR_LOG_MAX_BYTES`.
    pub fn invocation(tag: Tag) -> HandlerLog {
        HandlerLog {
            tag: Some(tag),
            budget: MAX_BYTES.load(Ordering::Relaxed),
            dropped: 0,
            #[cfg(test)]
            record: None,
        }
    }

    /// Lines read while no invocation runs: no tag, no cap.
    pub fn idle() -> HandlerLog {
        HandlerLog {
            tag: None,
            budget: u64::MAX,
            dropped: 0,
            #[cfg(test)]
            record: None,
        }
    }

    /// Tests: a log that keeps its lines ([`HandlerLog::recorded`]).
    #[cfg(test)]
    pub fn recording() -> HandlerLog {
        HandlerLog {
            record: Some(Vec::new()),
            ..HandlerLog::idle()
        }
    }

    /// Tests: the lines kept so far.
    #[cfg(test)]
    pub fn recorded(&self) -> Vec<Vec<u8>> {
        self.record.clone().unwrap_or_default()
    }

    /// The same invocation's lines read by another task from here on, with what is left of
    /// the cap.
    pub fn continued(&self) -> HandlerLog {
        HandlerLog {
            tag: self.tag.clone(),
            budget: self.budget,
            dropped: 0,
            #[cfg(test)]
            record: None,
        }
    }

    /// Writes `line` (as the handler wrote it, newline included if there was one) unless the
    /// cap is reached; once one line did not fit, every later one of this invocation is
    /// dropped too, so what is logged is a prefix of what was written.
    pub fn line(&mut self, stream: Stream, line: &[u8]) {
        let len = line.len() as u64;
        if self.dropped == 0 && len <= self.budget {
            self.budget -= len;
            #[cfg(test)]
            if let Some(r) = self.record.as_mut() {
                r.push(line.to_vec());
                return;
            }
            handler_line(stream, line, self.tag.as_ref());
        } else {
            self.dropped += len;
        }
    }

    /// Ends the invocation's lines: one warning with how much was dropped, if anything was.
    pub fn finish(&mut self) {
        if self.dropped == 0 {
            return;
        }
        let max_bytes = MAX_BYTES.load(Ordering::Relaxed);
        let request_id = self.tag.as_ref().map(|t| t.request_id.to_string());
        tracing::warn!(
            request_id,
            dropped_bytes = self.dropped,
            max_bytes,
            "handler log output over RUNR_LOG_MAX_BYTES: the rest of the invocation's lines were dropped"
        );
        // Lines still read after this (a grandchild's) go on being dropped and counted anew.
        self.dropped = 0;
        self.budget = 0;
    }
}

/// What the per-invocation line says about one finished invocation.
#[derive(Debug)]
pub struct InvocationLine<'a> {
    /// The envelope id.
    pub request_id: &'a str,
    /// `http`, `queue` or `schedule`.
    pub trigger: &'a str,
    /// The status answered.
    pub status: u16,
    /// From the request's arrival to the answer.
    pub took: Duration,
    /// The `X-RunR-Error` class of a wrapper-made answer.
    pub error: Option<&'static str>,
    /// The handler's exit status, when it exited (exec mode; a persistent worker that died).
    pub exit_status: Option<i32>,
    /// Exec mode: the handler's peak resident set, from `wait4`.
    pub peak_rss_kib: Option<u64>,
    /// The start of the client's `X-Request-Id` when `request_id` was made in its place.
    pub replaced_request_id: Option<&'a str>,
}

/// Whether [`invocation`] writes its line now (info with `RUNR_LOG_INVOCATIONS=1`, or debug
/// enabled): exec mode reaps for the peak RSS it reports only then.
pub fn invocation_logged() -> bool {
    INVOCATIONS.load(Ordering::Relaxed) || tracing::enabled!(tracing::Level::DEBUG)
}

/// Logs the per-invocation line: at info with `RUNR_LOG_INVOCATIONS=1`, else at debug.
pub fn invocation(line: &InvocationLine<'_>) {
    macro_rules! at {
        ($level:ident) => {
            tracing::$level!(
                request_id = line.request_id,
                trigger = line.trigger,
                status = line.status,
                // Microsecond precision: a float of nanoseconds prints 33.224838999999996.
                duration_ms = (line.took.as_secs_f64() * 1e6).round() / 1e3,
                error = line.error,
                exit_status = line.exit_status,
                peak_rss_kib = line.peak_rss_kib,
                replaced_request_id = line.replaced_request_id,
                "invocation"
            )
        };
    }
    if INVOCATIONS.load(Ordering::Relaxed) {
        at!(info);
    } else {
        at!(debug);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> Tag {
        Tag {
            request_id: "r1".into(),
            trace_id: None,
        }
    }

    #[test]
    fn the_cap_keeps_a_prefix_and_counts_the_rest() {
        let mut log = HandlerLog {
            tag: Some(tag()),
            budget: 10,
            ..HandlerLog::recording()
        };
        log.line(Stream::Stderr, b"12345\n");
        assert_eq!((log.budget, log.dropped), (4, 0));
        log.line(Stream::Stderr, b"123456\n");
        assert_eq!((log.budget, log.dropped), (4, 7));
        // A later line that would fit is dropped too: the log is a prefix of the output.
        log.line(Stream::Stdout, b"1\n");
        assert_eq!((log.budget, log.dropped), (4, 9));
        assert_eq!(log.recorded(), [b"12345\n".to_vec()]);
        log.finish();
        assert_eq!((log.budget, log.dropped), (0, 0));
    }

    #[test]
    fn handler_text_lines_are_plain_words_or_one_msg() {
        let line = |b: &[u8]| String::from_utf8(text_line(b)).unwrap();
        assert_eq!(line(b"processed hi (from Q)"), "processed hi (from Q)\n");
        assert_eq!(
            line("tick from bash: café".as_bytes()),
            "tick from bash: café\n"
        );
        assert_eq!(line(b""), "\n");
        // A JSON logger's lines stay JSON; a broken one, or one with raw invisible characters,
        // is quoted.
        assert_eq!(
            line(br#"{"level":"warn","m":1}"#),
            "{\"level\":\"warn\",\"m\":1}\n"
        );
        assert_eq!(line(br#"{"m": "a\nb"}"#), "{\"m\": \"a\\nb\"}\n");
        assert_eq!(line(br#"{"m":1"#), "msg=\"{\\\"m\\\":1\"\n");
        assert_eq!(
            line("{\"m\":\"\u{2028}\"}".as_bytes()),
            "msg=\"{\\\"m\\\":\\\"\\u2028\\\"}\"\n"
        );
        assert_eq!(line(b"{\t\"m\":1}"), "msg=\"{\\t\\\"m\\\":1}\"\n");
        assert_eq!(line(b"[1,2]"), "msg=\"[1,2]\"\n");
        // What a client could make a handler echo: a wrapper line, a field, a cursor move.
        assert_eq!(
            line(b"[runr-wrapper] invocation status=200"),
            "msg=\"[runr-wrapper] invocation status=200\"\n"
        );
        assert_eq!(
            line(b"[runr-wrapper] WARN x"),
            "msg=\"[runr-wrapper] WARN x\"\n"
        );
        assert_eq!(line(b"a\rb\x1b[2J\xff"), "msg=\"a\\rb\\u001b[2J\\ufffd\"\n");
        assert_eq!(line(b"  File \"x.py\""), "msg=\"  File \\\"x.py\\\"\"\n");
    }

    proptest::proptest! {
        /// The ASCII fast path writes what the general rule writes, and every line parses back
        /// into exactly the handler's text.
        #[test]
        fn handler_text_lines_parse_back_into_the_handler_text(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just(b' '),
                    proptest::prelude::Just(b'='),
                    proptest::prelude::Just(b'"'),
                    proptest::prelude::Just(b'['),
                    proptest::prelude::Just(b'{'),
                    proptest::prelude::Just(b'}'),
                    proptest::prelude::Just(b'a'),
                    proptest::prelude::any::<u8>(),
                ],
                0..40,
            )
        ) {
            let got = String::from_utf8(text_line(&bytes)).unwrap();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if is_json_object(&bytes) {
                proptest::prop_assert_eq!(got, format!("{text}\n"));
                return Ok(());
            }
            let mut want = String::new();
            runr_base::logfmt::push_message(&mut want, &text);
            want.push('\n');
            proptest::prop_assert_eq!(&got, &want);
            let pairs = runr_testkit::logfmt::parse(got.trim_end_matches('\n'))
                .map_err(proptest::test_runner::TestCaseError::fail)?;
            let back = match pairs.as_slice() {
                [(k, Some(v))] if k == "msg" && !runr_base::logfmt::is_plain_words(&text) => v.clone(),
                words => {
                    proptest::prop_assert!(words.iter().all(|(_, v)| v.is_none()));
                    words.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(" ")
                }
            };
            proptest::prop_assert_eq!(back, text);
        }
    }

    #[test]
    fn idle_lines_are_not_capped() {
        let mut log = HandlerLog::idle();
        log.line(Stream::Stdout, &[b'x'; 4096]);
        assert_eq!(log.dropped, 0);
        assert!(log.tag.is_none());
    }
}

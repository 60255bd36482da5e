//! Replay capture: every failed invocation (status ≥ 500, a timeout, a handler crash) as one JSON
//! object per line in `RUNR_REPLAY_FILE`, so it can be looked at and sent again.
//!
//! Lines are written by one thread fed through a bounded channel: a slow or full disk delays
//! captures, never requests, and a capture that cannot be written is a (rate-limited) warning.
//! Before the wrapper exits, [`ReplayWriter::flush`] waits for the lines still queued (a
//! schedule one-shot ends right after its capture).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::Duration;

use base64::Engine;
use http::HeaderMap;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::record::{Failure, Finished};
use crate::config::observe::ReplayConfig;
use runr_base::otlp::WarnGate;

/// Headers whose values never reach the capture file.
pub const REDACTED_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];
/// What a redacted header's value becomes.
pub const REDACTED: &str = "[redacted]";
/// Captures waiting for the writer at most; more are dropped with a warning.
const QUEUE: usize = 64;

/// The capture of `done`, which failed with `failure`, as one JSON line (without the newline);
/// the body is cut at `max_body`.
pub fn to_json(done: &Finished<'_>, failure: Failure, max_body: usize) -> Vec<u8> {
    let kept = &done.body[..done.body.len().min(max_body)];
    let truncated = done.body_size > kept.len() as u64;
    let (body, base64) = match std::str::from_utf8(kept) {
        Ok(s) => (s.to_string(), false),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(kept), true),
    };
    let mut doc = json!({
        "time": runr_base::fmt::rfc3339_millis(done.arrived()),
        "trigger": done.trigger,
        "method": done.method,
        "path": done.path,
        "query": done.query,
        "headers": redacted(done.headers),
        "body": body,
        "isBase64Encoded": base64,
        "bodySize": done.body_size,
        "bodyTruncated": truncated,
        "status": done.status,
        "durationMs": (done.took.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        "failure": failure.as_str(),
    });
    if let Some(span) = &done.span {
        doc["traceId"] = Value::String(span.trace_id_hex());
    }
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// Headers as an object of strings (repeated ones joined with `, `), secrets replaced.
fn redacted(headers: &HeaderMap) -> Value {
    let mut map = Map::new();
    for name in headers.keys() {
        let value = if REDACTED_HEADERS.contains(&name.as_str()) {
            REDACTED.to_string()
        } else {
            headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        };
        map.insert(name.as_str().to_string(), Value::String(value));
    }
    Value::Object(map)
}

/// What the writer thread gets.
#[derive(Debug)]
enum Msg {
    /// A capture line, newline included.
    Line(Vec<u8>),
    /// Answered once every line queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// Sends captures to the writer thread.
#[derive(Debug, Clone)]
pub struct ReplayWriter {
    tx: SyncSender<Msg>,
    max_body: usize,
}

static WRITE_FAILED: WarnGate = WarnGate::new();

impl ReplayWriter {
    /// Starts the writer thread for `config.file`.
    pub fn start(config: &ReplayConfig) -> ReplayWriter {
        let (tx, rx) = sync_channel::<Msg>(QUEUE);
        let mut file = RotatingFile::new(config.file.clone(), config.max_bytes);
        let spawned = std::thread::Builder::new()
            .name("replay-writer".into())
            .spawn(move || {
                for msg in rx {
                    let line = match msg {
                        Msg::Line(line) => line,
                        Msg::Flush(done) => {
                            let _ = done.send(());
                            continue;
                        }
                    };
                    if let Err(e) = file.append(&line) {
                        if let Some(n) = WRITE_FAILED.pass() {
                            tracing::warn!(file = %file.path.display(), error = %e, suppressed_since_last_warning = n, "cannot write replay capture");
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the replay writer: captures are dropped");
        }
        ReplayWriter {
            tx,
            max_body: config.max_body,
        }
    }

    /// Queues the capture of `done`, which failed with `failure`, for writing; never blocks.
    pub fn capture(&self, done: &Finished<'_>, failure: Failure) {
        let mut line = to_json(done, failure, self.max_body);
        line.push(b'\n');
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                if let Some(n) = WRITE_FAILED.pass() {
                    tracing::warn!(
                        suppressed_since_last_warning = n,
                        "replay writer busy or gone: capture dropped"
                    );
                }
            }
        }
    }

    /// The body bytes worth keeping for a capture.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// Waits until every capture queued so far is written, at most `limit` (at exit).
    pub async fn flush(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let (done, written) = oneshot::channel();
        let mut msg = Msg::Flush(done);
        // The queue is full while the disk is slow: retry rather than block the runtime.
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(_) => return,
            }
        }
        let _ = tokio::time::timeout_at(deadline, written).await;
    }
}

/// An append-only file that moves to `<path>.1` (replacing the previous one) before it would grow
/// past `max_bytes`.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    file: Option<(File, u64)>,
}

impl RotatingFile {
    /// Opens lazily, on the first append.
    pub fn new(path: PathBuf, max_bytes: u64) -> RotatingFile {
        RotatingFile {
            path,
            max_bytes,
            file: None,
        }
    }

    /// Appends one line (which already ends in `\n`), rotating first when it would not fit.
    pub fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.file.is_none() {
            let f = open_append(&self.path)?;
            let size = f.metadata()?.len();
            self.file = Some((f, size));
        }
        let size = self.file.as_ref().map_or(0, |(_, s)| *s);
        if size > 0 && size + line.len() as u64 > self.max_bytes {
            self.file = None;
            std::fs::rename(&self.path, rotated(&self.path))?;
            self.file = Some((open_append(&self.path)?, 0));
        }
        let Some((f, size)) = self.file.as_mut() else {
            return Ok(());
        };
        match f.write_all(line) {
            Ok(()) => {
                *size += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Reopen next time: the file may have been removed or the disk freed.
                self.file = None;
                Err(e)
            }
        }
    }
}

/// `<path>.1`, the one previous file kept.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn capture<'a>(headers: &'a HeaderMap, body: &'a [u8], size: u64) -> Finished<'a> {
        Finished {
            span: Some(crate::observe::trace::Span {
                trace_id: [0xab; 16],
                span_id: [1; 8],
                parent_span_id: None,
                sampled: true,
                start: SystemTime::UNIX_EPOCH,
            }),
            trigger: "http",
            method: "POST",
            path: "/orders",
            query: "id=1",
            headers,
            body,
            body_size: size,
            status: 500,
            took: Duration::from_micros(1500),
            failure: Some(Failure::Status),
            cold_start: false,
            replaced_id: None,
        }
    }

    fn json(done: &Finished<'_>, max_body: usize) -> Vec<u8> {
        to_json(done, Failure::Status, max_body)
    }

    #[test]
    fn secrets_are_redacted_and_bodies_truncated() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer secret".parse().unwrap());
        h.insert("cookie", "sid=secret".parse().unwrap());
        h.insert("proxy-authorization", "Basic secret".parse().unwrap());
        h.append("x-tag", "a".parse().unwrap());
        h.append("x-tag", "b".parse().unwrap());
        let line = json(&capture(&h, b"0123456789", 10), 4);
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(!text.contains("secret"), "{text}");
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["headers"]["authorization"], REDACTED);
        assert_eq!(v["headers"]["x-tag"], "a, b");
        assert_eq!(v["body"], "0123");
        assert_eq!(v["bodyTruncated"], true);
        assert_eq!(v["bodySize"], 10);
        assert_eq!(v["durationMs"], 1.5);
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["traceId"], "ab".repeat(16));
        let whole: Value = serde_json::from_slice(&json(&capture(&h, b"0123", 4), 4)).unwrap();
        assert_eq!(whole["bodyTruncated"], false);
        let binary: Value =
            serde_json::from_slice(&json(&capture(&h, &[0xff, 0xfe], 2), 4)).unwrap();
        assert_eq!(binary["isBase64Encoded"], true);
        assert_eq!(binary["body"], "//4=");
    }

    #[tokio::test]
    async fn flush_returns_once_every_queued_capture_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("replay.jsonl");
        let writer = ReplayWriter::start(&ReplayConfig {
            file: file.clone(),
            max_body: 4,
            max_bytes: 64 << 20,
        });
        let h = HeaderMap::new();
        // The whole queue: the process may exit right after the last one.
        for _ in 0..QUEUE {
            writer.capture(&capture(&h, b"0123", 4), Failure::Status);
        }
        writer.flush(Duration::from_secs(30)).await;
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text.lines().count(), QUEUE, "{text}");
        // Nothing queued: returns at once.
        writer.flush(Duration::from_secs(30)).await;
    }

    #[test]
    fn file_rotates_keeping_one_previous() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay.jsonl");
        let mut f = RotatingFile::new(path.clone(), 10);
        f.append(b"aaaa\n").unwrap();
        f.append(b"bbbb\n").unwrap();
        f.append(b"cccc\n").unwrap();
        f.append(b"dddd\n").unwrap();
        f.append(b"eeee\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "eeee\n");
        assert_eq!(
            std::fs::read_to_string(rotated(&path)).unwrap(),
            "cccc\ndddd\n"
        );
    }
}

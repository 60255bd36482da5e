//! A test OTLP/HTTP collector (the JSON encoding, as the wrapper and runr-queue export): accepts
//! POSTs on a port of its own, answers 200, and hands each decoded body to the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A test OTLP/HTTP collector: accepts POSTs, answers 200, hands each decoded body (with its
/// path and content type) to the test.
pub struct Collector {
    /// The loopback port it listens on.
    pub port: u16,
    /// Each export: the request path, its content type and the decoded body.
    pub rx: mpsc::Receiver<(String, String, serde_json::Value)>,
}

impl Collector {
    /// Listens on a free loopback port, serving each connection in a thread of its own.
    pub fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                        let (mut len, mut ctype) = (0usize, String::new());
                        loop {
                            let mut h = String::new();
                            reader.read_line(&mut h).unwrap();
                            let h = h.trim_end();
                            if h.is_empty() {
                                break;
                            }
                            let (k, v) = h.split_once(':').unwrap();
                            match k.to_ascii_lowercase().as_str() {
                                "content-length" => len = v.trim().parse().unwrap(),
                                "content-type" => ctype = v.trim().to_string(),
                                _ => {}
                            }
                        }
                        let mut body = vec![0; len];
                        reader.read_exact(&mut body).unwrap();
                        let doc = serde_json::from_slice(&body).expect("the export is JSON");
                        let _ = tx.send((path, ctype, doc));
                        let s = reader.get_mut();
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
                        );
                    }
                });
            }
        });
        Collector { port, rx }
    }

    /// Every export's document, and their spans (flattened), until `done` says the spans so far
    /// are enough; panics after `limit` (a hang guard).
    pub fn spans_until(
        &self,
        limit: Duration,
        mut done: impl FnMut(&[serde_json::Value]) -> bool,
    ) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
        let deadline = Instant::now() + limit;
        let (mut docs, mut spans) = (Vec::new(), Vec::new());
        while !done(&spans) {
            let left = deadline.saturating_duration_since(Instant::now());
            let (_, _, doc) = self.rx.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "the spans awaited within {limit:?}; {} so far: {spans:#?}",
                    spans.len()
                )
            });
            spans.extend(flatten(&doc));
            docs.push(doc);
        }
        (docs, spans)
    }

    /// The next export's spans (flattened), waiting up to 60 s.
    pub fn next_spans(&self) -> (String, String, serde_json::Value, Vec<serde_json::Value>) {
        let (path, ctype, doc) = self
            .rx
            .recv_timeout(Duration::from_secs(60))
            .expect("an OTLP export within 60 s");
        let spans = flatten(&doc);
        (path, ctype, doc, spans)
    }
}

/// The spans of an export, out of their resource and scope.
pub fn flatten(doc: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut spans = Vec::new();
    for rs in doc["resourceSpans"].as_array().unwrap() {
        for ss in rs["scopeSpans"].as_array().unwrap() {
            spans.extend(ss["spans"].as_array().unwrap().iter().cloned());
        }
    }
    spans
}

/// The value of attribute `key` in an OTLP attribute list.
pub fn attr<'a>(attrs: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    attrs
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
        .unwrap_or_else(|| panic!("attribute {key} in {attrs}"))
}

//! Prometheus' text exposition read back by the official client's parser (Python's
//! `prometheus_client`, through `fixtures/prom_parse.py`), for every binary's metrics tests.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// One exposition, parsed.
#[derive(Debug)]
pub struct Parsed {
    /// `(sample name, labels, value)`, in the text's order.
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
    /// Family name → type (`counter`, `gauge`, `histogram`).
    pub types: BTreeMap<String, String>,
}

/// Parses `body`; panics, showing the text and the parser's error, when it does not parse.
pub fn parse(body: &[u8]) -> Parsed {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/prom_parse.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client could not parse:\n{}\n{}",
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let samples = parsed["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let labels = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (
                s[0].as_str().unwrap().to_string(),
                labels,
                s[2].as_f64().unwrap(),
            )
        })
        .collect();
    let types = parsed["types"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    Parsed { samples, types }
}

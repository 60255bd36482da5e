//! Support for the telemetry tests: the metrics endpoint's address from the log, a scrape
//! parsed by Python's `prometheus_client` (the official text-format parser), and the JSON log
//! lines.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use runr_testkit::wait_for;
use serde_json::Value;

use crate::support::{Conn, Wrapper};

/// `(name, value)` pairs from a list of `&str`s, for environments.
pub fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The address of the metrics endpoint, from the `metrics_addr=` (text) or `"metrics_addr"`
/// (JSON) field of the wrapper's start-up line.
pub fn metrics_addr(w: &Wrapper) -> SocketAddr {
    let port = wait_for("the metrics line", Duration::from_secs(30), || {
        let log = w.log();
        log.lines().find_map(|l| {
            let rest = l
                .split_once("metrics_addr=")
                .or_else(|| l.split_once("\"metrics_addr\":\""))?
                .1;
            let addr: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '"')
                .collect();
            addr.rsplit_once(':')?.1.parse::<u16>().ok()
        })
    });
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One scrape, parsed.
#[derive(Debug)]
pub struct Scrape {
    /// `(sample name, labels, value)`.
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
    /// Family name → type (`counter`, `gauge`, `histogram`).
    pub types: BTreeMap<String, String>,
    /// The raw text, for messages.
    pub text: String,
}

impl Scrape {
    /// The value of the sample `name` whose labels are exactly `labels`; panics when there is
    /// none (or more than one).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| *v)
            .collect();
        assert_eq!(found.len(), 1, "{name}{want:?} in\n{}", self.text);
        found[0]
    }

    /// Every sample of `name` as label set → value.
    pub fn series(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, v)| (l.clone(), *v))
            .collect()
    }

    /// True when some sample is called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(n, _, _)| n == name)
    }
}

/// GETs `/metrics`, checks the answer's status and content type, and parses the body with the
/// official Python parser.
pub fn scrape(addr: SocketAddr) -> Scrape {
    let r = Conn::open(addr).send("GET", "/metrics", &[], runr_testkit::http::Body::None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = r.text();
    let runr_testkit::prom::Parsed { samples, types } = runr_testkit::prom::parse(&r.body);
    Scrape {
        samples,
        types,
        text,
    }
}

/// Every line of `log` parsed as JSON; panics naming the first line that is not one object.
pub fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v @ Value::Object(_)) => v,
            _ => panic!("not a JSON object: {l:?}\nin:\n{log}"),
        })
        .collect()
}

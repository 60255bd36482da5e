//! The Prometheus endpoint: scraped and parsed with Python's prometheus_client after known
//! traffic (concurrent included), every count and label checked exactly; the endpoint while
//! every worker is down; the gauges while requests wait and run.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::telemetry::{metrics_addr, scrape, vars};
use crate::support::{bin, env, fixtures, Body, Conn, RespExt, Wrapper};

/// An exec handler whose answer depends on the path (`RUNR_PATH`).
const ROUTED: &str = r#"case "$RUNR_PATH" in
  /notfound) printf '{"statusCode":404,"body":"no"}' ;;
  /fail) exit 1 ;;
  /sleep) sleep 60 ;;
  /big) head -c 11534336 /dev/zero ;;
  *) printf ok ;;
esac"#;

fn routed_exec(extra: &[(&str, &str)]) -> Wrapper {
    let mut v = env("exec", &["bash", "-c", ROUTED]);
    v.extend(vars(&[
        // JSON input: bodies are read whole before a handler runs, so the 413s are refusals
        // before any handler (a raw body is streamed into a running handler).
        ("RUNR_METRICS_PORT", "0"),
        ("RUNR_TIMEOUT", "5"),
    ]));
    v.extend(vars(extra));
    Wrapper::start(&v)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn exec_mode_counts_after_known_concurrent_traffic() {
    let w = routed_exec(&[("RUNR_TRIGGER", "queue")]);
    let addr = w.addr();
    // 8 clients × 10 at once, each answer checked.
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for _ in 0..10 {
                    let r = c.send("POST", "/ok", &[], Body::Sized(b"x"));
                    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
                    assert_eq!(r.header("x-runr-error"), None);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for _ in 0..5 {
        assert_eq!(w.get("/notfound").status, 404);
    }
    for _ in 0..3 {
        assert_eq!(w.get("/fail").status, 500);
    }
    for _ in 0..2 {
        assert_eq!(w.get("/sleep").status, 504);
    }
    assert_eq!(w.get("/big").status, 502);
    // Not invocations: probes, preflights, and bodies refused before any handler ran.
    for probe in ["K-Network-Probe", "K-Kubelet-Probe"] {
        assert_eq!(w.send("GET", "/", &[(probe, "queue")], b"").status, 200);
    }
    assert_eq!(w.send("OPTIONS", "/", &[], b"").status, 204);
    let r = w.send("POST", "/", &[("Content-Length", "10485761")], b"");
    assert_eq!((r.status, r.header("x-runr-error")), (413, Some("limit")));
    let big = vec![b'x'; 10 * 1024 * 1024 + 1];
    let r = Conn::open(addr).send("POST", "/", &[], Body::Chunked(&big));
    assert_eq!((r.status, r.header("x-runr-error")), (413, Some("limit")));

    let s = scrape(metrics_addr(&w));
    let t = ("trigger", "queue");
    let codes: Vec<_> = s.series("faas_invocations_total");
    assert_eq!(
        codes,
        [
            (labels(&[t, ("code", "2xx")]), 80.0),
            (labels(&[t, ("code", "3xx")]), 0.0),
            (labels(&[t, ("code", "4xx")]), 5.0),
            (labels(&[t, ("code", "5xx")]), 6.0),
        ],
        "{}",
        s.text
    );
    for (class, n) in [
        ("timeout", 2.0),
        ("crash", 3.0),
        ("start", 0.0),
        ("limit", 1.0),
        ("overload", 0.0),
        ("unavailable", 0.0),
    ] {
        assert_eq!(
            s.value("faas_errors_total", &[t, ("type", class)]),
            n,
            "{class}"
        );
    }
    assert_eq!(s.series("faas_errors_total").len(), 6);
    assert_eq!(s.value("faas_timeouts_total", &[t]), 2.0);
    // The first invocation of the wrapper process, and only that one.
    assert_eq!(s.value("faas_coldstarts_total", &[t]), 1.0);
    let bucket = |le: &str| s.value("faas_invoke_duration_seconds_bucket", &[t, ("le", le)]);
    assert_eq!(bucket("+Inf"), 91.0);
    assert_eq!(bucket("30"), 91.0);
    assert!(
        bucket("1") <= 89.0,
        "the two timeouts took five seconds each"
    );
    let les = [
        "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60",
        "+Inf",
    ];
    assert_eq!(
        s.series("faas_invoke_duration_seconds_bucket").len(),
        les.len()
    );
    assert!(les.windows(2).all(|p| bucket(p[0]) <= bucket(p[1])));
    assert_eq!(s.value("faas_invoke_duration_seconds_count", &[t]), 91.0);
    assert!(s.value("faas_invoke_duration_seconds_sum", &[t]) >= 10.0);
    assert_eq!(s.value("runr_inflight_invocations", &[]), 0.0);
    assert_eq!(s.value("runr_queued_invocations", &[]), 0.0);
    for (reason, n) in [
        ("overload", 0.0),
        ("body_too_large", 2.0),
        ("headers_too_large", 0.0),
    ] {
        assert_eq!(s.value("runr_rejected_total", &[("reason", reason)]), n);
    }
    assert!(!s.has("runr_workers_alive") && !s.has("runr_worker_restarts_total"));
    for (family, kind) in [
        ("faas_invocations", "counter"),
        ("faas_errors", "counter"),
        ("faas_timeouts", "counter"),
        ("faas_coldstarts", "counter"),
        ("faas_invoke_duration_seconds", "histogram"),
        ("runr_inflight_invocations", "gauge"),
        ("runr_queued_invocations", "gauge"),
        ("runr_rejected", "counter"),
    ] {
        assert_eq!(
            s.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
}

#[test]
fn the_endpoint_only_answers_get_metrics() {
    let w = routed_exec(&[]);
    let m = metrics_addr(&w);
    assert_ne!(m.port(), w.addr().port());
    let r = Conn::open(m).send("GET", "/", &[], Body::None);
    assert_eq!(r.status, 404);
    let r = Conn::open(m).send("POST", "/metrics", &[], Body::Sized(b"x"));
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    // The invocation port does not serve metrics: it invokes.
    assert_eq!(w.get("/metrics").text(), "ok");
    assert_eq!(
        scrape(m).value(
            "faas_invocations_total",
            &[("trigger", "http"), ("code", "2xx")]
        ),
        1.0
    );
}

#[test]
fn inflight_and_queued_gauges_while_requests_run_and_wait() {
    let f = fixtures();
    let mut v = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    v.extend(vars(&[("RUNR_METRICS_PORT", "0"), ("RUNR_TIMEOUT", "30")]));
    let w = Wrapper::start(&v);
    let m = metrics_addr(&w);
    assert_eq!(w.get("/").status, 200);
    // One worker: the first request runs, the next two wait, all three until the gate opens
    // (however slowly a busy machine lets the three arrive).
    let addr = w.addr();
    let (_dir, gate) = runr_testkit::work_dir();
    let target = format!("/gate?file={}", gate.join("open").display());
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let target = target.clone();
            std::thread::spawn(move || Conn::open(addr).send("GET", &target, &[], Body::None))
        })
        .collect();
    let s = wait_for("one running, two queued", Duration::from_secs(20), || {
        let s = scrape(m);
        (s.value("runr_inflight_invocations", &[]) == 1.0
            && s.value("runr_queued_invocations", &[]) == 2.0)
            .then_some(s)
    });
    std::fs::write(gate.join("open"), b"").unwrap();
    assert_eq!(s.value("runr_workers_alive", &[]), 1.0);
    for t in slow {
        assert_eq!(t.join().unwrap().status, 200);
    }
    let s = scrape(m);
    assert_eq!(s.value("runr_inflight_invocations", &[]), 0.0);
    assert_eq!(s.value("runr_queued_invocations", &[]), 0.0);
    assert_eq!(
        s.value(
            "faas_invocations_total",
            &[("trigger", "http"), ("code", "2xx")]
        ),
        4.0
    );
}

#[test]
fn persistent_mode_counts_cold_starts_per_worker_and_restarts() {
    let f = fixtures();
    let mut v = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    v.extend(vars(&[("RUNR_METRICS_PORT", "0"), ("RUNR_WORKERS", "2")]));
    let w = Wrapper::start(&v);
    let m = metrics_addr(&w);
    let addr = w.addr();
    // Two at once, so each worker serves one: two cold starts.
    let both = || {
        let ts: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || {
                    Conn::open(addr).send("GET", "/sleep?s=0.5", &[], Body::None)
                })
            })
            .collect();
        let mut workers: Vec<String> = ts
            .into_iter()
            .map(|t| {
                let r = t.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                r.json()["worker"].as_str().unwrap().to_string()
            })
            .collect();
        workers.sort();
        assert_eq!(workers, ["0", "1"]);
    };
    wait_for("both workers alive", Duration::from_secs(20), || {
        (scrape(m).value("runr_workers_alive", &[]) == 2.0).then_some(())
    });
    both();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for j in 0..10 {
                    let body = format!("{i}-{j}");
                    let r = c.send("POST", "/", &[], Body::Sized(body.as_bytes()));
                    assert_eq!(r.status, 200);
                    assert_eq!(r.json()["body"], body.as_str());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let r = w.get("/exit");
    assert_eq!((r.status, r.header("x-runr-error")), (502, Some("crash")));
    let s = wait_for("the worker restarted", Duration::from_secs(20), || {
        let s = scrape(m);
        (s.value("runr_workers_alive", &[]) == 2.0).then_some(s)
    });
    assert_eq!(s.value("runr_worker_restarts_total", &[]), 1.0);
    // The restarted worker's first invocation is a cold start too.
    both();
    let s = scrape(m);
    let t = ("trigger", "http");
    assert_eq!(s.value("faas_coldstarts_total", &[t]), 3.0);
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "2xx")]),
        84.0
    );
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "5xx")]),
        1.0
    );
    assert_eq!(s.value("faas_errors_total", &[t, ("type", "crash")]), 1.0);
    assert_eq!(s.value("faas_invoke_duration_seconds_count", &[t]), 85.0);
    assert_eq!(
        s.types.get("runr_workers_alive").map(String::as_str),
        Some("gauge")
    );
    assert_eq!(
        s.types.get("runr_worker_restarts").map(String::as_str),
        Some("counter")
    );
}

#[test]
fn the_endpoint_answers_while_every_worker_is_down() {
    let f = fixtures();
    let dir = tempfile::tempdir().unwrap();
    let mut v = env("persistent", &["bash", &f.path("crash.sh")]);
    v.extend(vars(&[
        ("RUNR_METRICS_PORT", "0"),
        ("RUNR_WORKERS", "2"),
        ("RUNR_TIMEOUT", "1"),
        // Never ready (it exits first): never alive, never given a request.
        ("RUNR_WORKER_READY", "1"),
        ("STARTS", &dir.path().join("starts").display().to_string()),
    ]));
    let w = Wrapper::start(&v);
    let m = metrics_addr(&w);
    let s = wait_for("restarts counted", Duration::from_secs(20), || {
        let s = scrape(m);
        (s.value("runr_worker_restarts_total", &[]) >= 4.0).then_some(s)
    });
    assert_eq!(s.value("runr_workers_alive", &[]), 0.0);
    let probe = w.send("GET", "/", &[("K-Kubelet-Probe", "1")], b"");
    assert_eq!(
        (probe.status, probe.error().as_str()),
        (503, "no worker is ready")
    );
    // Nobody can take it: it waits, and times out.
    let r = w.get("/");
    assert_eq!((r.status, r.header("x-runr-error")), (504, Some("timeout")));
    let s = scrape(m);
    assert_eq!(s.value("faas_timeouts_total", &[("trigger", "http")]), 1.0);
    assert_eq!(
        s.value("faas_coldstarts_total", &[("trigger", "http")]),
        0.0
    );
}

#[test]
fn the_metrics_port_must_differ_from_port() {
    let out = Command::new(bin())
        .env_clear()
        .env("PORT", "8999")
        .env("RUNR_METRICS_PORT", "8999")
        .env("RUNR_WRAPPER_MODE", "exec")
        .env("RUNR_COMMAND", "cat")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        runr_testkit::logfmt::plain(err.trim_end())
            .contains(r#"RUNR_METRICS_PORT="8999": must differ from PORT"#),
        "{err}"
    );
}

#[test]
fn http_mode_with_metrics_runs_the_observed_proxy_and_counts_its_invocations() {
    use crate::support::observed::start_proxy;
    let w = start_proxy(&[
        ("RUNR_METRICS_PORT", "0".to_string()),
        ("RUNR_TIMEOUT", "5".to_string()),
    ]);
    let m = metrics_addr(&w);
    let addr = w.addr();
    // The program's own answers, at 8 clients: no X-RunR-Error on any of them.
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                for code in [200, 201, 404, 503] {
                    let r = c.send("GET", &format!("/status?code={code}"), &[], Body::None);
                    assert_eq!((r.status, r.text()), (code, format!("status {code}")));
                    assert_eq!(r.header("x-runr-error"), None);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // The proxy's own: a timeout, and a connection the program broke off.
    let r = w.get("/sleep?s=60");
    assert_eq!((r.status, r.header("x-runr-error")), (504, Some("timeout")));
    let mut c = Conn::open(addr);
    std::io::Write::write_all(c.stream(), b"GET /crash HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert!(c.try_read_response().is_err(), "the body was cut off");
    // Probes and preflights are not invocations.
    assert_eq!(
        w.send("GET", "/", &[("K-Network-Probe", "1")], b"").status,
        200
    );
    assert_eq!(w.send("OPTIONS", "/", &[], b"").status, 204);
    let s = wait_for("the broken answer counted", Duration::from_secs(60), || {
        let s = scrape(m);
        (s.value("faas_invoke_duration_seconds_count", &[("trigger", "http")]) == 34.0).then_some(s)
    });
    let t = ("trigger", "http");
    // The broken one had sent its 200 head before it broke off: 2xx, and a crash.
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "2xx")]),
        17.0
    );
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "4xx")]),
        8.0
    );
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "5xx")]),
        9.0
    );
    assert_eq!(s.value("faas_errors_total", &[t, ("type", "timeout")]), 1.0);
    assert_eq!(s.value("faas_errors_total", &[t, ("type", "crash")]), 1.0);
    assert_eq!(s.value("faas_coldstarts_total", &[t]), 1.0);
    assert_eq!(s.value("runr_inflight_invocations", &[]), 0.0);
}

#[test]
fn admission_refusals_carry_their_class_and_count_as_rejected_not_invoked() {
    // The handlers wait at a gate until the test has seen what it needs, however slow the
    // machine is.
    let gate = crate::support::Gate::new();
    let mut v = env(
        "exec",
        &[
            "bash",
            "-c",
            r#"while [ ! -e "$GATE" ]; do sleep 0.01; done; printf done"#,
        ],
    );
    v.extend(vars(&[
        ("RUNR_METRICS_PORT", "0"),
        ("RUNR_MAX_INFLIGHT", "1"),
        ("RUNR_MAX_QUEUE", "1"),
        ("RUNR_TIMEOUT", "300"),
    ]));
    v.push(gate.var());
    let w = Wrapper::start(&v);
    let m = metrics_addr(&w);
    let addr = w.addr();
    // One runs, one waits, the third finds the line full.
    let first = std::thread::spawn(move || Conn::open(addr).send("GET", "/a", &[], Body::None));
    wait_for("one running", Duration::from_secs(20), || {
        (scrape(m).value("runr_inflight_invocations", &[]) == 1.0).then_some(())
    });
    let second = std::thread::spawn(move || Conn::open(addr).send("GET", "/b", &[], Body::None));
    wait_for("one waiting", Duration::from_secs(20), || {
        (scrape(m).value("runr_queued_invocations", &[]) == 1.0).then_some(())
    });
    let r = w.get("/c");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.header("retry-after")),
        (503, Some("overload"), Some("1"))
    );
    assert_eq!(r.error(), "overloaded");
    gate.open();
    for t in [first, second] {
        let r = t.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "done"));
    }
    // Headers the kernel would not pass to the handler: 431 before spawning.
    let long = "v".repeat(200 * 1024);
    let r = w.send("GET", "/d", &[("X-Long", &long)], b"");
    assert_eq!((r.status, r.header("x-runr-error")), (431, Some("limit")));
    let s = scrape(m);
    let t = ("trigger", "http");
    for (reason, n) in [
        ("overload", 1.0),
        ("body_too_large", 0.0),
        ("headers_too_large", 1.0),
    ] {
        assert_eq!(
            s.value("runr_rejected_total", &[("reason", reason)]),
            n,
            "{reason}"
        );
    }
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "2xx")]),
        2.0
    );
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "4xx")]),
        0.0
    );
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "5xx")]),
        0.0
    );
    assert_eq!(
        s.value("faas_errors_total", &[t, ("type", "overload")]),
        0.0
    );
    assert_eq!(s.value("runr_queued_invocations", &[]), 0.0);
}

#[test]
fn a_request_whose_time_runs_out_in_line_is_a_timed_out_invocation() {
    // The handler leaves a mark when it starts: the first invocation lives only for its 1 s
    // timeout, which a scrape of the in-flight gauge can miss on a busy machine. Whether the
    // second request then waits in line or arrives after the first was killed, its 1 s runs
    // out before a 3 s handler answers: both are timeouts, and only the first a cold start.
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("started");
    let mut v = env(
        "exec",
        &[
            "bash",
            "-c",
            "touch \"$0\"; sleep 3; printf done",
            mark.to_str().unwrap(),
        ],
    );
    v.extend(vars(&[
        ("RUNR_METRICS_PORT", "0"),
        ("RUNR_MAX_INFLIGHT", "1"),
        ("RUNR_TIMEOUT", "1"),
    ]));
    let w = Wrapper::start(&v);
    let m = metrics_addr(&w);
    let addr = w.addr();
    let first = std::thread::spawn(move || Conn::open(addr).send("GET", "/a", &[], Body::None));
    // (Or its answer came first: killed by its deadline before bash got to the mark.)
    wait_for("the first handler started", Duration::from_secs(60), || {
        (mark.exists() || first.is_finished()).then_some(())
    });
    let r = w.get("/b");
    assert_eq!(
        (r.status, r.header("x-runr-error"), r.error().as_str()),
        (504, Some("timeout"), "handler timed out after 1s")
    );
    assert_eq!(
        first.join().unwrap().header("x-runr-error"),
        Some("timeout")
    );
    let s = scrape(m);
    let t = ("trigger", "http");
    assert_eq!(s.value("faas_timeouts_total", &[t]), 2.0);
    assert_eq!(
        s.value("faas_invocations_total", &[t, ("code", "5xx")]),
        2.0
    );
    // Only the one that ran was a cold start.
    assert_eq!(s.value("faas_coldstarts_total", &[t]), 1.0);
}

#[test]
fn a_raw_body_refused_while_streamed_into_the_handler_is_rejected_not_invoked() {
    let mut v = env("exec", &["bash", "-c", "cat >/dev/null; printf read"]);
    v.extend(vars(&[("RUNR_METRICS_PORT", "0"), ("RUNR_INPUT", "raw")]));
    let w = Wrapper::start(&v);
    let m = metrics_addr(&w);
    let big = vec![b'x'; 10 * 1024 * 1024 + 1];
    let r = Conn::open(w.addr()).send("POST", "/", &[], Body::Chunked(&big));
    assert_eq!((r.status, r.header("x-runr-error")), (413, Some("limit")));
    assert_eq!(w.post("/", b"small").text(), "read");
    let s = scrape(m);
    assert_eq!(
        s.value("runr_rejected_total", &[("reason", "body_too_large")]),
        1.0
    );
    assert_eq!(
        s.value("faas_invoke_duration_seconds_count", &[("trigger", "http")]),
        1.0
    );
}

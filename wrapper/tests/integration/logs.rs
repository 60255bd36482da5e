//! The wrapper's own log lines cannot be forged by what a client or a handler chose: every
//! field is escaped, also in the access line, which is written without the log formatter.

use std::io::Write;

use crate::support::{env, Conn, Wrapper};

/// Lines of `log` that claim to be the wrapper's but are not one of its own.
fn forged(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with("[runr-wrapper] forged"))
        .collect()
}

#[test]
fn a_client_path_cannot_break_the_access_line() {
    let mut vars = env("exec", &["cat"]);
    vars.push(("RUNR_TRACING".into(), "1".into()));
    let w = Wrapper::start(&vars);
    // U+0085 (NEL, a line break to some log viewers) as raw UTF-8 in the request target:
    // the URI parser lets bytes from 0x80 through.
    let mut c = Conn::open(w.addr());
    c.stream()
        .write_all(b"GET /a\xc2\x85\xc2\x85forged HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(c.read_response().status, 200);
    w.wait_log(" 200 ");
    let log = w.log();
    let access: Vec<&str> = log.lines().filter(|l| l.contains("trace_id=")).collect();
    assert_eq!(access.len(), 1, "{log}");
    assert!(
        access[0].contains(r" GET /a\u{85}\u{85}forged 200 "),
        "{}",
        access[0]
    );
    assert!(!log.contains('\u{85}'), "{log}");
}

#[test]
fn a_handler_header_name_with_cr_lf_is_logged_escaped() {
    let answer = r#"{"statusCode": 200, "headers": {"X-Bad\r\n[runr-wrapper] forged line": "v"}, "body": "ok"}"#;
    let w = Wrapper::start(&env("exec", &["printf", "%s", answer]));
    let r = w.get("/");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    w.wait_log("invalid header name");
    let log = w.log();
    assert!(forged(&log).is_empty(), "{log}");
    assert!(
        log.contains(r"header=X-Bad\r\n[runr-wrapper] forged line"),
        "{log}"
    );
}

#[test]
fn a_client_header_with_a_bare_cr_is_refused_and_logs_nothing_forged() {
    let w = Wrapper::start(&env("exec", &["cat"]));
    let mut c = Conn::open(w.addr());
    c.stream()
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: 1\r[runr-wrapper] forged: x\r\n\r\n")
        .unwrap();
    assert_eq!(c.read_response().status, 400);
    assert_eq!(w.get("/").status, 200);
    assert!(forged(&w.log()).is_empty(), "{}", w.log());
}

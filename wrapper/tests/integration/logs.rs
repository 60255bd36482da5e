//! The wrapper's own log lines cannot be forged by what a client or a handler chose: every text
//! line, the access line, the invocation line and the handler's lines among them, parses (by
//! the reference logfmt reader) into exactly the fields the wrapper wrote; `X-Request-Id` is
//! kept when it is 1-200 visible characters, else replaced, and the replacement is said.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use runr_testkit::logfmt::{parse, values, Pair};
use runr_testkit::wait_for;

use crate::support::telemetry::vars;
use crate::support::{env, Body, Conn, Wrapper};

/// Every line of `log`, parsed; panics with the line that does not parse.
fn parsed(log: &str) -> Vec<Vec<Pair>> {
    log.lines()
        .map(|l| parse(l).unwrap_or_else(|e| panic!("a line that does not parse: {e}\n{log}")))
        .collect()
}

/// Whether `pairs` is a line of the wrapper's own (first token `[runr-wrapper]`) whose next
/// token is `word` (`invocation`; `trace_id` for the access line).
fn is_wrapper(pairs: &[Pair], word: &str) -> bool {
    pairs
        .first()
        .is_some_and(|(k, v)| k == "[runr-wrapper]" && v.is_none())
        && pairs.get(1).is_some_and(|(k, _)| k == word)
}

/// Waits until the wrapper wrote a line that starts with `start` and returns the log.
fn wait_line(w: &Wrapper, start: &str) -> String {
    wait_for(
        &format!("a line {start:?}"),
        Duration::from_secs(60),
        || {
            let log = w.log();
            log.lines().any(|l| l.starts_with(start)).then_some(log)
        },
    )
}

/// `%XX` decoded (the access line's method and path).
fn percent_decode(token: &str) -> String {
    let b = token.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(&token[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

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
    // The path is one bare token, as the spec's line has it, its U+0085 percent-encoded.
    assert!(
        access[0].contains(" GET /a%C2%85%C2%85forged 200 "),
        "{}",
        access[0]
    );
    assert!(!log.contains('\u{85}'), "{log}");
    parsed(&log);
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
        log.contains(r#"header="X-Bad\r\n[runr-wrapper] forged line""#),
        "{log}"
    );
    parsed(&log);
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

/// Exec mode with the access line and the invocation line, the handler printing what the
/// client sent to its stderr (as handlers do) and answering its request id, or crashing on
/// `/crash`.
fn echoing_wrapper() -> Wrapper {
    let script = r#"cat >/dev/null
printf 'got %s on %s\n' "$RUNR_REQUEST_ID" "$RUNR_PATH" >&2
printf '[runr-wrapper] invocation request_id=%s status=200 error=none\n' "$RUNR_REQUEST_ID" >&2
[ "$RUNR_PATH" = /crash ] && exit 3
printf '%s' "$RUNR_REQUEST_ID""#;
    let mut v = env("exec", &["bash", "-c", script]);
    v.extend(vars(&[
        ("RUNR_TRACING", "1"),
        ("RUNR_LOG_INVOCATIONS", "1"),
    ]));
    Wrapper::start(&v)
}

#[test]
fn the_issue_forgery_parses_back_into_one_status_and_the_replacement_is_said() {
    let w = echoing_wrapper();
    let forged = "x status=200 error=none";
    let r = w.send("GET", "/crash", &[("X-Request-Id", forged)], b"");
    assert_eq!(r.status, 500);
    wait_line(&w, "[runr-wrapper] invocation ");
    let log = wait_line(&w, "[runr-wrapper] trace_id=");
    let lines = parsed(&log);
    let inv: Vec<&Vec<Pair>> = lines
        .iter()
        .filter(|l| is_wrapper(l, "invocation"))
        .collect();
    assert_eq!(inv.len(), 1, "{log}");
    let inv = inv[0];
    assert_eq!(values(inv, "status"), ["500"], "{log}");
    assert_eq!(values(inv, "error"), ["crash"], "{log}");
    assert_eq!(values(inv, "replaced_request_id"), [forged], "{log}");
    let id = values(inv, "request_id");
    assert_eq!(id.len(), 1, "{log}");
    assert_ne!(id[0], forged);
    // The access line: the spec's tokens, one status, then the replacement.
    let access: Vec<&Vec<Pair>> = lines.iter().filter(|l| is_wrapper(l, "trace_id")).collect();
    assert_eq!(access.len(), 1, "{log}");
    let keys: Vec<&str> = access[0].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[4..7], ["GET", "/crash", "500"], "{log}");
    assert!(keys[7].ends_with("ms"), "{log}");
    assert_eq!(
        keys[8..],
        ["cold_start", "request_id", "replaced_request_id"],
        "{log}"
    );
    assert_eq!(values(access[0], "request_id"), id);
    assert_eq!(values(access[0], "replaced_request_id"), [forged]);
    // The handler's echo of the forged line is a handler line, its text intact.
    let echoed = format!(
        "[runr-wrapper] invocation request_id={} status=200 error=none",
        id[0]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.as_slice() == [("msg".to_string(), Some(echoed.clone()))]),
        "{log}"
    );

    // What the client sent is cut to 64 characters in the logs.
    let long = format!("{}{}", "y ".repeat(40), "z".repeat(300));
    let r = w.send("GET", "/", &[("X-Request-Id", &long)], b"");
    assert_eq!(r.status, 200);
    let given = r.text();
    let lines = parsed(&wait_line(
        &w,
        &format!("[runr-wrapper] invocation request_id={given} "),
    ));
    let access = lines
        .iter()
        .find(|l| is_wrapper(l, "trace_id") && values(l, "request_id") == [given.as_str()])
        .unwrap();
    let quoted: String = long.chars().take(64).collect();
    assert_eq!(values(access, "replaced_request_id"), [quoted.as_str()]);
}

#[test]
fn a_utf8_request_id_is_kept_and_a_kept_one_needs_no_replacement() {
    let w = echoing_wrapper();
    for id in ["café", "x=1\"y\\z", "日本語-42"] {
        let r = w.send("GET", "/", &[("X-Request-Id", id)], b"");
        assert_eq!((r.status, r.text().as_str()), (200, id));
    }
    let log = wait_line(&w, "[runr-wrapper] invocation request_id=日本語-42 ");
    let lines = parsed(&log);
    let ids: Vec<&str> = lines
        .iter()
        .filter(|l| is_wrapper(l, "invocation"))
        .flat_map(|l| values(l, "request_id"))
        .collect();
    assert_eq!(ids, ["café", "x=1\"y\\z", "日本語-42"], "{log}");
    assert!(!log.contains("replaced_request_id"), "{log}");
    assert!(
        log.contains("invocation request_id=café trigger=http"),
        "{log}"
    );
}

#[test]
fn under_many_concurrent_clients_every_line_parses_and_names_its_own_request() {
    let w = echoing_wrapper();
    let addr = w.addr();
    let (threads, per) = (16, 12);
    // (id sent, path sent, id given: the answer)
    let sent: Vec<(String, String, String)> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                (0..per)
                    .map(|i| {
                        let path = format!("/r/{t}/{i}/a=b\"c\\d/é");
                        // Kept ids with every character logfmt quotes, and replaced ones that
                        // try to add fields.
                        let id = match i % 3 {
                            0 => format!("id-{t}-{i}=\"x\"\\café"),
                            1 => format!("id-{t}-{i} status=200 error=none"),
                            _ => format!("id-{t}-{i}\t[runr-wrapper]"),
                        };
                        let r = c.send("POST", &path, &[("X-Request-Id", &id)], Body::Sized(b"x"));
                        assert_eq!(r.status, 200, "{id}: {}", r.text());
                        let given = r.text();
                        assert_eq!(given == id, i % 3 == 0, "{id} answered {given}");
                        (id, path, given)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let log = wait_for("every invocation line", Duration::from_secs(60), || {
        let log = w.log();
        let written = log
            .lines()
            .filter(|l| l.starts_with("[runr-wrapper] invocation "));
        (written.count() == sent.len()).then_some(log)
    });
    let lines = parsed(&log);
    let mut invocations: HashMap<String, Vec<&Vec<Pair>>> = HashMap::new();
    let mut access: HashMap<String, Vec<&Vec<Pair>>> = HashMap::new();
    let mut echoes: HashMap<String, usize> = HashMap::new();
    for l in &lines {
        if is_wrapper(l, "invocation") {
            let id = values(l, "request_id");
            assert_eq!((id.len(), values(l, "status")), (1, vec!["200"]), "{l:?}");
            invocations.entry(id[0].to_string()).or_default().push(l);
        } else if is_wrapper(l, "trace_id") {
            // The path token is the request's own: /r/<t>/<i>/...
            access.entry(percent_decode(&l[5].0)).or_default().push(l);
        } else if let [(k, Some(text))] = l.as_slice() {
            if k == "msg" {
                *echoes.entry(text.clone()).or_default() += 1;
            }
        } else {
            // Any other line of the wrapper's (listening, ...) is its own, never a handler's.
            assert!(l[0].0 == "[runr-wrapper]" && l[0].1.is_none(), "{l:?}");
        }
    }
    for (id, path, given) in &sent {
        let inv = &invocations[given];
        assert_eq!(inv.len(), 1, "{given}");
        let replaced = values(inv[0], "replaced_request_id");
        let acc = &access[path];
        assert_eq!(acc.len(), 1, "{path}");
        assert_eq!(acc[0][6].0, "200");
        if given == id {
            assert!(replaced.is_empty() && values(acc[0], "request_id").is_empty());
        } else {
            assert_eq!(replaced, [id.as_str()]);
            assert_eq!(values(acc[0], "request_id"), [given.as_str()]);
            assert_eq!(values(acc[0], "replaced_request_id"), [id.as_str()]);
        }
        assert_eq!(
            echoes.get(&format!("got {given} on {path}")),
            Some(&1),
            "{given}"
        );
        let forged = format!("[runr-wrapper] invocation request_id={given} status=200 error=none");
        assert_eq!(echoes.get(&forged), Some(&1), "{given}");
    }
}

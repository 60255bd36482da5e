//! Exec mode against real handlers: envelope, variables, raw input, response shapes, exit
//! statuses, limits, timeouts, CORS, probes, logs.

use std::time::Duration;

use runr_testkit::wait_for;

use crate::support::{alive, env, fixtures, Conn, RespExt, Wrapper};

fn with(mut vars: Vec<(String, String)>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    vars
}

#[test]
fn envelope_of_a_get_with_query_and_headers() {
    let w = Wrapper::start(&env("exec", &["cat"]));
    let r = w.send(
        "GET",
        "/orders/7?name=Run%20R&tag=a&tag=b",
        &[("X-Api-Key", "k1"), ("Accept", "text/plain")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The envelope is not a response envelope (no statusCode): it comes back as JSON.
    assert_eq!(r.header("content-type"), Some("application/json"));
    let e = r.json();
    assert_eq!(e["runr"], 1);
    assert_eq!(e["trigger"], "http");
    assert_eq!(e["method"], "GET");
    assert_eq!(e["path"], "/orders/7");
    assert_eq!(e["rawQuery"], "name=Run%20R&tag=a&tag=b");
    assert_eq!(e["query"]["name"], "Run R");
    assert_eq!(e["query"]["tag"], serde_json::json!(["a", "b"]));
    assert_eq!(e["headers"]["x-api-key"], "k1");
    assert_eq!(e["headers"]["accept"], "text/plain");
    assert_eq!(e["body"], "");
    assert_eq!(e["isBase64Encoded"], false);
    assert!(!e["id"].as_str().unwrap().is_empty());
    assert!(e.get("event").is_none());
}

#[test]
fn envelope_of_text_and_binary_posts() {
    let w = Wrapper::start(&env("exec", &["cat"]));
    let e = w.post("/", "{\"a\":\"é\"}\n".as_bytes()).json();
    assert_eq!(e["method"], "POST");
    assert_eq!(e["body"], "{\"a\":\"é\"}\n");
    assert_eq!(e["isBase64Encoded"], false);
    let e = w.post("/", &[0xff, 0x00, 0x80, 0x41]).json();
    assert_eq!(e["body"], "/wCAQQ==");
    assert_eq!(e["isBase64Encoded"], true);
}

#[test]
fn queue_trigger_folds_cloudevent_headers() {
    let f = fixtures();
    let w = Wrapper::start(&with(env("exec", &["cat"]), &[("RUNR_TRIGGER", "queue")]));
    let ce = [
        ("ce-specversion", "1.0"),
        ("ce-type", "dev.runr.queue.message"),
        ("ce-source", "/redisstream/orders/orders-api"),
        ("ce-id", "1728561234567-0"),
        ("ce-time", "2026-10-10T12:00:00Z"),
        ("Content-Type", "application/json"),
    ];
    let e = w.send("POST", "/", &ce, br#"{"item":42}"#).json();
    assert_eq!(e["trigger"], "queue");
    assert_eq!(e["id"], "1728561234567-0");
    assert_eq!(e["event"]["type"], "dev.runr.queue.message");
    assert_eq!(e["event"]["source"], "/redisstream/orders/orders-api");
    assert_eq!(e["event"]["data"], serde_json::json!({"item": 42}));
    assert_eq!(e["event"]["datacontenttype"], "application/json");

    let w = Wrapper::start(&with(
        env("exec", &["python3", &f.path("env.py")]),
        &[("RUNR_TRIGGER", "queue")],
    ));
    let vars = w.send("POST", "/", &ce, br#"{"item":42}"#).json();
    assert_eq!(vars["RUNR_TRIGGER"], "queue");
    assert_eq!(vars["RUNR_EVENT_ID"], "1728561234567-0");
    assert_eq!(vars["RUNR_EVENT_TYPE"], "dev.runr.queue.message");
    assert_eq!(vars["RUNR_EVENT_SOURCE"], "/redisstream/orders/orders-api");
    assert_eq!(vars["RUNR_REQUEST_ID"], "1728561234567-0");
}

#[test]
fn per_invocation_variables() {
    let f = fixtures();
    let w = Wrapper::start(&env("exec", &["python3", &f.path("env.py")]));
    let r = w.send(
        "PUT",
        "/a/b?name=RunR&x=1",
        &[
            ("X-Api-Key", "secret"),
            ("Content-Type", "text/plain"),
            ("x.odd-name", "v"),
        ],
        b"body",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["RUNR_TRIGGER"], "http");
    assert_eq!(v["RUNR_METHOD"], "PUT");
    assert_eq!(v["RUNR_PATH"], "/a/b");
    assert_eq!(v["RUNR_QUERY"], "name=RunR&x=1");
    assert_eq!(v["RUNR_CONTENT_TYPE"], "text/plain");
    assert_eq!(v["RUNR_HEADER_X_API_KEY"], "secret");
    assert_eq!(v["RUNR_HEADER_X_ODD_NAME"], "v");
    assert!(!v["RUNR_REQUEST_ID"].as_str().unwrap().is_empty());
    assert!(v.get("RUNR_EVENT_ID").is_none());
}

#[test]
fn raw_input_gets_the_body_as_is() {
    let w = Wrapper::start(&with(env("exec", &["cat"]), &[("RUNR_INPUT", "raw")]));
    let r = w.post("/", b"hello raw");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello raw");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    let r = w.post("/", br#"{"a":1}"#);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let binary: Vec<u8> = (0..=255u8).collect();
    assert_eq!(w.post("/", &binary).body, binary);
}

#[test]
fn compiled_handler_with_a_plain_string_command() {
    let f = fixtures();
    // RUNR_COMMAND as a plain string: split on whitespace, no shell.
    let w = Wrapper::start(&[
        ("RUNR_WRAPPER_MODE".into(), "exec".into()),
        ("RUNR_COMMAND".into(), format!("  {}  ", f.path("forker"))),
    ]);
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().starts_with("forked "), "{}", r.text());
}

#[test]
fn every_response_shape() {
    let f = fixtures();
    let w = Wrapper::start(&env("exec", &["python3", &f.path("shapes.py")]));
    let r = w.get("/?shape=text");
    assert_eq!((r.status, r.text().as_str()), (201, "created"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));

    let r = w.get("/?shape=html");
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(r.text(), "<b>x</b>");

    let r = w.get("/?shape=base64");
    assert_eq!(r.body, [0xff, 0x00, 0xfe]);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));

    let r = w.get("/?shape=json");
    assert_eq!(r.status, 202);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), serde_json::json!({"ok": true, "n": [1, 2]}));

    let r = w.get("/?shape=headers");
    assert_eq!(r.headers_named("set-cookie"), ["a=1", "b=2"]);
    assert_eq!(r.header("x-num"), Some("7"));
    assert_eq!(r.header("x-bool"), Some("false"));

    let r = w.get("/?shape=badstatus");
    assert_eq!(r.status, 500);
    assert!(r.error().contains("statusCode"), "{}", r.text());

    let r = w.get("/?shape=rawtext");
    assert_eq!((r.status, r.text().as_str()), (200, "just text"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));

    let r = w.get("/?shape=rawjson");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), serde_json::json!([1, "two"]));
}

#[test]
fn exit_statuses() {
    let script = r#"
case "$RUNR_PATH" in
  /fail) echo "some output"; exit 3 ;;
  /killed) kill -9 $$ ;;
  /envelope) echo '{"statusCode": 409, "body": "conflict"}'; exit 1 ;;
  *) echo ok ;;
esac"#;
    let w = Wrapper::start(&env("exec", &["bash", "-c", script]));
    let r = w.get("/fail");
    assert_eq!(r.status, 500);
    assert_eq!(r.error(), "handler exited with status 3");
    let r = w.get("/killed");
    assert_eq!(r.status, 500);
    assert_eq!(r.error(), "handler exited with status 137");
    let r = w.get("/envelope");
    assert_eq!((r.status, r.text().as_str()), (409, "conflict"));
    assert_eq!(w.get("/").text(), "ok\n");
}

#[test]
fn a_command_that_cannot_start() {
    let w = Wrapper::start(&env("exec", &["/nonexistent/handler"]));
    let r = w.get("/");
    assert_eq!(r.status, 500);
    assert_eq!(r.error(), "handler failed to start");
    assert_eq!(r.header("content-type"), Some("application/json"));
}

#[test]
fn request_body_over_10_mib_is_413() {
    let w = Wrapper::start(&with(env("exec", &["cat"]), &[("RUNR_INPUT", "raw")]));
    // Declared too large: answered before the body is sent at all.
    let mut c = Conn::open(w.addr());
    let head = "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10485761\r\n\r\n";
    std::io::Write::write_all(c.stream(), head.as_bytes()).unwrap();
    let r = c.read_response();
    assert_eq!(r.status, 413);
    assert_eq!(r.error(), "request body exceeds 10 MiB");

    // Chunked, no length given: cut off once it passes 10 MiB.
    let mut c = Conn::open(w.addr());
    let head = "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    std::io::Write::write_all(c.stream(), head.as_bytes()).unwrap();
    let chunk = vec![b'a'; 1024 * 1024];
    for _ in 0..11 {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        if std::io::Write::write_all(c.stream(), &frame).is_err() {
            break;
        }
    }
    assert_eq!(c.read_response().status, 413);

    // Exactly 10 MiB is fine.
    let body = vec![b'b'; 10 * 1024 * 1024];
    let r = w.post("/", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), body.len());
}

#[test]
fn handler_output_over_10_mib_is_502() {
    let w = Wrapper::start(&env("exec", &["head", "-c", "10485761", "/dev/zero"]));
    let r = w.get("/");
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), "handler output exceeds 10 MiB");
    let w = Wrapper::start(&env("exec", &["head", "-c", "10485760", "/dev/zero"]));
    assert_eq!(w.get("/").body.len(), 10 * 1024 * 1024);
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 60 & echo $! > {}; sleep 60", pidfile.display());
    let w = Wrapper::start(&with(
        env("exec", &["bash", "-c", &script]),
        &[("RUNR_TIMEOUT", "5")],
    ));
    // A 504 at the timeout (the handler itself would sleep a minute).
    let r = w.get("/");
    assert_eq!(r.status, 504);
    assert_eq!(r.error(), "handler timed out after 5s");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for(
        "the sleeping grandchild to be gone",
        Duration::from_secs(30),
        || (!alive(pid)).then_some(()),
    );
    // And reaped: as a subreaper the wrapper inherited it.
    wait_for(
        "the grandchild to be reaped",
        Duration::from_secs(30),
        || (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(()),
    );
}

#[test]
fn a_grandchild_holding_stdout_does_not_hold_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 60 & echo $! > {}; echo quick", pidfile.display());
    let w = Wrapper::start(&env("exec", &["bash", "-c", &script]));
    let r = w.get("/");
    assert_eq!(r.text(), "quick\n");
    // Answered while the grandchild still holds the pipe.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid), "the answer waited for the grandchild");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[test]
fn cors_on_every_answer_unless_the_handler_sets_it() {
    let f = fixtures();
    let w = Wrapper::start(&env("exec", &["python3", &f.path("shapes.py")]));
    assert_eq!(
        w.get("/?shape=text").header("access-control-allow-origin"),
        Some("*")
    );
    assert_eq!(
        w.get("/?shape=cors")
            .headers_named("access-control-allow-origin"),
        ["https://a.example"]
    );
    // Error answers too.
    assert_eq!(
        w.get("/?shape=badstatus")
            .header("access-control-allow-origin"),
        Some("*")
    );
}

#[test]
fn preflight_and_probes_do_not_invoke() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("invoked");
    let script = format!("touch {}; echo invoked", marker.display());
    let w = Wrapper::start(&env("exec", &["bash", "-c", &script]));
    let r = w.send(
        "OPTIONS",
        "/anything",
        &[
            ("Origin", "https://a.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        b"",
    );
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, POST, PUT, DELETE, PATCH, OPTIONS")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("Content-Type, Authorization")
    );
    assert_eq!(r.header("access-control-max-age"), Some("86400"));
    for probe in ["K-Network-Probe", "K-Kubelet-Probe"] {
        let r = w.send("GET", "/", &[(probe, "queue")], b"");
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{probe}");
    }
    assert!(
        !marker.exists(),
        "the handler must not run for preflights and probes"
    );
    assert_eq!(w.get("/").text(), "invoked\n");
    assert!(marker.exists());
}

#[test]
fn stderr_goes_to_the_logs_line_by_line() {
    let script = "echo 'first line' >&2; printf 'second ' >&2; echo 'line' >&2; echo done";
    let w = Wrapper::start(&env("exec", &["bash", "-c", script]));
    assert_eq!(w.get("/").text(), "done\n");
    w.wait_log("\nsecond line\n");
    let log = w.log();
    assert!(log.contains("\nfirst line\n"), "{log}");
    // The wrapper's own lines are prefixed, the program's are not.
    assert!(
        log.lines()
            .any(|l| l.starts_with("[runr-wrapper] listening")),
        "{log}"
    );
}

#[test]
fn concurrent_invocations_run_in_parallel() {
    // Each handler waits until all six run at once: one after another, the first would wait
    // for ever (and answer 504), however fast or slow the machine is.
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "touch {dir}/$$; while [ $(ls {dir} | wc -l) -lt 6 ]; do sleep 0.01; done; echo met",
        dir = dir.path().display()
    );
    let mut v = env("exec", &["bash", "-c", &script]);
    v.push(("RUNR_TIMEOUT".into(), "300".into()));
    let w = Wrapper::start(&v);
    let counts = crate::support::load(w.addr(), 6, 1, "/");
    assert_eq!(counts.get(&200), Some(&6), "{counts:?}");
}

#[test]
fn a_client_that_goes_away_takes_the_handler_group_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 60 & echo $! > {}; sleep 60", pidfile.display());
    let w = Wrapper::start(&env("exec", &["bash", "-c", &script]));
    let mut c = Conn::open(w.addr());
    std::io::Write::write_all(c.stream(), b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let pid: i32 = wait_for("the handler to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    });
    drop(c);
    wait_for(
        "the grandchild to be killed",
        Duration::from_secs(30),
        || (!alive(pid)).then_some(()),
    );
    // The wrapper carries on.
    assert_eq!(
        w.send("GET", "/", &[("K-Network-Probe", "queue")], b"")
            .status,
        200
    );
}

/// `/app/code` must not be created on the test machine, so the wrapper runs in a private mount
/// namespace whose root is an overlay of `/` with `/app/code` added (needs root and overlayfs;
/// skipped with a line otherwise).
#[test]
fn handlers_run_in_app_code_when_it_exists() {
    const SETUP: &str = r#"set -e
T="$1"; BIN="$2"; shift 2
mkdir -p "$T/u" "$T/w" "$T/m"
mount -t overlay overlay -o lowerdir=/,upperdir="$T/u",workdir="$T/w" "$T/m" 2>/dev/null || exit 77
mkdir -p "$T/m/app/code"
echo from-app-code > "$T/m/app/code/marker.txt"
touch "$T/m/runr-wrapper-under-test"
mount --bind "$BIN" "$T/m/runr-wrapper-under-test"
for d in proc dev sys; do mount --rbind "/$d" "$T/m/$d"; done
[ "$1" = probe ] && exit 0
exec chroot "$T/m" /runr-wrapper-under-test"#;
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let dir = tempfile::Builder::new()
        .prefix("runr-overlay-")
        .tempdir_in(base)
        .unwrap();
    let run = |probe: bool| {
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--fork", "bash", "-c", SETUP, "setup"])
            .arg(dir.path())
            .arg(crate::support::bin());
        if probe {
            cmd.arg("probe");
        }
        cmd
    };
    let probe = run(true).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no private mount namespace with an overlay of / here (needs root)");
        return;
    }
    let w = Wrapper::start_with(
        run(false),
        &env("exec", &["/bin/sh", "-c", "pwd; cat marker.txt"]),
    );
    let r = w.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "/app/code\nfrom-app-code\n");
}

#[test]
fn argv_is_exactly_the_configured_command() {
    // The program is looked up on PATH once, but argv[0] stays as written (busybox-style
    // programs dispatch on it).
    let w = Wrapper::start(&env(
        "exec",
        &["sh", "-c", "tr '\\0' '|' < /proc/$$/cmdline", "x y"],
    ));
    assert_eq!(
        w.get("/").text(),
        "sh|-c|tr '\\0' '|' < /proc/$$/cmdline|x y|"
    );
}

//! Bad configuration: one line per bad variable, exit 2, before anything is connected.

use std::process::Stdio;

use crate::support::*;

fn run(vars: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let out = command(&vars)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run runr-queue");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_bad_variable_is_one_line_and_the_exit_status_is_2() {
    let (code, stdout, stderr) = run(
        &[
            ("RUNR_QUEUE_REDIS_URL", "redis://user:hunter2@host:notaport"),
            ("RUNR_QUEUE_STREAM", "two words"),
            ("RUNR_QUEUE_TARGET", "ftp://fn"),
            ("RUNR_QUEUE_CONCURRENCY", "0"),
            ("RUNR_QUEUE_BACKOFF", "fast"),
            ("RUNR_QUEUE_DEAD_LETTER_AT_ONCE", "limit,200"),
            ("RUNR_QUEUE_LOG", "loud"),
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    // Read as a person does: the message is quoted (it holds `=` and `"`).
    let read: Vec<String> = stderr.lines().map(runr_testkit::logfmt::plain).collect();
    let lines: Vec<&str> = read.iter().map(String::as_str).collect();
    let names = [
        "RUNR_QUEUE_REDIS_URL",
        "RUNR_QUEUE_STREAM",
        "RUNR_QUEUE_GROUP",
        "RUNR_QUEUE_CONSUMER",
        "RUNR_QUEUE_TARGET",
        "RUNR_QUEUE_CONCURRENCY",
        "RUNR_QUEUE_BACKOFF",
        "RUNR_QUEUE_DEAD_LETTER_AT_ONCE",
        "RUNR_QUEUE_LOG",
    ];
    assert_eq!(lines.len(), names.len(), "{stderr}");
    for (line, name) in lines.iter().zip(names) {
        let want = format!("[runr-queue] ERROR msg=invalid configuration: {name}=");
        assert!(
            line.starts_with(&want),
            "{line:?} should start with {want:?}"
        );
    }
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(
        lines[2].ends_with("RUNR_QUEUE_GROUP=<unset>: required"),
        "{}",
        lines[2]
    );
}

#[test]
fn a_password_holding_url_delimiters_is_never_printed() {
    // The URL, and passwords that end the authority, the path or the query early.
    for (url, secret) in [
        ("redis://user:se/Zq9@host:6379", "Zq9"),
        ("redis://user:QX#7KP@host:6379/0", "QX#7KP"),
        ("rediss://app:JV?3W9@host:6380", "JV?3W9"),
        ("redis://:12/WZK4@host", "WZK4"),
        ("redis://user:VX@J:9@host:6379/x", "VX@J"),
    ] {
        let (code, stdout, stderr) = run(
            &[
                ("RUNR_QUEUE_REDIS_URL", url),
                ("RUNR_QUEUE_STREAM", "orders"),
                ("RUNR_QUEUE_GROUP", "g"),
                ("RUNR_QUEUE_CONSUMER", "c"),
                ("RUNR_QUEUE_TARGET", "http://fn"),
            ],
            &[],
        );
        assert_eq!(code, 2, "{url}: {stderr}");
        let raw = format!("{stdout}{stderr}");
        assert!(!raw.contains(secret), "{url}: {raw}");
        assert_eq!(raw.lines().count(), 1, "{raw}");
        let printed = runr_testkit::logfmt::plain(raw.trim_end());
        assert!(!printed.contains(secret), "{url}: {printed}");
        assert!(
            printed.contains("RUNR_QUEUE_REDIS_URL=\"redis"),
            "{printed}"
        );
        assert!(printed.contains("***@"), "{printed}");
    }
}

#[test]
fn version_and_help_print_every_variable_with_its_default() {
    for arg in ["version", "help"] {
        let (code, stdout, _) = run(&[], &[arg]);
        assert_eq!(code, 0);
        assert!(
            stdout.starts_with(concat!("runr-queue ", env!("CARGO_PKG_VERSION"), "\n")),
            "{stdout}"
        );
        for v in runr_queue::config::VARS {
            assert!(stdout.contains(v.name), "{} missing:\n{stdout}", v.name);
        }
        assert!(stdout.contains("RUNR_QUEUE_CONCURRENCY"));
        assert!(stdout.contains("(default: 8)"));
        assert!(stdout.contains("RUNR_QUEUE_REDIS_URL"));
        assert!(stdout.contains("(required)"));
    }
    let (code, _, stderr) = run(&[], &["frobnicate"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown argument \"frobnicate\""));
}

#[test]
fn a_key_that_is_not_a_stream_stops_the_consumer_with_status_1() {
    let dir = tmp();
    let redis = runr_testkit::redis::Redis::start();
    assert_eq!(
        redis.conn().cmd_str(&["SET", STREAM, "a string"]),
        runr_testkit::redis::Reply::Simple("OK".into())
    );
    let mut c = Consumer::spawn(
        dir.path(),
        "c1",
        &base_env(&redis, "http://127.0.0.1:9/", "c1"),
    );
    let status = c.child.wait_timeout(LONG);
    assert_eq!(status.code(), Some(1), "{}", c.log());
    assert!(c.log().contains("WRONGTYPE"), "{}", c.log());
}

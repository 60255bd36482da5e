//! http mode without observation (the wrapper becomes the program), the schedule trigger in
//! every mode (invoke sequence, one-shots) and the `tick` subcommand.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use runr_testkit::{free_port, wait_for_port, Child};

use crate::support::observed::{
    ce_receiver_script, run, spawn, upstream_command, upstream_script, Run,
};
use crate::support::{alive, fixtures, Body, Conn, RespExt};

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn http_vars(port: u16, command: String) -> Vec<(&'static str, String)> {
    vec![
        ("PORT", port.to_string()),
        ("RUNR_WRAPPER_MODE", "http".into()),
        ("RUNR_COMMAND", command),
    ]
}

/// The pid the upstream fixture announced on its stdout (which the wrapper sends to its logs:
/// as it is when the server runs itself, as `msg="…"` when the wrapper forwards it).
fn booted_pid(log: &str) -> i32 {
    log.lines()
        .map(runr_testkit::logfmt::plain)
        .find_map(|l| {
            let l = l.strip_prefix("msg=").unwrap_or(&l);
            Some(l.strip_prefix("upstream booting pid=")?.to_string())
        })
        .unwrap_or_else(|| panic!("no boot line in:\n{log}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn http_mode_replaces_itself_keeping_the_pid() {
    let port = free_port();
    let child = spawn(&[], &http_vars(port, upstream_command()));
    wait_for_port(local(port), Duration::from_secs(20));
    let answer = Conn::open(local(port))
        .send("GET", "/pid", &[], Body::None)
        .json();
    assert_eq!(
        answer["pid"],
        child.pid(),
        "the server runs in the wrapper's process"
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.pid())).unwrap();
    assert!(String::from_utf8_lossy(&cmdline).contains(&upstream_script()));
}

#[test]
fn http_mode_replaces_itself_with_a_binary_server() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hello from busybox").unwrap();
    let port = free_port();
    let command = serde_json::to_string(&[
        "busybox",
        "httpd",
        "-f",
        "-p",
        &format!("127.0.0.1:{port}"),
        "-h",
        &dir.path().to_string_lossy(),
    ])
    .unwrap();
    let child = spawn(&[], &http_vars(port, command));
    wait_for_port(local(port), Duration::from_secs(20));
    let exe = std::fs::read_link(format!("/proc/{}/exe", child.pid())).unwrap();
    assert!(exe.ends_with("busybox"), "{}", exe.display());
    let r =
        Conn::open(local(port)).send("GET", "/index.html", &[("Connection", "close")], Body::None);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "hello from busybox");
}

#[test]
fn a_command_that_cannot_be_executed_exits_127_with_one_line() {
    let r = run(
        &[],
        &http_vars(free_port(), r#"["/nonexistent/server", "--x"]"#.into()),
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 127, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].starts_with("[runr-wrapper] ERROR cannot execute RUNR_COMMAND"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("/nonexistent/server"), "{}", lines[0]);
}

fn schedule(port: u16, command: String, extra: &[(&'static str, String)]) -> Run {
    let mut vars = http_vars(port, command);
    vars.push(("RUNR_TRIGGER", "schedule".into()));
    vars.extend(extra.iter().cloned());
    run(&[], &vars, Duration::from_secs(60))
}

#[test]
fn invoke_sequence_waits_for_a_slow_server_posts_the_tick_and_stops_it() {
    let r = schedule(
        free_port(),
        upstream_command(),
        &[("STARTUP_DELAY", "1".into())],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let body: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {:?}", r.stdout));
    assert_eq!(body["method"], "POST");
    assert_eq!(body["path"], "/");
    assert_eq!(body["ce_type"], "dev.runr.schedule.tick");
    assert_eq!(body["body"], r#"{"trigger":"schedule"}"#);
    // The server's own stdout went to the logs, not to our stdout.
    assert!(r.stderr.contains("handled POST /"), "{}", r.stderr);
    assert!(!r.stdout.contains("upstream booting"));
    assert!(!alive(booted_pid(&r.stderr)), "the server was stopped");
}

#[test]
fn invoke_sequence_against_a_real_cloudevents_consumer() {
    let port = free_port();
    let command =
        serde_json::to_string(&["python3", &ce_receiver_script(), &port.to_string()]).unwrap();
    let r = schedule(port, command, &[]);
    assert_eq!(r.code, 0, "stdout {}\nstderr {}", r.stdout, r.stderr);
    let seen: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(seen["type"], "dev.runr.schedule.tick");
    assert_eq!(seen["source"], "/runr/schedule");
}

#[test]
fn invoke_sequence_error_status_exits_1() {
    let r = schedule(
        free_port(),
        upstream_command(),
        &[("ROOT_STATUS", "500".into())],
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout.contains("dev.runr.schedule.tick"),
        "the body is printed: {}",
        r.stdout
    );
    assert!(!alive(booted_pid(&r.stderr)));
}

#[test]
fn invoke_sequence_server_that_never_listens_exits_1() {
    let r = schedule(
        free_port(),
        r#"["sleep", "300"]"#.into(),
        &[("RUNR_TICK_WAIT", "500ms".into())],
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("the server never listened"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty());
}

#[test]
fn invoke_sequence_server_that_exits_before_listening_exits_1() {
    let r = schedule(free_port(), r#"["sh", "-c", "exit 4"]"#.into(), &[]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("the server exited before listening"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("status=4"), "{}", r.stderr);
}

#[test]
fn invoke_sequence_kills_a_server_that_ignores_sigterm() {
    let r = schedule(
        free_port(),
        upstream_command(),
        &[("IGNORE_TERM", "1".into())],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("server ignored SIGTERM: killing it"),
        "{}",
        r.stderr
    );
    assert!(!alive(booted_pid(&r.stderr)));
}

#[test]
fn schedule_one_shot_in_exec_mode() {
    let vars = vec![
        ("PORT", free_port().to_string()),
        ("RUNR_WRAPPER_MODE", "exec".to_string()),
        // The handler prints its envelope: the answer is the request it got.
        ("RUNR_COMMAND", r#"["cat"]"#.to_string()),
        ("RUNR_TRIGGER", "schedule".to_string()),
    ];
    let r = run(&[], &vars, Duration::from_secs(30));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let env: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(env["trigger"], "schedule");
    assert_eq!(env["method"], "POST");
    assert_eq!(env["path"], "/");
    assert_eq!(env["body"], r#"{"trigger":"schedule"}"#);
    assert_eq!(env["headers"]["ce-type"], "dev.runr.schedule.tick");
    assert_eq!(env["event"]["type"], "dev.runr.schedule.tick");
    assert_eq!(env["event"]["source"], "/runr/schedule");
    assert_eq!(
        env["event"]["data"],
        serde_json::json!({"trigger": "schedule"})
    );
    assert_eq!(env["id"], env["event"]["id"]);
}

#[test]
fn unknown_runr_variables_are_named_in_one_warning_each_and_ignored() {
    let vars = vec![
        ("PORT", free_port().to_string()),
        ("RUNR_WRAPPER_MODE", "exec".to_string()),
        ("RUNR_COMMAND", r#"["cat"]"#.to_string()),
        ("RUNR_TRIGGER", "schedule".to_string()),
        // A typo of RUNR_TIMEOUT: without the warning it would be the default, silently.
        ("RUNR_TIMOUT", "1".to_string()),
        ("RUNR_NOT_OURS_AT_ALL", "x".to_string()),
        // The tick's own variable, which the wrapper reads too: not unknown.
        ("RUNR_TICK_WAIT", "10s".to_string()),
        // What the platform sets in every function container: not unknown either.
        ("RUNR_MODE", "schedule".to_string()),
        ("RUNR_FILENAME", "main.sh".to_string()),
        ("RUNR_HANDLER", "handler".to_string()),
        ("RUNR_MCP_GATEWAY_KEY", "k-123".to_string()),
        ("RUNR_MODEL_GPT4_URL", "http://models/gpt4".to_string()),
        ("K_SERVICE", "orders".to_string()),
    ];
    let r = run(&[], &vars, Duration::from_secs(30));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let warnings: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("unknown variable"))
        .collect();
    assert_eq!(
        warnings,
        [
            "[runr-wrapper] WARN unknown variable, ignored variable=RUNR_NOT_OURS_AT_ALL",
            "[runr-wrapper] WARN unknown variable, ignored variable=RUNR_TIMOUT did_you_mean=RUNR_TIMEOUT",
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn schedule_one_shot_failure_exits_1() {
    let vars = vec![
        ("RUNR_WRAPPER_MODE", "exec".to_string()),
        (
            "RUNR_COMMAND",
            r#"["sh", "-c", "cat >/dev/null; exit 3"]"#.to_string(),
        ),
        ("RUNR_TRIGGER", "schedule".to_string()),
    ];
    let r = run(&[], &vars, Duration::from_secs(30));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout.contains("handler exited with status 3"),
        "{}",
        r.stdout
    );
}

#[test]
fn schedule_one_shot_in_persistent_mode() {
    let vars = vec![
        ("RUNR_WRAPPER_MODE", "persistent".to_string()),
        (
            "RUNR_COMMAND",
            serde_json::to_string(&["python3", "-u", &fixtures().path("worker.py")]).unwrap(),
        ),
        ("RUNR_TRIGGER", "schedule".to_string()),
    ];
    let r = run(&[], &vars, Duration::from_secs(30));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let body: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(body["path"], "/");
    assert_eq!(body["body"], r#"{"trigger":"schedule"}"#);
}

/// A CloudEvents consumer on a free port answering `status`.
fn receiver(status: u16) -> (Child, u16) {
    let port = free_port();
    let child = Child::spawn(
        Command::new("python3")
            .arg(ce_receiver_script())
            .arg(port.to_string())
            .arg(status.to_string())
            .stdout(std::process::Stdio::null()),
    )
    .unwrap();
    (child, port)
}

#[test]
fn tick_subcommand_sends_a_conforming_cloudevent() {
    let (_rx, port) = receiver(200);
    // The receiver may still be starting: the tick waits for it.
    let r = run(
        &["tick"],
        &[("PORT", port.to_string())],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let seen: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(seen["type"], "dev.runr.schedule.tick");
    assert_eq!(seen["data"], serde_json::json!({"trigger": "schedule"}));
}

#[test]
fn tick_subcommand_exit_status_follows_the_answer() {
    let (_rx, port) = receiver(503);
    let r = run(
        &["tick"],
        &[("RUNR_TICK_URL", format!("http://127.0.0.1:{port}/"))],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    let r = run(&["tick"], &[("PORT", "x".into())], Duration::from_secs(30));
    assert_eq!(r.code, 2);
    assert!(
        runr_testkit::logfmt::plain(r.stderr.trim_end()).contains(r#"PORT="x""#),
        "{}",
        r.stderr
    );
}

#[test]
fn invoke_sequence_is_traced_and_a_failed_tick_captured() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl");
    let r = schedule(
        free_port(),
        upstream_command(),
        &[
            ("ROOT_STATUS", "503".into()),
            ("RUNR_TRACING", "1".into()),
            ("RUNR_REPLAY", "1".into()),
            ("RUNR_REPLAY_FILE", file.to_string_lossy().into_owned()),
        ],
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    let body: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let access = crate::support::observed::access_lines(&r.stderr);
    assert_eq!(access.len(), 1, "{}", r.stderr);
    let line = &access[0];
    assert_eq!(
        (line.method.as_str(), line.path.as_str(), line.status),
        ("POST", "/", 503)
    );
    assert_eq!(
        body["traceparent"],
        format!("00-{}-{}-01", line.trace_id, line.span_id)
    );
    let captures = crate::support::observed::replay_lines(&file, 1);
    assert_eq!(captures[0]["trigger"], "schedule");
    assert_eq!(captures[0]["failure"], "status");
    assert_eq!(captures[0]["traceId"], line.trace_id.as_str());
    assert_eq!(captures[0]["headers"]["ce-type"], "dev.runr.schedule.tick");
}

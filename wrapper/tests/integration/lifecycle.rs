//! The process as a whole: bad configuration, subcommands, SIGTERM drain, PID-1 reaping.

use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use runr_testkit::wait_for;

use crate::support::{alive, bin, children_of, env, fixtures, load, Body, RespExt, Wrapper};

#[test]
fn bad_configuration_exits_2_naming_every_variable() {
    let out = Command::new(bin())
        .env_clear()
        .env("PORT", "eighty")
        .env("RUNR_WRAPPER_MODE", "fork")
        .env("RUNR_WORKERS", "17")
        .env("RUNR_TIMEOUT", "soon")
        .env("RUNR_INPUT", "xml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let read: Vec<String> = err.lines().map(runr_testkit::logfmt::plain).collect();
    let lines: Vec<&str> = read.iter().map(String::as_str).collect();
    for expected in [
        r#"PORT="eighty""#,
        r#"RUNR_WRAPPER_MODE="fork""#,
        "RUNR_COMMAND=<unset>",
        r#"RUNR_WORKERS="17""#,
        r#"RUNR_TIMEOUT="soon""#,
        r#"RUNR_INPUT="xml""#,
    ] {
        assert_eq!(
            lines.iter().filter(|l| l.contains(expected)).count(),
            1,
            "one line for {expected}:\n{err}"
        );
    }
    assert!(
        lines.iter().all(|l| l.starts_with("[runr-wrapper] ")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn unknown_subcommand_exits_2() {
    let out = Command::new(bin()).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown subcommand \"frobnicate\""));
}

#[test]
fn version_prints_version_and_variables() {
    let out = Command::new(bin()).arg("version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("runr-wrapper {}\n", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    for var in [
        "PORT",
        "RUNR_WRAPPER_MODE",
        "RUNR_COMMAND",
        "RUNR_INPUT",
        "RUNR_WORKERS",
        "RUNR_TIMEOUT",
        "RUNR_TRIGGER",
    ] {
        assert!(text.contains(var), "{var} missing:\n{text}");
    }
}

#[test]
fn install_copies_itself_atomically_with_mode_0755() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("runr/deep/runr-wrapper");
    // Installing twice also replaces an existing file.
    for _ in 0..2 {
        let out = Command::new(bin())
            .arg("install")
            .arg(&dest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta = std::fs::metadata(&dest).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(bin()).unwrap());
    // No temporary files left next to it.
    let names: Vec<_> = std::fs::read_dir(dest.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let out = Command::new(&dest).arg("version").output().unwrap();
    assert!(out.status.success());

    let out = Command::new(bin()).arg("install").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(bin())
        .args(["install", "/proc/not-writable/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("install failed"));
}

#[test]
fn sigterm_drains_in_flight_requests_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "touch {}/$RUNR_REQUEST_ID; sleep 1; echo finished",
        dir.path().display()
    );
    let mut w = Wrapper::start(&env("exec", &["bash", "-c", &script]));
    let addr = w.addr();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                crate::support::Conn::open(addr).send("GET", "/", &[], Body::None)
            })
        })
        .collect();
    wait_for("four handlers running", Duration::from_secs(30), || {
        (std::fs::read_dir(dir.path()).unwrap().count() == 4).then_some(())
    });
    w.child.signal(Signal::SIGTERM);
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "finished\n"));
    }
    let status = w.child.wait_timeout(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", w.log());
    assert!(
        runr_testkit::nothing_listens(addr),
        "still accepting after SIGTERM"
    );
    let log = w.log();
    assert!(log.contains("shutdown requested signal=SIGTERM\n"), "{log}");
}

#[test]
fn sigterm_stops_persistent_workers() {
    let f = fixtures();
    let mut vars = env("persistent", &["python3", "-u", &f.path("worker.py")]);
    vars.push(("RUNR_WORKERS".into(), "2".into()));
    let mut w = Wrapper::start(&vars);
    let pid = w.get("/").json()["pid"].as_i64().unwrap() as i32;
    w.child.signal(Signal::SIGTERM);
    let status = w.child.wait_timeout(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", w.log());
    assert!(!alive(pid));
    assert_eq!(w.log().matches("worker stopped").count(), 2, "{}", w.log());
}

/// As PID 1 of a fresh PID namespace (what a pod gives it), the wrapper reaps every orphan:
/// 10 000 invocations whose handler leaves a grandchild behind leave no zombie.
#[test]
fn as_pid_1_no_zombies_after_10000_requests() {
    let permitted = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !permitted {
        eprintln!(
            "skipped: `unshare --pid --fork` is not permitted here (needs root or user namespaces)"
        );
        return;
    }
    let f = fixtures();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", bin()]);
    let mut vars = env("exec", &[&f.path("forker")]);
    vars.push(("RUNR_LOG".into(), "info".into()));
    let mut w = Wrapper::start_with(cmd, &vars);
    // The wrapper is unshare's only child; in its namespace it is PID 1.
    let unshare_pid = w.child.pid() as i32;
    let wrapper = wait_for("the wrapper process", Duration::from_secs(60), || {
        children_of(unshare_pid).first().map(|(pid, _)| *pid)
    });
    w.wait_log("running as PID 1");

    let counts = load(w.addr(), 8, 1250, "/");
    assert_eq!(counts.get(&200), Some(&10_000), "{counts:?}");
    // Grandchildren live 5 ms after their handler; once they are gone nothing may be left.
    wait_for("every orphan reaped", Duration::from_secs(20), || {
        children_of(wrapper).is_empty().then_some(())
    });
    // SIGTERM to the wrapper itself (unshare just passes its exit status on).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(wrapper), Signal::SIGTERM).unwrap();
    let status = w.child.wait_timeout(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", w.log());
}

#[test]
fn a_worker_ignoring_sigterm_is_killed_after_5s() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("worker.pid");
    let script = format!(
        // Ignores SIGTERM and stdin's EOF too.
        "trap '' TERM; echo $$ > {}; while :; do if read -r line; then echo '{{\"statusCode\":200,\"body\":\"ok\"}}'; else sleep 0.1; fi; done",
        pidfile.display()
    );
    let mut w = Wrapper::start(&env("persistent", &["bash", "-c", &script]));
    assert_eq!(w.get("/").text(), "ok");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let started = std::time::Instant::now();
    w.child.signal(Signal::SIGTERM);
    let status = w.child.wait_timeout(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", w.log());
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(!alive(pid));
    assert!(
        w.log().contains("worker ignored SIGTERM; killing it"),
        "{}",
        w.log()
    );
}

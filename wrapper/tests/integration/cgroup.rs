//! Admission sized to the pod: the wrapper started in a real memory cgroup the test creates
//! (a child of the test's own, `memory.max` = 256 MiB on cgroup v2, `memory.limit_in_bytes` on
//! a v1 host) finds the limit, holds at most half of it for invocations, and a burst of 64
//! concurrent 9 MiB JSON requests — about 600 MiB of bodies — is answered without the OOM
//! killer: every request 200 (byte for byte) or 503, `oom_kill` 0. Needs root and a writable
//! cgroup hierarchy; skipped with the reason printed otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use runr_testkit::http::Body;
use runr_testkit::MIB;

use crate::support::{bin, env, fixtures, pattern, Conn, Wrapper};

const LIMIT: usize = 256 * MIB;
const REQUESTS: usize = 64;
const BODY: usize = 9 * MIB;
/// What each handler answers (`/answer/<seed>/ANSWER`).
const ANSWER: usize = 64 * 1024;

/// A memory cgroup made for one test, removed when dropped (after the wrapper in it).
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    /// A child of this process's own cgroup with `limit` bytes, or why there cannot be one.
    fn create(limit: usize) -> Result<Cgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
        let name = format!("runr-wrapper-test-{}", std::process::id());
        let mut why = Vec::new();
        // v2: the own cgroup must delegate the memory controller to its children.
        if let (Some(path), Some(point)) = (v2_path(&own), mount_of(&mounts, "cgroup2", None)) {
            let base = point.join(path.trim_start_matches('/'));
            match v2_child(&base, &name, limit) {
                Ok(dir) => return Ok(Cgroup { dir, v2: true }),
                Err(e) => why.push(format!("cgroup v2 at {}: {e}", base.display())),
            }
        } else {
            why.push("no cgroup v2 hierarchy".to_string());
        }
        if let (Some(path), Some(point)) = (
            v1_memory_path(&own),
            mount_of(&mounts, "cgroup", Some("memory")),
        ) {
            let dir = point.join(path.trim_start_matches('/')).join(&name);
            let made = std::fs::create_dir(&dir).and_then(|()| {
                std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())
            });
            match made {
                Ok(()) => return Ok(Cgroup { dir, v2: false }),
                Err(e) => {
                    let _ = std::fs::remove_dir(&dir);
                    why.push(format!("cgroup v1 memory at {}: {e}", dir.display()));
                }
            }
        } else {
            why.push("no cgroup v1 memory controller".to_string());
        }
        Err(why.join("; "))
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Times the OOM killer killed a process in the cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Whatever is left in it (nothing once the wrapper has stopped) goes first.
        let procs = std::fs::read_to_string(self.procs()).unwrap_or_default();
        for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// `base/name` with `limit`, when `base` can give its children the memory controller (the
/// kernel lets only a cgroup without processes of its own do that, or the root).
fn v2_child(base: &Path, name: &str, limit: usize) -> Result<PathBuf, String> {
    let controllers = std::fs::read_to_string(base.join("cgroup.controllers"))
        .map_err(|e| format!("cgroup.controllers: {e}"))?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err("no memory controller".into());
    }
    let subtree = std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
    if !subtree.split_whitespace().any(|c| c == "memory") {
        std::fs::write(base.join("cgroup.subtree_control"), "+memory").map_err(|e| {
            format!("enabling memory for children (a cgroup with processes cannot): {e}")
        })?;
    }
    let dir = base.join(name);
    std::fs::create_dir(&dir).map_err(|e| format!("mkdir: {e}"))?;
    if let Err(e) = std::fs::write(dir.join("memory.max"), limit.to_string()) {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("memory.max: {e}"));
    }
    // No swap: the limit is the memory.
    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
    Ok(dir)
}

fn v2_path(cgroups: &str) -> Option<&str> {
    cgroups.lines().find_map(|l| l.strip_prefix("0::"))
}

fn v1_memory_path(cgroups: &str) -> Option<&str> {
    cgroups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })
}

/// Where a hierarchy of `fstype` (with `option` among its super options) is mounted, when its
/// root is the hierarchy's root.
fn mount_of(mounts: &str, fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let ok = right.first() == Some(&fstype)
            && left.get(3) == Some(&"/")
            && option.is_none_or(|o| right.get(2).is_some_and(|s| s.split(',').any(|x| x == o)));
        ok.then(|| PathBuf::from(left[4]))
    })
}

#[test]
fn a_burst_in_a_256_mib_cgroup_is_answered_without_the_oom_killer() {
    let cgroup = match Cgroup::create(LIMIT) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED: no memory cgroup to run in: {why}");
            return;
        }
    };
    let mut vars = env("exec", &[&fixtures().path("stress_handler")]);
    vars.push(("RUNR_LOG".into(), "info".into()));
    vars.push(("RUNR_TIMEOUT".into(), "300".into()));
    // Into the cgroup before the wrapper is exec'd, so it reads its own limit.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", r#"echo $$ > "$1" && exec "$2""#, "sh"])
        .arg(cgroup.procs())
        .arg(bin());
    let w = Wrapper::start_with(cmd, &vars);
    w.wait_log("memory budget");
    let log = w.log();
    let line = log.lines().find(|l| l.contains("memory budget")).unwrap();
    assert!(
        line.contains("cgroup_limit=256MiB") && line.contains("max_inflight_bytes=128MiB"),
        "{line}"
    );
    let body: Arc<Vec<u8>> = Arc::new(
        std::iter::once(b'"')
            .chain((0..BODY - 2).map(|i| b'a' + (i % 26) as u8))
            .chain(std::iter::once(b'"'))
            .collect(),
    );
    let clients: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (addr, body) = (w.addr(), body.clone());
            std::thread::spawn(move || {
                let path = format!("/answer/{i}/{ANSWER}");
                let r = Conn::open(addr).send(
                    "POST",
                    &path,
                    &[("Content-Type", "application/json")],
                    Body::Sized(&body),
                );
                (i, r)
            })
        })
        .collect();
    let mut ok = 0;
    for c in clients {
        let (i, r) = c.join().unwrap();
        match r.status {
            200 => {
                let want: Vec<u8> = (i as u32..(i + ANSWER) as u32).map(pattern).collect();
                assert!(r.body == want, "request {i}: the answer differs");
                ok += 1;
            }
            503 => assert_eq!(r.header("x-runr-error"), Some("overload"), "{}", r.text()),
            s => panic!("request {i}: {s} {}", r.text()),
        }
    }
    assert_eq!(cgroup.oom_kills(), 0, "the OOM killer ran in the cgroup");
    assert!(
        crate::support::alive(w.pid() as i32),
        "the wrapper is still running"
    );
    eprintln!(
        "{ok} of {REQUESTS} answered 200 (cgroup {}, v2: {})",
        cgroup.dir.display(),
        cgroup.v2
    );
    drop(w);
}

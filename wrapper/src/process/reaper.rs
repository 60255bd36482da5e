//! Reaping: the ONE place in the wrapper that calls `waitpid`.
//!
//! As PID 1 of a pod (or as a child subreaper otherwise) the wrapper inherits every orphaned
//! descendant — a handler's `sleep 60 &` outlives the handler — and must reap them or they stay
//! zombies. Reaping orphans needs `waitpid(-1)`, and a `waitpid(-1)` loop next to
//! `tokio::process` steals the exit statuses tokio waits for (both wait, only one gets the
//! status). So the wrapper owns all spawning and all reaping itself:
//!
//! - every process is started by [`super::spawn`] (or [`super::prepared::spawn`]), which
//!   registers its pid in [`Table`] while holding the table's lock across `fork/exec` (so a child that exits at once
//!   cannot be reaped before it is registered, and std's own `waitpid(pid)` on a failed exec
//!   cannot race with us);
//! - one task here calls `waitpid(-1, WNOHANG)` until nothing is left after each SIGCHLD
//!   (several exits can share one SIGCHLD) and hands each status to the registered waiter;
//!   statuses of pids nobody registered are orphans and are simply dropped.
//!
//! Consequence for the rest of the crate: never use `tokio::process` or `std::process::Child::wait`
//! here; spawn with [`super::spawn`] and wait with [`super::Process::wait`].
//!
//! A child std spawned is reaped with `wait4` rather than `waitpid`: the same, plus the child's
//! own resource usage, whose peak resident set the per-invocation log line reports. nix has no
//! `wait4` and the workspace forbids `unsafe`, so while such a child is registered the loop
//! finds an exited child with `waitid(P_ALL, WNOWAIT)` (it stays a zombie), and reaps a
//! registered one through the `wait4` crate's `Child::wait4` (immediate: it has exited), any
//! other with `waitpid`. While none is (exec mode without the per-invocation line; persistent
//! and lambda mode spawn their workers through std, so they always have one),
//! `waitpid(-1)` reaps directly: one system call an exit fewer.

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::oneshot;
use wait4::Wait4;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// It was killed by this signal number.
    Signal(i32),
}

impl Exit {
    /// The status as a shell reports it: the exit code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }

    /// Exited with status 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

/// What the reaper learned about a process that ended: how, and its peak resident set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// How it ended.
    pub exit: Exit,
    /// Its largest resident set size in KiB (`ru_maxrss`), of the process alone: what its own
    /// children used is counted in theirs.
    pub max_rss_kib: u64,
}

/// The processes whose exit somebody waits for, by pid, with their std `Child` when std
/// spawned them (kept only to be reaped through: std never waits for it).
pub struct Table {
    waiting: BTreeMap<i32, (oneshot::Sender<Reaped>, Option<Child>)>,
    /// How many of `waiting` hold a std `Child` (to be reaped with its rusage).
    with_child: usize,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    waiting: BTreeMap::new(),
    with_child: 0,
});

/// True while a reaper task runs (reset when its runtime drops it, so a new runtime, e.g. in
/// tests, starts its own).
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Locks the table. Hold it across spawning (see the module docs) and across signalling a
/// group (a registered pid is not reaped yet, so its pgid cannot have been recycled).
pub fn lock() -> MutexGuard<'static, Table> {
    // A panic while holding the lock leaves the map itself consistent.
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    /// Registers `child`; the receiver gets its exit status once it is reaped.
    pub fn register(&mut self, child: Child) -> oneshot::Receiver<Reaped> {
        self.insert(child.id() as i32, Some(child))
    }

    /// Registers `pid`, spawned without std: reaped by pid, without its rusage.
    pub fn register_pid(&mut self, pid: i32) -> oneshot::Receiver<Reaped> {
        self.insert(pid, None)
    }

    fn insert(&mut self, pid: i32, child: Option<Child>) -> oneshot::Receiver<Reaped> {
        let (tx, rx) = oneshot::channel();
        self.with_child += usize::from(child.is_some());
        // A pid already there was reaped behind the table's back (never by this module).
        if let Some((_, Some(_))) = self.waiting.insert(pid, (tx, child)) {
            self.with_child -= 1;
        }
        rx
    }

    /// True while `pid` is registered and not reaped yet.
    pub fn is_live(&self, pid: i32) -> bool {
        self.waiting.contains_key(&pid)
    }

    /// Reaps `pid`, which has exited (`waitid` saw it, without reaping it), and tells its
    /// waiter.
    fn reap(&mut self, pid: Pid, exit: Exit) {
        match self.waiting.remove(&pid.as_raw()) {
            Some((tx, child)) => {
                if child.is_some() {
                    self.with_child -= 1;
                }
                // A zombie: wait4 returns at once, with its rusage. Linux reports KiB.
                let max_rss_kib = match child.map(|mut c| c.wait4()) {
                    Some(Ok(used)) => used.rusage.maxrss / 1024,
                    Some(Err(e)) => {
                        tracing::warn!(pid = pid.as_raw(), error = %e, "wait4 failed");
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                        0
                    }
                    // Spawned without std (`super::prepared`): no safe binding takes wait4 by
                    // pid, so no rusage. Nobody reports this one's peak RSS.
                    None => {
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                        0
                    }
                };
                // The waiter may be gone (request cancelled): nothing to tell then.
                let _ = tx.send(Reaped { exit, max_rss_kib });
            }
            None => {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                tracing::debug!(pid = pid.as_raw(), ?exit, "reaped orphan");
            }
        }
    }
}

/// Starts the reaper task on the current tokio runtime unless one runs already. The SIGCHLD
/// handler is installed before this returns, so call it before the first spawn.
pub fn ensure_started() -> std::io::Result<()> {
    if RUNNING.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    match signal(SignalKind::child()) {
        Ok(sigchld) => {
            tokio::spawn(reap_loop(sigchld, Running));
            Ok(())
        }
        Err(e) => {
            RUNNING.store(false, Ordering::SeqCst);
            Err(e)
        }
    }
}

/// Clears [`RUNNING`] when the reaper task is dropped with its runtime.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::SeqCst);
    }
}

async fn reap_loop(mut sigchld: Signal, _running: Running) {
    loop {
        // Reap first: children may have exited before the handler was installed.
        reap_now();
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

/// Reaps every exited child, ours or orphaned, without blocking.
pub fn reap_now() {
    let mut table = lock();
    if table.with_child == 0 {
        return reap_all(&mut table);
    }
    let exited = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::All, exited) {
            Ok(WaitStatus::Exited(pid, code)) => table.reap(pid, Exit::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) => table.reap(pid, Exit::Signal(sig as i32)),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            // Only exits are asked for (WEXITED); skip anything else if it comes.
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "waitid failed");
                return;
            }
        }
    }
}

/// [`reap_now`] while no std `Child` is registered: each `waitpid(-1)` reaps one exited
/// child (the lock is held, so none can be registered meanwhile).
fn reap_all(table: &mut Table) {
    loop {
        let (pid, exit) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, Exit::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, Exit::Signal(sig as i32)),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            // Stops and continues are not asked for (no WUNTRACED, no WCONTINUED).
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "waitpid failed");
                return;
            }
        };
        match table.waiting.remove(&pid.as_raw()) {
            // Registered by pid (no `Child`, as `with_child` is 0): no rusage.
            Some((tx, _)) => {
                let _ = tx.send(Reaped {
                    exit,
                    max_rss_kib: 0,
                });
            }
            None => tracing::debug!(pid = pid.as_raw(), ?exit, "reaped orphan"),
        }
    }
}

/// Makes sure orphaned descendants come to us: PID 1 gets them from the kernel; otherwise we
/// ask to be a child subreaper. Logs once when neither works (tini's `reaper_check`).
pub fn adopt_orphans() {
    if std::process::id() == 1 {
        tracing::info!("running as PID 1: reaping orphaned processes");
        return;
    }
    // gVisor (20221219) refuses PR_SET_CHILD_SUBREAPER with EINVAL to any process but PID 1.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(
            error = %e,
            "not PID 1 and cannot become a child subreaper: processes a handler leaves behind \
             go to the container's PID 1, and stay zombies holding the pod's pids unless it \
             reaps them; make runr-wrapper the container's command to have them reaped"
        );
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::process::Command;

    use super::*;
    use crate::process::{prepared, spawn};

    /// Children spawned both ways at once are reaped through the `waitid` peek (a std child is
    /// registered), then, once it is gone, through `waitpid(-1)` alone: every exit status
    /// reaches its waiter, and only std's children report a peak RSS. (Called from the one
    /// spawning test.)
    pub async fn both_ways_of_reaping() {
        let stdin = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap().0;
        let exiting = |code: i32| {
            let argv = ["sh".to_string(), "-c".into(), format!("exit {code}")];
            prepared::Prepared::new("/bin/sh", &argv, None).unwrap()
        };
        let mut held = spawn(Command::new("sleep").arg("30")).unwrap();
        assert_eq!(lock().with_child, 1);
        for code in [5, 6] {
            let mut p = prepared::spawn(&exiting(code), &[], stdin(), false).unwrap();
            assert_eq!(p.wait().await, Exit::Code(code));
            assert_eq!(p.peak_rss_kib(), None, "reaped by pid: no rusage");
        }
        held.signal_group(nix::sys::signal::Signal::SIGKILL);
        assert_eq!(held.wait().await, Exit::Signal(9));
        assert!(held.peak_rss_kib().is_some_and(|kib| kib > 0));
        {
            let table = lock();
            assert_eq!(table.with_child, 0, "{:?}", table.waiting.keys());
        }

        let mut ps: Vec<_> = (7..10)
            .map(|code| prepared::spawn(&exiting(code), &[], stdin(), false).unwrap())
            .collect();
        for (p, code) in ps.iter_mut().zip(7..) {
            assert_eq!(p.wait().await, Exit::Code(code));
        }
        let mut p = spawn(Command::new("sh").args(["-c", "exit 11"])).unwrap();
        assert_eq!(p.wait().await, Exit::Code(11));
        assert!(p.peak_rss_kib().is_some_and(|kib| kib > 0));
        assert_eq!(lock().with_child, 0);
    }
}

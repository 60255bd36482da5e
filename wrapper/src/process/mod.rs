//! Starting the user's processes: each in its own process group, with async pipes (and, with
//! `RUNR_RESULT_FD=3`, a result pipe as its fd 3: [`result_fd`]), owned by a [`Process`] guard
//! that kills the whole group when dropped before the process was reaped (a cancelled request
//! leaves no strays). Exit statuses come from [`reaper`], the one place that reaps. The
//! program's log lines go to our stderr through [`lines`]. Long-lived children (persistent
//! mode's workers, lambda mode's runtimes) live under the one [`supervisor`].

pub(crate) mod arg_limit;
pub(crate) mod lines;
pub(crate) mod prepared;
pub(crate) mod reaper;
pub(crate) mod result_fd;
pub(crate) mod supervisor;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncBufReadExt;
#[cfg(test)]
use tokio::io::BufReader;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::observe::logs::{HandlerLog, Stream};
use lines::LinePipe;

use reaper::{Exit, Reaped};

/// A running process (the leader of its own process group) and its pipes.
pub struct Process {
    pid: i32,
    exit: oneshot::Receiver<Reaped>,
    status: Option<Reaped>,
    /// Its stdin, when piped.
    pub stdin: Option<pipe::Sender>,
    /// Its stdout, when piped.
    pub stdout: Option<pipe::Receiver>,
    /// Its stderr, when piped.
    pub stderr: Option<pipe::Receiver>,
    /// The read end of its fd 3, when spawned with [`spawn_with_result_fd`].
    pub result: Option<pipe::Receiver>,
}

/// Spawns `cmd` as the leader of a new process group and registers it with the reaper. Must
/// run inside the tokio runtime.
pub fn spawn(cmd: &mut Command) -> io::Result<Process> {
    spawn_inner(cmd, false)
}

/// [`spawn`] with a result pipe as the child's fd 3 ([`Process::result`] reads it). fd 3 must
/// have been reserved at start ([`result_fd::reserve`]).
pub fn spawn_with_result_fd(cmd: &mut Command) -> io::Result<Process> {
    spawn_inner(cmd, true)
}

fn spawn_inner(cmd: &mut Command, with_result: bool) -> io::Result<Process> {
    reaper::ensure_started()?;
    // A group of its own: timeouts and cancellations kill the handler with everything it
    // started, and a terminal's or our own group's signals do not reach it.
    cmd.process_group(0);
    let result = with_result.then(result_fd::pipe).transpose()?;
    let (pid, pipes, exit) = {
        // Held across fork/exec: see the reaper module docs (and result_fd's).
        let mut table = reaper::lock();
        let mut child = match &result {
            Some((_, write)) => result_fd::with_fd3(write, || cmd.spawn())?,
            None => cmd.spawn()?,
        };
        let pid = child.id() as i32;
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        // The reaper keeps std's Child to reap it through (std never waits for it).
        let exit = table.register(child);
        (pid, pipes, exit)
    };
    // The child has its copy of the write end; ours must go, or EOF would never come.
    let result = result.map(|(read, _write)| read);
    let stdin = pipes.0.map(|s| sender(OwnedFd::from(s)));
    let stdout = pipes.1.map(|s| receiver(OwnedFd::from(s)));
    let stderr = pipes.2.map(|s| receiver(OwnedFd::from(s)));
    let mut process = Process::registered(pid, exit);
    // On error `process` drops here and kills the fresh group.
    process.stdin = stdin.transpose()?;
    process.stdout = stdout.transpose()?;
    process.stderr = stderr.transpose()?;
    process.result = result.map(receiver).transpose()?;
    Ok(process)
}

/// The writing end of a pipe made here or by std (so a pipe, opened for writing), made
/// non-blocking and registered with the runtime. tokio's `from_owned_fd` would check both
/// first with an fstat and an F_GETFL: two system calls per pipe, per exec invocation.
pub fn sender(fd: OwnedFd) -> io::Result<pipe::Sender> {
    pipe::Sender::from_owned_fd_unchecked(nonblocking(fd)?)
}

/// The reading end of a pipe made here or by std, as [`sender`] does it.
pub fn receiver(fd: OwnedFd) -> io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd_unchecked(nonblocking(fd)?)
}

/// `fd` with `O_NONBLOCK` set, its only status flag: a fresh pipe end has no other (the access
/// mode is not changed by F_SETFL). Only our end: the child's is another open file.
fn nonblocking(fd: OwnedFd) -> io::Result<OwnedFd> {
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(fd)
}

impl Process {
    /// A child the reaper knows (`exit` resolves when it is reaped), its pipes not attached
    /// yet: dropped from here on, it kills its group.
    fn registered(pid: i32, exit: oneshot::Receiver<Reaped>) -> Process {
        Process {
            pid,
            exit,
            status: None,
            stdin: None,
            stdout: None,
            stderr: None,
            result: None,
        }
    }

    /// The process id, which is also its process group id.
    pub fn id(&self) -> i32 {
        self.pid
    }

    /// Waits until the process has exited and been reaped. Cancel-safe.
    pub async fn wait(&mut self) -> Exit {
        if let Some(status) = self.status {
            return status.exit;
        }
        // The sender only goes away with a reaped status sent, or if the table was torn down;
        // report the latter like a kill so callers never hang.
        let status = (&mut self.exit).await.unwrap_or(Reaped {
            exit: Exit::Signal(9),
            max_rss_kib: 0,
        });
        self.status = Some(status);
        status.exit
    }

    /// The exit status if the process has been reaped already.
    pub fn try_status(&mut self) -> Option<Exit> {
        if self.status.is_none() {
            self.status = self.exit.try_recv().ok();
        }
        self.status.map(|s| s.exit)
    }

    /// Its peak resident set in KiB, once it has been reaped (`None` before, or when the
    /// kernel reported none).
    pub fn peak_rss_kib(&self) -> Option<u64> {
        self.status.map(|s| s.max_rss_kib).filter(|kib| *kib > 0)
    }

    /// Sends `sig` to the whole process group while the leader is not reaped yet (after that
    /// its pgid could name somebody else's group). Returns whether it was sent.
    pub fn signal_group(&self, sig: Signal) -> bool {
        let table = reaper::lock();
        // pgid 0 or 1 would signal our own group or everything we may kill.
        if self.pid <= 1 || !table.is_live(self.pid) {
            return false;
        }
        match killpg(Pid::from_raw(self.pid), sig) {
            Ok(()) => true,
            // ESRCH: the group is gone already, which is what we wanted.
            Err(_) => false,
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.signal_group(Signal::SIGKILL);
    }
}

/// A stdin pipe whose reading end the wrapper keeps a copy of, so that once the process is gone
/// it can tell what the process did not read: that is still in the pipe.
pub struct StdinPipe {
    /// The process's end, for [`Command::stdin`].
    pub child: Stdio,
    /// Our writing end.
    pub writer: pipe::Sender,
    /// Our copy of the reading end: blocking (its open file is the child's stdin, whose mode
    /// must not change), so read it only once `writer` is closed, when reads end at EOF.
    pub unread: OwnedFd,
}

/// A new [`StdinPipe`] (close-on-exec, so no other child inherits our ends).
pub fn stdin_pipe() -> io::Result<StdinPipe> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let unread = read.try_clone()?;
    Ok(StdinPipe {
        child: Stdio::from(read),
        writer: sender(write)?,
        unread,
    })
}

/// Forwards a process's pipe to our stderr line by line until EOF, in a task of its own: the
/// lines carry `log`'s tag and count against its cap.
pub fn forward_lines(from: pipe::Receiver, stream: Stream, log: HandlerLog) {
    tokio::spawn(LinePipe::new(from, stream).forward_to_end(log));
}

/// What [`read_ready`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Drained {
    /// Everything the pipe held is in `out` (the pipe is empty, or at EOF).
    All,
    /// `out` passed the cap; the rest was left in the pipe.
    OverCap,
}

/// Appends what the non-blocking pipe `from` holds right now to `out`, stopping once `out`
/// has more than `cap` bytes. Straight `read(2)` calls until the kernel answers EAGAIN or EOF:
/// a pipe written by a process that has exited holds everything it wrote, and a grandchild
/// that inherited the pipe and lives on cannot make this wait.
///
/// Not tokio's `try_read`: that answers WouldBlock from tokio's cached readiness without
/// asking the kernel, so bytes that arrived since the last wakeup would be left behind (output
/// lost under concurrency).
pub fn read_ready(from: &impl AsRawFd, out: &mut Vec<u8>, cap: usize) -> Drained {
    let mut chunk = [0u8; 8192];
    loop {
        match nix::unistd::read(from.as_raw_fd(), &mut chunk) {
            Ok(0) => return Drained::All,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(Errno::EINTR) => continue,
            // EAGAIN: empty now. Any other error: nothing more can be read either.
            Err(_) => return Drained::All,
        }
        if out.len() > cap {
            return Drained::OverCap;
        }
    }
}

/// What [`read_line_capped`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line ending in `\n` (included).
    Complete,
    /// `cap` bytes without a newline; the rest of the line is still unread.
    TooLong,
    /// End of input; `buf` holds whatever came before it.
    Eof,
}

/// Appends one line to `buf`, reading at most `cap` bytes, so a program that never writes a
/// newline cannot make us buffer without bound. Cancel-safe only between lines.
pub async fn read_line_capped<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
) -> io::Result<Line> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(Line::Eof);
        }
        let room = cap.saturating_sub(buf.len());
        let (take, done) = match memchr_newline(available) {
            Some(i) if i < room => (i + 1, Some(Line::Complete)),
            _ if available.len() >= room => (room, Some(Line::TooLong)),
            _ => (available.len(), None),
        };
        buf.extend_from_slice(&available[..take]);
        reader.consume(take);
        if let Some(line) = done {
            return Ok(line);
        }
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], cap: usize) -> Vec<(Vec<u8>, Line)> {
        let mut r = BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        loop {
            let mut buf = Vec::new();
            let l = read_line_capped(&mut r, &mut buf, cap).await.unwrap();
            let eof = l == Line::Eof;
            out.push((buf, l));
            if eof {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn lines_are_split_and_capped() {
        let got = lines(b"ab\ncdefghij\nk", 5).await;
        assert_eq!(
            got,
            vec![
                (b"ab\n".to_vec(), Line::Complete),
                (b"cdefg".to_vec(), Line::TooLong),
                (b"hij\n".to_vec(), Line::Complete),
                (b"k".to_vec(), Line::Eof),
            ]
        );
    }

    // One test for everything that spawns: the reaper's waitpid(-1) would reap children that
    // other tests in this binary wait for in their own way (none do; keep it that way).
    #[tokio::test]
    async fn spawn_wait_and_signal_the_group() {
        let mut p = spawn(Command::new("sh").args(["-c", "exit 3"])).unwrap();
        assert_eq!(p.wait().await, Exit::Code(3));
        assert_eq!(p.wait().await.code(), 3, "the status is kept");
        assert!(
            !p.signal_group(Signal::SIGTERM),
            "a reaped group is never signalled"
        );

        let mut p = spawn(Command::new("sleep").arg("30")).unwrap();
        assert_eq!(p.try_status(), None);
        assert!(p.signal_group(Signal::SIGKILL));
        assert_eq!(p.wait().await, Exit::Signal(9));
        assert_eq!(Exit::Signal(9).code(), 137);

        assert!(spawn(&mut Command::new("/nonexistent/program")).is_err());

        // Dropping a live process kills its group, grandchildren included.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        let mut p = spawn(&mut cmd).unwrap();
        let mut out = BufReader::new(p.stdout.take().unwrap());
        let mut line = Vec::new();
        read_line_capped(&mut out, &mut line, 64).await.unwrap();
        let grandchild: i32 = String::from_utf8_lossy(&line).trim().parse().unwrap();
        drop(p);
        let gone = async {
            // Gone, or a zombie waiting for whoever adopted it: either way no longer running.
            let running = || {
                std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                    .ok()
                    .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
                    .unwrap_or(false)
            };
            while running() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), gone)
            .await
            .expect("grandchild killed with its group");

        the_kernel_agrees_with_arg_limit().await;
        prepared_runs_in_its_own_group().await;
        prepared_unblocks_signals().await;
        prepared_refuses_what_does_not_fit().await;
        prepared_runs_in_its_directory().await;
        reaper::tests::both_ways_of_reaping().await;
        supervisor::tests::with_real_children().await;
    }

    /// A pipe end for a child's stdin.
    fn stdin() -> OwnedFd {
        nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap().0
    }

    /// A child of [`prepared::spawn`]: its variables, its exit status, its output, its own
    /// group. (This and the three below are called from the one spawning test.)
    async fn prepared_runs_in_its_own_group() {
        use std::ffi::OsString;
        let script = "echo $RUNR_X; read -r _ _ _ _ g _ < /proc/$$/stat; echo $g; exit 4";
        let argv = ["sh".to_string(), "-c".into(), script.into()];
        let p = prepared::Prepared::new("/bin/sh", &argv, None).unwrap();
        let vars = [(OsString::from("RUNR_X"), OsString::from("set"))];
        let mut proc = prepared::spawn(&p, &vars, stdin(), false).unwrap();
        let mut out = BufReader::new(proc.stdout.take().unwrap());
        let mut line = Vec::new();
        read_line_capped(&mut out, &mut line, 64).await.unwrap();
        assert_eq!(line, b"set\n");
        line.clear();
        read_line_capped(&mut out, &mut line, 64).await.unwrap();
        let pgid: i32 = String::from_utf8_lossy(&line).trim().parse().unwrap();
        assert_eq!(pgid, proc.id(), "the leader of its own group");
        assert_eq!(proc.wait().await, Exit::Code(4));
    }

    /// A child's signal mask and dispositions as exec'd: nothing blocked, SIGPIPE not ignored
    /// (a bare program name: looked up on PATH).
    async fn prepared_unblocks_signals() {
        let argv = [
            "grep".to_string(),
            "-E".into(),
            "^Sig(Blk|Ign):".into(),
            "/proc/self/status".into(),
        ];
        let p = prepared::Prepared::new("grep", &argv, None).unwrap();
        let mut proc = prepared::spawn(&p, &[], stdin(), false).unwrap();
        let mut out = BufReader::new(proc.stdout.take().unwrap());
        let mut masks = Vec::new();
        for _ in 0..2 {
            let mut line = Vec::new();
            read_line_capped(&mut out, &mut line, 64).await.unwrap();
            let s = String::from_utf8_lossy(&line).into_owned();
            masks.push(u64::from_str_radix(s.split_whitespace().nth(1).unwrap(), 16).unwrap());
        }
        assert_eq!(masks[0], 0, "nothing blocked");
        let sigpipe = 1 << (Signal::SIGPIPE as u32 - 1);
        assert_eq!(masks[1] & sigpipe, 0, "SIGPIPE not ignored");
        assert_eq!(proc.wait().await, Exit::Code(0));
    }

    /// E2BIG exactly where [`arg_limit::ArgLimit`] says the inherited environment and the
    /// request's variables stop fitting.
    async fn prepared_refuses_what_does_not_fit() {
        use std::ffi::OsString;
        let program = "/bin/true";
        let argv = [program.to_string()];
        let limit = arg_limit::ArgLimit::of_this_process(program, &argv);
        let p = prepared::Prepared::new(program, &argv, None).unwrap();
        // Fill what the inherited environment leaves, as variables of at most 100 KiB.
        let mut room = limit.room_left() + arg_limit::INTERPRETER_RESERVE;
        let mut vars = Vec::new();
        while room > 0 {
            let name = format!("V{}", vars.len());
            let overhead = name.len() + 2 + std::mem::size_of::<usize>();
            let len = (room - overhead).min(100 * 1024);
            vars.push((OsString::from(&name), OsString::from("v".repeat(len))));
            room -= overhead + len;
        }
        let mut proc = prepared::spawn(&p, &vars, stdin(), false).unwrap();
        assert_eq!(proc.wait().await, Exit::Code(0));
        vars.last_mut().unwrap().1.push("v");
        let e = prepared::spawn(&p, &vars, stdin(), false)
            .err()
            .expect("E2BIG");
        assert_eq!(e.raw_os_error(), Some(nix::libc::E2BIG), "{e}");
    }

    /// A child in its working directory, with ours unchanged after; a relative program there;
    /// an error for a directory or a program that is not there.
    async fn prepared_runs_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("here.sh"), "pwd").unwrap();
        let ours = std::env::current_dir().unwrap();
        let argv = ["sh".to_string(), "./here.sh".into()];
        let p = prepared::Prepared::new("/bin/sh", &argv, Some(dir.path())).unwrap();
        let mut proc = prepared::spawn(&p, &[], stdin(), false).unwrap();
        assert_eq!(std::env::current_dir().unwrap(), ours);
        let mut out = BufReader::new(proc.stdout.take().unwrap());
        let mut line = Vec::new();
        read_line_capped(&mut out, &mut line, 4096).await.unwrap();
        let canonical = dir.path().canonicalize().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&line).trim_end(),
            canonical.to_str().unwrap()
        );
        assert_eq!(proc.wait().await, Exit::Code(0));
        let gone =
            prepared::Prepared::new("/bin/true", &[], Some(&dir.path().join("gone"))).unwrap();
        assert!(prepared::spawn(&gone, &[], stdin(), false).is_err());
        assert_eq!(std::env::current_dir().unwrap(), ours);

        let p = prepared::Prepared::new("/nonexistent/program", &["x".to_string()], None).unwrap();
        let e = prepared::spawn(&p, &[], stdin(), false)
            .err()
            .expect("ENOENT");
        assert_eq!(e.raw_os_error(), Some(nix::libc::ENOENT), "{e}");
    }

    /// The kernel takes exactly what [`arg_limit::ArgLimit`] says fits, and refuses one byte
    /// more: as one string and in total. (Called from the one spawning test.)
    async fn the_kernel_agrees_with_arg_limit() {
        use std::ffi::OsString;
        let program = "/bin/true";
        let argv = [program.to_string()];
        let stack = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_STACK)
            .ok()
            .map(|(soft, _)| soft)
            .filter(|s| *s != nix::sys::resource::RLIM_INFINITY);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .unwrap()
            .unwrap() as usize;
        let limit = arg_limit::ArgLimit::new(stack, page, program, &argv, &[], 0);
        let run = |vars: &[(OsString, OsString)]| {
            let mut cmd = Command::new(program);
            cmd.env_clear().envs(vars.iter().cloned());
            spawn(&mut cmd)
        };
        // One string: `A=` + value + NUL at most 32 pages.
        let one = |len: usize| vec![(OsString::from("A"), OsString::from("v".repeat(len)))];
        let longest = 32 * page - 3;
        assert_eq!(limit.check(&one(longest)), Ok(()));
        assert_eq!(run(&one(longest)).unwrap().wait().await, Exit::Code(0));
        assert!(limit.check(&one(longest + 1)).is_err());
        let e = run(&one(longest + 1)).err().expect("E2BIG");
        assert_eq!(e.raw_os_error(), Some(nix::libc::E2BIG), "{e}");
        // In total: variables of 100 KiB and one that fills the rest exactly.
        let mut room = limit.room_left();
        let mut vars = Vec::new();
        let mut i = 0;
        while room > 0 {
            let name = format!("V{i}");
            // name, '=', value, NUL and the pointer.
            let overhead = name.len() + 2 + std::mem::size_of::<usize>();
            let len = (room - overhead).min(100 * 1024);
            vars.push((OsString::from(&name), OsString::from("v".repeat(len))));
            room -= overhead + len;
            i += 1;
        }
        assert_eq!(limit.check(&vars), Ok(()));
        assert_eq!(run(&vars).unwrap().wait().await, Exit::Code(0));
        let last = vars.last_mut().unwrap();
        last.1.push("v");
        assert!(limit.check(&vars).is_err());
        let e = run(&vars).err().expect("E2BIG");
        assert_eq!(e.raw_os_error(), Some(nix::libc::E2BIG), "{e}");
    }

    #[tokio::test]
    async fn a_line_of_exactly_cap_with_newline_is_too_long_then_complete() {
        let got = lines(b"abcde\n", 5).await;
        assert_eq!(got[0], (b"abcde".to_vec(), Line::TooLong));
        assert_eq!(got[1], (b"\n".to_vec(), Line::Complete));
    }
}

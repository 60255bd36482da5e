//! Exec mode's spawn without std's `Command`: `posix_spawn` with an environment built once at
//! start. As soon as one variable is set on a `Command`, std copies the whole inherited
//! environment at every spawn (a `BTreeMap` of owned strings, then a `CString` per entry): that
//! was 60 % of the wrapper's own instructions per exec request (docs/benchmarks.md). Here the
//! inherited part is made once, and a request only adds its own `RUNR_*` variables.
//!
//! The child gets what std would give it: the same `envp` (the inherited variables with the
//! request's set over them, sorted by name as std's map sorts them), argv, stdin/stdout/stderr
//! pipes (and fd 3 with `RUNR_RESULT_FD=3`), its own process group, nothing blocked and
//! SIGPIPE (which Rust ignores) back to its default disposition.
//!
//! The working directory (`/app/code`): nix has no `posix_spawn_file_actions_addchdir`, so
//! the wrapper itself moves there for the spawn and back right after, under the reaper's lock.
//! That is only sound because nothing else in the wrapper resolves a relative path meanwhile:
//! it runs on one thread (a current-thread runtime), and the only other threads are tokio's
//! blocking pool resolving host names (`TcpStream::connect` with a name: the span export, the
//! proxy's upstream, the tick), whose getaddrinfo reads absolute paths only. Code that opens a
//! relative path off the runtime thread must not be added while this is here.
//!
//! Not for everything: no safe binding takes `wait4` by pid, so a child spawned here is reaped
//! without its rusage (see [`super::reaper`]), and an invocation whose peak RSS is reported is
//! spawned by std.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix_spawn::spawn::{
    posix_spawn, posix_spawnp, PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags,
};
use nix_spawn::sys::signal::{SigSet, Signal};

use super::{reaper, receiver, result_fd, Process};
use crate::config::handler::RESULT_FD;

/// A handler ready to be spawned many times.
#[derive(Debug, Clone)]
pub struct Prepared {
    program: CString,
    /// A bare name (not found on PATH at start): looked up per spawn, as std does.
    search_path: bool,
    /// `argv[0]` as configured.
    argv: Vec<CString>,
    /// The inherited environment as `NAME=value`, sorted by name.
    env: Vec<Entry>,
    cwd: Option<Cwd>,
}

/// The child's working directory, and ours to come back to.
#[derive(Debug, Clone)]
struct Cwd {
    dir: PathBuf,
    ours: Arc<File>,
}

/// One inherited variable.
#[derive(Debug, Clone)]
struct Entry {
    /// The length of its name (the bytes of `line` before the `=`).
    name_len: usize,
    line: CString,
}

impl Entry {
    fn name(&self) -> &[u8] {
        &self.line.as_bytes()[..self.name_len]
    }
}

impl Prepared {
    /// `program` (the path std would be given) with `argv`, this process's environment as it
    /// is now, and `cwd` as its working directory (else ours).
    pub fn new(program: &str, argv: &[String], cwd: Option<&Path>) -> io::Result<Prepared> {
        // A map, like std's: a name inherited twice is passed once, with its last value.
        let inherited: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        let mut prepared = Prepared::with_env(program, argv, &inherited)?;
        if let Some(dir) = cwd {
            prepared.cwd = Some(Cwd {
                dir: dir.to_path_buf(),
                ours: Arc::new(File::open(".")?),
            });
        }
        Ok(prepared)
    }

    fn with_env(
        program: &str,
        argv: &[String],
        env: &BTreeMap<OsString, OsString>,
    ) -> io::Result<Prepared> {
        Ok(Prepared {
            program: c_string(program.as_bytes().to_vec())?,
            search_path: !program.contains('/'),
            argv: argv
                .iter()
                .map(|a| c_string(a.as_bytes().to_vec()))
                .collect::<io::Result<_>>()?,
            env: env
                .iter()
                .map(|(name, value)| {
                    Ok(Entry {
                        name_len: name.len(),
                        line: line(name, value)?,
                    })
                })
                .collect::<io::Result<_>>()?,
            cwd: None,
        })
    }

    /// The environment of a spawn with `vars` (each name once) set over the inherited one: a
    /// merge of two sorted lists, so what std would pass, in std's order.
    fn envp<'a>(&'a self, vars: &'a [CString], names: &[&[u8]]) -> Vec<&'a CStr> {
        let mut own: Vec<usize> = (0..vars.len()).collect();
        own.sort_unstable_by_key(|&i| names[i]);
        let mut envp = Vec::with_capacity(self.env.len() + vars.len());
        let mut own = own.into_iter().peekable();
        for inherited in &self.env {
            let mut replaced = false;
            while let Some(&i) = own.peek() {
                match names[i].cmp(inherited.name()) {
                    Ordering::Greater => break,
                    // Set over it: the inherited one is not passed.
                    Ordering::Equal => replaced = true,
                    Ordering::Less => {}
                }
                envp.push(vars[i].as_c_str());
                own.next();
            }
            if !replaced {
                envp.push(&inherited.line);
            }
        }
        envp.extend(own.map(|i| vars[i].as_c_str()));
        envp
    }
}

/// `NAME=value` as a C string.
fn line(name: &OsStr, value: &OsStr) -> io::Result<CString> {
    let mut s = Vec::with_capacity(name.len() + value.len() + 2);
    s.extend_from_slice(name.as_bytes());
    s.push(b'=');
    s.extend_from_slice(value.as_bytes());
    c_string(s)
}

/// The error std gives for a NUL inside an argument or variable.
fn c_string(bytes: Vec<u8>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

/// Spawns `prepared` with `vars` set over its environment, `stdin` as its stdin (closed here
/// once the child has its copy), stdout and stderr piped, and with `with_result` a result pipe
/// as fd 3; as the leader of a new process group, registered with the reaper. Must run inside
/// the tokio runtime.
pub fn spawn(
    prepared: &Prepared,
    vars: &[(OsString, OsString)],
    stdin: OwnedFd,
    with_result: bool,
) -> io::Result<Process> {
    reaper::ensure_started()?;
    let lines = vars
        .iter()
        .map(|(k, v)| line(k, v))
        .collect::<io::Result<Vec<_>>>()?;
    let names: Vec<&[u8]> = vars.iter().map(|(k, _)| k.as_bytes()).collect();
    let envp = prepared.envp(&lines, &names);
    let (stdout, stdout_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (stderr, stderr_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let result = with_result.then(result_fd::pipe).transpose()?;
    // Our ends are all above 3 (std opens 0–2 at start if they were closed, and fd 3 is
    // reserved), so no dup2 here overwrites a descriptor a later one reads.
    let mut actions = PosixSpawnFileActions::init()?;
    actions.add_dup2(stdin.as_raw_fd(), 0)?;
    actions.add_dup2(stdout_w.as_raw_fd(), 1)?;
    actions.add_dup2(stderr_w.as_raw_fd(), 2)?;
    if let Some((_, write)) = &result {
        actions.add_dup2(write.as_raw_fd(), RESULT_FD)?;
    }
    let mut attr = PosixSpawnAttr::init()?;
    // A group of its own (see `super::spawn`); the mask and SIGPIPE as std leaves them.
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETPGROUP
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    attr.set_pgroup(nix_spawn::unistd::Pid::from_raw(0))?;
    attr.set_sigmask(&SigSet::empty())?;
    let mut default = SigSet::empty();
    default.add(Signal::SIGPIPE);
    attr.set_sigdefault(&default)?;
    let (pid, exit) = {
        // Held across the spawn: see the reaper module docs.
        let mut table = reaper::lock();
        if let Some(cwd) = &prepared.cwd {
            nix::unistd::chdir(&cwd.dir)?;
        }
        let spawned = if prepared.search_path {
            posix_spawnp(&prepared.program, &actions, &attr, &prepared.argv, &envp)
        } else {
            posix_spawn(
                prepared.program.as_c_str(),
                &actions,
                &attr,
                &prepared.argv,
                &envp,
            )
        };
        if let Some(cwd) = &prepared.cwd {
            if let Err(e) = nix::unistd::fchdir(cwd.ours.as_raw_fd()) {
                tracing::error!(error = %e, "cannot return to the working directory after a spawn");
            }
        }
        let pid = spawned
            .map_err(|e| io::Error::from_raw_os_error(e as i32))?
            .as_raw();
        (pid, table.register_pid(pid))
    };
    // The child has its copies of the write ends (and of stdin); ours must go, or EOF would
    // never come (and a handler that exits without reading would not be seen to).
    drop((stdin, stdout_w, stderr_w));
    let mut process = Process::registered(pid, exit);
    // On error `process` drops here and kills the fresh group.
    process.stdout = Some(receiver(stdout)?);
    process.stderr = Some(receiver(stderr)?);
    process.result = result.map(|(read, _write)| receiver(read)).transpose()?;
    Ok(process)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<OsString, OsString> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    /// What std passes: the inherited map with the variables inserted, in the map's order.
    fn std_envp(inherited: &BTreeMap<OsString, OsString>, vars: &[(&str, &str)]) -> Vec<String> {
        let mut m = inherited.clone();
        for (k, v) in vars {
            m.insert(k.into(), v.into());
        }
        m.iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
            .collect()
    }

    #[test]
    fn the_environment_is_the_one_std_passes() {
        let inherited = env(&[
            ("A", "1"),
            ("PATH", "/bin"),
            ("RUNR_PATH", "inherited"),
            ("RUNR_PATHS", "kept"),
            ("RUNR_TRIGGER", "inherited"),
            ("RUNR_TRIGGER_", "kept"),
            ("ZZ", "last"),
        ]);
        let p = Prepared::with_env("/bin/true", &["true".into()], &inherited).unwrap();
        for vars in [
            &[][..],
            &[
                ("RUNR_TRIGGER", "http"),
                ("RUNR_PATH", "/x"),
                ("RUNR_QUERY", ""),
            ][..],
            &[
                ("0", "first"),
                ("ZZZ", "after all"),
                ("A", "replaced"),
                ("ZZ", "z"),
            ][..],
        ] {
            let lines: Vec<CString> = vars
                .iter()
                .map(|(k, v)| line(OsStr::new(k), OsStr::new(v)).unwrap())
                .collect();
            let names: Vec<&[u8]> = vars.iter().map(|(k, _)| k.as_bytes()).collect();
            let got: Vec<String> = p
                .envp(&lines, &names)
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            assert_eq!(got, std_envp(&inherited, vars), "{vars:?}");
        }
    }

    #[test]
    fn a_nul_is_refused_as_std_refuses_it() {
        let e = line(OsStr::new("A"), OsStr::new("a\0b")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

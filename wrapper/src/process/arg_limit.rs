//! What `execve(2)` accepts, computed the way Linux checks it (`fs/exec.c`), so that exec mode
//! refuses a request whose headers cannot be passed to the handler as environment variables
//! (431) before it spawns anything, instead of the spawn failing with E2BIG (a 500 that would
//! blame the deployment for a client's request).
//!
//! Linux copies the program's path, then every environment string, then every argument onto
//! the new stack, each with its NUL, and refuses (E2BIG) when:
//! - one string is longer than `MAX_ARG_STRLEN` (32 pages, 128 KiB with 4 KiB pages), NUL
//!   included; or
//! - all of them together, plus one pointer per argument and per environment string, take more
//!   than a quarter of the stack limit (`RLIMIT_STACK`), capped at 6 MiB (3/4 of `_STK_LIM`),
//!   but never less than `ARG_MAX` (128 KiB) whatever the stack limit.
//!
//! The environment a handler gets is the wrapper's own (std passes it on, and
//! [`super::prepared`] builds the same once at start) with the per-invocation `RUNR_*`
//! variables set over it, so the sum counts both, and the argv.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};

use nix::sys::resource::{getrlimit, Resource};
use nix::unistd::{sysconf, SysconfVar};

/// The floor of the strings' room whatever the stack limit (Linux's `ARG_MAX`).
const ARG_MAX: u64 = 128 * 1024;
/// The cap of the strings' room whatever the stack limit: 3/4 of `_STK_LIM` (8 MiB).
const STRINGS_CAP: u64 = 6 * 1024 * 1024;
/// Kept free for an interpreter (`#!`) line: Linux then also copies the interpreter's path,
/// its optional argument and the script's path (each line at most 256 bytes), possibly for a
/// few levels of interpreters.
pub const INTERPRETER_RESERVE: usize = 4096;
/// Bytes of one pointer in the argv/envp arrays.
const POINTER: usize = std::mem::size_of::<usize>();

/// Why an environment cannot be passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooLarge {
    /// One variable is longer than one string may be.
    #[error("{name} is {len} bytes, more than the {max} one string may take")]
    Variable {
        /// The variable.
        name: String,
        /// Its length as an environment string (`NAME=value` and the NUL).
        len: usize,
        /// `MAX_ARG_STRLEN`.
        max: usize,
    },
    /// Everything together is more than the kernel takes.
    #[error("the arguments and environment take {total} bytes, more than the {max} allowed")]
    Total {
        /// Strings and pointers together.
        total: usize,
        /// The room for them.
        max: usize,
    },
}

/// The room execve gives a handler's arguments and environment, and what every spawn of the
/// handler takes of it already.
#[derive(Debug, Clone)]
pub struct ArgLimit {
    /// Longest string, NUL included.
    max_string: usize,
    /// Room for all strings and pointers (less [`INTERPRETER_RESERVE`]).
    room: usize,
    /// Taken by every spawn: the program path, the argv, the inherited environment.
    base: usize,
    /// The inherited variables a per-invocation one may replace (`RUNR_*`), with what each
    /// takes (string and pointer).
    replaceable: HashMap<OsString, usize>,
}

impl ArgLimit {
    /// The limits of this process (its stack limit, page size and environment, which every
    /// child inherits) for spawning `program` (the path handed to execve) with `argv`.
    pub fn of_this_process(program: &str, argv: &[String]) -> ArgLimit {
        let stack = getrlimit(Resource::RLIMIT_STACK).ok().map(|(soft, _)| soft);
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .unwrap_or(4096);
        let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        ArgLimit::new(stack, page, program, argv, &env, INTERPRETER_RESERVE)
    }

    /// The limits for a stack limit of `stack` bytes (`None`: unlimited), `page`-byte pages, a
    /// spawn of `program` with `argv` and the inherited environment `env`, keeping `reserve`
    /// bytes free.
    pub fn new(
        stack: Option<u64>,
        page: usize,
        program: &str,
        argv: &[String],
        env: &[(OsString, OsString)],
        reserve: usize,
    ) -> ArgLimit {
        let quarter = stack.map_or(u64::MAX, |s| s / 4);
        let room = quarter.clamp(ARG_MAX, STRINGS_CAP);
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        // An empty argv still costs one pointer (Linux adds an empty argv[0]).
        let mut base = program.len() + 1 + argv.len().max(1) * POINTER;
        base += argv.iter().map(|a| a.len() + 1).sum::<usize>();
        let mut replaceable = HashMap::new();
        for (name, value) in env {
            let size = entry(name, value) + POINTER;
            base += size;
            if name.as_encoded_bytes().starts_with(b"RUNR_") {
                replaceable.insert(name.clone(), size);
            }
        }
        ArgLimit {
            max_string: 32 * page,
            room: room.saturating_sub(reserve),
            base,
            replaceable,
        }
    }

    /// Whether a spawn with `vars` set over the inherited environment fits.
    pub fn check(&self, vars: &[(OsString, OsString)]) -> Result<(), TooLarge> {
        let mut total = self.base;
        for (name, value) in vars {
            let len = entry(name, value);
            if len > self.max_string {
                return Err(TooLarge::Variable {
                    name: name.to_string_lossy().into_owned(),
                    len,
                    max: self.max_string,
                });
            }
            total += len + POINTER;
            // Set over an inherited one of the same name: that one is not passed.
            total -= self.replaceable.get(name).copied().unwrap_or(0);
        }
        if total > self.room {
            return Err(TooLarge::Total {
                total,
                max: self.room,
            });
        }
        Ok(())
    }

    /// The room left for per-invocation variables (strings and pointers).
    pub fn room_left(&self) -> usize {
        self.room.saturating_sub(self.base)
    }
}

/// `NAME=value` and its NUL.
fn entry(name: &OsStr, value: &OsStr) -> usize {
    name.len() + 1 + value.len() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, usize)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, n)| (OsString::from(k), OsString::from("v".repeat(*n))))
            .collect()
    }

    #[test]
    fn the_room_follows_the_stack_limit_between_128_kib_and_6_mib() {
        let room = |stack| ArgLimit::new(stack, 4096, "", &[], &[], 0).room;
        assert_eq!(room(Some(8 << 20)), 2 << 20);
        assert_eq!(room(Some(100 << 10)), 128 << 10);
        assert_eq!(room(Some(64 << 20)), 6 << 20);
        assert_eq!(room(None), 6 << 20);
    }

    #[test]
    fn one_string_at_most_32_pages() {
        let l = ArgLimit::new(None, 4096, "/bin/true", &[], &[], 0);
        // "A=" + value + NUL.
        assert_eq!(l.check(&vars(&[("A", 131072 - 3)])), Ok(()));
        assert!(matches!(
            l.check(&vars(&[("A", 131072 - 2)])),
            Err(TooLarge::Variable { len: 131073, .. })
        ));
        let big_pages = ArgLimit::new(None, 65536, "/bin/true", &[], &[], 0);
        assert_eq!(big_pages.check(&vars(&[("A", 131072)])), Ok(()));
    }

    #[test]
    fn the_sum_counts_program_argv_inherited_env_and_pointers() {
        let inherited = vars(&[("PATH", 10), ("RUNR_TRIGGER", 4)]);
        let argv = ["true".to_string(), "x".to_string()];
        let l = ArgLimit::new(Some(512 << 10), 4096, "/bin/true", &argv, &inherited, 0);
        let base = 10 + (5 + 2) + 2 * 8 + (4 + 1 + 10 + 1 + 8) + (12 + 1 + 4 + 1 + 8);
        assert_eq!(l.base, base);
        assert_eq!(l.room_left(), (128 << 10) - base);
        // RUNR_TRIGGER set again replaces the inherited one: counted once.
        let again = vars(&[("RUNR_TRIGGER", 4)]);
        let room = l.room_left();
        let fill = |extra: usize| {
            let mut v = again.clone();
            // What is left after the replaced variable, as one more variable B.
            v.push(("B".into(), "v".repeat(room - 3 - 8 + extra).into()));
            v
        };
        assert_eq!(l.check(&fill(0)), Ok(()));
        assert!(matches!(l.check(&fill(1)), Err(TooLarge::Total { .. })));
    }
}

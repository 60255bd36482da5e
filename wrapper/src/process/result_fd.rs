//! The result channel (`RUNR_RESULT_FD=3`): a pipe that the handler finds as its fd 3.
//!
//! Why not `pre_exec(dup2)`: a `pre_exec` hook makes std fork instead of `posix_spawn` (slower
//! per exec-mode request) and needs `unsafe`. Instead the wrapper keeps its own fd 3 reserved
//! from start-up (close-on-exec, so no child sees it), and while spawning (under the reaper's
//! lock, which every spawn holds across fork/exec, so one spawn at a time) points fd 3 at the
//! new pipe's write end without close-on-exec, spawns, and points it back. Nothing else can be
//! given fd 3 in between: it is never free.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::unistd::{dup2, pipe2};

use crate::config::handler::RESULT_FD;

/// What fd 3 holds between spawns (a pipe's read end whose writer is closed), kept at a
/// number of its own.
struct Reserved {
    placeholder: OwnedFd,
    /// When fd 3 was free at start, the descriptor that took it: kept (never dropped, which
    /// would close fd 3), its number being the reserved slot.
    _slot: Option<OwnedFd>,
}

static RESERVED: OnceLock<Reserved> = OnceLock::new();

/// Reserves fd 3. Call once at start, before the runtime or anything else opens descriptors;
/// a descriptor 3 inherited from our parent is replaced (nobody in this process owns it).
pub fn reserve() -> io::Result<()> {
    if RESERVED.get().is_some() {
        return Ok(());
    }
    let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
    drop(write);
    let (placeholder, slot) = if read.as_raw_fd() == RESULT_FD {
        // The lowest free number was 3: copy it elsewhere (try_clone takes the lowest free
        // number from 3 up, so not 3).
        (read.try_clone()?, Some(read))
    } else {
        (read, None)
    };
    point_fd3_at(placeholder.as_raw_fd())?;
    let _ = RESERVED.set(Reserved {
        placeholder,
        _slot: slot,
    });
    Ok(())
}

/// fd 3 becomes a copy of `fd`, close-on-exec.
fn point_fd3_at(fd: RawFd) -> io::Result<()> {
    dup2(fd, RESULT_FD)?;
    fcntl(RESULT_FD, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// A new result pipe: `(read end for the wrapper, write end for the child)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(pipe2(OFlag::O_CLOEXEC)?)
}

/// Runs `spawn` with fd 3 pointing at `write` (inherited by the child), then back at the
/// placeholder. The caller holds the reaper's lock (every spawn does), so no other spawn sees
/// fd 3 in between.
pub fn with_fd3<T>(write: &OwnedFd, spawn: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let placeholder = &RESERVED
        .get()
        .ok_or_else(|| io::Error::other("fd 3 was not reserved at start"))?
        .placeholder;
    // Without close-on-exec, so the child keeps it.
    dup2(write.as_raw_fd(), RESULT_FD)?;
    let spawned = spawn();
    if let Err(e) = point_fd3_at(placeholder.as_raw_fd()) {
        tracing::error!(error = %e, "cannot restore fd 3 after a spawn");
    }
    spawned
}

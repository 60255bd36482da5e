//! `runr-wrapper install <dest>`: copies our own executable to `dest`, the way the init
//! container puts the wrapper into a function pod. No shell, no libc calls beyond the static
//! binary's own: it runs in a FROM scratch image.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why an install failed; every variant names the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// `/proc/self/exe` (or the fallback) could not be opened.
    #[error("cannot open our own executable {0}")]
    OpenSelf(PathBuf, #[source] io::Error),
    /// The destination directory could not be created.
    #[error("cannot create directory {0}")]
    CreateDir(PathBuf, #[source] io::Error),
    /// Writing the temporary copy failed.
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] io::Error),
    /// The final rename failed.
    #[error("cannot rename {0} to {1}")]
    Rename(PathBuf, PathBuf, #[source] io::Error),
}

/// Copies the running executable to `dest` atomically: a temporary file in the same
/// directory, mode 0755, synced, then renamed over `dest` (so a reader never sees half a
/// binary). Creates the parent directory.
pub fn install(dest: &Path) -> Result<(), InstallError> {
    // /proc/self/exe still works when our file was replaced or its path is unknown.
    let source = PathBuf::from("/proc/self/exe");
    let mut from = fs::File::open(&source)
        .or_else(|_| std::env::current_exe().and_then(fs::File::open))
        .map_err(|e| InstallError::OpenSelf(source.clone(), e))?;
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|e| InstallError::CreateDir(dir.clone(), e))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut write = || -> io::Result<()> {
        let mut to = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&tmp)?;
        io::copy(&mut from, &mut to)?;
        // The umask may have trimmed the mode given at creation.
        to.set_permissions(fs::Permissions::from_mode(0o755))?;
        to.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(InstallError::Write(tmp, e));
    }
    if let Err(e) = fs::rename(&tmp, dest) {
        let _ = fs::remove_file(&tmp);
        return Err(InstallError::Rename(tmp, dest.to_path_buf(), e));
    }
    Ok(())
}

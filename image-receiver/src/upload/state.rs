//! Where the upload is in its life: what `GET /status` (and every chunk and complete answer)
//! says, and what the state file keeps of it across restarts.
//!
//! The state file ([`STATE_FILE`]) is JSON with the declared size and digest, the byte ranges
//! held, and the phase (`open`, `verifying`, `pushing`, `completed`, `failed`) with its message
//! and image. It is replaced whole by rename, so a reader never sees half of one.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ranges::Ranges;

/// The ranges held and the upload's state, inside the upload directory.
pub const STATE_FILE: &str = "upload.state.json";
/// Written then renamed over [`STATE_FILE`].
const STATE_TMP: &str = "upload.state.json.tmp";

/// Where the upload is in its life, as the control plane reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for chunks; nothing held (also after a digest mismatch reopened the upload).
    Ready,
    /// Some chunks are held.
    Receiving,
    /// `complete` was accepted: size and SHA-256 are being checked.
    Verifying,
    /// Verified: the format is being detected and the image pushed.
    Pushing,
    /// Pushed and read back; `image` says what.
    Completed,
    /// The file could not be turned into an image; `message` says why. Final.
    Failed,
}

impl State {
    /// The name `GET /status` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Ready => "ready",
            State::Receiving => "receiving",
            State::Verifying => "verifying",
            State::Pushing => "pushing",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }

    /// True while chunks are accepted.
    pub fn is_open(self) -> bool {
        matches!(self, State::Ready | State::Receiving)
    }
}

/// The body of `GET /status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Where the upload is.
    pub status: State,
    /// The declared size in bytes.
    pub size: u64,
    /// Bytes from 0 without a gap: where a client goes on after a broken connection.
    pub uploaded_bytes: u64,
    /// Every distinct byte held.
    pub received_bytes: u64,
    /// What the user should know: progress of the work, a digest mismatch, why it failed.
    pub message: Option<String>,
    /// What was pushed, once `completed` (the pipeline's `ImageInfo`).
    pub image: Option<serde_json::Value>,
}

/// Where the upload is, as persisted (ready and receiving are both `open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Phase {
    Open,
    Verifying,
    Pushing,
    Completed,
    Failed,
}

/// The state file's content.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Persisted {
    pub(crate) size: u64,
    pub(crate) sha256: String,
    pub(crate) phase: Phase,
    pub(crate) ranges: Ranges,
    pub(crate) message: Option<String>,
    pub(crate) image: Option<serde_json::Value>,
}

/// The state file's content, when it belongs to this upload.
pub(crate) fn read_state(path: &Path, size: u64, sha256: &str) -> Option<Persisted> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the state file: starting over");
            return None;
        }
    };
    match serde_json::from_slice::<Persisted>(&bytes) {
        Ok(p) if p.size == size && p.sha256 == sha256 => Some(p),
        Ok(p) => {
            tracing::warn!(
                old_size = p.size,
                old_sha256 = %p.sha256,
                "the upload directory holds another upload: starting over"
            );
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the state file is damaged: starting over");
            None
        }
    }
}

/// Replaces the state file in `dir` with `state`.
pub(crate) fn write_state(dir: &Path, state: &Persisted) -> io::Result<()> {
    let json = serde_json::to_vec(state)?;
    let tmp = dir.join(STATE_TMP);
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, dir.join(STATE_FILE))
}

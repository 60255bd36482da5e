//! What `GET /status` (and every chunk and complete answer) says about the upload.

use serde::{Deserialize, Serialize};

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

    /// True once nothing will change any more.
    pub fn is_final(self) -> bool {
        matches!(self, State::Completed | State::Failed)
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

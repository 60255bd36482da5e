//! The job line: the jobs waiting for a child, shared by a supervisor's slots.

use std::marker::PhantomData;
use std::sync::Arc;

use tokio::sync::{mpsc, Mutex};

use super::erased::AnyJob;

/// The jobs waiting for a child, shared by every slot. Unbounded here because the modes'
/// admission control lets at most one job per child in (the line in front of it is bounded by
/// `RUNR_MAX_QUEUE`); a job a child gave back goes to its end.
pub struct JobLine<J> {
    pub(super) line: Arc<Line>,
    jobs: PhantomData<fn(J) -> J>,
}

impl<J: Send + 'static> Default for JobLine<J> {
    fn default() -> JobLine<J> {
        let (tx, rx) = mpsc::unbounded_channel();
        JobLine {
            line: Arc::new(Line {
                tx,
                rx: Mutex::new(rx),
            }),
            jobs: PhantomData,
        }
    }
}

impl<J: Send + 'static> JobLine<J> {
    /// Where requesters put their jobs.
    pub fn sender(&self) -> Sender<J> {
        Sender {
            tx: self.line.tx.clone(),
            jobs: PhantomData,
        }
    }

    /// Queues `job` at the end.
    pub fn push(&self, job: J) {
        self.line.push(Box::new(job));
    }

    /// The next job, as a slot takes it.
    #[cfg(test)]
    pub(super) async fn next(&self) -> J {
        let job = self.line.next().await;
        *job.downcast::<J>().expect("only J is pushed")
    }

    /// Hands every job waiting now to `each`, unless a child is waiting for one (then no job
    /// waits); returns how many.
    pub fn drain_now(&self, mut each: impl FnMut(J)) -> usize {
        let Ok(mut rx) = self.line.rx.try_lock() else {
            return 0;
        };
        let mut n = 0;
        while let Ok(job) = rx.try_recv() {
            n += 1;
            if let Ok(job) = job.downcast::<J>() {
                each(*job);
            }
        }
        n
    }
}

/// The line's sending end, as requesters hold it.
pub struct Sender<J> {
    tx: mpsc::UnboundedSender<AnyJob>,
    jobs: PhantomData<fn(J)>,
}

/// The job line is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl<J: Send + 'static> Sender<J> {
    /// Queues `job` at the end of the line (`Err` once it is gone: never while its supervisor
    /// or mode holds it).
    pub fn send(&self, job: J) -> Result<(), Closed> {
        self.tx.send(Box::new(job)).map_err(|_| Closed)
    }
}

/// A job line with its jobs' type erased (see [`super::erased`]).
pub(super) struct Line {
    tx: mpsc::UnboundedSender<AnyJob>,
    rx: Mutex<mpsc::UnboundedReceiver<AnyJob>>,
}

impl Line {
    pub(super) fn push(&self, job: AnyJob) {
        // The receiver lives as long as `self`.
        let _ = self.tx.send(job);
    }

    /// The next job, once there is one. One waiting child at a time holds the line.
    pub(super) async fn next(&self) -> AnyJob {
        match self.rx.lock().await.recv().await {
            Some(job) => job,
            // `self` holds a sender: never.
            None => std::future::pending().await,
        }
    }
}

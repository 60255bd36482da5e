//! The one lifecycle of the wrapper's long-lived children (persistent mode's workers, lambda
//! mode's runtimes): each of `slots` slots starts its child, waits until it is ready, hands it
//! jobs from one shared [`JobLine`], restarts it with [`Backoff`] when it ends, replaces it when
//! it is due (`RUNR_WORKER_MAX_REQUESTS`, `RUNR_WORKER_MAX_AGE`: the replacement is started
//! first, the old one wound down without failing a request), and stops it with a grace
//! (SIGTERM, SIGKILL [`STOP_GRACE`] later) when the supervisor stops.
//!
//! What a child is, how it says it is ready and how it takes a job is its mode's: the
//! [`Child`] trait. The mode keeps only that (persistent: JSON lines over pipes; lambda: the
//! Runtime API's state machine).
//!
//! The loop is written once for every kind of child: it drives them, and takes their jobs,
//! behind vtables ([`erased`]).

mod erased;
mod line;
#[cfg(test)]
pub(crate) mod tests;

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::reaper::Exit;
use crate::observe::metrics::{self, Held};
use erased::{Cx, Kind, KindOf, Object, Stopping};
use line::Line;
pub use line::{JobLine, Sender};

/// Restart delay after a child that served a job or ran long enough.
const RESTART_DELAY: Duration = Duration::from_millis(100);
/// A child that lived this long counts as healthy even if it served nothing.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// Cap of the doubling restart delay of a crash-looping child.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);
/// How long a stopping child gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// A recycled child's time after EOF on its input before SIGTERM, and after SIGTERM before
/// SIGKILL.
pub const RETIRE_GRACE: Duration = Duration::from_secs(5);

/// One long-lived child as its mode drives it. The futures of `ready`, `watch` and `wait` are
/// cancel-safe (the supervisor races them against its stop, its timers and the job line);
/// `serve` runs to its end.
pub trait Child: Sized + Send + 'static {
    /// What waits in the [`JobLine`] for a child.
    type Job: Send + 'static;
    /// What starting one takes (the command, the environment, the mode's shared state).
    type Spec: Send + Sync + 'static;
    /// What the logs call it ("worker", "runtime").
    const NAME: &'static str;

    /// The program and its arguments, for the logs.
    fn command(spec: &Self::Spec) -> &[String];

    /// Starts a child in `slot`.
    fn start(spec: &Arc<Self::Spec>, slot: usize) -> io::Result<Self>;

    /// Starting a child in `slot` failed with `error` (already logged).
    fn start_failed(spec: &Self::Spec, slot: usize, error: &io::Error) {
        let _ = (spec, slot, error);
    }

    /// Its process id.
    fn pid(&self) -> i32;

    /// Resolves once it says it is ready (asked only with [`Settings::ready_wait`]). `Err` with
    /// its exit status when it ended first.
    fn ready(&mut self) -> impl Future<Output = Result<(), Exit>> + Send {
        async { Ok(()) }
    }

    /// Whether it takes a job now.
    fn wants_job(&self) -> bool {
        true
    }

    /// What it does on its own while no job is handed to it: its output, its exit, its own
    /// timers. [`Watch::Ended`] once it is gone.
    fn watch(&mut self, cx: &mut Serving<'_, Self::Job>) -> impl Future<Output = Watch> + Send;

    /// Serves `job` (dropping it when its requester left).
    fn serve(
        &mut self,
        job: Self::Job,
        cx: &mut Serving<'_, Self::Job>,
    ) -> impl Future<Output = Served> + Send;

    /// Sends `signal` to its process group.
    fn signal(&mut self, signal: Signal);

    /// Resolves once it has exited (reading what it writes meanwhile).
    fn wait(&mut self) -> impl Future<Output = Exit> + Send;

    /// It takes no more jobs: close its input (EOF on its stdin).
    fn close(&mut self) {}

    /// It was stopped, and exited with `exit`.
    fn stopped(&mut self, exit: Exit) {
        let _ = exit;
    }
}

/// What came of [`Child::watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Nothing that ends it: look again.
    Continue,
    /// It is gone.
    Ended,
}

/// What came of [`Child::serve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// It served the job, and takes the next one.
    Answered,
    /// The job was dropped (its requester left); it takes the next one.
    Dropped,
    /// It is gone; `good` counts the run as healthy for the backoff even if it answered
    /// nothing (it was killed for a job's timeout).
    Ended { good: bool },
}

/// What a child gets while it watches or serves: the job line, and its place among the
/// ready children.
pub struct Serving<'a, J> {
    line: &'a JobLine<J>,
    alive: &'a mut Option<Alive>,
    served: u64,
}

impl<J> Serving<'_, J> {
    /// Puts `job` back in line (at the end: it keeps its deadline), for another child.
    pub fn requeue(&self, job: J)
    where
        J: Send + 'static,
    {
        self.line.push(job);
    }

    /// The child is going (it is being killed): it no longer counts as ready.
    pub fn leaving(&mut self) {
        *self.alive = None;
    }

    /// Jobs this child served so far.
    pub fn served(&self) -> u64 {
        self.served
    }
}

/// What the probes ask of a set of slots: has each slot's child been ready once, and how many
/// are ready now.
#[derive(Debug, Default)]
pub struct Readiness {
    started: Vec<AtomicBool>,
    alive: AtomicUsize,
}

impl Readiness {
    /// Nothing ready yet, in `slots` slots.
    pub fn new(slots: usize) -> Readiness {
        Readiness {
            started: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            alive: AtomicUsize::new(0),
        }
    }

    /// True once every slot's child has been ready, while one is.
    pub fn ready(&self) -> bool {
        self.started.iter().all(|s| s.load(Ordering::SeqCst)) && self.any()
    }

    /// True while at least one child is ready.
    pub fn any(&self) -> bool {
        self.alive.load(Ordering::SeqCst) > 0
    }

    /// `slot`'s child is ready.
    pub fn up(&self, slot: usize) {
        if let Some(started) = self.started.get(slot) {
            started.store(true, Ordering::SeqCst);
        }
        self.alive.fetch_add(1, Ordering::SeqCst);
    }

    /// A ready child is no longer.
    pub fn down(&self) {
        self.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A child counted as ready (in the probes' view and `runr_workers_alive`) until dropped.
pub struct Alive {
    readiness: Arc<Readiness>,
    _gauge: Held,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.readiness.down();
    }
}

/// How the supervisor runs its children.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// How many children run at once.
    pub slots: usize,
    /// With a ready handshake: how long a child gets to say it is ready (`RUNR_TICK_WAIT`).
    /// `None`: ready once started.
    pub ready_wait: Option<Duration>,
    /// Replaced after this many jobs (`RUNR_WORKER_MAX_REQUESTS`, jittered per child).
    pub max_requests: Option<u64>,
    /// Replaced at this age (`RUNR_WORKER_MAX_AGE`, jittered per child).
    pub max_age: Option<Duration>,
    /// Where the supervisor counts its children ready, from [`Child::ready`] until they end;
    /// `None` when the mode's own state counts them (lambda: the Runtime API's `/next`).
    pub readiness: Option<Arc<Readiness>>,
}

/// The running slots.
pub struct Supervisor {
    stop: watch::Sender<bool>,
    slots: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Supervisor {
    /// Starts `settings.slots` slots, each starting its child right away, taking jobs from
    /// `line`. Must run inside the tokio runtime.
    pub fn start<C: Child>(
        settings: Settings,
        spec: Arc<C::Spec>,
        line: Arc<JobLine<C::Job>>,
    ) -> Supervisor {
        let (stop, stop_rx) = watch::channel(false);
        let jobs = line.line.clone();
        let kind: Arc<dyn Kind> = Arc::new(KindOf::<C> { spec, line });
        let settings = Arc::new(settings);
        let slots = (0..settings.slots)
            .map(|slot| {
                let run = SlotRun {
                    slot,
                    name: C::NAME,
                    kind: kind.clone(),
                    line: jobs.clone(),
                    settings: settings.clone(),
                };
                tokio::spawn(run.run(stop_rx.clone()))
            })
            .collect();
        Supervisor {
            stop,
            slots: std::sync::Mutex::new(slots),
        }
    }

    /// Stops every child: SIGTERM to its group, SIGKILL after [`STOP_GRACE`]; a child busy
    /// with a job finishes it first. Returns once all are gone.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let slots = std::mem::take(&mut *self.slots.lock().unwrap_or_else(|e| e.into_inner()));
        for slot in slots {
            let _ = slot.await;
        }
    }
}

/// The restart policy: 100 ms after a child that served a job or ran for at least 10 s,
/// otherwise a delay that doubles per quick failure, up to 5 s: runr-base's backoff without its
/// jitter (one child has no crowd to spread out).
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    /// Quick failures in a row, counting a good run as the first.
    failures: u32,
}

impl Backoff {
    const POLICY: runr_base::backoff::Backoff =
        runr_base::backoff::Backoff::new(RESTART_DELAY, MAX_RESTART_DELAY);

    /// The delay before restarting a child that ended after `ran` and did (not) serve.
    pub fn delay(&mut self, served: bool, ran: Duration) -> Duration {
        self.failures = if served || ran >= HEALTHY_RUN {
            1
        } else {
            self.failures.saturating_add(1)
        };
        Self::POLICY.ceiling(self.failures)
    }
}

/// `value` scaled by a random factor in [0.9, 1.1], so that children started together are not
/// recycled together.
fn jitter(value: f64) -> f64 {
    let mut b = [0u8; 4];
    runr_base::fmt::random_bytes(&mut b);
    let unit = f64::from(u32::from_le_bytes(b)) / f64::from(u32::MAX);
    value * (0.9 + 0.2 * unit)
}

/// A started child and what the supervisor keeps about it.
struct Running {
    child: Box<dyn Object>,
    started: Instant,
    /// Jobs served.
    served: u64,
    /// Recycled after this many jobs.
    max_requests: Option<u64>,
    /// Recycled at this time.
    retire_at: Option<Instant>,
    /// With the ready wait: killed if it has not said it is ready by then.
    ready_by: Option<Instant>,
    /// Counted ready once it is.
    alive: Option<Alive>,
}

impl Running {
    /// Due for recycling: enough jobs served or old enough.
    fn due(&self) -> bool {
        self.max_requests.is_some_and(|n| self.served >= n)
            || self.retire_at.is_some_and(|at| Instant::now() >= at)
    }

    /// How its time in the slot ended, now.
    fn ended(&self, good: bool) -> End {
        End::Exited {
            served: good || self.served > 0,
            ran: self.started.elapsed(),
        }
    }
}

/// How a child's time in a slot ended.
enum End {
    /// The supervisor stops; the child was stopped.
    Stopped,
    /// It exited, or was killed.
    Exited { served: bool, ran: Duration },
    /// It was recycled; this is its replacement, started (and ready) already.
    Replaced(Box<Running>),
}

/// How starting a child went.
enum Start {
    /// It runs and is ready.
    Ready(Box<Running>),
    /// It could not be started, or ended before it was ready, after `ran`.
    Failed { ran: Duration },
    /// The supervisor stops.
    Stopped,
}

/// One slot.
struct SlotRun {
    slot: usize,
    /// [`Child::NAME`].
    name: &'static str,
    kind: Arc<dyn Kind>,
    line: Arc<Line>,
    settings: Arc<Settings>,
}

impl SlotRun {
    /// Starts the slot's child, serves it jobs, restarts it when it ends, replaces it when it
    /// is due, stops it when the supervisor stops.
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut backoff = Backoff::default();
        let mut next: Option<Box<Running>> = None;
        let mut first = true;
        loop {
            if *stop.borrow() {
                return;
            }
            let running = match next.take() {
                Some(r) => r,
                None => {
                    if !std::mem::take(&mut first) {
                        metrics::get().worker_restarted();
                    }
                    match self.start_ready(&mut stop).await {
                        Start::Ready(r) => r,
                        Start::Stopped => return,
                        Start::Failed { ran } => {
                            if !self
                                .restart_after(backoff.delay(false, ran), &mut stop)
                                .await
                            {
                                return;
                            }
                            continue;
                        }
                    }
                }
            };
            match self.serve(*running, &mut stop).await {
                End::Stopped => return,
                End::Replaced(new) => next = Some(new),
                End::Exited { served, ran } => {
                    if !self
                        .restart_after(backoff.delay(served, ran), &mut stop)
                        .await
                    {
                        return;
                    }
                }
            }
        }
    }

    fn said(&self) -> Said {
        Said {
            slot: self.slot,
            name: self.name,
        }
    }

    /// Waits out a restart delay; false when the supervisor stops meanwhile.
    async fn restart_after(&self, delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        if *stop.borrow() {
            return false;
        }
        self.said().restarting(delay);
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = stop.changed() => false,
        }
    }

    /// Starts a child, with its recycling limits and ready deadline.
    fn start(&self) -> io::Result<Running> {
        let child = self.kind.start(self.slot)?;
        let started = Instant::now();
        let s = &self.settings;
        Ok(Running {
            child,
            started,
            served: 0,
            max_requests: s
                .max_requests
                .map(|n| (jitter(n as f64).round() as u64).max(1)),
            retire_at: s.max_age.map(|age| started + age.mul_f64(jitter(1.0))),
            ready_by: s.ready_wait.map(|wait| started + wait),
            alive: None,
        })
    }

    /// Counts `r` ready, when the supervisor is the one that counts.
    fn count_ready(&self, r: &mut Running) {
        if let Some(readiness) = &self.settings.readiness {
            readiness.up(self.slot);
            r.alive = Some(Alive {
                readiness: readiness.clone(),
                _gauge: metrics::get().worker_alive(),
            });
        }
    }

    /// Starts a child and waits until it is ready.
    async fn start_ready(&self, stop: &mut watch::Receiver<bool>) -> Start {
        let started = Instant::now();
        let mut r = match self.start() {
            Ok(r) => r,
            Err(e) => {
                self.kind.start_failed(self.said(), &e);
                return Start::Failed {
                    ran: started.elapsed(),
                };
            }
        };
        if self.settings.ready_wait.is_none() {
            self.count_ready(&mut r);
            return Start::Ready(Box::new(r));
        }
        tokio::select! {
            ready = until_ready(&mut r, self.said()) => match ready {
                Ok(()) => {
                    self.count_ready(&mut r);
                    Start::Ready(Box::new(r))
                }
                Err(exit) => {
                    self.said().exited_before_ready(exit);
                    Start::Failed { ran: started.elapsed() }
                }
            },
            _ = stop.changed() => {
                wind_down(r, self.said(), Duration::ZERO, STOP_GRACE).await;
                Start::Stopped
            }
        }
    }

    /// Hands `old` to a background wind-down (EOF, SIGTERM after [`RETIRE_GRACE`], SIGKILL
    /// after as long again) and `new`, started already, to the slot.
    fn recycle(&self, mut old: Running, mut new: Running) -> End {
        self.said().recycling(
            old.child.stopping().process_id(),
            old.served,
            new.child.stopping().process_id(),
        );
        // The replacement counts before the old one stops counting: the slot stays ready.
        self.count_ready(&mut new);
        old.alive = None;
        tokio::spawn(wind_down(old, self.said(), RETIRE_GRACE, RETIRE_GRACE));
        End::Replaced(Box::new(new))
    }

    /// A replacement for a due child, or `None` when it could not be started (logged).
    fn start_replacement(&self) -> Option<Running> {
        match self.start() {
            Ok(new) => Some(new),
            Err(e) => {
                self.said().replacement_failed(&e);
                None
            }
        }
    }

    /// Feeds `r` jobs until it ends, is replaced, or the supervisor stops.
    async fn serve(&self, mut r: Running, stop: &mut watch::Receiver<bool>) -> End {
        // A recycling replacement being started while this child goes on serving.
        let mut replacement: Option<Running> = None;
        // After a replacement failed: not before this.
        let mut retry_at: Option<Instant> = None;
        loop {
            if r.due() && replacement.is_none() && retry_at.is_none_or(|t| Instant::now() >= t) {
                retry_at = None;
                match self.start_replacement() {
                    // Without the ready wait a child is ready once it runs: switch now.
                    Some(new) if self.settings.ready_wait.is_none() => return self.recycle(r, new),
                    // With it, this one serves on until the replacement says it is ready.
                    Some(new) => replacement = Some(new),
                    None => retry_at = Some(Instant::now() + RESTART_DELAY),
                }
            }
            // What to wake up for without a job: the age limit, or the next try.
            let wake = match (r.due(), &replacement) {
                (false, _) => r.retire_at,
                (true, None) => retry_at,
                (true, Some(_)) => None,
            };
            let wants_job = r.child.wants_job();
            let cx = Cx {
                alive: &mut r.alive,
                served: r.served,
            };
            let job = tokio::select! {
                // In this order: a child known to be gone must not be handed a job, and a
                // ready replacement takes over before the next one.
                biased;
                _ = stop.changed() => {
                    wind_down(r, self.said(), Duration::ZERO, STOP_GRACE).await;
                    return End::Stopped;
                }
                watched = r.child.watch(cx) => match watched {
                    Watch::Continue => continue,
                    Watch::Ended => return r.ended(false),
                },
                ready = replacement_ready(&mut replacement, self.said()) => {
                    let Some(new) = replacement.take() else { continue };
                    match ready {
                        Ok(()) => return self.recycle(r, new),
                        Err(exit) => {
                            self.said().replacement_exited(exit);
                            retry_at = Some(Instant::now() + RESTART_DELAY);
                        }
                    }
                    continue;
                }
                job = self.line.next(), if wants_job => job,
                () = sleep_until(wake) => continue,
            };
            let cx = Cx {
                alive: &mut r.alive,
                served: r.served,
            };
            match r.child.serve(job, cx).await {
                Served::Answered => r.served += 1,
                Served::Dropped => {}
                Served::Ended { good } => return r.ended(good),
            }
        }
    }
}

/// Waits for `r` to say it is ready, killing it when its ready deadline passes first. `Err`
/// with its exit status when it ends first. Cancel-safe.
async fn until_ready(r: &mut Running, said: Said) -> Result<(), Exit> {
    let Some(ready_by) = r.ready_by else {
        return Ok(());
    };
    let ready = tokio::select! {
        ready = r.child.ready() => ready,
        () = tokio::time::sleep_until(ready_by) => {
            said.not_ready_in_time(r.child.stopping().process_id(), ready_by - r.started);
            let child = r.child.stopping();
            child.send(Signal::SIGKILL);
            Err(child.exit().await)
        }
    };
    if ready.is_ok() {
        said.ready(r.child.stopping().process_id());
    }
    ready
}

/// [`until_ready`] of the replacement being started, if there is one (else never).
async fn replacement_ready(replacement: &mut Option<Running>, said: Said) -> Result<(), Exit> {
    match replacement {
        Some(r) => until_ready(r, said).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends `signal` to the child's group (SIGKILL is final), waits up to `grace` for it to end,
/// then kills the group; returns its exit status.
pub async fn terminate<C: Child>(
    child: &mut C,
    slot: usize,
    signal: Signal,
    grace: Duration,
) -> Exit {
    let said = Said {
        slot,
        name: C::NAME,
    };
    stop_within(child, said, signal, grace).await
}

/// [`terminate`], once for every kind of child.
async fn stop_within(
    child: &mut dyn Stopping,
    said: Said,
    signal: Signal,
    grace: Duration,
) -> Exit {
    child.send(signal);
    if signal != Signal::SIGKILL && tokio::time::timeout(grace, child.exit()).await.is_err() {
        said.ignored_sigterm(child.process_id());
        child.send(Signal::SIGKILL);
    }
    child.exit().await
}

/// Ends a child that takes no more jobs: EOF on its input; after `before_signal`, SIGTERM to
/// its group; after `grace` more, SIGKILL. Recycling uses 5 s + 5 s, the supervisor's stop
/// 0 + 5 s.
async fn wind_down(mut r: Running, said: Said, before_signal: Duration, grace: Duration) {
    r.alive = None;
    r.child.close();
    let exit = match tokio::time::timeout(before_signal, r.child.stopping().exit()).await {
        Ok(exit) => exit,
        Err(_elapsed) => stop_within(r.child.stopping(), said, Signal::SIGTERM, grace).await,
    };
    r.child.stopped(exit);
    said.stopped(r.child.stopping().process_id());
}

/// The supervisor's log lines about one slot's child, written once for every kind of child.
#[derive(Debug, Clone, Copy)]
struct Said {
    slot: usize,
    /// [`Child::NAME`].
    name: &'static str,
}

impl Said {
    fn restarting(self, delay: Duration) {
        let delay_ms = delay.as_millis() as u64;
        tracing::info!(slot = self.slot, delay_ms, "restarting {}", self.name);
    }

    fn failed_to_start(self, command: &[String], error: &io::Error) {
        tracing::error!(slot = self.slot, ?command, %error, "{} failed to start", self.name);
    }

    fn exited_before_ready(self, exit: Exit) {
        let status = exit.code();
        tracing::warn!(
            slot = self.slot,
            status,
            "{} exited before it was ready",
            self.name
        );
    }

    fn not_ready_in_time(self, pid: i32, wait: Duration) {
        tracing::warn!(
            slot = self.slot,
            pid,
            wait = %runr_base::env::display_duration(wait),
            "{} did not say it was ready in time (RUNR_TICK_WAIT); killing it",
            self.name
        );
    }

    fn ready(self, pid: i32) {
        tracing::info!(slot = self.slot, pid, "{} ready", self.name);
    }

    fn recycling(self, pid: i32, served: u64, replacement: i32) {
        let (slot, name) = (self.slot, self.name);
        tracing::info!(slot, pid, served, replacement, "recycling {name}");
    }

    fn replacement_failed(self, error: &io::Error) {
        let (slot, name) = (self.slot, self.name);
        tracing::warn!(slot, %error, "cannot start a {name}'s replacement; keeping it for now");
    }

    fn replacement_exited(self, exit: Exit) {
        let (slot, name, status) = (self.slot, self.name, exit.code());
        tracing::warn!(
            slot,
            status,
            "a {name}'s replacement exited before it was ready; keeping it for now"
        );
    }

    fn ignored_sigterm(self, pid: i32) {
        tracing::warn!(
            slot = self.slot,
            pid,
            "{} ignored SIGTERM; killing it",
            self.name
        );
    }

    fn stopped(self, pid: i32) {
        tracing::info!(slot = self.slot, pid, "{} stopped", self.name);
    }
}

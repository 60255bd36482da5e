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

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::reaper::Exit;
use crate::observe::metrics::{self, Held};

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
    pub fn requeue(&self, job: J) {
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

/// The jobs waiting for a child, shared by every slot. Unbounded here because the modes'
/// admission control lets at most one job per child in (the line in front of it is bounded by
/// `RUNR_MAX_QUEUE`); a job a child gave back goes to its end.
pub struct JobLine<J> {
    tx: mpsc::UnboundedSender<J>,
    rx: Mutex<mpsc::UnboundedReceiver<J>>,
}

impl<J> Default for JobLine<J> {
    fn default() -> JobLine<J> {
        let (tx, rx) = mpsc::unbounded_channel();
        JobLine {
            tx,
            rx: Mutex::new(rx),
        }
    }
}

impl<J> JobLine<J> {
    /// Where requesters put their jobs (never closed while the line lives).
    pub fn sender(&self) -> mpsc::UnboundedSender<J> {
        self.tx.clone()
    }

    /// Queues `job` at the end.
    pub fn push(&self, job: J) {
        // The receiver lives as long as `self`.
        let _ = self.tx.send(job);
    }

    /// The next job, once there is one. One waiting child at a time holds the line.
    pub async fn next(&self) -> J {
        match self.rx.lock().await.recv().await {
            Some(job) => job,
            // `self` holds a sender: never.
            None => std::future::pending().await,
        }
    }

    /// Hands every job waiting now to `each`, unless a child is waiting for one (then no job
    /// waits); returns how many.
    pub fn drain_now(&self, mut each: impl FnMut(J)) -> usize {
        let Ok(mut rx) = self.rx.try_lock() else {
            return 0;
        };
        let mut n = 0;
        while let Ok(job) = rx.try_recv() {
            n += 1;
            each(job);
        }
        n
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
        let settings = Arc::new(settings);
        let slots = (0..settings.slots)
            .map(|slot| {
                let run = SlotRun::<C> {
                    slot,
                    spec: spec.clone(),
                    line: line.clone(),
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
struct Running<C> {
    child: C,
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

impl<C: Child> Running<C> {
    /// Due for recycling: enough jobs served or old enough.
    fn due(&self) -> bool {
        self.max_requests.is_some_and(|n| self.served >= n)
            || self.retire_at.is_some_and(|at| Instant::now() >= at)
    }

    /// How its time in the slot ended, now.
    fn ended(&self, good: bool) -> End<C> {
        End::Exited {
            served: good || self.served > 0,
            ran: self.started.elapsed(),
        }
    }
}

/// How a child's time in a slot ended.
enum End<C> {
    /// The supervisor stops; the child was stopped.
    Stopped,
    /// It exited, or was killed.
    Exited { served: bool, ran: Duration },
    /// It was recycled; this is its replacement, started (and ready) already.
    Replaced(Box<Running<C>>),
}

/// How starting a child went.
enum Start<C> {
    /// It runs and is ready.
    Ready(Box<Running<C>>),
    /// It could not be started, or ended before it was ready, after `ran`.
    Failed { ran: Duration },
    /// The supervisor stops.
    Stopped,
}

/// One slot.
struct SlotRun<C: Child> {
    slot: usize,
    spec: Arc<C::Spec>,
    line: Arc<JobLine<C::Job>>,
    settings: Arc<Settings>,
}

impl<C: Child> SlotRun<C> {
    /// Starts the slot's child, serves it jobs, restarts it when it ends, replaces it when it
    /// is due, stops it when the supervisor stops.
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut backoff = Backoff::default();
        let mut next: Option<Box<Running<C>>> = None;
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

    /// Waits out a restart delay; false when the supervisor stops meanwhile.
    async fn restart_after(&self, delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        if *stop.borrow() {
            return false;
        }
        tracing::info!(
            slot = self.slot,
            delay_ms = delay.as_millis() as u64,
            "restarting {}",
            C::NAME
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = stop.changed() => false,
        }
    }

    /// Starts a child, with its recycling limits and ready deadline.
    fn start(&self) -> io::Result<Running<C>> {
        let child = C::start(&self.spec, self.slot)?;
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
    fn count_ready(&self, r: &mut Running<C>) {
        if let Some(readiness) = &self.settings.readiness {
            readiness.up(self.slot);
            r.alive = Some(Alive {
                readiness: readiness.clone(),
                _gauge: metrics::get().worker_alive(),
            });
        }
    }

    /// Starts a child and waits until it is ready.
    async fn start_ready(&self, stop: &mut watch::Receiver<bool>) -> Start<C> {
        let started = Instant::now();
        let mut r = match self.start() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(slot = self.slot, command = ?C::command(&self.spec), error = %e, "{} failed to start", C::NAME);
                C::start_failed(&self.spec, self.slot, &e);
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
            ready = until_ready(&mut r, self.slot) => match ready {
                Ok(()) => {
                    self.count_ready(&mut r);
                    Start::Ready(Box::new(r))
                }
                Err(exit) => {
                    tracing::warn!(slot = self.slot, status = exit.code(), "{} exited before it was ready", C::NAME);
                    Start::Failed { ran: started.elapsed() }
                }
            },
            _ = stop.changed() => {
                wind_down(r, self.slot, Duration::ZERO, STOP_GRACE).await;
                Start::Stopped
            }
        }
    }

    /// Hands `old` to a background wind-down (EOF, SIGTERM after [`RETIRE_GRACE`], SIGKILL
    /// after as long again) and `new`, started already, to the slot.
    fn recycle(&self, mut old: Running<C>, mut new: Running<C>) -> End<C> {
        tracing::info!(
            slot = self.slot,
            pid = old.child.pid(),
            served = old.served,
            replacement = new.child.pid(),
            "recycling {}",
            C::NAME
        );
        // The replacement counts before the old one stops counting: the slot stays ready.
        self.count_ready(&mut new);
        old.alive = None;
        tokio::spawn(wind_down(old, self.slot, RETIRE_GRACE, RETIRE_GRACE));
        End::Replaced(Box::new(new))
    }

    /// A replacement for a due child, or `None` when it could not be started (logged).
    fn start_replacement(&self) -> Option<Running<C>> {
        match self.start() {
            Ok(new) => Some(new),
            Err(e) => {
                tracing::warn!(slot = self.slot, error = %e, "cannot start a {}'s replacement; keeping it for now", C::NAME);
                None
            }
        }
    }

    /// Feeds `r` jobs until it ends, is replaced, or the supervisor stops.
    async fn serve(&self, mut r: Running<C>, stop: &mut watch::Receiver<bool>) -> End<C> {
        // A recycling replacement being started while this child goes on serving.
        let mut replacement: Option<Running<C>> = None;
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
            let mut cx = Serving {
                line: &self.line,
                alive: &mut r.alive,
                served: r.served,
            };
            let job = tokio::select! {
                // In this order: a child known to be gone must not be handed a job, and a
                // ready replacement takes over before the next one.
                biased;
                _ = stop.changed() => {
                    wind_down(r, self.slot, Duration::ZERO, STOP_GRACE).await;
                    return End::Stopped;
                }
                watched = r.child.watch(&mut cx) => match watched {
                    Watch::Continue => continue,
                    Watch::Ended => return r.ended(false),
                },
                ready = replacement_ready(&mut replacement, self.slot) => {
                    let Some(new) = replacement.take() else { continue };
                    match ready {
                        Ok(()) => return self.recycle(r, new),
                        Err(exit) => {
                            tracing::warn!(slot = self.slot, status = exit.code(), "a {}'s replacement exited before it was ready; keeping it for now", C::NAME);
                            retry_at = Some(Instant::now() + RESTART_DELAY);
                        }
                    }
                    continue;
                }
                job = self.line.next(), if wants_job => job,
                () = sleep_until(wake) => continue,
            };
            let mut cx = Serving {
                line: &self.line,
                alive: &mut r.alive,
                served: r.served,
            };
            match r.child.serve(job, &mut cx).await {
                Served::Answered => r.served += 1,
                Served::Dropped => {}
                Served::Ended { good } => return r.ended(good),
            }
        }
    }
}

/// Waits for `r` to say it is ready, killing it when its ready deadline passes first. `Err`
/// with its exit status when it ends first. Cancel-safe.
async fn until_ready<C: Child>(r: &mut Running<C>, slot: usize) -> Result<(), Exit> {
    let Some(ready_by) = r.ready_by else {
        return Ok(());
    };
    let ready = tokio::select! {
        ready = r.child.ready() => ready,
        () = tokio::time::sleep_until(ready_by) => {
            tracing::warn!(
                slot,
                pid = r.child.pid(),
                wait = %runr_base::env::display_duration(ready_by - r.started),
                "{} did not say it was ready in time (RUNR_TICK_WAIT); killing it",
                C::NAME
            );
            r.child.signal(Signal::SIGKILL);
            Err(r.child.wait().await)
        }
    };
    if ready.is_ok() {
        tracing::info!(slot, pid = r.child.pid(), "{} ready", C::NAME);
    }
    ready
}

/// [`until_ready`] of the replacement being started, if there is one (else never).
async fn replacement_ready<C: Child>(
    replacement: &mut Option<Running<C>>,
    slot: usize,
) -> Result<(), Exit> {
    match replacement {
        Some(r) => until_ready(r, slot).await,
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
    child.signal(signal);
    if signal != Signal::SIGKILL && tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!(
            slot,
            pid = child.pid(),
            "{} ignored SIGTERM; killing it",
            C::NAME
        );
        child.signal(Signal::SIGKILL);
    }
    child.wait().await
}

/// Ends a child that takes no more jobs: EOF on its input; after `before_signal`, SIGTERM to
/// its group; after `grace` more, SIGKILL. Recycling uses 5 s + 5 s, the supervisor's stop
/// 0 + 5 s.
async fn wind_down<C: Child>(
    mut r: Running<C>,
    slot: usize,
    before_signal: Duration,
    grace: Duration,
) {
    r.alive = None;
    r.child.close();
    let exit = match tokio::time::timeout(before_signal, r.child.wait()).await {
        Ok(exit) => exit,
        Err(_elapsed) => terminate(&mut r.child, slot, Signal::SIGTERM, grace).await,
    };
    r.child.stopped(exit);
    tracing::info!(slot, pid = r.child.pid(), "{} stopped", C::NAME);
}

#[cfg(test)]
pub(crate) mod tests {
    use tokio::io::BufReader;
    use tokio::net::unix::pipe;
    use tokio::sync::oneshot;

    use super::*;
    use crate::process::{self, Line, Process};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What happened to a child (numbered in the order they were started).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Event {
        Started(usize),
        Ready(usize),
        Served(usize, u32),
        Signalled(usize, Signal),
        Closed(usize),
        Stopped(usize, Exit),
    }

    /// The events of every child of one test, at the (paused) time they happened.
    struct Record {
        t0: Instant,
        events: watch::Sender<Vec<(u64, Event)>>,
    }

    impl Record {
        fn new() -> Record {
            Record {
                t0: Instant::now(),
                events: watch::channel(Vec::new()).0,
            }
        }

        fn add(&self, e: Event) {
            let at = (Instant::now() - self.t0).as_millis() as u64;
            self.events.send_modify(|events| events.push((at, e)));
        }

        /// A new child's number.
        fn start(&self) -> usize {
            let id = self.starts().len();
            self.add(Event::Started(id));
            id
        }

        fn events(&self) -> Vec<(u64, Event)> {
            self.events.borrow().clone()
        }

        /// When `e` happened.
        fn at(&self, e: Event) -> u64 {
            let events = self.events();
            let found = events.iter().find(|(_, x)| *x == e);
            found.unwrap_or_else(|| panic!("no {e:?} in {events:?}")).0
        }

        /// The times children were started at.
        fn starts(&self) -> Vec<u64> {
            let events = self.events.borrow();
            let started = events
                .iter()
                .filter(|(_, e)| matches!(e, Event::Started(_)));
            started.map(|(at, _)| *at).collect()
        }

        /// Until `e` has happened.
        async fn until(&self, e: Event) {
            let mut events = self.events.subscribe();
            let _ = events
                .wait_for(|events| events.iter().any(|(_, x)| *x == e))
                .await;
        }

        /// Until `n` children have been started.
        async fn until_started(&self, n: usize) {
            self.until(Event::Started(n - 1)).await;
        }
    }

    /// What a fake child does by itself.
    #[derive(Debug, Clone, Copy)]
    struct Behaviour {
        /// Exits (status 1) this long after it started.
        exits_after: Option<Duration>,
        /// Says it is ready this long after it started (`None`: never).
        ready_after: Option<Duration>,
        takes_jobs: bool,
        ignores_sigterm: bool,
        exits_on_eof: bool,
        on_job: OnJob,
    }

    /// What a fake child does with a job.
    #[derive(Debug, Clone, Copy)]
    enum OnJob {
        Answer,
        /// It exits before it reads the job, which goes to another child.
        GiveBack,
        /// It is killed for the job's timeout (a good run for the backoff).
        TimesOut,
    }

    const PLAIN: Behaviour = Behaviour {
        exits_after: None,
        ready_after: Some(Duration::ZERO),
        takes_jobs: true,
        ignores_sigterm: false,
        exits_on_eof: false,
        on_job: OnJob::Answer,
    };

    /// The fake children's spec: the n-th started behaves as `behaviours[n]` (the last one
    /// repeats).
    struct Script {
        behaviours: Vec<Behaviour>,
        record: Record,
    }

    type Job = (u32, oneshot::Sender<usize>);

    /// A child without a process, for the supervisor's timing: it exits, says it is ready and
    /// answers signals as its [`Behaviour`] says, at exact (paused) times.
    struct Fake {
        id: usize,
        b: Behaviour,
        started: Instant,
        exit: Option<(Instant, Exit)>,
        script: Arc<Script>,
    }

    impl Fake {
        /// It exits now, unless it did already.
        fn end(&mut self, exit: Exit) {
            if self.exit.is_none_or(|(at, _)| at > Instant::now()) {
                self.exit = Some((Instant::now(), exit));
            }
        }
    }

    impl Child for Fake {
        type Job = Job;
        type Spec = Script;
        const NAME: &'static str = "fake";

        fn command(_: &Script) -> &[String] {
            &[]
        }

        fn start(spec: &Arc<Script>, _slot: usize) -> io::Result<Fake> {
            let id = spec.record.start();
            let b = spec.behaviours[id.min(spec.behaviours.len() - 1)];
            let started = Instant::now();
            Ok(Fake {
                id,
                b,
                started,
                exit: b.exits_after.map(|d| (started + d, Exit::Code(1))),
                script: spec.clone(),
            })
        }

        fn pid(&self) -> i32 {
            1_000_000 + self.id as i32
        }

        async fn ready(&mut self) -> Result<(), Exit> {
            let at = self.b.ready_after.map(|d| self.started + d);
            tokio::select! {
                biased;
                exit = self.wait() => Err(exit),
                () = sleep_until(at) => {
                    self.script.record.add(Event::Ready(self.id));
                    Ok(())
                }
            }
        }

        fn wants_job(&self) -> bool {
            self.b.takes_jobs
        }

        async fn watch(&mut self, _: &mut Serving<'_, Job>) -> Watch {
            self.wait().await;
            Watch::Ended
        }

        async fn serve(&mut self, (n, reply): Job, cx: &mut Serving<'_, Job>) -> Served {
            match self.b.on_job {
                OnJob::Answer => {
                    self.script.record.add(Event::Served(self.id, n));
                    let _ = reply.send(self.id);
                    return Served::Answered;
                }
                OnJob::GiveBack => cx.requeue((n, reply)),
                // Its requester answers the timeout itself.
                OnJob::TimesOut => drop(reply),
            }
            cx.leaving();
            self.end(Exit::Signal(9));
            Served::Ended {
                good: matches!(self.b.on_job, OnJob::TimesOut),
            }
        }

        fn signal(&mut self, signal: Signal) {
            self.script.record.add(Event::Signalled(self.id, signal));
            match signal {
                Signal::SIGKILL => self.end(Exit::Signal(9)),
                Signal::SIGTERM if !self.b.ignores_sigterm => self.end(Exit::Signal(15)),
                _ => {}
            }
        }

        async fn wait(&mut self) -> Exit {
            match self.exit {
                Some((at, exit)) => {
                    tokio::time::sleep_until(at).await;
                    exit
                }
                None => std::future::pending().await,
            }
        }

        fn close(&mut self) {
            self.script.record.add(Event::Closed(self.id));
            if self.b.exits_on_eof {
                self.end(Exit::Code(0));
            }
        }

        fn stopped(&mut self, exit: Exit) {
            self.script.record.add(Event::Stopped(self.id, exit));
        }
    }

    fn fakes(behaviours: Vec<Behaviour>) -> Arc<Script> {
        Arc::new(Script {
            behaviours,
            record: Record::new(),
        })
    }

    fn one_slot() -> Settings {
        Settings {
            slots: 1,
            readiness: Some(Arc::new(Readiness::new(1))),
            ..Settings::default()
        }
    }

    /// A job and where its answer (the number of the child that served it) comes.
    fn job(line: &JobLine<Job>, n: u32) -> oneshot::Receiver<usize> {
        let (tx, rx) = oneshot::channel();
        line.push((n, tx));
        rx
    }

    #[test]
    fn backoff_doubles_for_quick_failures_up_to_5s() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(10);
        let delays: Vec<u64> = (0..9)
            .map(|_| b.delay(false, quick).as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn backoff_resets_after_serving_or_a_long_run() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(10);
        b.delay(false, quick);
        b.delay(false, quick);
        assert_eq!(b.delay(true, quick), RESTART_DELAY);
        assert_eq!(b.delay(false, quick), Duration::from_millis(200));
        assert_eq!(b.delay(false, HEALTHY_RUN), RESTART_DELAY);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let all: Vec<f64> = (0..2000).map(|_| jitter(1000.0)).collect();
        assert!(all.iter().all(|v| (900.0..=1100.0).contains(v)), "{all:?}");
        // Spread over the range, not one value.
        assert!(all.iter().any(|v| *v < 950.0) && all.iter().any(|v| *v > 1050.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_looping_child_is_restarted_with_a_doubling_delay_reset_by_a_good_run() {
        let quick = Behaviour {
            exits_after: Some(ms(10)),
            takes_jobs: false,
            ..PLAIN
        };
        let serving = Behaviour {
            takes_jobs: true,
            ..quick
        };
        let healthy = Behaviour {
            exits_after: Some(HEALTHY_RUN),
            ..quick
        };
        let script = fakes(vec![quick, quick, quick, serving, quick, healthy, quick]);
        let line = Arc::new(JobLine::default());
        // Waits for the one child that takes jobs.
        let answer = job(&line, 1);
        let sup = Supervisor::start::<Fake>(one_slot(), script.clone(), line);
        script.record.until_started(7).await;
        sup.stop().await;
        assert_eq!(answer.await, Ok(3));
        // Each start: the last one's exit (10 ms after its start, 10 s for the healthy one)
        // plus the delay: 100, 200, 400 ms; 100 after serving; 200; 100 after a long run.
        assert_eq!(
            script.record.starts(),
            [0, 110, 320, 730, 840, 1050, 11150],
            "{:?}",
            script.record.events()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_that_ends_serving_gives_its_job_back_or_counts_as_a_good_run() {
        let gives_back = Behaviour {
            on_job: OnJob::GiveBack,
            ..PLAIN
        };
        let times_out = Behaviour {
            on_job: OnJob::TimesOut,
            ..PLAIN
        };
        let script = fakes(vec![gives_back, gives_back, times_out, PLAIN]);
        let line = Arc::new(JobLine::default());
        let settings = one_slot();
        let readiness = settings.readiness.clone().unwrap();
        let (first, second) = (job(&line, 1), job(&line, 2));
        let sup = Supervisor::start::<Fake>(settings, script.clone(), line);
        script.record.until_started(4).await;
        assert!(readiness.ready());
        sup.stop().await;
        // Job 1 went back behind job 2, job 2 behind job 1; then job 1 timed out.
        assert!(first.await.is_err());
        assert_eq!(second.await, Ok(3));
        // 100 and 200 ms after quick failures; 100 after the timeout.
        assert_eq!(script.record.starts(), [0, 100, 300, 400]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_child_is_replaced_by_one_started_first_and_wound_down_without_failing_a_job() {
        let slow_to_start = Behaviour {
            ready_after: Some(ms(1000)),
            ..PLAIN
        };
        let script = fakes(vec![slow_to_start]);
        let line = Arc::new(JobLine::default());
        let settings = Settings {
            ready_wait: Some(ms(5000)),
            max_requests: Some(2),
            ..one_slot()
        };
        let readiness = settings.readiness.clone().unwrap();
        let answers: Vec<_> = (1..=3).map(|n| job(&line, n)).collect();
        let sup = Supervisor::start::<Fake>(settings, script.clone(), line.clone());
        tokio::time::sleep(ms(1500)).await;
        assert!(readiness.ready());
        // Queued during the wind-down: the replacement serves it.
        tokio::time::sleep(ms(1500)).await;
        let late = job(&line, 4);
        tokio::time::sleep(ms(5000)).await;
        assert!(readiness.ready(), "the slot never stopped being ready");
        sup.stop().await;
        for (answer, by) in answers.into_iter().zip([0, 0, 0]) {
            assert_eq!(answer.await, Ok(by));
        }
        assert_eq!(late.await, Ok(1));
        use Event::*;
        let events: Vec<_> = script.record.events().into_iter().take(11).collect();
        assert_eq!(
            events,
            [
                (0, Started(0)),
                (1000, Ready(0)),
                (1000, Served(0, 1)),
                (1000, Served(0, 2)),
                // Due: its replacement is started, and it serves on until that is ready.
                (1000, Started(1)),
                (1000, Served(0, 3)),
                (2000, Ready(1)),
                (2000, Closed(0)),
                (3000, Served(1, 4)),
                // EOF is not enough for it: SIGTERM 5 s later.
                (7000, Signalled(0, Signal::SIGTERM)),
                (7000, Stopped(0, Exit::Signal(15))),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_ready_wait_the_replacement_takes_over_at_once() {
        let script = fakes(vec![Behaviour {
            exits_on_eof: true,
            ..PLAIN
        }]);
        let line = Arc::new(JobLine::default());
        let settings = Settings {
            max_requests: Some(1),
            ..one_slot()
        };
        let answers: Vec<_> = (1..=3).map(|n| job(&line, n)).collect();
        let sup = Supervisor::start::<Fake>(settings, script.clone(), line);
        script.record.until_started(4).await;
        sup.stop().await;
        for (answer, by) in answers.into_iter().zip([0, 1, 2]) {
            assert_eq!(answer.await, Ok(by));
        }
        let r = &script.record;
        for old in 0..3 {
            assert_eq!(r.at(Event::Started(old + 1)), 0);
            assert_eq!(r.at(Event::Stopped(old, Exit::Code(0))), 0, "ended by EOF");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_child_is_replaced_at_its_jittered_age() {
        let script = fakes(vec![PLAIN]);
        let line = Arc::new(JobLine::default());
        let settings = Settings {
            max_age: Some(Duration::from_secs(60)),
            ..one_slot()
        };
        let sup = Supervisor::start::<Fake>(settings, script.clone(), line);
        script.record.until_started(2).await;
        sup.stop().await;
        let replaced = script.record.at(Event::Started(1));
        assert!((54_000..=66_000).contains(&replaced), "{replaced}");
        assert_eq!(script.record.at(Event::Closed(0)), replaced);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_that_is_not_ready_in_time_is_killed_and_restarted() {
        let never = Behaviour {
            ready_after: None,
            ..PLAIN
        };
        let in_time = Behaviour {
            ready_after: Some(ms(1000)),
            ..PLAIN
        };
        let script = fakes(vec![never, in_time]);
        let settings = Settings {
            ready_wait: Some(ms(2000)),
            ..one_slot()
        };
        let readiness = settings.readiness.clone().unwrap();
        let sup = Supervisor::start::<Fake>(settings, script.clone(), Arc::default());
        tokio::time::sleep(ms(2050)).await;
        assert!(!readiness.ready() && !readiness.any());
        tokio::time::sleep(ms(1100)).await;
        assert!(readiness.ready());
        sup.stop().await;
        use Event::*;
        let events: Vec<_> = script.record.events().into_iter().take(4).collect();
        assert_eq!(
            events,
            [
                (0, Started(0)),
                (2000, Signalled(0, Signal::SIGKILL)),
                (2100, Started(1)),
                (3100, Ready(1)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_sends_sigterm_and_sigkill_after_the_grace() {
        let stubborn = Behaviour {
            ignores_sigterm: true,
            ..PLAIN
        };
        let script = fakes(vec![PLAIN, stubborn]);
        let settings = Settings {
            slots: 2,
            readiness: Some(Arc::new(Readiness::new(2))),
            ..Settings::default()
        };
        let readiness = settings.readiness.clone().unwrap();
        let sup = Supervisor::start::<Fake>(settings, script.clone(), Arc::default());
        tokio::time::sleep(ms(1000)).await;
        assert!(readiness.ready());
        sup.stop().await;
        assert_eq!(Instant::now() - script.record.t0, ms(6000));
        assert!(!readiness.any());
        use Event::*;
        let mut stops: Vec<_> = script.record.events().into_iter().skip(2).collect();
        stops.sort_by_key(|(at, e)| {
            (
                *at,
                matches!(e, Closed(1) | Signalled(1, _) | Stopped(1, _)),
            )
        });
        assert_eq!(
            stops,
            [
                (1000, Closed(0)),
                (1000, Signalled(0, Signal::SIGTERM)),
                (1000, Stopped(0, Exit::Signal(15))),
                (1000, Closed(1)),
                (1000, Signalled(1, Signal::SIGTERM)),
                (6000, Signalled(1, Signal::SIGKILL)),
                (6000, Stopped(1, Exit::Signal(9))),
            ]
        );
    }

    #[tokio::test]
    async fn the_job_line_hands_jobs_out_in_order_and_takes_them_back_at_the_end() {
        let line = JobLine::default();
        let _ = line.sender().send(1);
        line.push(2);
        assert_eq!(line.next().await, 1);
        // Given back: behind the one that waited meanwhile.
        line.push(1);
        assert_eq!(line.next().await, 2);
        assert_eq!(line.next().await, 1);

        line.push(3);
        line.push(4);
        let mut drained = Vec::new();
        assert_eq!(line.drain_now(|j| drained.push(j)), 2);
        assert_eq!(drained, [3, 4]);
        // A child waiting for a job holds the line: nothing waits, nothing is drained.
        let waiting = line.next();
        tokio::pin!(waiting);
        tokio::select! {
            biased;
            _ = &mut waiting => unreachable!("no job yet"),
            () = std::future::ready(()) => {}
        }
        line.push(5);
        assert_eq!(line.drain_now(|_| unreachable!()), 0);
        assert_eq!(waiting.await, 5);
    }

    /// A real `sh -c` child: it says it is ready by printing `ready` (with the ready wait, or
    /// else noted while it is watched); a job is answered without it (the process boundary is
    /// what these tests are about).
    struct Sh {
        id: usize,
        proc: Process,
        stdin: Option<pipe::Sender>,
        stdout: BufReader<pipe::Receiver>,
        line: Vec<u8>,
        record: Arc<ShScript>,
    }

    /// The n-th `sh` child runs `scripts[n]` (the last one repeats).
    struct ShScript {
        scripts: Vec<&'static str>,
        record: Record,
    }

    impl Child for Sh {
        type Job = Job;
        type Spec = ShScript;
        const NAME: &'static str = "sh";

        fn command(_: &ShScript) -> &[String] {
            &[]
        }

        fn start(spec: &Arc<ShScript>, _slot: usize) -> io::Result<Sh> {
            let n = spec.record.starts().len();
            let script = spec.scripts[n.min(spec.scripts.len() - 1)];
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", script])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped());
            let mut proc = process::spawn(&mut cmd)?;
            let stdout = BufReader::new(proc.stdout.take().unwrap());
            Ok(Sh {
                id: spec.record.start(),
                stdin: proc.stdin.take(),
                proc,
                stdout,
                line: Vec::new(),
                record: spec.clone(),
            })
        }

        fn pid(&self) -> i32 {
            self.proc.id()
        }

        async fn ready(&mut self) -> Result<(), Exit> {
            loop {
                tokio::select! {
                    read = process::read_line_capped(&mut self.stdout, &mut self.line, 64) => {
                        if let Ok(Line::Complete) = read {
                            if std::mem::take(&mut self.line) == b"ready\n" {
                                self.record.record.add(Event::Ready(self.id));
                                return Ok(());
                            }
                        } else {
                            return Err(self.proc.wait().await);
                        }
                    }
                    exit = self.proc.wait() => return Err(exit),
                }
            }
        }

        async fn watch(&mut self, _: &mut Serving<'_, Job>) -> Watch {
            tokio::select! {
                biased;
                _ = self.proc.wait() => Watch::Ended,
                read = process::read_line_capped(&mut self.stdout, &mut self.line, 64) => {
                    if let Ok(Line::Complete) = read {
                        if std::mem::take(&mut self.line) == b"ready\n" {
                            self.record.record.add(Event::Ready(self.id));
                        }
                        return Watch::Continue;
                    }
                    Watch::Ended
                }
            }
        }

        async fn serve(&mut self, (n, reply): Job, _: &mut Serving<'_, Job>) -> Served {
            self.record.record.add(Event::Served(self.id, n));
            let _ = reply.send(self.id);
            Served::Answered
        }

        fn signal(&mut self, signal: Signal) {
            self.record.record.add(Event::Signalled(self.id, signal));
            self.proc.signal_group(signal);
        }

        async fn wait(&mut self) -> Exit {
            self.proc.wait().await
        }

        fn close(&mut self) {
            self.record.record.add(Event::Closed(self.id));
            self.stdin = None;
        }

        fn stopped(&mut self, exit: Exit) {
            self.record.record.add(Event::Stopped(self.id, exit));
        }
    }

    fn sh(scripts: Vec<&'static str>) -> Arc<ShScript> {
        Arc::new(ShScript {
            scripts,
            record: Record::new(),
        })
    }

    /// `got` is `want`, each time at most a few milliseconds late: the clock was paused between
    /// two milliseconds, and each timer passes one late (tokio rounds a timer up).
    fn assert_near<T: PartialEq + std::fmt::Debug>(got: &[(u64, T)], want: &[(u64, T)]) {
        let near = got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|((a, x), (b, y))| x == y && (*b..=*b + 5).contains(a));
        assert!(near, "{got:?} is not {want:?}");
    }

    /// The supervisor with real children, in paused time: called from the one test that
    /// spawns (see `process::tests`). While a real child runs no timer is pending, so the
    /// paused clock stands still until it has exited; a grace, though, passes at once.
    pub(crate) async fn with_real_children() {
        tokio::time::pause();
        real_children_are_restarted_with_backoff().await;
        a_real_child_that_is_not_ready_in_time_is_killed().await;
        a_real_child_that_ignores_sigterm_is_killed_after_the_grace().await;
        real_children_are_replaced_before_they_are_wound_down().await;
        tokio::time::resume();
    }

    async fn real_children_are_restarted_with_backoff() {
        let script = sh(vec!["exit 3"]);
        let sup = Supervisor::start::<Sh>(one_slot(), script.clone(), Arc::default());
        script.record.until_started(4).await;
        sup.stop().await;
        let starts = script.record.starts();
        let starts: Vec<_> = starts.into_iter().take(4).map(|at| (at, ())).collect();
        assert_near(&starts, &[(0, ()), (100, ()), (300, ()), (700, ())]);
    }

    async fn a_real_child_that_is_not_ready_in_time_is_killed() {
        let script = sh(vec!["exec sleep 60"]);
        let settings = Settings {
            ready_wait: Some(ms(2000)),
            ..one_slot()
        };
        let sup = Supervisor::start::<Sh>(settings, script.clone(), Arc::default());
        script.record.until_started(2).await;
        sup.stop().await;
        use Event::*;
        let events: Vec<_> = script.record.events().into_iter().take(3).collect();
        assert_near(
            &events,
            &[
                (0, Started(0)),
                (2000, Signalled(0, Signal::SIGKILL)),
                (2100, Started(1)),
            ],
        );
    }

    async fn a_real_child_that_ignores_sigterm_is_killed_after_the_grace() {
        // SIG_IGN survives the exec: sleep ignores SIGTERM too. No ready wait (its timer
        // would pass at once): the test waits for the line itself.
        let script = sh(vec!["trap '' TERM; echo ready; exec sleep 60"]);
        let sup = Supervisor::start::<Sh>(one_slot(), script.clone(), Arc::default());
        script.record.until(Event::Ready(0)).await;
        let stop = (Instant::now() - script.record.t0).as_millis() as u64;
        sup.stop().await;
        use Event::*;
        let events: Vec<_> = script.record.events().into_iter().skip(2).collect();
        assert_near(
            &events,
            &[
                (stop, Closed(0)),
                (stop, Signalled(0, Signal::SIGTERM)),
                (stop + 5000, Signalled(0, Signal::SIGKILL)),
                (stop + 5000, Stopped(0, Exit::Signal(9))),
            ],
        );
    }

    async fn real_children_are_replaced_before_they_are_wound_down() {
        // No ready wait: its timer would pass at once.
        let script = sh(vec!["while read -r l; do :; done"]);
        let line = Arc::new(JobLine::default());
        let settings = Settings {
            max_requests: Some(1),
            ..one_slot()
        };
        let answers: Vec<_> = (1..=3).map(|n| job(&line, n)).collect();
        let sup = Supervisor::start::<Sh>(settings, script.clone(), line);
        for (answer, by) in answers.into_iter().zip([0, 1, 2]) {
            assert_eq!(answer.await, Ok(by));
        }
        script.record.until_started(4).await;
        for old in 0..3 {
            // EOF ends it, unless the retiring grace (passing at once here) came first.
            let ended = |e: &Exit| matches!(e, Exit::Code(0) | Exit::Signal(9 | 15));
            let mut events = script.record.events.subscribe();
            let _ = events
                .wait_for(|ev| {
                    ev.iter()
                        .any(|(_, e)| matches!(e, Event::Stopped(n, x) if *n == old && ended(x)))
                })
                .await;
        }
        sup.stop().await;
        let events = script.record.events();
        let pos = |e: Event| events.iter().position(|(_, x)| *x == e).unwrap();
        for old in 0..3 {
            assert!(
                pos(Event::Started(old + 1)) < pos(Event::Closed(old)),
                "{events:?}"
            );
        }
    }
}

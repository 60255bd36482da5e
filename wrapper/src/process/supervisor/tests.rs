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

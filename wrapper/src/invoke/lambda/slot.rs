//! One runtime slot: the state machine of one runtime process as its Runtime API sees it, and
//! the invocations that move through it.
//!
//! Each slot has its own loopback port, so every request to the Runtime API is known to come
//! from that slot's runtime (an `/init/error` restarts the runtime that sent it, an id belongs
//! to one runtime). The states follow Lambda's: a runtime starts (`Started`), either reports an
//! init error or asks for its first invocation (`Ready`), gets one (`Running`), answers it once
//! (`/response` or `/error`) and asks for the next. What breaks that order is answered as the
//! Runtime API documents it (`InvalidRequestID` 400, `InvalidStateTransition` 403), and never
//! stops the runtime.
//!
//! The state is behind a plain mutex, held only for a few field updates (never across an
//! await): the API handlers and the slot's supervisor ([`super::runtime`]) share it.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

use super::result::FunctionError;
use crate::process::supervisor::Readiness;

/// One invocation waiting for (or handed to) a runtime.
#[derive(Debug)]
pub struct Job {
    /// `Lambda-Runtime-Aws-Request-Id`: a UUID per invocation.
    pub id: Arc<str>,
    /// The event, as the body of `/next`.
    pub event: Bytes,
    /// When the invocation times out (its wait for a runtime included).
    pub deadline: Instant,
    /// The same deadline in Unix milliseconds (`Lambda-Runtime-Deadline-Ms`).
    pub deadline_ms: u64,
    /// `Lambda-Runtime-Trace-Id`, when tracing is on.
    pub trace_id: Option<HeaderValue>,
    /// `Lambda-Runtime-Client-Context`: what the invoke API's caller sent as
    /// `X-Amz-Client-Context`, decoded.
    pub client_context: Option<HeaderValue>,
    /// Where the runtime's answer goes.
    pub reply: oneshot::Sender<Delivery>,
    /// Held until a runtime is done with the invocation (the server's admission slot).
    pub hold: Hold,
}

/// Something kept alive while an invocation occupies a runtime: the server's admission slot,
/// so that the server admits exactly as many invocations as there are runtimes, however a
/// client's answer ends (a client that leaves a stream early frees nothing while the runtime
/// still writes it).
pub struct Hold {
    _held: Box<dyn Send>,
}

impl Hold {
    /// Keeps `value` until the invocation leaves its runtime.
    pub fn new(value: impl Send + 'static) -> Hold {
        Hold {
            _held: Box::new(value),
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}

/// What became of an invocation, as the waiting client learns it.
#[derive(Debug)]
pub enum Delivery {
    /// A buffered `/response`: the result and the content type the runtime gave it.
    Result {
        /// The result bytes (at most 6 MiB).
        body: Bytes,
        /// The `Content-Type` of the `/response` request.
        content_type: Option<HeaderValue>,
    },
    /// A streamed `/response` (`Lambda-Runtime-Function-Response-Mode: streaming`).
    Stream(Streamed),
    /// `/invocation/{id}/error`.
    Error(FunctionError),
    /// The invocation failed around the function.
    Failed(Failure),
}

/// A response the runtime is streaming.
#[derive(Debug)]
pub struct Streamed {
    /// The `Content-Type` of the `/response` request.
    pub content_type: Option<HeaderValue>,
    /// Its body as it comes, ended by [`Chunk::End`] or [`Chunk::Failed`].
    pub chunks: mpsc::Receiver<Chunk>,
}

/// A piece of a streamed response.
#[derive(Debug)]
pub enum Chunk {
    /// Body bytes.
    Data(Bytes),
    /// The stream ended as it should.
    End,
    /// The stream ended early: error trailers, or the runtime's request broke off.
    Failed(Option<FunctionError>),
}

/// Why an invocation failed around the function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The runtime exited (status) while the invocation was its own.
    Exited(i32),
    /// The response was above the payload limit.
    TooLarge,
    /// The error document (`/error`) was above the payload limit.
    ErrorTooLarge,
    /// The runtime's `/response` or `/error` request broke off.
    Truncated,
    /// `Lambda-Runtime-Function-Response-Mode` was neither absent nor `streaming`.
    BadResponseMode,
    /// The runtime failed to initialise (its `/init/error`, or an exit before it asked for
    /// an invocation) and no runtime was ready.
    Init(FunctionError),
    /// The invocation ran into `RUNR_TIMEOUT`.
    TimedOut,
}

/// An error answered on the Runtime API: `{"errorMessage", "errorType"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// `errorType`.
    pub error_type: &'static str,
    /// `errorMessage`.
    pub message: String,
}

impl ApiError {
    /// 400 `InvalidRequestID`: no invocation of this runtime has that id.
    pub fn invalid_request_id() -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            error_type: "InvalidRequestID",
            message: "Invalid request ID".into(),
        }
    }

    /// 403 `InvalidStateTransition` from state `from` to `to` (Lambda's state names).
    pub fn invalid_transition(from: &str, to: &str) -> ApiError {
        ApiError {
            status: StatusCode::FORBIDDEN,
            error_type: "InvalidStateTransition",
            message: format!(
                "State transition from {from} to {to} failed for runtime. Error: State transition is not allowed"
            ),
        }
    }
}

/// The Lambda names of the runtime states, for `InvalidStateTransition` messages.
const INIT_ERROR: &str = "InitError";
const READY: &str = "Ready";
const RUNNING: &str = "Running";
const INVOCATION_RESPONSE: &str = "InvocationResponse";
const INVOCATION_ERROR_RESPONSE: &str = "InvocationErrorResponse";
const RESPONSE_SENT: &str = "RuntimeResponseSentState";
const STOPPED: &str = "Stopped";

/// Where a runtime is in its life.
enum Phase {
    /// No process (between a restart's exit and start, and after the last stop).
    Down,
    /// Started, has not asked for an invocation yet.
    Starting,
    /// Posted `/init/error` at this instant; its process is expected to exit.
    InitFailed(Instant),
    /// Asked for invocations; has none.
    Ready,
    /// Has an invocation.
    Busy(Busy),
}

/// The invocation a runtime has.
struct Busy {
    id: Arc<str>,
    event: Bytes,
    deadline: Instant,
    deadline_ms: u64,
    trace_id: Option<HeaderValue>,
    client_context: Option<HeaderValue>,
    /// Taken when the runtime starts answering.
    reply: Option<oneshot::Sender<Delivery>>,
    /// Dropped with this state: when the runtime is done with the invocation.
    hold: Hold,
    /// Which answer is under way, once one is (`/response` or `/error`).
    answering: Option<&'static str>,
    /// The supervisor killed the runtime for the timeout.
    timed_out: bool,
    /// A `/next` answered with it: from then on the runtime has it (before, a runtime that
    /// exits has not seen it, and it goes back to the queue).
    delivered: bool,
}

struct State {
    phase: Phase,
    /// `/next` requests of the current process waiting for an invocation.
    waiting: usize,
    /// Counts process starts, so that a `/next` of a process that is gone cannot change the
    /// next process's count when it finally ends.
    generation: u64,
    /// The id of the last invocation this runtime finished (a second answer for it is an
    /// invalid transition, not an unknown id).
    last_done: Option<Arc<str>>,
}

/// The event a `/next` answers with.
#[derive(Debug, Clone)]
pub struct NextEvent {
    /// `Lambda-Runtime-Aws-Request-Id`.
    pub id: Arc<str>,
    /// The body.
    pub event: Bytes,
    /// `Lambda-Runtime-Deadline-Ms`.
    pub deadline_ms: u64,
    /// `Lambda-Runtime-Trace-Id`.
    pub trace_id: Option<HeaderValue>,
    /// `Lambda-Runtime-Client-Context`.
    pub client_context: Option<HeaderValue>,
}

/// What the supervisor waits for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Ready with a `/next` waiting: pull an invocation from the queue.
    pub wants_job: bool,
    /// The deadline of the invocation under way, unless it already timed out.
    pub deadline: Option<Instant>,
    /// When the runtime reported its init error.
    pub init_failed_at: Option<Instant>,
}

/// What the runtime was doing when it exited.
#[derive(Debug)]
pub enum Exited {
    /// It never asked for an invocation: an init failure.
    DuringInit,
    /// It had been handed an invocation that no `/next` had answered with yet: the job, for
    /// another runtime.
    Undelivered(Job),
    /// Anything else (idle, after an init error, or mid-invocation: that invocation has been
    /// answered with [`Failure::Exited`] here).
    Otherwise,
}

impl PartialEq for Exited {
    fn eq(&self, other: &Exited) -> bool {
        matches!(
            (self, other),
            (Exited::DuringInit, Exited::DuringInit)
                | (Exited::Otherwise, Exited::Otherwise)
                | (Exited::Undelivered(_), Exited::Undelivered(_))
        )
    }
}

/// One runtime slot.
pub struct Slot {
    /// Its number, 0-based (logs).
    pub index: usize,
    state: Mutex<State>,
    readiness: Arc<Readiness>,
    /// Wakes the supervisor after a state change it acts on.
    pub poke: Notify,
    /// Bumped when an invocation is handed to the runtime (`/next` waits on it).
    assigned: watch::Sender<u64>,
}

impl Slot {
    /// A slot without a process yet.
    pub fn new(index: usize, readiness: Arc<Readiness>) -> Slot {
        Slot {
            index,
            state: Mutex::new(State {
                phase: Phase::Down,
                waiting: 0,
                generation: 0,
                last_done: None,
            }),
            readiness,
            poke: Notify::new(),
            assigned: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves plain fields behind; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves to `phase`, keeping the ready count right.
    fn set(&self, st: &mut State, phase: Phase) {
        let was = is_ready(&st.phase);
        let now = is_ready(&phase);
        st.phase = phase;
        match (was, now) {
            (false, true) => self.readiness.up(self.index),
            (true, false) => self.readiness.down(),
            _ => {}
        }
    }

    // === the supervisor's side ===

    /// A new process was started.
    pub fn started(&self) {
        let mut st = self.lock();
        st.last_done = None;
        st.waiting = 0;
        st.generation += 1;
        self.set(&mut st, Phase::Starting);
    }

    /// What to wait for now.
    pub fn view(&self) -> View {
        let st = self.lock();
        match &st.phase {
            Phase::Ready => View {
                wants_job: st.waiting > 0,
                deadline: None,
                init_failed_at: None,
            },
            Phase::Busy(b) => View {
                wants_job: false,
                deadline: (!b.timed_out).then_some(b.deadline),
                init_failed_at: None,
            },
            Phase::InitFailed(at) => View {
                wants_job: false,
                deadline: None,
                init_failed_at: Some(*at),
            },
            Phase::Down | Phase::Starting => View {
                wants_job: false,
                deadline: None,
                init_failed_at: None,
            },
        }
    }

    /// Hands `job` to the runtime (its waiting `/next` answers with it). A job whose client
    /// gave up, or whose deadline passed while it queued, is dropped: `false`.
    pub fn assign(&self, job: Job) -> bool {
        if job.reply.is_closed() || Instant::now() >= job.deadline {
            return false;
        }
        let mut st = self.lock();
        if !matches!(st.phase, Phase::Ready) {
            // Cannot happen (only a ready slot pulls); answer rather than lose the job.
            drop(st);
            let _ = job.reply.send(Delivery::Failed(Failure::Exited(-1)));
            return false;
        }
        self.set(
            &mut st,
            Phase::Busy(Busy {
                id: job.id,
                event: job.event,
                deadline: job.deadline,
                deadline_ms: job.deadline_ms,
                trace_id: job.trace_id,
                client_context: job.client_context,
                reply: Some(job.reply),
                hold: job.hold,
                answering: None,
                timed_out: false,
                delivered: false,
            }),
        );
        drop(st);
        self.assigned.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    /// The invocation under way ran into its deadline: its client is told (504) and `true`
    /// says the runtime must be killed. `false` when it finished meanwhile.
    pub fn time_out(&self) -> bool {
        let mut st = self.lock();
        let Phase::Busy(b) = &mut st.phase else {
            return false;
        };
        if b.timed_out || Instant::now() < b.deadline {
            return false;
        }
        b.timed_out = true;
        if let Some(reply) = b.reply.take() {
            let _ = reply.send(Delivery::Failed(Failure::TimedOut));
        }
        true
    }

    /// The process exited with `status`: the slot is down; an invocation it held is answered
    /// (502) unless its answer was already under way (a stream then sees its request break).
    pub fn exited(&self, status: i32) -> Exited {
        let mut st = self.lock();
        let old = std::mem::replace(&mut st.phase, Phase::Down);
        if is_ready(&old) {
            self.readiness.down();
        }
        drop(st);
        // Waiting `/next`s (of the dead process) see `Down` and end.
        self.assigned.send_modify(|n| *n = n.wrapping_add(1));
        match old {
            Phase::Busy(b) if !b.delivered && !b.timed_out && b.answering.is_none() => {
                match b.reply {
                    Some(reply) => Exited::Undelivered(Job {
                        id: b.id,
                        event: b.event,
                        deadline: b.deadline,
                        deadline_ms: b.deadline_ms,
                        trace_id: b.trace_id,
                        client_context: b.client_context,
                        reply,
                        hold: b.hold,
                    }),
                    None => Exited::Otherwise,
                }
            }
            Phase::Busy(b) => {
                if let Some(reply) = b.reply {
                    let _ = reply.send(Delivery::Failed(Failure::Exited(status)));
                }
                Exited::Otherwise
            }
            Phase::Starting => Exited::DuringInit,
            Phase::Down | Phase::InitFailed(_) | Phase::Ready => Exited::Otherwise,
        }
    }

    // === the Runtime API's side ===

    /// `GET /runtime/invocation/next`, first half: an invocation to re-send (asked again
    /// before answering: the same event, as Lambda does), or registration as a waiter of this
    /// process (`Ok(Err(generation))`: pass it to [`Slot::next_done`]).
    pub fn next_begin(&self) -> Result<Result<NextEvent, u64>, ApiError> {
        let mut st = self.lock();
        match &mut st.phase {
            Phase::Starting => self.set(&mut st, Phase::Ready),
            Phase::Ready => {}
            Phase::Busy(b) => {
                return match b.answering {
                    None => Ok(Ok(next_event(b))),
                    Some(state) => Err(ApiError::invalid_transition(state, READY)),
                }
            }
            Phase::InitFailed(_) => return Err(ApiError::invalid_transition(INIT_ERROR, READY)),
            Phase::Down => return Err(ApiError::invalid_transition(STOPPED, READY)),
        }
        st.waiting += 1;
        let generation = st.generation;
        drop(st);
        self.poke.notify_one();
        Ok(Err(generation))
    }

    /// Subscribes to hand-overs; take it before [`Slot::next_begin`] so none is missed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.assigned.subscribe()
    }

    /// `/next`, second half (after a hand-over or an exit): the event if there is one to send.
    /// `Err` when the runtime went away meanwhile.
    pub fn next_poll(&self) -> Result<Option<NextEvent>, ApiError> {
        let mut st = self.lock();
        match &mut st.phase {
            Phase::Busy(b) if b.answering.is_none() => Ok(Some(next_event(b))),
            Phase::Ready | Phase::Busy(_) => Ok(None),
            Phase::Down | Phase::Starting | Phase::InitFailed(_) => {
                Err(ApiError::invalid_transition(STOPPED, READY))
            }
        }
    }

    /// A `/next` registered in `generation` stopped waiting (answered, or its connection
    /// went away).
    pub fn next_done(&self, generation: u64) {
        let mut st = self.lock();
        if st.generation == generation {
            st.waiting = st.waiting.saturating_sub(1);
        }
    }

    /// `/invocation/{id}/response` or `/error` begins: the client's reply channel when `id` is
    /// the invocation under way and not answered yet.
    pub fn answer_begin(
        &self,
        id: &str,
        error: bool,
    ) -> Result<oneshot::Sender<Delivery>, ApiError> {
        let to = if error {
            INVOCATION_ERROR_RESPONSE
        } else {
            INVOCATION_RESPONSE
        };
        let mut st = self.lock();
        let last_done = st.last_done.clone();
        match &mut st.phase {
            Phase::Busy(b) if &*b.id == id => match (b.answering, b.reply.take()) {
                (None, Some(reply)) => {
                    b.answering = Some(to);
                    Ok(reply)
                }
                // Timed out: the client has its 504, the runtime is being killed.
                (None, None) => Err(ApiError::invalid_transition(RUNNING, to)),
                (Some(state), reply) => {
                    b.reply = reply;
                    Err(ApiError::invalid_transition(state, to))
                }
            },
            _ if last_done.as_deref() == Some(id) => {
                Err(ApiError::invalid_transition(RESPONSE_SENT, to))
            }
            _ => Err(ApiError::invalid_request_id()),
        }
    }

    /// The answer for `id` is complete: the runtime is ready for its next invocation.
    pub fn answer_done(&self, id: &str) {
        let mut st = self.lock();
        if matches!(&st.phase, Phase::Busy(b) if &*b.id == id) {
            st.last_done = Some(Arc::from(id));
            self.set(&mut st, Phase::Ready);
            drop(st);
            self.poke.notify_one();
        }
    }

    /// `POST /runtime/init/error`: allowed once, before the first `/next`.
    pub fn init_error(&self) -> Result<(), ApiError> {
        let mut st = self.lock();
        let from = match &st.phase {
            Phase::Starting => {
                self.set(&mut st, Phase::InitFailed(Instant::now()));
                drop(st);
                self.poke.notify_one();
                return Ok(());
            }
            Phase::Down => STOPPED,
            Phase::InitFailed(_) => INIT_ERROR,
            Phase::Ready => READY,
            Phase::Busy(b) => b.answering.unwrap_or(RUNNING),
        };
        Err(ApiError::invalid_transition(from, INIT_ERROR))
    }

    /// The Lambda name of the current state.
    #[cfg(test)]
    fn state_name(&self) -> &'static str {
        match &self.lock().phase {
            Phase::Down => STOPPED,
            Phase::Starting => "Started",
            Phase::InitFailed(_) => INIT_ERROR,
            Phase::Ready => READY,
            Phase::Busy(b) => b.answering.unwrap_or(RUNNING),
        }
    }
}

fn is_ready(phase: &Phase) -> bool {
    matches!(phase, Phase::Ready | Phase::Busy(_))
}

/// The event of `b`, which counts as delivered from now on.
fn next_event(b: &mut Busy) -> NextEvent {
    b.delivered = true;
    NextEvent {
        id: b.id.clone(),
        event: b.event.clone(),
        deadline_ms: b.deadline_ms,
        trace_id: b.trace_id.clone(),
        client_context: b.client_context.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job(id: &str, timeout: Duration) -> (Job, oneshot::Receiver<Delivery>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            id: Arc::from(id),
            event: Bytes::from_static(b"{}"),
            deadline: Instant::now() + timeout,
            deadline_ms: 1,
            trace_id: None,
            client_context: None,
            reply: tx,
            hold: Hold::new(()),
        };
        (job, rx)
    }

    fn ready_slot() -> (Slot, Arc<Readiness>) {
        let readiness = Arc::new(Readiness::default());
        let slot = Slot::new(0, readiness.clone());
        slot.started();
        assert_eq!(slot.state_name(), "Started");
        assert!(!readiness.any());
        assert!(
            slot.next_begin().unwrap().is_err(),
            "registered as a waiter"
        );
        assert!(readiness.any(), "the first /next makes the runtime ready");
        (slot, readiness)
    }

    #[tokio::test]
    async fn one_invocation_through_its_states() {
        let (slot, _) = ready_slot();
        assert!(slot.view().wants_job);
        let mut assigned = slot.subscribe();
        let (j, mut rx) = job("id-1", Duration::from_secs(60));
        assert!(slot.assign(j));
        assert!(assigned.has_changed().unwrap());
        assigned.borrow_and_update();
        let event = slot.next_poll().unwrap().unwrap();
        assert_eq!(&*event.id, "id-1");
        slot.next_done(1);
        assert_eq!(slot.state_name(), "Running");
        assert!(!slot.view().wants_job);
        // Asked again before answering: the same event.
        assert_eq!(&*slot.next_begin().unwrap().unwrap().id, "id-1");
        // A waiter of an earlier process ending late changes nothing.
        slot.next_done(0);

        assert_eq!(
            slot.answer_begin("other", false).unwrap_err(),
            ApiError::invalid_request_id()
        );
        let reply = slot.answer_begin("id-1", false).unwrap();
        let second = slot.answer_begin("id-1", false).unwrap_err();
        assert_eq!(
            (second.status.as_u16(), second.error_type),
            (403, "InvalidStateTransition")
        );
        assert!(second
            .message
            .starts_with("State transition from InvocationResponse to InvocationResponse"));
        let busy = slot.next_begin().unwrap_err();
        assert_eq!(busy.status, 403, "no /next while the answer is under way");
        let _ = reply.send(Delivery::Failed(Failure::TooLarge));
        slot.answer_done("id-1");
        assert!(matches!(
            rx.try_recv(),
            Ok(Delivery::Failed(Failure::TooLarge))
        ));
        assert_eq!(slot.state_name(), "Ready");
        let late = slot.answer_begin("id-1", true).unwrap_err();
        assert_eq!(
            late.message,
            "State transition from RuntimeResponseSentState to InvocationErrorResponse failed for runtime. Error: State transition is not allowed"
        );
        assert_eq!(slot.answer_begin("id-2", true).unwrap_err().status, 400);
    }

    #[tokio::test]
    async fn init_errors_only_before_the_first_next() {
        let readiness = Arc::new(Readiness::default());
        let slot = Slot::new(0, readiness.clone());
        slot.started();
        slot.init_error().unwrap();
        assert_eq!(slot.state_name(), "InitError");
        assert!(slot.view().init_failed_at.is_some());
        assert_eq!(slot.init_error().unwrap_err().status, 403);
        assert_eq!(slot.next_begin().unwrap_err().status, 403);
        assert!(!readiness.any());
        assert_eq!(slot.exited(1), Exited::Otherwise);

        let (slot, readiness) = ready_slot();
        assert_eq!(slot.init_error().unwrap_err().status, 403);
        assert_eq!(slot.exited(0), Exited::Otherwise);
        assert!(!readiness.any(), "an exited runtime is not ready");

        let slot = Slot::new(0, readiness);
        slot.started();
        assert_eq!(slot.exited(2), Exited::DuringInit);
    }

    #[tokio::test]
    async fn a_waiter_of_a_gone_process_does_not_count_for_the_next() {
        let (slot, _) = ready_slot();
        slot.exited(1);
        slot.started();
        let generation = slot.next_begin().unwrap().unwrap_err();
        assert_eq!(generation, 2);
        slot.next_done(1);
        assert!(slot.view().wants_job, "the new process's /next still waits");
        slot.next_done(2);
        assert!(!slot.view().wants_job);
    }

    #[tokio::test]
    async fn an_invocation_its_runtime_never_saw_goes_back_with_its_client() {
        let (slot, _) = ready_slot();
        let (j, mut rx) = job("id-1", Duration::from_secs(60));
        assert!(slot.assign(j));
        let Exited::Undelivered(job) = slot.exited(3) else {
            panic!("the job was not handed back");
        };
        assert_eq!(&*job.id, "id-1");
        assert!(rx.try_recv().is_err(), "its client still waits");
        drop(job);
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn an_exit_mid_invocation_answers_it() {
        let (slot, _) = ready_slot();
        let (j, mut rx) = job("id-1", Duration::from_secs(60));
        assert!(slot.assign(j));
        assert!(slot.next_poll().unwrap().is_some(), "delivered");
        slot.exited(3);
        assert!(matches!(
            rx.try_recv(),
            Ok(Delivery::Failed(Failure::Exited(3)))
        ));
        assert_eq!(slot.next_poll().unwrap_err().status, 403);
    }

    #[tokio::test]
    async fn the_timeout_answers_once_and_asks_for_the_kill() {
        let (slot, _) = ready_slot();
        let (j, mut rx) = job("id-1", Duration::from_millis(1));
        // An expired job is not handed out at all.
        let (expired, _rx) = job("old", Duration::ZERO);
        assert!(!slot.assign(expired));
        assert!(slot.assign(j));
        assert!(slot.view().deadline.is_some());
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(slot.time_out());
        assert!(matches!(
            rx.try_recv(),
            Ok(Delivery::Failed(Failure::TimedOut))
        ));
        assert!(!slot.time_out(), "once");
        assert_eq!(slot.view().deadline, None);
        assert_eq!(slot.answer_begin("id-1", false).unwrap_err().status, 403);
    }

    #[tokio::test]
    async fn the_hold_is_released_when_the_runtime_is_done_not_before() {
        let (slot, _) = ready_slot();
        let (tx, _rx) = oneshot::channel();
        let held = Arc::new(());
        let job = Job {
            id: Arc::from("id-1"),
            event: Bytes::new(),
            deadline: Instant::now() + Duration::from_secs(60),
            deadline_ms: 1,
            trace_id: None,
            client_context: None,
            reply: tx,
            hold: Hold::new(held.clone()),
        };
        assert!(slot.assign(job));
        let reply = slot.answer_begin("id-1", false).unwrap();
        drop(reply);
        assert_eq!(
            Arc::strong_count(&held),
            2,
            "held while the answer is under way"
        );
        slot.answer_done("id-1");
        assert_eq!(Arc::strong_count(&held), 1, "released with the invocation");
    }

    #[tokio::test]
    async fn a_job_whose_client_left_is_dropped() {
        let (slot, _) = ready_slot();
        let (j, rx) = job("id-1", Duration::from_secs(60));
        drop(rx);
        assert!(!slot.assign(j));
        assert_eq!(slot.state_name(), "Ready");
    }
}

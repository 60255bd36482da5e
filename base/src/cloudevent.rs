//! The CloudEvents attributes the platform's events carry (the spec's execution contract): sent
//! by runr-tick and runr-queue, read by the wrapper to tell a tick from a queue message. One
//! definition, so that producer and reader cannot drift apart.

/// CloudEvents specification version of every event.
pub const SPECVERSION: &str = "1.0";
/// `ce-type` of a schedule tick.
pub const SCHEDULE_EVENT_TYPE: &str = "dev.runr.schedule.tick";
/// `ce-source` of a schedule tick.
pub const SCHEDULE_EVENT_SOURCE: &str = "/runr/schedule";
/// `ce-type` of the events runr-queue POSTs for stream entries (the wrapper tells a queue
/// invocation by it when its pod names no trigger).
pub const QUEUE_EVENT_TYPE: &str = "dev.runr.queue.message";
/// Content type of both events' data (JSON).
pub const CONTENT_TYPE: &str = "application/json";

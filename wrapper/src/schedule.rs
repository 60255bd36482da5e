//! The schedule trigger (`RUNR_TRIGGER=schedule`, what a CronJob runs): one tick, its answer on
//! stdout, exit 0 for a status below 400 and 1 otherwise.
//!
//! - http mode, the invoke sequence: start the program with `PORT`, wait until it listens (up to
//!   60 s), POST the schedule CloudEvent, stop the server (SIGTERM, SIGKILL after 5 s);
//! - exec and persistent mode: one invocation with the same request through the [`Invoker`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use runr_tick::{ScheduleEvent, Target, TickResponse};

use crate::config::{Config, Mode, Trigger};
use crate::envelope::Request;
use crate::invoke::Invoker;
use crate::{httpmode, observe, reaper};

/// Runs the configured mode's schedule one-shot; returns the exit status.
pub async fn run(config: Config) -> u8 {
    observe::install(&config.observe);
    reaper::adopt_orphans();
    if let Err(e) = reaper::ensure_started() {
        tracing::error!(error = %e, "cannot install the SIGCHLD handler");
        return 1;
    }
    let code = match config.mode {
        Mode::Http => invoke_sequence(&config).await,
        Mode::Exec | Mode::Persistent => one_shot(&config).await,
    };
    observe::flush(Duration::from_secs(2)).await;
    code
}

/// http mode: start the server, tick it once, stop it.
async fn invoke_sequence(config: &Config) -> u8 {
    let mut server = match httpmode::spawn_server(&config.command, config.port, true) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(command = ?config.command, error = %e, "cannot start RUNR_COMMAND");
            return 1;
        }
    };
    let target = Target::local(config.port);
    // Only the wait races the server's exit: once connected, a server that answers and then
    // exits must still have its answer read.
    let stream = tokio::select! {
        waited = runr_tick::wait_for_listener(&target, config.observe.listen_wait) => match waited {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::error!(command = ?config.command, "the server never listened: {e}");
                None
            }
        },
        exit = server.wait() => {
            tracing::error!(command = ?config.command, status = exit.code(), port = config.port, "the server exited before listening");
            None
        }
    };
    let code = match stream {
        None => 1,
        Some(stream) => {
            let event = ScheduleEvent::new();
            let started = Instant::now();
            match tokio::time::timeout(config.timeout, runr_tick::send(stream, &target, &event))
                .await
            {
                Ok(Ok(response)) => {
                    observe_tick(&event, &response, started.elapsed());
                    runr_tick::print_response(&response)
                }
                Ok(Err(e)) => {
                    tracing::error!("{}", runr_tick::error_chain(&e));
                    1
                }
                Err(_) => {
                    tracing::error!(timeout = %crate::config::display_timeout(config.timeout), "the server did not answer the schedule event in time");
                    1
                }
            }
        }
    };
    let exit = httpmode::stop(&mut server).await;
    tracing::debug!(status = exit.code(), "server stopped");
    code
}

/// Access line / span / capture of the http-mode tick, like any other invocation.
fn observe_tick(event: &ScheduleEvent, response: &TickResponse, took: Duration) {
    if observe::global().is_none() {
        return;
    }
    let req = schedule_request(event);
    let outcome = crate::invoke::Outcome::answered(crate::response::Reply {
        status: http::StatusCode::from_u16(response.status)
            .unwrap_or(http::StatusCode::BAD_GATEWAY),
        headers: Vec::new(),
        body: response.body.clone(),
    });
    observe::invocation(&req, &outcome, took);
}

/// exec and persistent mode: one invocation with the schedule request.
async fn one_shot(config: &Config) -> u8 {
    let Some(invoker) = Invoker::new(config) else {
        return 1;
    };
    let event = ScheduleEvent::new();
    let req = schedule_request(&event);
    let started = Instant::now();
    let outcome = invoker.invoke(&req).await;
    observe::invocation(&req, &outcome, started.elapsed());
    let response = TickResponse {
        status: outcome.reply.status.as_u16(),
        body: outcome.reply.body.clone(),
    };
    let code = runr_tick::print_response(&response);
    invoker.shutdown().await;
    code
}

/// The request an http-mode server receives for a tick: `POST /`, the CloudEvent headers, the
/// schedule body.
pub fn schedule_request(event: &ScheduleEvent) -> Request {
    let mut headers = HeaderMap::new();
    for (name, value) in event.headers() {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    headers.insert(http::header::HOST, HeaderValue::from_static("localhost"));
    headers.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(runr_tick::event::BODY.len()),
    );
    Request::new(
        Trigger::Schedule,
        "POST",
        "/",
        headers,
        Bytes::from_static(runr_tick::event::BODY),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_request_carries_the_event() {
        let ev = ScheduleEvent::new();
        let req = schedule_request(&ev);
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/");
        assert_eq!(req.id, ev.id);
        let event = req.event.as_ref().unwrap();
        assert_eq!(event["type"], "dev.runr.schedule.tick");
        assert_eq!(event["source"], "/runr/schedule");
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["data"], serde_json::json!({"trigger": "schedule"}));
        assert_eq!(&req.body[..], br#"{"trigger":"schedule"}"#);
    }
}

//! A RunR invocation as the event a Lambda function expects for its trigger:
//!
//! - http → API Gateway HTTP API, payload format 2.0 ([`http_event`]);
//! - queue → an SQS event with one record ([`sqs_event`]);
//! - schedule → an EventBridge Scheduled Event ([`schedule_event`]).
//!
//! Every event is serialized straight from borrowed parts of the parsed [`Request`]: no JSON
//! tree is built per invocation. Whatever bytes a client sends, the result is valid JSON (text
//! that is not UTF-8 is base64 for bodies and replaced lossily in headers).

use std::borrow::Cow;
use std::time::SystemTime;

use base64::Engine;
use http::HeaderMap;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::Value;

use super::md5;
use crate::request::Request;

/// The account id in ARNs and events: RunR has no AWS account behind it.
pub const ACCOUNT_ID: &str = "000000000000";
/// The API id of the HTTP API events.
const API_ID: &str = "runr";
/// What SQS-shaped records name as their source.
const QUEUE_EVENT_SOURCE: &str = "runr:queue";
/// The queue consumer's header with the delivery attempt (1 for the first delivery).
const DELIVERY_ATTEMPT: &str = "x-runr-delivery-attempt";

/// What an HTTP event needs besides the request.
#[derive(Debug, Clone, Copy)]
pub struct HttpContext<'a> {
    /// The client's address (`X-Forwarded-For`'s first entry when a proxy set it).
    pub source_ip: &'a str,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub protocol: &'a str,
    /// When the request arrived.
    pub now: SystemTime,
}

/// The API Gateway HTTP API (payload format 2.0) event of `req`.
pub fn http_event(req: &Request, ctx: &HttpContext<'_>) -> Vec<u8> {
    let (body, is_base64_encoded) = body_text(&req.body);
    let host = header_text(&req.headers, "host").unwrap_or(Cow::Borrowed("localhost"));
    let domain_name = strip_port(&host);
    let event = HttpEvent {
        version: "2.0",
        route_key: "$default",
        raw_path: &req.path,
        raw_query_string: &req.raw_query,
        cookies: Cookies(&req.headers),
        headers: V2Headers(&req.headers),
        query_string_parameters: (!req.raw_query.is_empty())
            .then(|| query_parameters(&req.raw_query)),
        request_context: RequestContext {
            account_id: ACCOUNT_ID,
            api_id: API_ID,
            domain_name,
            domain_prefix: domain_name.split('.').next().unwrap_or(domain_name),
            http: HttpDescription {
                method: &req.method,
                path: percent_decoded(&req.path),
                protocol: ctx.protocol,
                source_ip: ctx.source_ip,
                user_agent: header_text(&req.headers, "user-agent").unwrap_or_default(),
            },
            request_id: &req.id,
            route_key: "$default",
            stage: "$default",
            time: clf_time(ctx.now),
            time_epoch: runr_base::fmt::unix_millis(ctx.now),
        },
        body: (!req.body.is_empty()).then_some(body),
        is_base64_encoded,
    };
    // Plain strings, maps and numbers into a Vec: serialization cannot fail.
    serde_json::to_vec(&event).unwrap_or_default()
}

/// The SQS event (one record) of a queue CloudEvent, and the record's `messageId` (the
/// CloudEvent id), which a `batchItemFailures` result names.
pub fn sqs_event(req: &Request, region: &str, now: SystemTime) -> (Vec<u8>, String) {
    let message_id = event_attr(req, "id").unwrap_or(&req.id).to_string();
    let (body, _) = body_text(&req.body);
    let sent = event_attr(req, "time")
        .and_then(parse_rfc3339_millis)
        .unwrap_or_else(|| runr_base::fmt::unix_millis(now));
    let attempt = header_text(&req.headers, DELIVERY_ATTEMPT)
        .filter(|v| v.parse::<u32>().is_ok())
        .unwrap_or(Cow::Borrowed("1"));
    let record = SqsRecord {
        message_id: &message_id,
        receipt_handle: format!("runr:{message_id}"),
        md5_of_body: md5::hex_digest(body.as_bytes()),
        body,
        attributes: SqsAttributes {
            approximate_receive_count: attempt,
            sent_timestamp: sent.to_string(),
            sender_id: "runr",
            approximate_first_receive_timestamp: runr_base::fmt::unix_millis(now).to_string(),
        },
        message_attributes: EmptyObject,
        event_source: QUEUE_EVENT_SOURCE,
        event_source_arn: event_attr(req, "source").unwrap_or(""),
        aws_region: region,
    };
    let event = SqsEvent { records: [record] };
    (serde_json::to_vec(&event).unwrap_or_default(), message_id)
}

/// The EventBridge Scheduled Event of a schedule tick.
pub fn schedule_event(req: &Request, region: &str, now: SystemTime) -> Vec<u8> {
    let time = event_attr(req, "time")
        .map(str::to_string)
        .unwrap_or_else(|| runr_base::fmt::rfc3339(now));
    let event = ScheduledEvent {
        version: "0",
        id: event_attr(req, "id").unwrap_or(&req.id),
        detail_type: "Scheduled Event",
        source: "aws.events",
        account: ACCOUNT_ID,
        time,
        region,
        resources: [(); 0],
        detail: EmptyObject,
    };
    serde_json::to_vec(&event).unwrap_or_default()
}

/// A CloudEvent attribute of the request, when it carries one as text.
fn event_attr<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.event.as_ref()?.get(name).and_then(Value::as_str)
}

/// The body as JSON text: as it is when UTF-8, else base64 (and `true`).
fn body_text(body: &[u8]) -> (Cow<'_, str>, bool) {
    match std::str::from_utf8(body) {
        Ok(s) => (Cow::Borrowed(s), false),
        Err(_) => (
            Cow::Owned(base64::engine::general_purpose::STANDARD.encode(body)),
            true,
        ),
    }
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<Cow<'a, str>> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            if name.starts_with('[') || !name.contains(':') {
                name
            } else {
                host
            }
        }
        _ => host,
    }
}

/// The query string as API Gateway's `queryStringParameters`: decoded, a key given more than
/// once keeps its values joined with `,`, in order of first appearance.
fn query_parameters(raw: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
        match out.iter_mut().find(|(key, _)| *key == k) {
            Some((_, value)) => {
                value.push(',');
                value.push_str(&v);
            }
            None => out.push((k.into_owned(), v.into_owned())),
        }
    }
    out
}

/// `%20` → ` `; a path whose decoded bytes are not UTF-8 is kept as it came.
pub fn percent_decoded(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Borrowed(path),
    }
}

/// API Gateway's `requestContext.time`: `12/Mar/2020:19:03:58 +0000`.
fn clf_time(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // `2020-03-12T19:03:58Z`, rearranged (one calendar implementation in the workspace).
    let iso = runr_base::fmt::rfc3339(t);
    let month: usize = iso.get(5..7).and_then(|m| m.parse().ok()).unwrap_or(1);
    format!(
        "{}/{}/{}:{} +0000",
        iso.get(8..10).unwrap_or("01"),
        MONTHS[month.clamp(1, 12) - 1],
        iso.get(0..4).unwrap_or("1970"),
        iso.get(11..19).unwrap_or("00:00:00"),
    )
}

/// Milliseconds since the epoch of an RFC 3339 time (`2026-10-10T12:00:00Z`,
/// `…T12:00:00.123+02:00`); `None` when it is not one.
pub fn parse_rfc3339_millis(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        for (i, d) in frac
            .bytes()
            .take(3)
            .enumerate()
            .filter(|(i, _)| *i < digits)
        {
            millis += i64::from(d - b'0') * [100, 10, 1][i];
        }
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let (h, m): (i64, i64) = (rest[1..3].parse().ok()?, rest[4..6].parse().ok()?);
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month as u32, day as u32);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    u64::try_from(secs * 1000 + millis).ok()
}

/// Days since 1970-01-01 of a Gregorian date (Howard Hinnant's `days_from_civil`, the inverse
/// of the formatter's `civil_from_days` in runr-base).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

// === wire shapes ===

#[derive(Serialize)]
struct HttpEvent<'a> {
    version: &'static str,
    #[serde(rename = "routeKey")]
    route_key: &'static str,
    #[serde(rename = "rawPath")]
    raw_path: &'a str,
    #[serde(rename = "rawQueryString")]
    raw_query_string: &'a str,
    #[serde(skip_serializing_if = "Cookies::is_empty")]
    cookies: Cookies<'a>,
    headers: V2Headers<'a>,
    #[serde(
        rename = "queryStringParameters",
        skip_serializing_if = "Option::is_none",
        serialize_with = "pairs_as_object"
    )]
    query_string_parameters: Option<Vec<(String, String)>>,
    #[serde(rename = "requestContext")]
    request_context: RequestContext<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Cow<'a, str>>,
    #[serde(rename = "isBase64Encoded")]
    is_base64_encoded: bool,
}

#[derive(Serialize)]
struct RequestContext<'a> {
    #[serde(rename = "accountId")]
    account_id: &'static str,
    #[serde(rename = "apiId")]
    api_id: &'static str,
    #[serde(rename = "domainName")]
    domain_name: &'a str,
    #[serde(rename = "domainPrefix")]
    domain_prefix: &'a str,
    http: HttpDescription<'a>,
    #[serde(rename = "requestId")]
    request_id: &'a str,
    #[serde(rename = "routeKey")]
    route_key: &'static str,
    stage: &'static str,
    time: String,
    #[serde(rename = "timeEpoch")]
    time_epoch: u64,
}

#[derive(Serialize)]
struct HttpDescription<'a> {
    method: &'a str,
    path: Cow<'a, str>,
    protocol: &'a str,
    #[serde(rename = "sourceIp")]
    source_ip: &'a str,
    #[serde(rename = "userAgent")]
    user_agent: Cow<'a, str>,
}

fn pairs_as_object<S: Serializer>(
    pairs: &Option<Vec<(String, String)>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let pairs = pairs.as_deref().unwrap_or_default();
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// The request's headers as format 2.0 has them: lower-case names, repeated values joined
/// with `,`, and `cookie` moved to [`Cookies`].
struct V2Headers<'a>(&'a HeaderMap);

impl Serialize for V2Headers<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for name in self.0.keys() {
            if name == http::header::COOKIE {
                continue;
            }
            let mut values = self.0.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) => {
                    map.serialize_entry(name.as_str(), &String::from_utf8_lossy(v.as_bytes()))?
                }
                _ => {
                    let mut joined = Vec::new();
                    for (i, v) in self.0.get_all(name).iter().enumerate() {
                        if i > 0 {
                            joined.push(b',');
                        }
                        joined.extend_from_slice(v.as_bytes());
                    }
                    map.serialize_entry(name.as_str(), &String::from_utf8_lossy(&joined))?
                }
            }
        }
        map.end()
    }
}

/// Every `name=value` of the request's `Cookie` headers, in order.
struct Cookies<'a>(&'a HeaderMap);

impl Cookies<'_> {
    fn each(&self) -> impl Iterator<Item = Cow<'_, str>> {
        self.0
            .get_all(http::header::COOKIE)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
            .map(|c| c.trim_ascii())
            .filter(|c| !c.is_empty())
            .map(String::from_utf8_lossy)
    }

    fn is_empty(&self) -> bool {
        self.each().next().is_none()
    }
}

impl Serialize for Cookies<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for c in self.each() {
            seq.serialize_element(&c)?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct SqsEvent<'a> {
    #[serde(rename = "Records")]
    records: [SqsRecord<'a>; 1],
}

#[derive(Serialize)]
struct SqsRecord<'a> {
    #[serde(rename = "messageId")]
    message_id: &'a str,
    #[serde(rename = "receiptHandle")]
    receipt_handle: String,
    body: Cow<'a, str>,
    attributes: SqsAttributes<'a>,
    #[serde(rename = "messageAttributes")]
    message_attributes: EmptyObject,
    #[serde(rename = "md5OfBody")]
    md5_of_body: String,
    #[serde(rename = "eventSource")]
    event_source: &'static str,
    #[serde(rename = "eventSourceARN")]
    event_source_arn: &'a str,
    #[serde(rename = "awsRegion")]
    aws_region: &'a str,
}

#[derive(Serialize)]
struct SqsAttributes<'a> {
    #[serde(rename = "ApproximateReceiveCount")]
    approximate_receive_count: Cow<'a, str>,
    #[serde(rename = "SentTimestamp")]
    sent_timestamp: String,
    #[serde(rename = "SenderId")]
    sender_id: &'static str,
    #[serde(rename = "ApproximateFirstReceiveTimestamp")]
    approximate_first_receive_timestamp: String,
}

#[derive(Serialize)]
struct ScheduledEvent<'a> {
    version: &'static str,
    id: &'a str,
    #[serde(rename = "detail-type")]
    detail_type: &'static str,
    source: &'static str,
    account: &'static str,
    time: String,
    region: &'a str,
    resources: [(); 0],
    detail: EmptyObject,
}

/// `{}`.
struct EmptyObject;

impl Serialize for EmptyObject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_map(Some(0))?.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Trigger;
    use crate::request::test_headers as headers;
    use bytes::Bytes;
    use http::HeaderValue;
    use serde_json::json;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn http(req: &Request) -> Value {
        let ctx = HttpContext {
            source_ip: "10.1.2.3",
            protocol: "HTTP/1.1",
            now: at(1_583_348_638_390),
        };
        serde_json::from_slice(&http_event(req, &ctx)).unwrap()
    }

    #[test]
    fn an_http_request_as_payload_format_2_0() {
        let req = Request::new(
            Trigger::Http,
            "POST",
            "/my/path%20x?parameter1=value1&parameter1=value2&parameter2=a+b",
            headers(&[
                ("host", "orders.example.com:8080"),
                ("user-agent", "agent"),
                ("x-multi", "a"),
                ("x-multi", "b"),
                ("cookie", "cookie1=value1; cookie2=value2"),
                ("cookie", "cookie3=value3"),
                ("x-request-id", "req-1"),
            ]),
            Bytes::from_static(b"Hello from Lambda"),
        );
        let e = http(&req);
        assert_eq!(
            e,
            json!({
                "version": "2.0",
                "routeKey": "$default",
                "rawPath": "/my/path%20x",
                "rawQueryString": "parameter1=value1&parameter1=value2&parameter2=a+b",
                "cookies": ["cookie1=value1", "cookie2=value2", "cookie3=value3"],
                "headers": {
                    "host": "orders.example.com:8080",
                    "user-agent": "agent",
                    "x-multi": "a,b",
                    "x-request-id": "req-1",
                },
                "queryStringParameters": {"parameter1": "value1,value2", "parameter2": "a b"},
                "requestContext": {
                    "accountId": "000000000000",
                    "apiId": "runr",
                    "domainName": "orders.example.com",
                    "domainPrefix": "orders",
                    "http": {
                        "method": "POST",
                        "path": "/my/path x",
                        "protocol": "HTTP/1.1",
                        "sourceIp": "10.1.2.3",
                        "userAgent": "agent",
                    },
                    "requestId": "req-1",
                    "routeKey": "$default",
                    "stage": "$default",
                    "time": "04/Mar/2020:19:03:58 +0000",
                    "timeEpoch": 1_583_348_638_390u64,
                },
                "body": "Hello from Lambda",
                "isBase64Encoded": false,
            })
        );
    }

    #[test]
    fn no_query_no_cookies_no_body_are_left_out_and_binary_is_base64() {
        let req = Request::new(Trigger::Http, "GET", "/", HeaderMap::new(), Bytes::new());
        let e = http(&req);
        for absent in ["queryStringParameters", "cookies", "body"] {
            assert!(e.get(absent).is_none(), "{absent}: {e}");
        }
        assert_eq!(e["requestContext"]["domainName"], "localhost");
        assert_eq!(e["requestContext"]["http"]["userAgent"], "");
        let req = Request::new(
            Trigger::Http,
            "PUT",
            "/bin",
            HeaderMap::new(),
            Bytes::from_static(&[0xff, 0x00, 0xfe]),
        );
        let e = http(&req);
        assert_eq!(
            (e["body"].as_str(), e["isBase64Encoded"].as_bool()),
            (Some("/wD+"), Some(true))
        );
    }

    #[test]
    fn hosts_and_paths() {
        assert_eq!(strip_port("a.example:80"), "a.example");
        assert_eq!(strip_port("[::1]:8080"), "[::1]");
        assert_eq!(strip_port("::1"), "::1");
        assert_eq!(strip_port("a.example"), "a.example");
        assert_eq!(percent_decoded("/a%2Fb%20c"), "/a/b c");
        assert_eq!(percent_decoded("/%zz%4"), "/%zz%4");
        assert_eq!(percent_decoded("/%ff"), "/%ff", "not UTF-8: as it came");
        assert_eq!(percent_decoded("/caf%C3%A9"), "/café");
    }

    fn queue_request(extra: &[(&'static str, &str)]) -> Request {
        let mut pairs = vec![
            ("ce-specversion", "1.0"),
            ("ce-id", "1728561234567-0"),
            ("ce-type", "dev.runr.queue.message"),
            ("ce-source", "/redisstream/orders/orders-api"),
            ("ce-time", "2026-10-10T12:00:00.250Z"),
            ("content-type", "application/json"),
        ];
        pairs.extend_from_slice(extra);
        Request::new(
            Trigger::Queue,
            "POST",
            "/",
            headers(&pairs),
            Bytes::from_static(br#"{"item":42}"#),
        )
    }

    #[test]
    fn a_queue_cloudevent_as_an_sqs_record() {
        let req = queue_request(&[("x-runr-delivery-attempt", "3")]);
        let (bytes, id) = sqs_event(&req, "eu-west-1", at(1_790_000_000_000));
        assert_eq!(id, "1728561234567-0");
        let e: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            e,
            json!({"Records": [{
                "messageId": "1728561234567-0",
                "receiptHandle": "runr:1728561234567-0",
                "body": "{\"item\":42}",
                "attributes": {
                    "ApproximateReceiveCount": "3",
                    "SentTimestamp": "1791633600250",
                    "SenderId": "runr",
                    "ApproximateFirstReceiveTimestamp": "1790000000000",
                },
                "messageAttributes": {},
                "md5OfBody": md5::hex_digest(br#"{"item":42}"#),
                "eventSource": "runr:queue",
                "eventSourceARN": "/redisstream/orders/orders-api",
                "awsRegion": "eu-west-1",
            }]})
        );
        // No attempt header (or a bad one): the first delivery.
        for extra in [&[][..], &[("x-runr-delivery-attempt", "x")][..]] {
            let (bytes, _) = sqs_event(&queue_request(extra), "r", at(0));
            let e: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                e["Records"][0]["attributes"]["ApproximateReceiveCount"],
                "1"
            );
        }
    }

    #[test]
    fn a_tick_as_an_eventbridge_scheduled_event() {
        let tick = runr_tick::ScheduleEvent::new();
        let req = crate::schedule::schedule_request(&tick);
        let e: Value = serde_json::from_slice(&schedule_event(&req, "runr", at(0))).unwrap();
        assert_eq!(
            e,
            json!({
                "version": "0",
                "id": tick.id,
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": "000000000000",
                "time": req.event.as_ref().unwrap()["time"],
                "region": "runr",
                "resources": [],
                "detail": {},
            })
        );
    }

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339_millis("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_millis("2020-03-04T19:03:58.390Z"),
            Some(1_583_348_638_390)
        );
        assert_eq!(
            parse_rfc3339_millis("2020-03-04T21:03:58.39+02:00"),
            Some(1_583_348_638_390)
        );
        assert_eq!(
            parse_rfc3339_millis("2020-03-04T19:03:58.390123Z"),
            Some(1_583_348_638_390)
        );
        for bad in [
            "",
            "2020-03-04",
            "2020-13-04T00:00:00Z",
            "2020-03-04T24:00:00Z",
            "2020-03-04T00:00:00",
            "2020-03-04T00:00:00.Z",
            "2020-03-04T00:00:00+0200",
            "20x0-03-04T00:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339_millis(bad), None, "{bad:?}");
        }
        // Round trip with the formatter over a range of days (leap years included).
        for day in (0..25_000u64).step_by(37) {
            let t = at(day * 86_400_000 + 45_296_000);
            assert_eq!(
                parse_rfc3339_millis(&runr_base::fmt::rfc3339(t)),
                Some(day * 86_400_000 + 45_296_000)
            );
        }
        assert_eq!(clf_time(at(0)), "01/Jan/1970:00:00:00 +0000");
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any request the server can parse becomes valid JSON of the right shape.
            #[test]
            fn any_request_gives_valid_json(
                path in "/[ -~]{0,40}",
                query in "[ -~]{0,40}",
                value in proptest::collection::vec(any::<u8>(), 0..40),
                body in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let mut h = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_bytes(&value) {
                    h.append("cookie", v.clone());
                    h.append("x-any", v.clone());
                    h.append("x-any", v);
                }
                let target = format!("{}?{}", path.replace('?', ""), query);
                let req = Request::new(Trigger::Http, "GET", &target, h, Bytes::from(body.clone()));
                let e = http(&req);
                prop_assert_eq!(e["version"].as_str(), Some("2.0"));
                let decoded = if e["isBase64Encoded"] == true {
                    base64::engine::general_purpose::STANDARD
                        .decode(e["body"].as_str().unwrap())
                        .unwrap()
                } else {
                    e["body"].as_str().unwrap_or("").as_bytes().to_vec()
                };
                prop_assert_eq!(decoded, body);
            }
        }
    }
}

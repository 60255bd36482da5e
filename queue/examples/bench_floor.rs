//! The floor of bench/queue.sh: the Redis work runr-queue does per entry (`XREADGROUP … COUNT`
//! into free slots, one `XACK` per entry, pipelined), without HTTP, without the function.
//!
//! Configured like runr-queue (`RUNR_QUEUE_REDIS_URL`, `_STREAM`, `_GROUP`, `_CONSUMER`,
//! `_CONCURRENCY`, through its own parser); exits once it has acknowledged as many entries as its
//! one argument says.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use redis::Value;

fn main() -> ExitCode {
    let Some(total) = std::env::args()
        .nth(1)
        .and_then(|n| n.parse::<usize>().ok())
    else {
        eprintln!("usage: bench_floor ENTRIES (with runr-queue's RUNR_QUEUE_* variables)");
        return ExitCode::from(2);
    };
    let config = match runr_queue::Config::from_lookup(&runr_base::env::process_lookup) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(floor(config, total)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_floor: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn floor(config: runr_queue::Config, total: usize) -> redis::RedisResult<()> {
    let client = redis::Client::open(config.redis.secret())?;
    let mut reader = client.get_multiplexed_async_connection().await?;
    let acker = client.get_multiplexed_async_connection().await?;
    let mut acked = 0;
    while acked < total {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&config.group)
            .arg(&config.consumer)
            .arg("COUNT")
            .arg(config.concurrency)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg(&config.stream)
            .arg(">")
            .query_async(&mut reader)
            .await?;
        let ids = ids(&reply);
        // One XACK per entry, as runr-queue sends them, in one round trip.
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("XACK")
                .arg(&config.stream)
                .arg(&config.group)
                .arg(id)
                .ignore();
        }
        if !ids.is_empty() {
            let mut acker = acker.clone();
            pipe.query_async::<()>(&mut acker).await?;
        }
        acked += ids.len();
    }
    Ok(())
}

/// The entry ids of an `XREADGROUP` reply.
fn ids(reply: &Value) -> Vec<Vec<u8>> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in streams {
        if let Value::Array(pair) = s {
            if let Some(Value::Array(entries)) = pair.get(1) {
                for e in entries {
                    if let Value::Array(parts) = e {
                        if let Some(Value::BulkString(id)) = parts.first() {
                            out.push(id.clone());
                        }
                    }
                }
            }
        }
    }
    out
}

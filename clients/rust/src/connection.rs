//! The connections a limiter sends through: redis-rs's multiplexed connection, its connection
//! manager (reconnects by itself: the one to use in services) and its async cluster connection.

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A redis-rs async connection a [`RateLimiter`](crate::RateLimiter) can use: cheap to clone
/// (each clone shares one multiplexed socket), `Send + Sync`.
///
/// `key` names the key whose slot a cluster connection must send to (for `RATELIMIT.CHECKALL`,
/// whose first argument is a count, not a key); the other connections ignore it.
pub trait Connection: Clone + Send + Sync + 'static {
    fn send<'a>(&'a mut self, cmd: &'a Cmd, key: Option<&'a str>) -> RedisFuture<'a, Value>;

    /// `pipe` (made with `atomic()`) as one `MULTI` ... `EXEC` to the node of `key`: `EXEC`'s
    /// reply, one value per command (an error reply among them as a `Value::ServerError`).
    fn send_transaction<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        key: Option<&'a str>,
    ) -> RedisFuture<'a, Value>;

    /// Whether this is a cluster connection (the library is loaded on every primary).
    fn is_cluster(&self) -> bool {
        false
    }
}

macro_rules! single_node {
    ($type:ty) => {
        impl Connection for $type {
            fn send<'a>(
                &'a mut self,
                cmd: &'a Cmd,
                _key: Option<&'a str>,
            ) -> RedisFuture<'a, Value> {
                self.req_packed_command(cmd)
            }

            fn send_transaction<'a>(
                &'a mut self,
                pipe: &'a Pipeline,
                _key: Option<&'a str>,
            ) -> RedisFuture<'a, Value> {
                Box::pin(async move {
                    // MULTI's OK and each QUEUED are skipped: EXEC's reply is the last.
                    let mut replies = self.req_packed_commands(pipe, pipe.len() + 1, 1).await?;
                    Ok(replies.pop().unwrap_or(Value::Nil))
                })
            }
        }
    };
}

single_node!(MultiplexedConnection);
single_node!(ConnectionManager);

fn node(key: &str) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::new(slot(key.as_bytes()), SlotAddr::Master))
}

fn route(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(node(key))
}

impl Connection for ClusterConnection {
    fn send<'a>(&'a mut self, cmd: &'a Cmd, key: Option<&'a str>) -> RedisFuture<'a, Value> {
        match key {
            Some(key) => Box::pin(self.route_command(cmd, route(key))),
            None => self.req_packed_command(cmd),
        }
    }

    fn send_transaction<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        key: Option<&'a str>,
    ) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let offset = pipe.len() + 1;
            let mut replies = match key {
                Some(key) => self.route_pipeline(pipe, offset, 1, node(key)).await?,
                None => self.req_packed_commands(pipe, offset, 1).await?,
            };
            Ok(replies.pop().unwrap_or(Value::Nil))
        })
    }

    fn is_cluster(&self) -> bool {
        true
    }
}

/// The hash slot of `key`: CRC16/XMODEM of its hash tag (the first non-empty `{...}`) or of the
/// whole key, mod 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

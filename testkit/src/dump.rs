//! DUMP payloads of module values, taken apart and put back together with a valid CRC, so that
//! tests can hand the module's rdb_load corrupt limiters that Redis itself lets through.

use redis::{Connection, Value};

use super::send_one;

/// CRC-64/Jones as Redis computes the DUMP trailer (reflected, polynomial 0xad93d23594c935a9,
/// init 0, no final xor).
pub fn crc64(bytes: &[u8]) -> u64 {
    const REFLECTED_POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &byte in bytes {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ REFLECTED_POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// `body` (a DUMP payload without its CRC) with its CRC-64 trailer appended.
pub fn with_crc(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// An RDB length at `pos`: (value, bytes it took). `None` for the encoded-string forms.
fn read_rdb_len(bytes: &[u8], pos: usize) -> Option<(u64, usize)> {
    let first = *bytes.get(pos)?;
    match first >> 6 {
        0 => Some((u64::from(first & 0x3f), 1)),
        1 => Some((
            (u64::from(first & 0x3f) << 8) | u64::from(*bytes.get(pos + 1)?),
            2,
        )),
        _ if first == 0x80 => {
            let b: [u8; 4] = bytes.get(pos + 1..pos + 5)?.try_into().ok()?;
            Some((u64::from(u32::from_be_bytes(b)), 5))
        }
        _ if first == 0x81 => {
            let b: [u8; 8] = bytes.get(pos + 1..pos + 9)?.try_into().ok()?;
            Some((u64::from_be_bytes(b), 9))
        }
        _ => None,
    }
}

fn write_rdb_len(len: usize) -> Vec<u8> {
    if len < 64 {
        vec![len as u8]
    } else if len < 16_384 {
        vec![0x40 | (len >> 8) as u8, len as u8]
    } else {
        let mut out = vec![0x80];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out
    }
}

/// A module value's DUMP payload (with `rdbcompression no`), split around the limiter's bytes.
pub struct Dump {
    /// Type byte, module id, string opcode: everything before the buffer's length.
    pub head: Vec<u8>,
    /// The limiter's encoding, as the module's rdb_save wrote it.
    pub limiter: Vec<u8>,
    /// EOF opcode and RDB version, before the CRC.
    pub tail: Vec<u8>,
}

impl Dump {
    pub fn parse(payload: &[u8]) -> Dump {
        const RDB_TYPE_MODULE_2: u8 = 7;
        const OPCODE_STRING: u64 = 5;
        assert_eq!(payload[0], RDB_TYPE_MODULE_2, "a module value: {payload:?}");
        let (_, id_len) = read_rdb_len(payload, 1).expect("the module id");
        let opcode_at = 1 + id_len;
        let (opcode, opcode_len) = read_rdb_len(payload, opcode_at).expect("an opcode");
        assert_eq!(opcode, OPCODE_STRING, "a string buffer first: {payload:?}");
        let len_at = opcode_at + opcode_len;
        let (len, len_len) =
            read_rdb_len(payload, len_at).expect("a plain string (rdbcompression no)");
        let start = len_at + len_len;
        let end = start + len as usize;
        Dump {
            head: payload[..len_at].to_vec(),
            limiter: payload[start..end].to_vec(),
            tail: payload[end..payload.len() - 8].to_vec(),
        }
    }

    /// A payload holding `limiter` instead, its length and CRC made valid.
    pub fn with_limiter(&self, limiter: &[u8]) -> Vec<u8> {
        let mut body = self.head.clone();
        body.extend(write_rdb_len(limiter.len()));
        body.extend_from_slice(limiter);
        body.extend_from_slice(&self.tail);
        with_crc(body)
    }

    /// Where the limiter's bytes start in the payload.
    pub fn limiter_at(&self) -> usize {
        self.head.len() + write_rdb_len(self.limiter.len()).len()
    }

    /// The payload without its CRC.
    pub fn body(&self) -> Vec<u8> {
        let mut body = self.head.clone();
        body.extend(write_rdb_len(self.limiter.len()));
        body.extend_from_slice(&self.limiter);
        body.extend_from_slice(&self.tail);
        body
    }
}

/// `RESTORE key <expires_at_ms> payload REPLACE ABSTTL` (0: no expiry): the reply, an error
/// included. The expiry matters to DEBUG DIGEST-VALUE.
pub fn restore(con: &mut Connection, key: &str, expires_at_ms: i64, payload: &[u8]) -> Value {
    send_one(
        con,
        redis::cmd("RESTORE")
            .arg(key)
            .arg(expires_at_ms.max(0))
            .arg(payload)
            .arg("REPLACE")
            .arg("ABSTTL"),
    )
}

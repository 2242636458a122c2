//! A minimal RESP2 client for pipelined bulk work (filling keyspaces, scripted call sequences):
//! one writer thread streams pre-encoded commands while this thread reads the replies, so the
//! server never waits for the client between batches.

use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The first element of an array reply as an integer (CHECK's `allowed`), if it is one.
    pub fn allowed(&self) -> Option<i64> {
        match self {
            Reply::Array(Some(items)) => match items.first() {
                Some(Reply::Int(n)) => Some(*n),
                _ => None,
            },
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }
}

/// Appends one command in RESP to `out`.
pub fn encode<S: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[S]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one reply.
pub fn read_reply<R: BufRead>(reader: &mut R) -> io::Result<Reply> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if line.len() < 3 || !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
    let number = || -> io::Result<i64> {
        body.parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP {body:?}")))
    };
    Ok(match line[0] {
        b'+' => Reply::Status(body.clone()),
        b'-' => Reply::Error(body.clone()),
        b':' => Reply::Int(number()?),
        b'$' => {
            let len = number()?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let mut data = vec![0; len as usize + 2];
                reader.read_exact(&mut data)?;
                data.truncate(len as usize);
                Reply::Bulk(Some(data))
            }
        }
        b'*' => {
            let len = number()?;
            if len < 0 {
                Reply::Array(None)
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Reply::Array(Some(items))
            }
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown RESP type byte {other:#x}"),
            ))
        }
    })
}

/// What a pipelined batch answered.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    pub replies: u64,
    /// Replies whose first integer (CHECK's `allowed`) was 1 / 0.
    pub allowed: u64,
    pub rejected: u64,
    /// The first error reply, if any.
    pub first_error: Option<String>,
}

/// Reads one reply without keeping it: its kind, and the first integer of an array (CHECK's
/// `allowed`) or the integer itself. Reuses `line`; allocates only for an error.
pub fn skim_reply<R: BufRead>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> io::Result<Result<Option<i64>, String>> {
    let (kind, n) = read_line(reader, line)?;
    Ok(match kind {
        b'-' => Err(String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned()),
        b':' => Ok(Some(n)),
        b'$' => {
            if n >= 0 {
                let mut rest = (n + 2) as usize;
                while rest > 0 {
                    let chunk = reader.fill_buf()?;
                    if chunk.is_empty() {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let take = chunk.len().min(rest);
                    reader.consume(take);
                    rest -= take;
                }
            }
            Ok(None)
        }
        b'*' => {
            let mut first = None;
            for i in 0..n.max(0) {
                let item = skim_reply(reader, line)?;
                if i == 0 {
                    first = item.ok().flatten();
                }
            }
            Ok(first)
        }
        _ => Ok(None),
    })
}

/// Reads one line into `line`: its type byte and, for `:`, `$` and `*`, its number.
fn read_line<R: BufRead>(reader: &mut R, line: &mut Vec<u8>) -> io::Result<(u8, i64)> {
    line.clear();
    reader.read_until(b'\n', line)?;
    if line.len() < 3 || !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    let kind = line[0];
    let mut n: i64 = 0;
    if matches!(kind, b':' | b'$' | b'*') {
        let digits = &line[1..line.len() - 2];
        let (negative, digits) = match digits.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, digits),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad RESP number",
            ));
        }
        for d in digits {
            n = n.wrapping_mul(10).wrapping_add(i64::from(d - b'0'));
        }
        if negative {
            n = -n;
        }
    }
    Ok((kind, n))
}

/// Sends `count` commands that `produce(i, buf)` appends to `buf` in RESP, pipelined on a fresh
/// connection, and reads every reply.
pub fn pipeline<F>(port: u16, count: u64, produce: F) -> io::Result<BatchOutcome>
where
    F: Fn(u64, &mut Vec<u8>) + Send + 'static,
{
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let writer_stream = stream.try_clone()?;
    let writer = thread::spawn(move || -> io::Result<()> {
        let mut out = BufWriter::with_capacity(1 << 16, writer_stream);
        let mut buf = Vec::with_capacity(1 << 16);
        for i in 0..count {
            produce(i, &mut buf);
            if buf.len() >= 1 << 15 {
                out.write_all(&buf)?;
                buf.clear();
            }
        }
        out.write_all(&buf)?;
        out.flush()
    });
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let mut line = Vec::with_capacity(64);
    let mut outcome = BatchOutcome::default();
    let mut read_error = None;
    for _ in 0..count {
        match skim_reply(&mut reader, &mut line) {
            Ok(reply) => {
                outcome.replies += 1;
                match reply {
                    Err(message) => {
                        outcome.first_error.get_or_insert(message);
                    }
                    Ok(Some(1)) => outcome.allowed += 1,
                    Ok(Some(0)) => outcome.rejected += 1,
                    Ok(_) => {}
                }
            }
            Err(e) => {
                read_error = Some(e);
                break;
            }
        }
    }
    let written = writer
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("writer thread panicked")));
    if let Some(e) = read_error {
        return Err(e);
    }
    written?;
    Ok(outcome)
}

/// One command on a fresh connection.
pub fn call<S: AsRef<[u8]>>(port: u16, args: &[S]) -> io::Result<Reply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut buf = Vec::new();
    encode(&mut buf, args);
    stream.write_all(&buf)?;
    read_reply(&mut BufReader::new(stream))
}

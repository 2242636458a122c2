//! A minimal RESP client: pipelined bulk work (filling keyspaces, scripted call sequences), where
//! one writer thread streams pre-encoded commands while this thread reads the replies, so the
//! server never waits for the client between batches; and [`drive`], a load generator shaped
//! like redis-benchmark's (clients each sending batches of `pipeline` commands) that can speak
//! RESP3 (`HELLO 3` first), which redis-benchmark cannot. Replies are read in RESP2 and RESP3.

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
    /// RESP3: a map, a boolean, a null, a double (as sent).
    Map(Vec<(Reply, Reply)>),
    Bool(bool),
    Null,
    Double(String),
}

impl Reply {
    /// The first element of an array reply as an integer (CHECK's `allowed`), or the first
    /// value of a map reply (CHECK's `allowed` under RESP3, a boolean taken as 1 or 0), if it is
    /// one.
    pub fn allowed(&self) -> Option<i64> {
        match self {
            Reply::Array(Some(items)) => items.first().and_then(Reply::allowed_scalar),
            Reply::Map(pairs) => pairs.first().and_then(|(_, v)| v.allowed_scalar()),
            other => other.allowed_scalar(),
        }
    }

    fn allowed_scalar(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Bool(b) => Some(i64::from(*b)),
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
        b'#' => Reply::Bool(body == "t"),
        b'_' => Reply::Null,
        b',' => Reply::Double(body.clone()),
        b'(' => Reply::Status(body.clone()),
        b'%' => {
            let len = number()?.max(0);
            let mut pairs = Vec::with_capacity(len as usize);
            for _ in 0..len {
                let key = read_reply(reader)?;
                pairs.push((key, read_reply(reader)?));
            }
            Reply::Map(pairs)
        }
        b'|' => {
            // Attributes: skipped, the reply follows.
            for _ in 0..2 * number()?.max(0) {
                read_reply(reader)?;
            }
            read_reply(reader)?
        }
        b'$' | b'=' | b'!' => {
            let len = number()?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let mut data = vec![0; len as usize + 2];
                reader.read_exact(&mut data)?;
                data.truncate(len as usize);
                if line[0] == b'!' {
                    Reply::Error(String::from_utf8_lossy(&data).into_owned())
                } else {
                    Reply::Bulk(Some(data))
                }
            }
        }
        b'*' | b'~' | b'>' => {
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
/// `allowed`) or the integer itself; under RESP3 the first value of a map (CHECK's `allowed`),
/// a boolean counting as 1 or 0. Reuses `line`; allocates only for an error.
pub fn skim_reply<R: BufRead>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> io::Result<Result<Option<i64>, String>> {
    let (kind, n) = read_line(reader, line)?;
    Ok(match kind {
        b'-' => Err(String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned()),
        b':' => Ok(Some(n)),
        b'#' => Ok(Some(i64::from(line.get(1) == Some(&b't')))),
        b'$' | b'=' | b'!' => {
            let start = line.len();
            if n >= 0 {
                let mut rest = (n + 2) as usize;
                while rest > 0 {
                    let chunk = reader.fill_buf()?;
                    if chunk.is_empty() {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let take = chunk.len().min(rest);
                    if line[0] == b'!' {
                        line.extend_from_slice(&chunk[..take]);
                    }
                    reader.consume(take);
                    rest -= take;
                }
            }
            if line[0] == b'!' {
                let text = &line[start..line.len().saturating_sub(2).max(start)];
                return Ok(Err(String::from_utf8_lossy(text).into_owned()));
            }
            Ok(None)
        }
        b'*' | b'~' | b'>' | b'%' => {
            // A map's items are its keys and values in turn: its first value is item 1.
            let (items, wanted) = if kind == b'%' { (2 * n, 1) } else { (n, 0) };
            let mut first = None;
            let mut error = None;
            for i in 0..items.max(0) {
                let item = skim_reply(reader, line)?;
                match item {
                    Err(e) => {
                        error.get_or_insert(e);
                    }
                    Ok(value) if i == wanted => first = value,
                    Ok(_) => {}
                }
            }
            error.map_or(Ok(first), Err)
        }
        b'|' => {
            for _ in 0..2 * n.max(0) {
                let _ = skim_reply(reader, line)?;
            }
            skim_reply(reader, line)?
        }
        _ => Ok(None),
    })
}

/// Reads one line into `line`: its type byte and, for integers, lengths and counts, its number.
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
    if matches!(
        kind,
        b':' | b'$' | b'*' | b'%' | b'~' | b'>' | b'=' | b'!' | b'|'
    ) {
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

/// How [`drive`] loads a server.
#[derive(Clone, Debug)]
pub struct Load {
    pub port: u16,
    pub clients: usize,
    pub pipeline: usize,
    /// 2, or 3 for clients that send `HELLO 3` before their first command.
    pub protocol: u8,
    /// Calls in all.
    pub calls: u64,
    /// `Some(n)`: each call gets a key number drawn at random below `n`, as redis-benchmark's
    /// `-r n` does; `None`: number 0 for every call.
    pub keyspace: Option<u64>,
    /// Run on this CPU (`sched_setaffinity`), if any.
    pub cpu: Option<usize>,
}

/// What a [`drive`] run did.
#[derive(Debug, Default)]
pub struct DriveOutcome {
    pub batch: BatchOutcome,
    /// From the first command sent to the last reply read (connecting and `HELLO` excluded).
    pub seconds: f64,
}

/// Sends `load.calls` commands from `load.clients` connections (`HELLO 3` first on each when
/// `load.protocol` is 3), each keeping one batch of `load.pipeline` commands in flight at a time
/// as redis-benchmark's clients do; `produce(key_number, buf)` appends one command in RESP.
/// `ready` runs once every connection is open (and has switched protocol), just before the first
/// command is sent. One thread serves every connection in turn: it reads a client's replies and
/// sends its next batch at once, while the server works through the other clients' batches.
pub fn drive<F, R>(load: &Load, produce: F, ready: R) -> io::Result<DriveOutcome>
where
    F: Fn(u64, &mut Vec<u8>) + Send + 'static,
    R: FnOnce() -> io::Result<()> + Send + 'static,
{
    let load = load.clone();
    thread::spawn(move || drive_here(&load, produce, ready))
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("load thread panicked")))
}

fn drive_here<F, R>(load: &Load, produce: F, ready: R) -> io::Result<DriveOutcome>
where
    F: Fn(u64, &mut Vec<u8>),
    R: FnOnce() -> io::Result<()>,
{
    if let Some(cpu) = load.cpu {
        pin_this_thread(cpu)?;
    }
    let mut connections = Vec::with_capacity(load.clients);
    let mut line = Vec::with_capacity(64);
    for _ in 0..load.clients.max(1) {
        let stream = TcpStream::connect(("127.0.0.1", load.port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::with_capacity(1 << 16, stream);
        if load.protocol == 3 {
            let mut hello = Vec::new();
            encode(&mut hello, &["HELLO", "3"]);
            writer.write_all(&hello)?;
            if let Err(e) = skim_reply(&mut reader, &mut line)? {
                return Err(io::Error::other(format!("HELLO 3: {e}")));
            }
        }
        connections.push((writer, reader, 0u64));
    }
    ready()?;
    // xorshift64*: redis-benchmark draws its keys with random(); any uniform draw will do.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next_key = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        load.keyspace.map_or(0, |n| (r >> 11) % n.max(1))
    };
    let mut outcome = DriveOutcome::default();
    let mut unsent = load.calls;
    let mut buf = Vec::with_capacity(1 << 14);
    let started = std::time::Instant::now();
    let mut send = |writer: &mut TcpStream, unsent: &mut u64| -> io::Result<u64> {
        let n = (*unsent).min(load.pipeline.max(1) as u64);
        buf.clear();
        for _ in 0..n {
            produce(next_key(), &mut buf);
        }
        writer.write_all(&buf)?;
        *unsent -= n;
        Ok(n)
    };
    for (writer, _, in_flight) in connections.iter_mut() {
        *in_flight = send(writer, &mut unsent)?;
    }
    let mut busy = true;
    while busy {
        busy = false;
        for (writer, reader, in_flight) in connections.iter_mut() {
            if *in_flight == 0 {
                continue;
            }
            for _ in 0..*in_flight {
                outcome.batch.replies += 1;
                match skim_reply(reader, &mut line)? {
                    Err(message) => {
                        outcome.batch.first_error.get_or_insert(message);
                    }
                    Ok(Some(1)) => outcome.batch.allowed += 1,
                    Ok(Some(0)) => outcome.batch.rejected += 1,
                    Ok(_) => {}
                }
            }
            *in_flight = send(writer, &mut unsent)?;
            busy |= *in_flight > 0;
        }
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// Runs the calling thread on `cpu` alone.
fn pin_this_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it; sched_setaffinity
    // reads it (pid 0: the calling thread).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

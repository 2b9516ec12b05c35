//! The server side of HTTP/1.1 for `tiderec serve`, on a std `TcpStream`:
//! enough for its three routes (a request head, a `Content-Length` or
//! chunked body, a response with `Content-Length`), nothing more.
//!
//! Invariants:
//! * Every read happens before a deadline: the socket's read timeout is set
//!   to the time left before each read, so a client sending one byte at a
//!   time cannot stretch a request past it ([`HttpError::Timeout`]). The
//!   head (each read within a line included), a chunked body, its size
//!   lines and its trailers are read under the same deadline as a
//!   `Content-Length` body.
//! * Every write is done before a deadline the same way (the socket's write
//!   timeout set to the time left before each write), so a client taking a
//!   response a few bytes at a time cannot stretch it past the deadline.
//! * A head is at most [`MAX_HEAD`] bytes; a `Content-Length` body is read
//!   only once its announced length is known to be within the caller's
//!   limit.
//! * A body's buffer grows only with the bytes received, never for bytes
//!   announced (a `Content-Length`, a chunk's size) and not sent: it grows
//!   once bytes are there to fill it, by what they need or by doubling what
//!   it holds (up to the announced length, or the limit for a chunked body),
//!   and only after the caller's `grow` accepts the bytes it adds. Its
//!   capacity is what `grow` accepted, at most about twice what arrived.
//! * A chunked body ([`read_chunked`]) never holds more than the caller's
//!   limit: each chunk's size is checked against it when its size line is
//!   read, before its data (over it: [`ChunkedError::TooLarge`], the rest is
//!   not read). A size line is at most [`MAX_CHUNK_LINE`] bytes and
//!   the trailers (read and ignored) at most [`MAX_HEAD`]; every line ends
//!   in CRLF. Any bytes give a body or a typed error, never a panic.
//! * A head is read one way only (RFC 9112 §5, against request smuggling):
//!   a header line starting with white space (obsolete folding), a field
//!   name that is not a token (white space before its `:` included), a bare
//!   CR, and a `Content-Length` that is not decimal digits alone (a sign, a
//!   list) are refused (`400`), never read past.
//! * A request gives its body's length one way: `Content-Length` and a
//!   `Transfer-Encoding` together are refused (`400`), as is a
//!   `Transfer-Encoding` other than `chunked` (`identity` aside), which is
//!   not read ([`Transfer::Unsupported`], `501`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Largest request head (request line and headers), and largest trailer section of a chunked body.
pub const MAX_HEAD: usize = 16 << 10;

/// Largest chunk size line of a chunked body (the size, its extensions and CRLF).
pub const MAX_CHUNK_LINE: usize = 4 << 10;

/// Why a request could not be read.
#[derive(Debug, Error)]
pub enum HttpError {
    /// The client closed the connection before a request started.
    #[error("the client closed the connection")]
    Closed,
    /// The request was not received before its deadline.
    #[error("the request was not received within the read timeout")]
    Timeout,
    /// A head over [`MAX_HEAD`] bytes.
    #[error("a request head over {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// A malformed head, or a malformed chunked body.
    #[error("a bad request: {0}")]
    Bad(String),
    /// A request of an HTTP version other than 1.0 and 1.1 (`505`).
    #[error("the HTTP version {0:?} is not supported (send HTTP/1.1 or HTTP/1.0)")]
    Version(String),
    /// A chunked body grew over the caller's limit.
    #[error("request body over {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The caller's `grow` refused more bytes of a body.
    #[error("no memory left for the request body")]
    Refused,
    /// The connection failed.
    #[error("cannot read the request: {0}")]
    Io(#[source] std::io::Error),
}

/// A request's head, as far as `serve` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// `GET`, `POST`, ….
    pub method: String,
    /// The target without its query.
    pub path: String,
    /// `Content-Length`, if given.
    pub content_length: Option<usize>,
    /// `Transfer-Encoding`.
    pub transfer: Transfer,
    /// The connection closes after the response (`Connection: close`, or HTTP/1.0).
    pub close: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
}

/// A request's `Transfer-Encoding`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// None given, or only `identity`.
    Identity,
    /// `chunked`.
    Chunked,
    /// Any other coding (the codings as given, `identity` left out).
    Unsupported(String),
}

impl Transfer {
    /// The transfer of the codings `given` across every `Transfer-Encoding` header.
    fn of(given: &[String]) -> Transfer {
        let codings: Vec<&str> =
            given.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|c| !c.is_empty()).collect();
        let codings: Vec<&str> = codings.into_iter().filter(|c| !c.eq_ignore_ascii_case("identity")).collect();
        match codings.as_slice() {
            [] => Transfer::Identity,
            [c] if c.eq_ignore_ascii_case("chunked") => Transfer::Chunked,
            _ => Transfer::Unsupported(codings.join(", ")),
        }
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// Sets the read timeout of `reader`'s socket to the time left before `deadline`.
fn arm(reader: &BufReader<TcpStream>, deadline: Instant) -> Result<(), HttpError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HttpError::Timeout);
    }
    reader.get_ref().set_read_timeout(Some(left)).map_err(HttpError::Io)
}

/// Waits until a request's first byte arrives (`Ok(true)`), the client closes (`Ok(false)`),
/// `idle` passes or `stop()` says so (`Ok(false)`), looking at `stop` every 100 ms. With `stop()`
/// set, a request whose bytes have already arrived is still taken (`Ok(true)`).
pub fn wait_for_request(
    reader: &mut BufReader<TcpStream>,
    idle: Duration,
    stop: impl Fn() -> bool,
) -> Result<bool, HttpError> {
    let deadline = Instant::now() + idle;
    loop {
        if !reader.buffer().is_empty() {
            return Ok(true);
        }
        if stop() {
            // A request already sent (its bytes in the socket's buffer) is still answered.
            return ready_now(reader);
        }
        let slice = Duration::from_millis(100).min(deadline.saturating_duration_since(Instant::now()));
        if slice.is_zero() {
            return Ok(false);
        }
        reader.get_ref().set_read_timeout(Some(slice)).map_err(HttpError::Io)?;
        match reader.fill_buf() {
            Ok(b) => return Ok(!b.is_empty()),
            Err(e) if timed_out(&e) || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HttpError::Io(e)),
        }
    }
}

/// Whether bytes (or the client's close) wait on `reader`'s socket now, read into its buffer
/// without waiting: `Ok(true)` when a request has started.
fn ready_now(reader: &mut BufReader<TcpStream>) -> Result<bool, HttpError> {
    reader.get_ref().set_nonblocking(true).map_err(HttpError::Io)?;
    let filled = reader.fill_buf().map(|b| !b.is_empty());
    reader.get_ref().set_nonblocking(false).map_err(HttpError::Io)?;
    match filled {
        Ok(started) => Ok(started),
        Err(e) if timed_out(&e) || e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(HttpError::Io(e)),
    }
}

/// Reads one request head before `deadline`: every read of it, however few bytes each brings,
/// waits at most the time left, so a head trickled a byte at a time ends at the deadline.
pub fn read_head(reader: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Head, HttpError> {
    let (head, lines) = read_head_lines(&mut Timed { reader, deadline })?;
    parse_head(&head, &lines)
}

/// A head's bytes and the range of each of its lines in them.
type HeadLines = (Vec<u8>, Vec<(usize, usize)>);

/// The bytes of one request head from `input` and the range of each of its lines (the blank
/// line that ends it left out, as are blank lines before the request line).
fn read_head_lines(input: &mut impl BufRead) -> Result<HeadLines, HttpError> {
    let mut head = Vec::new();
    let mut lines: Vec<(usize, usize)> = Vec::new();
    loop {
        let start = head.len();
        let room = (MAX_HEAD + 1).saturating_sub(start) as u64;
        match input.by_ref().take(room).read_until(b'\n', &mut head) {
            Ok(0) if start == 0 => return Err(HttpError::Closed),
            Ok(0) => return Err(HttpError::Bad("the connection closed inside the request head".into())),
            Ok(_) => {}
            Err(e) if timed_out(&e) => return Err(HttpError::Timeout),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HttpError::Io(e)),
        }
        if head.len() > MAX_HEAD {
            return Err(HttpError::HeadTooLarge);
        }
        if head.last() != Some(&b'\n') {
            // The end of the stream cut the line: the next read says so.
            continue;
        }
        let line = &head[start..];
        let blank = line == b"\r\n" || line == b"\n";
        match (blank, lines.is_empty()) {
            (true, true) => head.truncate(start), // empty lines before a request line
            (true, false) => return Ok((head, lines)),
            (false, _) => lines.push((start, head.len())),
        }
    }
}

/// A line of a head without its line end (LF, or CRLF); a CR anywhere else is refused, as
/// RFC 9112 asks (a bare CR is read as a line end by some and not by others).
fn head_line(bytes: &[u8]) -> Result<&str, HttpError> {
    let text = std::str::from_utf8(bytes).map_err(|_| HttpError::Bad("a request head that is not UTF-8".into()))?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.contains('\r') {
        return Err(HttpError::Bad(format!("the head line {text:?} holds a bare CR")));
    }
    Ok(text)
}

/// A character of a token (RFC 9110 §5.6.2), which a field name is.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The name and value (without the white space around it) of a header line. Refused with
/// [`HttpError::Bad`], as RFC 9112 §5 asks, where a proxy could read the line otherwise: a line
/// starting with white space (obsolete line folding, the rest of the line before), and a name
/// that is not a token, white space before the `:` included.
fn header(line: &str) -> Result<(&str, &str), HttpError> {
    if line.starts_with([' ', '\t']) {
        return Err(HttpError::Bad(format!(
            "the header line {line:?} starts with white space (obsolete line folding is not accepted)"
        )));
    }
    let Some((name, value)) = line.split_once(':') else {
        return Err(HttpError::Bad(format!("the header line {line:?} has no `:`")));
    };
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(HttpError::Bad(format!(
            "the header name {name:?} is not a token (no white space is allowed before the `:`)"
        )));
    }
    Ok((name, value.trim_matches([' ', '\t'])))
}

/// A `Content-Length` value: decimal digits only (no sign, no white space inside, no list).
fn content_length(value: &str) -> Result<usize, HttpError> {
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| value.parse().ok()).flatten().ok_or_else(|| {
        HttpError::Bad(format!("the Content-Length {value:?} is not a number of bytes (decimal digits only)"))
    })
}

/// Whether the version of a request line is `HTTP/1.0` (`true`) or `HTTP/1.1` (`false`); any
/// other `HTTP/<digit>.<digit>` is [`HttpError::Version`] (`505`), anything else is
/// [`HttpError::Bad`].
fn http_version(version: &str) -> Result<bool, HttpError> {
    match version {
        "HTTP/1.0" => Ok(true),
        "HTTP/1.1" => Ok(false),
        _ => match version.strip_prefix("HTTP/").map(str::as_bytes) {
            Some([major, b'.', minor]) if major.is_ascii_digit() && minor.is_ascii_digit() => {
                Err(HttpError::Version(version.to_string()))
            }
            _ => Err(HttpError::Bad(format!("{version:?} is not an HTTP version (HTTP/1.1 or HTTP/1.0)"))),
        },
    }
}

fn parse_head(head: &[u8], lines: &[(usize, usize)]) -> Result<Head, HttpError> {
    let text = |&(a, b): &(usize, usize)| head_line(&head[a..b]);
    let request = text(&lines[0])?;
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Bad(format!("the request line {request:?} is not `METHOD TARGET HTTP/1.x`")));
    };
    let http10 = http_version(version)?;
    let mut out = Head {
        method: method.to_string(),
        path: target.split('?').next().unwrap_or(target).to_string(),
        content_length: None,
        transfer: Transfer::Identity,
        close: false,
        expect_continue: false,
    };
    let mut codings = Vec::new();
    let (mut close, mut keep_alive) = (false, false);
    for line in &lines[1..] {
        let (name, value) = header(text(line)?)?;
        if name.eq_ignore_ascii_case("content-length") {
            let n = content_length(value)?;
            if out.content_length.is_some_and(|m| m != n) {
                return Err(HttpError::Bad("two different Content-Length headers".into()));
            }
            out.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            codings.push(value.to_string());
        } else if name.eq_ignore_ascii_case("connection") {
            // A list of options (RFC 9110 §7.6.1): `close` anywhere in it closes.
            for option in value.split(',').map(|o| o.trim_matches([' ', '\t'])) {
                close |= option.eq_ignore_ascii_case("close");
                keep_alive |= option.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("expect") {
            out.expect_continue = value.eq_ignore_ascii_case("100-continue");
        }
    }
    // HTTP/1.1 keeps the connection unless asked to close it, HTTP/1.0 closes it unless asked
    // to keep it.
    out.close = close || (http10 && !keep_alive);
    out.transfer = Transfer::of(&codings);
    if out.content_length.is_some() && out.transfer != Transfer::Identity {
        return Err(HttpError::Bad(
            "both Content-Length and Transfer-Encoding (a request gives its body's length one way)".into(),
        ));
    }
    Ok(out)
}

/// Reads a body of `length` bytes (within the caller's limit) before `deadline`, its buffer
/// growing with the bytes received (see [`read_sized`]).
pub fn read_body(
    reader: &mut BufReader<TcpStream>,
    length: usize,
    deadline: Instant,
    grow: impl FnMut(usize) -> bool,
) -> Result<Vec<u8>, HttpError> {
    read_sized(&mut Timed { reader, deadline }, length, grow)
}

/// Reads a body of exactly `length` bytes from `input`. Its buffer grows only once bytes are
/// there to fill it (by what they need, or by doubling, up to `length`), each time after
/// `grow(n)` accepts the `n` bytes it adds: a body announced and not sent holds nothing.
fn read_sized(
    input: &mut impl BufRead,
    length: usize,
    mut grow: impl FnMut(usize) -> bool,
) -> Result<Vec<u8>, HttpError> {
    let mut body = Growing::new(length);
    while body.len() < length {
        let available = match input.fill_buf() {
            Ok([]) => return Err(HttpError::Closed),
            Ok(available) => available,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        let take = available.len().min(length - body.len());
        if !body.append(&available[..take], &mut grow) {
            return Err(HttpError::Refused);
        }
        input.consume(take);
    }
    Ok(body.into_bytes())
}

/// A body read as its bytes arrive: its buffer grows to hold the bytes appended, by doubling
/// (up to `max`), each growth accepted by the caller first; its capacity is what was accepted.
struct Growing {
    bytes: Vec<u8>,
    /// The bytes `grow` accepted: the buffer's capacity.
    reserved: usize,
    max: usize,
}

impl Growing {
    /// An empty body of at most `max` bytes, holding no buffer yet.
    fn new(max: usize) -> Growing {
        Growing { bytes: Vec::new(), reserved: 0, max }
    }

    fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends `more` (which must keep the body within `max`), growing the buffer first if it
    /// is too small: to what it needs, or twice what it holds (up to `max`), once `grow`
    /// accepts the bytes added; `false` (nothing appended) when it does not.
    fn append(&mut self, more: &[u8], grow: &mut impl FnMut(usize) -> bool) -> bool {
        let len = self.bytes.len() + more.len();
        if len > self.reserved {
            let target = len.max(self.reserved.saturating_mul(2).min(self.max));
            if !grow(target - self.reserved) {
                return false;
            }
            self.bytes.reserve_exact(target - self.bytes.len());
            self.reserved = target;
        }
        self.bytes.extend_from_slice(more);
        true
    }

    fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// The error of a failed read of a request's body: its deadline passed, the client closed the
/// connection, or the connection failed.
fn read_error(e: std::io::Error) -> HttpError {
    match e.kind() {
        _ if timed_out(&e) => HttpError::Timeout,
        std::io::ErrorKind::UnexpectedEof => HttpError::Closed,
        _ => HttpError::Io(e),
    }
}

/// Why a chunked body could not be read ([`read_chunked`]).
#[derive(Debug, Error)]
pub enum ChunkedError {
    /// The body breaks the chunked syntax; the message says where.
    #[error("a malformed chunked body: {0}")]
    Malformed(String),
    /// The body grew over the limit.
    #[error("request body over {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// `grow` refused the bytes the next chunk adds.
    #[error("no memory left for the request body")]
    Refused,
    /// The input failed or ended early.
    #[error("cannot read the chunked body: {0}")]
    Io(#[source] std::io::Error),
}

/// Reads one chunked body (RFC 9112 §7.1) from `input`: size lines in hex with optional
/// extensions, each chunk's data and CRLF, the last (zero) chunk and the trailers, which
/// are read and ignored. The body is at most `max` bytes; its buffer grows only with the
/// data received, not for a chunk's announced size, and before it grows by `n` bytes,
/// `grow(n)` must accept them (the buffer's capacity is what was accepted).
pub fn read_chunked(
    input: &mut impl BufRead,
    max: usize,
    mut grow: impl FnMut(usize) -> bool,
) -> Result<Vec<u8>, ChunkedError> {
    // Doubling (up to `max`) keeps a body of many small chunks from copying itself at every
    // chunk.
    let mut body = Growing::new(max);
    loop {
        let line = read_crlf_line(input, MAX_CHUNK_LINE, "a chunk size line")?;
        let size = chunk_size(&line)?;
        if size == 0 {
            read_trailers(input)?;
            return Ok(body.into_bytes());
        }
        body.len().checked_add(size).filter(|&n| n <= max).ok_or(ChunkedError::TooLarge { max })?;
        read_chunk_data(input, &mut body, size, &mut grow)?;
        let mut end = [0u8; 2];
        read_exact_buf(input, &mut end)?;
        if end != *b"\r\n" {
            return Err(ChunkedError::Malformed(format!("the data of a {size}-byte chunk is not followed by CRLF")));
        }
    }
}

/// The size of a chunk size line (without its CRLF): hex digits, then optional white space
/// and `;extensions`, which are ignored.
fn chunk_size(line: &[u8]) -> Result<usize, ChunkedError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let after = rest.iter().position(|&b| b != b' ' && b != b'\t').map_or(&rest[rest.len()..], |k| &rest[k..]);
    if digits == 0 || !(after.is_empty() || after[0] == b';') {
        let shown = String::from_utf8_lossy(line);
        return Err(ChunkedError::Malformed(format!("the chunk size line {shown:?} is not a hex size")));
    }
    // Leading zeros aside, a size of more than 16 hex digits is over any limit.
    let start = line[..digits].iter().position(|&b| b != b'0').unwrap_or(digits);
    let hex = &line[start..digits];
    if hex.len() > 16 {
        return Ok(usize::MAX);
    }
    let size = hex.iter().fold(0u64, |n, &b| (n << 4) | u64::from(hex_value(b)));
    Ok(usize::try_from(size).unwrap_or(usize::MAX))
}

/// The value of an ASCII hex digit.
fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

/// Reads the trailer lines up to the empty line that ends the body, at most [`MAX_HEAD`]
/// bytes in all.
fn read_trailers(input: &mut impl BufRead) -> Result<(), ChunkedError> {
    let mut total = 0;
    loop {
        let line = read_crlf_line(input, MAX_HEAD, "a trailer line")?;
        if line.is_empty() {
            return Ok(());
        }
        if !line.contains(&b':') {
            let shown = String::from_utf8_lossy(&line);
            return Err(ChunkedError::Malformed(format!("the trailer line {shown:?} has no `:`")));
        }
        total += line.len() + 2;
        if total > MAX_HEAD {
            return Err(ChunkedError::Malformed(format!("the trailers are over {MAX_HEAD} bytes")));
        }
    }
}

/// One line of at most `limit` bytes ending in CRLF, without the CRLF; `what` names it in
/// the error.
fn read_crlf_line(input: &mut impl BufRead, limit: usize, what: &str) -> Result<Vec<u8>, ChunkedError> {
    let mut line = Vec::new();
    loop {
        let available = fill(input)?;
        if available.is_empty() {
            return Err(ChunkedError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let (take, done) = match memchr::memchr(b'\n', available) {
            Some(k) => (k + 1, true),
            None => (available.len(), false),
        };
        if line.len() + take > limit {
            return Err(ChunkedError::Malformed(format!("{what} is over {limit} bytes")));
        }
        line.extend_from_slice(&available[..take]);
        input.consume(take);
        if done {
            break;
        }
    }
    line.pop();
    if line.pop() != Some(b'\r') {
        return Err(ChunkedError::Malformed(format!("{what} ends in a bare LF, not CRLF")));
    }
    Ok(line)
}

/// The buffered bytes of `input`, reading more if none are (retrying an interrupted read).
fn fill(input: &mut impl BufRead) -> Result<&[u8], ChunkedError> {
    loop {
        match input.fill_buf() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ChunkedError::Io(e)),
        }
    }
    input.fill_buf().map_err(ChunkedError::Io)
}

/// Appends exactly `n` bytes of `input` to `body` as they arrive (see [`Growing::append`]).
fn read_chunk_data(
    input: &mut impl BufRead,
    body: &mut Growing,
    n: usize,
    grow: &mut impl FnMut(usize) -> bool,
) -> Result<(), ChunkedError> {
    let mut left = n;
    while left > 0 {
        let available = fill(input)?;
        if available.is_empty() {
            return Err(ChunkedError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let take = available.len().min(left);
        if !body.append(&available[..take], grow) {
            return Err(ChunkedError::Refused);
        }
        input.consume(take);
        left -= take;
    }
    Ok(())
}

/// Fills `out` from `input`.
fn read_exact_buf(input: &mut impl BufRead, out: &mut [u8]) -> Result<(), ChunkedError> {
    let mut at = 0;
    while at < out.len() {
        let available = fill(input)?;
        if available.is_empty() {
            return Err(ChunkedError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let take = available.len().min(out.len() - at);
        out[at..at + take].copy_from_slice(&available[..take]);
        input.consume(take);
        at += take;
    }
    Ok(())
}

/// A socket's reader whose every read waits at most until `deadline`.
struct Timed<'r> {
    reader: &'r mut BufReader<TcpStream>,
    deadline: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Timed<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.reader.buffer().is_empty() {
            arm(self.reader, self.deadline).map_err(|e| match e {
                HttpError::Io(e) => e,
                _ => std::io::ErrorKind::TimedOut.into(),
            })?;
        }
        self.reader.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.reader.consume(n);
    }
}

/// Reads a chunked body of at most `max` bytes before `deadline` (see [`read_chunked`]).
pub fn read_chunked_body(
    reader: &mut BufReader<TcpStream>,
    max: usize,
    deadline: Instant,
    grow: impl FnMut(usize) -> bool,
) -> Result<Vec<u8>, HttpError> {
    read_chunked(&mut Timed { reader, deadline }, max, grow).map_err(|e| match e {
        ChunkedError::Malformed(m) => HttpError::Bad(m),
        ChunkedError::TooLarge { max } => HttpError::TooLarge { max },
        ChunkedError::Refused => HttpError::Refused,
        ChunkedError::Io(e) => read_error(e),
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Service Unavailable",
    }
}

/// Writes all of `bytes` before `deadline` (else a `TimedOut` error, the rest unwritten):
/// the socket's write timeout is set to the time left before each write, so progress,
/// however slow, does not stretch the write past it.
fn write_before(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(ErrorKind::TimedOut, "the response was not taken before its deadline"));
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(Error::from(ErrorKind::WriteZero)),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `100 Continue` before `deadline`.
pub fn write_continue(stream: &mut TcpStream, deadline: Instant) -> std::io::Result<()> {
    write_before(stream, b"HTTP/1.1 100 Continue\r\n\r\n", deadline)
}

/// Writes a JSON response, all of it before `deadline` (else an error, the rest unwritten);
/// `close` announces that the connection closes after it, and `retry_after` adds a
/// `Retry-After` header of that many seconds.
pub fn write_json(
    stream: &mut TcpStream,
    status: u16,
    body: &[u8],
    close: bool,
    retry_after: Option<u32>,
    deadline: Instant,
) -> std::io::Result<()> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    let retry = retry_after.map(|s| format!("Retry-After: {s}\r\n")).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{connection}{retry}\r\n",
        reason(status),
        body.len()
    );
    let mut out = Vec::with_capacity(head.len() + body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(body);
    write_before(stream, &out, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Head, HttpError> {
        let head = text.as_bytes();
        let mut lines = Vec::new();
        let mut start = 0;
        for (i, &b) in head.iter().enumerate() {
            if b == b'\n' {
                lines.push((start, i + 1));
                start = i + 1;
            }
        }
        parse_head(head, &lines)
    }

    #[test]
    fn heads_parse() {
        let h = parse("POST /score?x=1 HTTP/1.1\r\nContent-Length: 12\r\nExpect: 100-continue\r\n").unwrap();
        assert_eq!((h.method.as_str(), h.path.as_str(), h.content_length), ("POST", "/score", Some(12)));
        assert!(h.expect_continue && !h.close && h.transfer == Transfer::Identity);
        let h = parse("GET /health HTTP/1.0\r\n").unwrap();
        assert!(h.close, "HTTP/1.0 closes unless asked to keep alive");
        let h = parse("GET /health HTTP/1.1\nConnection: close\nTransfer-Encoding: chunked\n").unwrap();
        assert!(h.close && h.transfer == Transfer::Chunked);
        for bad in ["GET /health\r\n", "GET / SPDY/3\r\n", "GET / HTTP/1.1\r\nno colon\r\n"] {
            assert!(matches!(parse(bad), Err(HttpError::Bad(_))), "{bad}");
        }
        let two = parse("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n");
        assert!(matches!(two, Err(HttpError::Bad(_))));
    }

    /// `Connection` is a list of options, `close` anywhere in it closing; only HTTP/1.0 and
    /// HTTP/1.1 are read.
    #[test]
    fn connection_options_and_versions_are_read_strictly() {
        let close = |version: &str, headers: &str| parse(&format!("GET / {version}\r\n{headers}")).unwrap().close;
        assert!(close("HTTP/1.1", "Connection: keep-alive, close\r\n"));
        assert!(close("HTTP/1.1", "Connection: Upgrade,CLOSE\r\n"));
        assert!(close("HTTP/1.1", "Connection: keep-alive\r\nConnection: close\r\n"));
        assert!(!close("HTTP/1.1", "Connection: keep-alive\r\n"));
        assert!(!close("HTTP/1.1", "Connection: closed, x-close\r\n"), "options, not substrings");
        assert!(!close("HTTP/1.0", "Connection: Keep-Alive\r\n"));
        assert!(close("HTTP/1.0", "Connection: keep-alive, close\r\n"));
        assert!(close("HTTP/1.0", ""));
        for junk in ["HTTP/1.junk", "HTTP/1.", "HTTP/1.10", "http/1.1", "HTTP/11"] {
            match parse(&format!("GET /health {junk}\r\n")) {
                Err(HttpError::Bad(m)) => assert!(m.contains("is not an HTTP version"), "{junk}: {m}"),
                other => panic!("{junk:?}: {other:?}"),
            }
        }
        for other in ["HTTP/2.0", "HTTP/1.2", "HTTP/0.9"] {
            let e = parse(&format!("GET /health {other}\r\n")).unwrap_err();
            assert!(matches!(e, HttpError::Version(_)), "{other}: {e:?}");
            assert!(e.to_string().contains("is not supported (send HTTP/1.1 or HTTP/1.0)"), "{e}");
        }
    }

    /// A request whose bytes arrived before the server stops is still taken; a connection with
    /// nothing sent is let go at once.
    #[test]
    fn a_request_already_sent_is_taken_when_stopping() {
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut sent = TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let silent = TcpStream::connect(addr).unwrap();
        let (quiet, _) = listener.accept().unwrap();
        sent.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut reader = BufReader::new(stream);
        let started = Instant::now();
        assert!(wait_for_request(&mut reader, Duration::from_secs(5), || true).unwrap());
        let head = read_head(&mut reader, Instant::now() + Duration::from_secs(1)).unwrap();
        assert_eq!(head.path, "/health");
        let mut quiet = BufReader::new(quiet);
        assert!(!wait_for_request(&mut quiet, Duration::from_secs(5), || true).unwrap());
        assert!(started.elapsed() < Duration::from_secs(1), "no wait when stopping: {:?}", started.elapsed());
        // The socket blocks again: a read waits for its timeout rather than failing at once.
        quiet.get_ref().set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let waited = Instant::now();
        assert!(quiet.fill_buf().is_err());
        assert!(waited.elapsed() >= Duration::from_millis(150), "{:?}", waited.elapsed());
        drop(silent);
    }

    /// RFC 9112 §5: what a proxy could read another way is refused, never read past.
    #[test]
    fn heads_a_proxy_could_read_otherwise_are_refused() {
        let bad = |header: &str| match parse(&format!("POST / HTTP/1.1\r\n{header}\r\nHost: x\r\n")) {
            Err(HttpError::Bad(m)) => m,
            other => panic!("{header:?}: {other:?}"),
        };
        let e = bad("Transfer-Encoding : chunked");
        assert!(e.contains("\"Transfer-Encoding \" is not a token (no white space is allowed before the `:`)"), "{e}");
        assert!(bad("Content-Length\t: 5").contains("not a token"));
        assert!(bad(": 5").contains("not a token"));
        for folded in [" chunked", "\tchunked"] {
            let e = bad(&format!("Transfer-Encoding: identity\r\n{folded}"));
            assert!(e.contains("starts with white space (obsolete line folding"), "{e}");
        }
        for length in ["+5", "-5", "5 5", "5,5", "0x5", "", " ", "99999999999999999999999"] {
            let e = bad(&format!("Content-Length: {length}"));
            assert!(e.contains("is not a number of bytes"), "{length:?}: {e}");
        }
        assert!(bad("X-A: 1\r2").contains("a bare CR"));
        // Optional white space around a value is no part of it.
        let h = parse("POST / HTTP/1.1\r\nContent-Length:\t 7 \t\r\nConnection:close\r\n").unwrap();
        assert_eq!((h.content_length, h.close), (Some(7), true));
    }

    /// A head sent one byte every 100 ms, never ending its line, on a real socket: refused as
    /// late at the deadline, not when a read waits longer than the time left.
    #[test]
    fn a_trickled_head_ends_at_the_deadline() {
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /health HTTP/1.1\r\nX-Slow: ").unwrap();
            // Until the server closes (or 10 s, far past the deadline).
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(b"a").is_err() {
                    break;
                }
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream);
        let started = Instant::now();
        let head = read_head(&mut reader, started + Duration::from_millis(600));
        let took = started.elapsed();
        assert!(matches!(head, Err(HttpError::Timeout)), "{head:?}");
        assert!(took < Duration::from_millis(1200), "refused after {took:?}, not at the deadline");
        drop(reader);
        client.join().unwrap();
    }

    /// Lines are read up to the blank line; what follows stays unread.
    #[test]
    fn head_lines_end_at_the_blank_line() {
        let mut input = &b"\r\nGET / HTTP/1.1\r\nA: 1\n\r\nbody"[..];
        let (head, lines) = read_head_lines(&mut input).unwrap();
        assert_eq!(
            (head.as_slice(), lines.as_slice()),
            (&b"GET / HTTP/1.1\r\nA: 1\n\r\n"[..], &[(0, 16), (16, 21)][..])
        );
        assert_eq!(input, b"body");
        assert!(matches!(read_head_lines(&mut &b""[..]), Err(HttpError::Closed)));
        assert!(matches!(read_head_lines(&mut &b"GET / HTTP/1.1\r\nA"[..]), Err(HttpError::Bad(_))));
        let long = vec![b'a'; MAX_HEAD + 1];
        assert!(matches!(read_head_lines(&mut &long[..]), Err(HttpError::HeadTooLarge)));
    }

    #[test]
    fn transfer_encodings_are_chunked_identity_or_unsupported() {
        let transfer = |te: &str| parse(&format!("POST / HTTP/1.1\r\n{te}\r\n")).map(|h| h.transfer);
        assert_eq!(transfer("Transfer-Encoding: Chunked").unwrap(), Transfer::Chunked);
        assert_eq!(transfer("Transfer-Encoding: identity, chunked").unwrap(), Transfer::Chunked);
        assert_eq!(transfer("Transfer-Encoding: identity").unwrap(), Transfer::Identity);
        assert_eq!(
            transfer("Transfer-Encoding: gzip, chunked").unwrap(),
            Transfer::Unsupported("gzip, chunked".into())
        );
        let twice = parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n");
        assert!(matches!(twice.unwrap().transfer, Transfer::Unsupported(_)));
        // Content-Length and a transfer coding together: refused, whichever comes first.
        for both in [
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n",
        ] {
            let e = parse(both).unwrap_err().to_string();
            assert!(e.contains("both Content-Length and Transfer-Encoding"), "{e}");
        }
    }

    /// Reads a `length`-byte body from `text`, delivered `piece` bytes at a time, with a budget
    /// of `budget` bytes; the body and each growth `grow` was asked for.
    fn sized(text: &[u8], length: usize, piece: usize, budget: usize) -> (Result<Vec<u8>, HttpError>, Vec<usize>) {
        let mut asks = Vec::new();
        let mut input = BufReader::with_capacity(piece, text);
        let body = read_sized(&mut input, length, |n| {
            asks.push(n);
            asks.iter().sum::<usize>() <= budget
        });
        (body, asks)
    }

    /// A body's buffer grows with the bytes that arrive, by doubling up to the length
    /// announced, never for the length alone: a client announcing 1 MiB and sending 5 bytes
    /// makes the server hold 5.
    #[test]
    fn a_sized_body_grows_with_the_bytes_received_not_the_length_announced() {
        let (body, asks) = sized(b"hello", 1 << 20, 4096, usize::MAX);
        assert!(matches!(body, Err(HttpError::Closed)), "{body:?}");
        assert_eq!(asks, [5], "only what arrived was asked for");
        let text: Vec<u8> = (0..20).collect();
        let (body, asks) = sized(&text, 20, 4, usize::MAX);
        let body = body.unwrap();
        assert_eq!(asks, [4, 4, 8, 4], "4, doubled to 8 and 16, then the 20 announced");
        assert_eq!((body.as_slice(), body.capacity()), (&text[..], 20));
        // A refused growth stops the read; what follows a body stays unread.
        assert!(matches!(sized(&text, 20, 4, 10).0, Err(HttpError::Refused)));
        let mut input = &b"abcGET /health"[..];
        assert_eq!(read_sized(&mut input, 3, |_| true).unwrap(), b"abc");
        assert_eq!(input, b"GET /health");
        assert!(read_sized(&mut &b""[..], 0, |_| panic!("nothing to hold")).unwrap().is_empty());
        // A chunk's announced size is no more held than a Content-Length.
        let (body, grown) = decode(b"100000\r\nabc", 1 << 20, usize::MAX);
        assert!(matches!(body, Err(ChunkedError::Io(_))), "{body:?}");
        assert_eq!(grown, 3, "the 3 bytes of a 1 MiB chunk that arrived");
    }

    /// On a real socket: a head's announced 16 MiB, of which 10 bytes are sent before the
    /// client stalls, reserve 10 bytes until the deadline ends the read.
    #[test]
    fn a_stalled_body_holds_only_the_bytes_it_sent() {
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (done, stalled) = std::sync::mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"[{\"I1\": 3}").unwrap();
            let _ = stalled.recv_timeout(Duration::from_secs(10));
        });
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream);
        let mut asked = 0;
        let body = read_body(&mut reader, 16 << 20, Instant::now() + Duration::from_millis(500), |n| {
            asked += n;
            true
        });
        assert!(matches!(body, Err(HttpError::Timeout)), "{body:?}");
        assert_eq!(asked, 10, "the bytes sent, not the 16 MiB announced");
        done.send(()).unwrap();
        client.join().unwrap();
    }

    /// Decodes `text` with limit `max`, counting what `grow` accepted in `grown`.
    fn decode(text: &[u8], max: usize, budget: usize) -> (Result<Vec<u8>, ChunkedError>, usize) {
        let mut grown = 0;
        let body = read_chunked(&mut &text[..], max, |n| {
            grown += n;
            grown <= budget
        });
        (body, grown)
    }

    fn malformed(text: &[u8]) -> String {
        match decode(text, 1 << 20, usize::MAX).0 {
            Err(ChunkedError::Malformed(m)) => m,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(text)),
        }
    }

    #[test]
    fn chunked_bodies_decode() {
        let ok = |text: &[u8]| decode(text, 1 << 20, usize::MAX).0.unwrap();
        assert_eq!(ok(b"0\r\n\r\n"), b"");
        assert_eq!(ok(b"5\r\nhello\r\n1;name=value\r\n!\r\n0\r\n\r\n"), b"hello!");
        assert_eq!(ok(b"A \t;ext\r\n0123456789\r\n000\r\nTrailer: x\r\nOther: y\r\n\r\n"), b"0123456789");
        assert_eq!(ok(b"0000000000000000000001\r\nz\r\n0\r\n\r\n"), b"z", "leading zeros are no size");
        assert_eq!(ok(b"1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\nafter"), b"abcdefghijklmnopqrstuvwxyz");
        // What follows the body stays unread (the next request on the connection).
        let mut input = &b"2\r\nab\r\n0\r\n\r\nGET /health"[..];
        assert_eq!(read_chunked(&mut input, 10, |_| true).unwrap(), b"ab");
        assert_eq!(input, b"GET /health");
    }

    #[test]
    fn malformed_chunks_say_what_is_wrong() {
        let e = malformed(b"zz\r\nhello\r\n0\r\n\r\n");
        assert!(e.contains("\"zz\" is not a hex size"), "{e}");
        assert!(malformed(b"\r\n").contains("is not a hex size"));
        assert!(malformed(b"-1\r\n").contains("is not a hex size"));
        assert!(malformed(b"0x5\r\nhello\r\n").contains("is not a hex size"));
        assert!(malformed(b"5 5\r\nhello\r\n").contains("is not a hex size"));
        assert!(malformed(b"5\nhello\r\n0\r\n\r\n").contains("bare LF"));
        assert!(malformed(b"5\r\nhelloXY0\r\n\r\n").contains("not followed by CRLF"));
        assert!(malformed(b"0\r\nno colon\r\n\r\n").contains("trailer line"));
        let long = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(malformed(long.as_bytes()).contains(&format!("over {MAX_CHUNK_LINE} bytes")));
        let trailers = format!("0\r\n{}\r\n", "T: v\r\n".repeat(MAX_HEAD / 4));
        assert!(malformed(trailers.as_bytes()).contains("the trailers are over"));
        for cut in [&b"5\r\nhel"[..], b"5\r\nhello", b"5\r\nhello\r\n", b"0\r\n", b"0\r\nT: v\r\n", b""] {
            let e = decode(cut, 100, usize::MAX).0;
            assert!(matches!(&e, Err(ChunkedError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof), "{e:?}");
        }
    }

    #[test]
    fn a_chunked_body_stops_at_its_limit_and_its_budget() {
        // At the limit: read; one byte over, in one chunk or across chunks: refused at the size line.
        assert_eq!(decode(b"4\r\nabcd\r\n0\r\n\r\n", 4, usize::MAX).0.unwrap(), b"abcd");
        let over = |text: &[u8]| matches!(decode(text, 4, usize::MAX).0, Err(ChunkedError::TooLarge { max: 4 }));
        assert!(over(b"5\r\n"), "the data of a chunk over the limit is not waited for");
        assert!(over(b"3\r\nabc\r\n2\r\n"));
        assert!(over(b"ffffffffffffffff\r\n"));
        assert!(over(b"1ffffffffffffffff\r\n"), "more than 64 bits of size");
        // `grow` is asked before the buffer grows; a refusal stops the read.
        let (body, grown) = decode(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 1 << 20, usize::MAX);
        assert_eq!(body.unwrap(), b"abcde");
        assert_eq!(grown, 6, "3 bytes, then doubled to 6");
        let (body, grown) = decode(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 5, usize::MAX);
        assert_eq!((body.unwrap().as_slice(), grown), (&b"abcde"[..], 5), "doubling stops at the limit");
        let (body, grown) = decode(b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n", 1 << 20, 5);
        assert!(matches!(body, Err(ChunkedError::Refused)), "{body:?}");
        assert_eq!(grown, 3 + 4, "the refused growth was asked for");
        // A body of many one-byte chunks grows its budget a doubling at a time.
        let many = format!("{}0\r\n\r\n", "1\r\nx\r\n".repeat(1000));
        let (body, grown) = decode(many.as_bytes(), 1 << 20, usize::MAX);
        assert_eq!((body.unwrap().len(), grown), (1000, 1024));
    }
}

//! The server side of HTTP/1.1 for `tiderec serve`, on a std `TcpStream`:
//! enough for its three routes (a request head, a `Content-Length` body, a
//! response with `Content-Length`), nothing more.
//!
//! Invariants:
//! * Every read happens before a deadline: the socket's read timeout is set
//!   to the time left before each read, so a client sending one byte at a
//!   time cannot stretch a request past it ([`HttpError::Timeout`]).
//! * A head is at most [`MAX_HEAD`] bytes; a body is read only once its
//!   announced length is known to be within the caller's limit, into one
//!   buffer of exactly that length.
//! * Chunked bodies are not read (`411`: the client sends `Content-Length`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 16 << 10;

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
    /// A head that is not HTTP/1.x.
    #[error("a bad request: {0}")]
    Bad(String),
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
    /// A `Transfer-Encoding` other than `identity` was given.
    pub chunked: bool,
    /// The connection closes after the response (`Connection: close`, or HTTP/1.0).
    pub close: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
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
/// `idle` passes or `stop()` says so (`Ok(false)`), looking at `stop` every 100 ms.
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
            return Ok(false);
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

/// Reads one request head before `deadline`.
pub fn read_head(reader: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Head, HttpError> {
    let mut head = Vec::new();
    let mut lines: Vec<(usize, usize)> = Vec::new();
    loop {
        let start = head.len();
        let room = (MAX_HEAD + 1).saturating_sub(start) as u64;
        arm(reader, deadline)?;
        match reader.by_ref().take(room).read_until(b'\n', &mut head) {
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
            // A timeout or the end of the stream cut the line: read on.
            continue;
        }
        let line = &head[start..];
        let blank = line == b"\r\n" || line == b"\n";
        match (blank, lines.is_empty()) {
            (true, true) => head.truncate(start), // empty lines before a request line
            (true, false) => break,
            (false, _) => lines.push((start, head.len())),
        }
    }
    parse_head(&head, &lines)
}

fn parse_head(head: &[u8], lines: &[(usize, usize)]) -> Result<Head, HttpError> {
    let text = |&(a, b): &(usize, usize)| {
        std::str::from_utf8(&head[a..b])
            .map(|s| s.trim_end_matches(['\r', '\n']))
            .map_err(|_| HttpError::Bad("a request head that is not UTF-8".into()))
    };
    let request = text(&lines[0])?;
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Bad(format!("the request line {request:?} is not `METHOD TARGET HTTP/1.x`")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Bad(format!("{version:?} is not HTTP/1.x")));
    }
    let mut out = Head {
        method: method.to_string(),
        path: target.split('?').next().unwrap_or(target).to_string(),
        content_length: None,
        chunked: false,
        close: version == "HTTP/1.0",
        expect_continue: false,
    };
    for line in &lines[1..] {
        let line = text(line)?;
        let Some((name, value)) = line.split_once(':') else {
            return Err(HttpError::Bad(format!("the header line {line:?} has no `:`")));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value.parse().map_err(|_| HttpError::Bad(format!("Content-Length {value:?}")))?;
            if out.content_length.is_some_and(|m| m != n) {
                return Err(HttpError::Bad("two different Content-Length headers".into()));
            }
            out.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            out.chunked |= !value.eq_ignore_ascii_case("identity");
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                out.close = true;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                out.close = false;
            }
        } else if name.eq_ignore_ascii_case("expect") {
            out.expect_continue = value.eq_ignore_ascii_case("100-continue");
        }
    }
    Ok(out)
}

/// Reads a body of `length` bytes before `deadline`.
pub fn read_body(reader: &mut BufReader<TcpStream>, length: usize, deadline: Instant) -> Result<Vec<u8>, HttpError> {
    let mut body = vec![0; length];
    let mut at = 0;
    while at < length {
        arm(reader, deadline)?;
        match reader.read(&mut body[at..]) {
            Ok(0) => return Err(HttpError::Closed),
            Ok(n) => at += n,
            Err(e) if timed_out(&e) => return Err(HttpError::Timeout),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HttpError::Io(e)),
        }
    }
    Ok(body)
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
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    }
}

/// Writes `100 Continue`.
pub fn write_continue(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
}

/// Writes a JSON response; `close` announces that the connection closes after it.
pub fn write_json(stream: &mut TcpStream, status: u16, body: &[u8], close: bool) -> std::io::Result<()> {
    let connection = if close { "Connection: close\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{connection}\r\n",
        reason(status),
        body.len()
    );
    let mut out = Vec::with_capacity(head.len() + body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(body);
    stream.write_all(&out)?;
    stream.flush()
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
        assert!(h.expect_continue && !h.close && !h.chunked);
        let h = parse("GET /health HTTP/1.0\r\n").unwrap();
        assert!(h.close, "HTTP/1.0 closes unless asked to keep alive");
        let h = parse("GET /health HTTP/1.1\nConnection: close\nTransfer-Encoding: chunked\n").unwrap();
        assert!(h.close && h.chunked);
        for bad in ["GET /health\r\n", "GET / SPDY/3\r\n", "GET / HTTP/1.1\r\nno colon\r\n"] {
            assert!(matches!(parse(bad), Err(HttpError::Bad(_))), "{bad}");
        }
        let two = parse("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n");
        assert!(matches!(two, Err(HttpError::Bad(_))));
    }
}

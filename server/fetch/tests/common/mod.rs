//! A tiny HTTP/1.1 server on 127.0.0.1 that serves files in the Hugging Face
//! Hub layout (`/{repo}/resolve/{revision}/{file}`) and at plain URLs, with
//! the headers `hf-hub` needs (`etag`, `x-repo-commit`, `content-range`).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The commit every served repo file reports.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Default)]
struct State {
    files: HashMap<String, Vec<u8>>,
    /// Paths whose responses claim more bytes than they send.
    truncated: Vec<String>,
    /// Path prefix -> the bearer token it requires.
    protected: Vec<(String, String)>,
}

/// A running test server; requests are counted.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    requests: Arc<AtomicUsize>,
    stopped: Arc<AtomicBool>,
    state: Arc<Mutex<State>>,
}

impl Server {
    /// Starts serving on an ephemeral 127.0.0.1 port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = Server {
            base,
            requests: Arc::default(),
            stopped: Arc::default(),
            state: Arc::default(),
        };
        let (requests, stopped, state) = (
            server.requests.clone(),
            server.stopped.clone(),
            server.state.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (requests, state) = (requests.clone(), state.clone());
                std::thread::spawn(move || serve(stream, &requests, &state));
            }
        });
        server
    }

    /// Serves `bytes` at `/{repo}/resolve/{revision}/{file}`.
    pub fn add_repo_file(&self, repo: &str, revision: &str, file: &str, bytes: &[u8]) {
        self.add_path(&format!("/{repo}/resolve/{revision}/{file}"), bytes);
    }

    /// Serves `bytes` at URL path `path`.
    pub fn add_path(&self, path: &str, bytes: &[u8]) {
        let mut state = self.state.lock().unwrap();
        state.files.insert(path.to_string(), bytes.to_vec());
    }

    /// Serves `bytes` at `path` but claims 100 more, then closes.
    pub fn add_truncated(&self, path: &str, bytes: &[u8]) {
        self.add_path(path, bytes);
        self.state.lock().unwrap().truncated.push(path.to_string());
    }

    /// Requires `Authorization: Bearer {token}` under `/{repo}/`.
    pub fn protect(&self, repo: &str, token: &str) {
        let mut state = self.state.lock().unwrap();
        state
            .protected
            .push((format!("/{repo}/"), token.to_string()));
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Stops accepting: later connections are refused.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let addr = self.base.trim_start_matches("http://");
        let _ = TcpStream::connect(addr);
        // Wait until the listener is gone.
        for _ in 0..100 {
            if TcpStream::connect(addr).is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("test server did not stop");
    }
}

fn serve(stream: TcpStream, requests: &AtomicUsize, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let response = respond(&path, &headers, &state.lock().unwrap());
    let _ = reader.into_inner().write_all(&response);
}

fn respond(path: &str, headers: &HashMap<String, String>, state: &State) -> Vec<u8> {
    for (prefix, token) in &state.protected {
        let want = format!("Bearer {token}");
        if path.starts_with(prefix) && headers.get("authorization") != Some(&want) {
            return reply("401 Unauthorized", &[], b"Invalid credentials");
        }
    }
    let Some(body) = state.files.get(path) else {
        return reply("404 Not Found", &[], b"Entry not found");
    };
    let mut hasher = DefaultHasher::new();
    body.hash(&mut hasher);
    let etag = format!("\"{:016x}\"", hasher.finish());
    let mut extra = vec![("etag", etag), ("x-repo-commit", COMMIT.to_string())];
    match headers
        .get("range")
        .and_then(|r| parse_range(r, body.len()))
    {
        Some((a, b)) => {
            extra.push(("content-range", format!("bytes {a}-{b}/{}", body.len())));
            reply("206 Partial Content", &extra, &body[a..=b])
        }
        None if state.truncated.iter().any(|p| p == path) => {
            let mut out = reply("200 OK", &extra, body);
            let claimed = format!("content-length: {}", body.len() + 100);
            let real = format!("content-length: {}", body.len());
            let head =
                String::from_utf8_lossy(&out[..out.len() - body.len()]).replace(&real, &claimed);
            out.splice(..out.len() - body.len(), head.into_bytes());
            out
        }
        None => reply("200 OK", &extra, body),
    }
}

/// `bytes=a-b` (b optional, clamped to the end) as an inclusive range.
fn parse_range(range: &str, len: usize) -> Option<(usize, usize)> {
    let (a, b) = range.strip_prefix("bytes=")?.split_once('-')?;
    let a: usize = a.parse().ok()?;
    let b: usize = b.parse().unwrap_or(usize::MAX).min(len.checked_sub(1)?);
    (a <= b).then_some((a, b))
}

fn reply(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("connection: close\r\n\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

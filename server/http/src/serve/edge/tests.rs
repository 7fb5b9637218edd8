//! The edge's limits over real loopback sockets.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::fixtures::{engine_config, request, serve_with};
use crate::load::config::HttpConfig;

#[tokio::test]
async fn a_write_the_client_never_reads_fails_after_the_limit() {
    let (near, mut far) = tokio::io::duplex(64);
    let mut w = WriteStall::new(near, Duration::from_millis(100));
    w.write_all(&[1; 64]).await.unwrap();
    // The far end reads in time: no error, however slow the whole write.
    let reader = tokio::spawn(async move {
        let mut buf = vec![0; 64];
        tokio::time::sleep(Duration::from_millis(60)).await;
        far.read_exact(&mut buf).await.unwrap();
        far
    });
    w.write_all(&[2; 64]).await.unwrap();
    let _far = reader.await.unwrap();
    // Now nobody reads: the write fails after ~100 ms, not before.
    let started = Instant::now();
    let err = w.write_all(&[3; 65]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(90), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

/// Reads until the server closes; what it sent, or `None` if still open
/// after `within`.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut out)).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn connections_over_the_cap_get_a_503_and_the_slot_comes_back() {
    let http = HttpConfig {
        max_connections: 2,
        ..HttpConfig::default()
    };
    let (addr, _state) = serve_with(engine_config(), 0, &http).await;
    let first = TcpStream::connect(addr).await.unwrap();
    let _second = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    let answer = read_until_closed(&mut third, Duration::from_secs(2))
        .await
        .expect("the third connection is closed");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body: serde_json::Value =
        serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections");
    drop(first);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(request(addr, "GET", "/health", "").await.0, 200);
}

#[tokio::test]
async fn headers_that_trickle_in_past_the_read_timeout_close_the_connection() {
    let http = HttpConfig {
        read_timeout: Duration::from_millis(300),
        ..HttpConfig::default()
    };
    let (addr, _state) = serve_with(engine_config(), 0, &http).await;
    // Slowloris: a request line, then nothing.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(
        read_until_closed(&mut slow, Duration::from_secs(3))
            .await
            .is_some(),
        "still open 3 s after a 300 ms header timeout"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    // An idle keep-alive connection is closed the same way.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut idle, Duration::from_secs(3)).await;
    assert!(answer.is_some_and(|a| a.starts_with("HTTP/1.1 200")));
    // A body that trickles in is a 408 after the same timeout.
    let mut body = TcpStream::connect(addr).await.unwrap();
    body.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"prompt\"",
    )
    .await
    .unwrap();
    let answer = read_until_closed(&mut body, Duration::from_secs(3)).await;
    let answer = answer.unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
}

//! The HTTP edge: accepts connections under a cap, gives each a header read
//! timeout (slowloris; it also closes idle keep-alive connections) and a
//! write-stall timeout, serves the router over HTTP/1.1, and shuts down
//! gracefully. A connection over the cap gets a 503 and is closed, so a flood
//! of sockets cannot starve the clients already served.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Sleep;

use crate::openai::error::ApiError;

/// The edge's limits; see `serve`'s flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EdgeConfig {
    /// A request's headers must arrive within this; an idle keep-alive
    /// connection is closed after it.
    pub header_read_timeout: Duration,
    /// A response the client accepts no bytes of for this long is abandoned
    /// (for a stream: its request is cancelled).
    pub write_stall_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets each
/// connection finish its request in flight and returns once all have closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: EdgeConfig,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                let conn = connection(stream, app.clone(), config, permit, stop_rx.clone());
                tokio::spawn(conn);
            }
            Err(_) => {
                tokio::spawn(refuse(stream, config.max_connections));
            }
        }
    }
    drop(stop_rx);
    let _ = stop_tx.send(true);
    // Each connection holds a receiver until it has closed.
    stop_tx.closed().await;
}

/// Serves one connection; on the stop signal, finishes the request in flight
/// and closes.
async fn connection(
    stream: TcpStream,
    app: Router,
    config: EdgeConfig,
    _permit: OwnedSemaphorePermit,
    mut stop: watch::Receiver<bool>,
) {
    let io = TokioIo::new(WriteStall::new(stream, config.write_stall_timeout));
    let service = TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    let mut conn = pin!(builder.serve_connection(io, service));
    let stopping = async {
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        result = conn.as_mut() => return note(result),
        () = stopping => {}
    }
    conn.as_mut().graceful_shutdown();
    note(conn.await);
}

fn note(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended");
    }
}

/// Answers a connection over the cap with a 503 and closes it.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body =
        serde_json::to_string(&ApiError::TooManyConnections { max }.body()).unwrap_or_default();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    // A client that does not read this either is not waited for.
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// A stream whose writes fail once one has waited `limit` without progress:
/// the client stopped reading, so its response is abandoned.
pub struct WriteStall<T> {
    inner: T,
    limit: Duration,
    /// Armed while a write waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteStall<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, limit: Duration) -> Self {
        WriteStall {
            inner,
            limit,
            timer: None,
        }
    }

    /// After an inner poll: disarms on progress, else arms the timer and
    /// fails once it fires.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.timer = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client accepted no bytes for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests;

//! `archon serve`'s connections over raw TCP: a connection that sends no request, or only part of its
//! headers, is closed after the header timeout while others are served; at `--max-connections` a
//! further connection is not served until one closes, and the server goes on once they do.

use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::serve::{PATIENCE, Server, serve};

const HELLO: &str = "name: hello\nsteps:\n  - id: a\n    tool: echo\n    with: { said: hello }\n";

fn workflows() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("hello.yaml"), HELLO).expect("write");
    dir
}

/// A connection to the server.
async fn connect(server: &Server) -> TcpStream {
    let address = server.url.strip_prefix("http://").expect("an http URL");
    TcpStream::connect(address).await.expect("connected")
}

/// A whole `GET path` that keeps the connection open.
fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
}

/// What the server sends until it has sent a response's head, or closes, or `patience` passes: the
/// text, and whether it closed.
async fn read_head(stream: &mut TcpStream, patience: Duration) -> (String, bool) {
    let deadline = Instant::now() + patience;
    let mut got = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(0) | Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => {
                got.extend_from_slice(&buffer[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    return (String::from_utf8_lossy(&got).into_owned(), false);
                }
            }
        }
    }
}

/// Reads until the server closes the connection (at most [`PATIENCE`]); what it sent, or `None` when
/// it never closed.
async fn read_to_close(stream: &mut TcpStream) -> Option<String> {
    let mut got = Vec::new();
    match tokio::time::timeout(PATIENCE, stream.read_to_end(&mut got)).await {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn idle_and_half_sent_requests_are_closed_after_the_header_timeout() {
    let dir = workflows();
    let server = serve(dir.path(), &["--header-timeout-ms", "300"], &[]);
    let opened = Instant::now();
    let mut idle = connect(&server).await;
    let mut half = connect(&server).await;
    half.write_all(b"GET /api/v1/workflows HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("sent");
    // One that was answered and then sends nothing more (keep-alive).
    let mut kept = connect(&server).await;
    kept.write_all(get("/api/v1/workflows").as_bytes())
        .await
        .expect("sent");
    let (head, _) = read_head(&mut kept, PATIENCE).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    // Meanwhile a whole request is served.
    let (status, _) = server.get("/api/v1/workflows").await;
    assert_eq!(status, 200);
    for (name, stream) in [
        ("idle", &mut idle),
        ("half-sent", &mut half),
        ("kept", &mut kept),
    ] {
        let said = read_to_close(stream).await;
        let said = said.unwrap_or_else(|| panic!("the {name} connection was never closed"));
        assert!(
            !said.contains("200 OK"),
            "the {name} connection was answered: {said}"
        );
    }
    assert!(opened.elapsed() >= Duration::from_millis(300));
    // And the server still serves (on a new connection: the client's kept one was closed too).
    let response = reqwest::get(format!("{}/api/v1/workflows", server.url))
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn at_the_connection_limit_a_further_connection_waits_until_one_closes() {
    let dir = workflows();
    let server = serve(dir.path(), &["--max-connections", "2"], &[]);
    // Two connections, each answered once and kept open.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = connect(&server).await;
        stream
            .write_all(get("/api/v1/workflows").as_bytes())
            .await
            .expect("sent");
        let (head, _) = read_head(&mut stream, PATIENCE).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        held.push(stream);
    }
    // A third is not served while they are open.
    let mut third = connect(&server).await;
    third
        .write_all(get("/api/v1/workflows").as_bytes())
        .await
        .expect("sent");
    let (head, closed) = read_head(&mut third, Duration::from_millis(500)).await;
    assert_eq!((head.as_str(), closed), ("", false));
    // One closes: the third is served.
    drop(held.remove(0));
    let (head, _) = read_head(&mut third, PATIENCE).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    drop(third);
    drop(held);
    // The server goes on serving, one connection after another.
    for _ in 0..5 {
        let (status, _) = server.get("/api/v1/workflows").await;
        assert_eq!(status, 200);
    }
}

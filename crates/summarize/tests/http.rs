//! The HTTP summarizer against a server on the loopback address: a good reply, a reply that misses a ref
//! (falls back), an error status, and a server slower than the idle timeout. Every server answers a
//! bounded number of requests and stops.

use condense_summarize::{Extractive, HttpConfig, HttpSummarizer, Item, Summarizer, WithFallback};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// Serves `replies` (status, body, delay) to successive requests, then stops; returns the base URL and
/// a handle yielding the request bodies it saw.
fn serve(replies: Vec<(u16, String, Duration)>) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for (status, body, delay) in replies {
            let Ok((stream, _)) = listener.accept() else { break };
            stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut len = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut req = vec![0u8; len];
            let _ = reader.read_exact(&mut req);
            seen.push(String::from_utf8_lossy(&req).into_owned());
            std::thread::sleep(delay);
            let mut s = stream;
            let _ = write!(s, "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        }
        seen
    });
    (url, handle)
}

fn reply(content: &str) -> String {
    serde_json::json!({"choices": [{"message": {"role": "assistant", "content": content}}]}).to_string()
}

fn items() -> Vec<Item<'static>> {
    vec![
        Item { ref_n: 1, tool: "bash", arguments: "{\"command\":\"make\"}", text: "error: boom\n", is_error: true },
        Item { ref_n: 2, tool: "read", arguments: "{\"path\":\"a.rs\"}", text: "fn main() {}\n", is_error: false },
    ]
}

fn cfg(url: &str) -> HttpConfig {
    let mut c = HttpConfig::new(url, "test-model", Some("secret".into()));
    c.idle = Duration::from_millis(500);
    c.total = Duration::from_secs(5);
    c
}

#[test]
fn good_reply_gives_one_summary_per_ref() {
    let (url, h) = serve(vec![(200, reply("t1: make failed with boom\nt2: a.rs holds an empty main"), Duration::ZERO)]);
    let out = HttpSummarizer::new(cfg(&url)).summarize(&items()).unwrap();
    assert_eq!(out, vec!["t1: make failed with boom".to_string(), "t2: a.rs holds an empty main".to_string()]);
    let seen = h.join().unwrap();
    assert!(seen[0].contains("\"model\":\"test-model\"") && seen[0].contains("### t1 (bash, error)"), "{}", seen[0]);
}

#[test]
fn missing_ref_or_error_status_falls_back() {
    let (url, h) = serve(vec![
        (200, reply("t1: only one"), Duration::ZERO),
        (500, "{\"error\":\"overloaded\"}".into(), Duration::ZERO),
    ]);
    let http = HttpSummarizer::new(cfg(&url));
    assert!(matches!(http.summarize(&items()), Err(condense_summarize::SummarizeError::Count { got: 1, want: 2, .. })));
    let err = http.summarize(&items()).unwrap_err().to_string();
    assert!(err.contains("status 500"), "{err}");
    h.join().unwrap();
    let (url, h) = serve(vec![(200, reply("t2: only the second"), Duration::ZERO)]);
    let with = WithFallback::new(HttpSummarizer::new(cfg(&url)), Extractive::default());
    let out = with.summarize(&items()).unwrap();
    assert!(out[0].starts_with("t1 bash (make):"), "{out:?}");
    let f = with.fallbacks();
    assert_eq!(f.count, 1);
    assert!(f.last.as_deref().is_some_and(|l| l.contains("1 summaries for 2 outputs")), "{f:?}");
    h.join().unwrap();
}

#[test]
fn a_server_slower_than_the_idle_timeout_fails() {
    let (url, h) = serve(vec![(200, reply("t1: x\nt2: y"), Duration::from_millis(1500))]);
    let err = HttpSummarizer::new(cfg(&url)).summarize(&items()).unwrap_err().to_string();
    assert!(err.to_lowercase().contains("timeout") || err.to_lowercase().contains("timed out"), "{err}");
    h.join().unwrap();
}

//! `condense serve`: a local endpoint that speaks the Anthropic Messages, OpenAI Chat Completions and
//! OpenAI Responses APIs, so an agent (Claude Code, pi, Codex, any OpenAI-compatible client) points its
//! base URL at it unchanged. Each request's history is matched against the conversation's session; what
//! is new is recorded; the engine prepares the context (pruning, checkpoints, recovery, notices); the
//! request goes upstream with its message list replaced by that context and everything else as the
//! client sent it. Calls of condense's own tools are answered here and the request continued, so the
//! client never sees them. One process owns the store; the engine stays synchronous behind the async
//! server and runs on blocking threads.
//!
//! See `docs/serve.md` for identity, diffing, tool interception, caching and failure behaviour.
//!
//! # Example
//!
//! A server in front of a scripted fake provider, both on loopback; a client sends a Chat Completions
//! request with `OPENAI_BASE_URL` pointed at the server, as an agent would:
//!
//! ```
//! use condense_serve::fake::{Fake, Step};
//! use condense_serve::{start, ServeConfig};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let fake = Fake::start(vec![Step::Text("hello back".into())]).await;
//! let dir = tempfile::tempdir().unwrap();
//! let mut config = ServeConfig::new(dir.path().join("store"));
//! config.listen = "127.0.0.1:0".parse().unwrap();
//! (config.openai_upstream, config.anthropic_upstream) = (fake.url(), fake.url());
//! let running = start(config).await.unwrap();
//! let reply: serde_json::Value = reqwest::Client::new()
//!     .post(format!("http://{}/v1/chat/completions", running.addr))
//!     .bearer_auth("the client's own key, passed through")
//!     .header("content-type", "application/json")
//!     .body(r#"{"model": "gpt-5", "messages": [{"role": "user", "content": "hello"}]}"#)
//!     .send()
//!     .await
//!     .unwrap()
//!     .bytes()
//!     .await
//!     .map(|b| serde_json::from_slice(&b).unwrap())
//!     .unwrap();
//! assert_eq!(reply["choices"][0]["message"]["content"], "hello back");
//! // The conversation is a session of the store now.
//! assert_eq!(running.state.store().sessions().unwrap().len(), 1);
//! running.stop().await.unwrap();
//! # });
//! ```

pub mod api;
pub mod billing;
pub mod budget;
pub mod conv;
mod dashboard;
pub mod fake;
pub mod lock;
mod live;
mod metrics;
mod request;
mod state;
pub mod stream;
pub mod summary;
pub mod track;

use condense_engine::config::FileConfig;
use condense_engine::{Store, StoreOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use request::rounds::ROUND_LIMIT_NOTE;
pub use request::routes::AUTH_HEADER;
pub use state::State;

/// The public Anthropic API.
pub const DEFAULT_ANTHROPIC_UPSTREAM: &str = "https://api.anthropic.com";
/// The public OpenAI API.
pub const DEFAULT_OPENAI_UPSTREAM: &str = "https://api.openai.com";
/// Where Gemini API requests go by default.
pub const DEFAULT_GEMINI_UPSTREAM: &str = "https://generativelanguage.googleapis.com";
/// The default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// The default cap on a request body.
pub const DEFAULT_MAX_BODY: usize = 64 << 20;
/// The default bound on condense-tool rounds per client request.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;
/// Most messages (list items) a request may hold: the Anthropic Messages API's own limit, and what
/// bounds the memory recording a request of tiny messages takes (~1.5 KB a message, `docs/serve.md`).
pub const DEFAULT_MAX_MESSAGES: usize = 100_000;

/// Runs a CLI command against the server's open store: `(argv) → (stdout, stderr, exit code)`. The CLI
/// binary supplies it, so `condense sessions` and friends work while the server holds the store.
pub type CliHandler = Arc<dyn Fn(&Store, Vec<String>) -> (Vec<u8>, Vec<u8>, i32) + Send + Sync>;

/// How the server runs.
#[derive(Clone)]
pub struct ServeConfig {
    /// The store folder.
    pub store: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Base URL of the Anthropic API (no `/v1`).
    pub anthropic_upstream: String,
    /// Base URL of the OpenAI API (no `/v1`).
    pub openai_upstream: String,
    /// Base URL of the Gemini API (no `/v1beta`).
    pub gemini_upstream: String,
    /// Largest request body accepted, bytes.
    pub max_body_bytes: usize,
    /// Most messages (items of `messages` or `input`) a request may hold; past it, a 413.
    pub max_messages: usize,
    /// condense-tool rounds per client request at most.
    pub max_tool_rounds: u32,
    /// The store's configuration file (pruning, summarizer, model table).
    pub file: FileConfig,
    /// The summarizer for pruning and checkpoints (`None`: the embedded extractive one).
    pub summarizer: Option<Arc<dyn condense_summarize::Summarizer>>,
    /// Runs CLI commands sent by another `condense` process.
    pub cli: Option<CliHandler>,
    /// Warm projections kept in memory at most (256: a server's active conversations stay folded; their
    /// memory is bounded by `warm_bytes`, and with 64 a hundred conversations in turn were each folded
    /// again from the log on every request, 0.4 ms of a 100-message request's 1.4).
    pub warm_limit: usize,
    /// What the warm projections may hold together, about (bytes; `StoreOptions::warm_bytes`), and on its
    /// own what the open conversations' client views may hold (`conv::Conv::weight`).
    pub warm_bytes: u64,
    /// sled's page cache, bytes.
    pub cache_bytes: u64,
    /// Whether every conversation's requests are priced as the provider bills caching, through
    /// condense and as the client sent them (`cache_priced` in `/condense/status`). Off by default: it
    /// parses each body twice more, which costs serve a third of its own time on a 2-core machine.
    pub price_cache: bool,
    /// Whether conversations whose model's list prices are known are priced so without `price_cache`
    /// (on by default; `--no-price-cache` turns all pricing off).
    pub price_known_models: bool,
    /// The token every request must carry in the `x-condense-auth` header (`None`: no token; only
    /// allowed on a loopback address).
    pub auth_token: Option<String>,
    /// The memory requests may hold at once, bytes (see `budget.rs`).
    pub memory_budget: u64,
    /// How long a client may take to send a request's headers, and its body; how long a stopping server
    /// waits for requests in flight.
    pub timeouts: Timeouts,
    /// Which summaries go through the upstream with the client's credentials (when no summarizer is
    /// configured): recovery handoffs by default.
    pub summaries: summary::Summaries,
    /// The model summaries through the upstream ask (`None`: the session's previous, native model).
    pub summary_model: Option<String>,
    /// How long the provider's prompt cache keeps a conversation's prefix after its last request (`None`:
    /// for ever). A request that comes later than that after the conversation's last one finds the cache
    /// cold, and the prunes pending go ahead then (`Session::with_cold_cache`).
    pub cache_ttl: Option<std::time::Duration>,
}

/// serve's own time limits.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A request's headers must arrive within this; the connection is closed otherwise (2,000 connections
    /// with unfinished headers stayed open before issue 35).
    pub header_read: std::time::Duration,
    /// A request's body must arrive within this once its headers did (a 408 otherwise).
    pub body_read: std::time::Duration,
    /// A stopping server waits this long at most for requests in flight (a hung upstream), then stops.
    pub shutdown_grace: std::time::Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts { header_read: std::time::Duration::from_secs(10), body_read: std::time::Duration::from_secs(60), shutdown_grace: std::time::Duration::from_secs(10) }
    }
}

impl ServeConfig {
    /// Defaults for a store folder.
    pub fn new(store: impl Into<PathBuf>) -> ServeConfig {
        ServeConfig {
            store: store.into(),
            listen: DEFAULT_LISTEN.parse().expect("a socket address"),
            anthropic_upstream: DEFAULT_ANTHROPIC_UPSTREAM.into(),
            openai_upstream: DEFAULT_OPENAI_UPSTREAM.into(),
            gemini_upstream: DEFAULT_GEMINI_UPSTREAM.into(),
            max_body_bytes: DEFAULT_MAX_BODY,
            max_messages: DEFAULT_MAX_MESSAGES,
            max_tool_rounds: DEFAULT_MAX_ROUNDS,
            file: FileConfig::default(),
            summarizer: None,
            cli: None,
            warm_limit: 256,
            warm_bytes: condense_engine::DEFAULT_WARM_BYTES,
            cache_bytes: 64 << 20,
            price_cache: false,
            price_known_models: true,
            cache_ttl: Some(std::time::Duration::from_secs(condense_engine::simulate::DEFAULT_CACHE_TTL)),
            auth_token: None,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            timeouts: Timeouts::default(),
            summaries: summary::Summaries::default(),
            summary_model: None,
        }
    }
}

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The store could not be opened.
    #[error("opening store {}: {source}", condense_log::Location::parse(path))]
    Store {
        /// The store folder or database URL (shown without its password).
        path: PathBuf,
        /// Why.
        source: condense_engine::EngineError,
    },
    /// The address could not be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// An upstream URL is not usable.
    #[error("upstream URL `{0}` must start with http:// or https://")]
    Upstream(String),
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(String),
    /// A non-loopback address without a token, or an empty token.
    #[error("{0}")]
    Auth(String),
    /// The server stopped with an I/O error.
    #[error("serving: {0}")]
    Io(std::io::Error),
}

/// A running server.
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its state (for status figures in tests).
    pub state: Arc<State>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Running {
    /// Stops accepting requests and waits until the server has stopped.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.await.unwrap_or(Ok(()))
    }

    /// Waits until the server stops on its own (it does not, short of an error).
    pub async fn wait(self) -> Result<(), ServeError> {
        self.task.await.unwrap_or(Ok(()))
    }
}

/// The default memory budget of requests in flight: 2 GiB.
pub const DEFAULT_MEMORY_BUDGET: u64 = 2 << 30;

/// Accepts connections until `stop` fires, each served on a task of its own with a header-read timeout;
/// then waits for the requests in flight, at most the shutdown grace.
async fn accept(listener: tokio::net::TcpListener, app: axum::Router, timeouts: Timeouts, mut stop: tokio::sync::oneshot::Receiver<()>) -> Result<(), ServeError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(timeouts.header_read);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => {
                        // Stream events go out as they come.
                        let _ = stream.set_nodelay(true);
                        stream
                    }
                    // Out of file descriptors and the like: the listener stays, the next accept may work.
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = &mut stop => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(timeouts.shutdown_grace, graceful.shutdown()).await;
    Ok(())
}

/// A base URL without trailing `/` or `/v1` (request paths carry `/v1`).
fn base_url(url: &str) -> Result<String, ServeError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ServeError::Upstream(url.to_string()));
    }
    let u = url.trim_end_matches('/');
    Ok(u.strip_suffix("/v1").unwrap_or(u).to_string())
}

/// Opens the store and starts serving on `config.listen` (port 0 picks a free port).
pub async fn start(mut config: ServeConfig) -> Result<Running, ServeError> {
    if config.auth_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(ServeError::Auth("the authentication token is empty".into()));
    }
    if !config.listen.ip().is_loopback() && config.auth_token.is_none() {
        return Err(ServeError::Auth(format!(
            "listening on {} (not a loopback address) needs a token: --auth-token-file FILE. Requests carry API keys and the store holds every conversation, so serve does not answer other machines without one",
            config.listen
        )));
    }
    config.anthropic_upstream = base_url(&config.anthropic_upstream)?;
    config.openai_upstream = base_url(&config.openai_upstream)?;
    config.gemini_upstream = base_url(&config.gemini_upstream)?;
    config.gemini_upstream = config.gemini_upstream.strip_suffix("/v1beta").unwrap_or(&config.gemini_upstream).to_string();
    let path = config.store.clone();
    // The port first: a server that cannot listen leaves nothing behind (it made the store folder before).
    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|source| ServeError::Bind { addr: config.listen, source })?;
    // A request's history and the pipeline's decisions are written without waiting for the disk (the
    // client resends its history with every request); a reply is made durable when it is recorded.
    let options = StoreOptions { cache_bytes: config.cache_bytes, warm_limit: config.warm_limit, warm_bytes: config.warm_bytes, defer_durability: true };
    let store = tokio::task::spawn_blocking(move || Store::open_with(&path, options))
        .await
        .expect("store open task")
        .map_err(|source| ServeError::Store { path: config.store.clone(), source })?;
    if let Some(s) = &config.summarizer {
        store.set_summarizer(s.clone());
    }
    let addr = listener.local_addr().map_err(ServeError::Io)?;
    let state = state::State::new(store, config).await?;
    let app = request::routes::router(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let timeouts = state.cfg.timeouts;
    let task = tokio::spawn(accept(listener, app, timeouts, rx));
    Ok(Running { addr, state, shutdown: Some(tx), task })
}

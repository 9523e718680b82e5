//! The command line, declared with clap: every command, flag and example. `condense help COMMAND` and
//! `condense COMMAND --help` print a command's page; `cargo xtask man` writes the man page from the same
//! declaration, and `condense completions SHELL` the shell completions.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// The exit codes, the same for every command and for `--json` output.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  a finding: a failed check (verify, render of a context a provider would reject), a ref that
     recovers nothing, a file that could not be imported, a replay whose refs or validity failed
  2  a usage error (unknown command or flag, bad value) or an I/O or store error";

/// condense: records what a coding agent's session does and renders, every turn, a context that is
/// small, byte-stable and provider-valid, with every original recoverable by a short ref.
#[derive(Debug, Parser)]
#[command(name = "condense", version, about, max_term_width = 100, after_help = format!("Examples:
  condense demo                                   a generated session, replayed with pruning on
  condense serve                                  the live endpoint agents point their base URL at
  condense import ~/.pi/agent/sessions ~/.claude/projects ~/.codex/sessions
  condense simulate ~/.pi/agent/sessions --plot pi.svg

{EXIT_CODES}"))]
pub struct Cli {
    /// The store: a folder (the embedded default), or a PostgreSQL database shared by many processes
    /// (postgres://user@host/db)
    #[arg(long, global = true, env = "CONDENSE_STORE", hide_env_values = true, value_name = "DIR|URL", default_value = ".condense")]
    pub store: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a provider-compatible endpoint (Anthropic Messages, OpenAI Chat Completions and Responses, the
    /// Gemini API)
    /// that agents point their base URL at; while it runs, other commands on the store go through it
    #[command(after_help = "Example:\n  condense serve --listen 127.0.0.1:8787\n  ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude")]
    Serve(ServeArgs),
    /// Start a coding agent through condense: through the `condense serve` already running on the store,
    /// else one started for the agent and stopped when it exits; the agent is pointed at it without any
    /// of its files edited, and its arguments, terminal, signals and exit code pass through
    #[command(after_help = "Examples:
  condense run claude
  condense run codex -- exec \"fix the failing test\"
  condense --store ~/.condense run pi --keep-serve -- --model claude-sonnet-4-5

Everything after the agent's name (with or without `--`) is the agent's own. Agents must be
installed; `condense run` names the npm package of one it cannot find. docs/run.md: what each
agent is given, which of its providers go through condense.")]
    Run(RunArgs),
    /// Generate a long realistic session, import it as `demo` and print its statistics
    #[command(after_help = "Example:\n  condense demo --store /tmp/demo-store")]
    Demo {
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Import session files or folders (pi, Claude Code, Codex; recursive), or restore a store export
    #[command(after_help = "Examples:\n  condense import ~/.pi/agent/sessions\n  condense import backup.export          restore what `condense export` wrote (resumable)")]
    Import {
        /// Session files, folders of them, or export files
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
        /// Name every session relative to DIR instead of the folder given (what `watch` passes for the
        /// files it follows)
        #[arg(long, value_name = "DIR", hide = true)]
        relative_to: Option<PathBuf>,
    },
    /// Follow agents' session folders: import new session files and append what existing ones grow by,
    /// one line per change, until stopped (Ctrl-C)
    #[command(after_help = "Example:\n  condense watch ~/.claude/projects ~/.pi/agent/sessions ~/.codex/sessions\n\nWith `condense serve` running on the same store, start serve first: watch then imports through it.")]
    Watch {
        /// Folders (or files) to follow, recursively
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Quiet time before a changed file is read, in milliseconds (lets the agent finish writing)
        #[arg(long, value_name = "MS", default_value_t = 500)]
        settle: u64,
    },
    /// List the sessions in the store: id, events, name (either addresses the session)
    #[command(after_help = "Example:\n  condense sessions --json")]
    Sessions {
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Entries, turns, user-turn groups, tool calls, tokens by role and by tool, and the provider's usage
    /// priced as prompt caching is billed (through condense beside direct, for a served session)
    #[command(after_help = "Example:\n  condense stats demo --entry-ids")]
    Stats {
        /// Session name or id
        session: String,
        /// Also list the active branch's entries with their ids (what `fork --at` takes)
        #[arg(long)]
        entry_ids: bool,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Print the context the model would be sent next (or as it was after an event)
    #[command(after_help = "Examples:\n  condense render demo --as anthropic\n  condense render demo --after-event 120\n  condense render demo --entry-ids")]
    Render {
        /// Session name or id
        session: String,
        /// Wire format of the printed context
        #[arg(long = "as", value_enum, default_value_t = Format::Neutral)]
        format: Format,
        /// The context as it was after this event (a seq number of the session's log)
        #[arg(long, value_name = "SEQ")]
        after_event: Option<u64>,
        /// Print the active branch's entries with their ids instead of the context
        #[arg(long, conflicts_with = "after_event")]
        entry_ids: bool,
        /// The model named in an `openai` or `anthropic` request body (default: the session's newest)
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
    },
    /// Check the log, replay every session and compare with a fresh render, run the provider-validity
    /// check, list unfinished imports; exits 1 on any finding
    #[command(after_help = "Example:\n  condense verify --json")]
    Verify {
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Write the whole store to one portable file (a temporary file renamed on success)
    #[command(after_help = "Example:\n  condense export backup.export && condense import backup.export --store restored")]
    Export {
        /// The export file (outside the store)
        file: PathBuf,
        /// Replace an existing file
        #[arg(long)]
        force: bool,
    },
    /// Replay sessions request by request with pruning on and report tokens, cost, cache breaks,
    /// stubs, chains and recovery
    #[command(after_help = "Examples:\n  condense simulate ~/.pi/agent/sessions --plot pi.svg\n  condense simulate session.jsonl --window 32000     checkpoints as a 32k model would need; compared with pi's own compaction\n  condense simulate sessions/ --price gpt-5 --plot s.png  priced at gpt-5's list prices, plotted\n  condense simulate session.jsonl --switch 32000@200 the model moves to a 32k window at request 200\n  condense simulate session.jsonl --cache-ttl 3600   priced with Anthropic's one-hour cache\n  condense simulate session.jsonl --keep --force     store the replay as simulated/<name>")]
    Simulate {
        /// Session files or folders
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Replay as if the model had a window of N tokens (at least 1024): checkpoints fire
        #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1024..))]
        window: Option<u64>,
        /// Switch the model to one with a WINDOW-token context before request REQUEST (1-based), e.g.
        /// 32000@200: the payload guard and smaller-model recovery run; recoveries are reported
        #[arg(long, value_name = "WINDOW@REQUEST", value_parser = parse_switch)]
        switch: Option<condense_engine::simulate::Switch>,
        /// The provider cache's lifetime: a request the session's own timestamps put more than SECONDS
        /// after the one before reads nothing from the cache, raw, host compaction and condense alike
        /// (3600 for Anthropic's one-hour cache; 0: no lifetime, the gaps are ignored)
        #[arg(long, value_name = "SECONDS", default_value_t = condense_engine::simulate::DEFAULT_CACHE_TTL)]
        cache_ttl: u64,
        /// Configuration file (default: the store's config.json, else the defaults)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Write a plot, FILE.svg or FILE.png: per session, context tokens per request (raw, the host's own
        /// compaction, condense) and cumulative estimated cost, the floor beside them
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
        /// Estimate prices with MODEL's list prices (claude-opus-4-5, claude-opus-4-1, claude-sonnet-4-5,
        /// claude-haiku-4-5, gpt-5, gpt-5-mini, gpt-5-nano, gpt-4.1, or one the configuration's
        /// `listPrices` adds)
        #[arg(long, value_name = "MODEL", default_value = condense_engine::simulate::DEFAULT_PRICE_MODEL)]
        price: String,
        /// Keep the replays in the store as `simulated/<name>` (for render and query)
        #[arg(long)]
        keep: bool,
        /// With --keep: replace replays kept before
        #[arg(long, requires = "keep")]
        force: bool,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Print the originals behind refs (tN, bN, cN) or raw tool-call ids
    #[command(after_help = "Example:\n  condense query simulated/session.jsonl t12 c1")]
    Query {
        /// Session name or id
        session: String,
        /// Refs: tN (a tool output), bN (a batch), cN (a checkpoint), or a tool-call id
        #[arg(required = true, value_name = "REF")]
        refs: Vec<String>,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
        /// Print each tool output's original alone, exactly its bytes (no `=== tN ===` header, nothing added)
        #[arg(long, conflicts_with = "json")]
        raw: bool,
    },
    /// Make a checkpoint of an idle session now
    #[command(after_help = "Example:\n  condense compact demo && condense query demo c1")]
    Compact {
        /// Session name or id
        session: String,
    },
    /// Fork a session: copy the path to an entry into a new session, with the decisions about it
    #[command(after_help = "Example:\n  condense fork demo demo-b --at 00000040      (entry ids: condense render demo --entry-ids)")]
    Fork {
        /// Session name or id
        session: String,
        /// Name of the new session
        name: String,
        /// The entry the fork ends at (default: the leaf)
        #[arg(long, value_name = "ENTRY")]
        at: Option<String>,
    },
    /// Delete a session and its events from the store
    #[command(after_help = "Example:\n  condense rm simulated/session.jsonl")]
    Rm {
        /// Session name or id
        session: String,
    },
    /// The read-only recovery tools of seed 004: archives, search, read
    #[command(subcommand)]
    History(History),
    /// Print a checkpoint as a pi `compaction` entry line
    #[command(after_help = "Example:\n  condense checkpoint-line demo c1 --timestamp 2026-01-01T00:00:00.000Z")]
    CheckpointLine {
        /// Session name or id
        session: String,
        /// The checkpoint (default: the newest)
        #[arg(value_name = "cN")]
        checkpoint: Option<String>,
        /// Timestamp written into the line (default: now, UTC)
        #[arg(long, value_name = "RFC3339")]
        timestamp: Option<String>,
    },
    /// Print the pruning configuration in force, or set one key in the store's config.json
    #[command(after_help = "Examples:\n  condense config\n  condense config set recoveryGraceTurns 2")]
    Config {
        #[command(subcommand)]
        action: Option<ConfigAction>,
        /// Configuration file to show (default: the store's config.json, else the defaults)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Machine-readable output (the configuration only)
        #[arg(long)]
        json: bool,
    },
    /// Print shell completions
    #[command(after_help = "Example:\n  condense completions bash > ~/.local/share/bash-completion/completions/condense")]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
}

/// `condense run`'s arguments.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// The agent: claude (Claude Code), codex, pi, opencode or gemini (Gemini CLI)
    #[arg(value_enum, value_name = "AGENT")]
    pub agent: Agent,
    /// The agent's own arguments, passed as given
    #[arg(value_name = "AGENT ARGS", trailing_var_arg = true, allow_hyphen_values = true, value_parser = clap::value_parser!(std::ffi::OsString))]
    pub args: Vec<std::ffi::OsString>,
    /// Leave the `condense serve` this command starts running when the agent exits (the next `condense
    /// run`, and other commands on the store, go through it)
    #[arg(long)]
    pub keep_serve: bool,
    /// serve's own flags, for the server this command starts (ignored when one already runs)
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The agents `condense run` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Agent {
    /// Claude Code (`claude`)
    Claude,
    /// OpenAI Codex CLI (`codex`)
    Codex,
    /// pi (`pi`, the pi coding agent)
    Pi,
    /// opencode (`opencode`)
    Opencode,
    /// Gemini CLI (`gemini`)
    Gemini,
}

/// `condense serve`'s flags.
#[derive(Debug, Args, Clone, PartialEq)]
pub struct ServeArgs {
    /// Address to listen on (loopback unless you mean otherwise: requests carry API keys); default
    /// 127.0.0.1:8787, and for `condense run` a free loopback port
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Where Anthropic Messages requests go
    #[arg(long, value_name = "URL")]
    pub anthropic_upstream: Option<String>,
    /// Where OpenAI Chat Completions and Responses requests go
    #[arg(long, value_name = "URL")]
    pub openai_upstream: Option<String>,
    /// Where Gemini API requests go (default: the public Gemini API)
    #[arg(long, value_name = "URL")]
    pub gemini_upstream: Option<String>,
    /// Largest request body accepted (bytes, at least 1024)
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1024..))]
    pub max_body_bytes: Option<u64>,
    /// Most messages a request may hold (default 100,000, the Anthropic API's own limit); past it, a 413
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_messages: Option<u64>,
    /// Most rounds of condense's own tool calls answered inside one client request
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tool_rounds: Option<u32>,
    /// Configuration file (default: the store's config.json, else the defaults)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Price every conversation's requests as the provider bills prompt caching, through condense and as
    /// the client sent them (`cache_priced` in /condense/status; costs serve CPU time)
    #[arg(long, conflicts_with = "no_price_cache")]
    pub price_cache: bool,
    /// Price nothing: without it, conversations whose model's list prices are known (the embedded table,
    /// `listPrices` in config.json) are priced by default
    #[arg(long)]
    pub no_price_cache: bool,
    /// A file holding the token every request must carry in the `x-condense-auth` header (required to
    /// listen on anything but loopback)
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Memory that requests may hold at once (bytes, default 2 GiB); past it a request gets a 503 with
    /// retry-after, or a 413 when it could never fit
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1 << 20..))]
    pub memory_budget: Option<u64>,
    /// Memory the sessions kept warm (folded, ready to render) may hold together, and the conversations'
    /// client views theirs, each about (bytes, default 512 MiB); beyond it the least recently used idle
    /// ones are dropped and folded again from the store when next used
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1 << 20..))]
    pub warm_bytes: Option<u64>,
    /// How serve's log lines on stderr are written (one per request, and what it notices); which lines
    /// come is set by RUST_LOG (default `info`)
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which summaries a model writes through the upstream, with the client's own credentials (when the
    /// configuration names no summarizer); condense's extractive summarizer writes the rest and stands in
    /// whenever a call fails
    #[arg(long, value_name = "WHICH", value_enum, default_value_t = SummariesArg::Handoffs)]
    pub summaries: SummariesArg,
    /// The model summaries through the upstream ask (default: the session's previous model, the one its
    /// history was written by)
    #[arg(long, value_name = "MODEL")]
    pub summary_model: Option<String>,
    /// The provider cache's lifetime (default 300; 3600 for Anthropic's one-hour cache; 0: none): a
    /// request that comes longer after its conversation's last one finds the cache cold, and the pruning
    /// condense held back to keep the cache goes ahead then
    #[arg(long, value_name = "SECONDS")]
    pub cache_ttl: Option<u64>,
}

/// serve's default address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

impl ServeArgs {
    /// The flags that give these arguments again (`condense run` starts `condense serve` with them);
    /// `listen` stands in for an address not given.
    pub fn to_args(&self, listen: std::net::SocketAddr) -> Vec<std::ffi::OsString> {
        // Every field named: a flag added to serve is a compile error here until it is passed on.
        let ServeArgs {
            listen: given,
            anthropic_upstream,
            openai_upstream,
            gemini_upstream,
            max_body_bytes,
            max_messages,
            max_tool_rounds,
            config,
            price_cache,
            no_price_cache,
            auth_token_file,
            memory_budget,
            warm_bytes,
            log_format,
            summaries,
            summary_model,
            cache_ttl,
        } = self;
        let mut out: Vec<std::ffi::OsString> = Vec::new();
        let mut flag = |name: &str, value: std::ffi::OsString| {
            out.push(format!("--{name}").into());
            out.push(value);
        };
        flag("listen", given.unwrap_or(listen).to_string().into());
        let text = |v: &dyn ToString| std::ffi::OsString::from(v.to_string());
        let named = |v: &dyn Fn() -> Option<clap::builder::PossibleValue>| std::ffi::OsString::from(v().map(|p| p.get_name().to_string()).unwrap_or_default());
        anthropic_upstream.iter().for_each(|u| flag("anthropic-upstream", u.into()));
        openai_upstream.iter().for_each(|u| flag("openai-upstream", u.into()));
        gemini_upstream.iter().for_each(|u| flag("gemini-upstream", u.into()));
        max_body_bytes.iter().for_each(|n| flag("max-body-bytes", text(n)));
        max_messages.iter().for_each(|n| flag("max-messages", text(n)));
        max_tool_rounds.iter().for_each(|n| flag("max-tool-rounds", text(n)));
        config.iter().for_each(|f| flag("config", f.clone().into_os_string()));
        auth_token_file.iter().for_each(|f| flag("auth-token-file", f.clone().into_os_string()));
        memory_budget.iter().for_each(|n| flag("memory-budget", text(n)));
        warm_bytes.iter().for_each(|n| flag("warm-bytes", text(n)));
        flag("log-format", named(&|| log_format.to_possible_value()));
        flag("summaries", named(&|| summaries.to_possible_value()));
        summary_model.iter().for_each(|m| flag("summary-model", m.into()));
        cache_ttl.iter().for_each(|n| flag("cache-ttl", text(n)));
        if *price_cache {
            out.push("--price-cache".into());
        }
        if *no_price_cache {
            out.push("--no-price-cache".into());
        }
        out
    }
}

/// `condense serve --summaries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SummariesArg {
    /// The handoff of a recovery onto a smaller model
    Handoffs,
    /// Every summary: recovery and checkpoint handoffs, and the summaries of pruned tool outputs
    /// (pi-condense's way)
    Upstream,
    /// None: every summary extractive
    Extractive,
}

/// The form of serve's log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line each
    Text,
    /// One JSON object each
    Json,
}

/// `condense history`'s verbs.
#[derive(Debug, Subcommand)]
pub enum History {
    /// Commit an archive view of the context as it stands
    #[command(after_help = "Example:\n  condense history archive demo")]
    Archive {
        /// Session name or id
        session: String,
    },
    /// List archives, newest first, 20 per page
    #[command(after_help = "Example:\n  condense history archives demo --page 1")]
    Archives {
        /// Session name or id
        session: String,
        /// Page number (from 0)
        #[arg(long, default_value_t = 0)]
        page: usize,
    },
    /// Search an archive for keywords
    #[command(after_help = "Example:\n  condense history search demo FAILED test --archive a1")]
    Search {
        /// Session name or id
        session: String,
        /// Keywords
        #[arg(required = true)]
        keywords: Vec<String>,
        /// The archive (default: the newest)
        #[arg(long, value_name = "aN")]
        archive: Option<String>,
    },
    /// Read an entry of an archive, a page at a time
    #[command(after_help = "Example:\n  condense history read demo 00000040 --offset 4096")]
    Read {
        /// Session name or id
        session: String,
        /// Entry id
        entry: String,
        /// Byte offset to read from
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// The archive (default: the newest)
        #[arg(long, value_name = "aN")]
        archive: Option<String>,
    },
}

/// `condense config`'s verbs.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Set one key in the store's config.json (checked before it is written)
    Set {
        /// The key, as in the configuration file (e.g. recoveryGraceTurns)
        key: String,
        /// The value (JSON, or a bare string)
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
}

/// Wire formats `render` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// condense's own message model
    Neutral,
    /// An OpenAI Chat Completions request body (model, max_completion_tokens, messages, condense's tools when used)
    Openai,
    /// An Anthropic Messages request body (model, max_tokens, messages, condense's tools when used)
    Anthropic,
}

impl Command {
    /// Whether the command creates the store when it does not exist (the others refuse a missing one).
    pub fn creates_store(&self) -> bool {
        matches!(self, Command::Import { .. } | Command::Demo { .. } | Command::Serve(_) | Command::Run(_) | Command::Watch { .. })
            || matches!(self, Command::Simulate { keep: true, .. })
    }

    /// Whether the command needs no store at all.
    pub fn needs_no_store(&self) -> bool {
        matches!(self, Command::Completions { .. } | Command::Config { .. } | Command::Simulate { keep: false, .. })
    }
}

/// The clap command, for completions and the man page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// `WINDOW@REQUEST` of `simulate --switch`.
fn parse_switch(s: &str) -> Result<condense_engine::simulate::Switch, String> {
    let (w, at) = s.split_once('@').ok_or_else(|| format!("`{s}` is not WINDOW@REQUEST (e.g. 32000@200)"))?;
    let window: u64 = w.trim().parse().map_err(|_| format!("`{w}` is not a window in tokens"))?;
    let at: u64 = at.trim().parse().map_err(|_| format!("`{at}` is not a request number"))?;
    if window < 1024 || at == 0 {
        return Err(format!("`{s}`: the window is at least 1024 tokens and requests count from 1"));
    }
    Ok(condense_engine::simulate::Switch { window, at })
}

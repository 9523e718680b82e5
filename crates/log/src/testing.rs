//! A throwaway PostgreSQL cluster for tests: `initdb` into a temporary folder,
//! `postgres` on a free loopback port with trust authentication, and a watchdog that stops the server when
//! the test process ends, however it ends. It needs the server binaries of the machine's PostgreSQL
//! package (Debian: `postgresql`, found under `/usr/lib/postgresql/*/bin` or on `PATH`). Run as root, the
//! server runs as the `postgres` user the package creates (PostgreSQL refuses to run as root).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// A running cluster, stopped when dropped (or when the process ends).
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_user: Option<&'static str>,
    port: u16,
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

static SHARED: OnceLock<Cluster> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(1);

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
fn server_bin() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).filter(|b| b.join("initdb").is_file()).collect())
        .unwrap_or_default();
    found.sort_by_key(|p| p.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0));
    if let Some(b) = found.pop() {
        return b;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
            return dir;
        }
    }
    panic!(
        "the PostgreSQL tests need the server binaries (initdb, pg_ctl, postgres): install the distribution's \
         package (Debian: `apt-get install postgresql`; `.ci/run` does)"
    );
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port").local_addr().expect("its address").port()
}

impl Cluster {
    /// The cluster the whole test process shares (started on first use); tests take a database each.
    pub fn shared() -> &'static Cluster {
        SHARED.get_or_init(Cluster::start)
    }

    /// A new cluster of its own (for tests that stop and restart the server).
    pub fn start() -> Cluster {
        let bin = server_bin();
        let as_user = is_root().then_some("postgres");
        let dir = tempfile::Builder::new().prefix("condense-pg-").tempdir().expect("a temporary folder");
        if let Some(u) = as_user {
            let ok = Command::new("chown").arg(u).arg(dir.path()).status().is_ok_and(|s| s.success());
            assert!(ok, "chown {u} {}: the `postgres` user should exist once PostgreSQL is installed", dir.path().display());
        }
        let c = Cluster { dir, bin, as_user, port: free_port(), watchdog: Mutex::new(None) };
        let data = c.data();
        let out = c
            .command("initdb")
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .expect("running initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nmax_connections = 200\nshared_buffers = 64MB\nfsync = on\n",
            c.port,
            c.dir.path().display()
        );
        std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).and_then(|mut f| f.write_all(conf.as_bytes())).expect("writing postgresql.conf");
        c.up();
        // The watchdog holds the read end of a pipe whose write end only this process has: when the
        // process ends, the read returns, the server is stopped and its folder removed (the shared
        // cluster lives in a static, which is never dropped, so its `TempDir` cannot remove it).
        let script = format!(
            "read _; {} stop -m fast -D '{}' >/dev/null 2>&1; rm -rf '{}'; exit 0",
            c.prefix("pg_ctl"),
            data.display(),
            c.dir.path().display()
        );
        let mut child = Command::new("sh").arg("-c").arg(script).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("starting the watchdog");
        let stdin = child.stdin.take().expect("piped");
        *c.watchdog.lock().expect("watchdog lock") = Some((child, stdin));
        c
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `tool` as a shell command prefix, run as the server's user.
    fn prefix(&self, tool: &str) -> String {
        let path = self.bin.join(tool);
        match self.as_user {
            Some(u) => format!("runuser -u {u} -- '{}'", path.display()),
            None => format!("'{}'", path.display()),
        }
    }

    fn command(&self, tool: &str) -> Command {
        match self.as_user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(self.bin.join(tool));
                c
            }
            None => Command::new(self.bin.join(tool)),
        }
    }

    fn pg_ctl(&self, args: &[&str]) -> bool {
        let log = self.dir.path().join("server.log");
        self.command("pg_ctl")
            .args(args)
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts the server (waiting until it accepts connections).
    pub fn up(&self) {
        assert!(self.pg_ctl(&["start", "-w", "-t", "60"]), "postgres did not start: {}", self.server_log());
    }

    /// Stops the server: `fast` (clean), or `immediate` (as a crash: recovery from the WAL at the next start).
    pub fn down(&self, mode: &str) {
        assert!(self.pg_ctl(&["stop", "-w", "-m", mode]), "postgres did not stop: {}", self.server_log());
    }

    /// Stops every process of the server (SIGSTOP) without closing anything: connections stay open and
    /// new ones are accepted by the kernel, but nothing answers (a hung server, as in a partition).
    pub fn pause(&self) {
        let pids = self.pids();
        self.signal("STOP", pids.iter());
    }

    /// Lets the processes [`Cluster::pause`] stopped go on.
    pub fn resume(&self) {
        let pids = self.pids();
        self.signal("CONT", pids.iter().rev());
    }

    /// The server's processes: the postmaster first, then its children.
    fn pids(&self) -> Vec<u32> {
        let pid_file = std::fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        let main: u32 = pid_file.lines().next().and_then(|l| l.trim().parse().ok()).expect("the postmaster's pid");
        let mut pids = vec![main];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // `pid (comm) state ppid …`: the fields after the last `)`.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(main) {
                pids.push(pid);
            }
        }
        pids
    }

    fn signal<'a>(&self, sig: &str, pids: impl Iterator<Item = &'a u32>) {
        let args: Vec<String> = pids.map(u32::to_string).collect();
        let ok = Command::new("kill").arg(format!("-{sig}")).args(&args).status().is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {args:?}");
    }

    /// The server's log so far (for failure messages).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates an empty database of its own and returns its URL.
    pub fn database(&self) -> String {
        let name = format!("t{}_{}", std::process::id(), NEXT_DB.fetch_add(1, Ordering::SeqCst));
        let mut c = postgres::Client::connect(&self.url("postgres"), postgres::NoTls).expect("connecting to the test cluster");
        c.batch_execute(&format!("CREATE DATABASE {name}")).expect("creating a test database");
        self.url(&name)
    }

    /// Runs `sql` on database `url` (a test's direct change to what a store holds).
    pub fn execute(&self, url: &str, sql: &str) {
        let mut c = postgres::Client::connect(url, postgres::NoTls).expect("connecting to the test cluster");
        c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Begins a transaction on database `url` that runs `sql` (a lock it takes, as a second writer's
    /// would) and holds it until [`Held::commit`].
    pub fn hold(&self, url: &str, sql: &str) -> Held {
        let mut c = postgres::Client::connect(url, postgres::NoTls).expect("connecting to the test cluster");
        c.batch_execute(&format!("BEGIN; {sql}")).unwrap_or_else(|e| panic!("{sql}: {e}"));
        Held { client: c, url: url.to_string() }
    }

    /// The cluster's folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A transaction a test holds open ([`Cluster::hold`]).
pub struct Held {
    client: postgres::Client,
    url: String,
}

impl Held {
    /// Waits until another connection to the same database waits for a lock (one this transaction
    /// holds), up to 60 s.
    pub fn wait_for_a_waiter(&self) {
        let mut c = postgres::Client::connect(&self.url, postgres::NoTls).expect("connecting to the test cluster");
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
        for _ in 0..600 {
            let row = c.query_one(waiting, &[]).expect("reading pg_stat_activity");
            if row.get::<_, i64>(0) > 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("no connection waited for the lock held in 60 s");
    }

    /// Runs `sql` in the transaction and commits it, releasing its locks.
    pub fn commit(mut self, sql: &str) {
        self.client.batch_execute(&format!("{sql}; COMMIT")).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.watchdog.lock().expect("watchdog lock").take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

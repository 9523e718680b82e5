//! The dashboard in a real browser: Debian's Chromium, headless, driven through ChromeDriver's WebDriver
//! protocol on loopback. `cargo xtask test` installs both (packages `chromium` and `chromium-driver`);
//! without them these tests fail and say so.

use super::*;

/// A ChromeDriver process and one browser session in it, both stopped on drop.
struct Browser {
    driver: std::process::Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

fn find(names: &[&str]) -> Option<std::path::PathBuf> {
    names.iter().find_map(|n| {
        let p = Path::new(n);
        if p.is_absolute() {
            return p.exists().then(|| p.to_path_buf());
        }
        std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|d| d.join(n)).find(|p| p.exists()))
    })
}

impl Browser {
    async fn start() -> Browser {
        let chromium = find(&["chromium", "/usr/bin/chromium", "chromium-browser"])
            .expect("the dashboard's browser tests need Debian's `chromium` (apt-get install chromium chromium-driver); `cargo xtask test` installs it");
        let driver_bin = find(&["chromedriver", "/usr/bin/chromedriver"])
            .expect("the dashboard's browser tests need ChromeDriver (Debian's `chromium-driver`); `cargo xtask test` installs it");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = std::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(r) = http.get(format!("{base}/status")).send().await {
                if r.bytes().await.ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).is_some_and(|v| v["value"]["ready"] == true) {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not come up on port {port}");
        let profile = tempfile::tempdir().unwrap();
        // Chromium's own traffic (updates, sync, metrics) is turned off: only loopback is reached.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--window-size=1280,1800",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium.to_string_lossy(), "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let resp = http.post(format!("{base}/session")).header("content-type", "application/json").body(caps.to_string()).send().await.unwrap();
        let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        let session = v["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("a browser session: {v}")).to_string();
        Browser { driver, base, session, http, _profile: profile }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let rb = self.http.request(method, url);
        let rb = match body {
            Some(b) => rb.header("content-type", "application/json").body(b.to_string()),
            None => rb,
        };
        let bytes = rb.send().await.unwrap().bytes().await.unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("chromedriver answered {path} with {e}: {}", String::from_utf8_lossy(&bytes)));
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    async fn eval(&self, script: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    /// Waits until `script` returns something other than null/false/empty; returns it.
    async fn until(&self, what: &str, script: &str) -> Value {
        for _ in 0..150 {
            let v = self.eval(script).await;
            if !(v.is_null() || v == false || v == "" || v.as_object().is_some_and(|o| o.contains_key("error"))) {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("waited in vain for {what}; the page: {}", self.eval("return document.body.innerText").await);
    }

    /// The page's console messages at level SEVERE (errors, failed loads).
    async fn console_errors(&self) -> Vec<String> {
        let v = self.call(reqwest::Method::POST, "/se/log", Some(json!({"type": "browser"}))).await;
        let entries = v.as_array().unwrap_or_else(|| panic!("the browser's log: {v}"));
        entries.iter().filter(|e| e["level"] == "SEVERE").map(|e| e["message"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// Ends the browser session (Chromium exits) and then the driver.
    async fn quit(self) {
        self.call(reqwest::Method::DELETE, "", None).await;
    }

    async fn screenshot(&self, to: &Path) {
        use base64::Engine as _;
        let v = self.call(reqwest::Method::GET, "/screenshot", None).await;
        std::fs::write(to, base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap()).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The sessions list and a session page, in Chromium: no console errors, the figures `/condense/status`
/// gives, and a stub expanded to its original, byte for byte what `context_tree_query` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_status_figures_and_expands_a_stub_in_a_browser() {
    // Fourteen turns of two outputs each on a model with a 24,000-token window (the defaults prune them
    // into stubs and chains); the model queries a stub once.
    let mut steps = Vec::new();
    for t in 0..14 {
        steps.push(Step::Shell(format!("seq {} {}", t * 7, 2500 + t * 7)));
        steps.push(Step::Shell(format!("ls -la /usr/lib | head -{}", 40 + t)));
        if t == 9 {
            steps.push(Step::QueryNewestStub);
        }
        steps.push(Step::Text(format!("Done with step {t}: the numbers are counted and the listing read.")));
    }
    steps.push(Step::Text("One more answer.".into()));
    let fake = Fake::start(steps).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.file.raw.rolling_window = None;
    cfg.price_cache = true;
    cfg.file.models = vec![("fake-model".into(), ModelLimits { context_window: 24_000, max_output: Some(4_000) })];
    let serve = start(cfg).await.expect("serve starts");
    let url = format!("http://{}", serve.addr);
    let mut agent = Agent::new(Api::Anthropic, false, &url);
    for t in 0..14 {
        agent.turn(&format!("Step {t}: count the numbers and list the libraries")).await.unwrap();
    }
    // A message no checkpoint can fit in the window: refused, and the refusal shown with its session.
    agent.user(&"an enormous pasted log line\n".repeat(5_000));
    let (code, body) = agent.request().await.unwrap_err();
    assert_eq!(code, 400, "{body}");
    agent.history.pop();
    let status = serve.state.status().await;
    let live = &status["active_sessions"][0];
    let id = live["id"].as_u64().unwrap();
    assert_eq!(live["failures"], 1, "{status}");

    let browser = Browser::start().await;
    browser.goto(&format!("{url}/condense/")).await;
    let row = browser
        .until("the sessions table", &format!("const r = document.querySelector('#sessions tr[data-id=\"{id}\"]'); return r && r.querySelector('td.requests').textContent"))
        .await;
    assert_eq!(row, live["requests"].to_string(), "the session's requests as status counts them");
    let text = browser.eval("return document.body.innerText").await;
    for word in ["null", "undefined", "NaN"] {
        assert!(!text.as_str().unwrap().contains(word), "`{word}` on the page: {text}");
    }
    let total = browser.eval("return document.getElementById('total-requests').textContent").await;
    assert_eq!(total, format!("{} requests", status["requests"]));
    let stubs = browser.eval(&format!("return document.querySelector('#sessions tr[data-id=\"{id}\"] td.stubs').textContent")).await;
    assert_eq!(stubs, live["stubs"].to_string());
    // Issue 62, item 8: the table fits the page at 1,280 pixels (the last activity in view, no scrollbar),
    // and a session's name wraps between words, not inside one.
    let fits = browser
        .eval("const t = document.getElementById('sessions'); const last = t.querySelector('tbody tr td.last'); return [t.scrollWidth, document.getElementById('main').clientWidth, last.getBoundingClientRect().right, window.innerWidth, getComputedStyle(t.querySelector('tbody td')).wordBreak]")
        .await;
    assert!(fits[0].as_f64() <= fits[1].as_f64() && fits[2].as_f64() <= fits[3].as_f64(), "the table overflows: {fits}");
    assert_eq!(fits[4], "normal", "names break between words");
    let refused = browser.eval(&format!("return document.querySelector('#sessions tr[data-id=\"{id}\"] td.refused').textContent")).await;
    assert_eq!(refused, "1");
    let failure = browser
        .until("the refused request", "const f = document.querySelector('#failures li.failure'); return f && [f.querySelector('a.session').textContent, f.querySelector('.code').textContent, f.querySelector('.reason').textContent]")
        .await;
    assert_eq!(failure[0], live["name"], "the refusal names its session");
    assert_eq!(failure[1], "400 CONTEXT_COMPACTION_FAILED");
    let reason = failure[2].as_str().unwrap();
    assert!(reason.contains("CONTEXT_COMPACTION_FAILED") && reason.contains("larger window"), "the reason in full: {reason}");
    let cost = browser.eval(&format!("return document.querySelector('#sessions tr[data-id=\"{id}\"] td.cost').textContent")).await;
    let ratio = live["cache_priced"]["cost_vs_direct"].as_f64().expect("priced");
    assert_eq!(cost, format!("{:.1}%", 100.0 * ratio));

    // The session page: its plot, its context, and a stub expanded.
    browser.eval(&format!("document.querySelector('#sessions tr[data-id=\"{id}\"] a.name').click(); return true")).await;
    let requests = browser.until("the session page", "const e = document.getElementById('fig-requests'); return e && e.textContent").await;
    assert_eq!(requests, live["requests"].to_string());
    // The floor beside the cost (issue 60, item 2): in the card, and as a line of the cost plot.
    let card = browser.eval("return document.getElementById('fig-cost').textContent").await;
    let priced = &live["cache_priced"];
    let (ratio, floor) = (priced["cost_vs_direct"].as_f64().unwrap(), priced["floor_vs_direct"].as_f64().expect("the floor"));
    assert!(floor > 0.0 && floor < 1.0, "{priced}");
    assert_eq!(card, format!("{:.1}% ({:.1}%)", 100.0 * ratio, 100.0 * floor));
    let floor_line = browser.until("the floor line", "const p = document.querySelector('#cost polyline.series-cost_floor'); return p && p.getAttribute('points')").await;
    assert_eq!(floor_line.as_str().unwrap().split(' ').count() as u64, live["requests"].as_u64().unwrap(), "the floor at every request");
    let total = browser.eval("return document.getElementById('total-requests').textContent").await;
    assert_eq!(total, format!("{} requests", status["requests"]));
    let points = browser.until("the plot", "const p = document.querySelector('#tokens polyline.series-sent'); return p && p.getAttribute('points')").await;
    assert_eq!(points.as_str().unwrap().split(' ').count() as u64, live["requests"].as_u64().unwrap(), "one point per request");
    let api: Value = serde_json::from_slice(&reqwest::get(format!("{url}/condense/api/sessions/{id}")).await.unwrap().bytes().await.unwrap()).unwrap();
    let breaks = api["live"]["cache_breaks"].as_u64().unwrap();
    assert!(breaks >= 1, "the prune of turn two rewrote the context: {api}");
    let dots = browser.eval("return document.querySelectorAll('#tokens circle.cache-break').length").await;
    assert_eq!(dots.as_u64(), Some(breaks), "a dot per cache break");
    let window = browser.eval("const p = document.querySelector('#tokens polyline.window'); return p && p.getAttribute('points').split(' ').length").await;
    assert_eq!(window.as_u64(), live["requests"].as_u64(), "the window line spans every request");
    let timeline = browser.until("the decisions", "return document.querySelectorAll('#timeline li').length").await;
    assert!(timeline.as_u64().unwrap() >= 2, "{timeline}");
    // Issue 60, item 1: each decision that changed the context shows its net to date, and the session's
    // card the nets summed and how many have not paid for themselves, as the API gives them.
    let events: Value = serde_json::from_slice(&reqwest::get(format!("{url}/condense/api/sessions/{id}/timeline?after=0")).await.unwrap().bytes().await.unwrap()).unwrap();
    let accounted = events["events"].as_array().unwrap().iter().filter_map(|e| e["accounts"].as_array()).map(Vec::len).sum::<usize>();
    assert!(accounted >= 2, "the prunes of this session have accounts: {events}");
    let nets = browser.until("the decisions' nets", "const n = document.querySelectorAll('#timeline .net'); return n.length > 0 && n.length").await;
    assert_eq!(nets.as_u64(), Some(accounted as u64));
    let card = browser.eval("return document.getElementById('fig-net').textContent").await;
    let acc = &api["accounts"];
    let (net, tail) = card.as_str().unwrap().split_once(' ').unwrap_or_else(|| panic!("{card}"));
    assert!((net.parse::<f64>().unwrap() - acc["net"].as_f64().unwrap()).abs() <= 0.051, "{card} against {acc}");
    assert_eq!(tail, format!("({} of {})", acc["net_negative"], acc["decisions"]));
    // Item 8: an error in the decisions is shown whole (it was cut at 160 characters); the page says which
    // figures cover the time since serve started and which the whole log; the axis ticks are round.
    let error = browser.until("the refusal among the decisions", "const li = [...document.querySelectorAll('#timeline li')].find((l) => l.querySelector('.kind-error')); return li && li.textContent").await;
    assert!(error.as_str().unwrap().contains("use a model with a larger window"), "the error whole: {error}");
    let note = browser.eval("return document.getElementById('span-note').textContent").await;
    assert!(note.as_str().unwrap().contains("since it started") && note.as_str().unwrap().contains("the whole log"), "{note}");
    let ticks = browser.eval("return [...document.querySelectorAll('#tokens text.tick')].map((t) => t.textContent)").await;
    let values: Vec<f64> = ticks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let t = t.as_str().unwrap();
            match t.strip_suffix('k').map(|n| (n, 1e3)).or_else(|| t.strip_suffix('M').map(|n| (n, 1e6))) {
                Some((n, k)) => n.parse::<f64>().unwrap() * k,
                None => t.parse::<f64>().unwrap(),
            }
        })
        .collect();
    assert!(values.len() >= 3 && values[0] == 0.0, "{ticks}");
    let step = values[1];
    let mantissa = step / 10f64.powf(step.log10().floor());
    assert!([1.0, 2.0, 2.5, 5.0].iter().any(|m| (m - mantissa).abs() < 1e-9), "a round step: {ticks}");
    assert!(values.windows(2).all(|w| (w[1] - w[0] - step).abs() < 1e-6), "even steps: {ticks}");
    // A session of 92 checkpoints draws them as ticks on the axis, not a band over the plot; three are
    // lines the plot's height.
    let heights = browser
        .eval(
            "const draw = (k) => { const rows = []; for (let n = 1; n <= 200; n++) rows.push({ n, received: 30000, sent: 12000, window: 32000, checkpoints: Math.floor(n * k / 200), cache_break: false }); \
             const svg = plot(rows, { id: 'probe', label: 'probe', fmt: num, window: true, markers: true, series: [{ key: 'sent', color: 'black' }] }); \
             return [...svg.querySelectorAll('line.checkpoint')].map((l) => l.getAttribute('y2') - l.getAttribute('y1')); }; \
             return [draw(92), draw(3)]",
        )
        .await;
    let (many, few) = (heights[0].as_array().unwrap(), heights[1].as_array().unwrap());
    assert!(many.len() >= 90 && many.iter().all(|h| h.as_f64().unwrap() <= 8.0), "92 checkpoints as ticks: {many:?}");
    assert!(few.len() == 3 && few.iter().all(|h| h.as_f64().unwrap() > 100.0), "three as lines: {few:?}");
    let r = browser.until("a stub with a ref", "const b = document.querySelector('#context button.ref[data-ref^=\"t\"]'); return b && b.dataset.ref").await;
    let r = r.as_str().unwrap().to_string();
    browser.eval(&format!("document.querySelector('#context button.ref[data-ref=\"{r}\"]').click(); return true")).await;
    let shown = browser.until("the original", &format!("const p = document.querySelector('#context pre.original[data-ref=\"{r}\"]'); return p && p.textContent")).await;
    let store = serve.state.store().clone();
    let session = store.session(live["name"].as_str().unwrap()).unwrap();
    let answer = session.query(&[r.clone()]).unwrap();
    assert!(!answer.is_error, "{}", answer.text);
    assert_eq!(shown.as_str().unwrap(), answer.text, "the page shows what context_tree_query returns");
    let n: usize = r[1..].parse().unwrap();
    assert!(answer.text.ends_with(&agent.outputs[n - 1]), "{r}'s original is the command's output");

    let text = browser.eval("return document.body.innerText").await;
    for word in ["null", "undefined", "NaN"] {
        assert!(!text.as_str().unwrap().contains(word), "`{word}` on the session page: {text}");
    }
    // The page follows the conversation as it goes on, without a reload.
    agent.turn("one more question").await.unwrap();
    let now = serve.state.status().await["active_sessions"][0]["requests"].clone();
    assert_eq!(now.as_u64(), live["requests"].as_u64().map(|n| n + 1));
    browser.until("the new request on the page", &format!("const e = document.getElementById('fig-requests'); return e && e.textContent === '{now}'")).await;
    let shown = browser.eval(&format!("const p = document.querySelector('#context pre.original[data-ref=\"{r}\"]'); return p && p.textContent")).await;
    assert_eq!(shown.as_str(), Some(answer.text.as_str()), "an expanded original stays expanded as the page updates");
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    if let Some(to) = std::env::var_os("CONDENSE_DASHBOARD_SCREENSHOT") {
        browser.screenshot(Path::new(&to)).await;
    }
    browser.quit().await;
    serve.stop().await.unwrap();
}


//! The `condense` binary end to end: demo, import, stats, render in every format, verify, export and
//! restore, and one-line errors with a non-zero exit.

use std::process::Command;

#[path = "support/crash_rounds.rs"]
mod crash_rounds;

fn condense(store: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(store).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn demo_import_render_verify_export() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (code, out, _) = condense(&store, &["demo", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tool_calls"], 360);
    assert_eq!(v["user_turn_groups"], 12);
    assert!(v["tool_errors"].as_u64().unwrap() > 0);
    // The main job: the replay with condense in the loop, its savings and a plot.
    let sim = &v["simulation"];
    assert_eq!(sim["session"], "demo/pruned");
    assert!(sim["token_ratio"].as_f64().unwrap() < 0.2, "{sim}");
    assert_eq!(sim["refs_recovered_exact"], sim["refs_checked"]);
    assert_eq!(sim["validity_errors"], 0);
    assert!(std::fs::read_to_string(v["plot"].as_str().unwrap()).unwrap().starts_with("<svg"));
    // Dollars at the default model's list prices, condense well under the agent alone.
    assert_eq!(sim["price_model"], "claude-sonnet-4-5");
    assert!(sim["dollars"]["condense"].as_f64().unwrap() < sim["dollars"]["raw"].as_f64().unwrap() * 0.2, "{sim}");
    let (code, out, _) = condense(&store, &["demo"]);
    assert_eq!(code, 0);
    assert!(out.contains("input tokens sent") && out.contains("refs recovered      360/360") && out.contains("condense serve"), "{out}");
    // The headline compares with what the agent would really send (its own compaction at the model's
    // window), and the unlimited history comes after it, said to be an upper bound.
    let host = out.find("Against the agent compacting its own history").expect("the host baseline");
    let unlimited = out.find("Against the agent with no limit").expect("the unlimited baseline");
    assert!(host < unlimited && out.contains("an upper bound"), "{out}");
    assert!(sim["host_cost_ratio"].as_f64().unwrap() < 1.0 && sim["host_compactions"].as_u64().unwrap() > 0, "{sim}");
    assert!(out.contains("estimated cost      $") && out.contains("at claude-sonnet-4-5 list prices"), "{out}");

    let (code, out, _) = condense(&store, &["render", "demo", "--as", "anthropic", "--after-event", "20"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "user");
    assert_eq!(msgs[1]["content"].as_array().unwrap().last().unwrap()["type"], "tool_use");
    let (code, out, err) = condense(&store, &["render", "demo", "--as", "openai"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["messages"].as_array().unwrap().len(), 744);
    assert!(v["model"].is_null() && err.contains("pass --model NAME"), "{err}");
    // A complete request body: model, output limit, messages, and condense's tools once stubs refer to them.
    let (code, out, _) = condense(&store, &["render", "demo/pruned", "--as", "anthropic", "--model", "claude-sonnet-4-5"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["model"], "claude-sonnet-4-5");
    assert!(v["max_tokens"].as_u64().unwrap() > 0);
    assert_eq!(v["messages"][0]["role"], "user");
    assert!(v["tools"].as_array().unwrap().iter().any(|t| t["name"] == "context_tree_query" && t["input_schema"].is_object()), "{}", v["tools"]);

    let (code, out, _) = condense(&store, &["verify", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["failed"], 0);

    let export = dir.path().join("x.export");
    assert_eq!(condense(&store, &["export", export.to_str().unwrap()]).0, 0);
    let other = dir.path().join("other");
    let (code, out, _) = condense(&other, &["import", export.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("restored 2 sessions"), "{out}");
    let a = condense(&store, &["render", "demo"]).1;
    let b = condense(&other, &["render", "demo"]).1;
    assert_eq!(a, b);
}

#[test]
fn errors_are_one_line_and_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // A command that reads a store refuses a missing one (a mistyped --store) and creates nothing.
    let (code, _, err) = condense(&store, &["stats", "nope"]);
    assert_eq!(code, 2);
    assert!(err.starts_with("condense: no store at ") && err.contains("--store or CONDENSE_STORE"), "{err}");
    assert_eq!(err.lines().count(), 1);
    assert!(!store.exists());
    // `import` creates the store; a file it cannot read is a finding (exit 1) named with the reason.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"hello\":1}\n").unwrap();
    let (code, _, err) = condense(&store, &["import", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("bad.jsonl: not a session condense reads") && err.contains("(keys: hello)"), "{err}");
    let (code, _, err) = condense(&store, &["stats", "nope"]);
    assert_eq!(code, 2);
    assert_eq!(err.trim(), "condense: no session named `nope`");
    assert_eq!(err.lines().count(), 1);
    // Usage errors (exit 2) name what is wrong.
    let (code, _, err) = condense(&store, &["render", "x", "--as", "xml"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'xml'") && err.contains("neutral, openai, anthropic"), "{err}");
    let (code, _, err) = condense(&store, &["frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("unrecognized subcommand 'frobnicate'"), "{err}");
    let (code, _, err) = condense(&store, &["simulate", "-h", "x"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_closed_pipe_ends_quietly() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    assert_eq!(condense(&store, &["demo"]).0, 0);
    let mut child = Command::new(env!("CARGO_BIN_EXE_condense"))
        .arg("--store")
        .arg(&store)
        .args(["render", "demo"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap(); // then the pipe closes
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty());
}

/// `simulate --window` compares condense with pi's own compaction at that window, prices the three with a
/// chosen model's list prices (or the configuration's), and plots them as PNG or SVG.
#[test]
fn simulate_window_compares_with_the_host_prices_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
    let file = corpus.to_str().unwrap();
    let png = dir.path().join("plot.png");
    let (code, out, err) = condense(&store, &["simulate", "--json", "--window", "64000", "--price", "gpt-5", "--plot", png.to_str().unwrap(), file]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["total"];
    let n = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("missing {k}"));
    // The session peaks at 136k raw tokens: at a 64k window pi compacts, and its requests are smaller than raw.
    assert!(n("host_compactions") >= 1.0 && n("host_cache_breaks") >= n("host_compactions"));
    assert!(n("host_input_tokens_total") < n("raw_input_tokens_total"));
    assert!(n("host_summary_input_tokens_total") > 0.0);
    assert!((n("host_token_ratio") - n("rendered_input_tokens_total") / n("host_input_tokens_total")).abs() < 1e-3);
    // Dollars at gpt-5's list prices: cached reads at $0.125, the rest at $1.25 per million.
    assert_eq!(v["price"]["model"], "gpt-5");
    let raw = (n("raw_cached_prefix_tokens_total") * 0.125 + (n("raw_input_tokens_total") - n("raw_cached_prefix_tokens_total")) * 1.25) / 1e6;
    assert!((t["dollars"]["raw"].as_f64().unwrap() - raw).abs() < 1e-3, "{} vs {raw}", t["dollars"]);
    let host = (n("host_cached_prefix_tokens_total") * 0.125
        + (n("host_input_tokens_total") - n("host_cached_prefix_tokens_total") + n("host_summary_input_tokens_total")) * 1.25) / 1e6;
    assert!((t["dollars"]["host"].as_f64().unwrap() - host).abs() < 1e-3);
    assert!(t["dollars"]["condense"].as_f64().unwrap() < host);
    assert!(t.get("median_host_cost_ratio").is_some());
    // The floor (issue 60, item 2): each token new to a raw request once, at the uncached price (1.25
    // units; the cache-write price in dollars), over the raw cost; below condense and raw alike.
    // (A request after a gap longer than the cache's lifetime reads nothing from it, but what it sends
    // again is not new: the floor counts the tokens no earlier request held, `raw_new_tokens_total`.)
    let new = n("raw_new_tokens_total");
    assert!(new <= n("raw_input_tokens_total") - n("raw_cached_prefix_tokens_total"), "{t}");
    assert!((n("cost_units_floor") - 1.25 * new).abs() < 1.0, "{t}");
    assert!((n("floor_cost_ratio") - n("cost_units_floor") / n("cost_units_raw")).abs() < 1e-3, "{t}");
    assert!(n("floor_cost_ratio") > 0.0 && n("floor_cost_ratio") < n("cost_ratio"), "{t}");
    assert!((t["dollars"]["floor"].as_f64().unwrap() - new * 1.25 / 1e6).abs() < 1e-3, "{}", t["dollars"]);
    assert!(t["median_floor_cost_ratio"].as_f64().is_some());
    assert_eq!(v["sessions"][0]["floor_cost_ratio"], t["floor_cost_ratio"], "one session: its figure is the total's");
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "{}", bytes.len());
    // The plain report says the same in words; a configuration's list prices price a model of its own.
    let config = dir.path().join("prices.json");
    std::fs::write(&config, r#"{"listPrices":{"house":{"input":2,"cachedRead":1}}}"#).unwrap();
    let svg = dir.path().join("plot.svg");
    let (code, out, err) = condense(&store, &["simulate", "--window", "64000", "--price", "house", "--config", config.to_str().unwrap(), "--plot", svg.to_str().unwrap(), file]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("at house list prices") && out.contains("the host's own compaction at 64000 tokens"), "{out}");
    assert!(out.contains("against the host's own compaction: median tokens"), "{out}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{}", &svg[..100]);
    for label in ["context per request", "request", "tokens", "window 64k", "US$ (house)", "cumulative cost"] {
        assert!(svg.contains(label), "the plot has no {label:?}");
    }
    // An unknown model or plot format is refused before anything is replayed, naming what is known.
    let (code, _, err) = condense(&store, &["simulate", "--price", "gpt-9", file]);
    assert_eq!(code, 2);
    assert!(err.contains("--price gpt-9") && err.contains("claude-sonnet-4-5") && err.contains("listPrices"), "{err}");
    let (code, _, err) = condense(&store, &["simulate", "--plot", "x.pdf", file]);
    assert_eq!(code, 2);
    assert!(err.contains("FILE.svg or FILE.png"), "{err}");
}

#[test]
fn simulate_query_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
    let svg = dir.path().join("plot.svg");
    let (code, out, err) = condense(&store, &["simulate", "--json", "--keep", "--plot", svg.to_str().unwrap(), corpus.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["total"];
    for key in [
        "turns", "tool_calls", "raw_tokens_peak", "rendered_tokens_peak", "raw_input_tokens_total", "rendered_input_tokens_total",
        "cached_prefix_tokens_total", "cache_breaks", "cost_units_raw", "cost_units_rendered", "stubs", "spills", "dedups",
        "chains", "refs_checked", "refs_recovered_exact", "validity_errors",
    ] {
        assert!(t.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(t["refs_checked"], t["refs_recovered_exact"]);
    assert_eq!(t["validity_errors"], 0);
    assert!(t["rendered_input_tokens_total"].as_u64() < t["raw_input_tokens_total"].as_u64());
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let name = v["sessions"][0]["session"].as_str().unwrap().to_string();
    let (code, out, _) = condense(&store, &["query", &name, "t1"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("=== t1 · "), "{out}");
    // `--raw`: the original alone, exactly what follows the header's newline (the text form adds a newline).
    let (code, raw, _) = condense(&store, &["query", &name, "t1", "--raw"]);
    assert_eq!(code, 0);
    let (_, after_header) = out.split_once('\n').unwrap();
    let after_header = after_header.split_once("[output]\n").map_or(after_header, |(_, o)| o);
    let at = format!("{raw}\n").bytes().zip(after_header.bytes()).position(|(a, b)| a != b);
    assert!(format!("{raw}\n") == after_header, "raw {} bytes, text form {} after its header; first difference at {at:?}", raw.len(), after_header.len());
    assert!(!raw.contains("=== t1"));
    let (code, out, _) = condense(&store, &["query", &name, "t99999"]);
    assert_eq!(code, 1);
    assert!(out.contains("unknown ref t99999"), "{out}");
    // Config: set, show, refuse a bad key without touching the file. `config set` takes values in range
    // only; a file written by hand is normalized as the seed says (2.7 turns is 2).
    assert_eq!(condense(&store, &["config", "set", "recoveryGraceTurns", "2.7"]).0, 2);
    assert_eq!(condense(&store, &["config", "set", "recoveryGraceTurns", "2"]).0, 0);
    let (code, out, _) = condense(&store, &["config", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["recoveryGraceTurns"], 2);
    let hand = dir.path().join("hand.json");
    std::fs::write(&hand, r#"{"recoveryGraceTurns": 2.7}"#).unwrap();
    let (code, out, _) = condense(&store, &["config", "--json", "--config", hand.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["recoveryGraceTurns"], 2);
    let (code, _, err) = condense(&store, &["config", "set", "rollingWindw", "2"]);
    assert_eq!(code, 2);
    assert!(err.contains("config key `rollingWindw`: unknown key"), "{err}");
    // The models table: every window in force, the file's and the built-in ones, and where each is from.
    assert_eq!(condense(&store, &["config", "set", "models", r#"{"my-model": {"contextWindow": 32000, "maxOutput": 4096}, "gpt-4o*": {"contextWindow": 64000}}"#]).0, 0);
    let (code, out, _) = condense(&store, &["config", "--json"]);
    assert_eq!(code, 0);
    let models = &serde_json::from_str::<serde_json::Value>(&out).unwrap()["models"];
    assert_eq!(models["my-model"], serde_json::json!({"contextWindow": 32000, "maxOutput": 4096, "from": "config"}));
    assert_eq!(models["gpt-4o*"]["contextWindow"], 64000, "the file's entry overrides the built-in one");
    assert_eq!(models["gpt-4o*"]["from"], "config");
    assert_eq!(models["claude-*"], serde_json::json!({"contextWindow": 200000, "maxOutput": 64000, "from": "built-in"}));
    let (_, text, _) = condense(&store, &["config"]);
    assert!(text.contains("condense config set models"), "{text}");
}

#[test]
fn compact_and_checkpoint_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    assert_eq!(condense(&store, &["demo"]).0, 0);
    let (_, before, _) = condense(&store, &["render", "demo", "--as", "openai"]);
    let before: serde_json::Value = serde_json::from_str(&before).unwrap();
    let (code, out, err) = condense(&store, &["compact", "demo"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("checkpoint c1 committed"), "{out}");
    // The transcript shows where the context was compacted (ADR 0064).
    let (code, out, _) = condense(&store, &["render", "demo", "--entry-ids"]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("──── checkpoint c1: the context up to here was compacted").count(), 1, "{out}");
    // `--json` output is one document (issue 62: it was the figures, then the entries).
    let (_, out, _) = condense(&store, &["stats", "demo", "--entry-ids", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("one JSON document: {e}\n{out}"));
    assert_eq!(doc["dividers"][0]["checkpoint"], "c1");
    assert!(doc["entries"].as_array().is_some_and(|e| !e.is_empty()) && doc["session"] == "demo", "{doc}");
    let (code, out, _) = condense(&store, &["checkpoint-line", "demo", "c1", "--timestamp", "2026-11-30T00:00:00.000Z"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["type"], "compaction");
    assert_eq!(v["timestamp"], "2026-11-30T00:00:00.000Z");
    let (code, out, _) = condense(&store, &["render", "demo"]);
    assert_eq!(code, 0);
    let msgs: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(msgs[0]["content"][0]["text"].as_str().unwrap().starts_with("[Checkpoint c1"));
    // Errors say one thing each.
    let (code, _, err) = condense(&store, &["checkpoint-line", "demo", "c5"]);
    assert_eq!((code, err.trim()), (2, "condense: session `demo` has no checkpoint c5 (it has 1)"));
    let (code, _, err) = condense(&store, &["fork", "demo", "x", "--at", "nope"]);
    assert_eq!(code, 2);
    assert!(err.starts_with("condense: session `demo` has no entry `nope`"), "{err}");
    // Without --timestamp the line is stamped now.
    let (code, out, _) = condense(&store, &["checkpoint-line", "demo"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ts = v["timestamp"].as_str().unwrap();
    assert!(ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T' && ts[..4].parse::<u32>().unwrap() >= 2026, "{ts}");
    // `query c1` recovers what the checkpoint replaced: every user prompt and tool output the context held
    // before, byte for byte (the demo ran no pruning, so these are messages, not refs).
    let (code, text, err) = condense(&store, &["query", "demo", "c1"]);
    assert_eq!(code, 0, "{err}");
    let mut checked = 0;
    for m in before["messages"].as_array().unwrap() {
        if let (Some("user" | "tool"), Some(content)) = (m["role"].as_str(), m["content"].as_str()) {
            assert!(text.contains(content), "missing from c1: {}", &content[..content.len().min(200)]);
            checked += 1;
        }
    }
    assert!(checked > 300, "{checked}");
    let (code, json_text, _) = condense(&store, &["query", "demo", "c1", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(v["is_error"], false);
    assert_eq!(format!("{}\n", v["text"].as_str().unwrap()), text);
    // An unknown ref is a finding (exit 1) with or without --json.
    assert_eq!(condense(&store, &["query", "demo", "c9"]).0, 1);
    assert_eq!(condense(&store, &["query", "demo", "c9", "--json"]).0, 1);
}

#[test]
fn history_tools_over_an_archive() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    assert_eq!(condense(&store, &["demo"]).0, 0);
    assert_eq!(condense(&store, &["history", "archive", "demo"]).1.trim(), "archive a1 committed");
    let (code, out, _) = condense(&store, &["history", "search", "demo", "FAILED", "test"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let hits = v["hits"].as_array().unwrap();
    assert!(!hits.is_empty() && hits[0]["matched"] == 2);
    let id = hits[0]["id"].as_str().unwrap().to_string();
    // Page through the entry to its end, then past it.
    let mut offset = 0u64;
    let mut text = String::new();
    loop {
        let (code, out, err) = condense(&store, &["history", "read", "demo", &id, "--offset", &offset.to_string()]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        text.push_str(v["text"].as_str().unwrap());
        match v["nextOffset"].as_u64() {
            Some(n) => offset = n,
            None => break,
        }
    }
    assert!(text.contains("FAILED"));
    let (code, _, err) = condense(&store, &["history", "read", "demo", &id, "--offset", "99999999"]);
    assert_eq!(code, 2);
    assert!(err.contains("past the end"), "{err}");
    let many: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
    let mut args = vec!["history", "search", "demo"];
    args.extend(many.iter().map(String::as_str));
    let (code, _, err) = condense(&store, &args);
    assert_eq!(code, 2);
    assert!(err.contains("at most 16 keywords"), "{err}");
    // Reopening the store restores the reference (the view is rebuilt from the log).
    let (code, out, _) = condense(&store, &["history", "archives", "demo"]);
    assert_eq!(code, 0);
    assert!(out.contains("\"a1\""));
}

#[test]
fn a_store_in_use_by_another_process_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let held = condense_engine::Store::open(&store).unwrap();
    let (code, _, err) = condense(&store, &["sessions"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is in use by another condense process"), "{err}");
    assert!(!err.contains("Os {"), "no debug formatting: {err}");
    drop(held);
}

#[test]
fn export_never_destroys_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    assert_eq!(condense(&store, &["demo"]).0, 0);
    let target = dir.path().join("x.export");
    std::fs::write(&target, b"an earlier export").unwrap();
    let (code, _, err) = condense(&store, &["export", target.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("exists already; pass --force"), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"an earlier export");
    let (code, out, _) = condense(&store, &["export", target.to_str().unwrap(), "--force"]);
    assert_eq!(code, 0, "{out}");
    assert!(std::fs::read(&target).unwrap().starts_with(b"CONDENSE-EXPORT"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().contains("condense-tmp")).collect();
    assert!(leftovers.is_empty(), "no temporary file left");
    // A target inside the store (it would overwrite the database) is refused.
    let inside = store.join("db").join("db");
    let (code, _, err) = condense(&store, &["export", inside.to_str().unwrap(), "--force"]);
    assert_eq!(code, 2);
    assert!(err.contains("is inside the store"), "{err}");
    assert_eq!(condense(&store, &["verify"]).0, 0, "the store still works");
}

#[test]
fn render_of_an_invalid_context_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    {
        let s = condense_engine::Store::open(&store).unwrap();
        let session = s.create_session("bad").unwrap();
        let reply = condense_events::Message::Assistant { content: vec![condense_events::Block::Text { text: "hi".into() }], model: None, stop: None, usage: None };
        session.append(vec![condense_events::SourceEvent::EntryAppended { id: "a".into(), parent: None, entry: condense_events::Entry::Message(reply) }]).unwrap();
    }
    let (code, out, err) = condense(&store, &["render", "bad"]);
    assert_eq!(code, 1);
    assert!(out.contains("\"hi\""), "the context is still printed: {out}");
    assert!(err.contains("breaks a provider rule") && err.contains("does not start with a user message"), "{err}");
}

#[test]
fn simulate_without_keep_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/claude-code/DRMacIver__claude-reliability/snapshot-tests/tests/hello-world-script/transcript.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_condense"))
        .arg("--store")
        .arg(dir.path().join("store"))
        .arg("simulate")
        .arg(&corpus)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The replays are held in memory: nothing is written, neither a scratch folder nor the store.
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "a scratch folder was left behind");
    assert!(!dir.path().join("store").exists(), "simulate without --keep wrote to the store");
}

#[test]
fn non_utf8_paths_are_taken_as_they_are() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let session = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
    // A session file and a store folder whose names are not UTF-8.
    let file = dir.path().join(std::ffi::OsStr::from_bytes(b"x\xfe.jsonl"));
    std::fs::copy(&session, &file).unwrap();
    let store = dir.path().join(std::ffi::OsStr::from_bytes(b"st\xff"));
    let out = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(&store).arg("import").arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"));
    let out = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(&store).args(["sessions", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v[0]["name"].as_str().unwrap().ends_with("x\u{fffd}.jsonl"), "{v}");
    // The session is addressable by the id `sessions` prints.
    let out = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(&store).args(["stats", "1", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // A huge page number is an empty page, not an overflow.
    let out = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(&store).args(["history", "archives", "1", "--page", "18446744073709551615"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["archives"], serde_json::json!([]));
}

#[test]
fn config_set_refuses_values_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    for (key, value) in [("spillThreshold", "-5"), ("cachedPrice", "-1"), ("rollingWindow", "-1"), ("recoveryGraceTurns", "-5"), ("minBatchChars", "3.7")] {
        let (code, _, err) = condense(&store, &["config", "set", key, value]);
        assert_eq!(code, 2, "{key} {value}");
        assert!(err.contains(&format!("config key `{key}`")) && err.contains("out of range"), "{err}");
    }
    assert!(!store.join("config.json").exists(), "nothing written");
    assert_eq!(condense(&store, &["config", "set", "rollingWindow", "2"]).0, 0);
}

#[test]
fn an_unreachable_http_summarizer_falls_back_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    // A loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = format!(r#"{{"summarizer":{{"kind":"http","baseUrl":"http://127.0.0.1:{port}/v1","model":"m","idleTimeoutSecs":1,"totalTimeoutSecs":2}}}}"#);
    std::fs::write(store.join("config.json"), config).unwrap();
    let session = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
    let (code, out, err) = condense(&store, &["simulate", session, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let n = v["total"]["summarizer_fallbacks"].as_u64().unwrap();
    assert!(n > 0, "{out}");
    assert!(err.contains(&format!("the configured summarizer failed {n} times and the extractive summarizer stood in")), "{err}");
    assert!(err.contains("Connection refused") || err.contains("connect"), "{err}");
    // With the embedded summarizer nothing falls back and nothing is said.
    std::fs::remove_file(store.join("config.json")).unwrap();
    let (code, out, err) = condense(&store, &["simulate", session, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["total"]["summarizer_fallbacks"], 0);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn an_unreadable_file_or_folder_is_named_and_the_rest_imported() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("locked")).unwrap();
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/claude-code/DRMacIver__claude-reliability/snapshot-tests/tests/hello-world-script/transcript.jsonl");
    std::fs::copy(&corpus, src.join("good.jsonl")).unwrap();
    std::fs::copy(&corpus, src.join("locked/hidden.jsonl")).unwrap();
    std::fs::write(src.join("notes.jsonl"), "not a session\n").unwrap();
    std::fs::set_permissions(src.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads everything; the test still checks the not-a-session report and the import of the rest.
    let (code, out, err) = condense(&dir.path().join("store"), &["import", src.to_str().unwrap()]);
    std::fs::set_permissions(src.join("locked"), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("good.jsonl"), "{out}");
    assert!(err.contains("notes.jsonl") && err.contains("skipped"), "each skipped file is named with why: {err}");
    let is_root = std::fs::read_dir(src.join("locked")).is_ok();
    if !is_root {
        assert!(err.contains("locked") && err.contains("cannot be read"), "{err}");
    }
}

fn generated_pi(dir: &std::path::Path, entries: u32) -> std::path::PathBuf {
    let out = dir.join(format!("gen-{entries}.jsonl"));
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/gen_pi_session.py");
    let st = Command::new("python3").arg(tool).args(["--entries", &entries.to_string(), "--seed", "1", "--out"]).arg(&out).status().expect("python3");
    assert!(st.success());
    out
}

#[test]
fn a_grown_file_appends_and_another_file_under_the_same_name_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let full = generated_pi(dir.path(), 300);
    let text = std::fs::read_to_string(&full).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::create_dir_all(dir.path().join("w")).unwrap();
    std::fs::write(dir.path().join("w/s.jsonl"), lines[..150].join("\n") + "\n").unwrap();
    // Imports a file by a relative path: the session is named after the file, `s.jsonl`.
    let import_from = |cwd: &std::path::Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(&store).args(["import", "w/s.jsonl"]).current_dir(cwd).output().unwrap();
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, out, err) = import_from(dir.path());
    assert_eq!(code, 0, "{out}{err}");
    // The agent went on writing: the same file again appends what it grew by.
    std::fs::write(dir.path().join("w/s.jsonl"), text.clone()).unwrap();
    let (code, out, err) = import_from(dir.path());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("grown"), "{out}");
    // Again, unchanged: nothing to do.
    let (code, out, _) = import_from(dir.path());
    assert_eq!(code, 0);
    assert!(out.contains("skipped 1 files"), "{out}");
    // The grown session renders as a fresh import of the whole file.
    let fresh = dir.path().join("fresh");
    let o = Command::new(env!("CARGO_BIN_EXE_condense")).arg("--store").arg(&fresh).args(["import", "w/s.jsonl"]).current_dir(dir.path()).output().unwrap();
    assert!(o.status.success());
    assert_eq!(condense(&store, &["render", "s.jsonl"]).1, condense(&fresh, &["render", "s.jsonl"]).1);
    assert_eq!(condense(&store, &["verify"]).0, 0);
    // Another file of the same name is another session, told apart by its folder.
    let other = dir.path().join("elsewhere");
    std::fs::create_dir_all(other.join("w")).unwrap();
    std::fs::write(other.join("w/s.jsonl"), lines[..10].join("\n") + "\n").unwrap();
    let (code, out, err) = import_from(&other);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("w/s.jsonl: pi"), "{out}");
    // Importing the folder of the first file finds its session under the name it has.
    let (code, out, _) = condense(&store, &["import", dir.path().join("w").to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("skipped 1 files"), "{out}");
    let names = session_names(&store);
    assert_eq!(names, ["s.jsonl", "w/s.jsonl"]);
}

/// The names `condense sessions --json` lists, in id order.
fn session_names(store: &std::path::Path) -> Vec<String> {
    let list: serde_json::Value = serde_json::from_str(&condense(store, &["sessions", "--json"]).1).unwrap();
    list.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect()
}

/// Issue 37 item 8: a session is named from its path relative to the folder given; an agent's project
/// folder (Claude Code's `-home-…`, pi's `--home-…--`) shows as its project; `simulate` names and plots
/// the same, and a plot title too long for its panel is cut at the left.
#[test]
fn sessions_are_named_relative_to_the_folder_given_and_projects_by_their_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus");
    let claude = dir.path().join("home/me/.claude/projects/-home-USER-projects-spotter-worktrees-spotter-dov");
    std::fs::create_dir_all(&claude).unwrap();
    std::fs::copy(corpus.join("claude-code/marot__spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl"), claude.join("4d5611e5-241a-462a-8d15-5122611a9569.jsonl")).unwrap();
    let pi = dir.path().join("home/me/.pi/agent/sessions/--Users-badlogic-workspaces-pi-mono--");
    std::fs::create_dir_all(&pi).unwrap();
    std::fs::copy(corpus.join("pi/badlogic__pi-mono/session.jsonl"), pi.join("2025-12-17_5fd1e58c.jsonl")).unwrap();
    // A folder named like a project whose file says another working directory stays as it is.
    let lookalike = dir.path().join("plain/-not-a-project");
    std::fs::create_dir_all(&lookalike).unwrap();
    std::fs::copy(generated_pi(dir.path(), 40), lookalike.join("x.jsonl")).unwrap();
    let arg = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (code, out, err) = condense(&store, &["import", &arg(&dir.path().join("home/me/.claude/projects")), &arg(&dir.path().join("home/me/.pi/agent/sessions")), &arg(&dir.path().join("plain"))]);
    assert_eq!(code, 0, "{out}{err}");
    let names = session_names(&store);
    assert_eq!(names, ["spotter-dov/4d5611e5-241a-462a-8d15-5122611a9569.jsonl", "pi-mono/2025-12-17_5fd1e58c.jsonl", "-not-a-project/x.jsonl"]);
    // Its stats report the usage the host recorded on its own requests, at cache prices (issue 34 item 4).
    let (code, out, _) = condense(&store, &["stats", "spotter-dov/4d5611e5-241a-462a-8d15-5122611a9569.jsonl", "--json"]);
    assert_eq!(code, 0);
    let p = serde_json::from_str::<serde_json::Value>(&out).unwrap()["provider"].clone();
    assert_eq!(p["served"], false, "{p}");
    assert!(p["requests"].as_u64().unwrap() > 100 && p["cache_read_tokens"].as_u64().unwrap() > 1_000_000, "{p}");
    let (read, uncached) = (p["cache_read_tokens"].as_f64().unwrap(), p["input_tokens"].as_f64().unwrap() + p["cache_write_tokens"].as_f64().unwrap());
    assert!((p["cache_priced_cost"].as_f64().unwrap() - (0.1 * read + 1.25 * uncached)).abs() < 1.0, "{p}");
    assert!(p["direct_cost"].is_null(), "no direct estimate for the host's own requests");
    // The file given alone is the same session.
    let (code, out, _) = condense(&store, &["import", &arg(&claude.join("4d5611e5-241a-462a-8d15-5122611a9569.jsonl"))]);
    assert_eq!(code, 0);
    assert!(out.contains("skipped 1 files"), "{out}");
    // simulate names its replays the same way, and its plot titles them so.
    let plot = dir.path().join("p.svg");
    let (code, out, err) = condense(&store, &["simulate", &arg(&dir.path().join("home/me/.claude/projects")), "--json", "--plot", &arg(&plot)]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["sessions"][0]["session"], "simulated/spotter-dov/4d5611e5-241a-462a-8d15-5122611a9569.jsonl", "{v}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.lines().any(|l| l == "spotter-dov/4d5611e5-241a-462a-8d15-5122611a9569.jsonl: context per request"), "the title names the session as sessions does");
    // A name longer than its panel loses its start, not its end.
    let deep = dir.path().join(format!("deep/{}/{}", "a-rather-long-folder-name".repeat(4), "b-another-long-folder-name".repeat(4)));
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::copy(generated_pi(dir.path(), 40), deep.join("the-end.jsonl")).unwrap();
    let (code, _, err) = condense(&store, &["simulate", &arg(&dir.path().join("deep")), "--plot", &arg(&plot)]);
    assert_eq!(code, 0, "{err}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    let title = svg.lines().find_map(|l| l.strip_suffix(": context per request")).expect("a title");
    assert!(title.starts_with('…') && title.ends_with("long-folder-name/the-end.jsonl"), "{title}");
    assert!(title.chars().count() < 100, "cut to fit: {title}");
}

#[test]
fn imports_demos_and_restores_killed_at_random_points_finish_when_run_again() {
    // Twelve rounds here (four per command); `cargo xtask crash` runs the same harness a hundred times and more.
    let dir = tempfile::tempdir().unwrap();
    let file = generated_pi(dir.path(), 1500);
    let summary = crash_rounds::crash_rounds(std::path::Path::new(env!("CARGO_BIN_EXE_condense")), dir.path(), &file, 12, 0x2545_f491_4f6c_dd1d)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{summary:?}");
    assert_eq!(summary.rounds, [4, 4, 4]);
    assert!(summary.interrupted.iter().sum::<u32>() >= 4, "too few kills came during a command: {summary:?}");
}

fn bare(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_condense")).args(args).env_remove("CONDENSE_STORE").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn help_version_and_completions() {
    for flag in ["--version", "-V"] {
        let (code, out, _) = bare(&[flag]);
        assert_eq!(code, 0);
        assert_eq!(out.trim(), format!("condense {}", env!("CARGO_PKG_VERSION")));
    }
    let (code, out, _) = bare(&["-h"]);
    assert_eq!(code, 0);
    assert!(out.contains("Commands:") && out.contains("serve") && out.contains("Exit codes:"), "{out}");
    // Every command has its own page, with an example.
    let (_, top, _) = bare(&["--help"]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert_eq!(commands.len(), 19, "{commands:?}");
    for c in &commands {
        let (code, page, _) = bare(&[c, "--help"]);
        assert_eq!(code, 0, "{c}");
        assert!(page.contains(&format!("Usage: condense {c}")), "{c}: {page}");
        assert!(page.contains("Example") || c == "history", "{c} has no example: {page}");
        let (_, via_help, _) = bare(&["help", c]);
        assert_eq!(via_help, page, "{c}");
    }
    let (_, page, _) = bare(&["history", "search", "--help"]);
    assert!(page.contains("Example:\n  condense history search"), "{page}");
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, _) = bare(&["completions", shell]);
        assert_eq!(code, 0);
        assert!(out.contains("simulate") && out.contains("after-event"), "{shell}");
    }
    let (code, _, err) = bare(&["completions", "tcsh"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'tcsh'"), "{err}");
}

#[test]
fn store_from_the_environment_rm_and_simulate_keep_force() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("envstore");
    let session = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_condense")).args(args).env("CONDENSE_STORE", &store).output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, _, err) = run(&["simulate", session, "--keep"]);
    assert_eq!(code, 0, "{err}");
    assert!(store.join("db").is_dir(), "CONDENSE_STORE names the store");
    let (_, list, _) = run(&["sessions", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let name = v[0]["name"].as_str().unwrap().to_string();
    let id = v[0]["id"].as_u64().unwrap();
    assert!(name.starts_with("simulated/"), "{name}");
    // A kept replay is not replaced silently.
    let (code, _, err) = run(&["simulate", session, "--keep"]);
    assert_eq!(code, 2);
    assert!(err.contains("pass --force to replace it"), "{err}");
    let (code, _, err) = run(&["simulate", session, "--force"]);
    assert_eq!(code, 2, "--force needs --keep");
    assert!(err.contains("--keep"), "{err}");
    let (code, _, err) = run(&["simulate", session, "--keep", "--force"]);
    assert_eq!(code, 0, "{err}");
    let (_, list, _) = run(&["sessions", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert!(v[0]["id"].as_u64().unwrap() > id, "a replaced session gets a new id");
    // Entry ids, as `fork --at` takes them.
    let (code, out, _) = run(&["render", &name, "--entry-ids"]);
    assert_eq!(code, 0);
    let entry = out.lines().filter(|l| !l.trim_start().starts_with('─')).nth(5).unwrap().split_whitespace().next().unwrap().to_string();
    let (code, out, err) = run(&["fork", &name, "forked", "--at", &entry]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("forked"), "{out}");
    let (code, out, _) = run(&["stats", "forked", "--entry-ids", "--json"]);
    assert_eq!(code, 0);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["entries"].as_array().unwrap().last().unwrap()["entry"], entry.as_str());
    // rm by name and by id.
    let forked_id = {
        let (_, list, _) = run(&["sessions", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&list).unwrap();
        v.as_array().unwrap().iter().find(|s| s["name"] == "forked").unwrap()["id"].as_u64().unwrap()
    };
    assert_eq!(run(&["rm", &forked_id.to_string()]).0, 0);
    let (code, out, _) = run(&["rm", &name]);
    assert_eq!(code, 0);
    assert!(out.contains("removed session"), "{out}");
    let (code, out, _) = run(&["sessions"]);
    assert_eq!(code, 0);
    assert!(out.contains("0 sessions"), "{out}");
    let (code, out, err) = run(&["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = run(&["rm", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("no session named `nope`"), "{err}");
}

/// Every `condense …` command the README and docs show, in code blocks and in inline code, against the
/// CLI's own declaration: a concrete command must parse; a template (with `[…]`, `|`, `<…>`) must name an
/// existing command and only flags that command has.
#[test]
fn docs_name_only_commands_and_flags_the_cli_has() {
    use clap::Parser as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
    docs.sort();
    files.extend(docs);
    let mut cli = condense_cli::cli::command();
    cli.build();
    let placeholder = |w: &str| w.len() >= 2 && w.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '.');
    let mut checked = 0;
    let mut wrong = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut in_code = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                continue;
            }
            let mut candidates: Vec<String> = Vec::new();
            if in_code && line.trim_start().starts_with("condense ") {
                candidates.extend(line.trim().split("&&").map(str::to_string));
            }
            if !in_code {
                for (i, span) in line.split('`').enumerate() {
                    if i % 2 == 1 && span.starts_with("condense ") {
                        candidates.push(span.to_string());
                    }
                }
            }
            for c in candidates.into_iter().map(|c| (c, !in_code)) {
                let (c, inline) = c;
                let words: Vec<String> = c
                    .split_whitespace()
                    .take_while(|w| !w.starts_with('#') && !w.starts_with('>'))
                    .map(|w| w.trim_matches(|ch| ch == '"' || ch == '\'').to_string())
                    .collect();
                if words.first().map(String::as_str) != Some("condense") || words.len() < 2 || words[1].ends_with(':') || placeholder(&words[1]) {
                    continue;
                }
                checked += 1;
                let place = format!("{}:{}: `{}`", file.file_name().unwrap().to_string_lossy(), n + 1, c.trim());
                // Inline code names a command in prose (often without its arguments): checked as a template.
                let template = inline || words.iter().any(|w| w.contains('[') || w.contains('|') || w.contains('<') || w.contains('…') || placeholder(w));
                if !template {
                    if let Err(e) = condense_cli::cli::Cli::try_parse_from(&words)
                        && !matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion)
                    {
                        wrong.push(format!("{place}: {}", e.render().to_string().lines().next().unwrap_or("")));
                    }
                    continue;
                }
                // A template: the command path must exist and every --flag must belong to it.
                let mut cmd = &cli;
                let mut rest = words[1..].iter();
                let mut path = Vec::new();
                for w in rest.by_ref() {
                    match cmd.find_subcommand(w) {
                        Some(sub) => {
                            path.push(w.clone());
                            cmd = sub;
                            if !cmd.has_subcommands() {
                                break;
                            }
                        }
                        None => break,
                    }
                }
                if path.is_empty() && !words[1].starts_with("--") {
                    wrong.push(format!("{place}: no such command"));
                    continue;
                }
                // After `--` the words are another program's (`condense run AGENT -- ARGS`).
                for w in words.iter().take_while(|w| w.trim_start_matches('[') != "--").filter(|w| w.trim_start_matches('[').starts_with("--")) {
                    let flag = w.trim_start_matches('[').trim_start_matches("--").split(['=', ']']).next().unwrap_or("");
                    let known = cmd.get_arguments().chain(cli.get_arguments()).any(|a| a.get_long() == Some(flag)) || flag == "help";
                    if !known {
                        wrong.push(format!("{place}: `condense {}` has no --{flag}", path.join(" ")));
                    }
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} commands found in the docs");
    assert!(wrong.is_empty(), "the docs name what the CLI does not have:\n{}", wrong.join("\n"));
}

/// `condense run` starts serve with the serve flags it was given: every flag of `serve` given to `run`
/// comes back from `ServeArgs::to_args` and parses to the same arguments (the agent's own after it).
#[test]
fn run_passes_its_serve_flags_to_the_serve_it_starts() {
    use clap::Parser as _;
    use condense_cli::cli::{Cli, Command as Cmd};
    let given = [
        "condense", "run", "--listen", "127.0.0.1:9999", "--anthropic-upstream", "http://a.example", "--openai-upstream", "http://o.example", "--max-body-bytes", "4096",
        "--max-messages", "7", "--max-tool-rounds", "3", "--config", "/c.json", "--price-cache", "--auth-token-file", "/t", "--memory-budget", "2097152", "--warm-bytes",
        "3145728", "--log-format", "json", "--summaries", "upstream", "--summary-model", "m", "--keep-serve", "pi", "--model", "x", "--", "-p", "hi",
    ];
    let Cmd::Run(run) = Cli::try_parse_from(given).unwrap().command else { panic!("not run") };
    assert_eq!(run.agent, condense_cli::cli::Agent::Pi);
    assert!(run.keep_serve);
    assert_eq!(run.args, ["--model", "x", "--", "-p", "hi"].map(std::ffi::OsString::from));
    let free = "127.0.0.1:0".parse().unwrap();
    let again = |serve: &condense_cli::cli::ServeArgs| {
        let argv: Vec<std::ffi::OsString> = ["condense", "serve"].map(Into::into).into_iter().chain(serve.to_args(free)).collect();
        let Cmd::Serve(back) = Cli::try_parse_from(argv).unwrap().command else { panic!("not serve") };
        back
    };
    assert_eq!(again(&run.serve), run.serve);
    // No flags: a free port, the rest serve's defaults; `--no-price-cache` passes too.
    let Cmd::Run(bare) = Cli::try_parse_from(["condense", "run", "--no-price-cache", "claude"]).unwrap().command else { panic!("not run") };
    let back = again(&bare.serve);
    assert_eq!(back.listen, Some(free));
    assert_eq!(condense_cli::cli::ServeArgs { listen: None, ..back }, bare.serve);
}

#[test]
fn watch_imports_new_files_and_appends_what_they_grow_by() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let folder = dir.path().join("sessions");
    std::fs::create_dir_all(&folder).unwrap();
    let full = generated_pi(dir.path(), 200);
    let text = std::fs::read_to_string(&full).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let pi = folder.join("s.jsonl");
    std::fs::write(&pi, lines[..100].join("\n") + "\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_condense"))
        .arg("--store")
        .arg(&store)
        .args(["watch", "--settle", "200"])
        .arg(&folder)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let expect = |what: &str| -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("watch never said `{what}`");
    };
    // The file there at the start, then its growth.
    // Named relative to the watched folder, as an import of the folder names it.
    let first = expect("imported");
    assert!(first.starts_with("imported  s.jsonl  ("), "{first}");
    expect("watching");
    std::fs::OpenOptions::new().append(true).open(&pi).map(|mut f| std::io::Write::write_all(&mut f, (lines[100..].join("\n") + "\n").as_bytes())).unwrap().unwrap();
    let grown = expect("grown");
    assert!(grown.starts_with("grown     s.jsonl  (+"), "{grown}");
    // A JSON document that its agent rewrites whole as the chat goes on (Gemini CLI).
    let gemini = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/gemini-cli/codemie-ai__codemie-code/tests/integration/metrics/fixtures/gemini/session-2025-12-01T21-45-5b959dae.json");
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&gemini).unwrap()).unwrap();
    let all = doc["messages"].as_array().unwrap().clone();
    doc["messages"] = serde_json::Value::Array(all[..6].to_vec());
    std::fs::write(folder.join("chat.json"), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    assert!(expect("imported").contains("chat.json"));
    doc["messages"] = serde_json::Value::Array(all.clone());
    std::fs::write(folder.join("chat.json"), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    assert!(expect("grown").contains("chat.json"));
    // Something that is not a session is named with the reason.
    std::fs::write(folder.join("notes.json"), "{\"x\":1}").unwrap();
    let skipped = expect("skipped");
    assert!(skipped.contains("notes.json") && skipped.contains("keys: x"), "{skipped}");
    child.kill().unwrap();
    child.wait().unwrap();
    // The watched session is what an import of the finished file gives.
    let fresh = dir.path().join("fresh");
    assert_eq!(condense(&fresh, &["import", pi.to_str().unwrap()]).0, 0);
    let name = condense(&fresh, &["sessions", "--json"]).1;
    let name = serde_json::from_str::<serde_json::Value>(&name).unwrap()[0]["name"].as_str().unwrap().to_string();
    assert_eq!(condense(&store, &["render", &name]).1, condense(&fresh, &["render", &name]).1);
    assert_eq!(condense(&store, &["verify"]).0, 0);
}

#[test]
fn simulate_switch_reports_recoveries_and_refuses_a_malformed_switch() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/corpus/pi/badlogic__pi-mono/large-session.jsonl");
    // At request 200 the session's context is over 16k tokens (not over 24k since the final replies of
    // compressed chains render cut and the turn pi never replays is left out), so a 16k model needs a
    // recovery there.
    let (code, out, err) = condense(&store, &["simulate", file, "--switch", "16000@200", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["total"]["recoveries"].as_u64().unwrap() >= 1, "{}", v["total"]);
    assert_eq!(v["total"]["recoveries_blocked"], 0);
    assert_eq!(v["total"]["archives"], v["total"]["recoveries"]);
    for bad in ["32000", "32000@0", "512@10", "x@1"] {
        let (code, _, err) = condense(&store, &["simulate", file, "--switch", bad]);
        assert_eq!(code, 2, "{bad}");
        assert!(err.contains("--switch"), "{bad}: {err}");
    }
}

/// `--store postgres://…` works as a folder does (import, sessions, render, verify, stats), an export of
/// either backend restores into the other byte for byte, and the password never shows.
#[test]
fn a_postgres_store_works_as_a_folder_does_and_exports_move_between_them() {
    let url = condense_log::testing::Cluster::shared().database().replace("postgres@", "postgres:s3cret-pw@");
    let pg = std::path::PathBuf::from(&url);
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("store");
    let session = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
    let mut seen = String::new();
    let mut run = |store: &std::path::Path, args: &[&str]| {
        let (code, out, err) = condense(store, args);
        seen.push_str(&out);
        seen.push_str(&err);
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    };
    for store in [&pg, &folder] {
        run(store, &["import", session]);
    }
    let listed = run(&pg, &["sessions", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let name = v[0]["name"].as_str().unwrap().to_string();
    assert_eq!(run(&pg, &["render", &name]), run(&folder, &["render", &name]), "the two backends render differently");
    assert_eq!(run(&pg, &["stats", &name, "--json"]), run(&folder, &["stats", &name, "--json"]));
    run(&pg, &["verify"]);
    // PostgreSQL → file → a new folder → file: the same bytes.
    let from_pg = dir.path().join("pg.export");
    run(&pg, &["export", from_pg.to_str().unwrap()]);
    let restored = dir.path().join("restored");
    run(&restored, &["import", from_pg.to_str().unwrap()]);
    let from_folder = dir.path().join("folder.export");
    run(&restored, &["export", from_folder.to_str().unwrap()]);
    assert_eq!(std::fs::read(&from_pg).unwrap(), std::fs::read(&from_folder).unwrap(), "the export changed on its way through a folder");
    // And back: the folder's export into a new database exports the same bytes again.
    let again = std::path::PathBuf::from(condense_log::testing::Cluster::shared().database());
    run(&again, &["import", from_folder.to_str().unwrap()]);
    let from_again = dir.path().join("again.export");
    run(&again, &["export", from_again.to_str().unwrap()]);
    assert_eq!(std::fs::read(&from_again).unwrap(), std::fs::read(&from_pg).unwrap(), "the export changed on its way through PostgreSQL");
    // A shared store has no folder for a config file; the error says what to do instead.
    let (code, _, err) = condense(&pg, &["config", "set", "keepRecentTurns", "3"]);
    assert_eq!(code, 2);
    assert!(err.contains("--config") && !err.contains("s3cret"), "{err}");
    // An unreachable database is one line naming it, without the password.
    let (code, _, err) = condense(std::path::Path::new("postgres://ann:s3cret-pw@127.0.0.1:1/nowhere"), &["sessions"]);
    assert_eq!(code, 2);
    assert!(err.contains("127.0.0.1:1/nowhere") && !err.contains("s3cret") && err.trim().lines().count() == 1, "{err}");
    let (code, _, err) = condense(std::path::Path::new("postgres://ann:s3cret-pw@127.0.0.1:1/nowhere"), &["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 2);
    assert!(err.contains("127.0.0.1:1/nowhere") && !err.contains("s3cret"), "serve: {err}");
    assert!(!seen.contains("s3cret"), "the password was printed");
}

/// `condense serve` on a port another process holds fails with the address and the cause, and leaves no
/// store folder behind (issue 37: it made the folder first).
#[test]
fn serve_on_a_port_in_use_fails_and_leaves_nothing() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("new-store");
    let (code, _, err) = condense(&store, &["serve", "--listen", &format!("127.0.0.1:{port}")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")) && err.contains("in use"), "{err}");
    assert!(!store.exists(), "the store folder was made for a server that never ran");
}

/// Issue 60, item 3: `simulate --cache-ttl` reads the session's own timestamps; a request more than the
/// cache's lifetime after the one before reads nothing from the cache, raw and condense alike, and is
/// counted in `cold_requests`; a longer lifetime, or none (0), counts none.
/// Issue 60, items 1 and 2: `simulate --json` gives each session, and the total, the decisions' accounts
/// (`decisions`, `decisions_net_negative`, `decisions_net_units`, by kind) beside the floor
/// (`floor_cost_ratio`); the nets add up to what condense saved against raw; the text report says them.
#[test]
fn simulate_reports_what_each_kind_of_decision_cost_and_saved() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let file = dir.path().join("demo.jsonl");
    std::fs::write(&file, condense_engine::demo::generate(condense_engine::demo::DemoConfig { prompts: 6, calls_per_prompt: 15 })).unwrap();
    let (code, out, err) = condense(&store, &["simulate", "--json", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (t, row) = (&v["total"], &v["sessions"][0]);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("missing {k} in {v}"));
    for k in ["decisions", "decisions_net_negative", "decisions_net_units", "kept_reads", "kept_reads_net_units", "floor_cost_ratio", "cold_requests"] {
        assert_eq!(f(t, k), f(row, k), "{k}: one session, the total is its figures");
    }
    assert!(f(t, "decisions") > 10.0 && f(t, "decisions_net_negative") <= f(t, "decisions"), "{t}");
    let saved = f(t, "cost_units_raw") - f(t, "cost_units_rendered");
    assert!((f(t, "decisions_net_units") - saved).abs() <= 0.02 * saved, "the accounts' net {} against {saved} saved", f(t, "decisions_net_units"));
    let kinds = t["decisions_by_kind"].as_object().unwrap();
    assert!(kinds.contains_key("stub") && kinds.contains_key("chain"), "{kinds:?}");
    let sum: f64 = kinds.values().map(|k| f(k, "decisions")).sum();
    assert_eq!(sum, f(t, "decisions"));
    let (code, out, err) = condense(&store, &["simulate", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("decisions: {} (", t["decisions"])) && out.contains("had not paid for themselves"), "{out}");
}

#[test]
fn simulate_prices_a_request_after_a_long_gap_as_cold() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // A pi session of ten turns a minute apart, the eighth ten minutes after the seventh: prompt, a call,
    // its output of ~2 KB, a reply.
    let mut lines = vec![r#"{"type":"session","version":3,"id":"s","timestamp":"2026-03-01T10:00:00.000Z","cwd":"/w"}"#.to_string()];
    let mut parent = None::<String>;
    let mut line = |id: String, minute: u32, message: serde_json::Value, lines: &mut Vec<String>| {
        let t = format!("2026-03-01T{:02}:{:02}:00.000Z", 10 + minute / 60, minute % 60);
        lines.push(serde_json::json!({"type": "message", "id": id, "parentId": parent, "timestamp": t, "message": message}).to_string());
        parent = Some(id);
    };
    for k in 0..10u32 {
        let minute = k + if k >= 7 { 10 } else { 0 };
        line(format!("u{k}"), minute, serde_json::json!({"role": "user", "content": format!("step {k}")}), &mut lines);
        let call = serde_json::json!({"type": "toolCall", "id": format!("c{k}"), "name": "bash", "arguments": {"command": format!("cat f{k}")}});
        line(format!("a{k}"), minute, serde_json::json!({"role": "assistant", "content": [call]}), &mut lines);
        let out = format!("line {k} of the file\n").repeat(100);
        line(format!("r{k}"), minute, serde_json::json!({"role": "toolResult", "toolCallId": format!("c{k}"), "toolName": "bash", "content": [{"type": "text", "text": out}]}), &mut lines);
        line(format!("f{k}"), minute, serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": format!("step {k} done")}]}), &mut lines);
    }
    let file = dir.path().join("session.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let run = |ttl: &[&str]| -> serde_json::Value {
        let mut args = vec!["simulate", "--json", file.to_str().unwrap()];
        args.extend(ttl);
        let (code, out, err) = condense(&store, &args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let (default, hour, none) = (run(&[]), run(&["--cache-ttl", "3600"]), run(&["--cache-ttl", "0"]));
    let t = |v: &serde_json::Value, k: &str| v["total"][k].as_f64().unwrap_or_else(|| panic!("missing {k}"));
    assert_eq!((default["cache_ttl"].as_u64(), hour["cache_ttl"].as_u64(), none["cache_ttl"].as_u64()), (Some(300), Some(3600), None));
    assert_eq!((t(&default, "turns"), t(&default, "cold_requests"), t(&hour, "cold_requests"), t(&none, "cold_requests")), (20.0, 1.0, 0.0, 0.0));
    assert_eq!(default["sessions"][0]["cold_requests"], 1);
    // The cold request read nothing from the cache: raw and condense pay more than with the hour's cache;
    // the floor does not move (what a cold request sends again is not new).
    for k in ["cost_units_raw", "cost_units_rendered"] {
        assert!(t(&default, k) > t(&hour, k), "{k}: {} against {}", t(&default, k), t(&hour, k));
        assert_eq!(t(&hour, k), t(&none, k), "{k}");
    }
    assert_eq!(t(&default, "cost_units_floor"), t(&hour, "cost_units_floor"));
    assert_eq!(t(&default, "raw_new_tokens_total"), t(&none, "raw_new_tokens_total"));
    assert!(t(&default, "raw_cached_prefix_tokens_total") < t(&hour, "raw_cached_prefix_tokens_total"));
    // The text report counts them too.
    let (code, out, err) = condense(&store, &["simulate", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("20 requests (1 cold)"), "{out}");
}

//! `condense demo`: a generated long session imported and replayed with condense in the loop, and what
//! that saves.

use crate::plot;
use crate::commands::inspect::stats_json;
use crate::commands::simulate::{dollars_json, figures_json};
use crate::shared::load_config;
use anyhow::{Context as _, Result};
use condense_engine::{demo, Store};
use serde_json::json;
use std::path::Path;
use std::process::ExitCode;

/// The window the demo's replay runs at: the generated session's model (Claude Sonnet 4.5) has 200,000
/// tokens, so the agent compacts its own history there, and condense checkpoints as it would live.
const DEMO_WINDOW: u64 = 200_000;

pub(crate) fn run_demo(store: &Store, dir: &Path, json_out: bool) -> Result<ExitCode> {
    let name = "demo";
    let pruned = "demo/pruned";
    // The generated session is the same bytes every time: a demo that stopped part-way is finished, a
    // complete one is left as it is.
    let text = demo::generate(demo::DemoConfig::default());
    let folder = dir.join("demo");
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let file = folder.join("demo-session.jsonl");
    if std::fs::read(&file).ok().as_deref() != Some(text.as_bytes()) {
        std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
    }
    let o = store.import_file(&file, name)?;
    if !json_out && o.action != condense_engine::ImportAction::Unchanged {
        outln!("generated {} ({} bytes) and imported it as session `{name}` ({} events)", file.display(), text.len(), o.events);
    }
    // The main job: the same session replayed request by request with condense in the loop, as `simulate`
    // does. The replay is deterministic, so one left by an earlier (or interrupted) demo is replaced.
    let file_config = load_config(None, dir)?;
    if store.log().session_id(pruned)?.is_some() {
        store.remove_session(pruned)?;
    }
    let events = condense_formats::import_file(&file)?.events;
    let f = condense_engine::simulate::replay_with(store, pruned, events, file_config.raw.normalize(), file_config.prices, Some(DEMO_WINDOW), None)?;
    let plot = folder.join("demo.svg");
    let price = condense_engine::config::list_price(&file_config.list_prices, condense_engine::simulate::DEFAULT_PRICE_MODEL).expect("the default price model is in the table");
    plot::write(&plot, &[plot::Session { name: pruned, series: &f.series }], None, &price)?;
    let ok = f.validity_errors == 0 && f.refs_recovered_exact == f.refs_checked;
    if json_out {
        let s = store.session(name)?.stats()?;
        let mut v = stats_json(&s);
        v["session"] = json!(name);
        v["simulation"] = figures_json(&f);
        v["simulation"]["session"] = json!(pruned);
        v["plot"] = json!(plot.display().to_string());
        v["simulation"]["dollars"] = dollars_json(&f, &price);
        v["simulation"]["price_model"] = json!(price.model);
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    let s = store.session(name)?.stats()?;
    outln!(
        "\nThe agent's session: {} requests, {} tool calls ({} failed), {} tokens of history by the end.",
        f.turns, s.tool_calls, s.tool_errors, f.raw_tokens_peak
    );
    let window = DEMO_WINDOW.to_string().as_bytes().rchunks(3).rev().map(|c| std::str::from_utf8(c).unwrap_or("")).collect::<Vec<_>>().join(",");
    let (raw_dollars, host_dollars, condense_dollars) = price.of(&f);
    outln!("Replayed request by request with condense in the loop (session `{pruned}`), at a {window}-token window:");
    outln!("\nAgainst the agent compacting its own history (what it really sends: the history until the {window}-token");
    outln!("window is full, then a summary of it and what follows):");
    outln!(
        "  input tokens sent   {:.1}% of the agent's ({} vs {})",
        f.host_token_ratio() * 100.0, f.rendered_input_tokens_total, f.host_input_tokens_total
    );
    outln!("  cost                {:.1}% of the agent's, prompt caching counted", f.host_cost_ratio() * 100.0);
    outln!("  estimated cost      ${condense_dollars:.2} instead of ${host_dollars:.2} at {} list prices", price.model);
    outln!("  largest context     {} tokens instead of {}", f.rendered_tokens_peak, f.host_tokens_peak);
    outln!("  cache breaks        {} (the agent: {}, compacting {} times)", f.cache_breaks, f.host_cache_breaks, f.host_compactions);
    outln!("\nAgainst the agent with no limit (every request carrying the whole history, {} tokens by the end:", f.raw_tokens_peak);
    outln!("past any model's window, so an upper bound, not what an agent could send):");
    outln!(
        "  input tokens sent   {:.1}% ({} vs {}); cost {:.1}%; ${condense_dollars:.2} instead of ${raw_dollars:.2}",
        f.token_ratio() * 100.0, f.rendered_input_tokens_total, f.raw_input_tokens_total, f.cost_ratio() * 100.0
    );
    outln!("\nWhat condense did:");
    outln!("  pruned              {} stubs, {} spilled outputs, {} duplicates, {} chains", f.stubs, f.spills, f.dedups, f.chains);
    outln!("  refs recovered      {}/{} byte-exact; {} provider-rule violations", f.refs_recovered_exact, f.refs_checked, f.validity_errors);
    outln!("  plot                {}", plot.display());
    let store_flag = if dir == Path::new(".condense") { String::new() } else { format!(" --store {}", dir.display()) };
    outln!("\nNext:");
    let next = [
        (format!("condense render {pruned} --as anthropic{store_flag}"), "the context condense would send now"),
        (format!("condense query {pruned} t12{store_flag}"), "an original behind a stub, byte for byte"),
        (format!("condense serve{store_flag}"), "put condense between your agent and its provider (README)"),
    ];
    let width = next.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    for (command, what) in next {
        outln!("  {command:<width$}   {what}");
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

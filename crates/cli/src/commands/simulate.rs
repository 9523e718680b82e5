//! `condense simulate`: sessions replayed with condense in the loop, their figures (tokens, cost, cache
//! breaks, retention, with `--window` against the host's own compaction, in dollars) and plots.

use crate::plot;
use crate::commands::import::{candidate_names, walk};
use crate::shared::{load_config, summarizer_of};
use anyhow::{bail, Result};
use condense_engine::Store;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub(crate) fn figures_json(f: &condense_engine::simulate::Figures) -> Value {
    let mut v = json!({
        "turns": f.turns, "tool_calls": f.tool_calls,
        "raw_tokens_peak": f.raw_tokens_peak, "rendered_tokens_peak": f.rendered_tokens_peak,
        "raw_input_tokens_total": f.raw_input_tokens_total, "rendered_input_tokens_total": f.rendered_input_tokens_total,
        "cached_prefix_tokens_total": f.cached_prefix_tokens_total, "cache_breaks": f.cache_breaks,
        "raw_cached_prefix_tokens_total": f.raw_cached_prefix_tokens_total,
        "cost_units_raw": (f.cost_units_raw * 100.0).round() / 100.0,
        "cost_units_rendered": (f.cost_units_rendered * 100.0).round() / 100.0,
        "cost_units_floor": (f.cost_units_floor * 100.0).round() / 100.0,
        "stubs": f.stubs, "spills": f.spills, "dedups": f.dedups, "chains": f.chains,
        "refs_checked": f.refs_checked, "refs_recovered_exact": f.refs_recovered_exact,
        "validity_errors": f.validity_errors,
        "checkpoints": f.checkpoints, "over_budget_requests": f.over_budget_requests,
        "compaction_failures": f.compaction_failures,
        "recoveries": f.recoveries, "recoveries_blocked": f.recoveries_blocked, "blocked_reasons": f.blocked_reasons,
        "archives": f.archives,
        "facts_needed": f.facts_needed, "facts_retained": f.facts_retained,
        "retention": (f.retention() * 10000.0).round() / 10000.0,
        "token_ratio": (f.token_ratio() * 10000.0).round() / 10000.0,
        "cost_ratio": (f.cost_ratio() * 10000.0).round() / 10000.0,
        "floor_cost_ratio": (f.floor_cost_ratio() * 10000.0).round() / 10000.0,
        "host_input_tokens_total": f.host_input_tokens_total, "host_cached_prefix_tokens_total": f.host_cached_prefix_tokens_total,
        "host_summary_input_tokens_total": f.host_summary_input_tokens_total, "host_tokens_peak": f.host_tokens_peak,
        "host_cache_breaks": f.host_cache_breaks, "host_compactions": f.host_compactions,
        "cost_units_host": (f.cost_units_host * 100.0).round() / 100.0,
        "host_token_ratio": (f.host_token_ratio() * 10000.0).round() / 10000.0,
        "host_cost_ratio": (f.host_cost_ratio() * 10000.0).round() / 10000.0,
    });
    // (Past what one `json!` takes.)
    v["cold_requests"] = json!(f.cold_requests);
    v["raw_new_tokens_total"] = json!(f.raw_new_tokens_total);
    let a = &f.accounts;
    let units = |x: f64| (x * 100.0).round() / 100.0;
    v["decisions"] = json!(a.decisions);
    v["decisions_net_negative"] = json!(a.net_negative);
    v["decisions_net_units"] = json!(units(a.net));
    v["kept_reads"] = json!(a.kept_reads);
    v["kept_reads_net_units"] = json!(units(a.kept_reads_net));
    v["decisions_by_kind"] =
        a.by_kind.iter().map(|&(k, n, neg, net)| (k.name().to_string(), json!({"decisions": n, "net_negative": neg, "net_units": units(net)}))).collect::<serde_json::Map<_, _>>().into();
    v
}

/// The decisions' accounts in a line: how many paid for themselves and their net, by kind.
fn accounts_line(a: &condense_engine::accounts::Totals) -> String {
    let kinds: Vec<String> = a.by_kind.iter().map(|&(k, n, neg, net)| format!("{} {n} ({neg} net negative, net {net:.0})", k.name())).collect();
    format!(
        "decisions: {} ({} had not paid for themselves), net saving {:.0} cost units; {} kept reads cost {:.0}{}{}",
        a.decisions,
        a.net_negative,
        a.net,
        a.kept_reads,
        -a.kept_reads_net,
        if kinds.is_empty() { "" } else { "; " },
        kinds.join(", ")
    )
}

/// Estimated dollars of the raw, host-baseline and condense requests at `price`.
pub(crate) fn dollars_json(f: &condense_engine::simulate::Figures, price: &condense_engine::simulate::ListPrice) -> Value {
    let (raw, host, condense) = price.of(f);
    let floor = price.floor_dollars(f.raw_new_tokens());
    let round = |d: f64| (d * 10000.0).round() / 10000.0;
    json!({"raw": round(raw), "host": round(host), "condense": round(condense), "floor": round(floor)})
}

/// Absolute tokens and estimated dollars, condense beside raw (and, with a window, beside the host's own
/// compaction at that window).
pub(crate) fn money_line(f: &condense_engine::simulate::Figures, price: &condense_engine::simulate::ListPrice, window: Option<u64>) -> String {
    let (raw, host, condense) = price.of(f);
    let new = f.raw_new_tokens();
    let mut line = format!(
        "{} input tokens, ${condense:.2} at {} list prices; raw {} tokens, ${raw:.2}; the floor (each of raw's {new} new tokens once, uncached) ${:.2}",
        f.rendered_input_tokens_total, price.model, f.raw_input_tokens_total, price.floor_dollars(new)
    );
    if let Some(w) = window {
        line.push_str(&format!(
            "; the host's own compaction at {w} tokens {} tokens, ${host:.2} ({} compactions, {} cache breaks): condense takes {:.1}% of its tokens, {:.1}% of its cost",
            f.host_input_tokens_total, f.host_compactions, f.host_cache_breaks, f.host_token_ratio() * 100.0, f.host_cost_ratio() * 100.0
        ));
    }
    line
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// `simulate`'s inputs.
pub(crate) struct SimulateOptions {
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) window: Option<u64>,
    pub(crate) switch: Option<condense_engine::simulate::Switch>,
    /// The cache's lifetime in seconds (`None`: none).
    pub(crate) cache_ttl: Option<u64>,
    pub(crate) config: Option<PathBuf>,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) price: String,
    pub(crate) force: bool,
    pub(crate) json: bool,
}

/// Replays sessions with pruning on; into `kept` (the store, with `--keep`) or a private scratch store.
pub(crate) fn simulate(kept: Option<&Store>, store_dir: &Path, o: &SimulateOptions) -> Result<ExitCode> {
    let window = o.window;
    let file_config = load_config(o.config.as_deref(), store_dir)?;
    let prices = condense_engine::simulate::Prices { cache_ttl: o.cache_ttl, ..file_config.prices };
    let config = file_config.raw.normalize();
    let Some(list_price) = condense_engine::config::list_price(&file_config.list_prices, &o.price) else {
        let mut known: Vec<String> = condense_engine::simulate::price_table().into_iter().map(|p| p.model).collect();
        known.extend(file_config.list_prices.iter().map(|p| p.model.clone()));
        bail!("--price {}: no list prices for that model (known: {}; add one under `listPrices` in the configuration)", o.price, known.join(", "));
    };
    if let Some(plot) = &o.plot {
        plot::check_path(plot)?;
    }
    let summarizer = summarizer_of(&file_config, false);
    // Each file with the folder (or file) given it was found under: sessions are named relative to it, as
    // `import` names them.
    let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
    for path in &o.paths {
        if path.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found)?;
            files.extend(found.into_iter().map(|f| (path.clone(), f)));
        } else if path.is_file() {
            files.push((path.clone(), path.clone()));
        } else {
            bail!("{}: no such file or folder", path.display());
        }
    }
    // Replays not kept go into a store held in memory: nothing in it needs to survive the command, and no
    // append waits for a writer thread or the disk.
    let scratch_options = condense_engine::StoreOptions { defer_durability: true, ..Default::default() };
    let temp = if kept.is_some() { None } else { Some(Store::in_memory(scratch_options)) };
    let target = match (&temp, kept) {
        (Some(t), _) => t,
        (None, Some(k)) => k,
        (None, None) => unreachable!("a scratch store or the kept one"),
    };
    if let Some(s) = &summarizer {
        target.set_summarizer(s.clone());
    }
    let mut total = condense_engine::simulate::Figures::default();
    let mut rows = Vec::new();
    let (mut token_ratios, mut cost_ratios, mut retentions) = (Vec::new(), Vec::new(), Vec::new());
    let (mut host_token_ratios, mut host_cost_ratios, mut floor_ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut plot = Vec::new();
    let mut taken = std::collections::BTreeSet::new();
    for (root, file) in &files {
        // Read on a thread of its own, the file's events are replayed as they are parsed.
        let mut reading = match condense_engine::simulate::Reading::start(file) {
            Ok(r) => r,
            Err(e) => {
                errln!("condense: skipped {e}");
                continue;
            }
        };
        let candidates = candidate_names(root, file);
        let short = candidates.iter().find(|n| !taken.contains(*n)).unwrap_or(&candidates[candidates.len() - 1]).clone();
        taken.insert(short.clone());
        let name = format!("simulated/{short}");
        if kept.is_some() && target.log().session_id(&name)?.is_some() {
            if !o.force {
                bail!("session {name} exists from an earlier `simulate --keep`; pass --force to replace it");
            }
            target.remove_session(&name)?;
        }
        let mut f = condense_engine::simulate::replay_with(target, &name, &mut reading, config.clone(), prices, window, o.switch)?;
        if let Some(e) = reading.finish() {
            // A file that fails part way is skipped as one that fails at once: what was replayed goes.
            target.remove_session(&name)?;
            errln!("condense: skipped {e}");
            continue;
        }
        if !o.json {
            let recovery = match o.switch {
                Some(_) => format!(
                    ", {} recoveries, {} blocked{}, {} archives",
                    f.recoveries,
                    f.recoveries_blocked,
                    if f.blocked_reasons.is_empty() { String::new() } else { format!(" ({})", f.blocked_reasons.join("; ")) },
                    f.archives
                ),
                None => String::new(),
            };
            outln!(
                "{name}: {} requests ({} cold), {} tool calls, tokens {:.1}% of raw, cost {:.1}% of raw (the floor {:.1}%), {} cache breaks, {} stubs, {} chains, {} checkpoints, {} over budget, {} compaction failures{recovery}, retention {:.3} ({}/{} facts), refs {}/{} exact, {} validity errors",
                f.turns, f.cold_requests, f.tool_calls, f.token_ratio() * 100.0, f.cost_ratio() * 100.0, f.floor_cost_ratio() * 100.0, f.cache_breaks, f.stubs, f.chains,
                f.checkpoints, f.over_budget_requests, f.compaction_failures, f.retention(), f.facts_retained, f.facts_needed,
                f.refs_recovered_exact, f.refs_checked, f.validity_errors
            );
            outln!("  {}", money_line(&f, &list_price, window));
            outln!("  {}", accounts_line(&f.accounts));
        }
        if f.turns > 0 {
            token_ratios.push(f.token_ratio());
            cost_ratios.push(f.cost_ratio());
            floor_ratios.push(f.floor_cost_ratio());
            host_token_ratios.push(f.host_token_ratio());
            host_cost_ratios.push(f.host_cost_ratio());
        }
        if f.facts_needed > 0 {
            retentions.push(f.retention());
        }
        let mut row = figures_json(&f);
        row["session"] = json!(name);
        row["dollars"] = dollars_json(&f, &list_price);
        rows.push(row);
        total.add(&f);
        // Plot titles name the session as it was read (without the `simulated/` of the replay).
        plot.push((short, std::mem::take(&mut f.series)));
    }
    drop(temp);
    if let Some(path) = &o.plot {
        let sessions: Vec<plot::Session> = plot.iter().map(|(name, series)| plot::Session { name, series }).collect();
        plot::write(path, &sessions, window, &list_price)?;
    }
    let mut t = figures_json(&total);
    t["dollars"] = dollars_json(&total, &list_price);
    t["sessions"] = json!(rows.len());
    // A configured summarizer that could not answer is said out loud: the figures above are then partly
    // the extractive stand-in's.
    let fallbacks = summarizer.as_ref().map(|s| s.fallbacks()).unwrap_or_default();
    t["summarizer_fallbacks"] = json!(fallbacks.count);
    if fallbacks.count > 0 {
        errln!(
            "condense: warning: the configured summarizer failed {} times and the extractive summarizer stood in (last: {})",
            fallbacks.count,
            fallbacks.last.as_deref().unwrap_or("?")
        );
    }
    t["median_token_ratio"] = json!((median(token_ratios) * 10000.0).round() / 10000.0);
    t["median_cost_ratio"] = json!((median(cost_ratios) * 10000.0).round() / 10000.0);
    t["median_floor_cost_ratio"] = json!((median(floor_ratios) * 10000.0).round() / 10000.0);
    t["median_retention"] = json!((median(retentions) * 10000.0).round() / 10000.0);
    t["median_host_token_ratio"] = json!((median(host_token_ratios) * 10000.0).round() / 10000.0);
    t["median_host_cost_ratio"] = json!((median(host_cost_ratios) * 10000.0).round() / 10000.0);
    if o.json {
        let price = json!({"model": list_price.model, "input": list_price.input, "cachedRead": list_price.cached_read, "cacheWrite": list_price.cache_write});
        outln!("{}", serde_json::to_string_pretty(&json!({"config": condense_engine::config::to_json(&config, prices), "window": window, "cache_ttl": o.cache_ttl, "price": price, "total": t, "sessions": rows}))?);
    } else {
        outln!(
            "total: {} sessions, {} requests ({} cold), tokens {:.1}% of raw (median {:.1}%), cost {:.1}% of raw (median {:.1}%; the floor {:.1}%, median {:.1}%), {} cache breaks, retention {:.3} (median {:.3}), refs {}/{} exact, {} validity errors",
            rows.len(), total.turns, total.cold_requests, total.token_ratio() * 100.0, t["median_token_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            total.cost_ratio() * 100.0, t["median_cost_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            total.floor_cost_ratio() * 100.0, t["median_floor_cost_ratio"].as_f64().unwrap_or(0.0) * 100.0, total.cache_breaks,
            total.retention(), t["median_retention"].as_f64().unwrap_or(0.0),
            total.refs_recovered_exact, total.refs_checked, total.validity_errors
        );
        outln!("  {}", money_line(&total, &list_price, window));
        outln!("  {}", accounts_line(&total.accounts));
        if window.is_some() {
            outln!(
                "  against the host's own compaction: median tokens {:.1}%, median cost {:.1}%",
                t["median_host_token_ratio"].as_f64().unwrap_or(0.0) * 100.0, t["median_host_cost_ratio"].as_f64().unwrap_or(0.0) * 100.0
            );
        }
        if let Some(sw) = o.switch {
            outln!(
                "switch to a {}-token window at request {}: {} recoveries, {} blocked, {} archives, {} over budget",
                sw.window, sw.at, total.recoveries, total.recoveries_blocked, total.archives, total.over_budget_requests
            );
            for r in &total.blocked_reasons {
                outln!("  blocked: {r}");
            }
        }
    }
    let ok = total.validity_errors == 0 && total.refs_recovered_exact == total.refs_checked;
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

// condense's dashboard: the sessions list and a session page, polled from /condense/api/ every two
// seconds. Everything a session holds is untrusted text: it reaches the page only as textContent.
"use strict";

const POLL_MS = 2000;
const main = document.getElementById("main");
let timer = null;
let view = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

const SVG = "http://www.w3.org/2000/svg";
function sv(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function num(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 1e6) return trim((n / 1e6).toFixed(2)) + "M";
  if (n >= 1e4) return trim((n / 1e3).toFixed(1)) + "k";
  return String(Math.round(n));
}
// 50.0 → 50, 2.50 → 2.5: round figures read round.
const trim = (s) => s.replace(/\.0+$/, "").replace(/(\.\d*[1-9])0+$/, "$1");
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
function ago(ms, now) {
  if (!ms) return "–";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

async function api(path) {
  const r = await fetch("api/" + path, { credentials: "same-origin", cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

function showError(e) {
  document.getElementById("updated").textContent = "";
  const old = document.getElementById("fetch-error");
  if (old) old.remove();
  main.prepend(el("p", { id: "fetch-error", class: "error", text: "could not reach condense serve: " + e.message }));
}
function fetched() {
  const old = document.getElementById("fetch-error");
  if (old) old.remove();
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

function totals(status) {
  const t = document.getElementById("totals");
  t.replaceChildren(
    el("span", { id: "total-requests", text: num(status.requests) + " requests" }), " · ",
    el("span", { id: "total-tokens", text: num(status.tokens_in) + " tokens received → " + num(status.tokens_sent) + " sent" }),
  );
}

function costCell(live) {
  const c = live && live.cache_priced;
  if (!c) return "–";
  return (100 * c.cost_vs_direct).toFixed(1) + "%";
}

// ---- the sessions list ----
async function renderList() {
  const data = await api("sessions");
  fetched();
  totals(data.status);
  const rows = data.sessions.map((s) => {
    const l = s.live;
    const f = (l && l.figures) || {};
    const cells = [
      el("td", {}, el("a", { href: "#/session/" + s.id, class: "name", text: s.name })),
      el("td", { class: "requests", text: l ? String(f.requests) : "–" }),
      el("td", { class: "tokens", text: l ? num(l.tokens_received) + " → " + num(l.tokens_sent) : "–" }),
      el("td", { class: "cost", text: costCell(l) }),
      el("td", { class: "hit", text: l && l.cache_priced ? pct(l.cache_priced.condense.cache_hit) : "–" }),
      el("td", { class: "stubs", text: l ? String(f.stubs) : "–" }),
      el("td", { class: "chains", text: l ? String(f.chains) : "–" }),
      el("td", { class: "checkpoints", text: l ? String(f.checkpoints) : "–" }),
      el("td", { class: "recoveries", text: l ? String(f.recoveries) : "–" }),
      el("td", { class: "breaks", text: l ? String(l.cache_breaks) : "–" }),
      el("td", { class: "refused", text: String(s.failures || 0) }),
      el("td", { class: "events", text: String(s.events) }),
      el("td", { class: "last", text: l ? ago(l.last_activity_ms, data.now_ms) : "not served since start" }),
    ];
    return el("tr", { "data-id": String(s.id), class: l ? "live" : "cold" }, ...cells);
  });
  const head = ["session", "requests", "tokens received → sent", "cost vs direct", "cache hit", "stubs", "chains",
    "checkpoints", "recoveries", "cache breaks", "refused", "events", "last activity"];
  const note = data.price_cache ? null
    : el("p", { class: "muted", text: "Cost and cache hit are priced as the providers bill prompt caching for models whose list prices condense knows (listPrices in config.json adds more), and for every model when serve runs with --price-cache." });
  main.replaceChildren(...[
    el("h1", { text: data.sessions.length + (data.sessions.length === 1 ? " session" : " sessions") }),
    note,
    el("table", { id: "sessions" }, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))), el("tbody", {}, ...rows)),
    failuresView(data.failures || [], data.now_ms),
  ].filter((x) => x !== null));
}

// Requests condense refused itself, newest first, each with the session it belongs to and its reason in
// full (it says what did not fit and what to do).
function failuresView(failures, now) {
  if (failures.length === 0) return null;
  const items = failures.map((f) => el("li", { class: "failure" },
    el("span", { class: "when muted", text: ago(f.at_ms, now) }), " ",
    f.session === null || f.session === undefined
      ? el("span", { class: "muted", text: "no session" })
      : el("a", { href: "#/session/" + f.session, class: "session", text: f.name || "session " + f.session }), " ",
    el("span", { class: "code", text: f.status + " " + f.code }), " ",
    el("span", { class: "muted", text: f.api }),
    el("div", { class: "reason", text: f.reason })));
  return el("section", { id: "failures" }, el("h2", { text: "Refused requests" }), el("ol", { class: "timeline" }, ...items));
}

// ---- a session ----
const CHECKPOINT_LINES = 20;

// The round step nearest above `raw`: 1, 2, 2.5 or 5 times a power of ten.
function niceStep(raw) {
  if (!(raw > 0)) return 1;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

function plot(rows, opts) {
  const W = 900, H = 260, L = 60, R = 15, T = 15, B = 30;
  const svg = sv("svg", { class: "plot", id: opts.id, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opts.label });
  if (!rows.length) {
    svg.append(sv("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no requests through this server yet"));
    return svg;
  }
  const n0 = rows[0].n, n1 = rows[rows.length - 1].n;
  let ymax = 1;
  for (const r of rows) for (const s of opts.series) ymax = Math.max(ymax, r[s.key] || 0);
  if (opts.window) for (const r of rows) ymax = Math.max(ymax, r.window || 0);
  // Gridlines at a round step (1, 2, 2.5 or 5 times a power of ten), about four of them, the top one at
  // or above the highest value.
  const step = niceStep(ymax / 4);
  ymax = Math.ceil((ymax * 1.02) / step) * step;
  const x = (n) => L + (n1 === n0 ? 0.5 : (n - n0) / (n1 - n0)) * (W - L - R);
  const y = (v) => T + (1 - v / ymax) * (H - T - B);
  for (let v = 0; v <= ymax + step / 2; v += step) {
    svg.append(sv("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#eee" }));
    svg.append(sv("text", { class: "tick", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, opts.fmt(v)));
  }
  svg.append(sv("text", { x: L, y: H - 8 }, "request " + n0));
  svg.append(sv("text", { x: W - R, y: H - 8, "text-anchor": "end" }, "request " + n1));
  if (opts.markers) {
    // A dashed line the plot's height for each checkpoint; past CHECKPOINT_LINES of them (a long session on a
    // small window) a short tick on the axis each, so they do not paint the plot over.
    const at = [];
    let prev = null;
    for (const r of rows) {
      if (prev !== null && r.checkpoints > prev.checkpoints) at.push(r.n);
      prev = r;
    }
    const top = at.length > CHECKPOINT_LINES ? H - B - 8 : T;
    for (const n of at) {
      svg.append(sv("line", { class: "checkpoint", x1: x(n), x2: x(n), y1: top, y2: H - B, stroke: "var(--checkpoint)", "stroke-dasharray": at.length > CHECKPOINT_LINES ? "" : "4 3" }));
    }
  }
  if (opts.window) {
    const pts = rows.filter((r) => r.window).map((r) => `${x(r.n)},${y(r.window)}`);
    if (pts.length) svg.append(sv("polyline", { class: "window", points: pts.join(" "), fill: "none", stroke: "var(--window)", "stroke-dasharray": "6 4" }));
  }
  for (const s of opts.series) {
    const pts = rows.filter((r) => r[s.key] !== null && r[s.key] !== undefined).map((r) => `${x(r.n)},${y(r[s.key])}`);
    svg.append(sv("polyline", { class: "series-" + s.key, points: pts.join(" "), fill: "none", stroke: s.color, "stroke-width": 2 }));
  }
  if (opts.markers) {
    for (const r of rows) {
      if (r.cache_break) svg.append(sv("circle", { class: "cache-break", cx: x(r.n), cy: y(r.sent), r: 3.5, fill: "var(--break)" }));
    }
  }
  return svg;
}

function legend(items) {
  return el("div", { class: "legend muted" }, ...items.map(([color, text, dashed]) =>
    el("span", {}, el("i", { style: `background:${color};${dashed ? "opacity:.6" : ""}` }), text)));
}

function card(k, v, id) {
  return el("div", { class: "card" }, el("div", { class: "v", id, text: v }), el("div", { class: "k", text: k }));
}

const expanded = new Map(); // ref → original text, for the session shown

async function expand(id, ref, box, button) {
  const open = box.querySelector(`pre.original[data-ref="${ref}"]`);
  if (open) { open.remove(); expanded.delete(ref); return; }
  button.disabled = true;
  try {
    const a = await api(`sessions/${id}/query?ref=${encodeURIComponent(ref)}`);
    expanded.set(ref, a.text);
    box.append(el("pre", { class: "original", "data-ref": ref, text: a.text }));
  } catch (e) {
    box.append(el("pre", { class: "original error", "data-ref": ref, text: e.message }));
  } finally {
    button.disabled = false;
  }
}

function contextView(id, ctx) {
  const list = el("div", { id: "context" });
  for (const m of ctx.messages) {
    const box = el("div", { class: "msg " + m.role, "data-i": String(m.i) });
    box.append(el("div", { class: "meta", text: `#${m.i} ${m.role}${m.kind && m.kind !== m.role ? " · " + m.kind : ""} · ${num(m.tokens)} tokens${m.cut ? " · shown cut, " + num(m.chars) + " characters" : ""}` }));
    box.append(el("pre", { text: m.text }));
    if (m.refs.length) {
      const refs = el("div", { class: "refs" });
      for (const r of m.refs) {
        const b = el("button", { class: "ref", "data-ref": r, type: "button", title: "show the original behind " + r, text: "expand " + r });
        b.addEventListener("click", () => expand(id, r, box, b));
        refs.append(b);
      }
      box.append(refs);
    }
    for (const [r, text] of expanded) if (m.refs.includes(r)) box.append(el("pre", { class: "original", "data-ref": r, text }));
    list.append(box);
  }
  return list;
}

function timelineItem(e) {
  const item = el("li", { "data-seq": String(e.seq) }, el("span", { class: "seq", text: "#" + e.seq }),
    el("span", { class: "kind kind-" + e.kind, text: e.kind }), e.text);
  // What the decision saved less what it cost, to date (cost units; a kept read's is what keeping it costs).
  for (const a of e.accounts || []) {
    const tip = `${a.kind} ${a.label}: ${num(a.tokens)} tokens, saved ${a.saved.toFixed(1)}, rewrite ${a.premium.toFixed(1)}` +
      (a.summarizer ? `, summarizer ${a.summarizer.toFixed(1)}` : "") + ` over ${a.requests} requests` + (a.ended ? " (ended)" : "");
    item.append(el("span", { class: "net " + (a.net < 0 ? "net-negative" : "net-positive"), title: tip,
      text: (a.kind === "kept_read" ? "kept " + a.label + " " : "net ") + (a.net >= 0 ? "+" : "") + a.net.toFixed(1) }));
  }
  return item;
}

async function renderSession(id, state) {
  const data = await api("sessions/" + id);
  fetched();
  totals(data.status);
  const l = data.live;
  const f = (l && l.figures) || {};
  const rows = data.rows;
  const first = !state.built;
  if (first) {
    state.built = true;
    state.head = -1;
    state.after = 0;
    expanded.clear();
    main.replaceChildren(
      el("p", {}, el("a", { href: "#/", text: "← all sessions" })),
      el("h1", { id: "session-name", text: data.name }),
      el("div", { class: "cards", id: "cards" }),
      el("p", { class: "muted", id: "span-note" }),
      el("h2", { text: "Context tokens per request" }),
      legend([["var(--received)", "received from the client"], ["var(--sent)", "sent upstream"], ["var(--window)", "the model's window", true],
        ["var(--checkpoint)", "checkpoint", true], ["var(--break)", "cache break (dot)"]]),
      el("div", { id: "plot-tokens" }),
      el("h2", { text: "Cumulative cost, cache-priced" }),
      el("div", { id: "plot-cost" }),
      el("div", { class: "cols" },
        el("section", {}, el("h2", { text: "The context condense sends now" }), el("div", { id: "context-box" })),
        el("section", {}, el("h2", { text: "Decisions" }), el("ol", { class: "timeline", id: "timeline" }))),
    );
  }
  const c = l && l.cache_priced;
  document.getElementById("cards").replaceChildren(
    card("requests", l ? String(f.requests) : "–", "fig-requests"),
    card("tokens received → sent", l ? num(l.tokens_received) + " → " + num(l.tokens_sent) : "–", "fig-tokens"),
    card("cost vs direct (floor)", c ? pct(c.cost_vs_direct) + " (" + pct(c.floor_vs_direct) + ")" : "–", "fig-cost"),
    card("cache hit, condense / direct", c ? pct(c.condense.cache_hit) + " / " + pct(c.direct.cache_hit) : "–", "fig-hit"),
    card("stubs", l ? String(f.stubs) : "–", "fig-stubs"),
    card("chains", l ? String(f.chains) : "–", "fig-chains"),
    card("checkpoints", l ? String(f.checkpoints) : "–", "fig-checkpoints"),
    card("recoveries", l ? String(f.recoveries) : "–", "fig-recoveries"),
    card("cache breaks", l ? String(l.cache_breaks) : "–", "fig-breaks"),
    card("events in the log", String(data.events), "fig-events"),
    card("decisions' net saving (net negative)", data.accounts ? data.accounts.net.toFixed(1) + " (" + data.accounts.net_negative + " of " + data.accounts.decisions + ")" : "–", "fig-net"),
  );
  // The figures cover two spans: say which is which.
  const since = data.started_ms ? new Date(data.started_ms).toLocaleString() : "its start";
  document.getElementById("span-note").textContent =
    `Requests, tokens, cost, cache breaks and the plots: this server's requests since it started (${since}). ` +
    "Stubs, chains, checkpoints, recoveries, events, the context and the decisions: the whole log. " +
    "The decisions' net (saved less the rewrite and the summarizer, in cost units: 0.1 a cached, 1.25 an uncached token): " +
    "those made since this server took the session up.";
  document.getElementById("plot-tokens").replaceChildren(plot(rows, {
    id: "tokens", label: "context tokens per request", fmt: num, window: true, markers: true,
    series: [{ key: "received", color: "var(--received)" }, { key: "sent", color: "var(--sent)" }],
  }));
  const priced = rows.filter((r) => r.cost_condense !== null);
  document.getElementById("plot-cost").replaceChildren(
    data.price_cache
      ? el("div", {}, legend([["var(--received)", "direct"], ["var(--sent)", "through condense"], ["var(--window)", "the floor: each new byte once, uncached"]]),
        plot(priced, { id: "cost", label: "cumulative cost", fmt: num, series: [{ key: "cost_direct", color: "var(--received)" }, { key: "cost_condense", color: "var(--sent)" }, { key: "cost_floor", color: "var(--window)" }] }))
      : el("p", { class: "muted", text: "This model's list prices are unknown: add them as listPrices in config.json, or start serve with --price-cache, to price its requests as the providers bill prompt caching." }));
  if (data.events !== state.head) {
    state.head = data.events;
    const [ctx, tl] = await Promise.all([api(`sessions/${id}/context`), api(`sessions/${id}/timeline?after=${state.after}`)]);
    document.getElementById("context-box").replaceChildren(
      el("p", { class: "muted", text: `${ctx.messages.length} messages, ${num(ctx.tokens)} tokens (estimated)` }), contextView(id, ctx));
    const ol = document.getElementById("timeline");
    for (const e of tl.events) ol.prepend(timelineItem(e));
    while (ol.children.length > 300) ol.lastChild.remove();
    state.after = tl.head;
  }
}

async function tick() {
  const m = /^#\/session\/(\d+)$/.exec(location.hash);
  const key = m ? "session:" + m[1] : "list";
  if (!view || view.key !== key) view = { key, built: false };
  try {
    if (m) await renderSession(m[1], view);
    else await renderList();
  } catch (e) {
    showError(e);
  }
  document.body.dataset.ready = "1";
  timer = setTimeout(tick, POLL_MS);
}

window.addEventListener("hashchange", () => { clearTimeout(timer); view = null; tick(); });
tick();

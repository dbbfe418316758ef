"use strict";
const TOKEN_KEY = "crossbar-admin-token";
const REFRESH_MS = 3000;
const COLOURS = ["#2f6fdb", "#1f8a4c", "#c0392b", "#8e44ad", "#b7791f", "#16a085", "#d35400",
                 "#7f8c8d"];
const $ = (id) => document.getElementById(id);
let refreshes = 0;
let fetched = 0;  // characters of the API answers of the refresh under way

function report(text) {
  const errors = $("errors");
  const lines = (errors.textContent ? errors.textContent.split("\n") : []).concat([text]);
  errors.textContent = lines.slice(-20).join("\n");
}
window.onerror = (message, source, line) => { report(`script error: ${message} (${source}:${line})`); };
window.addEventListener("unhandledrejection", (e) => { report(`unhandled: ${e.reason}`); });

(function takeTokenFromFragment() {
  const m = location.hash.match(/(?:^#|&)token=([^&]*)/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);  // out of the URL bar
  }
})();

function askToken() {  // an inline form, not window.prompt: nothing blocks the refresh loop
  $("login").hidden = false;
  $("token-input").focus();
}

async function api(method, path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { method, headers, cache: "no-store" });
  if (response.status === 401) askToken();
  let body = null;
  const text = await response.text();
  fetched += text.length;
  try { body = JSON.parse(text); } catch (e) { body = null; }
  if (!response.ok) {
    const why = body && body.error ? body.error.message : response.statusText;
    throw new Error(`${method} ${path}: ${response.status} ${why}`);
  }
  return body;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") node.addEventListener("click", v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function fill(id, heads, rows, empty) {
  const table = $(id);
  table.replaceChildren(el("tr", {}, ...heads.map((h) => el("th", { class: /^[#0-9]|tokens|ms|%|requests|errors|slots|queue|leases|idle|ctx|priority|weight|flight|wait\b|tok\/s|^ETA$/.test(h) ? "num" : null }, h))));
  if (!rows.length) table.append(el("tr", {}, el("td", { colspan: heads.length, class: "muted" }, empty)));
  for (const row of rows) table.append(row);
}

const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
const pct = (r) => (r === null || r === undefined ? "–" : `${(100 * r).toFixed(1)}%`);
const td = (v, cls) => el("td", { class: cls || null }, v);
function ago(seconds) {
  if (seconds < 90) return `${Math.round(seconds)}s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}
const clock = (at) => new Date(at * 1000).toLocaleTimeString("en-GB");

async function act(method, path, question) {
  if (question && !window.confirm(question)) return;
  try { await api(method, path); } catch (e) { report(String(e.message || e)); }
  refresh();
}

function renderHosts(hosts) {
  const rows = [];
  for (const h of hosts) {
    const health = h.healthy ? el("span", { class: "ok" }, "healthy")
                             : el("span", { class: "bad" }, "unhealthy");
    const drain = h.draining
      ? el("button", { type: "button", onclick: () => act("DELETE", `/api/hosts/${encodeURIComponent(h.name)}/drain`) }, "undrain")
      : el("button", { type: "button", onclick: () => act("POST", `/api/hosts/${encodeURIComponent(h.name)}/drain`) }, "drain");
    h.models.forEach((m, i) => {
      rows.push(el("tr", { "data-host": h.name, "data-model": m.name },
        td(i ? "" : h.name), td(i ? "" : health),
        td(i ? "" : draining(h)), td(i ? "" : places(h.router)),
        td(m.name), td(loaded(h.router, m)), td(slots(m), "num"), td(m.queued, "num"),
        td(waiting(m.queued_by_route), "waiting"), td(num(m.queued_prefill_tokens), "num"),
        td(expectedWait(m.expected_wait_seconds), "num"), td(rates(m), "num"),
        td(m.leases, "num"), td(byClass(m), "classes"), td(m.ctx === null ? "?" : num(m.ctx), "num"),
        td(i ? "" : warm(h.cache), "num"),
        td(i ? "" : (h.pinned_routes.join(", ") || "–")),
        td(i ? "" : (h.reason || ""), "muted"), td(i ? "" : drain), td(i ? "" : evacuate(h))));
    });
  }
  fill("hosts", ["host", "health", "draining", "models loaded", "model", "state", "slots in use", "queue", "waiting (by route)",
                 "queued prefill tokens", "expected wait", "prefill / decode tok/s", "leases",
                 "by class", "ctx",
                 "warm cache", "pinned routes", "reason", "", ""], rows, "no hosts configured");
}

// Slots held (and waiters, "+N") per request class where any are, and the slots batch may hold.
function byClass(m) {
  if (!m.classes) return "–";
  const busy = ["interactive", "standard", "batch"]
    .filter((c) => m.classes[c].in_flight || m.classes[c].queued)
    .map((c) => `${c} ${m.classes[c].in_flight}` + (m.classes[c].queued ? ` +${m.classes[c].queued}` : ""));
  const cap = m.batch_slots === null ? "what the turns leave" : `${m.batch_slots}`;
  return el("span", { title: `batch may hold ${cap} of its slots` },
    busy.length ? busy.join(" · ") : "idle");
}

// A router-mode host's places: the models running of how many it holds at once ("–" for a host
// that is not a router).
function places(router) {
  if (!router) return "–";
  const held = router.max_loaded === null ? "?" : router.max_loaded;
  return el("span", { title: `running: ${router.running.join(", ") || "none"}` },
    `${router.running.length} of ${held}`);
}

// A router-mode host's model: its state, and the seconds its load takes ("~" before one was seen).
function loaded(router, m) {
  if (!router || !m.state) return "–";
  const guess = m.load_seconds_source !== "learned" ? "~" : "";
  const load = m.load_seconds === null ? "load unknown"
    : `load ${guess}${m.load_seconds < 10 ? m.load_seconds.toFixed(1) : Math.round(m.load_seconds)} s`;
  return el("span", { class: m.state === "loaded" ? "ok" : (m.state === "failed" ? "bad" : "muted"),
                      title: load }, m.state);
}

// Seconds until a slot frees for one more request, from what runs and waits at the host's rates.
function expectedWait(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  return `${seconds < 10 ? seconds.toFixed(2) : Math.round(seconds)} s`;
}

// The host's learned rates for the model; "~" before any answer of its own (a guess).
function rates(m) {
  // null: a number the admin API could not write as JSON (not finite).
  if (m.prefill_tokens_per_second == null || m.decode_tokens_per_second == null) return "–";
  const text = `${num(Math.round(m.prefill_tokens_per_second))} / ${num(Math.round(m.decode_tokens_per_second))}`;
  const guess = m.rates_source !== "learned";
  return el("span", { class: guess ? "muted" : "", title: `rates: ${m.rates_source}` }, guess ? `~${text}` : text);
}

// A host's cache truth: tokens of its active conversations against what it keeps warm, and
// the reused turns that found their prefix evicted.
function warm(cache) {
  if (!cache) return "–";
  const capacity = cache.warm_capacity === null ? "?" : num(cache.warm_capacity);
  const text = `${num(cache.active_tokens)} / ${capacity} tok, ${num(cache.evictions)} evicted`;
  return el("span", { class: cache.evictions ? "bad" : "", title: `kept ${cache.kept_turns} turns` }, text);
}

// "draining", or an evacuation's progress bar: conversations moved off the host so far.
function draining(h) {
  const e = h.evacuation;
  if (!e) return h.draining ? el("span", { class: "warn" }, "draining") : "no";
  const text = `${e.running ? "evacuating" : "evacuated"} ${e.moved}/${e.total}`;
  const title = `${e.moved} of ${e.total} moved (${e.warm} warm), ${e.left} left` +
    (e.failed ? `, ${e.failed} could not move` : "");
  return el("span", { class: "warn", "data-evacuation": e.running ? "running" : "done", title },
    el("progress", { max: String(e.total || 1), value: String(e.total ? e.moved : 1) }), " ", text);
}

function evacuate(h) {
  if (h.evacuation && h.evacuation.running) return "";
  const path = `/api/hosts/${encodeURIComponent(h.name)}/evacuate`;
  const question = `Evacuate ${h.name}? It is drained and each of its conversations moves, prewarmed, to another host.`;
  return el("button", { type: "button", onclick: () => act("POST", path, question) }, "evacuate");
}

// "1 / 2", or "1 / 2 of 4" when other instances sharing the store hold the rest.
function slots(m) {
  const share = m.share === undefined ? m.parallel : m.share;
  return `${m.in_flight} / ${share}` + (share !== m.parallel ? ` of ${m.parallel}` : "");
}

// "batch 3 · agent 1", or a dash when nobody waits.
function waiting(byRoute) {
  const parts = Object.entries(byRoute || {}).map(([route, n]) => `${route} ${n}`);
  return parts.length ? parts.join(" · ") : "–";
}

// weight null: the route waits in its priority's shared FIFO line.
const share = (r) => (r.weight === null || r.weight === undefined ? "shared" : num(r.weight));
const PAGE = { routes: 20, leases: 50, top: 10, batches: 10 };
// Where each paged table is: its cursors so far (the first page has none; a batch page's
// cursor is the last batch id of the page before).
const pages = { routes: [null], leases: [null], batches: [null] };

function pager(id, kind, answer) {
  const at = pages[kind].length - 1;
  const move = (delta) => () => {
    if (delta > 0) pages[kind].push(answer.next); else pages[kind].pop();
    refresh();
  };
  $(id).replaceChildren(
    el("button", { type: "button", disabled: at ? null : "", onclick: move(-1) }, "‹ prev"), " ",
    `page ${at + 1}`, " ",
    el("button", { type: "button", disabled: answer.next ? null : "", onclick: move(1) }, "next ›"));
}

function renderRoutes(answer) {
  const routes = answer.routes;
  $("route-count").textContent = `${num(answer.total)}`;
  pager("route-pager", "routes", answer);
  fill("routes", ["route", "from", "hosts", "pinned", "leases", "requests 24h", "priority", "weight",
                  "max in flight", "max queued", "in flight", "queued", "by class", ""], routes.map((r) =>
    el("tr", { "data-route": r.name }, td(r.name),
      td(r.served ? (r.template ? `template ${r.template}` : "config") : "not in config", "muted"),
      td(r.hosts.join(", ")), td(r.pinned || "–"), td(r.leases, "num"), td(num(r.requests), "num"),
      td(num(r.priority), "num"), td(share(r), "num"), td(num(r.max_in_flight), "num"),
      td(num(r.max_queued), "num"), td(num(r.in_flight), "num"), td(num(r.queued), "num"),
      td(byClass(r), "classes"),
      td(r.leases ? el("button", { type: "button", onclick: () => act("DELETE", `/api/routes/${encodeURIComponent(r.name)}/leases`, `Release all ${r.leases} leases of route ${r.name}? Their next requests may land on other hosts and re-read their prompts.`) }, "release") : ""))),
    "no routes");
}

function renderLeases(answer) {
  $("lease-count").textContent = `${num(answer.total)}`;
  pager("lease-pager", "leases", answer);
  fill("leases", ["route", "fp", "model", "host", "idle for"], answer.leases.map((l) =>
    el("tr", { "data-lease": `${l.route}/${l.fp}/${l.model}` }, td(l.route),
      td(el("code", {}, l.fp || "(route)")), td(l.model), td(l.host), td(ago(l.idle_for), "num"))),
    "no leases");
}

// The Batch API's batches: whose, how far (items ended of the total, failed among them), their
// tokens and when they should end at the pace so far; a cancel button while one may be cancelled.
const BATCH_CLASS = { completed: "ok", failed: "bad", expired: "bad", cancelling: "warn",
                      cancelled: "warn", in_progress: "", validating: "muted", finalizing: "muted" };
function renderBatches(answer) {
  pager("batch-pager", "batches", answer);
  fill("batches", ["batch", "route", "key", "status", "progress", "tokens in / out", "ETA",
                   "created", ""], answer.batches.map((b) =>
    el("tr", { "data-batch": b.id, "data-status": b.status }, td(el("code", {}, b.id)),
      td(b.route), td(b.key || "–"), td(el("span", { class: BATCH_CLASS[b.status] || null }, b.status)),
      td(progress(b)), td(`${num(b.tokens.prompt)} / ${num(b.tokens.completion)}`, "num"),
      td(eta(b), "num"), td(clock(b.created_at)), td(cancel(b)))),
    "no batches");
}

function progress(b) {
  const p = b.progress;
  const failed = b.items.failed ? el("span", { class: "bad" }, `, ${num(b.items.failed)} failed`) : "";
  return el("span", { title: `${b.items.pending} pending, ${b.items.running} running, ${b.items.done} done` },
    el("progress", { max: String(p.total || 1), value: String(p.total ? p.ended : 0) }), " ",
    `${num(p.ended)}/${num(p.total)}`, failed);
}

// At the pace so far; marked when that pace would not end the batch within its window.
function eta(b) {
  if (b.eta_seconds === null || b.eta_seconds === undefined) return "–";
  const late = b.expires_at && Date.now() / 1000 + b.eta_seconds > b.expires_at;
  return el("span", { class: late ? "warn" : null,
                      title: late ? `at this pace it ends after its window (${clock(b.expires_at)})` : "at the pace so far" },
    ago(b.eta_seconds));
}

function cancel(b) {
  if (b.status !== "in_progress" && b.status !== "validating") return "";
  const question = `Cancel batch ${b.id} of route ${b.route}? Its requests not run go to its error file; those running finish.`;
  return el("button", { type: "button", onclick: () => act("POST", `/api/batches/${encodeURIComponent(b.id)}/cancel`, question) }, "cancel");
}

function renderTotals(status, routes, usage) {
  let requests = 0, prompt = 0, cached = 0;
  for (const u of usage) { requests += u.requests; prompt += u.prompt_tokens || 0; cached += u.cached_tokens || 0; }
  const items = [["conversations (leases)", num(status.leases)], ["routes", num(routes.total)],
    ["hosts healthy", `${status.hosts.healthy} / ${status.hosts.configured}`],
    ["store", status.status]];
  $("totals").replaceChildren(...items.map(([k, v]) =>
    el("span", { "data-total": k }, el("b", {}, v), k)));
}

function usageRows(usage) {
  return usage.map((u) =>
    el("tr", { "data-route": u.route }, td(u.route), td(num(u.requests), "num"),
      td(num(u.errors), u.errors ? "num bad" : "num"),
      td(num((u.prompt_tokens || 0) + (u.completion_tokens || 0)), "num"),
      td(pct(u.cache_hit_ratio), "num"),
      td(num(u.ttfb_p50_ms && Math.round(u.ttfb_p50_ms)), "num"),
      td(num(u.ttfb_p95_ms && Math.round(u.ttfb_p95_ms)), "num")));
}
const USAGE_HEADS = ["route", "requests", "errors", "tokens", "cache hit %", "TTFB p50 ms",
                     "TTFB p95 ms"];

function renderUsage(busiest, worst) {
  fill("usage", USAGE_HEADS, usageRows(busiest), "no requests in this window");
  fill("worst", USAGE_HEADS, usageRows(worst.filter((u) => u.cache_hit_ratio !== null)),
       "no prompt tokens in this window");
  let prompt = 0, cached = 0;
  for (const u of busiest) { prompt += u.prompt_tokens || 0; cached += u.cached_tokens || 0; }
  $("cache-hit").textContent = prompt ? `cache hit ${pct(cached / prompt)} of ${num(prompt)} prompt tokens` : "";
}

// The keys that spent most in the window, with their budgets and the limits they hit.
function renderKeys(keys, usage) {
  const byName = new Map(keys.map((k) => [k.name, k]));
  const of = (used, limit) => (limit ? `${num(Math.round(used))} / ${num(limit)}` : num(Math.round(used)));
  const rows = usage.filter((u) => u.key).map((u) => {
    const k = byName.get(u.key) || { limits: {}, used: {}, blocked: false, expired: false };
    const used = k.used || {};
    const limited = Object.entries(used.limited || {}).map(([n, c]) => `${n} ${c}`).join(", ");
    return el("tr", { "data-key": u.key }, td(u.key),
      td(k.blocked ? "blocked" : k.expired ? "expired" : "ok", k.blocked || k.expired ? "bad" : null),
      td(num(u.requests), "num"),
      td(num((u.prompt_tokens || 0) + (u.completion_tokens || 0)), "num"),
      td(of(used.tokens_today || 0, k.limits.tokens_per_day), "num"),
      td(of(used.tokens_this_month || 0, k.limits.tokens_per_month), "num"),
      td(limited || "–", limited ? "bad" : null));
  });
  fill("keys", ["key", "state", "requests", "tokens", "tokens today / budget",
                "tokens this month / budget", "limits hit"], rows, "no key sent a request in this window");
  $("key-count").textContent = rows.length ? `the ${rows.length} busiest in the window` : "";
}

function renderMoves(moves) {
  fill("moves", ["route", "fp", "model", "moves", "last moved"], moves.map((m) =>
    el("tr", { "data-lease": `${m.route}/${m.fp}/${m.model}` }, td(m.route),
      td(el("code", {}, m.fp || "(route)")), td(m.model), td(num(m.moves), "num"),
      td(clock(m.last_moved)))), "no conversation moved in this window");
}

function renderEvents(events) {
  fill("events", ["at", "reason", "route", "fp", "model", "from", "to"], events.map((e) =>
    el("tr", { "data-reason": e.reason }, td(clock(e.at)), td(e.reason), td(e.route),
      td(el("code", {}, e.fp || (e.model ? "(route)" : "(pin)"))), td(e.model),
      td(e.from_host || "–"), td(e.to_host || "–"))), "no events yet");
}

// Every crossbar sharing this one's store; the one answering is marked.
function renderInstances(answer) {
  const alive = answer.instances.filter((i) => i.alive).length;
  $("instance-count").textContent = `${alive} alive`;
  fill("instances", ["instance", "state", "address", "version", "config", "started",
                     "last heartbeat", "in flight"], answer.instances.map((i) =>
    el("tr", { "data-instance": i.id, "data-alive": String(i.alive) },
      td(i.this ? el("strong", {}, `${i.id} (this one)`) : i.id),
      td(i.alive ? el("span", { class: "ok" }, "alive") : el("span", { class: "bad" }, "dead")),
      td(i.address), td(i.version),
      td(i.config_matches ? el("code", {}, i.config_digest)
                          : el("span", { class: "warn" }, `${i.config_digest} (differs)`)),
      td(clock(i.started)), td(`${ago(i.seconds_since_heartbeat)} ago`, "num"),
      td(num(i.in_flight), "num"))), "no instance has written a heartbeat yet");
}

function renderChart(answer) {
  const svgNS = "http://www.w3.org/2000/svg";
  const W = 1000, H = 220, L = 60, R = 10, T = 10, B = 24;
  const { since, bucket, now, series } = answer;
  const first = Math.floor(since / bucket) * bucket, last = Math.floor(now / bucket) * bucket;
  const routes = [...new Set(series.map((p) => p.route))].sort();
  const values = new Map(routes.map((r) => [r, new Map()]));
  for (const p of series) values.get(p.route).set(p.at, (p.prompt_tokens || 0) + (p.completion_tokens || 0));
  let max = 1;
  for (const m of values.values()) for (const v of m.values()) max = Math.max(max, v);
  const x = (at) => L + ((at - first) / Math.max(bucket, last - first)) * (W - L - R);
  const y = (v) => H - B - (v / max) * (H - T - B);
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n); return n;
  };
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#dde2ea" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#dde2ea" });
  add("text", { x: L - 6, y: T + 10, "text-anchor": "end", "font-size": 11, fill: "#6b7585" }, num(max));
  add("text", { x: L - 6, y: H - B, "text-anchor": "end", "font-size": 11, fill: "#6b7585" }, "0");
  add("text", { x: L, y: H - 6, "font-size": 11, fill: "#6b7585" }, clock(first));
  add("text", { x: W - R, y: H - 6, "text-anchor": "end", "font-size": 11, fill: "#6b7585" }, clock(last));
  const legend = $("legend");
  legend.replaceChildren();
  routes.forEach((route, i) => {
    const colour = COLOURS[i % COLOURS.length], points = [];
    for (let at = first; at <= last; at += bucket) points.push(`${x(at).toFixed(1)},${y(values.get(route).get(at) || 0).toFixed(1)}`);
    add("polyline", { points: points.join(" "), fill: "none", stroke: colour, "stroke-width": 2, "data-route": route });
    legend.append(el("span", {}, el("i", { style: `background:${colour}` }), route));
  });
  $("chart").replaceChildren(svg);
  $("chart-note").textContent = `prompt + completion tokens per ${ago(bucket)}`;
}

// The search box: a route's name (part of it for the routes table, all of it for the leases),
// or the start of a fingerprint.
function filters() {
  const text = $("search").value.trim();
  const q = (params) => Object.entries(params).filter(([, v]) => v).map(([k, v]) => `${k}=${encodeURIComponent(v)}`).join("&");
  const looksLikeFp = /^[0-9a-f]{6,}$/.test(text);
  return {
    routes: q({ limit: PAGE.routes, route: looksLikeFp ? "" : text, cursor: pages.routes.at(-1) }),
    leases: q({ limit: PAGE.leases, route: looksLikeFp ? "" : text, fp: looksLikeFp ? text : "",
                cursor: pages.leases.at(-1) }),
    batches: q({ limit: PAGE.batches, route: looksLikeFp ? "" : text, after: pages.batches.at(-1) }),
  };
}

// One refresh at a time: a refresh asked for while one runs (a button, the search box) runs
// once after it, and the timer waits for the refresh before it, so a slow answer never piles
// requests up.
let running = false, again = false, timer = null;

async function refresh() {
  if (running) { again = true; return; }
  running = true;
  clearTimeout(timer);
  try { await refreshOnce(); } finally {
    running = false;
    if (again) { again = false; refresh(); } else timer = setTimeout(refresh, REFRESH_MS);
  }
}

async function refreshOnce() {
  const windowSeconds = Number($("window").value);
  // About 60 points; whole hours (the store's hourly sums answer) from a day's window on.
  const rough = Math.max(10, Math.round(windowSeconds / 60));
  const bucket = rough >= 1200 ? Math.max(1, Math.round(rough / 3600)) * 3600 : rough;
  const since = `since=${windowSeconds}s`;
  const f = filters();
  fetched = 0;
  try {
    const [status, hosts, routes, leases, events, busiest, worst, moves, series, instances,
           keyUsage, batches] =
      await Promise.all([
        api("GET", "/api/status"), api("GET", "/api/hosts"), api("GET", `/api/routes?${f.routes}`),
        api("GET", `/api/leases?${f.leases}`), api("GET", "/api/events?limit=25"),
        api("GET", `/api/usage?by=route&${since}&sort=requests&limit=${PAGE.top}`),
        api("GET", `/api/usage?by=route&${since}&sort=cache_hit_ratio&limit=${PAGE.top}`),
        api("GET", `/api/moves?${since}&limit=${PAGE.top}`),
        api("GET", `/api/usage/series?${since}&bucket=${bucket}s&top=8`),
        api("GET", "/api/instances"),
        api("GET", `/api/usage?by=key&${since}&sort=requests&limit=${PAGE.top}`),
        api("GET", `/api/batches?${f.batches}`)]);
    // Only the top keys' limits and budgets: a fleet may have thousands of keys.
    const top = keyUsage.usage.map((u) => u.key).filter((k) => k);
    const keys = top.length
      ? await api("GET", `/api/keys?names=${top.map(encodeURIComponent).join(",")}`)
      : { keys: [] };
    renderTotals(status, routes, busiest.usage); renderHosts(hosts.hosts);
    renderRoutes(routes); renderLeases(leases); renderEvents(events.events);
    renderUsage(busiest.usage, worst.usage); renderMoves(moves.moves); renderChart(series);
    renderInstances(instances); renderKeys(keys.keys, keyUsage.usage); renderBatches(batches);
    refreshes += 1;
    const body = document.body.dataset;
    if (refreshes === 1) body.firstPaintMs = String(Math.round(performance.now()));
    body.fetchedBytes = String(fetched);
    body.refreshes = String(refreshes);
    $("status").textContent = `updated ${new Date().toLocaleTimeString("en-GB")}; every ${REFRESH_MS / 1000}s`;
  } catch (e) {
    report(String(e.message || e));
    $("status").textContent = "cannot reach the admin API";
  }
}

let searchTimer = null;
$("search").addEventListener("input", () => {  // a new search starts at the first page
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => {
    pages.routes = [null]; pages.leases = [null]; pages.batches = [null]; refresh();
  }, 300);
});
$("window").addEventListener("change", refresh);
$("token-button").addEventListener("click", askToken);
$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = $("token-input").value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  $("token-input").value = "";
  $("login").hidden = true;
  $("errors").textContent = "";
  refresh();
});
refresh();

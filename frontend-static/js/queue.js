// "/queues/{queue}": every request in flight as one compact row (place, request,
// title or branch, author, what it does, elapsed, chance to land, ETA), grouped by
// what it does — building apart from waiting for a build slot — with its batch and
// speculation paths folded under the row; a filter box ("mine" by author); the last
// 24 h as a small SVG chart; recent results and counts. Kept current by the queue's
// event stream (no reload).
import {
  api, clock, coalesce, duration, fill, h, keepPlace, liveUpdates, notFound,
  percent, priorityBadge, showError, sqidLink, statusBadge, tick, timeElement,
} from "./lib.js";
import { throughputChart } from "./chart.js";
import {
  changesList, dependencyList, forecastLine, freezeBanner, healthBanner, outageBanner,
  pathsTable, stallBanner,
} from "./render.js";
import { initSearch } from "./search.js";
import { onPrincipal, principal } from "./signin.js";

// In this order on the page: closest to landing first.
const ACTIVITY_TITLES = {
  landing: () => "Landing",
  built: () => "Built, waiting for the batches ahead",
  building: (o) => `Building (${o.slots.in_use}/${o.slots.budget} build slots in use)`,
  waiting_for_slot: (o) => `Waiting for a build slot (${o.slots.text})`,
  queued: () => "Queued for a build",
  batching: () => "Batching",
  validating: () => "Incoming (validating)",
  cancelling: () => "Cancelling",
};
const SHORT = {
  landing: "landing", built: "built", building: "building", waiting_for_slot: "waiting",
  queued: "queued", batching: "batching", validating: "validating", cancelling: "cancelling",
};
const COLUMNS = ["#", "Request", "Title or branch", "Author", "Stage", "Elapsed", "Chance",
  "ETA", ""];
const COUNT_ORDER = ["accepted", "started", "validating", "validated", "batching", "batched",
  "speculating", "speculated", "landing", "cancelling", "landed", "error", "cancelled"];
const TWO_COLUMNS = window.matchMedia("(min-width: 1100px)");
const ME_KEY = "submitqueue.me";

const queue = decodeURIComponent(window.location.pathname.split("/")[2] || "");
const els = Object.fromEntries(["title", "description", "outages", "error", "counts", "timing",
  "stages", "recent", "live", "moved", "chart", "slots", "filter", "mine", "me", "me-row",
  "shown"].map((id) => [id, document.getElementById(id)]));
const expanded = new Set();  // sqids whose batch is unfolded (kept across redraws)
let last = null;  // the last overview, for redraws on filter changes
let actor = null;  // the signed-in actor (null: anonymous)

// --- the filter -------------------------------------------------------------------

function me() {
  return [actor, localStorage.getItem(ME_KEY)].filter(Boolean).map((x) => x.toLowerCase());
}

function byAuthor(r, who) {
  const names = [r.author, r.author_email, r.submitted_by].map((x) => (x || "").toLowerCase());
  return names.some((n) => n && (n === who || n.includes(who)));
}

/** Rows the filter keeps: every word must match (``author:x`` only the author); "mine"
 * keeps rows whose author or submitter is the signed-in actor or the name given. */
function matches(r) {
  if (els.mine.checked) {
    const mine = me();
    if (!mine.length || !mine.some((who) => byAuthor(r, who))) return false;
  }
  const words = els.filter.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const hay = [r.sqid, r.title, r.branch, r.author, r.author_email, r.submitted_by,
    r.activity_text, r.batch_id, r.status, ...r.change_uris].join("\n").toLowerCase();
  return words.every((w) => (w.startsWith("author:") ? byAuthor(r, w.slice(7))
    : hay.includes(w)));
}

function syncUrl() {
  const params = new URLSearchParams(window.location.search);
  const q = els.filter.value.trim();
  if (q) params.set("q", q); else params.delete("q");
  if (els.mine.checked) params.set("mine", "1"); else params.delete("mine");
  const search = params.toString();
  window.history.replaceState(null, "", window.location.pathname + (search ? `?${search}` : ""));
}

// --- one row ------------------------------------------------------------------------

/** A duration for a narrow cell: "42 s", "17 min", "2 h 5 min". */
function short(ms) {
  if (ms < 60000) return duration(ms);
  const m = Math.floor(ms / 60000);
  return m < 60 ? `${m} min` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function etaShort(f) {
  if (!f || f.eta_at_ms === null || f.eta_at_ms === undefined) return "unknown";
  const left = f.eta_at_ms - clock.now();
  if (left <= 0) return "any moment";
  return left < 1000 ? "in < 1 s" : `in ~${short(left)}`;
}

/** The rows' own clock: elapsed and ETA cells in the short form, once a second. */
function tickRows() {
  for (const el of document.querySelectorAll("[data-row-since]")) {
    el.textContent = short(clock.now() - Number(el.dataset.rowSince));
  }
  for (const el of document.querySelectorAll("[data-row-eta]")) {
    el.textContent = etaShort({ eta_at_ms: Number(el.dataset.rowEta) });
  }
}

function chanceCell(f) {
  if (!f) return h("span", { class: "muted" }, "–");
  const prior = f.p_land_from === "prior";
  return h("span", { class: `p-land${prior ? " prior" : ""}`, title: prior
    ? `The scorer's prior for this change: nothing of its batch has finished building yet. ${f.basis}`
    : f.basis }, h("strong", {}, prior ? `~${percent(f.p_land)}` : percent(f.p_land)));
}

function stageCell(r) {
  const short = SHORT[r.activity] || r.activity || r.stage;
  return h("span", { class: `activity activity-${r.activity}`, title: r.activity_text }, short,
    r.health && r.health.state !== "ok" ? [" ", h("span", {
      class: `badge badge-${r.health.state.replace("_", "-")}` }, r.health.state === "dead_lettered"
      ? "dead-lettered" : r.health.state)] : null);
}

function batchCard(b) {
  return h("article", { class: "card batch", dataset: { batch: b.id, state: b.state } },
    h("h3", {}, "Batch ", h("code", {}, b.id), " ", statusBadge(b.state)),
    h("p", {}, "Requests: ", b.requests.map((s, i) => [i ? ", " : "", sqidLink(s)])),
    h("div", { class: "deps-row" }, h("span", {}, "Depends on: "), dependencyList(b.dependencies)),
    healthBanner(b.health),
    forecastLine(b.forecast),
    h("p", { class: "muted small" }, b.forecast.basis),
    pathsTable(b.paths, `Speculation paths of ${b.id}`));
}

function fold(r, batch) {
  return h("tr", { class: "fold", id: `fold-${r.n}` }, h("td", { colspan: COLUMNS.length },
    h("p", { class: "small" }, h("strong", {}, r.activity_text), " · received ",
      timeElement(r.received_at_ms),
      r.submitted_by ? ` · submitted by ${r.submitted_by}` : null,
      r.author_email ? ` · author ${r.author} <${r.author_email}>` : null),
    changesList(r.change_uris),
    batch ? batchCard(batch) : h("p", { class: "muted small" }, "Not in a batch yet.")));
}

function toggle(r) {
  const open = expanded.has(r.sqid);
  return h("button", { type: "button", class: "fold-toggle", "aria-expanded": String(open),
    "aria-controls": `fold-${r.n}`, id: `toggle-${r.n}`,
    "aria-label": `${open ? "Hide" : "Show"} the batch and paths of ${r.sqid}`,
    on: { click: () => {
      if (expanded.has(r.sqid)) expanded.delete(r.sqid); else expanded.add(r.sqid);
      draw();
    } } }, open ? "▾" : "▸");
}

function requestRows(r, batches) {
  const name = r.title || r.branch;
  const hover = [r.title, r.branch && `branch ${r.branch}`, r.change_uris.length > 1
    ? `${r.change_uris.length} changes` : null].filter(Boolean).join(" · ");
  return h("tbody", { class: "req", dataset: { sqid: r.sqid, status: r.status, stage: r.stage,
    activity: r.activity } },
  h("tr", { class: "row" },
    h("td", { class: "pos" }, r.position ?? ""),
    h("td", { class: "sqid" }, sqidLink(r.sqid)),
    h("td", { class: "name", title: hover }, priorityBadge(r.priority), name,
      r.title && r.branch ? h("span", { class: "branch" }, ` ${r.branch}`) : null,
      r.change_uris.length > 1 ? h("span", { class: "muted" }, ` +${r.change_uris.length - 1}`)
        : null),
    h("td", { class: "author", title: r.author_email || r.submitted_by || "" },
      r.author || r.submitted_by || "–"),
    h("td", { class: "stage-cell" }, stageCell(r)),
    h("td", { class: "elapsed", title: `received ${new Date(r.received_at_ms).toString()}` },
      h("span", { dataset: { rowSince: String(r.received_at_ms) } },
        short(clock.now() - r.received_at_ms))),
    h("td", { class: "chance" }, chanceCell(r.forecast)),
    h("td", { class: "eta-cell", title: r.forecast ? r.forecast.basis : "" },
      h("span", { class: "eta", dataset: r.forecast && r.forecast.eta_at_ms
        ? { rowEta: String(r.forecast.eta_at_ms) } : {} }, etaShort(r.forecast))),
    h("td", { class: "toggle-cell" }, toggle(r))),
  r.health && r.health.state !== "ok" ? h("tr", { class: "trouble" },
    h("td", { colspan: COLUMNS.length }, healthBanner(r.health))) : null,
  expanded.has(r.sqid) ? fold(r, batches.get(r.batch_id)) : null);
}

// --- the list -----------------------------------------------------------------------

function groupsOf(o, rows) {
  const order = Object.keys(ACTIVITY_TITLES);
  const by = new Map();
  for (const r of rows) {
    const key = order.includes(r.activity) ? r.activity : "validating";
    if (!by.has(key)) by.set(key, []);
    by.get(key).push(r);
  }
  return order.filter((k) => by.has(k)).map((k) => ({ key: k, title: ACTIVITY_TITLES[k](o),
    rows: by.get(k) }));
}

function groupHead(g, continued) {
  return h("tbody", { class: "group", dataset: { activity: g.key } }, h("tr", {},
    h("th", { colspan: COLUMNS.length, scope: "rowgroup" }, g.title, " ",
      h("span", { class: "count" }, `(${g.rows.length})`), continued ? " (continued)" : null)));
}

function table(items, caption) {
  return h("table", { class: "inflight-table" },
    h("caption", { class: "visually-hidden" }, caption),
    h("colgroup", {}, ["pos", "sqid", "name", "author", "stage", "elapsed", "chance", "eta",
      "toggle"].map((c) => h("col", { class: `col-${c}` }))),
    h("thead", {}, h("tr", {}, COLUMNS.map((c, i) => h("th", { scope: "col",
      class: i === COLUMNS.length - 1 ? "visually-hidden-text" : null },
    i === COLUMNS.length - 1 ? h("span", { class: "visually-hidden" }, "Details") : c)))),
    items);
}

/** Two tables side by side on a wide screen (the list split in half, a group carried
 * over says so), one otherwise. */
function layout(o, groups) {
  const batches = new Map(o.batches.map((b) => [b.id, b]));
  const flat = [];
  for (const g of groups) {
    flat.push({ g, head: true });
    for (const r of g.rows) flat.push({ g, r });
  }
  const render = (part, first) => part.map((it, i) => {
    if (it.head) return groupHead(it.g, false);
    const carried = i === 0 && !first;
    return [carried ? groupHead(it.g, true) : null, requestRows(it.r, batches)];
  });
  const rows = flat.filter((x) => !x.head).length;
  if (!TWO_COLUMNS.matches || rows < 16) {
    return h("div", { class: "inflight" }, table(render(flat, true), "Requests in flight"));
  }
  let cut = Math.ceil(flat.length / 2);
  if (flat[cut - 1].head) cut -= 1;  // never leave a heading alone at the bottom
  return h("div", { class: "inflight two" },
    table(render(flat.slice(0, cut), true), "Requests in flight, first half"),
    table(render(flat.slice(cut), false), "Requests in flight, second half"));
}

function renderInFlight(o) {
  const all = o.stages.flatMap((g) => g.requests);
  const rows = all.filter(matches);
  const filtered = rows.length !== all.length;
  fill(els.shown, filtered ? `${rows.length} of ${all.length} shown` : "");
  const s = o.slots;
  const building = s ? `${s.building} building, ${s.waiting_for_slot} waiting for a build ` +
    `slot (${s.text})` : "";
  fill(els.slots, `${all.length} in flight${all.length ? ` · ${building}` : ""}` +
    (o.truncated ? " · list truncated" : ""));
  if (!all.length) {
    fill(els.stages, h("p", { class: "muted" }, "Nothing in flight."));
    return;
  }
  if (!rows.length) {
    fill(els.stages, h("p", { class: "muted" }, els.mine.checked && !me().length
      ? "“Mine” needs to know who you are: sign in, or give your name or email."
      : "No request in flight matches the filter."));
    return;
  }
  fill(els.stages, layout(o, groupsOf(o, rows)));
}

function renderRecent(recent) {
  if (!recent.length) {
    fill(els.recent, h("p", { class: "muted" }, "Nothing finished yet."));
    return;
  }
  fill(els.recent, h("div", { class: "table-wrap" }, h("table", { class: "recent" },
    h("caption", {}, "Landed, failed and cancelled requests, newest first"),
    h("thead", {}, h("tr", {}, ["Request", "Title or branch", "Result", "Took", "Finished",
      "Landed as, or why not"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, recent.map((r) => h("tr", { dataset: { sqid: r.sqid, status: r.status } },
      h("td", {}, sqidLink(r.sqid)),
      h("td", { class: "name", title: r.branch }, r.title || r.branch),
      h("td", {}, statusBadge(r.status)),
      h("td", {}, duration(r.duration_ms)),
      h("td", {}, timeElement(r.status_at_ms)),
      h("td", { class: "reason" }, r.landed_commits.length
        ? r.landed_commits.map((c, i) => [i ? ", " : "", h("code", { class: "sha landed-as",
          title: c }, c.slice(0, 12))])
        : r.last_error || "")))))));
}

function renderCounts(counts, timing, budget) {
  fill(els.counts, COUNT_ORDER.filter((s) => counts[s]).map((s) => h("div", {},
    h("dt", {}, s), h("dd", { dataset: { count: s } }, counts[s]))));
  if (!els.counts.childElementCount) fill(els.counts, h("p", { class: "muted" }, "No requests."));
  const build = timing.build_ms === null ? "unknown"
    : `${duration(timing.build_ms)} (median of ${timing.build_samples})`;
  const merge = timing.merge_ms === null ? "unknown"
    : `${duration(timing.merge_ms)} (median of ${timing.merge_samples})`;
  fill(els.timing, `Recent builds take ${build}; merges take ${merge}. Build budget: ${budget}.`);
}

function renderChart(t) {
  const svg = throughputChart(t);
  fill(els.chart, svg ? [svg, h("figcaption", { class: "small muted" },
    `24 h: ${t.landed} landed · ${t.failed} failed`,
    t.mean_wait_ms === null ? "" : ` · mean wait ${duration(t.mean_wait_ms)}`)] : null);
}

// The newest move of the target outside the queue: a new trunk the paths were rebuilt on.
function renderMove(move) {
  els.moved.hidden = !move;
  fill(els.moved, move ? move.notice : "");
  if (move) els.moved.title = `${move.tip_sha} (trunk epoch ${move.epoch})`;
}

function draw() {
  if (!last) return;
  keepPlace(document.getElementById("main"), () => renderInFlight(last));
}

async function refresh() {
  try {
    const o = await api(`/api/v1/queues/${encodeURIComponent(queue)}/overview`);
    clock.sync(o.now_ms);
    last = o;
    keepPlace(document.getElementById("main"), () => {
      fill(els.title, `Queue ${o.queue}`);
      document.title = `${o.queue} · SubmitQueue`;
      fill(els.description, o.description || "");
      fill(els.outages, freezeBanner(o.freeze), outageBanner(o.outages), stallBanner(o.stall),
        healthBanner(o.queue_health));
      renderCounts(o.counts, o.timing, o.build_budget);
      renderMove(o.trunk_move);
      renderChart(o.throughput);
      renderInFlight(o);
      renderRecent(o.recent);
    });
    fill(els.error);
    els.stages.removeAttribute("aria-busy");
    document.body.dataset.loaded = String(Date.now());
    return true;
  } catch (err) {
    if (err.status === 404) {
      notFound(els, err, "Queue not found");
      return false;
    }
    showError(els.error, err);
    return true;
  }
}

async function whoAmI() {
  try {
    const who = await principal();
    actor = who.anonymous ? null : who.actor;
  } catch {
    actor = null;
  }
  els["me-row"].hidden = !els.mine.checked || Boolean(actor);
  draw();
}

function setUpFilter() {
  const params = new URLSearchParams(window.location.search);
  els.filter.value = params.get("q") || "";
  els.mine.checked = params.get("mine") === "1";
  els.me.value = localStorage.getItem(ME_KEY) || "";
  els["me-row"].hidden = true;
  els.filter.addEventListener("input", () => { syncUrl(); draw(); });
  els.mine.addEventListener("change", () => {
    els["me-row"].hidden = !els.mine.checked || Boolean(actor);
    syncUrl();
    draw();
  });
  els.me.addEventListener("input", () => {
    const v = els.me.value.trim();
    if (v) localStorage.setItem(ME_KEY, v); else localStorage.removeItem(ME_KEY);
    draw();
  });
  document.getElementById("filter-form").addEventListener("submit", (e) => e.preventDefault());
  TWO_COLUMNS.addEventListener("change", draw);
}

async function main() {
  initSearch(queue);
  setUpFilter();
  const later = coalesce(refresh, 120);
  if (!await refresh()) return;  // an unknown queue: nothing to stream or refresh
  whoAmI();
  const live = liveUpdates(queue, { onOpen: later, onChange: later, statusEl: els.live });
  onPrincipal(() => { live.restart(); whoAmI(); later(); });
  setInterval(() => { tick(); tickRows(); }, 1000);
  // keeps a live batch's countdowns and paths honest between events
  setInterval(later, 15000);
}

main();

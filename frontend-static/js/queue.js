// "/queues/{queue}": in-flight requests by stage, batches with their paths, recent
// results and counts, kept current by the queue's event stream (no reload).
import {
  api, clock, coalesce, duration, fill, h, keepPlace, liveUpdates, showError, sqidLink,
  statusBadge, tick, timeElement,
} from "./lib.js";
import {
  changesList, dependencyList, forecastLine, outageBanner, pathsTable,
} from "./render.js";
import { initSearch } from "./search.js";
import { onPrincipal } from "./signin.js";

const STAGE_TITLES = {
  incoming: "Incoming (validating)",
  batching: "Batching",
  speculating: "Speculating (building)",
  landing: "Landing",
  cancelling: "Cancelling",
};
const COUNT_ORDER = ["accepted", "started", "validating", "validated", "batching", "batched",
  "speculating", "speculated", "landing", "cancelling", "landed", "error", "cancelled"];

const queue = decodeURIComponent(window.location.pathname.split("/")[2] || "");
const els = Object.fromEntries(["title", "description", "outages", "error", "counts", "timing",
  "stages", "batches", "recent", "live", "moved"].map((id) => [id, document.getElementById(id)]));

function requestCard(r) {
  return h("li", { class: "req", dataset: { sqid: r.sqid, status: r.status } },
    h("div", { class: "req-head" },
      h("strong", {}, sqidLink(r.sqid)), " ", statusBadge(r.status),
      h("span", { class: "muted" }, " for ",
        h("span", { dataset: { since: String(r.status_at_ms) } },
          duration(clock.now() - r.status_at_ms))),
      r.batch_id ? h("span", { class: "muted" }, ` · ${r.batch_id}`) : null,
      r.submitted_by ? h("span", { class: "muted by" }, ` · by ${r.submitted_by}`) : null),
    changesList(r.change_uris),
    forecastLine(r.forecast));
}

function renderStages(stages) {
  const groups = stages.filter((g) => g.requests.length);
  if (!groups.length) {
    fill(els.stages, h("p", { class: "muted" }, "Nothing in flight."));
    return;
  }
  fill(els.stages, groups.map((g) => h("section", { class: "stage", dataset: { stage: g.stage },
    "aria-label": STAGE_TITLES[g.stage] || g.stage },
  h("h3", {}, STAGE_TITLES[g.stage] || g.stage, " ",
    h("span", { class: "count" }, `(${g.requests.length})`)),
  h("ul", { class: "req-list" }, g.requests.map(requestCard)))));
}

function batchCard(b) {
  return h("article", { class: "card batch", dataset: { batch: b.id, state: b.state } },
    h("h3", {}, h("code", {}, b.id), " ", statusBadge(b.state)),
    h("p", {}, "Requests: ", b.requests.map((s, i) => [i ? ", " : "", sqidLink(s)])),
    h("div", { class: "deps-row" }, h("span", {}, "Depends on: "), dependencyList(b.dependencies)),
    forecastLine(b.forecast),
    h("p", { class: "muted small" }, b.forecast.basis),
    pathsTable(b.paths, `Speculation paths of ${b.id}`));
}

function renderBatches(batches) {
  if (!batches.length) {
    fill(els.batches, h("p", { class: "muted" }, "No live batch."));
    return;
  }
  fill(els.batches, h("div", { class: "batch-list" }, batches.map(batchCard)));
}

function renderRecent(recent) {
  if (!recent.length) {
    fill(els.recent, h("p", { class: "muted" }, "Nothing finished yet."));
    return;
  }
  fill(els.recent, h("div", { class: "table-wrap" }, h("table", { class: "recent" },
    h("caption", {}, "Landed, failed and cancelled requests, newest first"),
    h("thead", {}, h("tr", {}, ["Request", "Result", "Took", "Finished", "Reason"].map(
      (t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, recent.map((r) => h("tr", { dataset: { sqid: r.sqid, status: r.status } },
      h("td", {}, sqidLink(r.sqid)),
      h("td", {}, statusBadge(r.status)),
      h("td", {}, duration(r.duration_ms)),
      h("td", {}, timeElement(r.status_at_ms)),
      h("td", { class: "reason" }, r.last_error || "")))))));
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

// The newest move of the target outside the queue: a new trunk the paths were rebuilt on.
function renderMove(move) {
  els.moved.hidden = !move;
  fill(els.moved, move ? move.notice : "");
  if (move) els.moved.title = `${move.tip_sha} (trunk epoch ${move.epoch})`;
}

async function refresh() {
  try {
    const o = await api(`/api/v1/queues/${encodeURIComponent(queue)}/overview`);
    clock.sync(o.now_ms);
    keepPlace(document.getElementById("main"), () => {
      fill(els.title, `Queue ${o.queue}`);
      document.title = `${o.queue} · SubmitQueue`;
      fill(els.description, o.description || "");
      fill(els.outages, outageBanner(o.outages));
      renderCounts(o.counts, o.timing, o.build_budget);
      renderMove(o.trunk_move);
      renderStages(o.stages);
      renderBatches(o.batches);
      renderRecent(o.recent);
    });
    fill(els.error);
    els.stages.removeAttribute("aria-busy");
    document.body.dataset.loaded = String(Date.now());
  } catch (err) {
    showError(els.error, err);
  }
}

function main() {
  initSearch(queue);
  const later = coalesce(refresh, 120);
  refresh();
  const live = liveUpdates(queue, { onOpen: later, onChange: later, statusEl: els.live });
  onPrincipal(() => { live.restart(); later(); });
  setInterval(tick, 1000);
  // keeps a live batch's countdowns and paths honest between events
  setInterval(later, 15000);
}

main();

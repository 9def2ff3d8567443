// "/queues/{queue}/requests/{n}": where a request is, what happens next (or why it was
// removed), its batch and what it waits on, the stage trail, and a cancel button.
import {
  api, clock, coalesce, duration, etaElement, fill, h, keepPlace, liveUpdates, percent,
  queuePath, showError, statusBadge, tick, timeElement,
} from "./lib.js";
import { dependencyList, outageBanner, pathsTable } from "./render.js";
import { initSearch } from "./search.js";
import { onPrincipal, openSignIn, principal, whyNoCancel } from "./signin.js";

const parts = window.location.pathname.split("/");
const queue = decodeURIComponent(parts[2] || "");
const number = decodeURIComponent(parts[4] || "");
const sqid = `${queue}/${number}`;
const $ = (id) => document.getElementById(id);

const REMOVAL_TITLES = {
  build_failed: "Removed: its build failed",
  merge_conflict: "Removed: merge conflict",
  cancelled: "Cancelled",
  dead_lettered: "Removed: dead-lettered",
  dependency_unavailable: "Removed: a dependency stayed unreachable",
  duplicate: "Removed: duplicate",
  rejected: "Removed: rejected",
  error: "Removed: error",
};

function evidenceList(evidence) {
  if (!evidence.length) return null;
  return h("ul", { class: "evidence" }, evidence.map((e) => h("li", {},
    e.url ? h("a", { href: e.url }, e.label) : h("span", {}, e.label))));
}

function renderNext(view) {
  const r = view.request;
  const box = $("next");
  if (view.removal) {
    fill($("next-h"), REMOVAL_TITLES[view.removal.kind] || "Removed");
    fill(box, h("div", { class: "removal", dataset: { kind: view.removal.kind } },
      h("p", { class: "reason" }, view.removal.text),
      view.removal.stage ? h("p", {}, "Stage: ", h("code", {}, view.removal.stage)) : null,
      evidenceList(view.removal.evidence),
      r.last_error ? h("details", {}, h("summary", {}, "Error as recorded"),
        h("pre", { class: "raw-error" }, r.last_error)) : null));
    return;
  }
  if (r.status === "landed") {
    fill($("next-h"), "Landed");
    const commits = r.landed_commits || [];
    fill(box, h("p", {}, `Landed ${duration(r.duration_ms)} after it was submitted.`),
      commits.length ? h("div", { class: "landed-commits" },
        h("p", {}, commits.length === 1 ? "Landed as commit" : "Landed as commits"),
        h("ol", { id: "landed-commits" }, commits.map((c, i) => h("li", {},
          h("code", { class: "sha", title: r.change_uris[i] || "" }, c))))) : null);
    return;
  }
  fill($("next-h"), "What happens next");
  const f = r.forecast;
  fill(box, outageBanner(view.outages), h("dl", { class: "facts" },
    h("div", {}, h("dt", {}, "Chance to land"),
      h("dd", { class: "p-land" }, f ? percent(f.p_land) : "unknown")),
    h("div", {}, h("dt", {}, "Chance the builds under way count"),
      h("dd", {}, f ? percent(f.p_speculation_holds) : "unknown")),
    h("div", {}, h("dt", {}, "Expected to land"), h("dd", {}, etaElement(f))),
    h("div", {}, h("dt", {}, "How we know"), h("dd", { class: "small" }, f ? f.basis : "–"))),
  view.waits_on.length ? h("div", { class: "waits" }, h("p", {}, "Waits on:"),
    dependencyList(view.waits_on)) : null);
}

function renderBatch(view) {
  const b = view.batch;
  if (!b) {
    fill($("batch"), h("p", { class: "muted" }, "Not in a batch (yet)."));
    return;
  }
  fill($("batch"), h("article", { class: "card batch", dataset: { batch: b.id, state: b.state } },
    h("p", {}, h("code", {}, b.id), " ", statusBadge(b.state),
      b.requests.length > 1 ? ` with ${b.requests.length - 1} other request(s)` : null),
    h("div", { class: "deps-row" }, h("span", {}, "Depends on: "), dependencyList(b.dependencies)),
    b.failure_reason ? h("p", { class: "reason" }, b.failure_reason) : null,
    pathsTable(b.paths, `Speculation paths of ${b.id}`)));
}

function trailEntry(e) {
  const link = e.build_url ? h("a", { href: e.build_url }, "build log") : null;
  return h("li", {}, timeElement(e.at_ms), " ", e.event,
    e.build_status ? [" ", statusBadge(e.build_status)] : null,
    e.build_id ? [" ", h("code", {}, e.build_id)] : null, link ? [" ", link] : null);
}

function renderTrail(view) {
  fill($("trail"), view.trail.map((st) => h("li", { class: "stage-step",
    dataset: { status: st.status } },
  h("div", { class: "step-head" },
    h("strong", { class: "step-label" }, st.label), " ",
    h("span", { class: "muted" }, timeElement(st.at_ms),
      st.duration_ms === null ? "" : ` · ${duration(st.duration_ms)}`)),
  st.last_error ? h("p", { class: "reason" }, st.last_error) : null,
  st.entries.length ? h("details", {}, h("summary", {}, `${st.entries.length} event(s)`),
    h("ul", { class: "events" }, st.entries.map(trailEntry))) : null)));
}

async function refresh() {
  try {
    const view = await api(`/api/v1/queues/${encodeURIComponent(queue)}/requests/` +
      `${encodeURIComponent(number)}/view`);
    clock.sync(view.now_ms);
    const r = view.request;
    keepPlace($("main"), () => {
      fill($("title"), `Request ${r.sqid}`);
      document.title = `${r.sqid} · SubmitQueue`;
      fill($("status"), statusBadge(r.status));
      fill($("changes"), r.change_uris.map((u, i) => h("li", {}, h("code", { class: "uri" }, u),
        r.landed_commits && r.landed_commits[i] ? [" → landed as ",
          h("code", { class: "sha landed-as" }, r.landed_commits[i])] : null)));
      renderNext(view);
      renderBatch(view);
      renderTrail(view);
      fill($("submitted"), r.submitted_by ? ["Submitted by ", h("strong", {}, r.submitted_by),
        " at ", timeElement(r.received_at_ms)] : ["Submitted at ",
        timeElement(r.received_at_ms)]);
    });
    await renderCancel(view);
    document.body.dataset.status = r.status;
    fill($("error"));
    document.body.dataset.loaded = String(Date.now());
  } catch (err) {
    showError($("error"), err);
  }
}

/** The cancel section: shown while it can be cancelled; the button only to a caller
 * the server would let cancel it (the server checks again). */
async function renderCancel(view) {
  $("cancel-section").hidden = !view.cancellable;
  if (!view.cancellable) return;
  let why;
  try {
    why = whyNoCancel(await principal(), view.request);
  } catch (err) {
    why = `Could not ask the server who you are: ${err.message}`;
  }
  $("cancel").hidden = why !== null;
  $("cancel-signin").hidden = why === null;
  fill($("cancel-why"), why || "");
}

function setUpCancel(reload) {
  $("cancel-signin").addEventListener("click", openSignIn);
  const dialog = $("cancel-dialog");
  $("cancel").addEventListener("click", () => {
    fill($("cancel-h"), `Cancel ${sqid}?`);
    $("cancel-reason").value = "";
    dialog.showModal();
    $("cancel-keep").focus();
  });
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "confirm") return;
    const reason = $("cancel-reason").value.trim();
    try {
      const out = await api(`/api/v1/queues/${encodeURIComponent(queue)}/requests/` +
        `${encodeURIComponent(number)}/cancel`, { method: "POST", body: { reason } });
      fill($("cancel-result"), `Cancel requested: ${out.sqid} is ${out.status}.`);
      reload();
    } catch (err) {
      showError($("cancel-result"), err);
    }
  });
}

function main() {
  initSearch(queue);
  const link = $("queue-link");
  link.setAttribute("href", queuePath(queue));
  link.textContent = queue;
  const later = coalesce(refresh, 120);
  setUpCancel(later);
  refresh();
  const live = liveUpdates(queue, {
    onOpen: later,
    // its own changes, and those of the batches it waits on, matter: re-read on any
    onChange: later,
    statusEl: $("live"),
  });
  onPrincipal(() => {
    fill($("cancel-result"));
    live.restart();
    later();
  });
  setInterval(tick, 1000);
  setInterval(later, 15000);  // batches it waits on can change without an event of its own
}

main();

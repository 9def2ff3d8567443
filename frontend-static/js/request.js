// "/queues/{queue}/requests/{n}": where a request is, what happens next (or why it was
// removed), its batch and what it waits on, the stage trail, and a cancel button.
import {
  api, clock, coalesce, duration, etaElement, fill, found, h, keepPlace, liveUpdates,
  notFound, percent, priorityBadge, queuePath, showError, statusBadge, tick, timeElement,
  unknownQueue,
} from "./lib.js";
import {
  dependencyList, flakeNote, freezeBanner, healthBanner, outageBanner, pathsTable,
} from "./render.js";
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

// The failing lines of a failed build's log (removal.log): numbered as in the whole
// log, the lines that read like a failure marked in words too, a link to all of it.
function logExcerpt(log) {
  if (!log || !log.lines.length) return null;
  const from = log.lines[0].n;
  const to = log.lines[log.lines.length - 1].n;
  const where = log.first_failure === null
    ? `the last ${log.lines.length} lines (no line reads like a failure)`
    : `lines ${from}–${to} of ${log.total_lines}, around the first failure (line ${log.first_failure})`;
  return h("figure", { class: "log-excerpt", dataset: { build: log.build_id } },
    h("figcaption", {}, "Build ", h("code", {}, log.build_id), `: ${where}`,
      log.url ? [" · ", h("a", { href: log.url, class: "full-log" }, "the whole log")] : null),
    h("ol", { class: "log-lines", start: String(from) }, log.lines.map((l) => h("li", {
      value: String(l.n), class: l.failing ? "failing" : null,
      dataset: l.n === log.first_failure ? { first: "true" } : {} },
    l.failing ? h("span", { class: "visually-hidden" }, "failing: ") : null,
    h("code", {}, l.text || "\u00a0")))));
}

function renderRemoval(view) {
  const r = view.request;
  const removal = view.removal;
  fill($("next-h"), REMOVAL_TITLES[removal.kind] || "Removed");
  fill($("next"), h("div", { class: "removal", dataset: { kind: removal.kind } },
    h("p", { class: "reason" }, removal.text),
    removal.stage ? h("p", {}, "Stage: ", h("code", {}, removal.stage)) : null,
    evidenceList(removal.evidence)),
  logExcerpt(removal.log),
  removal.next_steps.length ? h("div", { class: "next-steps" },
    h("h3", {}, "What to do next"),
    h("ul", {}, removal.next_steps.map((step) => h("li", {}, step)))) : null,
  r.last_error ? h("details", {}, h("summary", {}, "Error as recorded"),
    h("pre", { class: "raw-error" }, r.last_error)) : null);
}

function renderNext(view) {
  const r = view.request;
  const box = $("next");
  if (view.removal) {
    renderRemoval(view);
    return;
  }
  if (r.status === "landed") {
    fill($("next-h"), "Landed");
    const commits = r.landed_commits || [];
    fill(box, h("p", {}, `Landed ${duration(r.duration_ms)} after it was submitted.`),
      flakeNote(view.flakes), commits.length ? h("div", { class: "landed-commits" },
        h("p", {}, commits.length === 1 ? "Landed as commit" : "Landed as commits"),
        h("ol", { id: "landed-commits" }, commits.map((c, i) => h("li", {},
          h("code", { class: "sha", title: r.change_uris[i] || "" }, c))))) : null);
    return;
  }
  fill($("next-h"), "What happens next");
  const f = r.forecast;
  fill(box, freezeBanner(view.freeze), outageBanner(view.outages), healthBanner(r.health),
    flakeNote(view.flakes),
    h("dl", { class: "facts" },
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
    found();
    keepPlace($("main"), () => {
      fill($("title"), `Request ${r.sqid}`);
      document.title = `${r.sqid} · SubmitQueue`;
      fill($("status"), statusBadge(r.status), priorityBadge(r.priority));
      fill($("changes"), r.change_uris.map((u, i) => h("li", {}, h("code", { class: "uri" }, u),
        r.landed_commits && r.landed_commits[i] ? [" → landed as ",
          h("code", { class: "sha landed-as" }, r.landed_commits[i])] : null)));
      renderNext(view);
      renderBatch(view);
      renderTrail(view);
      fill($("about"), r.title ? h("strong", { class: "req-title" }, r.title) : null,
        r.branch ? [r.title ? " · " : "", "branch ", h("code", { class: "branch" }, r.branch)]
          : null,
        r.author ? [" · by ", h("span", { class: "author", title: r.author_email }, r.author)]
          : null);
      fill($("submitted"), r.submitted_by ? ["Submitted by ", h("strong", {}, r.submitted_by),
        " at ", timeElement(r.received_at_ms)] : ["Submitted at ",
        timeElement(r.received_at_ms)],
      r.position ? ` · number ${r.position} in line` : null,
      r.activity_text && !["landed", "error", "cancelled"].includes(r.status)
        ? ` · ${r.activity_text}` : null);
    });
    await renderCancel(view);
    document.body.dataset.status = r.status;
    fill($("error"));
    document.body.dataset.loaded = String(Date.now());
    return true;
  } catch (err) {
    if (err.status === 404) {
      notFound({ title: $("title"), error: $("error"), live: $("live") }, err,
        unknownQueue(err) ? "Queue not found" : "Request not found");
      return !unknownQueue(err);  // a request may yet appear; a queue will not
    }
    showError($("error"), err);
    return true;
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

async function main() {
  initSearch(queue);
  const link = $("queue-link");
  link.setAttribute("href", queuePath(queue));
  link.textContent = queue;
  const later = coalesce(refresh, 120);
  setUpCancel(later);
  if (!await refresh()) return;  // an unknown queue or request: nothing to stream
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

// "/admin": sign in with the admin token (kept in sessionStorage only), then topics
// (pause / resume each consumer group), dead letters with reconcile / requeue /
// discard, one by one or all of a topic (a reason is required to requeue or discard),
// and the audit log; each queue's freeze with freeze / unfreeze (docs/freeze.md);
// refreshed every 5 s unless an action is being typed.
import { ApiError, api, duration, fill, h, showError, sqidLink, timeElement } from "./lib.js";
import { initSearch } from "./search.js";

const KEY = "submitqueue.adminToken";
const A = "/api/v1/admin";
const $ = (id) => document.getElementById(id);
const MODES = {
  reconcile: "Reconcile: end its request or batch in its failed state",
  requeue: "Requeue: send it back to its original topic",
  discard: "Discard: delete it",
};

const token = () => sessionStorage.getItem(KEY);

function signedOut(message) {
  sessionStorage.removeItem(KEY);
  $("console").hidden = true;
  $("login").hidden = false;
  if (message) showError($("error"), new Error(message));
  $("token").focus();
}

async function call(path, options = {}) {
  try {
    return await api(A + path, { ...options, token: token() });
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      signedOut(err.message);
    }
    throw err;
  }
}

const BATCH = /^([A-Za-z0-9][A-Za-z0-9._-]*)\/batch\/[0-9]+$/;
const batchRequests = new Map();  // batch id -> promise of its member requests (search API)

/** A batch's requests as links, filled in once the search API answered. */
function requestsOf(id) {
  const out = h("span", { class: "entity-requests", dataset: { batch: id } });
  if (!batchRequests.has(id)) {
    batchRequests.set(id, api(`/api/v1/search?${new URLSearchParams({ q: id })}`)
      .then((found) => found.items)
      .catch(() => { batchRequests.delete(id); return null; }));
  }
  batchRequests.get(id).then((items) => {
    if (items === null) {
      const [, queue] = BATCH.exec(id);
      fill(out, " (", h("a", { href: `/queues/${encodeURIComponent(queue)}?${
        new URLSearchParams({ q: id })}` }, "its requests in flight"), ")");
    } else if (items.length) {
      fill(out, ` (request${items.length > 1 ? "s" : ""} `, items.map((hit, i) => [i ? ", " : "",
        h("a", { href: hit.page }, hit.sqid)]), ")");
    }
  });
  return out;
}

/** The request or batch a dead letter names, linked to its request page(s). */
function entityCell(id) {
  if (!id) return h("span", { class: "muted" }, "–");
  if (/^[A-Za-z0-9][A-Za-z0-9._-]*\/[0-9]+$/.test(id)) return sqidLink(id);
  return BATCH.test(id) ? h("span", {}, h("code", {}, id), requestsOf(id)) : h("code", {}, id);
}

let formSeq = 0;

function actionForm(topic, message) {
  formSeq += 1;
  const ids = { mode: `mode-${formSeq}`, reason: `reason-${formSeq}` };
  const select = h("select", { id: ids.mode, name: "mode" },
    Object.entries(MODES).map(([value, label]) => h("option", { value }, label)));
  const reason = h("input", { id: ids.reason, name: "reason", maxlength: "2000",
    placeholder: "what was fixed, or why it cannot be processed" });
  const sync = () => { reason.required = select.value !== "reconcile"; };
  select.addEventListener("change", sync);
  sync();
  return h("form", { class: "dlq-action", dataset: { id: String(message.id) },
    on: { submit: async (event) => {
      event.preventDefault();
      if (!event.target.reportValidity()) return;
      const body = { mode: select.value, message_ids: [message.id], reason: reason.value.trim() };
      try {
        const out = await call(`/dlq/${encodeURIComponent(topic)}/drain`,
          { method: "POST", body });
        const result = out.results[0] || {};
        fill($("action-result"), `${topic} #${message.id}: ${result.result}` +
          (result.error ? ` (${result.error})` : "") + ` — audit entry ${out.audit_id}.`);
        await load();
      } catch (err) {
        showError($("action-result"), err);
      }
    } } },
  h("label", { for: ids.mode }, `Action for message ${message.id}`), select,
  h("label", { for: ids.reason }, "Reason"), reason,
  h("button", { type: "submit" }, "Apply"));
}

const DRAIN_PAGES = 50; // at most 50 x 200 messages per click; click again for more

/** Drain the unsettled dead letters of ``topic``: bounded pages, following the cursor. */
async function drainAll(topic, mode, reason) {
  const counts = {};
  let cursor = null;
  let audits = 0;
  do {
    const out = await call(`/dlq/${encodeURIComponent(topic)}/drain`,
      { method: "POST", body: { mode, message_ids: null, reason, limit: 200, cursor } });
    for (const [k, v] of Object.entries(out.counts)) counts[k] = (counts[k] || 0) + v;
    audits += 1;
    cursor = out.next_cursor || null;
  } while (cursor && audits < DRAIN_PAGES);
  return { counts, audits, more: Boolean(cursor) };
}

function drainAllForm(topic, size) {
  formSeq += 1;
  const ids = { mode: `all-mode-${formSeq}`, reason: `all-reason-${formSeq}` };
  const select = h("select", { id: ids.mode, name: "mode" },
    Object.entries(MODES).map(([value, label]) => h("option", { value }, label)));
  const reason = h("input", { id: ids.reason, name: "reason", maxlength: "2000",
    placeholder: "why every one of them gets this" });
  const sync = () => { reason.required = select.value !== "reconcile"; };
  select.addEventListener("change", sync);
  sync();
  return h("form", { class: "dlq-action dlq-all", dataset: { topic },
    on: { submit: async (event) => {
      event.preventDefault();
      if (!event.target.reportValidity()) return;
      try {
        const { counts, audits, more } =
          await drainAll(topic, select.value, reason.value.trim());
        const summary = Object.entries(counts).map(([k, v]) => `${k}: ${v}`).join(", ");
        fill($("action-result"), `${topic}, all: ${summary || "nothing left"}` +
          ` (${audits} audit entr${audits === 1 ? "y" : "ies"})` +
          (more ? "; more remain: apply again." : "."));
        await load();
      } catch (err) {
        showError($("action-result"), err);
      }
    } } },
  h("label", { for: ids.mode }, `Action for all ${size} in ${topic}`), select,
  h("label", { for: ids.reason }, "Reason"), reason,
  h("button", { type: "submit" }, "Apply to all"));
}

function consumerButton(topic, group) {
  const action = group.paused ? "resume" : "pause";
  const label = `${group.paused ? "Resume" : "Pause"} ${topic} (${group.group})`;
  return h("button", { type: "button", class: "consumer-toggle", "aria-label": label,
    dataset: { topic, group: group.group, action },
    on: { click: async () => {
      try {
        const out = await call(`/consumers/${encodeURIComponent(topic)}/${action}`, {
          method: "POST", body: { group: group.group, reason: `from the admin page (${action})` },
        });
        fill($("action-result"), `${topic} (${out.group}): ${out.paused ? "paused" : "resumed"}` +
          (out.changed ? "." : " (it already was)."));
        await load();
      } catch (err) {
        showError($("action-result"), err);
      }
    } } }, group.paused ? "Resume" : "Pause");
}

/** The admin token's call to a queue's freeze route (outside /api/v1/admin). */
async function freezeCall(queue, action, body) {
  try {
    return await api(`/api/v1/queues/${encodeURIComponent(queue)}/${action}`,
      { method: body ? "POST" : "GET", body, token: token() });
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      signedOut(err.message);
    }
    throw err;
  }
}

function freezeForm(queue, freeze) {
  const id = (x) => `freeze-${queue}-${x}`;
  const reason = h("input", { id: id("reason"), name: "reason", required: true,
    placeholder: "release cut, incident, ..." });
  const builds = h("input", { id: id("builds"), type: "checkbox", checked: true });
  const act = async (action, body) => {
    try {
      const out = await freezeCall(queue, action, body);
      fill($("action-result"), `${queue}: ${out.freeze.frozen ? out.freeze.text : "not frozen"}` +
        (out.changed ? "." : " (nothing to change)."));
      await load();
    } catch (err) {
      showError($("action-result"), err);
    }
  };
  return h("form", { class: "freeze-form", dataset: { queue },
    on: { submit: (event) => {
      event.preventDefault();
      act("freeze", { reason: reason.value, allow_builds: builds.checked });
    } } },
  h("label", { for: id("reason") }, `Reason to freeze ${queue}`), reason,
  h("label", { for: id("builds") }, builds, " keep building"),
  h("button", { type: "submit" }, freeze.frozen ? "Freeze again" : "Freeze"),
  freeze.frozen && freeze.source === "manual" ? h("button", { type: "button",
    class: "unfreeze", on: { click: () => act("unfreeze", { reason: "from the admin page" }) } },
  "Unfreeze") : null);
}

async function renderFreezes() {
  const { items } = await api("/api/v1/queues", { token: token() });
  const rows = [];
  for (const q of items) {
    const { freeze } = await freezeCall(q.name, "freeze");
    rows.push(h("li", { class: "card", dataset: { queue: q.name } },
      h("p", {}, h("strong", {}, q.name), ": ", freeze.frozen ? freeze.text : "lands as usual"),
      freezeForm(q.name, freeze)));
  }
  fill($("freezes"), h("ul", { class: "freeze-list" }, rows));
}

async function renderDlq() {
  const { topics } = await call("/dlq");
  const busy = topics.filter((t) => t.size > 0);
  if (!busy.length) {
    fill($("dlq"), h("p", { class: "muted" }, "No dead letters. Every topic is clean."));
    return;
  }
  const sections = [];
  for (const t of busy) {
    const { items } = await call(`/dlq/${encodeURIComponent(t.topic)}/messages?limit=50`);
    sections.push(h("section", { class: "card dlq-topic", dataset: { topic: t.topic } },
      h("h3", {}, h("code", {}, t.topic), ` — ${t.size} message(s)`,
        t.parked ? `, ${t.parked} parked` : "",
        t.consumers.some((c) => c.paused) ? " (its reconciler is paused)" : ""),
      t.size > 1 ? drainAllForm(t.topic, t.size) : null,
      h("ul", { class: "dlq-list" }, items.map((m) => h("li", { class: "dlq-message",
        dataset: { id: String(m.id) } },
      h("p", {}, h("strong", {}, `#${m.id}`), " from ", h("code", {}, m.original_topic || "?"),
        " · entity ", entityCell(m.entity_id), ` · ${m.attempts} attempt(s) · failed `,
        m.failed_at_ms ? timeElement(m.failed_at_ms) : "–", m.parked ? " · parked" : ""),
      h("pre", { class: "raw-error" }, m.last_error || "(no error recorded)"),
      actionForm(t.topic, m))))));
  }
  fill($("dlq"), sections);
}

async function renderTopics() {
  const { topics } = await call("/topics");
  const rows = [];
  for (const t of topics) {
    for (const g of t.groups) {
      rows.push(h("tr", {},
        h("th", { scope: "row" }, h("code", {}, t.topic)), h("td", {}, g.group),
        h("td", {}, g.depth), h("td", {}, g.in_flight), h("td", {}, g.held),
        h("td", {}, g.retrying), h("td", {}, g.oldest_age_ms ? duration(g.oldest_age_ms) : "–"),
        h("td", {}, g.paused ? "paused" : "running", " ", consumerButton(t.topic, g)),
        h("td", {}, t.is_dlq ? "–" : t.dlq_size)));
    }
  }
  fill($("topics"), h("div", { class: "table-wrap" }, h("table", {},
    h("caption", {}, "Per topic and consumer group"),
    h("thead", {}, h("tr", {}, ["Topic", "Group", "Depth", "In flight", "Held", "Retrying",
      "Oldest", "Consumer", "Dead letters"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows))));
}

async function renderAudit() {
  const { items } = await call("/audit?limit=20");
  if (!items.length) {
    fill($("audit"), h("p", { class: "muted" }, "No admin action yet."));
    return;
  }
  fill($("audit"), h("div", { class: "table-wrap" }, h("table", { class: "audit" },
    h("caption", {}, "Admin actions, newest first"),
    h("thead", {}, h("tr", {}, ["When", "Who", "Action", "Topic", "Messages", "Reason",
      "Result"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, items.map((e) => h("tr", { dataset: { action: e.action } },
      h("td", {}, timeElement(e.at_ms)), h("td", {}, e.actor), h("td", {}, e.action),
      h("td", {}, h("code", {}, e.topic)), h("td", {}, (e.message_ids || []).join(", ")),
      h("td", {}, e.reason || "–"),
      h("td", {}, Object.entries((e.result && e.result.counts) || {})
        .map(([k, v]) => `${k}: ${v}`).join(", ") || "–")))))));
}

async function load() {
  try {
    await Promise.all([renderFreezes(), renderDlq(), renderTopics(), renderAudit()]);
    fill($("whoami"), `Signed in for this tab · updated ${new Date().toLocaleTimeString()}`);
    fill($("error"));
    document.body.dataset.loaded = String(Date.now());
  } catch (err) {
    if (token()) showError($("error"), err);
  }
}

async function signIn(value) {
  sessionStorage.setItem(KEY, value);
  try {
    await call("/dlq");
  } catch {
    return;
  }
  $("login").hidden = true;
  $("console").hidden = false;
  fill($("error"));
  await load();
  $("refresh").focus();
}

/** Refresh on a timer, unless the operator is in the middle of an action. */
function autoRefresh() {
  setInterval(() => {
    if ($("console").hidden || document.hidden) return;
    const busy = $("dlq").contains(document.activeElement) ||
      $("freezes").contains(document.activeElement) ||
      Array.from(document.querySelectorAll(".dlq-action input, .freeze-form input[name=reason]"))
        .some((i) => i.value);
    if (!busy) load();
  }, 5000);
}

function main() {
  initSearch(null, { signIn: false });
  autoRefresh();
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    $("token").value = "";
    if (value) signIn(value);
  });
  $("logout").addEventListener("click", () => signedOut(""));
  $("refresh").addEventListener("click", load);
  if (token()) signIn(token());
}

main();

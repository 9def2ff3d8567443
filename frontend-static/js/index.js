// "/": the configured queues with their counts.
import { api, fill, h, queuePath, showError } from "./lib.js";
import { initSearch } from "./search.js";
import { onPrincipal } from "./signin.js";

const LIVE = ["accepted", "started", "validating", "validated", "batching", "batched",
  "speculating", "speculated", "landing", "cancelling"];

async function load() {
  const box = document.getElementById("queues");
  try {
    const { items } = await api("/api/v1/queues");
    fill(box, items.map((q) => {
      const live = LIVE.reduce((n, s) => n + (q.counts[s] || 0), 0);
      return h("article", { class: "card queue-card" },
        h("h2", {}, h("a", { href: queuePath(q.name) }, q.name)),
        h("p", { class: "muted" }, q.description || ""),
        h("dl", { class: "counts" },
          h("div", {}, h("dt", {}, "in flight"), h("dd", {}, live)),
          h("div", {}, h("dt", {}, "landed"), h("dd", {}, q.counts.landed || 0)),
          h("div", {}, h("dt", {}, "error"), h("dd", {}, q.counts.error || 0)),
          h("div", {}, h("dt", {}, "cancelled"), h("dd", {}, q.counts.cancelled || 0)),
          h("div", {}, h("dt", {}, "build budget"), h("dd", {}, q.build_budget))));
    }));
    if (!items.length) fill(box, h("p", {}, "No queue is configured."));
    fill(document.getElementById("error"));
  } catch (err) {
    showError(document.getElementById("error"), err);
  } finally {
    box.removeAttribute("aria-busy");
  }
}

function main() {
  initSearch();
  onPrincipal(load);
  load();
}

main();

// The search box in every page's header: a sqid (demo/12; a bare number on a queue
// page) or an exact change URI. One hit opens its page; several are listed.
import { api, fill, h, showError, statusBadge } from "./lib.js";

export function initSearch(currentQueue = null) {
  const form = document.getElementById("search");
  const input = document.getElementById("search-q");
  const results = document.getElementById("search-results");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const q = input.value.trim();
    if (!q) return;
    const params = new URLSearchParams({ q });
    if (currentQueue) params.set("queue", currentQueue);
    try {
      const found = await api(`/api/v1/search?${params}`);
      if (found.items.length === 1) {
        window.location.assign(found.items[0].page);
        return;
      }
      if (found.items.length === 0) {
        fill(results, h("p", { class: "notice" }, `No request matches ${found.query}.`));
        return;
      }
      fill(results, h("div", { class: "notice" },
        h("p", {}, `${found.items.length} requests carried this change:`),
        h("ul", {}, found.items.map((hit) => h("li", {},
          h("a", { href: hit.page }, hit.sqid), " ", statusBadge(hit.status))))));
    } catch (err) {
      showError(results, err);
    }
  });
}

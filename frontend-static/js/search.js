// Every page's header (brand, main navigation, search box), rendered into the page's
// empty <header class="site">, and the search box: a sqid (demo/12; a bare number on a
// queue page), a batch id (its requests) or an exact change URI. One hit opens its page;
// several are listed.
import { api, fill, h, showError, statusBadge } from "./lib.js";
import { initSignIn } from "./signin.js";

function renderHeader(signIn) {
  const header = document.querySelector("header.site");
  fill(header,
    h("a", { class: "brand", href: "/" }, "SubmitQueue"),
    h("nav", { "aria-label": "Main" },
      h("a", { href: "/" }, "Queues"),
      h("a", { href: "/admin" }, "Admin")),
    h("form", { id: "search", class: "search", role: "search", autocomplete: "off" },
      h("label", { for: "search-q" }, "Find a request"),
      h("input", {
        id: "search-q", name: "q", type: "search", required: true, maxlength: "1024",
        placeholder: "demo/12 or a change URI", "aria-describedby": "search-hint",
      }),
      h("button", { type: "submit" }, "Search"),
      h("span", { id: "search-hint", class: "visually-hidden" },
        "A sqid such as demo/12, a batch such as demo/batch/3, or an exact change URI")),
    signIn ? h("div", { id: "signin", class: "signin" }) : null);
}

/** The header on every page; ``signIn: false`` leaves out the token control (/admin
 * has its own). */
export function initSearch(currentQueue = null, { signIn = true } = {}) {
  renderHeader(signIn);
  if (signIn) initSignIn();
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
        h("p", {}, found.kind === "batch" ? `${found.query} holds ${found.items.length} requests:`
          : `${found.items.length} requests carried this change:`),
        h("ul", {}, found.items.map((hit) => h("li", {},
          h("a", { href: hit.page }, hit.sqid), " ", statusBadge(hit.status))))));
    } catch (err) {
      showError(results, err);
    }
  });
}

// The header's "Sign in" control: a person enters an API token (`submitqueue token
// create`), the pages send it as "Authorization: Bearer" with every call (lib.js
// tabToken: this tab only, never a cookie), and ask the server who it is
// (GET /api/v1/auth/whoami) to decide what to offer, e.g. the request page's cancel
// button. The server decides every call again; this only hides what would be refused.
import { ApiError, api, fill, h, tabToken } from "./lib.js";

let current = null;  // a promise of the whoami answer for the tab's token
const listeners = [];
const $ = (id) => document.getElementById(id);

/** Who the server takes this tab for: {actor, anonymous, scopes, queues, auth, ...}. */
export function principal() {
  if (current === null) {
    current = api("/api/v1/auth/whoami").catch((err) => {
      if (!(err instanceof ApiError) || err.status !== 401 || !tabToken.get()) throw err;
      tabToken.clear();  // revoked or expired since it was entered: back to anonymous
      return api("/api/v1/auth/whoami", { token: null });
    });
    current.catch(() => { current = null; });  // a network error: ask again next time
  }
  return current;
}

/** Call fn() each time the person signs in or out. */
export function onPrincipal(fn) {
  listeners.push(fn);
}

function changed() {
  current = null;
  renderSlot();
  for (const fn of listeners) fn();
}

function inQueue(who, queue) {
  return who.queues === null || who.queues === undefined || who.queues.includes(queue);
}

/**
 * null when ``who`` may cancel ``request`` (a request row or summary); else why not,
 * in words a person can act on. Mirrors the server's rule (app/gateway/requests.py).
 */
export function whyNoCancel(who, request) {
  const scopes = new Set(who.scopes);
  if (!inQueue(who, request.queue)) {
    return `The token of ${who.actor} is limited to ${who.queues.join(", ")}.`;
  }
  if (scopes.has("cancel:any")) return null;
  if (scopes.has("cancel") && request.submitted_by === who.actor) return null;
  if (who.anonymous) {
    return "Cancelling needs an API token with the scope cancel (your own requests) " +
      "or cancel:any (anyone's). Sign in with one.";
  }
  if (scopes.has("cancel")) {
    return `${request.sqid} was submitted by ${request.submitted_by || "an unknown actor"}; ` +
      `the token of ${who.actor} cancels only its own requests (cancel:any cancels anyone's).`;
  }
  return `The token of ${who.actor} has no cancel scope (it has ${who.scopes.join(", ")}).`;
}

function renderSlot() {
  const slot = $("signin");
  if (!slot) return;
  const signedIn = tabToken.get() !== null;
  principal().then((who) => {
    fill(slot, signedIn && !who.anonymous
      ? [h("span", { id: "signin-who" }, "Signed in as ", h("strong", {}, who.actor)), " ",
        h("button", { type: "button", id: "signout", class: "link",
          on: { click: () => { tabToken.clear(); changed(); } } }, "Sign out")]
      : h("button", { type: "button", id: "signin-open", class: "link",
        on: { click: openSignIn } }, "Sign in"));
  }).catch(() => fill(slot));
}

/** Open the sign-in dialog. */
export function openSignIn() {
  const dialog = $("signin-dialog");
  fill($("signin-error"));
  $("signin-token").value = "";
  dialog.showModal();
  $("signin-token").focus();
}

function dialogElement() {
  const input = h("input", { id: "signin-token", name: "token", type: "password",
    autocomplete: "off", spellcheck: "false", required: true, maxlength: "200" });
  const form = h("form", { method: "dialog", id: "signin-form" },
    h("h2", { id: "signin-h" }, "Sign in with an API token"),
    h("p", { class: "small" }, "The token stays in this browser tab and is sent only to " +
      "this server. Ask an administrator for one (submitqueue token create)."),
    h("label", { for: "signin-token" }, "API token"), input,
    h("p", { id: "signin-error", role: "alert" }),
    h("div", { class: "actions" },
      h("button", { type: "submit", value: "close", formnovalidate: true }, "Close"),
      h("button", { type: "submit", value: "use", id: "signin-use" }, "Use this token")));
  form.addEventListener("submit", async (event) => {
    if (event.submitter && event.submitter.value !== "use") return;
    event.preventDefault();
    const token = input.value.trim();
    try {
      const who = await api("/api/v1/auth/whoami", { token });
      if (who.anonymous) throw new Error("the server does not know this token");
      tabToken.set(token);
      input.value = "";
      $("signin-dialog").close();
      changed();
    } catch (err) {
      fill($("signin-error"), h("span", { class: "error" },
        `Not signed in: ${err.message || String(err)}`));
    }
  });
  return h("dialog", { id: "signin-dialog", "aria-labelledby": "signin-h" }, form);
}

/** The header's slot (an element with id "signin") and the dialog. */
export function initSignIn() {
  document.body.appendChild(dialogElement());
  renderSlot();
}

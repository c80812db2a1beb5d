// rlf ui: one page, four views (runs, a run, a trajectory, a new run), routed by the URL hash;
// the views are the other scripts, loaded before this one.
"use strict";

// ---------------------------------------------------------------- a new run

async function showNewRun() {
  const {ok, body} = await api("/api/new-run/form");
  if (!ok) { put(main, h("h1", {}, "New run"), h("div", {class: "error"}, body.error)); return; }
  window.rlfNewRun(main, body, {h, api, post, fmt, put});
}

// ---------------------------------------------------------------- routing

// The view's state lives in the address: #/PATH?QUERY (a run page's kind, step and filters, the
// runs list's comparison), kept current with history.replaceState as it changes, so Back,
// Forward, a reload and a pasted link restore it; the scroll position is kept per address.
function routeQuery() { return new URLSearchParams(location.hash.split("?")[1] || ""); }

function setQuery(values) {  // this view's state into its address, without a new history entry
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(values)) if (v !== "" && v !== null && v !== undefined) query.set(k, v);
  const path = location.hash.split("?")[0] || "#/";
  const text = query.toString();
  history.replaceState(history.state, "", `${path}${text ? "?" + text : ""}`);
}

const scrolls = JSON.parse(sessionStorage.getItem("rlf-scrolls") || "{}");
function restoreScroll() { if (scrolls[location.hash]) window.scrollTo(0, scrolls[location.hash]); }

function route() {
  clearInterval(timer);
  tooltip.hidden = true;
  let parts;
  try {
    parts = location.hash.split("?")[0].replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  } catch (e) {  // a malformed address
    put(main, h("h1", {}, "Not found"), h("p", {}, h("a", {href: "#/"}, "all runs")));
    return;
  }
  const query = routeQuery();
  if (parts[0] === "run" && parts[2] === "t") return showTrajectory(parts[1], parts[3], Number(parts[4]), Number(parts[5]), query.get("q") || "");
  if (parts[0] === "run" && parts[2] === "same") return showSameSample(parts[1], parts[3], parts.slice(4).join("/"));
  if (parts[0] === "run" && parts[2] === "group") return showGroup(parts[1], parts[3], Number(parts[4]), Number(parts[5]));
  if (parts[0] === "run" && parts[1]) return showRun(parts[1], query);
  if (parts[0] === "new") return showNewRun();
  return showRuns(query);
}
window.addEventListener("hashchange", e => {
  const old = e.oldURL.split("#")[1];
  if (old !== undefined) { scrolls[`#${old}`] = window.scrollY; sessionStorage.setItem("rlf-scrolls", JSON.stringify(scrolls)); }
  route();
});
route();

// rlf ui: one page, four views (runs, a run, a trajectory, a new run), routed by the URL hash.
// Every value from a run is put in the page as text (textContent), never as HTML.
"use strict";

const main = document.getElementById("main");
const tooltip = document.getElementById("tooltip");
let timer = null;  // the current view's refresh

// ---------------------------------------------------------------- helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

// replaceChildren with the empty parts (null, undefined, false) left out, not written as "null"
function put(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter(c => c !== null && c !== undefined && c !== false));
}

// label/value pairs as a two-column grid (each part its own cell)
function kv(...parts) {
  return h("div", {class: "kv"}, parts.map(p => p instanceof Node ? p : h("span", {}, p === null || p === undefined ? "–" : String(p))));
}

const banner = document.getElementById("banner");

async function api(path, options) {
  let response;
  try {
    response = await fetch(path, {credentials: "same-origin", ...(options || {})});
  } catch (e) {  // the server is gone: say so, keep what is on screen
    banner.textContent = "The rlf ui server cannot be reached: what you see may be stale. Start it again and reload.";
    banner.hidden = false;
    return {ok: false, status: 0, body: {error: "the server cannot be reached"}};
  }
  banner.hidden = true;
  if (response.status === 401) {
    banner.textContent = "Not signed in: open the URL that rlf ui printed (it carries the access token).";
    banner.hidden = false;
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = {error: `${response.status} ${response.statusText}`}; }
  if (!response.ok && !(body && (body.errors || body.error))) body = {error: `${response.status} ${response.statusText}`};
  return {ok: response.ok, status: response.status, body};
}

function post(path, data) {
  return api(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(data || {})});
}

const fmt = (v, digits = 3) => v === null || v === undefined ? "–" :
  typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(digits)) : String(v);
const when = t => t ? new Date(t * 1000).toLocaleString() : "–";
const enc = encodeURIComponent;
const runLink = name => `#/run/${enc(name)}`;
const stateBadge = (state, message) => h("span", {class: `state ${state}`, title: message || state}, state);

function errorList(errors) {
  const entries = Object.entries(errors || {});
  if (!entries.length) return "";
  return h("div", {class: "errors"}, entries.map(([part, message]) => h("div", {}, `${part}: ${message}`)));
}

// plotly renders names and titles as its own HTML subset (links included): give it text
const plain = text => String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

function plot(el, traces, layout) {
  traces = traces.map(t => ({...t, name: plain(t.name)}));
  if (layout.title && layout.title.text !== undefined) layout = {...layout, title: {...layout.title, text: plain(layout.title.text)}};
  const steps = traces.flatMap(t => t.x || []);
  const last = steps.length ? Math.max(...steps.slice(-5000)) : 1;
  if (!window.Plotly) { el.textContent = "plotly.js did not load"; return; }
  const {title, ...rest} = layout;
  const colour = getComputedStyle(document.documentElement).getPropertyValue("--fg").trim() || "#1d2329";
  Plotly.react(el, traces, {margin: {l: 45, r: 10, t: 32, b: 28}, font: {size: 11, color: colour},
                            paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
                            title: {...title, x: 0.01, xanchor: "left", font: {size: 13}},
                            legend: {orientation: "h", x: 0, y: -0.12, yanchor: "top"}, showlegend: traces.length > 1,
                            xaxis: {automargin: true, tick0: 0, dtick: Math.max(1, Math.ceil(last / 8))},
                            yaxis: {automargin: true}, hovermode: "x unified", ...rest},
               {displaylogo: false, responsive: true, displayModeBar: "hover"});
  // the plots' toolbars out of the Tab order: the filters come first for a keyboard
  for (const button of el.querySelectorAll(".modebar-btn, a")) button.setAttribute("tabindex", "-1");
}

// A run's warnings as events: the steps its trainer printed a loud warning for (warnings/*
// metrics) and the steps with reward errors.
const WARNINGS = {"warnings/no_tool_call": "no tool call although the env offers tools (check the parser and the prompt)",
                  "warnings/constant_rewards": "every group's rewards were constant: nothing to learn from the step"};
function runEvents(series) {
  const found = [];
  for (const [key, message] of Object.entries(WARNINGS)) {
    for (const [step, value] of series[key] || []) if (value) found.push({step, kind: key.split("/")[1], message});
  }
  for (const [step, value] of series["reward/errors"] || []) {
    if (value > 0) found.push({step, kind: "reward_errors", message: `${fmt(value)} reward error${value === 1 ? "" : "s"} (a reward raised: see the console)`});
  }
  return found.sort((a, b) => a.step - b.step);
}

// The plots' options, the same for every panel of a page: exponential smoothing, a log y axis,
// and the x axis by step or by wall time (minutes since the run's first record).
const plotOptions = {smoothing: 0, log: false, x: "step"};

function smoothed(values, weight) {  // an exponential moving average, as TensorBoard's slider
  if (!weight) return values;
  let last = null;
  return values.map(v => (v === null ? v : (last = last === null ? v : last * weight + v * (1 - weight))));
}

function shaped(trace, series) {  // a trace's x and y under plotOptions
  let x = trace.x;
  if (plotOptions.x === "time" && series.time) {
    const at = new Map(series.time.map(([step, t]) => [step, t]));
    const start = series.time.length ? series.time[0][1] : 0;
    x = trace.x.map(step => (at.has(step) ? (at.get(step) - start) / 60 : null));
  }
  return {...trace, x, y: trace.type === "bar" ? trace.y : smoothed(trace.y, plotOptions.smoothing)};
}

function plotControls(onChange) {
  const smooth = h("input", {type: "range", id: "smoothing", min: 0, max: 0.99, step: 0.01, value: plotOptions.smoothing,
                             oninput: e => { plotOptions.smoothing = Number(e.target.value); onChange(); }});
  const log = h("input", {type: "checkbox", id: "log-y", checked: plotOptions.log,
                          onchange: e => { plotOptions.log = e.target.checked; onChange(); }});
  const x = h("select", {id: "x-axis", onchange: e => { plotOptions.x = e.target.value; onChange(); }},
              h("option", {value: "step"}, "step"), h("option", {value: "time"}, "wall time (min)"));
  x.value = plotOptions.x;
  return h("div", {class: "toolbar plot-controls"}, h("label", {}, "smoothing", smooth), h("label", {}, log, "log y"),
           h("label", {}, "x", x));
}

function every(ms, fn) { clearInterval(timer); timer = setInterval(fn, ms); }

// ---------------------------------------------------------------- runs

async function showRuns(query = new URLSearchParams()) {
  document.title = "Runs · rlf ui";
  const table = h("tbody");
  const selected = new Set((query.get("compare") || "").split(",").filter(Boolean));
  const compareButton = h("button", {id: "compare", disabled: true, onclick: () => compare()}, "Compare selected");
  // any metric the selected runs logged, several at once (one chart each): ctrl/shift-click to pick more
  const metricSelect = h("select", {id: "compare-metric", multiple: true, size: 4},
    ["eval/reward/accuracy", "eval/reward/mean", "reward/mean", "reward/accuracy", "tools/calls_per_trajectory",
     "train/kl", "train/entropy", "time/step"].map(k => h("option", {value: k}, k)));
  const chart = h("div", {id: "compare-plot", hidden: true});
  const chosen = () => [...metricSelect.selectedOptions].map(o => o.value);
  const errors = h("div");
  // a run is shown when every word typed is in its name, env, model, state or tags
  const find = h("input", {type: "search", id: "run-search", placeholder: "find runs (name, env, model, tag)",
                           value: query.get("find") || "", oninput: () => { refresh(); remember(); }});
  put(main, h("h1", {}, "Runs"),
    h("div", {class: "toolbar"}, find, compareButton, metricSelect, h("a", {href: "#/new"}, "New run")),
    plotControls(() => { if (!chart.hidden) compare(); }), chart, errors,
    h("table", {id: "runs"}, h("thead", {}, h("tr", {}, ["", "run", "status", "env", "model", "step", "held-out",
                                                           "started", "tags", ""].map(c => h("th", {}, c)))), table));

  const wantedMetrics = (query.get("metric") || "").split(",").filter(Boolean);
  const remember = () => setQuery({find: find.value, compare: [...selected].join(","),
                                   metric: chart.hidden ? "" : chosen().join(",")});

  async function compare() {
    const series = {};
    for (const name of selected) series[name] = (await api(`/api/runs/${enc(name)}/metrics`)).body.series || {};
    // every metric any of them logged is offered; the chosen ones stay chosen
    const keys = [...new Set(Object.values(series).flatMap(s => Object.keys(s)))].filter(k => k !== "time").sort();
    const keep = new Set([...chosen(), ...wantedMetrics.splice(0)]);
    if (!keep.size) keep.add("eval/reward/accuracy");
    put(metricSelect, ...keys.map(k => h("option", {value: k, selected: keep.has(k)}, k)));
    chart.hidden = false;
    put(chart, ...chosen().map(key => {
      const el = h("div", {class: "plot", dataset: {metric: key}});
      const traces = Object.entries(series).map(([name, s]) => shaped(
        {x: (s[key] || []).map(p => p[0]), y: (s[key] || []).map(p => p[1]), name, mode: "lines+markers"}, s));
      requestAnimationFrame(() => plot(el, traces, {title: {text: key},
        yaxis: {automargin: true, type: plotOptions.log ? "log" : "linear"}}));
      return el;
    }));
    remember();
  }
  metricSelect.addEventListener("change", () => { if (!chart.hidden) compare(); });

  async function editTags(run) {
    const text = window.prompt(`Tags of ${run.name}, separated by commas`, (run.tags || []).join(", "));
    if (text === null) return;
    const tags = text.split(",").map(t => t.trim()).filter(Boolean);
    const r = await api(`/api/runs/${enc(run.name)}/tags`, {method: "PUT", headers: {"Content-Type": "application/json"},
                                                             body: JSON.stringify({tags})});
    put(errors, r.ok ? "" : h("div", {class: "error"}, r.body.error));
    refresh();
  }

  async function remove(run) {  // asked first; the server refuses a running run
    if (!window.confirm(`Delete the run ${run.name} and every file in its directory? This cannot be undone.`)) return;
    const r = await api(`/api/runs/${enc(run.name)}`, {method: "DELETE"});
    put(errors, r.ok ? "" : h("div", {class: "error"}, r.body.error));
    selected.delete(run.name);
    refresh();
  }

  async function refresh() {
    const {ok, body} = await api("/api/runs");
    if (!ok) { put(errors, h("div", {class: "error"}, body.error)); return; }
    document.getElementById("runs-dir").textContent = body.runs_dir;
    put(errors, );
    const words = find.value.toLowerCase().split(/\s+/).filter(Boolean);
    const shown = body.runs.filter(run => {
      const text = [run.name, run.env, run.model, run.state, ...(run.tags || [])].join(" ").toLowerCase();
      return words.every(w => text.includes(w));
    });
    put(table, ...shown.map(run => {
      const box = h("input", {type: "checkbox", "aria-label": `select ${run.name}`, checked: selected.has(run.name),
        onchange: e => { e.target.checked ? selected.add(run.name) : selected.delete(run.name);
                         compareButton.disabled = selected.size < 2; remember(); }});
      const held = run.held_out ? `${fmt(run.held_out.value)} (${run.held_out.key.split("/").pop()}, step ${run.held_out.step})` : "–";
      return h("tr", {class: "run", dataset: {run: run.name}},
        h("td", {}, box), h("td", {}, h("a", {href: runLink(run.name)}, run.name),
                            Object.keys(run.errors || {}).length ? h("div", {class: "error"}, Object.entries(run.errors).map(e => e.join(": ")).join("; ")) : null),
        h("td", {}, stateBadge(run.state, run.message)), h("td", {}, run.env || "–"),
        h("td", {class: "mono"}, run.model || "–"), h("td", {}, `${fmt(run.step)} / ${fmt(run.steps)}`),
        h("td", {}, held), h("td", {}, when(run.started_at)),
        h("td", {class: "tags"}, (run.tags || []).map(t => h("span", {class: "tag"}, t)),
          h("button", {type: "button", class: "edit-tags", title: "edit the tags", onclick: () => editTags(run)}, "✎")),
        h("td", {}, h("button", {type: "button", class: "delete", disabled: ["running", "starting", "stopping"].includes(run.state),
          title: "delete this run's directory", onclick: () => remove(run)}, "delete")));
    }));
    if (body.runs.length && !shown.length) put(table, h("tr", {}, h("td", {colspan: 10, class: "muted"}, "No run matches.")));
    if (!body.runs.length) put(table, h("tr", {}, h("td", {colspan: 10, class: "muted"},
      "No runs here yet: start one with `rlf train` or from New run.")));
  }
  await refresh();
  compareButton.disabled = selected.size < 2;
  if (selected.size >= 2 && wantedMetrics.length) await compare();  // a comparison's link
  every(3000, refresh);
}

// ---------------------------------------------------------------- a run

const PANELS = [
  {title: "Reward (training)", keys: ["reward/mean", "reward/accuracy"]},
  {title: "Held-out", keys: ["eval/reward/accuracy", "eval/reward/mean"]},
  {title: "Tool calls per trajectory", keys: ["tools/calls_per_trajectory", "eval/tools/calls_per_trajectory"]},
  {title: "Tool error rate", keys: ["tools/error_rate", "eval/tools/error_rate"]},
  {title: "Stop reasons (training)", prefix: "rollout/stop/", stack: true},
  // each class's share; the infrastructure's share and the policy-only accuracy are not classes
  {title: "Outcomes (training)", prefix: "outcome/", exclude: ["infrastructure", "accuracy_policy_only"], stack: true},
  {title: "Resampled attempts (training)", prefix: "outcome/resampled/", stack: true},
  {title: "KL", keys: ["train/kl"]},
  {title: "Entropy", keys: ["train/entropy"]},
  {title: "Clip fraction", keys: ["train/clip_fraction"]},
  {title: "Sampler vs trainer", keys: ["train/sampler_logprob_diff", "train/sampler_kl"]},
  {title: "Step time by phase (s)", keys: ["time/rollout", "time/reward", "time/train", "time/weight_sync",
                                           "time/eval", "time/checkpoint"], bars: true},
];

// An eval metric as one series in the order the model went: the base model (step 0), the
// model after the warm-up (cold_start/..., step 0 too), then each RL step; marked by phase.
function phases(series, key) {
  const points = series[key] || [];
  const marked = [...points.filter(p => p[0] === 0).map(p => [p, "base model", "circle-open"]),
                  ...(series[`cold_start/${key}`] || []).map(p => [p, "after the warm-up", "star"]),
                  ...points.filter(p => p[0] > 0).map(p => [p, `RL step ${p[0]}`, "circle"])];
  return {x: marked.map(m => m[0][0]), y: marked.map(m => m[0][1]), text: marked.map(m => m[1]),
          marker: {symbol: marked.map(m => m[2]), size: marked.map(m => m[2] === "star" ? 11 : 7)}};
}

async function showRun(name, query = new URLSearchParams()) {
  document.title = `${name} · rlf ui`;
  const head = h("div");
  const plots = h("div", {class: "plots", id: "plots"});
  const plotNote = h("div", {id: "plot-note"});
  const trajectories = h("div", {id: "trajectories"});
  const details = h("div");
  const downloads = h("div", {class: "toolbar"}, "download:",
    h("a", {id: "export-metrics", href: `/api/runs/${enc(name)}/export/metrics.csv`}, "metrics (CSV)"),
    h("a", {id: "export-config", href: `/api/runs/${enc(name)}/export/config.yaml`}, "config (YAML)"));
  const search = searchBox(name);
  const controls = plotControls(() => refreshPlots());
  const events = h("div", {id: "events"});
  put(main, head, events, controls, plotNote, plots, downloads, details, h("h2", {}, "Search"), search,
      h("h2", {}, "Trajectories"), trajectories);  // config above 200 rows
  const panels = new Map();
  let recorded = null;
  let actionError = "";  // a refused Stop or Resume: shown until the next click
  let pending = "";  // what a click sent, until the server's answer (a refresh already under way is older)

  async function act(path, sending) {  // the run's state (starting, stopping) comes back with the refresh
    actionError = "";
    pending = sending;
    document.getElementById("run-message").textContent = sending;
    const r = await post(path);
    if (!r.ok) actionError = r.body.error;
    pending = "";
    await refreshHead();
  }

  async function refreshHead() {
    const {ok, body} = await api(`/api/runs/${enc(name)}`);
    if (!ok) { put(head, h("h1", {}, name), h("div", {class: "error"}, body.error)); return null; }
    // the buttons and the message follow the run's real state (the server's): starting, running,
    // stopping, interrupted with a checkpoint, finished, failed; nothing local to go stale
    const stop = h("button", {id: "stop", disabled: !body.can_stop || !!pending, onclick: () => {
      stop.disabled = true; act(`/api/runs/${enc(name)}/stop`, "sending stop…"); }}, "Stop");
    const resume = h("button", {id: "resume", disabled: !body.can_resume || !!pending, onclick: () => {
      resume.disabled = true; act(`/api/runs/${enc(name)}/resume`, "resuming…"); }}, "Resume");
    const message = h("span", {id: "run-message", class: actionError ? "error" : "muted"},
      actionError || pending || (body.exiting && !["starting", "stopping"].includes(body.state)
        ? `${body.message ? body.message + "; " : ""}its process is still exiting` : body.message || ""));
    put(head, 
      h("h1", {}, body.name, " ", stateBadge(body.state, body.message)),
      h("div", {class: "toolbar"}, stop, resume, message),
      kv("env", body.env || "–", "model", h("span", {class: "mono"}, body.model || "–"),
        "step", `${fmt(body.step)} / ${fmt(body.steps)}`, "engine", body.engine || "–", "seed", fmt(body.seed),
        "held-out", body.held_out ? `${fmt(body.held_out.value)} at step ${body.held_out.step}` : "–",
        "started", when(body.started_at)),
      errorList(body.errors));
    if (!details.childElementCount) {
      details.append(h("h2", {}, "Config and plugins"),
        h("details", {}, h("summary", {}, "config.yaml"), h("pre", {id: "config"}, body.config_text || "(none)")),
        h("details", {}, h("summary", {}, "plugins and versions"),
          h("table", {}, Object.entries(body.plugins || {}).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v))))),
        h("details", {ontoggle: e => { if (e.target.open) refreshConsole(); }}, h("summary", {}, "console"),
          h("pre", {id: "console"})));
    }
    return body;
  }

  async function refreshPlots() {
    const {ok, body} = await api(`/api/runs/${enc(name)}/metrics`);
    if (!ok) { put(plotNote, h("div", {class: "error"}, body.error)); return; }
    const series = body.series;
    const found = runEvents(series);
    put(events, found.length ? h("details", {open: true}, h("summary", {}, `Warnings (${found.length})`),
      h("ul", {}, found.map(e => h("li", {class: "event", dataset: {step: e.step, kind: e.kind}},
                                   `step ${e.step}: ${e.message}`)))) : "");
    // the warnings' steps marked on the curves (dotted lines), the list above says what they were
    const marks = [...new Set(found.map(e => e.step))].map(step => ({type: "line", x0: step, x1: step, yref: "paper",
      y0: 0, y1: 1, line: {color: "#cf222e", width: 1, dash: "dot"}}));
    for (const panel of PANELS) {
      const child = k => k.slice(panel.prefix.length);  // a prefix panel: its direct keys, not deeper ones
      const keys = panel.prefix ? Object.keys(series).filter(k => k.startsWith(panel.prefix) && !child(k).includes("/")
                                                              && !(panel.exclude || []).includes(child(k))).sort()
                                : panel.keys.filter(k => series[k]);
      if (!keys.length) continue;
      let el = panels.get(panel.title);
      if (!el) { el = h("div", {class: "plot", dataset: {panel: panel.title}}); panels.set(panel.title, el); plots.append(el); }
      const traces = keys.map(k => {
        if (k.startsWith("eval/")) return {...phases(series, k), name: k, type: "scatter", mode: "lines+markers"};
        const points = series[k].filter(p => !panel.bars || p[0] > 0);
        return {x: points.map(p => p[0]), y: points.map(p => p[1]), name: panel.prefix ? k.slice(panel.prefix.length) : k,
                type: panel.bars ? "bar" : "scatter", mode: "lines+markers", stackgroup: panel.stack ? "one" : undefined};
      }).map(t => shaped(t, series));
      plot(el, traces, {title: {text: panel.title}, barmode: panel.bars ? "stack" : undefined,
                        yaxis: {automargin: true, type: plotOptions.log && !panel.stack ? "log" : "linear"},
                        xaxis: {automargin: true, title: {text: plotOptions.x === "time" ? "minutes" : ""}},
                        shapes: plotOptions.x === "step" && !panel.bars ? marks : [],
                        ...(panel.prefix ? {showlegend: true} : {})});  // one stop reason still named
    }
    // in PANELS order, whichever appeared first (a new run has its held-out eval before any step)
    const order = PANELS.map(p => panels.get(p.title)).filter(Boolean);
    if (order.some((el, i) => plots.children[i] !== el)) plots.append(...order);
    put(plotNote, panels.size ? "" : h("p", {class: "muted"}, "No metrics yet."), errorList(body.errors));
  }

  async function refreshConsole() {
    const pre = document.getElementById("console");
    if (!pre || !pre.parentElement.open) return;
    const {body} = await api(`/api/runs/${enc(name)}/console?lines=200`);
    // the tail is what matters: it opens at the bottom and stays there, unless the reader scrolled up
    const following = !pre.dataset.filled || pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 2;
    pre.textContent = Object.entries(body || {}).map(([f, t]) => `== ${f}\n${t}`).join("\n\n") || "(no output)";
    pre.dataset.filled = "1";
    if (following) pre.scrollTop = pre.scrollHeight;
  }

  async function refreshAll() {
    const run = await refreshHead();
    await refreshPlots();
    await refreshConsole();
    if (run && JSON.stringify(run.recorded) !== JSON.stringify(recorded)) {
      const first = recorded === null;
      recorded = run.recorded;
      if (first) showTrajectoryList(trajectories, name, recorded, query);
      else trajectories.dispatchEvent(new CustomEvent("recorded", {detail: recorded}));
    }
  }
  await refreshAll();
  every(3000, refreshAll);
}

// Full-text search over the run's trajectories (messages, tool arguments and results, answers):
// each hit says where, shows its text with the match marked, and opens the trajectory marked too.
function searchBox(name) {
  const input = h("input", {type: "search", id: "search", placeholder: "text in messages, tool calls, answers",
                            size: 40});
  const results = h("div", {id: "search-results"});
  async function run() {
    const q = input.value.trim();
    if (!q) { put(results, ); return; }
    put(results, h("p", {class: "muted"}, "searching…"));
    const {ok, body} = await api(`/api/runs/${enc(name)}/search?q=${enc(q)}`);
    if (!ok) { put(results, h("div", {class: "error"}, body.error)); return; }
    put(results, h("p", {class: "muted"}, `${body.total} match${body.total === 1 ? "" : "es"}` +
                     (body.truncated ? `, the first ${body.hits.length} shown` : "")), errorList(body.errors) || "",
      h("ol", {class: "hits"}, body.hits.map(hit => h("li", {class: "hit"},
        h("a", {href: `#/run/${enc(name)}/t/${enc(hit.kind)}/${hit.step}/${hit.index}?q=${enc(q)}`},
          `${hit.kind} step ${hit.step} · trajectory ${hit.index} · ${hit.sample_id} · ${hit.where}`),
        h("div", {class: "mono snippet"}, hit.before, h("mark", {}, hit.match), hit.after)))));
  }
  input.addEventListener("change", run);
  return h("div", {class: "toolbar"}, h("label", {}, "find", input), results);
}

// ``size`` characters of ``text``: its start, or around the first ``needle`` when that lies further in
function excerpt(text, needle, size) {
  const at = needle ? text.toLowerCase().indexOf(needle.toLowerCase()) : -1;
  if (at < size - needle.length) return text.slice(0, size);
  const start = Math.max(0, at - Math.floor(size / 2));
  return `…${text.slice(start, start + size)}${start + size < text.length ? "…" : ""}`;
}

// every occurrence of ``needle`` in the text under ``root`` marked (case-insensitive); the first one scrolled to
function highlight(root, needle) {
  if (!needle) return;
  const lower = needle.toLowerCase();
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const nodes = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.closest(".tokens") && node.nodeValue.toLowerCase().includes(lower)) nodes.push(node);
  }
  for (const node of nodes) {
    const text = node.nodeValue, parts = [];
    let at = 0;
    for (let i = text.toLowerCase().indexOf(lower); i >= 0; i = text.toLowerCase().indexOf(lower, at)) {
      parts.push(text.slice(at, i), h("mark", {class: "found"}, text.slice(i, i + needle.length)));
      at = i + needle.length;
    }
    parts.push(text.slice(at));
    node.replaceWith(...parts);
  }
  const first = root.querySelector("mark.found");
  if (first) first.scrollIntoView({block: "center"});
}

function showTrajectoryList(box, name, recorded, query = new URLSearchParams()) {
  const kinds = Object.keys(recorded);
  if (!kinds.length) { put(box, h("p", {class: "muted"}, "No trajectories recorded yet.")); return; }
  const kind = h("select", {id: "kind"}, kinds.map(k => h("option", {value: k}, k)));
  kind.value = kinds.includes(query.get("kind")) ? query.get("kind") : kinds.includes("eval") ? "eval" : kinds[0];
  const step = h("select", {id: "step"});
  const minReward = h("input", {type: "number", step: "any", id: "min-reward", placeholder: "min"});
  const maxReward = h("input", {type: "number", step: "any", id: "max-reward", placeholder: "max"});
  const stopReason = h("select", {id: "stop-reason"}, h("option", {value: ""}, "any"));
  const toolError = h("select", {id: "tool-error"}, h("option", {value: ""}, "any"));
  const outcome = h("select", {id: "outcome"}, h("option", {value: ""}, "any"));
  const sampleId = h("input", {type: "search", id: "sample-id", placeholder: "sample id"});
  const rows = h("tbody", {onkeydown: e => {  // j/k (or the arrows) move between rows, Enter opens one
    const row = e.target.closest("tr.trajectory-row");
    if (!row) return;
    const next = ["j", "ArrowDown"].includes(e.key) ? row.nextElementSibling
      : ["k", "ArrowUp"].includes(e.key) ? row.previousElementSibling : null;
    if (next) { next.focus(); e.preventDefault(); }
    if (e.key === "Enter") location.hash = row.dataset.href;
  }});
  // sortable columns: a click sorts by it, a second click the other way (the server sorts every page)
  let sortBy = query.get("sort") || "", order = query.get("order") === "desc" ? "desc" : "asc";
  const COLUMNS = [["step", "step"], ["#", "index"], ["sample", "sample_id"], ["group", "group"], ["reward", "reward"],
                   ["advantage", "advantage"], ["stop", "stop_reason"], ["outcome", "outcome"], ["turns", "num_turns"],
                   ["tool errors", null], ["final answer", null]];
  const header = h("tr");
  function drawHeader() {
    put(header, ...COLUMNS.map(([label, key]) => key === null ? h("th", {}, label) : h("th", {
      class: "sortable", tabindex: 0, dataset: {sort: key}, "aria-sort": sortBy === key ? (order === "asc" ? "ascending" : "descending") : "none",
      onclick: () => { order = sortBy === key && order === "asc" ? "desc" : "asc"; sortBy = key; offset = 0; drawHeader(); load(); },
      onkeydown: e => { if (e.key === "Enter") e.target.click(); }},
      label, sortBy === key ? (order === "asc" ? " ▲" : " ▼") : "")));
  }
  drawHeader();
  const PAGE = 200;
  let offset = Math.max(0, Number(query.get("offset")) || 0);
  minReward.value = query.get("min_reward") || "";
  maxReward.value = query.get("max_reward") || "";
  sampleId.value = query.get("sample_id") || "";
  // the filters the address names, applied once their choices (the step's facets) are there
  const wanted = {stop_reason: query.get("stop_reason") || "", tool_error: query.get("tool_error") || "",
                  outcome: query.get("outcome") || ""};
  if (query.get("step") === "all") step.dataset.chosen = "all";
  else if (query.get("step")) step.dataset.wanted = query.get("step");
  const previous = h("button", {type: "button", id: "previous-page", onclick: () => { offset = Math.max(0, offset - PAGE); load(); }}, "previous");
  const next = h("button", {type: "button", id: "next-page", onclick: () => { offset += PAGE; load(); }}, "next");
  const status = h("span", {class: "muted"});
  const exportLink = h("a", {id: "export-trajectories", href: "#"}, "export these (JSONL)");
  const errors = h("div");

  function fillSteps() {
    const steps = recorded[kind.value] || [];
    const current = step.value;
    put(step, h("option", {value: ""}, "all steps"), ...steps.map(s => h("option", {value: s}, `step ${s}`)));
    // every kind opens on its latest step ("all steps" only when chosen; Number("") is 0, a real eval step)
    const keep = current === "" ? step.dataset.chosen === "all" : steps.includes(Number(current));
    const asked = step.dataset.wanted;
    delete step.dataset.wanted;
    step.value = asked !== undefined && steps.includes(Number(asked)) ? asked : keep ? current : String(steps[steps.length - 1]);
  }

  function remember() {
    setQuery({kind: kind.value, step: step.value === "" ? "all" : step.value, min_reward: minReward.value,
              max_reward: maxReward.value, stop_reason: stopReason.value, tool_error: toolError.value,
              outcome: outcome.value, sample_id: sampleId.value, sort: sortBy, order: sortBy ? order : "",
              offset: offset || ""});
    // the export is the list as filtered now, every page of it
    const params = new URLSearchParams({kind: kind.value});
    for (const [key, value] of [["step", step.value], ["min_reward", minReward.value], ["max_reward", maxReward.value],
                                ["stop_reason", stopReason.value], ["tool_error", toolError.value],
                                ["outcome", outcome.value], ["sample_id", sampleId.value]]) if (value) params.set(key, value);
    exportLink.href = `/api/runs/${enc(name)}/export/trajectories.jsonl?${params}`;
  }

  async function load() {
    const params = new URLSearchParams({kind: kind.value, limit: String(PAGE), offset: String(offset)});
    if (step.value !== "") params.set("step", step.value);
    if (minReward.value !== "") params.set("min_reward", minReward.value);
    if (maxReward.value !== "") params.set("max_reward", maxReward.value);
    const chosen = {stop_reason: stopReason.value || wanted.stop_reason, tool_error: toolError.value || wanted.tool_error,
                    outcome: outcome.value || wanted.outcome};
    for (const [key, value] of Object.entries(chosen)) if (value) params.set(key, value);
    if (sampleId.value) params.set("sample_id", sampleId.value);
    if (sortBy) { params.set("sort", sortBy); params.set("order", order); }
    const {ok, body} = await api(`/api/runs/${enc(name)}/trajectories?${params}`);
    if (!ok) { put(errors, h("div", {class: "error"}, body.error)); put(rows, ); return; }
    put(errors, errorList(body.errors) || "");
    for (const [select, values, key] of [[stopReason, body.facets.stop_reasons, "stop_reason"],
                                         [toolError, body.facets.tool_errors, "tool_error"],
                                         [outcome, body.facets.outcomes, "outcome"]]) {
      const current = select.value || wanted[key];
      wanted[key] = "";
      // a filter the step's facets do not list (an outcome side: policy) is kept, as chosen
      const offered = current && !values.includes(current) ? [...values, current] : values;
      put(select, h("option", {value: ""}, "any"), ...offered.map(v => h("option", {value: v}, v)));
      select.value = current || "";
    }
    remember();
    status.textContent = `${body.total} trajectories` +
      (body.total > body.rows.length ? `, ${offset + 1}–${offset + body.rows.length} shown` : "");
    previous.disabled = offset === 0;
    next.disabled = offset + body.rows.length >= body.total;
    // rows are links: a click opens the trajectory, a middle click or a copied link a new tab
    put(rows, ...body.rows.map(r => { const href = `#/run/${enc(name)}/t/${enc(r.kind)}/${r.step}/${r.index}`;
      return h("tr", {class: "clickable trajectory-row", tabindex: 0, dataset: {index: r.index, step: r.step, href},
        onclick: e => { if (!e.target.closest("a")) location.hash = href; }},
      h("td", {}, h("a", {href}, String(r.step))), h("td", {}, r.index), h("td", {class: "mono"}, r.sample_id),
      h("td", {}, r.group >= 0 ? r.group : "–"), h("td", {}, fmt(r.reward)), h("td", {}, fmt(r.advantage)),
      h("td", {}, r.stop_reason || "–"), h("td", {class: r.outcome_side === "infrastructure" ? "outcome-infrastructure" : ""},
        (r.outcome || "–") + (r.replaced ? " · replaced" : r.attempt ? ` · attempt ${r.attempt}` : "")),
      h("td", {}, fmt(r.num_turns)), h("td", {}, (r.tool_error_kinds || []).join(", ") || "–"),
      h("td", {class: "mono"}, String(r.final_answer ?? "").slice(0, 80))); }));
    restoreScroll();
  }

  for (const el of [kind, step, stopReason, toolError, outcome]) el.addEventListener("change", () => { if (el === kind) fillSteps(); offset = 0; load(); });
  for (const el of [minReward, maxReward, sampleId]) el.addEventListener("change", () => { offset = 0; load(); });
  step.addEventListener("change", () => { step.dataset.chosen = step.value === "" ? "all" : ""; });
  box.addEventListener("recorded", e => { recorded = e.detail; fillSteps(); if (step.value === "") load(); });
  put(box, 
    h("div", {class: "toolbar"}, h("label", {}, "kind", kind), h("label", {}, "step", step),
      h("label", {}, "reward", minReward, "–", maxReward), h("label", {}, "stop", stopReason),
      h("label", {}, "tool error", toolError), h("label", {}, "outcome", outcome), sampleId),
    h("div", {class: "toolbar"}, status, previous, next, exportLink), errors,
    h("table", {id: "trajectory-table"}, h("thead", {}, header), rows));
  fillSteps();
  load();
}

// ---------------------------------------------------------------- a trajectory

const MASK_COLOURS = {1: "rgb(170, 222, 170)", 0: "rgb(236, 236, 236)"};
const NONE = "rgb(248, 248, 248)";

function diverging(value, scale) {  // blue above 0, red below, white at 0
  if (value === null || value === undefined) return NONE;
  const t = Math.max(-1, Math.min(1, value / (scale || 1)));
  const fade = c => Math.round(255 - (255 - c) * Math.abs(t));
  return t >= 0 ? `rgb(${fade(70)}, ${fade(130)}, ${fade(230)})` : `rgb(${fade(220)}, ${fade(60)}, ${fade(60)})`;
}

const DRIFT_SCALE = 0.1;  // nats of trainer − sampler logprob drawn in full colour

const COLOUR_MODES = {
  mask: {label: "loss mask", colour: (s, i) => MASK_COLOURS[s.loss_mask[i] ? 1 : 0],
         legend: [[MASK_COLOURS[1], "trained (loss mask 1)"], [MASK_COLOURS[0], "not trained (prompt, tool results)"]]},
  advantage: {label: "advantage", colour: (s, i, scale) => diverging(s.advantage[i], scale.advantage),
              legend: [[diverging(1, 1), "positive"], [diverging(-1, 1), "negative"], [NONE, "none"]]},
  // a fixed scale, not the sequence's largest: a 4e-5-nat drift is no drift, whatever else is in the sequence
  drift: {label: "logprob drift (trainer − sampler)",
          colour: (s, i) => s.trainer_logprob[i] === null || s.sampler_logprob[i] === null ? NONE
            : diverging(s.trainer_logprob[i] - s.sampler_logprob[i], DRIFT_SCALE),
          legend: [[diverging(1, 1), `trainer higher (full at +${DRIFT_SCALE} nat)`],
                   [diverging(-1, 1), `sampler higher (full at −${DRIFT_SCALE} nat)`], [NONE, "not scored"]]},
  logprob: {label: "sampler probability", colour: (s, i) => s.sampler_logprob[i] === null ? NONE
              : diverging(-(1 - Math.exp(s.sampler_logprob[i])), 1),
            legend: [["rgb(255, 255, 255)", "p = 1"], [diverging(-1, 1), "p → 0"], [NONE, "not sampled"]]},
};
// a token's policy version against the newest in its sequence: how stale it was when trained
const VERSION_COLOURS = ["rgb(190, 215, 245)", "rgb(250, 215, 160)", "rgb(240, 165, 120)", "rgb(215, 120, 120)"];
COLOUR_MODES.version = {label: "policy version (staleness)",
  colour: (s, i, scale) => s.policy_version[i] === null || s.policy_version[i] === undefined || s.policy_version[i] < 0
    ? NONE : VERSION_COLOURS[Math.min(scale.newest - s.policy_version[i], VERSION_COLOURS.length - 1)],
  legend: [[VERSION_COLOURS[0], "the sequence's newest version"], [VERSION_COLOURS[1], "1 version older"],
           [VERSION_COLOURS[2], "2 older"], [VERSION_COLOURS[3], "3 or more older"], [NONE, "not sampled"]]};
const SEGMENTS = ["prompt", "model", "observation"];

// a number for a tooltip: 4 decimals, or scientific notation where those would show nothing (4.00e-5)
function sci(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value !== 0 && Math.abs(value) < 5e-4) return value.toExponential(2);
  return value.toFixed(4);
}

// A long trajectory (a 128k-context agent's, a million tokens) is drawn in chunks of about CHUNK
// tokens, each when it comes near the view; the rest wait as placeholders of about their height.
// A chunk ends after a newline where one comes within CHUNK more tokens, so the text breaks where
// it breaks; a chunk cut elsewhere starts on a new line, marked (.cont).
const CHUNK = 1000;
const LINE_EM = 1.7;  // .tokens line-height

function tokenChunks(pieces, n) {
  const chunks = [];
  for (let start = 0; start < n;) {
    let end = Math.min(n, start + CHUNK), cut = true;
    for (let i = end; i < Math.min(n, start + 2 * CHUNK) && end < n; i++) {
      if (String(pieces[i - 1] ?? "").includes("\n")) { end = i; cut = false; break; }
    }
    if (end >= n) cut = false;
    chunks.push({start, end, cut});
    start = end;
  }
  return chunks;
}

function setColourMode(box, mode) {  // recolours the drawn tokens; the others are drawn in it
  box.colourMode = mode;
  const {sequence, scale} = box;
  for (const el of box.querySelectorAll(".tok")) {
    el.style.background = COLOUR_MODES[mode].colour(sequence, Number(el.dataset.i), scale);
  }
}

function tokenView(sequence, mode) {
  for (const key of ["token_ids", "pieces", "segment", "turn", "loss_mask", "sampler_logprob", "trainer_logprob",
                     "advantage", "policy_version"]) sequence[key] = sequence[key] || [];
  const n = sequence.token_ids.length;
  const maxAbs = values => {  // a loop: a 128k-token sequence is too many arguments for Math.max
    let most = 1e-6;
    for (const v of values) if (v !== null && v !== undefined && Math.abs(v) > most) most = Math.abs(v);
    return most;
  };
  let newest = -1;
  for (const v of sequence.policy_version) if (v !== null && v > newest) newest = v;
  const box = h("div", {class: "tokens", id: "tokens"});
  Object.assign(box, {sequence, scale: {advantage: maxAbs(sequence.advantage), newest}, colourMode: mode});
  const chunks = tokenChunks(sequence.pieces, n);
  let perLine = 120;  // characters a line holds, measured once the view is on the page
  const estimate = c => {
    let lines = 1, run = 0;
    for (let i = c.start; i < c.end; i++) {
      const piece = String(sequence.pieces[i] ?? "");
      const breaks = piece.split("\n");
      run += breaks[0].length;
      for (let b = 1; b < breaks.length; b++) { lines += 1 + Math.floor(run / perLine); run = breaks[b].length; }
    }
    return lines + Math.floor(run / perLine);
  };
  function draw(el, c) {
    const spans = [];
    for (let i = c.start; i < c.end; i++) {
      const piece = String(sequence.pieces[i] ?? "");
      // a visible mark for tokens that show nothing: a newline, an empty piece, tabs and the like
      const marks = piece.includes("\n") ? " nl" : piece === "" ? " empty" : piece.trim() === "" && !piece.includes(" ") ? " ws" : "";
      spans.push(h("span", {class: `tok seg-${sequence.segment[i]}${marks}`, dataset: {i, mask: sequence.loss_mask[i]},
                            style: {background: COLOUR_MODES[box.colourMode].colour(sequence, i, box.scale)}}, piece));
    }
    el.replaceChildren(...spans);  // at most 2 * CHUNK arguments
    el.style.minHeight = "";
    el.dataset.drawn = "1";
  }
  const firstModel = sequence.segment.indexOf(1);
  const opening = chunks.findIndex(c => firstModel >= c.start && firstModel < c.end);
  const observer = new IntersectionObserver(entries => {
    for (const e of entries) {
      if (!e.isIntersecting) continue;
      observer.unobserve(e.target);
      if (!e.target.dataset.drawn) draw(e.target, chunks[Number(e.target.dataset.chunk)]);
    }
  }, {root: box, rootMargin: "3000px 0px"});
  chunks.forEach((c, k) => {
    const el = h("div", {class: `chunk${k > 0 && chunks[k - 1].cut ? " cont" : ""}`, dataset: {chunk: k}});
    // the opening (the first chunks, and the model's first turn) drawn at once; the rest when near
    if (k <= 1 || Math.abs(k - opening) <= 1) draw(el, c);
    else { el.style.minHeight = `${estimate(c) * LINE_EM}em`; observer.observe(el); }
    box.appendChild(el);
  });
  // opened at the model's first token, not at the top of a long (few-shot) prompt
  requestAnimationFrame(() => {
    const probe = h("span", {class: "tok"}, "0".repeat(100));
    box.appendChild(probe);
    const width = probe.getBoundingClientRect().width / 100;
    probe.remove();
    if (width > 0 && box.clientWidth > 0) {
      perLine = Math.max(20, Math.floor(box.clientWidth / width));
      box.querySelectorAll(".chunk:not([data-drawn])").forEach(el => {
        el.style.minHeight = `${estimate(chunks[Number(el.dataset.chunk)]) * LINE_EM}em`;
      });
    }
    const first = box.querySelector(".tok.seg-1");
    if (first) box.scrollTop = Math.max(0, first.offsetTop - 40);  // .tokens is position: relative
  });
  box.addEventListener("mouseover", e => {
    const el = e.target.closest(".tok");
    if (!el) return;
    const i = Number(el.dataset.i), s = sequence;
    const drift = s.trainer_logprob[i] === null || s.sampler_logprob[i] === null ? null : s.trainer_logprob[i] - s.sampler_logprob[i];
    tooltip.textContent = [`token ${i}  id ${s.token_ids[i]}  ${JSON.stringify(s.pieces[i])}`,
      `${SEGMENTS[s.segment[i]]}, turn ${s.turn[i]}, loss mask ${s.loss_mask[i]}`,
      `sampler logprob ${sci(s.sampler_logprob[i])}  trainer logprob ${sci(s.trainer_logprob[i])}  drift ${sci(drift)}`,
      `advantage ${sci(s.advantage[i])}  policy version ${s.policy_version[i]}`].join("\n");
    tooltip.hidden = false;
    const r = el.getBoundingClientRect();
    tooltip.style.left = `${Math.min(r.left, window.innerWidth - 460)}px`;
    const below = r.bottom + 6 + tooltip.offsetHeight < window.innerHeight;
    tooltip.style.top = `${below ? r.bottom + 6 : Math.max(0, r.top - 6 - tooltip.offsetHeight)}px`;
  });
  box.addEventListener("mouseout", e => { if (e.target.closest(".tok")) tooltip.hidden = true; });
  return box;
}

// text over LONG_TEXT characters shown cut, with a button for the rest (a 5 MB tool result)
const LONG_TEXT = 20000;
let longTextWanted = "";  // a searched text: a long text holding it past the cut is shown whole
function longText(text, cls = "body") {
  if (text.length <= LONG_TEXT) return h("div", {class: cls}, text);
  if (longTextWanted && text.slice(LONG_TEXT).toLowerCase().includes(longTextWanted.toLowerCase())) {
    const whole = h("div", {class: cls});
    for (let at = 0; at < text.length; at += LONG_TEXT) whole.append(text.slice(at, at + LONG_TEXT));
    return whole;
  }
  const box = h("div", {class: cls}, text.slice(0, LONG_TEXT));
  // in pieces: Chrome lays out one text node of millions of characters as one unbreakable line
  // (blank, and the page millions of pixels wide), wrapping or not
  const more = h("button", {type: "button", onclick: () => {
    const pieces = [];
    for (let at = 0; at < text.length;) {
      let end = Math.min(text.length, at + LONG_TEXT);
      if (end < text.length && /[\uDC00-\uDFFF]/.test(text[end])) end += 1;  // never half a surrogate pair
      pieces.push(text.slice(at, end));
      at = end;
    }
    box.replaceChildren(...pieces);
    more.remove();
  }},
                 `show all ${text.length.toLocaleString()} characters`);
  return h("div", {}, box, more);
}

function conversation(record) {
  // each model turn with the tool calls parsed from it (their results and errors follow as
  // the next messages, as the model saw them)
  const calls = (record.tool_calls || []).filter(Boolean);
  let assistantTurn = -1;
  return h("div", {class: "conversation", id: "conversation"}, (record.messages || []).filter(Boolean).map(m => {
    // the record's turn (-1: the prompt's messages, few-shot examples included); counted for old records
    const counted = m.role === "assistant" ? ++assistantTurn : null;
    const turn = m.turn === undefined || m.turn === null ? counted : (m.role === "assistant" && m.turn >= 0 ? m.turn : null);
    const made = turn === null ? [] : calls.filter(c => c.turn === turn);
    return h("div", {class: `msg ${m.role}`, dataset: turn === null ? {} : {turn}},
      h("div", {class: "role"}, m.role, m.name ? ` · ${m.name}` : "", turn === null ? "" : ` · turn ${turn}`,
        m.turn === -1 ? " · prompt" : ""),
      m.content ? longText(String(m.content)) : null,
      made.map(c => h("div", {class: `call${c.error ? " failed" : ""}`},
        h("div", {class: "mono"}, `→ ${c.name}(${c.arguments})`),
        h("div", {class: c.error ? "error" : "muted"}, c.error ? `error: ${c.error}` : "ok",
          c.latency_s !== null && c.latency_s !== undefined ? ` · ${fmt(c.latency_s)} s` : ""))));
  }));
}

async function showTrajectory(name, kind, step, index, find = "") {
  document.title = `${name} ${kind} ${step}/${index} · rlf ui`;
  put(main, h("p", {class: "muted"}, "loading…"));  // never the previous trajectory under this URL
  const {ok, body} = await api(`/api/runs/${enc(name)}/trajectories/${enc(kind)}/${step}/${index}`);
  const back = h("a", {href: runLink(name)}, `← ${name}`);
  if (!ok) { put(main, back, h("div", {class: "error"}, body.error)); return; }
  const r = body;
  longTextWanted = find;  // the conversation below shows a long text whole when it holds the searched one
  let meta = {};
  try { meta = JSON.parse(r.metadata || "{}") || {}; } catch (e) { meta = {}; }
  const facts = kv("sample", h("span", {class: "mono"}, r.sample_id), "reward", fmt(r.reward),
    "rewards", Object.entries(r.rewards || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") || "–",
    "advantage", fmt(r.advantage), "correct", fmt(r.correct), "stop reason", r.stop_reason || "–",
    "outcome", r.outcome ? `${r.outcome}${r.outcome_side ? ` (${r.outcome_side})` : ""}` : "–",
    "attempt", r.replaced ? `${r.attempt}, replaced by a resample (not trained)` : fmt(r.attempt || 0), "turns", fmt(r.num_turns), "turn rewards", (r.turn_rewards || []).map(v => fmt(v)).join(", ") || "–",
    "final answer", h("span", {class: "mono"}, String(r.final_answer ?? "–").slice(0, LONG_TEXT)),
    "expected", h("span", {class: "mono"}, String(r.expected ?? "–").slice(0, LONG_TEXT)),
    "policy version", fmt(r.policy_version),
    "time", `generation ${fmt(meta.generation_s)} s, tools ${fmt(meta.tool_s)} s`,
    "parse errors", fmt(meta.parse_errors), "cut-off turns", fmt(meta.cut_turns));
  const same = h("a", {id: "same-sample", href: `#/run/${enc(name)}/same/${enc(kind)}/${enc(r.sample_id)}`},
                 "this sample at every recorded step");
  const parts = [back, h("h1", {}, `${kind} step ${step} · trajectory ${index}`), facts, h("p", {}, same),
                 r.error ? h("div", {class: "error"}, r.error) : null,
                 (r.reward_errors || []).length ? h("div", {class: "error"}, r.reward_errors.join("; ")) : null];
  if (r.text_only) {
    parts.push(h("p", {class: "muted"}, "Recorded before token-level records: text only."),
               h("pre", {id: "text"}, typeof r.text === "string" ? r.text : JSON.stringify(r.text ?? "")));
    if ((r.tool_calls || []).length) parts.push(h("h2", {}, "Tool calls"), h("pre", {}, r.tool_calls.map(c => `${c.name}(${c.arguments})`).join("\n")));
    put(main, ...parts);
    return;
  }
  const tokensBox = h("div");
  const legend = h("div", {class: "legend", id: "legend"});
  let mode = "mask";
  const modeSelect = h("select", {id: "colour-mode", onchange: e => { mode = e.target.value; drawTokens(); }},
    Object.entries(COLOUR_MODES).map(([k, m]) => h("option", {value: k}, m.label)));
  const sequences = (r.sequences || []).filter(Boolean);
  const views = sequences.map(s => tokenView(s, mode));
  function drawTokens() {  // a colour change recolours the drawn tokens, it does not draw them again
    put(legend, ...COLOUR_MODES[mode].legend.map(([c, text]) => h("span", {}, h("span", {class: "swatch", style: {background: c}}), " ", text)));
    views.forEach(view => setColourMode(view, mode));
  }
  put(tokensBox, ...sequences.map((s, k) => h("div", {},
    sequences.length > 1 ? h("h3", {}, `sequence ${k + 1} of ${sequences.length}`) : null, views[k])));
  drawTokens();
  const callRows = (r.tool_calls || []).map(c => h("tr", {}, h("td", {}, fmt(c.turn)), h("td", {class: "mono nowrap"}, c.name),
    h("td", {class: "mono"}, c.arguments), h("td", {class: c.error ? "error" : ""}, c.error || "ok"),
    h("td", {}, fmt(c.latency_s)), h("td", {class: "mono"}, excerpt(c.result || "", find, 400))));
  parts.push(h("h2", {}, "Conversation"), conversation(r),
    callRows.length ? h("details", {open: true}, h("summary", {}, `Tool calls (${callRows.length})`),
      h("table", {}, h("thead", {}, h("tr", {}, ["turn", "tool", "arguments", "error", "latency (s)", "result"].map(c => h("th", {}, c)))),
        h("tbody", {}, callRows))) : null,
    h("h2", {}, "Tokens"), h("div", {class: "toolbar"}, h("label", {}, "colour", modeSelect), legend), tokensBox);
  put(main, ...parts);
  longTextWanted = "";
  highlight(main, find);
}

async function showSameSample(name, kind, sampleId) {
  const {ok, body} = await api(`/api/runs/${enc(name)}/same-sample?kind=${enc(kind)}&sample_id=${enc(sampleId)}`);
  const back = h("a", {href: runLink(name)}, `← ${name}`);
  if (!ok) { put(main, back, h("div", {class: "error"}, body.error)); return; }
  // the prompt every column shares (system, few-shot examples, the question) once, folded: the
  // model's own turns are what differs, and they start at the top of each column
  const shared = body.shared ? h("details", {id: "shared-prompt"},
    h("summary", {}, `the prompt every column shares (${body.shared} message${body.shared > 1 ? "s" : ""})`),
    conversation({messages: body.shared_messages, tool_calls: []})) : null;
  put(main, back, h("h1", {}, body.title), errorList(body.errors) || "", shared,
    h("div", {class: "side-by-side", id: "same-sample-columns"}, body.trajectories.map(r => h("div", {},
      h("h3", {}, h("a", {href: `#/run/${enc(name)}/t/${enc(r.kind)}/${r.step}/${r.index}`}, r.phase),
        ` · reward ${fmt(r.reward)}`),
      kv("final answer", h("span", {class: "mono"}, r.final_answer || "–"), "stop", r.stop_reason || "–",
        "turns", fmt(r.num_turns)),
      r.text_only ? h("pre", {}, r.text || "") : conversation(r)))));
}

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

// rlf ui: a run's page (state and controls, plots, events, downloads, search, the trajectory list).
"use strict";

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
    // within the outcome the list is filtered by (a class or a side), as the list shows it
    const outcome = (document.getElementById("outcome") || {}).value || "";
    const {ok, body} = await api(`/api/runs/${enc(name)}/search?q=${enc(q)}` + (outcome ? `&outcome=${enc(outcome)}` : ""));
    if (!ok) { put(results, h("div", {class: "error"}, body.error)); return; }
    put(results, h("p", {class: "muted"}, `${body.total} match${body.total === 1 ? "" : "es"}` +
                     (outcome ? ` in outcome ${outcome}` : "") +
                     (body.truncated ? `, the first ${body.hits.length} shown` : "")), errorList(body.errors) || "",
      h("ol", {class: "hits"}, body.hits.map(hit => h("li", {class: "hit"},
        h("a", {href: `#/run/${enc(name)}/t/${enc(hit.kind)}/${hit.step}/${hit.index}?q=${enc(q)}`},
          `${hit.kind} step ${hit.step} · trajectory ${hit.index} · ${hit.sample_id} · ${hit.where}` +
          (hit.policy_version >= 0 ? ` · version ${hit.policy_version}` : "") +
          (hit.outcome ? ` · ${hit.outcome}` : "") +
          (hit.num_sequences ? ` · sequence ${hit.sequence} of ${hit.num_sequences}` : "")),
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
  const version = h("select", {id: "policy-version"}, h("option", {value: ""}, "any"));
  const sequenceCount = h("select", {id: "sequence-count"}, h("option", {value: ""}, "any"));
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
                  outcome: query.get("outcome") || "", policy_version: query.get("policy_version") || "",
                  sequences: query.get("sequences") || ""};
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
              outcome: outcome.value, policy_version: version.value, sequences: sequenceCount.value,
              sample_id: sampleId.value, sort: sortBy,
              order: sortBy ? order : "",
              offset: offset || ""});
    // the export is the list as filtered now, every page of it
    const params = new URLSearchParams({kind: kind.value});
    for (const [key, value] of [["step", step.value], ["min_reward", minReward.value], ["max_reward", maxReward.value],
                                ["stop_reason", stopReason.value], ["tool_error", toolError.value],
                                ["outcome", outcome.value], ["policy_version", version.value],
                                ["sequences", sequenceCount.value], ["sample_id", sampleId.value]]) if (value) params.set(key, value);
    exportLink.href = `/api/runs/${enc(name)}/export/trajectories.jsonl?${params}`;
  }

  async function load() {
    const params = new URLSearchParams({kind: kind.value, limit: String(PAGE), offset: String(offset)});
    if (step.value !== "") params.set("step", step.value);
    if (minReward.value !== "") params.set("min_reward", minReward.value);
    if (maxReward.value !== "") params.set("max_reward", maxReward.value);
    const chosen = {stop_reason: stopReason.value || wanted.stop_reason, tool_error: toolError.value || wanted.tool_error,
                    outcome: outcome.value || wanted.outcome, policy_version: version.value || wanted.policy_version,
                    sequences: sequenceCount.value || wanted.sequences};
    for (const [key, value] of Object.entries(chosen)) if (value) params.set(key, value);
    if (sampleId.value) params.set("sample_id", sampleId.value);
    if (sortBy) { params.set("sort", sortBy); params.set("order", order); }
    const {ok, body} = await api(`/api/runs/${enc(name)}/trajectories?${params}`);
    if (!ok) { put(errors, h("div", {class: "error"}, body.error)); put(rows, ); return; }
    put(errors, errorList(body.errors) || "");
    for (const [select, values, key] of [[stopReason, body.facets.stop_reasons, "stop_reason"],
                                         [toolError, body.facets.tool_errors, "tool_error"],
                                         [outcome, body.facets.outcomes, "outcome"],
                                         [version, (body.facets.policy_versions || []).map(String), "policy_version"],
                                         [sequenceCount, (body.facets.sequence_counts || []).map(String), "sequences"]]) {
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
      h("td", {}, fmt(r.num_turns) + (r.num_sequences > 1 ? ` · ${r.num_sequences} sequences` : "")),
      h("td", {}, (r.tool_error_kinds || []).join(", ") || "–"),
      h("td", {class: "mono"}, String(r.final_answer ?? "").slice(0, 80))); }));
    restoreScroll();
  }

  for (const el of [kind, step, stopReason, toolError, outcome, version, sequenceCount]) el.addEventListener("change", () => { if (el === kind) fillSteps(); offset = 0; load(); });
  for (const el of [minReward, maxReward, sampleId]) el.addEventListener("change", () => { offset = 0; load(); });
  step.addEventListener("change", () => { step.dataset.chosen = step.value === "" ? "all" : ""; });
  box.addEventListener("recorded", e => { recorded = e.detail; fillSteps(); if (step.value === "") load(); });
  put(box, 
    h("div", {class: "toolbar"}, h("label", {}, "kind", kind), h("label", {}, "step", step),
      h("label", {}, "reward", minReward, "–", maxReward), h("label", {}, "stop", stopReason),
      h("label", {}, "tool error", toolError), h("label", {}, "outcome", outcome),
      h("label", {title: "the policy version (weights) that sampled it"}, "version", version),
      h("label", {title: "how many token sequences (several where the model family rewrote earlier turns)"},
        "sequences", sequenceCount), sampleId),
    h("div", {class: "toolbar"}, status, previous, next, exportLink), errors,
    h("table", {id: "trajectory-table"}, h("thead", {}, header), rows));
  fillSteps();
  load();
}

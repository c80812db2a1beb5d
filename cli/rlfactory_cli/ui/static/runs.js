// rlf ui: the runs list (search, tags, delete, comparisons).
"use strict";

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

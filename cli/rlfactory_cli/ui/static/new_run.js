// The New run page: a form generated from the run config's schema (GET /api/new-run/form), so a
// setting added to the config appears here without UI work. Only the settings the user changed
// are posted (on top of the env's defaults, like a --config file), validated by the same code as
// `rlf train`; every error is shown beside its field, all at once.
"use strict";

window.rlfNewRun = function (main, initial, {h, api, post, put}) {
  const changed = {};          // dotted key -> the value to post
  let rewards = null;          // the rewards list shown
  let rewardsEdited = false;   // posted only once the user changed it (else the env's defaults hold)
  let form = initial;

  const result = h("div", {id: "new-run-result"});
  const topErrors = h("div", {class: "errors", id: "form-errors"});
  const body = h("div");
  const mcpText = h("textarea", {id: "mcp-json", rows: 6, cols: 80,
    placeholder: '{"mcpServers": {"time": {"command": "python", "args": ["-m", "mcp_server_time"]}}}'});
  const mcpOut = h("div", {id: "mcp-tools"});
  const yamlOut = h("pre", {id: "yaml", hidden: true});

  function values() {
    const out = {...changed};
    if (rewards && rewardsEdited) out.rewards = rewards;
    if (mcpText.value.trim()) {
      out.mcpServers_json = mcpText.value;
      // the tool pool: the listed tools left ticked (all of them: no restriction)
      const boxes = [...mcpOut.querySelectorAll("input[data-tool]")];
      if (boxes.some(b => !b.checked)) out["env_options.tools"] = boxes.filter(b => b.checked).map(b => b.dataset.tool);
    }
    return out;
  }

  function fieldInput(field) {
    const key = field.key;
    const current = key in changed ? changed[key] : field.default;
    const mark = value => { changed[key] = value; };
    const attrs = {"data-key": key, id: `field-${key}`, name: key};
    const componentNames = field.component && form.choices[field.component]
      ? (field.component === "models" ? [] : form.choices[field.component].map(c => c.name)) : null;
    if (key === "env") {
      return h("select", {...attrs, onchange: e => { mark(e.target.value); reload(); }},
        componentNames.map(n => h("option", {value: n, selected: n === current}, n)));
    }
    if (field.component === "models") {
      const list = h("datalist", {id: "models-list"},
        [...new Set([...form.choices.models.embedded, ...form.choices.models.available.map(m => m.name)])]
          .map(n => h("option", {value: n})));
      return h("span", {}, h("input", {...attrs, list: "models-list", size: 40, value: current ?? "",
        onchange: e => mark(e.target.value)}), list);
    }
    if (componentNames || field.type === "enum") {
      const options = componentNames || field.choices;
      return h("select", {...attrs, onchange: e => { mark(e.target.value); if (key === "preset") reload(); }},
        field.nullable || field.default === null ? h("option", {value: ""}, "(none)") : null,
        options.map(n => h("option", {value: n, selected: n === current}, n)));
    }
    if (field.type === "bool") {
      return h("input", {...attrs, type: "checkbox", checked: Boolean(current), onchange: e => mark(e.target.checked)});
    }
    if (field.type === "int" || field.type === "float") {
      return h("input", {...attrs, type: "text", inputmode: "decimal", size: 12, value: current ?? "",
        onchange: e => mark(e.target.value)});
    }
    if (field.type === "str") {
      return h("input", {...attrs, type: "text", size: 40, value: current ?? "", onchange: e => mark(e.target.value)});
    }
    // lists, dicts, unions: JSON text (YAML is accepted too: the server reads it like an override)
    return h("textarea", {...attrs, rows: 2, cols: 50, onchange: e => mark(e.target.value)},
      current === null || current === undefined ? "" : JSON.stringify(current));
  }

  function rewardsEditor(field) {
    rewards = rewards || (changed.rewards ?? field.default ?? []).map(r => ({...r}));
    const names = form.choices.rewards.map(r => r.name);
    const rows = h("tbody");
    const draw = () => put(rows, ...rewards.map((r, i) => h("tr", {},
      h("td", {}, h("select", {"data-key": `rewards[${i}].name`, onchange: e => { r.name = e.target.value; rewardsEdited = true; }},
        names.map(n => h("option", {value: n, selected: n === r.name}, n)))),
      h("td", {}, h("input", {"data-key": `rewards[${i}].weight`, type: "text", size: 6, value: r.weight ?? 1,
        onchange: e => { r.weight = e.target.value; rewardsEdited = true; }})),
      h("td", {}, h("input", {"data-key": `rewards[${i}].options`, type: "text", size: 30,
        value: JSON.stringify(r.options || {}), onchange: e => { r.options = e.target.value; rewardsEdited = true; }})),
      h("td", {}, h("button", {type: "button", onclick: () => { rewards.splice(i, 1); rewardsEdited = true; draw(); }}, "remove")))));
    draw();
    return h("div", {"data-key": "rewards"}, h("table", {id: "rewards"},
      h("thead", {}, h("tr", {}, ["reward", "weight", "options (JSON)", ""].map(c => h("th", {}, c)))), rows),
      h("button", {type: "button", id: "add-reward",
                   onclick: () => { rewards.push({name: names[0], weight: 1.0, options: {}}); rewardsEdited = true; draw(); }}, "add a reward"));
  }

  function fieldRow(field) {
    const input = field.key === "rewards" ? rewardsEditor(field) : fieldInput(field);
    return [h("label", {class: "key", for: `field-${field.key}`}, field.key),
            h("div", {}, input, h("div", {class: "help"}, field.description || ""),
              h("div", {class: "field-error", "data-error-for": field.key}))];
  }

  function render() {
    const groups = form.form.groups.map(group => {
      const grid = h("div", {class: "form-grid"}, group.keys.map(k => fieldRow(form.form.fields[k])));
      return group.collapsed ? h("details", {"data-group": group.name}, h("summary", {}, group.title), grid)
                             : h("section", {"data-group": group.name}, grid);
    });
    const problems = [...(form.choices.errors || []), ...(form.choices.warnings || [])];
    put(body, 
      problems.length ? h("div", {class: "errors"}, problems.map(p => h("div", {}, `${p.plugin || p.distribution}: ${p.message}`))) : "",
      ...groups,
      h("h2", {}, "MCP servers"),
      h("p", {class: "muted"}, "An mcpServers JSON (as Claude Desktop and Cursor use). With env mcp the run gets these servers' tools (and env_options.data, a JSONL of tasks); list them, and untick the ones the run should not offer."),
      mcpText, h("div", {}, h("button", {type: "button", id: "list-mcp-tools", onclick: listTools}, "List their tools")), mcpOut);
  }

  async function reload() {
    const params = new URLSearchParams();
    if (changed.env) params.set("env", changed.env);
    if (changed.preset) params.set("preset", changed.preset);
    const r = await api(`/api/new-run/form?${params}`);
    if (r.ok) { form = r.body; rewards = null; rewardsEdited = false; render(); }
  }

  async function listTools() {
    put(mcpOut, h("span", {class: "muted"}, "starting the servers…"));
    const r = await post("/api/new-run/mcp-tools", {mcpServers_json: mcpText.value});
    const b = r.body || {};
    put(mcpOut, 
      ...(b.errors || []).map(e => h("div", {class: "error"}, e)), r.ok ? "" : h("div", {class: "error"}, b.error || "failed"),
      ...(b.servers || []).map(s => h("div", {class: "mcp-server"}, h("strong", {}, s.name), s.error ? h("span", {class: "error"}, ` ${s.error}`) : "",
        h("ul", {}, (s.tools || []).map(t => h("li", {}, h("label", {},
          h("input", {type: "checkbox", checked: true, "data-tool": t.name}), " ",
          h("span", {class: "mono"}, t.name), " ", h("span", {class: "muted"}, t.description || ""))))))));
  }

  function showErrors(errors) {
    for (const el of main.querySelectorAll(".invalid")) el.classList.remove("invalid");
    for (const el of main.querySelectorAll(".field-error")) el.textContent = "";
    put(topErrors, );
    for (const {key, message} of errors || []) {
      const base = key.replace(/\[\d+\].*$/, "");
      const box = main.querySelector(`[data-error-for="${CSS.escape(key)}"]`) || main.querySelector(`[data-error-for="${CSS.escape(base)}"]`);
      const input = main.querySelector(`[data-key="${CSS.escape(key)}"]`) || main.querySelector(`[data-key="${CSS.escape(base)}"]`);
      if (input) { input.classList.add("invalid"); const d = input.closest("details"); if (d) d.open = true; }
      if (box) box.append(h("div", {}, key === base ? message : `${key}: ${message}`));
      else topErrors.append(h("div", {}, key ? `${key}: ${message}` : message));
    }
  }

  async function check(path) {
    result.textContent = "checking…";
    const buttons = [...main.querySelectorAll("#validate, #launch, #export")];
    for (const b of buttons) b.disabled = true;  // one launch per click, however fast the clicks
    let r;
    try { r = await post(path, values()); } finally { for (const b of buttons) b.disabled = false; }
    r.body = r.body || {};
    showErrors(r.body.errors);
    if (r.body.ok) { result.textContent = path.endsWith("launch") ? `launched ${r.body.run}` : "valid"; }
    else result.textContent = r.body.error || `${(r.body.errors || []).length} problem(s)`;
    return r;
  }

  async function exportYaml() {
    const r = await check("/api/new-run/validate");
    if (!r.body.ok) return;
    yamlOut.hidden = false;
    yamlOut.textContent = r.body.yaml;
    const link = h("a", {href: URL.createObjectURL(new Blob([r.body.yaml], {type: "text/yaml"})), download: "rlf-config.yaml"});
    document.body.append(link); link.click(); link.remove();
  }

  async function launch() {
    const r = await check("/api/new-run/launch");
    if (r.body.ok && r.body.run) location.hash = `#/run/${encodeURIComponent(r.body.run)}`;
  }

  put(main, h("h1", {}, "New run"),
    h("div", {class: "toolbar"}, h("button", {type: "button", id: "validate", onclick: () => check("/api/new-run/validate")}, "Check"),
      h("button", {type: "button", id: "launch", class: "primary", onclick: launch}, "Launch"),
      h("button", {type: "button", id: "export", onclick: exportYaml}, "Export YAML"), result),
    topErrors, body, yamlOut);
  render();
};

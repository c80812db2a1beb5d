// rlf ui: a trajectory (the conversation, tool calls, tokens) and one sample across evaluations.
"use strict";

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
    "policy version", fmt(r.policy_version), "sequences", fmt(r.num_sequences ?? (r.sequences || []).length),
    "time", `generation ${fmt(meta.generation_s)} s, tools ${fmt(meta.tool_s)} s`,
    "parse errors", fmt(meta.parse_errors), "cut-off turns", fmt(meta.cut_turns));
  const same = h("a", {id: "same-sample", href: `#/run/${enc(name)}/same/${enc(kind)}/${enc(r.sample_id)}`},
                 "this sample at every recorded step");
  // previous and next trajectory of the step, and the group this one was trained with
  const around = h("span", {class: "toolbar", id: "around"});
  api(`/api/runs/${enc(name)}/trajectories?kind=${enc(kind)}&step=${step}&limit=1000&sort=index`).then(({ok, body}) => {
    if (!ok) return;
    const indices = body.rows.map(row => row.index), at = indices.indexOf(index);
    const link = (i, text, id) => (i >= 0 && i < indices.length
      ? h("a", {id, href: `#/run/${enc(name)}/t/${enc(kind)}/${step}/${indices[i]}`}, text) : h("span", {class: "muted"}, text));
    put(around, link(at - 1, "← previous", "previous-trajectory"), link(at + 1, "next →", "next-trajectory"),
        r.group >= 0 ? h("a", {id: "its-group", href: groupLink(name, kind, step, r.group)}, `its group (${r.group})`) : null);
  });
  const parts = [back, h("h1", {}, `${kind} step ${step} · trajectory ${index}`), around, facts, h("p", {}, same),
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

// ---------------------------------------------------------------- a group

const groupLink = (name, kind, step, group) => `#/run/${enc(name)}/group/${enc(kind)}/${step}/${group}`;

// One prompt's group side by side (what GRPO compared): each member's reward and advantage, its
// turns after the prompt they share (shown once), previous and next group; tick two to diff them.
async function showGroup(name, kind, step, number) {
  document.title = `${name} ${kind} ${step} group ${number} · rlf ui`;
  const {ok, body} = await api(`/api/runs/${enc(name)}/group?kind=${enc(kind)}&step=${step}&group=${number}`);
  const back = h("a", {href: runLink(name)}, `← ${name}`);
  if (!ok) { put(main, back, h("div", {class: "error"}, body.error)); return; }
  const at = body.groups.indexOf(number);
  const step_ = (d, text, id) => (at + d >= 0 && at + d < body.groups.length
    ? h("a", {id, href: groupLink(name, kind, step, body.groups[at + d])}, text) : h("span", {class: "muted"}, text));
  const picked = new Set();
  const diffBox = h("div", {id: "diff"});
  const diffButton = h("button", {type: "button", id: "diff-button", disabled: true, onclick: () => {
    const [a, b] = body.members.filter(m => picked.has(m.index));
    put(diffBox, diffView(a, b, body.shared));
  }}, "diff the two ticked");
  const shared = body.shared ? h("details", {id: "shared-prompt"},
    h("summary", {}, `the prompt every member shares (${body.shared} message${body.shared > 1 ? "s" : ""})`),
    conversation({messages: body.shared_messages, tool_calls: []})) : null;
  put(main, back, h("h1", {}, body.title), h("div", {class: "toolbar"}, step_(-1, "← previous group", "previous-group"),
      step_(1, "next group →", "next-group"), diffButton), errorList(body.errors) || "", shared, diffBox,
    h("div", {class: "side-by-side", id: "group-columns"}, body.members.map(m => h("div", {dataset: {index: m.index}},
      h("h3", {}, h("input", {type: "checkbox", "aria-label": `tick trajectory ${m.index}`, onchange: e => {
        e.target.checked ? picked.add(m.index) : picked.delete(m.index);
        diffButton.disabled = picked.size !== 2; }}), " ",
        h("a", {href: `#/run/${enc(name)}/t/${enc(kind)}/${step}/${m.index}`}, `trajectory ${m.index}`)),
      kv("reward", fmt(m.reward), "advantage", fmt(m.advantage), "outcome", m.outcome || "–",
         "policy version", fmt(m.policy_version), "sequences", fmt((m.token_ids || []).length),
         "final answer", h("span", {class: "mono"}, m.final_answer ?? "–")),
      conversation(m)))));
}

// Two trajectories' differences: their turns (after the shared prompt) line by line, and their
// tokens: how many lead alike, and the first that differs.
function diffView(a, b, shared) {
  const text = m => (m.messages || []).map(x => `[${x.role}] ${x.content ?? ""}`).join("\n").split("\n");
  const rows = lineDiff(text(a), text(b)).map(([op, line]) => h("div", {class: `diff-${op}`},
    op === "same" ? "  " : op === "removed" ? "- " : "+ ", line));
  const ta = (a.token_ids || [])[0] || [], tb = (b.token_ids || [])[0] || [];
  let lead = 0;
  while (lead < ta.length && lead < tb.length && ta[lead] === tb[lead]) lead++;
  const tokens = lead === ta.length && lead === tb.length ? `the ${lead} tokens are the same`
    : `the first ${lead} tokens are the same; then ${a.index} has ${ta.length - lead} more and ${b.index} ${tb.length - lead}` +
      (lead < ta.length && lead < tb.length ? ` (token ${lead}: id ${ta[lead]} against ${tb[lead]})` : "");
  return h("div", {class: "diff"}, h("h2", {}, `trajectory ${a.index} (−) against ${b.index} (+)`),
           h("p", {id: "token-diff"}, tokens), h("pre", {id: "text-diff"}, rows));
}

function lineDiff(a, b) {  // the longest common subsequence of lines; unequal parts as removed / added
  if (a.length * b.length > 4e6) return [...a.map(l => ["removed", l]), ...b.map(l => ["added", l])];
  const n = a.length, m = b.length, table = Array.from({length: n + 1}, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) {
    table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
  }
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push(["same", a[i]]); i++; j++; }
    else if (table[i + 1][j] >= table[i][j + 1]) out.push(["removed", a[i++]]);
    else out.push(["added", b[j++]]);
  }
  while (i < n) out.push(["removed", a[i++]]);
  while (j < m) out.push(["added", b[j++]]);
  return out;
}

// rlf ui: the helpers every view uses (elements, the API, plots). Every value from a run is put
// in the page as text (textContent), never as HTML. The views: runs.js, run.js, trajectory.js,
// new_run.js; app.js routes the URL hash to them (loaded last).
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

// The page of `aiayn serve`: no libraries, nothing from a CDN, so it works offline.
"use strict";

const $ = (id) => document.getElementById(id);
let attention = null; // the "attention" entry of the last /translate answer, sentence 0

async function loadInfo() {
  try { // 401: the server wants a key for /info too
    const response = await fetch("/info");
    $("key-label").hidden = response.ok ? !(await response.json()).api_key_required : false;
  } catch (e) { // unknown: offer the key field, so that a server that wants one is usable
    $("key-label").hidden = false;
  }
}

// A header carries bytes as ISO-8859-1 characters: the key's UTF-8 bytes, as the server
// compares them (a non-ASCII key was refused, or made fetch() throw).
const headerBytes = (text) => String.fromCharCode(...new TextEncoder().encode(text));

// A full queue (429) clears in the seconds its Retry-After names: wait and send again (at
// most BUSY_TRIES sends), saying so, rather than show an error the user can only answer
// by clicking.
const BUSY_TRIES = 5, BUSY_MAX_WAIT_S = 30;
const sleep = (seconds) => new Promise((done) => setTimeout(done, seconds * 1000));

async function post(body) {
  const headers = { "Content-Type": "application/json" };
  if ($("key").value) headers["X-API-Key"] = headerBytes($("key").value);
  const send = () => fetch("/translate", { method: "POST", headers, body: JSON.stringify(body) });
  let response = await send();
  for (let tries = 1; response.status === 429 && tries < BUSY_TRIES; tries++) {
    const given = Number(response.headers.get("Retry-After")); // seconds; a date: NaN
    const wait = Math.min(Number.isFinite(given) && given > 0 ? given : 1, BUSY_MAX_WAIT_S);
    $("status").textContent = `the server is busy: trying again in ${wait} s…`;
    await sleep(wait);
    $("status").textContent = "translating…";
    response = await send();
  }
  let answer = null;
  try { answer = await response.json(); } catch (e) { /* a proxy's HTML page, a plain 500 */ }
  if (response.ok && answer) return answer;
  const message = answer && answer.error ? answer.error.message : "";
  const error = new Error(message || `${response.status} ${response.statusText}`.trim());
  error.status = response.status;
  throw error;
}

function fillSelect(select, n, extra) {
  const old = select.value;
  select.innerHTML = "";
  for (let i = 1; i <= n; i++) select.add(new Option(String(i), String(i)));
  if (extra) select.add(new Option(extra, "mean"));
  const fallback = extra ? "mean" : String(n); // the last layer, the mean of the heads
  select.value = [...select.options].some((o) => o.value === old) ? old : fallback;
}

function labels(kind) {
  if (kind === "encoder") return [attention.source, attention.source];
  return [attention.target, kind === "decoder_self" ? attention.target_in : attention.source];
}

function matrix() {
  const kind = $("kind").value;
  const heads = attention[kind][Number($("layer").value) - 1]; // [head][row][col]
  if ($("head").value !== "mean") return heads[Number($("head").value) - 1];
  return heads[0].map((row, r) => row.map((_, c) => heads.reduce((s, h) => s + h[r][c], 0) / heads.length));
}

function color(w) { // viridis-like ramp from dark blue to yellow
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.min(Math.max(w, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function draw() {
  const canvas = $("heatmap"), ctx = canvas.getContext("2d");
  const m = matrix(), [rows, cols] = labels($("kind").value);
  const cell = 26, font = "12px system-ui, sans-serif";
  ctx.font = font;
  const left = Math.max(...rows.map((t) => ctx.measureText(t).width)) + 12;
  const top = Math.max(...cols.map((t) => ctx.measureText(t).width)) + 12;
  canvas.width = left + cols.length * cell + 4;
  canvas.height = top + rows.length * cell + 4;
  ctx.font = font;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  m.forEach((row, r) => row.forEach((w, c) => {
    ctx.fillStyle = color(w);
    ctx.fillRect(left + c * cell, top + r * cell, cell - 1, cell - 1);
  }));
  ctx.fillStyle = "#1d2430";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  rows.forEach((t, r) => ctx.fillText(t, left - 6, top + r * cell + cell / 2));
  cols.forEach((t, c) => {
    ctx.save();
    ctx.translate(left + c * cell + cell / 2, top - 6);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(t, 0, 0);
    ctx.restore();
  });
  canvas.dataset.rows = rows.length;
  canvas.dataset.cols = cols.length;
}

function refresh() {
  if (!attention) return;
  const kind = $("kind").value;
  fillSelect($("layer"), attention[kind].length);
  fillSelect($("head"), attention[kind][0].length, "mean of heads");
  draw();
}

async function translate(event) {
  event.preventDefault();
  const text = $("src").value.trim() || $("src").placeholder;
  $("go").disabled = true;
  $("result").hidden = true; // no earlier result under a new input's error
  $("status").className = "";
  $("status").textContent = "translating…";
  const request = { src: [text], attention: true };
  if ($("beam").value) request.beam = Number($("beam").value); // empty: the model's beam
  try {
    let body, note = "";
    try {
      body = await post(request);
    } catch (e) { // maps over the server's limits: the translation alone
      if (e.status !== 413 || !e.message.startsWith("attention")) throw e;
      body = await post({ ...request, attention: false });
      note = "no attention map: " + e.message;
    }
    $("translation").textContent = body.translations[0];
    attention = body.attention ? body.attention[0] : null; // null: a blank source
    $("maps").hidden = !attention;
    $("result").hidden = false;
    $("status").textContent = note;
    refresh();
  } catch (e) {
    $("status").className = "error";
    $("status").textContent = "error: " + e.message;
  } finally {
    $("go").disabled = false;
  }
}

$("form").addEventListener("submit", translate);
$("kind").addEventListener("change", refresh);
$("layer").addEventListener("change", () => attention && draw());
$("head").addEventListener("change", () => attention && draw());
loadInfo();

// The page of `aiayn serve`: no libraries, nothing from a CDN, so it works offline.
"use strict";

const $ = (id) => document.getElementById(id);
let attention = null; // the "attention" entry of the last /translate answer, sentence 0

async function loadInfo() {
  const response = await fetch("/info"); // 401: the server wants a key for /info too
  $("key-label").hidden = response.ok ? !(await response.json()).api_key_required : false;
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
  const kind = $("kind").value;
  fillSelect($("layer"), attention[kind].length);
  fillSelect($("head"), attention[kind][0].length, "mean of heads");
  draw();
}

async function translate(event) {
  event.preventDefault();
  const text = $("src").value.trim() || $("src").placeholder;
  $("go").disabled = true;
  $("status").className = "";
  $("status").textContent = "translating…";
  const headers = { "Content-Type": "application/json" };
  if ($("key").value) headers["X-API-Key"] = $("key").value;
  try {
    const response = await fetch("/translate", {
      method: "POST",
      headers,
      body: JSON.stringify({ src: [text], beam: Number($("beam").value), attention: true }),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    $("translation").textContent = body.translations[0];
    attention = body.attention[0];
    $("result").hidden = false;
    $("status").textContent = "";
    if (attention) refresh();
  } catch (e) {
    $("status").className = "error";
    $("status").textContent = "error: " + e.message;
  } finally {
    $("go").disabled = false;
  }
}

$("form").addEventListener("submit", translate);
$("kind").addEventListener("change", refresh);
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
loadInfo();

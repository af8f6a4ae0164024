// seq2seq-serve's page: asks /v1/translate for every loaded model and draws the answers
// side by side. Plain DOM, no framework, no network beyond this server; text from the
// server is always set as textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KIND = { none: "fixed vector", bahdanau: "additive attention", luong: "multiplicative attention" };
const HEAT = "31, 95, 191";  // the heatmap's colour (style.css's --accent), alpha = weight
let models = [];

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function count(n) {  // 8320320 -> "8.3M", 9878 -> "9.9k"
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : `${(n / 1e3).toFixed(1)}k`;
}

function say(message, isError = false) {
  $("status").textContent = message;
  $("status").classList.toggle("error", isError);
}

async function loadModels() {
  try {
    const answer = await fetch("/v1/models");
    const body = await answer.json();
    models = body.models;
    const { max_beam, max_nbest, max_chars } = body.limits;
    $("beam").max = max_beam;
    $("beam").value = Math.min(body.default_beam, max_beam);
    $("nbest").max = max_nbest;
    $("source").maxLength = max_chars;
    $("loaded").textContent = "Loaded: " + models.map((m) =>
      `${m.name} (${m.attention}, ${count(m.parameters)} parameters)`).join(" · ");
  } catch (err) {
    $("loaded").textContent = "Could not reach the server: " + err;
  }
}

async function translate(event) {
  event.preventDefault();
  const text = $("source").value.trim();
  if (!text) { say("Type a Spanish sentence first.", true); return; }
  const beam = Number($("beam").value), nbest = Number($("nbest").value);
  $("go").disabled = true;
  say("Translating…");
  const started = performance.now();
  try {
    const answer = await fetch("/v1/translate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sentences: [text], beam, nbest, attention: true }),
    });
    const body = await answer.json();
    if (!answer.ok) { say(`Error ${answer.status}: ${body.message}`, true); return; }
    render(body.outputs);
    say(`Translated by ${body.outputs.length} model(s) in ${Math.round(performance.now() - started)} ms.`);
  } catch (err) {
    say("The server did not answer: " + err, true);
  } finally {
    $("go").disabled = false;
  }
}

function render(outputs) {
  const results = $("results");
  results.replaceChildren(...outputs.map((output, k) => card(output, k)));
}

function card(output, k) {
  const info = models.find((m) => m.name === output.model);
  const sentence = output.sentences[0];
  const best = sentence.hypotheses[0];
  const headingId = `model-${k}`;
  const bestText = el("p", { class: "best", lang: "en", text: best.text || "(empty)" });
  const copy = el("button", { class: "copy", type: "button", "aria-label": `Copy ${output.model}'s translation`,
    text: "Copy", onclick: () => copyText(best.text, output.model) });
  const body = [
    el("h2", { id: headingId }, output.model,
      el("span", { class: "kind", text: `${KIND[output.attention] || output.attention}` +
        (info ? ` · ${count(info.parameters)} parameters` : "") })),
    el("div", { class: "best-row" }, bestText, copy),
    nbestList(sentence.hypotheses, output.model),
  ];
  if (sentence.truncated) body.push(el("p", { class: "truncated", text: "The sentence was cut to the model's maximum length." }));
  if (!output.alignment) {
    body.push(el("p", { class: "no-align", text: "One fixed vector, no alignment: this model " +
      "compresses the whole sentence into a single vector before writing, so there is no " +
      "attention to show." }));
  } else if (best.attention && best.tgt_tokens.length && sentence.src_tokens.length) {
    body.push(...heatmap(best, sentence.src_tokens, output.model, k));
  }
  return el("article", { class: "model", "aria-labelledby": headingId, "data-model": output.model }, ...body);
}

function nbestList(hypotheses, model) {
  const list = el("ol", { class: "nbest", "aria-label": `${model}: ${hypotheses.length} best hypotheses with scores` });
  for (const h of hypotheses) {
    list.append(el("li", {}, el("span", { lang: "en", text: h.text || "(empty)" }),
      el("span", { class: "score", text: `${h.score.toFixed(3)}`, title: "length-normalised log-probability" })));
  }
  return list;
}

async function copyText(text, model) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {  // no clipboard API (an insecure context): the old way
    const area = el("textarea", { class: "sr-only" });
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  say(`Copied ${model}'s translation.`);
}

// ---------------------------------------------------------------- the heatmap

function heatmap(hyp, src, model, k) {
  const att = hyp.attention;  // (len(tgt), len(src)), row i = weights when writing target i
  const tgt = hyp.tgt_tokens;
  const desc = el("p", { class: "align-desc", id: `align-${k}`, "aria-live": "polite" });
  const table = el("table", { class: "heat", "aria-describedby": desc.id });
  table.append(el("caption", { text: `${model}'s attention: rows = English subwords written, columns = Spanish subwords read` }));
  const head = el("tr", {}, el("td", { "aria-hidden": "true" }));
  src.forEach((piece, j) => head.append(el("th", { scope: "col", class: "src" },
    tokenButton(piece, "src", j, `Spanish subword ${j + 1}: ${piece}`))));
  table.append(el("thead", {}, head));
  const rows = el("tbody");
  tgt.forEach((piece, i) => {
    const row = el("tr", {}, el("th", { scope: "row", class: "tgt" },
      tokenButton(piece, "tgt", i, `English subword ${i + 1}: ${piece}`)));
    att[i].forEach((w, j) => {
      const cell = el("td", { "data-i": i, "data-j": j, title: `${piece} ← ${src[j]}: ${(100 * w).toFixed(1)}%` });
      cell.style.backgroundColor = `rgba(${HEAT}, ${Math.min(1, w).toFixed(3)})`;
      row.append(cell);
    });
    rows.append(row);
  });
  table.append(rows);
  const wire = (event) => {
    const target = event.target.closest("[data-side], td[data-i]");
    if (!target) return;
    if (target.tagName === "TD") highlightCell(table, +target.dataset.i, +target.dataset.j);
    else highlight(table, desc, att, src, tgt, target.dataset.side, +target.dataset.index);
  };
  table.addEventListener("mouseover", wire);
  table.addEventListener("focusin", wire);
  table.addEventListener("click", wire);  // a tap on a phone
  table.addEventListener("mouseleave", () => clear(table));
  table.addEventListener("focusout", () => clear(table));
  return [el("div", { class: "heat-wrap" }, table), desc];
}

function tokenButton(piece, side, index, label) {
  return el("button", { type: "button", class: `tok ${side}`, "data-side": side, "data-index": index,
    "aria-label": label, text: piece });
}

function clear(table) {
  table.querySelectorAll(".hl, .on").forEach((node) => node.classList.remove("hl", "on"));
}

// The tokens on the other side that got at least half of the largest weight.
function strongest(weights) {
  const top = Math.max(...weights);
  return weights.map((w, idx) => [w, idx]).filter(([w]) => top > 0 && w >= 0.5 * top);
}

function highlight(table, desc, att, src, tgt, side, index) {
  clear(table);
  const fromTarget = side === "tgt";
  const weights = fromTarget ? att[index] : att.map((row) => row[index]);
  const other = fromTarget ? "src" : "tgt";
  table.querySelector(`.tok.${side}[data-index="${index}"]`).classList.add("on");
  const strong = strongest(weights);
  for (const [, idx] of strong) {
    table.querySelector(`.tok.${other}[data-index="${idx}"]`).classList.add("hl");
    const [i, j] = fromTarget ? [index, idx] : [idx, index];
    table.querySelector(`td[data-i="${i}"][data-j="${j}"]`).classList.add("hl");
  }
  const pieces = fromTarget ? src : tgt;
  const words = strong.sort((a, b) => b[0] - a[0])
    .map(([w, idx]) => `${pieces[idx]} ${(100 * w).toFixed(0)}%`).join(", ");
  desc.textContent = fromTarget ? `${tgt[index]} ← ${words}` : `${src[index]} → ${words}`;
}

function highlightCell(table, i, j) {
  clear(table);
  table.querySelector(`.tok.tgt[data-index="${i}"]`).classList.add("hl");
  table.querySelector(`.tok.src[data-index="${j}"]`).classList.add("hl");
  table.querySelector(`td[data-i="${i}"][data-j="${j}"]`).classList.add("hl");
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", translate);
  $("source").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("form").requestSubmit();
  });
  loadModels();
});

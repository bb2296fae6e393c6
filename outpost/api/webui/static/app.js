// Outpost's chat page. Streams /v1/chat/completions (SSE over fetch), keeps the conversation in
// localStorage, and sends the API key only as an Authorization header (never in a URL). Text is
// always set with textContent: model output is never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { chat: "outpost.chat", settings: "outpost.settings", key: "outpost.apiKey" };
const SETTINGS = ["system", "temperature", "top_p", "max_tokens"];
const STATUS_LABELS = {
  400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 408: "Timed out",
  413: "Request too large", 429: "Server busy", 500: "Server error", 503: "Unavailable",
};

const state = { messages: load(STORE.chat, []), model: null, controller: null };
const views = new WeakMap(); // message -> its DOM nodes (kept out of what is saved)

function load(name, fallback) {
  try {
    const raw = localStorage.getItem(name);
    return raw ? JSON.parse(raw) : fallback;
  } catch {
    return fallback;
  }
}

function save(name, value) {
  try {
    localStorage.setItem(name, JSON.stringify(value));
  } catch {
    // storage full or disabled: the chat still works, it just is not kept
  }
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---- API key: sessionStorage, or localStorage with "remember"; sent only as a header ----

function loadKey() {
  const remembered = localStorage.getItem(STORE.key);
  $("api-key").value = sessionStorage.getItem(STORE.key) || remembered || "";
  $("remember-key").checked = Boolean(remembered);
  if ($("api-key").value) $("key-row").hidden = false;
}

function storeKey() {
  const key = $("api-key").value.trim();
  const keep = $("remember-key").checked ? localStorage : sessionStorage;
  const drop = keep === localStorage ? sessionStorage : localStorage;
  drop.removeItem(STORE.key);
  if (key) keep.setItem(STORE.key, key);
  else keep.removeItem(STORE.key);
}

function headers() {
  const result = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

function askForKey() {
  $("key-row").hidden = false;
  $("settings").hidden = false;
  $("settings-toggle").setAttribute("aria-expanded", "true");
  $("api-key").focus();
}

// ---- errors ----

async function errorText(response) {
  let message = response.statusText;
  try {
    const body = await response.json();
    message = body?.error?.message || JSON.stringify(body);
  } catch {
    // not JSON: keep the status text
  }
  const label = STATUS_LABELS[response.status] || "Error";
  return `${label} (${response.status}): ${message}`;
}

function showError(text) {
  $("error").textContent = text || "";
  $("error").hidden = !text;
}

// ---- rendering ----

function renderAll() {
  const log = $("log");
  for (const node of [...log.querySelectorAll(".msg")]) node.remove();
  $("empty").hidden = state.messages.length > 0;
  for (const message of state.messages) log.append(buildView(message).root);
  scrollDown(true);
}

function buildView(message) {
  const root = el("div", `msg ${message.role}`);
  const view = { root, details: null, thoughts: null, body: el("div", "body"), meta: el("div", "meta") };
  if (message.reasoning) addReasoning(view);
  root.append(view.body, view.meta);
  views.set(message, view);
  paint(message);
  return view;
}

function addReasoning(view) {
  view.details = el("details", "reasoning");
  view.details.append(el("summary", "", "Thinking"));
  view.thoughts = el("div", "thoughts");
  view.details.append(view.thoughts);
  view.root.prepend(view.details);
}

function paint(message, live) {
  const view = views.get(message);
  if (!view) return;
  if (message.reasoning && !view.details) addReasoning(view);
  if (view.thoughts) view.thoughts.textContent = message.reasoning;
  view.body.textContent = message.content;
  view.meta.textContent = live || message.meta || "";
  view.meta.hidden = !view.meta.textContent;
  view.root.classList.toggle("streaming", Boolean(live));
}

function scrollDown(force) {
  const log = $("log");
  if (force || log.scrollHeight - log.scrollTop - log.clientHeight < 120) log.scrollTop = log.scrollHeight;
}

function setBusy(busy) {
  document.body.dataset.busy = busy ? "true" : "false";
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// ---- server calls ----

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) {
      showError(await errorText(response));
      if (response.status === 401) askForKey();
      return;
    }
    const card = (await response.json()).data[0];
    state.model = card.id;
    $("model").textContent = card.id;
    const ctx = card.meta?.n_ctx_seq;
    if (ctx) $("model").title = `${card.id}: ${ctx} tokens of context per request`;
    showError("");
  } catch (err) {
    showError(`Cannot reach the server: ${err.message}`);
  }
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of state.messages) {
    if (m.content) messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if (state.model) body.model = state.model;
  for (const name of ["temperature", "top_p", "max_tokens"]) {
    const raw = $(name).value.trim();
    if (raw !== "") body[name] = Number(raw);
  }
  return body;
}

// The `data:` payloads of a server-sent event stream, parsed; "[DONE]" is passed on as is.
async function* sseEvents(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield data === "[DONE]" ? data : JSON.parse(data);
    }
  }
}

function rate(n, ms) {
  return n > 0 && ms > 0 ? `${((n * 1000) / ms).toFixed(1)} tok/s` : "";
}

async function ask(text) {
  const user = { role: "user", content: text };
  state.messages.push(user);
  const body = requestBody();
  const reply = { role: "assistant", content: "", reasoning: "" };
  state.messages.push(reply);
  $("empty").hidden = true;
  $("log").append(buildView(user).root, buildView(reply).root);
  scrollDown(true);
  showError("");

  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  const live = { n: 0, first: 0, timings: null, finish: null };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) {
      const message = await errorText(response);
      state.messages.splice(-2); // nothing was said: take the turn back so it can be resent
      views.get(user).root.remove();
      views.get(reply).root.remove();
      $("empty").hidden = state.messages.length > 0;
      $("prompt").value = text;
      showError(message);
      if (response.status === 401) askForKey();
      return;
    }
    for await (const event of sseEvents(response.body)) {
      if (event === "[DONE]") break;
      if (event.error) throw new Error(event.error.message || "the server ended the answer with an error");
      receive(reply, event, live);
    }
    reply.meta = summary(live, reply);
  } catch (err) {
    if (err.name === "AbortError") {
      reply.meta = `stopped · ${live.n} tokens`;
    } else {
      reply.meta = `error: ${err.message}`;
      showError(err.message);
    }
  } finally {
    state.controller = null;
    setBusy(false);
    paint(reply);
    save(STORE.chat, state.messages);
  }
}

function receive(reply, event, live) {
  if (event.timings) live.timings = event.timings;
  const choice = event.choices?.[0];
  if (!choice) return;
  const delta = choice.delta || {};
  if (delta.content || delta.reasoning_content) {
    live.n += 1; // one chunk per token; the final chunk's timings give the exact figures
    if (!live.first) live.first = performance.now();
    reply.content += delta.content || "";
    reply.reasoning += delta.reasoning_content || "";
  }
  if (choice.finish_reason) live.finish = choice.finish_reason;
  const speed = rate(live.n - 1, performance.now() - live.first);
  $("speed").textContent = speed;
  paint(reply, `${live.n} tokens${speed ? ` · ${speed}` : ""}`);
  scrollDown(false);
}

function summary(live, reply) {
  const t = live.timings;
  const parts = [];
  if (t) {
    const speed = `${(t.predicted_per_second || 0).toFixed(1)} tok/s`;
    parts.push(`${t.predicted_n} tokens`, speed);
    if (t.prompt_n) parts.push(`prompt ${t.prompt_n} tokens in ${(t.prompt_ms || 0).toFixed(0)} ms`);
    $("speed").textContent = speed;
  } else {
    parts.push(`${live.n} tokens`);
  }
  if (live.finish === "length") parts.push("cut at max tokens");
  if (!reply.content && !reply.reasoning) parts.push("empty answer");
  return parts.join(" · ");
}

// ---- wiring ----

function loadSettings() {
  const saved = load(STORE.settings, {});
  for (const name of SETTINGS) {
    if (typeof saved[name] === "string") $(name).value = saved[name];
    $(name).addEventListener("input", () => {
      save(STORE.settings, Object.fromEntries(SETTINGS.map((n) => [n, $(n).value])));
    });
  }
}

function start() {
  loadSettings();
  loadKey();
  renderAll();
  setBusy(false);

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    ask(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("new-chat").addEventListener("click", () => {
    state.controller?.abort();
    state.messages = [];
    save(STORE.chat, state.messages);
    $("speed").textContent = "";
    showError("");
    renderAll();
    $("prompt").focus();
  });
  $("settings-toggle").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  });
  const keyChanged = () => {
    storeKey();
    loadModel();
  };
  $("api-key").addEventListener("change", keyChanged);
  $("remember-key").addEventListener("change", keyChanged);

  loadModel();
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", start);

// Outpost's chat page. Streams /v1/chat/completions (SSE over fetch), keeps the conversations in
// localStorage, and sends the API key only as an Authorization header (never in a URL). Answers
// are markdown: rendered by the vendored marked with any HTML in them escaped (so a <script> in an
// answer shows as text), then sanitised by the vendored DOMPurify before it reaches the page.
// Everything else (user turns, reasoning, errors) is set with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { chat: "outpost.chat", chats: "outpost.chats", settings: "outpost.settings", key: "outpost.apiKey" };
const SETTINGS = ["system", "temperature", "top_p", "max_tokens"];
const STATUS_LABELS = {
  400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 408: "Timed out",
  413: "Request too large", 429: "Server busy", 500: "Server error", 503: "Unavailable",
};

const state = { chats: null, messages: [], model: null, controller: null };
const views = new WeakMap(); // message -> its DOM nodes (kept out of what is saved)
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
// Raw HTML in an answer is shown as the text it is, never parsed.
const markdown = new marked.Marked({ gfm: true, breaks: true, renderer: { html: ({ text }) => escapeHtml(text) } });

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

// ---- conversations: {current, list: [{id, title, messages, updated}]} in localStorage ----

function newChat(messages) {
  const id = `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`;
  return { id, title: "", messages: messages || [], updated: Date.now() };
}

function loadChats() {
  const saved = load(STORE.chats, null);
  if (saved && Array.isArray(saved.list) && saved.list.length) return saved;
  const first = newChat(load(STORE.chat, [])); // the single conversation older pages kept
  localStorage.removeItem(STORE.chat);
  return { current: first.id, list: [first] };
}

function currentChat() {
  return state.chats.list.find((c) => c.id === state.chats.current);
}

function saveChats() {
  const chat = currentChat();
  if (chat) {
    chat.messages = state.messages;
    chat.updated = Date.now();
    const first = state.messages.find((m) => m.role === "user");
    chat.title = first ? first.content.slice(0, 60) : "";
  }
  save(STORE.chats, state.chats);
  renderChats();
}

function openChat(id) {
  state.controller?.abort();
  state.chats.current = id;
  state.messages = currentChat().messages;
  save(STORE.chats, state.chats);
  $("speed").textContent = "";
  showError("");
  renderAll();
  renderChats();
}

function startChat() {
  const chat = currentChat();
  if (chat && chat.messages.length === 0) return openChat(chat.id);
  const fresh = newChat();
  state.chats.list.unshift(fresh);
  openChat(fresh.id);
}

function deleteChat(id) {
  state.chats.list = state.chats.list.filter((c) => c.id !== id);
  if (!state.chats.list.length) state.chats.list.push(newChat());
  if (state.chats.current === id) openChat(state.chats.list[0].id);
  else saveChats();
}

function renderChats() {
  const list = $("chat-list");
  list.replaceChildren();
  for (const chat of state.chats.list) {
    const item = el("li", chat.id === state.chats.current ? "current" : "");
    const open = el("button", "ghost open-chat", chat.title || "New chat");
    open.type = "button";
    open.addEventListener("click", () => openChat(chat.id));
    const drop = el("button", "ghost delete-chat", "×");
    drop.type = "button";
    drop.title = drop.ariaLabel = "Delete this conversation";
    drop.addEventListener("click", () => deleteChat(chat.id));
    item.append(open, drop);
    list.append(item);
  }
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

function renderMarkdown(node, text) {
  node.innerHTML = DOMPurify.sanitize(markdown.parse(text));
  for (const pre of node.querySelectorAll("pre")) {
    const copy = el("button", "ghost copy", "Copy");
    copy.type = "button";
    copy.addEventListener("click", () => copyCode(copy, pre.querySelector("code") || pre));
    pre.append(copy);
  }
}

async function copyCode(button, code) {
  try {
    await navigator.clipboard.writeText(code.textContent);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => (button.textContent = "Copy"), 1500);
}

function addTools(message, view) {
  const tools = el("div", "tools");
  const index = state.messages.indexOf(message);
  if (message.role === "user") {
    const edit = el("button", "ghost edit", "Edit");
    edit.type = "button";
    edit.addEventListener("click", () => editFrom(index));
    tools.append(edit);
  } else if (index === state.messages.length - 1) {
    const again = el("button", "ghost regenerate", "Regenerate");
    again.type = "button";
    again.addEventListener("click", regenerate);
    tools.append(again);
  }
  view.root.append(tools);
}

function paint(message, live) {
  const view = views.get(message);
  if (!view) return;
  if (message.reasoning && !view.details) addReasoning(view);
  if (view.thoughts) view.thoughts.textContent = message.reasoning;
  if (message.role === "assistant") renderMarkdown(view.body, message.content);
  else view.body.textContent = message.content;
  view.root.querySelector(".tools")?.remove();
  if (!live && !state.controller) addTools(message, view);
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

// Edit a user turn: its text goes back to the box and the conversation from it on is dropped.
function editFrom(index) {
  if (state.controller) return;
  const text = state.messages[index].content;
  state.messages.splice(index);
  saveChats();
  renderAll();
  $("prompt").value = text;
  $("prompt").focus();
}

function regenerate() {
  if (state.controller || state.messages.at(-1)?.role !== "assistant") return;
  state.messages.pop();
  const user = state.messages.pop();
  renderAll();
  ask(user.content);
}

async function ask(text) {
  const user = { role: "user", content: text };
  state.messages.push(user);
  const body = requestBody();
  const reply = { role: "assistant", content: "", reasoning: "" };
  state.messages.push(reply);
  $("empty").hidden = true;
  for (const old of document.querySelectorAll(".regenerate")) old.remove();
  const controller = new AbortController();
  state.controller = controller;
  $("log").append(buildView(user).root, buildView(reply).root);
  scrollDown(true);
  showError("");

  setBusy(true);
  const live = { n: 0, first: 0, timings: null, finish: null };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) {
      const message = await errorText(response);
      state.controller = null;
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
    if (views.get(reply)?.root.isConnected) {
      paint(reply);
      paint(user);
    }
    saveChats();
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

// A setting never saved keeps the page's own default (the textarea's text for the system prompt: a
// small instruct model rambles or switches language without one); one saved, even empty, is the user's.
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
  state.chats = loadChats();
  state.messages = currentChat()?.messages || [];
  loadSettings();
  loadKey();
  renderAll();
  renderChats();
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
    startChat();
    $("prompt").focus();
  });
  $("chats-toggle").addEventListener("click", () => {
    const open = $("chats").hidden;
    $("chats").hidden = !open;
    $("chats-toggle").setAttribute("aria-expanded", String(open));
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

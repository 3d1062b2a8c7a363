// The chat page of `infer serve`: a client of the server's own OpenAI routes, no dependencies.
// Model output is never parsed as HTML: the Markdown renderer below builds elements and sets only
// text, and the page's Content-Security-Policy forbids inline scripts besides.
"use strict";

const STORE = "infer.conversations";
const CURRENT = "infer.current";
const SETTINGS = "infer.settings";
const KEY = "infer.apiKey"; // in sessionStorage: the key leaves with the tab
const UNTITLED = "New chat";
const toInt = (s) => parseInt(s, 10);
const NUMBERS = [["temperature", parseFloat], ["top_p", parseFloat], ["top_k", toInt],
  ["min_p", parseFloat], ["max_tokens", toInt], ["seed", toInt]];

// The page's one piece of state: the conversations, the open one, the running reply's controller.
const state = { convs: [], current: null, controller: null, keyAsk: null, frame: 0 };

const $ = (sel) => document.querySelector(sel);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---------------------------------------------------------------- Markdown, as DOM nodes only

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

const INLINE = [
  /\\([!-/:-@[-`{-~])/, // 1: a backslash-escaped punctuation character
  /(`+)([^`]|[^`][\s\S]*?[^`])\2(?!`)/, // 2, 3: a code span
  /\*\*(?=\S)([\s\S]*?\S)\*\*/, // 4: bold
  /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/, // 5: bold
  /\*(?=[^\s*])([\s\S]*?[^\s*])\*/, // 6: italic
  /(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/, // 7: italic, not inside snake_case words
  /~~(?=\S)([\s\S]*?\S)~~/, // 8: strikethrough
  /\[([^[\]]+)\]\(\s*<?([^\s<>]+?)>?(?:\s+"[^"]*")?\s*\)/, // 9, 10: a link
  /(https?:\/\/[^\s<>()[\]]*[^\s<>()[\].,;:!?'"*_~])/, // 11: a bare URL
].map((r) => r.source).join("|");

const MAX_DEPTH = 8; // lists and quotes nested deeper show as text: "- - - - …" must not exhaust the stack

// Whatever the model wrote, the reply shows: a bug here falls back to the plain text.
function markdown(text) {
  try {
    return renderMarkdown(text, 0);
  } catch (e) {
    console.warn("Markdown rendering failed; showing the plain text", e);
    return el("p", null, text);
  }
}

function renderMarkdown(text, depth) {
  const frag = document.createDocumentFragment();
  if (depth > MAX_DEPTH) return (frag.append(el("p", null, text)), frag);
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) i++;
    else if ((m = FENCE.exec(line))) i = codeBlock(lines, i, m, frag);
    else if ((m = HEADING.exec(line))) i = heading(m, frag, i);
    else if (RULE.test(line)) (frag.append(el("hr")), i++);
    else if (QUOTE.test(line)) i = quote(lines, i, frag, depth);
    else if (ITEM.test(line)) i = list(lines, i, frag, depth);
    else i = paragraph(lines, i, frag);
  }
  return frag;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

const indentOf = (line) => line.length - line.trimStart().length;

function heading(m, parent, i) {
  const h = el("h" + m[1].length);
  inline(m[2], h);
  parent.append(h);
  return i + 1;
}

function codeBlock(lines, i, m, parent) {
  const close = new RegExp("^ {0,3}" + (m[1][0] === "`" ? "`" : "~") + "{" + m[1].length + ",}\\s*$");
  const body = [];
  for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
  const pre = el("pre");
  const code = el("code", null, body.join("\n"));
  if (m[2]) code.className = "language-" + m[2];
  pre.append(code);
  parent.append(pre);
  return i + 1; // past the closing fence; a reply still streaming may not have written it yet
}

function quote(lines, i, parent, depth) {
  const body = [];
  for (let m; i < lines.length && (m = QUOTE.exec(lines[i])); i++) body.push(m[1]);
  const bq = el("blockquote");
  bq.append(renderMarkdown(body.join("\n"), depth + 1));
  parent.append(bq);
  return i;
}

function paragraph(lines, i, parent) {
  const body = [lines[i].trim()];
  for (i++; i < lines.length && lines[i].trim() && !startsBlock(lines[i]); i++) body.push(lines[i].trim());
  const p = el("p");
  inline(body.join("\n"), p);
  parent.append(p);
  return i;
}

// A list of the items at one indent; an item's own lines (nested lists included) render as Markdown.
function list(lines, i, parent, depth) {
  const first = ITEM.exec(lines[i]);
  const base = first[1].length;
  const ordered = /\d/.test(first[2]);
  const ul = el(ordered ? "ol" : "ul");
  if (ordered && toInt(first[2]) !== 1) ul.start = toInt(first[2]);
  for (;;) {
    const m = i < lines.length && ITEM.exec(lines[i]);
    if (!m || m[1].length !== base || /\d/.test(m[2]) !== ordered) break;
    const li = el("li");
    i = listItem(lines, i, m, li, depth);
    ul.append(li);
    // a blank line between two items of the same list does not end it
    if (i + 1 < lines.length && !lines[i]?.trim() && ITEM.test(lines[i + 1]) && indentOf(lines[i + 1]) === base) i++;
  }
  parent.append(ul);
  return i;
}

function listItem(lines, i, m, li, depth) {
  const base = m[1].length;
  const offset = m[0].length - m[3].length; // where the item's text starts
  const body = [m[3]];
  for (i++; i < lines.length; i++) {
    const line = lines[i];
    if (!line.trim()) {
      const next = lines[i + 1];
      if (next !== undefined && next.trim() && indentOf(next) > base) body.push("");
      else break;
    } else if (indentOf(line) > base) body.push(line.slice(Math.min(indentOf(line), offset)));
    else if (startsBlock(line)) break;
    else body.push(line.trim()); // a lazy continuation of the item's paragraph
  }
  li.append(renderMarkdown(body.join("\n"), depth + 1));
  return i;
}

function inline(text, parent) {
  const re = new RegExp(INLINE, "g"); // a fresh lastIndex per call: inline() recurses
  let at = 0;
  for (let m; (m = re.exec(text));) {
    if (m.index > at) parent.append(text.slice(at, m.index)); // append(string) makes a Text node
    parent.append(inlineNode(m));
    at = re.lastIndex;
  }
  if (at < text.length) parent.append(text.slice(at));
}

function inlineNode(m) {
  const wrap = (tag, inner) => {
    const e = el(tag);
    inline(inner, e);
    return e;
  };
  if (m[1] !== undefined) return m[1];
  if (m[3] !== undefined) return el("code", null, m[3]);
  if (m[4] !== undefined || m[5] !== undefined) return wrap("strong", m[4] ?? m[5]);
  if (m[6] !== undefined || m[7] !== undefined) return wrap("em", m[6] ?? m[7]);
  if (m[8] !== undefined) return wrap("del", m[8]);
  if (m[9] !== undefined) return link(m[9], m[10], m[0]);
  return link(null, m[11], m[0]);
}

function safeUrl(href) {
  try {
    const url = new URL(href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

// Links go to http(s) only: a javascript: or data: link stays its literal text.
function link(label, href, literal) {
  const url = safeUrl(href);
  if (!url) return literal;
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  if (label === null) a.textContent = href;
  else inline(label, a);
  return a;
}

// ---------------------------------------------------------------- messages

function messageView(msg) {
  const user = msg.role === "user";
  const art = el("article", "msg " + (user ? "user" : "assistant"));
  const think = el("details", "reasoning");
  think.append(el("summary", null, "Thinking"), el("div", "reasoning-text"));
  think.hidden = true;
  art.append(el("div", "role", user ? "You" : "Assistant"), think, el("div", "content " + (user ? "plain" : "md")),
    el("div", "error"), el("div", "stats"));
  updateView(art, msg);
  return art;
}

function updateView(art, msg) {
  const think = art.querySelector(".reasoning");
  if (msg.reasoning) {
    if (think.hidden) think.open = !msg.content; // open while the model thinks, then the user's to toggle
    think.hidden = false;
    think.querySelector(".reasoning-text").textContent = msg.reasoning;
  }
  const body = art.querySelector(".content");
  if (msg.role === "user") body.textContent = msg.content;
  else body.replaceChildren(markdown(msg.content));
  art.querySelector(".error").textContent = msg.error ?? "";
  showStats(art.querySelector(".stats"), msg);
}

function showStats(box, msg) {
  const s = msg.stats;
  if (!s) return void box.replaceChildren();
  const parts = [`${s.tokens} tokens`];
  if (s.ttft_ms !== null) parts.push(`TTFT ${s.ttft_ms} ms`);
  if (s.tps !== null) parts.push(`${s.tps} tok/s`);
  if (msg.stopped) parts.push("stopped");
  box.textContent = parts.join(" · ");
  Object.assign(box.dataset, { tokens: s.tokens, ttft: s.ttft_ms ?? "", tps: s.tps ?? "" });
}

function nearBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

// Streamed deltas redraw at most once a frame: a long reply re-renders its Markdown whole.
function scheduleUpdate(art, msg) {
  if (state.frame) return;
  state.frame = requestAnimationFrame(() => {
    state.frame = 0;
    const box = $("#messages");
    const follow = nearBottom(box);
    updateView(art, msg);
    if (follow) box.scrollTop = box.scrollHeight;
  });
}

function renderMessages() {
  const box = $("#messages");
  const conv = state.current;
  box.replaceChildren(...conv.messages.map(messageView));
  if (!conv.messages.length) box.append(el("p", "empty", "Ask anything. Enter sends, Shift+Enter starts a new line."));
  box.scrollTop = box.scrollHeight;
}

// ---------------------------------------------------------------- conversations

function newConv() {
  const id = Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  return { id, title: UNTITLED, created: Date.now(), updated: Date.now(), system: "", messages: [] };
}

function cleanConv(c) {
  if (!c || typeof c.id !== "string" || !Array.isArray(c.messages)) return null;
  const messages = c.messages.filter((m) => m && typeof m.content === "string")
    .map((m) => ({ ...m, role: m.role === "user" ? "user" : "assistant" }));
  return { ...c, title: String(c.title || UNTITLED), system: String(c.system ?? ""), messages,
    updated: Number(c.updated) || 0 };
}

function loadConvs() {
  try {
    const all = JSON.parse(localStorage.getItem(STORE) || "[]");
    return Array.isArray(all) ? all.map(cleanConv).filter(Boolean) : [];
  } catch {
    return []; // unreadable storage: start afresh rather than not at all
  }
}

function saveConvs() {
  try {
    // an empty conversation is not worth keeping, unless it is the open one after a reload
    localStorage.setItem(STORE, JSON.stringify(state.convs.filter((c) => c.messages.length)));
    localStorage.setItem(CURRENT, state.current.id);
  } catch (e) {
    notice(`could not save the conversation: ${e.message}`);
  }
}

function renderList() {
  const ul = $("#conversations");
  const sorted = [...state.convs].sort((a, b) => b.updated - a.updated);
  ul.replaceChildren(...sorted.map((c) => {
    const li = el("li", "conv-item" + (c === state.current ? " current" : ""));
    li.dataset.id = c.id;
    const open = el("button", "conv-open", c.title);
    open.type = "button";
    if (c === state.current) open.setAttribute("aria-current", "true");
    open.addEventListener("click", () => openConv(c.id));
    li.append(open);
    return li;
  }));
  $("#title").textContent = state.current.title;
  document.title = `${state.current.title} · infer`;
}

function render() {
  renderList();
  renderMessages();
  $("#system").value = state.current.system;
}

function openConv(id) {
  stop();
  state.current = state.convs.find((c) => c.id === id) ?? state.current;
  saveConvs();
  render();
  closeMenu();
  $("#prompt").focus();
}

function startConv() {
  stop();
  const empty = state.convs.find((c) => !c.messages.length);
  if (empty) state.current = empty; // reuse the blank one rather than pile them up
  else state.convs.push((state.current = newConv()));
  render();
  closeMenu();
  $("#prompt").focus();
}

async function renameConv() {
  const title = await ask("Rename the conversation:", { value: state.current.title });
  if (title === null || !title.trim()) return;
  state.current.title = title.trim().slice(0, 200);
  state.current.renamed = true;
  saveConvs();
  renderList();
}

async function deleteConv() {
  const conv = state.current;
  if ((await ask(`Delete "${conv.title}"?`, { input: false })) === null) return;
  stop();
  state.convs = state.convs.filter((c) => c !== conv);
  if (!state.convs.length) state.convs.push(newConv());
  state.current = [...state.convs].sort((a, b) => b.updated - a.updated)[0];
  saveConvs();
  render();
}

function exportConv() {
  const conv = state.current;
  const blob = new Blob([JSON.stringify(conv, null, 2)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = (conv.title.replace(/[^\w.-]+/g, "-").replace(/^-+|-+$/g, "") || "conversation") + ".json";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---------------------------------------------------------------- settings and the model list

function loadSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SETTINGS) || "{}") || {};
  } catch {
    saved = {};
  }
  for (const [name] of NUMBERS) $("#" + name).value = saved[name] ?? "";
  return saved;
}

function saveSettings() {
  const saved = { model: $("#model").value };
  for (const [name] of NUMBERS) saved[name] = $("#" + name).value;
  try {
    localStorage.setItem(SETTINGS, JSON.stringify(saved));
  } catch {
    // settings are a convenience: a full storage only loses them
  }
}

async function loadModels(preferred) {
  const select = $("#model");
  try {
    const resp = await apiFetch("/v1/models");
    if (!resp.ok) throw new Error(await errorMessage(resp));
    const ids = ((await resp.json()).data ?? []).map((m) => String(m.id));
    select.replaceChildren(...ids.map((id) => el("option", null, id)));
    if (ids.includes(preferred)) select.value = preferred;
  } catch (e) {
    notice(`could not list the models: ${e.message}`);
  }
}

function requestBody(conv) {
  const body = { messages: [], stream: true, stream_options: { include_usage: true } };
  const model = $("#model").value;
  if (model) body.model = model;
  if (conv.system.trim()) body.messages.push({ role: "system", content: conv.system });
  for (const m of conv.messages) if (m.content) body.messages.push({ role: m.role, content: m.content });
  for (const [name, parse] of NUMBERS) {
    const raw = $("#" + name).value.trim();
    const v = raw === "" ? NaN : parse(raw);
    if (Number.isFinite(v)) body[name] = v; // empty or invalid: the server's default
  }
  return body;
}

// ---------------------------------------------------------------- HTTP: the API key and the stream

function ask(label, { value = "", secret = false, input = true } = {}) {
  const dialog = $("#ask-dialog");
  const field = $("#ask-input");
  $("#ask-label").textContent = label;
  field.hidden = !input;
  field.type = secret ? "password" : "text";
  field.value = value;
  dialog.returnValue = "";
  dialog.showModal();
  if (input) field.select();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "ok") resolve(null);
      else resolve(input ? field.value : true);
    }, { once: true });
  });
}

// One question however many requests got a 401 at once.
function askKey() {
  state.keyAsk ??= ask("This server needs an API key:", { secret: true }).finally(() => {
    state.keyAsk = null;
  });
  return state.keyAsk;
}

// fetch with the session's API key; on a 401, ask for the key once and retry once (a wrong key
// fails this request, and the next request asks again).
async function apiFetch(url, opts = {}) {
  for (let retried = false; ; retried = true) {
    const headers = new Headers(opts.headers);
    const key = sessionStorage.getItem(KEY);
    if (key) headers.set("Authorization", `Bearer ${key}`);
    opts.onSend?.();
    const resp = await fetch(url, { ...opts, headers });
    if (resp.status !== 401 || retried) return resp;
    const entered = await askKey();
    if (!entered || !entered.trim()) return resp;
    sessionStorage.setItem(KEY, entered.trim());
  }
}

async function errorMessage(resp) {
  const text = await resp.text();
  try {
    const err = JSON.parse(text).error;
    return (typeof err === "string" ? err : err?.message) || `HTTP ${resp.status}`;
  } catch {
    return `HTTP ${resp.status}: ${text.slice(0, 200)}`;
  }
}

// The JSON payloads of a server-sent event stream, until its [DONE].
async function* sseData(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      const lines = buf.split("\n");
      buf = lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  } finally {
    reader.cancel().catch(() => {}); // an early end closes the connection: the server cancels the request
  }
}

async function streamReply(body, reply, art, signal) {
  const t = { sent: 0, first: null, deltas: 0, usage: null };
  try {
    const resp = await apiFetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
      onSend: () => (t.sent = performance.now()), // after any key question: TTFT is the server's
    });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    for await (const data of sseData(resp.body)) {
      if (data.error) throw new Error(data.error.message || "the server failed mid-reply");
      if (data.usage) t.usage = data.usage;
      const delta = data.choices?.[0]?.delta ?? {};
      const content = typeof delta.content === "string" ? delta.content : "";
      const reasoning = typeof delta.reasoning_content === "string" ? delta.reasoning_content : "";
      if (!content && !reasoning) continue;
      t.first ??= performance.now();
      t.deltas++;
      reply.content += content;
      reply.reasoning = (reply.reasoning ?? "") + reasoning;
      scheduleUpdate(art, reply);
    }
  } finally {
    if (t.first !== null) reply.stats = replyStats(t, performance.now());
  }
}

function replyStats(t, end) {
  // without usage (a stopped reply) the deltas count the tokens, near enough: one token a delta
  const tokens = t.usage?.completion_tokens ?? t.deltas;
  const secs = (end - t.first) / 1000;
  return {
    tokens, prompt_tokens: t.usage?.prompt_tokens ?? null, ttft_ms: Math.round(t.first - t.sent),
    // tokens after the first over the time after it: the first one's wait is the TTFT
    tps: tokens > 1 && secs > 0 ? Math.round(((tokens - 1) / secs) * 10) / 10 : null,
  };
}

// ---------------------------------------------------------------- sending and stopping

async function send() {
  const prompt = $("#prompt");
  const text = prompt.value;
  if (!text.trim() || state.controller) return;
  notice("");
  const conv = state.current;
  const user = { role: "user", content: text };
  conv.messages.push(user);
  if (!conv.renamed && conv.title === UNTITLED) conv.title = text.trim().split("\n")[0].slice(0, 60);
  const body = requestBody(conv);
  const reply = { role: "assistant", content: "", reasoning: "", model: body.model ?? "" };
  conv.messages.push(reply);
  conv.updated = Date.now();
  prompt.value = "";
  renderList();
  renderMessages();
  const art = $("#messages").lastElementChild;
  saveConvs();
  const controller = new AbortController();
  setBusy(controller);
  try {
    await streamReply(body, reply, art, controller.signal);
  } catch (e) {
    if (e.name === "AbortError") reply.stopped = true;
    else reply.error = e.message;
  } finally {
    finish(conv, user, reply, art);
  }
}

function finish(conv, user, reply, art) {
  setBusy(null);
  if (!reply.content && !reply.reasoning) {
    // nothing came back: take the turn back so the user can resend it (and roles keep alternating)
    conv.messages = conv.messages.filter((m) => m !== user && m !== reply);
    if (state.current === conv) {
      $("#prompt").value ||= user.content;
      renderMessages();
    }
    if (reply.error) notice(reply.error);
  } else if (art.isConnected) {
    cancelAnimationFrame(state.frame);
    state.frame = 0;
    updateView(art, reply);
  }
  saveConvs();
  renderList();
}

function setBusy(controller) {
  const wasOnStop = document.activeElement === $("#stop");
  state.controller = controller;
  $("#send").hidden = !!controller;
  $("#stop").hidden = !controller;
  document.body.classList.toggle("busy", !!controller);
  if (wasOnStop || document.activeElement === document.body) $("#prompt").focus();
}

function stop() {
  state.controller?.abort();
}

function notice(text) {
  $("#notice").textContent = text;
  $("#notice").hidden = !text;
}

// ---------------------------------------------------------------- the narrow-screen menu

function openMenu() {
  $("#app").classList.add("menu-open");
  $("#menu").setAttribute("aria-expanded", "true");
  $("#new-chat").focus();
}

function closeMenu() {
  if (!$("#app").classList.contains("menu-open")) return;
  $("#app").classList.remove("menu-open");
  $("#menu").setAttribute("aria-expanded", "false");
}

// ---------------------------------------------------------------- start

function bind() {
  $("#composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("#prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || $("#ask-dialog").open) return;
    if (state.controller) (e.preventDefault(), stop());
    else closeMenu();
  });
  $("#stop").addEventListener("click", stop);
  $("#new-chat").addEventListener("click", startConv);
  $("#rename").addEventListener("click", renameConv);
  $("#delete").addEventListener("click", deleteConv);
  $("#export").addEventListener("click", exportConv);
  $("#menu").addEventListener("click", openMenu);
  $("#close-menu").addEventListener("click", closeMenu);
  $("#scrim").addEventListener("click", closeMenu);
  $("#settings-form").addEventListener("input", saveSettings);
  $("#settings-form").addEventListener("submit", (e) => e.preventDefault());
  $("#model").addEventListener("change", saveSettings);
  $("#system").addEventListener("input", () => {
    state.current.system = $("#system").value;
    saveConvs();
  });
}

function start() {
  state.convs = loadConvs();
  const saved = localStorage.getItem(CURRENT);
  state.current = state.convs.find((c) => c.id === saved) ?? [...state.convs].sort((a, b) => b.updated - a.updated)[0];
  if (!state.current) state.convs.push((state.current = newConv()));
  const settings = loadSettings();
  bind();
  render();
  loadModels(settings.model);
  $("#prompt").focus();
}

start();

// The page at /: conversations, streaming answers with their probabilities, the settings, and the
// forward-pass views of `llmrun look`. Every text from a model or a user reaches the page as text
// (textContent), except an answer's Markdown, which goes through DOMPurify before it is shown.

import { marked } from "/ui/vendor/marked.esm.js";
import { ApiError, getJSON, postJSON, streamChat } from "/ui/chat.js";
import * as images from "/ui/images.js";
import { colour, percent, prob, reshape, visible } from "/ui/probs.js";
import * as store from "/ui/store.js";

const $ = (id) => document.getElementById(id);
const TOP = 20; // alternatives asked for per token (OpenAI's most)
const SLIDERS = ["temperature", "top_k", "top_p", "min_p"];

const ui = {
  settings: store.loadSettings(),
  conversations: [],
  current: null,
  running: null, // {controller, conversation}
  cursor: null, // {message, token}: the token whose distribution the next-token panel shows
  altsFor: null,
  hideTimer: 0,
  attached: [], // data URLs of the images that go with the next message
  sees: true, // whether the picked model reads images (Ollama's /api/show capabilities say "vision")
};

// --- start -----------------------------------------------------------------------------

async function start() {
  bindSettings();
  bindComposer();
  bindSidebar();
  bindTabs();
  bindAlternatives();
  ui.conversations = await store.conversations();
  ui.current = ui.conversations[0] || null;
  renderConversations();
  renderMessages();
  await loadModels();
}

async function loadModels() {
  let models;
  try {
    models = (await getJSON("/v1/models")).data.map((m) => m.id);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return askKey(loadModels);
    return status(`cannot list the models: ${error.message}`, true);
  }
  const picker = $("model-picker");
  picker.textContent = "";
  for (const name of models) picker.add(new Option(name, name));
  const wanted = (ui.current && ui.current.model) || ui.settings.model;
  picker.value = models.includes(wanted) ? wanted : models[0] || "";
  if (!models.length) status("this server serves no models", true);
  else checkVision();
}

// Whether the picked model reads images: the attach button is off, and says why, when it does not.
async function checkVision() {
  const model = $("model-picker").value;
  let sees = true; // when the server cannot say, it decides (a 400 naming the reason)
  try {
    const shown = await postJSON("/api/show", { model });
    sees = Array.isArray(shown.capabilities) && shown.capabilities.includes("vision");
  } catch { /* keep the button */ }
  if (model !== $("model-picker").value) return;
  ui.sees = sees;
  const label = $("attach-label");
  label.classList.toggle("off", !sees);
  $("attach").disabled = !sees;
  label.title = sees
    ? "Attach images (or paste or drop them here)"
    : `${model} does not read images: serve a vision model with its projector (llmrun serve -m MODEL --mmproj FILE)`;
}

function askKey(retry) {
  const dialog = $("key-dialog");
  $("key-form").onsubmit = () => {
    const key = $("key-input").value.trim();
    if (key) store.setApiKey(key);
    $("key-input").value = "";
    setTimeout(retry, 0);
  };
  if (!dialog.open) dialog.showModal();
}

function status(text, bad = false) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", bad);
}

// --- settings --------------------------------------------------------------------------

function bindSettings() {
  const s = ui.settings;
  for (const name of SLIDERS) {
    const input = $(`set-${name}`);
    input.value = s[name];
    $(`out-${name}`).textContent = shownSetting(name, s[name]);
    input.oninput = () => {
      s[name] = Number(input.value);
      $(`out-${name}`).textContent = shownSetting(name, s[name]);
      store.saveSettings(s);
      renderNext();
    };
  }
  $("set-system").value = s.system;
  $("set-system").oninput = () => { s.system = $("set-system").value; store.saveSettings(s); };
  $("set-seed").value = s.seed ?? "";
  $("set-seed").oninput = () => {
    const v = $("set-seed").value.trim();
    s.seed = v === "" ? null : Math.trunc(Number(v));
    store.saveSettings(s);
  };
  $("set-max_tokens").value = s.max_tokens;
  $("set-max_tokens").oninput = () => {
    const v = Math.trunc(Number($("set-max_tokens").value));
    s.max_tokens = v > 0 ? v : store.DEFAULTS.max_tokens;
    store.saveSettings(s);
  };
  $("show-probs").checked = s.showProbs;
  $("show-probs").onchange = () => { s.showProbs = $("show-probs").checked; store.saveSettings(s); renderMessages(); };
  $("model-picker").onchange = () => {
    s.model = $("model-picker").value;
    store.saveSettings(s);
    if (ui.current) { ui.current.model = s.model; store.save(ui.current); }
    checkVision();
  };
  $("reset-settings").onclick = () => {
    Object.assign(s, { ...store.DEFAULTS, model: s.model, showProbs: s.showProbs, system: s.system });
    store.saveSettings(s);
    bindSettings();
    renderNext();
  };
}

function shownSetting(name, value) {
  if (name === "top_k") return value > 0 ? String(value) : "off";
  if ((name === "top_p" && value >= 1) || (name === "min_p" && value <= 0)) return "off";
  return Number(value).toFixed(2);
}

function sampling() {
  const s = ui.settings;
  const body = { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, min_p: s.min_p, max_tokens: s.max_tokens };
  if (s.seed !== null && Number.isFinite(s.seed)) body.seed = s.seed;
  return body;
}

// --- conversations ---------------------------------------------------------------------

function newConversation() {
  const now = Date.now();
  return { id: store.newId(), title: "New chat", model: $("model-picker").value, created: now, updated: now, messages: [] };
}

async function persist(conversation) {
  conversation.updated = Date.now();
  await store.save(conversation);
  if (!ui.conversations.includes(conversation)) ui.conversations.unshift(conversation);
  ui.conversations.sort((a, b) => b.updated - a.updated);
  renderConversations();
}

function bindSidebar() {
  $("new-chat").onclick = () => {
    if (ui.running) return;
    ui.current = null;
    renderConversations();
    renderMessages();
    $("prompt").focus();
  };
  $("export").onclick = () => {
    const data = { format: "llmrun-conversations", version: 1, conversations: ui.conversations };
    const url = URL.createObjectURL(new Blob([JSON.stringify(data, null, 1)], { type: "application/json" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = `llmrun-conversations-${new Date().toISOString().slice(0, 10)}.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  };
  $("import").onchange = async () => {
    const file = $("import").files[0];
    $("import").value = "";
    if (!file) return;
    try {
      const found = store.importable(JSON.parse(await file.text()));
      for (const c of found) await store.save(c);
      ui.conversations = await store.conversations();
      status(`imported ${found.length} conversation${found.length === 1 ? "" : "s"}`);
      renderConversations();
    } catch (error) {
      status(`cannot import ${file.name}: ${error.message}`, true);
    }
  };
}

function renderConversations() {
  const list = $("conversations");
  list.textContent = "";
  for (const c of ui.conversations) {
    const li = document.createElement("li");
    li.classList.toggle("on", c === ui.current);
    const title = document.createElement("span");
    title.textContent = c.title;
    title.title = `${c.model} · ${new Date(c.updated).toLocaleString()}`;
    li.onclick = () => {
      if (ui.running) return;
      ui.current = c;
      if (c.model && [...$("model-picker").options].some((o) => o.value === c.model)) $("model-picker").value = c.model;
      renderConversations();
      renderMessages();
    };
    const drop = document.createElement("button");
    drop.type = "button";
    drop.className = "drop";
    drop.title = "Delete this conversation";
    drop.textContent = "×";
    drop.onclick = async (e) => {
      e.stopPropagation();
      if (ui.running && ui.running.conversation === c) return;
      await store.remove(c.id);
      ui.conversations = ui.conversations.filter((x) => x !== c);
      if (ui.current === c) { ui.current = null; renderMessages(); }
      renderConversations();
    };
    li.append(title, drop);
    list.append(li);
  }
}

// --- messages --------------------------------------------------------------------------

function renderMessages() {
  const box = $("messages");
  box.textContent = "";
  const messages = ui.current ? ui.current.messages : [];
  if (!messages.length) {
    const empty = document.createElement("div");
    empty.id = "empty";
    empty.className = "dim";
    empty.textContent = "Ask something. Turn on Probabilities to see how sure the model was of each token, and what else it could have said.";
    box.append(empty);
  }
  const last = lastAnswerIndex();
  messages.forEach((m, i) => box.append(m.role === "assistant" ? answerElement(m, i, i === last) : userElement(m, i)));
  box.scrollTop = box.scrollHeight;
  renderNext();
}

function lastAnswerIndex() {
  const messages = ui.current ? ui.current.messages : [];
  for (let i = messages.length - 1; i >= 0; i--) if (messages[i].role === "assistant") return i;
  return -1;
}

function userElement(message, index) {
  const el = document.createElement("div");
  el.className = "msg user";
  if (message.images && message.images.length) {
    const row = document.createElement("div");
    row.className = "images";
    for (const url of message.images) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "an attached image";
      img.dataset.testid = "message-image";
      row.append(img);
    }
    el.append(row);
  }
  const text = document.createElement("div");
  text.className = "text";
  text.textContent = message.content;
  const tools = document.createElement("div");
  tools.className = "tools";
  tools.append(button("Edit", "edit", () => edit(el, index)));
  el.append(text, tools);
  return el;
}

function answerElement(message, index, isLast) {
  const el = document.createElement("div");
  el.className = "msg assistant";
  el.dataset.index = index;
  if (message.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const text = document.createElement("div");
    text.textContent = message.reasoning;
    details.append(summary, text);
    el.append(details);
  }
  const body = document.createElement("div");
  body.className = "body";
  if (isLast) body.dataset.testid = "answer";
  fillBody(body, message, index);
  el.append(body);
  if (message.error) {
    const error = document.createElement("div");
    error.className = "error";
    error.textContent = message.error;
    el.append(error);
  }
  const foot = document.createElement("div");
  foot.className = "tools";
  const stats = document.createElement("span");
  stats.className = "stats dim";
  stats.dataset.testid = isLast ? "answer-stats" : "stats";
  stats.textContent = statsLine(message);
  foot.append(stats);
  if (isLast && !ui.running) foot.append(button("Regenerate", "regenerate", regenerate));
  foot.append(button("Copy", "copy", () => navigator.clipboard && navigator.clipboard.writeText(message.content)));
  el.append(foot);
  return el;
}

function fillBody(body, message, index) {
  body.textContent = "";
  body.classList.toggle("tokens", ui.settings.showProbs && message.tokens.length > 0);
  if (ui.settings.showProbs && message.tokens.length) {
    message.tokens.forEach((t, i) => body.append(tokenElement(t, index, i)));
    const rest = message.content.slice(message.tokens.map((t) => t.t).join("").length);
    if (rest) body.append(document.createTextNode(rest)); // text that came without probabilities
    return;
  }
  body.innerHTML = DOMPurify.sanitize(marked.parse(message.content || ""), { USE_PROFILES: { html: true } });
}

function tokenElement(token, messageIndex, tokenIndex) {
  const span = document.createElement("span");
  const p = prob(token.lp);
  span.className = "atok";
  span.dataset.testid = "token";
  span.dataset.p = p.toFixed(6);
  span.dataset.index = tokenIndex;
  span.style.background = colour(p);
  span.textContent = token.t;
  span.onmouseenter = () => showAlternatives(span, messageIndex, tokenIndex);
  span.onmouseleave = () => hideAlternativesSoon();
  span.onclick = () => showAlternatives(span, messageIndex, tokenIndex);
  return span;
}

function statsLine(m) {
  if (!m.stats) return m.stopped ? "stopped" : "";
  const s = m.stats;
  const parts = [];
  if (s.completion !== undefined) parts.push(`${s.completion} tokens`);
  if (s.prompt !== undefined) parts.push(`prompt ${s.prompt}`);
  if (s.tps) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  if (s.seconds !== undefined) parts.push(`${s.seconds.toFixed(1)} s`);
  if (m.stopped) parts.push("stopped");
  else if (s.finish === "length") parts.push("cut at max tokens");
  if (s.model) parts.push(s.model);
  return parts.join(" · ");
}

function button(label, testid, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "link";
  b.dataset.testid = testid;
  b.textContent = label;
  b.onclick = action;
  return b;
}

function edit(el, index) {
  if (ui.running) return;
  const message = ui.current.messages[index];
  el.textContent = "";
  const area = document.createElement("textarea");
  area.value = message.content;
  area.rows = Math.min(12, Math.max(2, message.content.split("\n").length));
  area.dataset.testid = "edit-text";
  const tools = document.createElement("div");
  tools.className = "tools";
  tools.append(
    button("Save and send", "edit-send", () => {
      if (!area.value.trim()) return;
      message.content = area.value;
      ui.current.messages.splice(index + 1);
      generate(ui.current);
    }),
    button("Cancel", "edit-cancel", renderMessages),
  );
  el.append(area, tools);
  area.focus();
}

// --- generating --------------------------------------------------------------------------

function bindComposer() {
  $("composer").onsubmit = (e) => { e.preventDefault(); send(); };
  $("attach").onchange = () => { attach([...$("attach").files]); $("attach").value = ""; };
  $("prompt").onpaste = (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
    if (files.length) { e.preventDefault(); attach(files); }
  };
  const composer = $("composer");
  composer.ondragover = (e) => { if (ui.sees) { e.preventDefault(); composer.classList.add("drop"); } };
  composer.ondragleave = () => composer.classList.remove("drop");
  composer.ondrop = (e) => {
    composer.classList.remove("drop");
    const files = [...e.dataTransfer.files].filter((f) => f.type.startsWith("image/"));
    if (files.length) { e.preventDefault(); attach(files); }
  };
  $("prompt").onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  };
  $("stop").onclick = () => { if (ui.running) ui.running.controller.abort(); };
}

async function attach(files) {
  if (!ui.sees) return status(`${$("model-picker").value} does not read images`, true);
  for (const file of files) {
    try {
      ui.attached.push(await images.prepare(file));
    } catch (error) {
      status(error.message, true);
    }
  }
  renderAttached();
}

function renderAttached() {
  const box = $("attachments");
  box.textContent = "";
  box.hidden = !ui.attached.length;
  ui.attached.forEach((url, i) => {
    const thumb = document.createElement("div");
    thumb.className = "thumb";
    const img = document.createElement("img");
    img.src = url;
    img.alt = "an image for the next message";
    img.dataset.testid = "attached-image";
    const drop = document.createElement("button");
    drop.type = "button";
    drop.title = "Leave this image out";
    drop.dataset.testid = "unattach";
    drop.textContent = "×";
    drop.onclick = () => { ui.attached.splice(i, 1); renderAttached(); };
    thumb.append(img, drop);
    box.append(thumb);
  });
}

async function send() {
  const text = $("prompt").value;
  if ((!text.trim() && !ui.attached.length) || ui.running) return;
  if (!$("model-picker").value) return status("no model to send to", true);
  $("prompt").value = "";
  if (!ui.current) ui.current = newConversation();
  const c = ui.current;
  if (!c.messages.length) c.title = text.trim().slice(0, 60) || "An image";
  const message = { role: "user", content: text };
  if (ui.attached.length) message.images = ui.attached;
  ui.attached = [];
  renderAttached();
  c.messages.push(message);
  await generate(c);
}

function regenerate() {
  if (ui.running || !ui.current) return;
  const messages = ui.current.messages;
  if (messages.length && messages[messages.length - 1].role === "assistant") messages.pop();
  generate(ui.current);
}

function requestMessages(conversation, upTo, withImages = true) {
  const system = ui.settings.system.trim() ? [{ role: "system", content: ui.settings.system }] : [];
  const shown = (m) => (withImages && m.role === "user" ? images.content(m) : m.content);
  return [...system, ...conversation.messages.slice(0, upTo).map((m) => ({ role: m.role, content: shown(m) }))];
}

// One answer streamed into the conversation: a new one, or (from) the continuation of the last one
// after `prefix` (tokens kept, the chosen alternative last).
async function generate(conversation, prefix = null) {
  const model = $("model-picker").value;
  conversation.model = model;
  let answer;
  const body = { model, ...sampling(), logprobs: true, top_logprobs: TOP, stream_options: { include_usage: true } };
  if (prefix) {
    answer = conversation.messages[conversation.messages.length - 1];
    Object.assign(answer, { tokens: prefix, content: prefix.map((t) => t.t).join(""), stats: null, error: "", stopped: false });
    body.messages = [...requestMessages(conversation, conversation.messages.length - 1), { role: "assistant", content: answer.content }];
    body.continue_final_message = true;
  } else {
    answer = { role: "assistant", content: "", reasoning: "", tokens: [], stats: null };
    body.messages = requestMessages(conversation, conversation.messages.length);
    conversation.messages.push(answer);
  }
  const controller = new AbortController();
  ui.running = { controller, conversation };
  busy(true);
  renderConversations();
  renderMessages();
  const started = performance.now();
  let first = 0, received = 0, usage = null, finish = null, pending = false;
  const draw = () => {
    pending = false;
    const body = document.querySelector('[data-testid="answer"]');
    if (!body || ui.current !== conversation) return;
    fillBody(body, answer, conversation.messages.length - 1);
    const reasoning = body.parentElement.querySelector(".reasoning div");
    if (reasoning) reasoning.textContent = answer.reasoning;
    else if (answer.reasoning) renderMessages();
    $("messages").scrollTop = $("messages").scrollHeight;
  };
  try {
    for await (const chunk of streamChat(body, controller.signal)) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.content || delta.reasoning_content) { if (!first) first = performance.now(); }
        if (delta.reasoning_content) answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
        if (delta.content) answer.content += delta.content;
        for (const entry of (choice.logprobs && choice.logprobs.content) || []) {
          received += 1;
          answer.tokens.push({ t: entry.token, lp: entry.logprob, top: (entry.top_logprobs || []).map((a) => [a.token, a.logprob]) });
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      if (!pending) { pending = true; requestAnimationFrame(draw); }
    }
  } catch (error) {
    if (error.name === "AbortError") answer.stopped = true;
    else if (error instanceof ApiError && error.status === 401) { answer.error = "the server needs an API key"; askKey(() => {}); }
    else answer.error = error.message;
  }
  const ended = performance.now();
  const completion = usage ? usage.completion_tokens : received;
  const decoding = first ? (ended - first) / 1000 : 0;
  answer.stats = {
    completion: prefix && usage ? completion + prefix.length : completion,
    prompt: usage ? usage.prompt_tokens : undefined,
    tps: decoding > 0 && completion > 1 ? (completion - 1) / decoding : 0,
    seconds: (ended - started) / 1000,
    finish,
    model,
  };
  ui.running = null;
  busy(false);
  await persist(conversation);
  renderMessages();
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  document.body.dataset.busy = on ? "yes" : "no"; // (a hook for tests and tools: "no" once an answer is kept)
  status(on ? "answering…" : "");
}

// --- alternatives and the next-token panel -------------------------------------------------

function bindAlternatives() {
  const alts = $("alts");
  alts.onmouseenter = () => clearTimeout(ui.hideTimer);
  alts.onmouseleave = () => hideAlternativesSoon();
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") alts.hidden = true; });
}

function showAlternatives(span, messageIndex, tokenIndex) {
  clearTimeout(ui.hideTimer);
  const message = ui.current.messages[messageIndex];
  const token = message.tokens[tokenIndex];
  ui.cursor = { message: messageIndex, token: tokenIndex };
  renderNext();
  const alts = $("alts");
  alts.textContent = "";
  const head = document.createElement("div");
  head.className = "alts-head";
  head.textContent = `${percent(prob(token.lp))} chosen · click another to continue from it`;
  const list = document.createElement("ol");
  for (const [text, logprob] of token.top) {
    const li = document.createElement("li");
    li.dataset.testid = "alternative";
    li.dataset.token = text;
    li.dataset.p = prob(logprob).toFixed(6);
    li.classList.toggle("chosen", text === token.t);
    const word = document.createElement("code");
    word.textContent = visible(text);
    const p = document.createElement("span");
    p.className = "p";
    p.textContent = percent(prob(logprob));
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${Math.max(1, 100 * prob(logprob))}%`;
    bar.style.background = colour(prob(logprob));
    li.append(word, p, bar);
    if (!ui.running && messageIndex === lastAnswerIndex()) {
      li.onclick = () => continueFrom(messageIndex, tokenIndex, text, logprob);
      li.classList.add("pick");
    }
    list.append(li);
  }
  alts.append(head, list);
  alts.hidden = false;
  const r = span.getBoundingClientRect();
  const width = alts.offsetWidth, height = alts.offsetHeight;
  alts.style.left = `${Math.max(8, Math.min(window.innerWidth - width - 8, r.left))}px`;
  alts.style.top = `${r.bottom + height + 8 > window.innerHeight ? Math.max(8, r.top - height - 4) : r.bottom + 4}px`;
}

function hideAlternativesSoon() {
  clearTimeout(ui.hideTimer);
  ui.hideTimer = setTimeout(() => { $("alts").hidden = true; }, 350);
}

function continueFrom(messageIndex, tokenIndex, text, logprob) {
  if (ui.running) return;
  $("alts").hidden = true;
  const message = ui.current.messages[messageIndex];
  const chosen = message.tokens[tokenIndex];
  const prefix = [...message.tokens.slice(0, tokenIndex), { t: text, lp: logprob, top: chosen.top, picked: true }];
  generate(ui.current, prefix);
}

function renderNext() {
  const box = $("next");
  const c = ui.current;
  const cursor = ui.cursor;
  const message = c && cursor ? c.messages[cursor.message] : null;
  const token = message && message.tokens ? message.tokens[cursor.token] : null;
  if (!token) return;
  $("next-where").textContent = `token ${cursor.token + 1} of answer`;
  box.textContent = "";
  const rows = reshape(token.top.map(([t, lp]) => ({ token: t, logprob: lp })), ui.settings);
  const table = document.createElement("table");
  const head = table.insertRow();
  for (const h of ["token", "model", "with these settings"]) { const th = document.createElement("th"); th.textContent = h; head.append(th); }
  for (const r of rows) {
    const tr = table.insertRow();
    tr.classList.toggle("chosen", r.token === token.t);
    tr.classList.toggle("cut", Boolean(r.cut));
    Object.assign(tr.dataset, { testid: "next-row", token: r.token, after: r.after.toFixed(6), cut: r.cut });
    const word = tr.insertCell();
    word.textContent = visible(r.token);
    const model = tr.insertCell();
    model.append(barOf(r.p, percent(r.p)));
    const after = tr.insertCell();
    after.append(r.cut ? cutNote(r.cut) : barOf(r.after, percent(r.after)));
  }
  const note = document.createElement("p");
  note.className = "dim small";
  note.textContent = `The ${rows.length} most likely tokens at this point, as the server reported them (model: temperature 1). ` +
    "With these settings: the sampler chain in llama.cpp's order — top-k, top-p, min-p, then temperature — over these tokens.";
  box.append(table, note);
}

function barOf(p, label) {
  const wrap = document.createElement("span");
  wrap.className = "pbar";
  const fill = document.createElement("span");
  fill.style.width = `${Math.max(0.5, 100 * p)}%`;
  fill.style.background = colour(p);
  const text = document.createElement("span");
  text.textContent = label;
  wrap.append(fill, text);
  return wrap;
}

function cutNote(reason) {
  const span = document.createElement("span");
  span.className = "dim small";
  span.textContent = `cut by ${reason}`;
  return span;
}

// --- inside the model (llmrun look) ------------------------------------------------------------

function bindTabs() {
  for (const tab of document.querySelectorAll("[data-tab]")) {
    tab.onclick = () => {
      for (const t of document.querySelectorAll("[data-tab]")) t.classList.toggle("on", t === tab);
      $("chat-view").hidden = tab.dataset.tab !== "chat";
      $("inside-view").hidden = tab.dataset.tab !== "inside";
    };
  }
  $("look-run").onclick = look;
}

async function look() {
  const c = ui.current;
  const model = $("model-picker").value;
  let upTo = c ? c.messages.length : 0;
  while (upTo > 0 && c.messages[upTo - 1].role !== "user") upTo -= 1;
  const draft = $("prompt").value.trim();
  const messages = upTo ? requestMessages(c, upTo, false) : draft ? [...requestMessages({ messages: [] }, 0), { role: "user", content: draft }] : null;
  if (!messages) { $("look-status").textContent = "Send a message first (or type one): the views show the prompt the model reads."; return; }
  const withImages = upTo && c.messages.slice(0, upTo).some((m) => m.images && m.images.length);
  $("look-run").disabled = true;
  $("look-status").textContent = "Looking inside… (one forward pass with its attention and every layer's output captured)";
  try {
    const report = await postJSON("/llmrun/look", { model, messages });
    llmrunLook.mount($("look-root"), report);
    $("look-status").textContent = `${report.tokens.length} tokens · capture ${report.seconds.capture.toFixed(2)} s, lens ${report.seconds.lens.toFixed(2)} s` +
      (withImages ? " · the conversation's text only: the views do not capture images" : "");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) askKey(look);
    $("look-status").textContent = `cannot look inside: ${error.message}`;
  } finally {
    $("look-run").disabled = false;
  }
}

start();

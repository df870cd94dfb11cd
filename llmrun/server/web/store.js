// Conversations in the browser's IndexedDB (one record each), settings in localStorage, the API key
// in sessionStorage (this tab only). Nothing leaves the browser except the requests the page makes.

import { isImageDataUrl } from "/ui/images.js";

const DB = "llmrun";
const STORE = "conversations";
const SETTINGS = "llmrun.settings";
const KEY = "llmrun.key";

export const DEFAULTS = Object.freeze({
  model: "",
  system: "",
  temperature: 0.8,
  top_k: 40,
  top_p: 0.95,
  min_p: 0.05,
  seed: null,
  max_tokens: 1024,
  showProbs: false,
});

function database() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(DB, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(STORE, { keyPath: "id" });
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

async function transaction(mode, work) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    const result = work(tx.objectStore(STORE));
    tx.oncomplete = () => { db.close(); resolve(result && "result" in result ? result.result : undefined); };
    tx.onerror = () => { db.close(); reject(tx.error); };
    tx.onabort = () => { db.close(); reject(tx.error); };
  });
}

export async function conversations() {
  const all = (await transaction("readonly", (s) => s.getAll())) || [];
  return all.sort((a, b) => b.updated - a.updated);
}

export const save = (conversation) => transaction("readwrite", (s) => { s.put(conversation); });
export const remove = (id) => transaction("readwrite", (s) => { s.delete(id); });

export function loadSettings() {
  try {
    const saved = JSON.parse(localStorage.getItem(SETTINGS) || "{}");
    return { ...DEFAULTS, ...(saved && typeof saved === "object" ? saved : {}) };
  } catch {
    return { ...DEFAULTS };
  }
}

export const saveSettings = (settings) => localStorage.setItem(SETTINGS, JSON.stringify(settings));
export const apiKey = () => sessionStorage.getItem(KEY) || "";
export const setApiKey = (key) => sessionStorage.setItem(KEY, key);

const ROLES = new Set(["system", "user", "assistant"]);

// Conversations from an exported file, checked field by field: what does not fit is left out.
export function importable(data) {
  const list = Array.isArray(data) ? data : data && Array.isArray(data.conversations) ? data.conversations : null;
  if (!list) throw new Error("not an llmrun export: expected {\"conversations\": [...]}");
  const out = [];
  for (const c of list) {
    if (!c || typeof c !== "object" || !Array.isArray(c.messages)) continue;
    const messages = c.messages
      .filter((m) => m && ROLES.has(m.role) && typeof m.content === "string")
      .map((m) => ({
        role: m.role,
        content: m.content,
        ...(m.role === "user" && Array.isArray(m.images) && m.images.some(isImageDataUrl)
          ? { images: m.images.filter(isImageDataUrl).slice(0, 16) } : {}),
        reasoning: typeof m.reasoning === "string" ? m.reasoning : "",
        tokens: Array.isArray(m.tokens) ? m.tokens.filter(validToken) : [],
        stats: m.stats && typeof m.stats === "object" ? m.stats : null,
      }));
    out.push({
      id: typeof c.id === "string" && c.id ? c.id : newId(),
      title: typeof c.title === "string" ? c.title.slice(0, 200) : "Imported",
      model: typeof c.model === "string" ? c.model : "",
      created: Number.isFinite(c.created) ? c.created : Date.now(),
      updated: Number.isFinite(c.updated) ? c.updated : Date.now(),
      messages,
    });
  }
  return out;
}

function validToken(t) {
  return t && typeof t.t === "string" && Number.isFinite(t.lp) && Array.isArray(t.top);
}

export const newId = () => (crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`);

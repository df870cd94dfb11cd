// The OpenAI API as the page calls it: JSON requests, and chat completions streamed as server-sent events.

import { apiKey } from "/ui/store.js";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers() {
  const key = apiKey();
  return { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) };
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = (body.error && (body.error.message || body.error)) || message;
  } catch { /* not JSON */ }
  return new ApiError(response.status, String(message));
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function postJSON(path, body, signal) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body), signal });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// Each chunk of a streamed chat completion; an error event mid-stream is thrown.
export async function* streamChat(body, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(), body: JSON.stringify({ ...body, stream: true }), signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue; // a comment (keep-alive ping)
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk.error.message || String(chunk.error));
      yield chunk;
    }
  }
}

// codechat's chat page: a multi-turn conversation over the server's own /v1/chat/completions,
// streamed (server-sent events), with function calls and their responses shown as such.
// When the model calls a function, the next thing you send is that function's response.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { history: [], pendingCall: null, controller: null, model: null };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function errorOf(response) {
  const body = await response.json().catch(() => ({}));
  return new Error(body.error ? body.error.message : `HTTP ${response.status}`);
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) throw await errorOf(r);
    const card = (await r.json()).data[0];
    state.model = card.id;
    $("model").textContent = `${card.id} · context ${card.max_model_len} tokens`;
    $("max-tokens").max = card.max_model_len;
  } catch (e) {
    $("model").textContent = "not connected: " + e.message;
  }
}

function bubble(kind, label, text) {
  const div = document.createElement("div");
  div.className = "msg " + kind;
  const role = document.createElement("span");
  role.className = "role";
  role.textContent = label;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.append(role, body);
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function callText(call) {
  let args = call.function.arguments;
  try { args = JSON.stringify(JSON.parse(args)); } catch (e) { /* shown as sent */ }
  return `${call.function.name}(${args})`;
}

function tools() {
  const raw = $("tools").value.trim();
  if (!raw) return null;
  let list;
  try { list = JSON.parse(raw); } catch (e) { throw new Error("Tools: not valid JSON: " + e.message); }
  if (!Array.isArray(list)) list = [list];
  return list.map((t) => (t.type === "function" ? t : { type: "function", function: t }));
}

// Read server-sent events from a fetch response, calling onData with each decoded data object.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new Error(obj.error.message);
        onData(obj);
      }
    }
  }
}

async function complete() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.history);
  const body = {
    model: state.model || "codechat", messages, stream: true, stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
  };
  if ($("max-tokens").value) body.max_tokens = Number($("max-tokens").value);  // empty: what the context leaves
  const declared = tools();
  if (declared) body.tools = declared;

  const div = bubble("assistant", "assistant", "");
  const text = div.querySelector(".text");
  div.dataset.chunks = "0";
  let content = "", call = null, finish = null, usage = null, failed = false;
  state.controller = new AbortController();
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!r.ok) throw await errorOf(r);
    await readEvents(r, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        const d = c.delta || {};
        if (d.content) {
          content += d.content;
          text.textContent = content;
          div.dataset.chunks = String(Number(div.dataset.chunks) + 1);
          div.scrollIntoView({ block: "end" });
        }
        for (const tc of d.tool_calls || []) {
          call = call || { id: "", type: "function", function: { name: "", arguments: "" } };
          if (tc.id) call.id = tc.id;
          if (tc.function && tc.function.name) call.function.name += tc.function.name;
          if (tc.function && tc.function.arguments) call.function.arguments += tc.function.arguments;
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
    });
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped"; else { showError(e.message); failed = true; }
  } finally {
    state.controller = null;
  }
  if (failed && !content && !call) {
    div.remove();
    return;
  }
  if (content || call) {
    const msg = { role: "assistant", content: content || null };
    if (call) msg.tool_calls = [call];
    state.history.push(msg);
  }
  if (call) {  // shown as a call: in the reply's own bubble when the reply is only the call
    const shown = content ? bubble("call", "", "") : div;
    shown.className = "msg call";
    shown.querySelector(".role").textContent = "function call";
    shown.querySelector(".text").textContent = callText(call);
    state.pendingCall = call;
    $("input").placeholder = `The response of ${call.function.name} (JSON or text), sent back to the model`;
  }
  const note = document.createElement("span");
  note.className = "finish";
  note.textContent = `finish: ${finish || "none"}` + (usage ? ` · ${usage.completion_tokens} tokens` : "");
  div.append(note);
  div.dataset.finish = finish || "";
  div.dataset.done = "true";
}

function busy(on) {
  $("send").disabled = on;
  $("stop").hidden = !on;
}

async function send(event) {
  event.preventDefault();
  const input = $("input");
  const text = input.value;
  if (!text.trim() || state.controller) return;
  showError("");
  try { tools(); } catch (e) { showError(e.message); return; }
  if (state.pendingCall) {
    state.history.push({ role: "tool", tool_call_id: state.pendingCall.id, content: text });
    bubble("response", "function response", text);
    state.pendingCall = null;
    input.placeholder = "Message (Enter sends, Shift+Enter for a new line)";
  } else {
    state.history.push({ role: "user", content: text });
    bubble("user", "you", text);
  }
  input.value = "";
  busy(true);
  try { await complete(); } finally { busy(false); }
}

function reset() {
  if (state.controller) state.controller.abort();
  state.history = [];
  state.pendingCall = null;
  $("messages").replaceChildren();
  showError("");
}

$("composer").addEventListener("submit", send);
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("reset").addEventListener("click", reset);
$("api-key").value = localStorage.getItem("codechat-api-key") || "";
$("api-key").addEventListener("change", () => { localStorage.setItem("codechat-api-key", $("api-key").value); loadModel(); });
loadModel();

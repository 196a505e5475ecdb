// The agent UI's page: starts runs, follows their events (server-sent events, see app.py) and
// draws them.  Every piece of model or tool text goes in through textContent, never innerHTML.
"use strict";

const log = document.getElementById("log");
const statusLine = document.getElementById("status");
const buttons = {
  run: document.getElementById("run"),
  stop: document.getElementById("stop"),
  retry: document.getElementById("retry"),
};
const traceLink = document.getElementById("trace-link");
let run = null; // {id, agent, source, bubble, cards: Map(card id -> elements)}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function entry(className, label, text) {
  const node = el("div", "entry " + className);
  node.append(el("div", "label", label));
  if (text !== undefined) node.append(el("div", "text", text));
  log.append(node);
  node.scrollIntoView({block: "end"});
  return node;
}

function setRunning(running) {
  buttons.run.disabled = running;
  buttons.stop.disabled = !running;
  buttons.retry.disabled = running || run === null;
  for (const button of log.querySelectorAll(".retry-step")) button.disabled = running;
}

function markReplayed(node, data) {
  // A step a retry replayed from the run it retries: shown, but not run again.
  if (!data.replayed || node.classList.contains("replayed")) return;
  node.classList.add("replayed");
  node.querySelector(".label").textContent += " · replayed";
}

function retryButton(node, step, call) {
  // Retries the run from this step (a model turn, or a call of one): only a ReAct run can.
  if (run.agent !== "react") return;
  const owner = run.id;
  const button = el("button", "retry-step", "Retry from here");
  button.type = "button";
  button.title = "a new run from this step; the steps before it are replayed, not run again";
  button.disabled = buttons.run.disabled;
  button.addEventListener("click", () => start(post(`/api/runs/${owner}/retry`, {step, call})));
  node.append(button);
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify(body || {}),
  });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function bubble() {
  // The assistant turn in progress: tokens go here until its model_call event ends it.
  if (!run.bubble) {
    run.bubble = entry("assistant", "assistant", "");
  }
  return run.bubble.querySelector(".text");
}

function card(id, name, agent) {
  if (id && run.cards.has(id)) return run.cards.get(id);
  const node = entry("card", agent ? agent + " · tool call" : "tool call");
  node.dataset.status = "pending";
  if (id) node.id = "card-" + id;
  const parts = {
    node,
    name: el("div", "card-name", name),
    args: el("pre", "card-args", ""),
    approval: el("div", "approval"),
    result: el("pre", "card-result"),
    meta: el("div", "card-meta", ""),
  };
  parts.approval.hidden = true;
  parts.result.hidden = true;
  node.append(parts.name, parts.args, parts.approval, parts.result, parts.meta);
  if (id) run.cards.set(id, parts);
  return parts;
}

const handlers = {
  run_start(data) {
    run.agent = data.agent;
    statusLine.textContent = "running " + data.agent;
    if (data.retry_of) {
      const from = "step " + data.from_step + (data.from_call === null ? "" : " call " + data.from_call);
      entry("retry", "retry", "of run " + data.retry_of + " from " + from);
    }
  },
  token(data) {
    bubble().textContent += data.text;
  },
  tool_call(data) {
    card(data.card, data.name, data.agent);
  },
  tool_args(data) {
    card(data.card).args.textContent += data.text;
  },
  model_call(data) {
    const text = bubble();
    if (!text.textContent && data.text) text.textContent = data.text;
    if (data.agent) run.bubble.querySelector(".label").textContent = data.agent;
    if (text.textContent || run.agent === "react") {
      run.bubble.dataset.step = data.step;
      markReplayed(run.bubble, data);
      retryButton(run.bubble, data.step, null);
    } else {
      run.bubble.remove();
    }
    run.bubble = null;
  },
  approval_request(data) {
    const parts = card(data.card, data.name);
    parts.node.dataset.status = "awaiting_approval";
    parts.approval.replaceChildren(
      el("span", "", "approve this call? (denied after " + data.timeout_s + " s)"),
    );
    for (const [label, approve] of [["Approve", true], ["Deny", false]]) {
      const button = el("button", approve ? "approve" : "deny", label);
      button.type = "button";
      button.addEventListener("click", () => {
        for (const b of parts.approval.querySelectorAll("button")) b.disabled = true;
        post(`/api/runs/${run.id}/approvals/${data.approval}`, {approve}).catch((e) => {
          statusLine.textContent = e.message;
        });
      });
      parts.approval.append(button);
    }
    parts.approval.hidden = false;
  },
  approval_result(data) {
    const parts = card(data.card, "");
    const verdict = data.approved ? "approved" : "denied";
    parts.approval.replaceChildren(el("span", "verdict", verdict + " (" + data.by + ")"));
    parts.node.dataset.status = data.approved ? "approved" : "denied";
  },
  tool_result(data) {
    const parts = card(data.card, data.name, data.agent);
    parts.node.dataset.status = data.status;
    parts.result.textContent = data.content;
    parts.result.hidden = false;
    parts.meta.textContent =
      data.status + " · " + (data.latency_s * 1000).toFixed(1) + " ms" +
      (data.attempts > 1 ? " · " + data.attempts + " attempts" : "");
    markReplayed(parts.node, data);
    if (data.call !== null && data.call !== undefined) retryButton(parts.node, data.step, data.call);
  },
  decision(data) {
    const text = data.decision + (data.detail ? ": " + data.detail : "");
    markReplayed(entry("decision", "decision", text), data);
  },
  message(data) {
    entry(
      "message",
      data.sender + " → " + data.recipients.join(", ") + " (" + data.act + ")",
      data.content,
    );
  },
  run_end(data) {
    const node = entry("end", "run end · " + data.stop_reason, data.answer || data.detail);
    node.id = "run-end";
    finish("finished: " + data.stop_reason);
  },
  error(data) {
    entry("error", "error", data.error);
    finish("crashed");
  },
};

function finish(text) {
  run.source.close();
  statusLine.textContent = text;
  setRunning(false);
}

function follow(started) {
  run = {id: started.id, agent: null, source: null, bubble: null, cards: new Map()};
  entry("user", "task", started.task);
  traceLink.href = `/runs/${started.id}/trace`;
  traceLink.hidden = false;
  setRunning(true);
  run.source = new EventSource(`/api/runs/${started.id}/events`);
  for (const [type, handle] of Object.entries(handlers)) {
    run.source.addEventListener(type, (event) => handle(JSON.parse(event.data)));
  }
}

function start(promise) {
  promise.then(follow).catch((e) => {
    statusLine.textContent = e.message;
  });
}

document.getElementById("task-form").addEventListener("submit", (event) => {
  event.preventDefault();
  start(post("/api/runs", {task: document.getElementById("task").value}));
});
buttons.stop.addEventListener("click", () => post(`/api/runs/${run.id}/stop`));
buttons.retry.addEventListener("click", () => start(post(`/api/runs/${run.id}/retry`)));

// rollgate dashboard: a browser ES module (built by the gateway's build into dist/dashboard/app.js),
// no network beyond this gateway. Reads the task API (/v1/tasks…), the session API and the
// dashboard's /v1/stats/* endpoints. Wire types come from @rollgate/protocol (types only: nothing
// of it is loaded in the browser).

import type { DecodedTrajectory, Preflight, TaskError, TaskEvent, TaskRecord, TaskResult, TaskStatus } from "@rollgate/protocol";

// The /v1/stats/* aggregates are open objects in the API document: what this page reads of them.
interface Overview {
  by_status: Partial<Record<TaskStatus, number>>;
  reward: { mean: number | null };
  usage: TaskResult["usage"];
  weight_version: string | null;
}
interface Series {
  bucket_s: number;
  buckets: { t: string; llm_calls: number; tokens_per_s: number }[];
}
interface Ranks {
  engines?: { index: number; kind: string; url: string; profile: string; preflight: Preflight | null }[];
  ranks: { engine: number; dp_rank: number; kind: string; url: string; sessions: number; healthy: boolean; status: number | null; latency_ms: number; error?: string }[];
}
interface Groups {
  range: { min: number; max: number };
  groups: { group_id: string; tasks: number; ended: number; rewards: number[]; mean: number | null; std: number | null; histogram: number[] }[];
}
interface ErrorJson {
  error?: { type?: string; message?: string };
}

const KEY_STORAGE = "rollgate.apiKey";
const REFRESH_MS = 3000;
let timer: ReturnType<typeof setTimeout> | undefined;
let streamAbort: AbortController | null = null;

// ── helpers ────────────────────────────────────────────────────────────────────────────

/** An element the page (index.html) must have. */
function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`the dashboard page has no #${id}`);
  return el as T;
}

const view = byId("view");

type Leaf = Node | string | number | null | undefined | false;
type Child = Leaf | Leaf[];
type Attrs = Record<string, string | number | boolean | null | undefined | ((e: Event) => void)>;

function h(tag: string, attrs: Attrs = {}, ...children: Child[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = String(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  return el;
}

function svg(tag: string, attrs: Record<string, string | number> = {}, ...children: Child[]): SVGElement {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const fmt = {
  num: (n: number | null | undefined, d = 0) => (n === null || n === undefined || Number.isNaN(n) ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d })),
  reward: (r: number | null | undefined) => (r === null || r === undefined ? "–" : Number(r).toFixed(3)),
  ms: (ms: number | null | undefined) => (ms === null || ms === undefined ? "–" : ms < 1000 ? `${Math.round(ms)} ms` : ms < 60_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.floor(ms / 60000)}m ${Math.round((ms % 60000) / 1000)}s`),
  time: (iso: string | null | undefined) => (iso ? new Date(iso).toLocaleTimeString([], { hour12: false }) : "–"),
  ago: (iso: string | null | undefined) => {
    if (!iso) return "–";
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    return s < 60 ? `${Math.round(s)}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
  },
};

const badge = (status: string) => h("span", { class: `badge ${status}` }, status.replace("_", " "));

function apiKey(): string {
  return localStorage.getItem(KEY_STORAGE) || "";
}

class ApiError extends Error {
  readonly status: number;
  readonly type: string | undefined;
  constructor(status: number, body: ErrorJson | null) {
    super(body?.error?.message ?? `HTTP ${status}`);
    this.status = status;
    this.type = body?.error?.type;
  }
}

function authHeaders(headers: Record<string, string> = {}): Record<string, string> {
  const key = apiKey();
  if (key) headers.authorization = `Bearer ${key}`;
  return headers;
}

async function request(path: string): Promise<Response> {
  const res = await fetch(path, { headers: authHeaders() });
  setConn(true);
  if (!res.ok) {
    let body: ErrorJson | null = null;
    try {
      body = (await res.json()) as ErrorJson;
    } catch {
      /* not JSON */
    }
    if (res.status === 401) askKey(true);
    throw new ApiError(res.status, body);
  }
  return res;
}

/** GETs a JSON route of this gateway; its type is what the route answers. */
async function api<T>(path: string): Promise<T> {
  return (await (await request(path)).json()) as T;
}

async function apiText(path: string): Promise<string> {
  return (await request(path)).text();
}

function setConn(ok: boolean, message?: string) {
  const el = byId("conn");
  el.className = `pill ${ok ? "ok" : "bad"}`;
  el.textContent = ok ? "connected" : message ?? "unreachable";
}

function askKey(required: boolean) {
  const dialog = byId<HTMLDialogElement>("key-dialog");
  if (dialog.open) return;
  byId<HTMLInputElement>("key-input").value = apiKey();
  if (required) setConn(false, "API key needed");
  dialog.showModal();
}

byId("key-btn").addEventListener("click", () => askKey(false));
byId<HTMLDialogElement>("key-dialog").addEventListener("close", () => {
  if (byId<HTMLDialogElement>("key-dialog").returnValue === "save") {
    localStorage.setItem(KEY_STORAGE, byId<HTMLInputElement>("key-input").value.trim());
    void route();
  }
});

function errorBox(err: unknown) {
  if (err instanceof TypeError) setConn(false);
  const message = err instanceof Error ? err.message : String(err);
  return h("div", { class: "error-box" }, err instanceof ApiError ? `${err.type ?? "error"}: ${message}` : `cannot reach the gateway: ${message}`);
}

// ── charts (inline SVG) ────────────────────────────────────────────────────────────────

function barChart(values: number[], { color = "#5b8def", labels = [] as string[], unit = "" } = {}) {
  const W = 600, H = 150, L = 38, B = 18, T = 8;
  const max = Math.max(1e-9, ...values);
  const n = Math.max(1, values.length);
  const bw = (W - L) / n;
  const el = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  el.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W, y2: H - B }));
  for (const f of [0.5, 1]) {
    const y = H - B - (H - B - T) * f;
    el.append(svg("line", { class: "axis", x1: L, y1: y, x2: W, y2: y, "stroke-dasharray": "3 4" }));
    el.append(svg("text", { x: 2, y: y + 3 }, fmt.num(max * f, max * f < 10 ? 1 : 0)));
  }
  values.forEach((v, i) => {
    const bh = ((H - B - T) * v) / max;
    const rect = svg("rect", { x: L + i * bw + 1, y: H - B - bh, width: Math.max(1, bw - 2), height: bh, fill: color, rx: 1 });
    rect.append(svg("title", {}, `${labels[i] ?? ""}  ${fmt.num(v, 1)}${unit}`));
    el.append(rect);
  });
  const step = Math.max(1, Math.ceil(n / 6));
  labels.forEach((lab, i) => {
    if (i % step === 0) el.append(svg("text", { x: L + i * bw, y: H - 4 }, lab));
  });
  return el;
}

// ── overview ───────────────────────────────────────────────────────────────────────────

let statusFilter = "";
const groupFilter = () => new URLSearchParams(location.hash.split("?")[1] ?? "").get("group");

async function renderOverview() {
  const group = groupFilter();
  const [overview, series, ranks, groups, tasks] = await Promise.all([
    api<Overview>("/v1/stats/overview"),
    api<Series>("/v1/stats/timeseries?minutes=15&bucket_s=15"),
    api<Ranks>("/v1/stats/ranks"),
    api<Groups>("/v1/stats/groups?limit=12"),
    api<{ tasks: TaskRecord[] }>(`/v1/tasks?limit=50${statusFilter ? `&status=${statusFilter}` : ""}${group ? `&group_id=${encodeURIComponent(group)}` : ""}`),
  ]);
  byId("weight").textContent = `weights: ${overview.weight_version ?? "–"}`;
  const s = overview.by_status;
  const cards = h(
    "section",
    { class: "grid cards", id: "cards" },
    ([
      ["queued", s.queued, "queued"],
      ["running", s.running, "running"],
      ["completed", s.completed, "completed"],
      ["failed", (s.failed ?? 0) + (s.timed_out ?? 0), "failed / timed out"],
      ["", s.cancelled, "cancelled"],
      ["", fmt.reward(overview.reward.mean), "mean reward"],
      ["", fmt.num(overview.usage.llm_calls), "LLM calls"],
      ["", fmt.num(overview.usage.completion_tokens), "tokens generated"],
    ] satisfies [string, Child, string][]).map(([cls, value, label]) => h("div", { class: `panel card ${cls}` }, h("div", { class: "label" }, label), h("div", { class: "value" }, value ?? 0))),
  );

  const labels = series.buckets.map((b) => fmt.time(b.t).slice(0, 5));
  const charts = h(
    "section",
    { class: "grid two" },
    h("div", { class: "panel", id: "chart-tokens" }, h("h2", {}, "Tokens / s"), barChart(series.buckets.map((b) => b.tokens_per_s), { labels, unit: " tok/s" }), h("div", { class: "legend" }, `completion tokens per second, ${series.bucket_s}s buckets, last 15 min`)),
    h("div", { class: "panel", id: "chart-calls" }, h("h2", {}, "LLM calls"), barChart(series.buckets.map((b) => b.llm_calls), { labels, color: "#a371f7" }), h("div", { class: "legend" }, `calls per ${series.bucket_s}s bucket`)),
  );

  const maxLoad = Math.max(1, ...ranks.ranks.map((r) => r.sessions));
  const rankPanel = h(
    "div",
    { class: "panel", id: "ranks" },
    h("h2", {}, "Engine ranks"),
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, h("th", {}, "rank"), h("th", {}, "engine"), h("th", {}, "health"), h("th", { class: "num" }, "sessions"), h("th", {}, "load"))),
      h(
        "tbody",
        {},
        ranks.ranks.map((r) =>
          h(
            "tr",
            {},
            h("td", { class: "mono" }, `${r.engine}:${r.dp_rank}`),
            h("td", { class: "mono muted" }, `${r.kind} ${r.url}`),
            h("td", {}, h("span", { class: `dot ${r.healthy ? "ok" : "bad"}` }), r.healthy ? `ok · ${r.latency_ms} ms` : r.error ?? `HTTP ${r.status}`),
            h("td", { class: "num" }, r.sessions),
            h("td", {}, h("div", { class: "bar" }, h("span", { style: `width:${(100 * r.sessions) / maxLoad}%` }))),
          ),
        ),
      ),
    ),
  );

  // Each engine's preflight (GET /admin/engines has the full report): what will hold before a run.
  const yesNo = (v: boolean | null | undefined, yes: string, no: string) => (v === null || v === undefined ? "–" : v ? yes : no);
  const enginePanel = h(
    "div",
    { class: "panel", id: "engines" },
    h("h2", {}, "Engines (preflight)"),
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, h("th", {}, "engine"), h("th", {}, "profile"), h("th", {}, "vocab"), h("th", {}, "token-in"), h("th", {}, "tool turns"), h("th", {}, "reasoning at new user turn"), h("th", {}, "abort pause"))),
      h(
        "tbody",
        {},
        (ranks.engines ?? []).map((e) => {
          const p = e.preflight;
          return h(
            "tr",
            {},
            h("td", { class: "mono muted" }, `${e.index} ${e.kind} ${e.url}`),
            h("td", { class: "mono" }, e.profile),
            h("td", { class: "num" }, p ? (p.vocab_size ?? "unbounded") : "…"),
            h("td", { title: p?.token_in.why ?? "" }, p ? (p.token_in.available ? `yes (${p.token_in.route})` : "no") : "…"),
            h("td", { title: p?.tool_turn.detail ?? "" }, p ? yesNo(p.tool_turn.round_trips, "round-trip", "re-render differently") : "…"),
            h("td", { title: p?.reasoning.detail ?? "" }, p ? yesNo(p.reasoning.dropped_at_user_turn, "dropped", "kept") : "…"),
            h("td", { class: "mono", title: p?.pause.why ?? "" }, p ? (p.pause.abort_mode ?? "–") : "…"),
          );
        }),
      ),
    ),
  );

  const groupPanel = h(
    "div",
    { class: "panel", id: "groups" },
    h("h2", {}, "Reward by group"),
    groups.groups.length === 0
      ? h("div", { class: "empty" }, "no GRPO groups yet")
      : h(
          "table",
          {},
          h("thead", {}, h("tr", {}, h("th", {}, "group"), h("th", { class: "num" }, "done"), h("th", { class: "num" }, "mean"), h("th", { class: "num" }, "std"), h("th", {}, `distribution ${fmt.num(groups.range.min, 1)}…${fmt.num(groups.range.max, 1)}`))),
          h(
            "tbody",
            {},
            groups.groups.map((g) => {
              const peak = Math.max(1, ...g.histogram);
              return h(
                "tr",
                {},
                h("td", { class: "mono" }, h("a", { href: `#/?group=${encodeURIComponent(g.group_id)}` }, g.group_id)),
                h("td", { class: "num" }, `${g.ended}/${g.tasks}`),
                h("td", { class: "num" }, fmt.reward(g.mean)),
                h("td", { class: "num" }, fmt.reward(g.std)),
                h("td", {}, h("span", { class: "hist", title: g.rewards.map((r) => r.toFixed(2)).join(", ") }, g.histogram.map((c) => h("span", { style: `height:${c ? Math.max(8, (100 * c) / peak) : 0}%` })))),
              );
            }),
          ),
        ),
  );

  const filter = h(
    "select",
    {
      id: "status-filter",
      onchange: (e) => {
        statusFilter = (e.target as HTMLSelectElement).value;
        void refresh();
      },
    },
    ["", "queued", "running", "completed", "failed", "timed_out", "cancelled"].map((st) => h("option", { value: st, selected: st === statusFilter }, st || "all statuses")),
  );
  const tasksPanel = h(
    "div",
    { class: "panel", id: "tasks" },
    h("div", { class: "toolbar" }, h("h2", { style: "margin:0" }, "Tasks"), h("span", { class: "muted" }, `newest ${tasks.tasks.length}`),
      group ? h("a", { class: "pill", href: "#/", title: "show all groups" }, `group ${group} ✕`) : null, h("div", { class: "spacer" }), filter),
    tasks.tasks.length === 0
      ? h("div", { class: "empty" }, "no tasks yet — submit some with ", h("code", {}, "rollgate submit tasks.jsonl"))
      : h(
          "table",
          { class: "tasks-table" },
          h(
            "thead",
            {},
            h("tr", {}, ["task", "group", "status", "reward", "LLM calls", "tokens", "duration", "created"].map((c, i) => h("th", { class: i >= 3 && i <= 6 ? "num" : "" }, c))),
          ),
          h(
            "tbody",
            {},
            tasks.tasks.map((t) =>
              h(
                "tr",
                { "data-task": t.id },
                h("td", { class: "id" }, h("a", { href: `#/tasks/${encodeURIComponent(t.id)}` }, t.id)),
                h("td", { class: "mono muted" }, t.group_id ?? ""),
                h("td", {}, badge(t.status)),
                h("td", { class: "num" }, fmt.reward(t.result?.reward)),
                h("td", { class: "num" }, fmt.num(t.result?.usage.llm_calls)),
                h("td", { class: "num" }, fmt.num(t.result ? t.result.usage.completion_tokens : null)),
                h("td", { class: "num" }, fmt.ms(t.result?.timings.total_ms ?? (t.started_at ? Date.now() - Date.parse(t.started_at) : null))),
                h("td", { class: "muted" }, fmt.ago(t.created_at)),
              ),
            ),
          ),
        ),
  );

  view.replaceChildren(cards, charts, h("section", { class: "grid two" }, rankPanel, groupPanel), enginePanel, tasksPanel);
}

// ── task page ──────────────────────────────────────────────────────────────────────────

function eventLine(e: TaskEvent) {
  const d = e.data ?? {};
  const error = d.error as TaskError | null | undefined;
  let detail = "";
  if (e.type === "llm_call") detail = `#${d.seq} prompt ${d.prompt_tokens} · completion ${d.completion_tokens} · cached ${d.cached_tokens} · ${d.latency_ms} ms · ${d.finish_reason}`;
  else if (e.type === "started") detail = `worker ${d.worker} · attempt ${d.attempt} · session ${d.session_id}`;
  else if (e.type === "terminal") detail = `${d.status}${d.reward !== null && d.reward !== undefined ? ` · reward ${d.reward}` : ""}${error ? ` · ${error.kind}: ${error.message}` : ""}`;
  else detail = Object.keys(d).length ? JSON.stringify(d) : "";
  return h("div", { class: `ev ${e.type}` }, h("span", { class: "muted" }, fmt.time(e.at)), h("span", { class: "type" }, e.type), h("span", {}, detail));
}

/** Follows the task's SSE stream with fetch (EventSource cannot send an Authorization header). */
async function followEvents(id: string, box: HTMLElement, signal: AbortSignal) {
  const res = await fetch(`/v1/tasks/${encodeURIComponent(id)}/events`, { headers: authHeaders({ accept: "text/event-stream" }), signal });
  if (!res.ok || !res.body) throw new ApiError(res.status, null);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = block
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      try {
        box.append(eventLine(JSON.parse(data) as TaskEvent));
        box.scrollTop = box.scrollHeight;
      } catch {
        /* ignore */
      }
    }
  }
}

function renderTrajectory(decoded: DecodedTrajectory) {
  if (decoded.traces.length === 0) return h("div", { class: "empty" }, "no LLM calls recorded in this session");
  return h(
    "div",
    {},
    h(
      "div",
      { class: "legend", style: "margin-bottom:8px" },
      h("span", {}, h("span", { class: "swatch", style: "background:rgba(63,185,127,.6)" }), "trainable (loss_mask 1: sampled by the policy)"),
      h("span", {}, h("span", { class: "swatch", style: "background:#3a444f" }), "masked (loss_mask 0: tool results, template glue)"),
      h("span", {}, `${decoded.stats.traces} trace(s) · ${decoded.stats.records} record(s) · ${decoded.stats.trainable_tokens}/${decoded.stats.response_tokens} response tokens trainable`),
    ),
    decoded.traces.map((t) =>
      h(
        "div",
        { class: "trace", "data-trace": t.index },
        h(
          "div",
          { class: "trace-head" },
          h("strong", {}, `trace ${t.index}`),
          h("span", {}, `prompt ${t.prompt_tokens} tok`),
          h("span", {}, `response ${t.response_tokens} tok (${t.trainable_tokens} trainable)`),
          h("span", {}, `finish ${t.finish_reason}`),
          h("span", { class: "muted" }, `weights ${t.weight_versions.map((v) => v ?? "–").join(", ")}`),
        ),
        h(
          "div",
          { class: "trace-body" },
          h("details", {}, h("summary", {}, `prompt (${t.prompt_tokens} tokens)`), h("span", { class: "prompt-text" }, t.prompt_text)),
          t.segments.map((s) => h("span", { class: `seg ${s.trainable ? "trainable" : "masked"}`, title: `${s.tokens} tokens, loss_mask ${s.trainable ? 1 : 0}` }, s.text)),
        ),
      ),
    ),
  );
}

async function renderTask(id: string) {
  const task = await api<TaskRecord>(`/v1/tasks/${encodeURIComponent(id)}`);
  const r = task.result;
  const kv = (pairs: ([string, Leaf] | null)[]) => h("dl", { class: "kv" }, pairs.flatMap((p) => (p ? [h("dt", {}, p[0]), h("dd", {}, p[1] ?? "–")] : [])));
  const summary = h(
    "section",
    { class: "grid two" },
    h(
      "div",
      { class: "panel", id: "task-summary" },
      h("div", { class: "toolbar" }, h("h2", { style: "margin:0" }, h("span", { class: "mono" }, task.id)), badge(task.status)),
      kv([
        ["reward", h("strong", {}, fmt.reward(r?.reward))],
        ["group", task.group_id],
        ["instruction", h("span", { class: "mono" }, (task.task.instruction.split("\n")[0] ?? "").slice(0, 160))],
        ["harness", task.task.agent.harness],
        ["worker", task.worker],
        ["session", task.session_id ? h("span", { class: "mono" }, task.session_id) : null],
        ["attempts", task.attempts],
        ["callback", task.callback.state === "none" ? "none" : `${task.callback.state} (${task.callback.attempts} attempts)`],
        r?.error ? ["error", h("span", { style: "color:var(--red)" }, `${r.error.kind}: ${r.error.message}`)] : null,
      ]),
    ),
    h(
      "div",
      { class: "panel" },
      h("h2", {}, "Usage and timings"),
      kv([
        ["created", `${fmt.time(task.created_at)} (${fmt.ago(task.created_at)})`],
        ["LLM calls", fmt.num(r?.usage.llm_calls)],
        ["prompt tokens", fmt.num(r?.usage.prompt_tokens)],
        ["completion tokens", fmt.num(r?.usage.completion_tokens)],
        ["cached tokens", fmt.num(r?.usage.cached_tokens)],
        ["queued / run / eval", r ? `${fmt.ms(r.timings.queued_ms)} / ${fmt.ms(r.timings.run_ms)} / ${fmt.ms(r.timings.eval_ms)}` : "–"],
        ["total", fmt.ms(r?.timings.total_ms)],
        ["agent exit", r ? `${r.agent.exit_code ?? "–"}${r.agent.signal ? ` (${r.agent.signal})` : ""}` : "–"],
        ["evaluation", r?.evaluation ? `${r.evaluation.kind} · exit ${r.evaluation.exit_code ?? "–"}` : "–"],
      ]),
    ),
  );
  const eventsBox = h("div", { class: "events", id: "events" });
  const logs = h("pre", { class: "logs", id: "logs" }, "…");
  const traj = h("div", { id: "trajectory" }, h("div", { class: "empty" }, task.session_id ? "decoding…" : "the task has not started yet"));
  view.replaceChildren(
    h("div", { style: "margin-bottom:10px" }, h("a", { href: "#/" }, "← all tasks")),
    summary,
    h("section", { class: "grid two" }, h("div", { class: "panel" }, h("h2", {}, "Events"), eventsBox), h("div", { class: "panel" }, h("h2", {}, "Agent logs"), logs)),
    h("section", { class: "panel" }, h("h2", {}, "Trajectory"), traj),
  );
  streamAbort?.abort();
  streamAbort = new AbortController();
  followEvents(id, eventsBox, streamAbort.signal).catch((err: unknown) => {
    if ((err as Error | null)?.name !== "AbortError") eventsBox.append(errorBox(err));
  });
  apiText(`/v1/tasks/${encodeURIComponent(id)}/logs`)
    .then((t) => (logs.textContent = t || "(no output)"))
    .catch((err: unknown) => logs.replaceChildren(errorBox(err)));
  if (task.session_id) {
    api<DecodedTrajectory>(`/v1/sessions/${encodeURIComponent(task.session_id)}/trajectory/decoded?builder=${task.task.trajectory?.builder ?? "prefix_merging"}`)
      .then((d) => traj.replaceChildren(renderTrajectory(d)))
      .catch((err: unknown) => traj.replaceChildren(errorBox(err)));
  }
  // A running task's page refreshes itself once it ends.
  if (!r) timer = setTimeout(() => void route(), REFRESH_MS * 2);
}

// ── routing ────────────────────────────────────────────────────────────────────────────

async function refresh() {
  clearTimeout(timer);
  try {
    await renderOverview();
  } catch (err) {
    view.replaceChildren(errorBox(err));
  }
  if (currentRoute() === "overview") timer = setTimeout(() => void refresh(), REFRESH_MS);
}

function currentRoute() {
  return location.hash.startsWith("#/tasks/") ? "task" : "overview";
}

async function route() {
  clearTimeout(timer);
  streamAbort?.abort();
  for (const a of document.querySelectorAll<HTMLElement>("[data-nav]")) a.classList.toggle("active", currentRoute() === a.dataset.nav);
  if (currentRoute() === "task") {
    const id = decodeURIComponent(location.hash.slice("#/tasks/".length));
    view.replaceChildren(h("div", { class: "empty" }, "loading…"));
    try {
      await renderTask(id);
    } catch (err) {
      view.replaceChildren(h("div", { style: "margin-bottom:10px" }, h("a", { href: "#/" }, "← all tasks")), errorBox(err));
    }
  } else {
    await refresh();
  }
}

window.addEventListener("hashchange", () => void route());
void route();

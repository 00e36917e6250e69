import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim, getSimState } from "./app.js";
import type { Conversation } from "./__fixtures__/conversation.js";
import { playChat, playRaw, playTokenIn, post } from "./__fixtures__/conversation.js";

// Qwen3-Coder as served by `vllm serve Qwen/Qwen3-Coder-30B-A3B-Instruct --tool-call-parser qwen3_coder`
// (vLLM vllm/tool_parsers/qwen3coder_tool_parser.py): the Qwen3 tokenizer, ChatML turns, XML calls.

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather",
      parameters: {
        type: "object",
        properties: { city: { type: "string", description: "The city" }, days: { type: "integer" }, detailed: { type: "boolean" }, unit: { type: "string", enum: ["c", "f"] } },
        required: ["city"],
      },
    },
  },
];

const SCRIPT = '#sim: [{"think":"not written","text":"Let me check.","tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","days":3,"detailed":true}}]},{"text":"It is sunny."}]';

// The tool-use instructions the Qwen3-Coder template writes into the system turn (published with
// Qwen/Qwen3-Coder-30B-A3B-Instruct's chat template).
const INSTRUCTIONS =
  "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

const CONV: Conversation = {
  messages: [
    { role: "system", content: `You are a weather bot.\n${SCRIPT}` },
    { role: "user", content: "Weather in Paris?" },
  ],
  tools: TOOLS,
  results: ["Sunny, 21 C"],
  turns: [
    {
      emitted: "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=detailed>\nTrue\n</parameter>\n</function>\n</tool_call><|im_end|>",
      // qwen3_coder: the text before <tool_call>, unstripped; values converted by the schema ("True" → true).
      content: "Let me check.\n\n",
      reasoning: null,
      calls: [{ name: "get_weather", arguments: '{"city": "Paris", "days": 3, "detailed": true}' }],
      finish: "tool_calls",
    },
    { emitted: "It is sunny.<|im_end|>", content: "It is sunny.", reasoning: null, calls: [], finish: "stop" },
  ],
};

let app: FastifyInstance;
let sglang: FastifyInstance;
beforeAll(() => {
  app = buildEngineSim({ family: "qwen3-coder" });
  sglang = buildEngineSim({ family: "qwen3-coder", kind: "sglang" });
});
afterAll(async () => {
  await app.close();
  await sglang.close();
});

describe("Qwen3-Coder template (bundled: templates/qwen3-coder.jinja)", () => {
  it("renders the published format: XML tool list in the system turn, XML calls, tool responses in a user turn", async () => {
    const messages = [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris", "detailed": false, "days": 2}' } }] },
      { role: "tool", tool_call_id: "c1", content: "Sunny, 21 C" },
    ];
    const r = await post(app, "/tokenize", { messages, tools: TOOLS });
    const text = getSimState(app).tok.decode(r.json().tokens);
    expect(text).toBe(
      "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve tasks.\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n" +
        "<function>\n<name>get_weather</name>\n<description>Get the current weather</description>\n<parameters>\n" +
        "<parameter>\n<name>city</name>\n<type>string</type>\n<description>The city</description>\n</parameter>\n" +
        "<parameter>\n<name>days</name>\n<type>integer</type>\n</parameter>\n" +
        "<parameter>\n<name>detailed</name>\n<type>boolean</type>\n</parameter>\n" +
        '<parameter>\n<name>unit</name>\n<type>string</type>\n<enum>["c", "f"]</enum>\n</parameter>\n' +
        '<required>["city"]</required>\n</parameters>\n</function>\n</tools>\n\n' +
        INSTRUCTIONS +
        "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n" +
        "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=detailed>\nFalse\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n" +
        "<|im_start|>user\n<tool_response>\nSunny, 21 C\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  it("a system message opens the system turn; an answer's text precedes its calls after a blank line", async () => {
    const messages = [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: " Let me look. ", tool_calls: [{ id: "a", type: "function", function: { name: "f", arguments: '{"x": {"y": [1, 2.0]}}' } }, { id: "b", type: "function", function: { name: "g", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "a", content: "1" },
      { role: "tool", tool_call_id: "b", content: "2" },
      { role: "assistant", content: "Done." },
    ];
    const r = await post(app, "/tokenize", { messages, add_generation_prompt: false });
    expect(getSimState(app).tok.decode(r.json().tokens)).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
        '<|im_start|>assistant\nLet me look.\n\n<tool_call>\n<function=f>\n<parameter=x>\n{"y": [1, 2.0]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\nDone.<|im_end|>\n",
    );
  });
});

describe("Qwen3-Coder: a scripted tool conversation", () => {
  it("token-in on the chat route (kv_transfer_params, prompt_token_ids, SGLang input_ids) gives the same answers", async () => {
    await playTokenIn({ family: "qwen3-coder" }, CONV);
  });

  it("chat route, not streamed: XML calls parsed as vLLM's qwen3_coder parser does; raw-prompt routes play the same", async () => {
    const records = await playChat(app, getSimState(app).tok, CONV, false);
    await playRaw(app, records, "vllm");
    await playRaw(sglang, records, "sglang");
  });

  it("chat route, streamed: the deltas add up to the same answer", async () => {
    await playChat(app, getSimState(app).tok, CONV, true);
  });

  it("the answer re-rendered in the history is what the model wrote (the turn round-trips)", async () => {
    const records = await playChat(app, getSimState(app).tok, CONV, false);
    const second = records[1]!.promptIds;
    const first = records[0]!;
    expect(second.slice(0, first.promptIds.length + first.ids.length)).toEqual([...first.promptIds, ...first.ids]);
  });
});

/**
 * The gateway's hermes / qwen3 parsers on golden strings: Qwen3's published output format
 * (`<think>\n…\n</think>\n\n`, `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`) and the
 * cases vLLM's own hermes parser tests pin (tests/tool_parsers/test_hermes_tool_parser.py).
 */
import { describe, expect, it } from "vitest";
import { gatewayParser, parseAnswerText, parseWhole, type OutputParser, type ParsedDelta } from "./index.js";

let n = 0;
const ids = () => `call-${n++}`;
const qwen3 = (tools = true) => gatewayParser("qwen3").create(tools, ids);
const hermes = (tools = true) => gatewayParser("hermes").create(tools, ids);

/** The message a stream of `size`-character pieces assembles to. */
function streamed(parser: OutputParser, text: string, size: number) {
  const deltas: ParsedDelta[] = [];
  for (let i = 0; i < text.length; i += size) {
    const d = parser.push(text.slice(i, i + size));
    if (d) deltas.push(d);
  }
  const tail = parser.end();
  if (tail) deltas.push(tail);
  const content = deltas.map((d) => d.content ?? "").join("");
  const reasoning = deltas.some((d) => d.reasoning !== undefined) ? deltas.map((d) => d.reasoning ?? "").join("") : null;
  const calls = deltas.flatMap((d) => d.tool_calls ?? []).map((c) => ({ name: c.function?.name, arguments: c.function?.arguments }));
  return { content: content === "" ? null : content, reasoning, calls };
}

function whole(parser: OutputParser, text: string) {
  const m = parseWhole(parser, text);
  return { content: m.content, reasoning: m.reasoning, calls: m.tool_calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments })) };
}

const GOLDEN: { name: string; text: string; want: ReturnType<typeof whole> }[] = [
  { name: "plain text", text: "This is not a tool call.", want: { content: "This is not a tool call.", reasoning: null, calls: [] } },
  {
    name: "a call between tags (vLLM test_hermes_parser_non_streaming_tool_call_between_tags)",
    text: '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>',
    want: { content: null, reasoning: null, calls: [{ name: "final_answer", arguments: '{"trigger": true}' }] },
  },
  {
    name: "an unclosed call until EOS still counts",
    text: '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}',
    want: { content: null, reasoning: null, calls: [{ name: "final_answer", arguments: '{"trigger": true}' }] },
  },
  {
    // The engine's chat route, read as a stream (as the gateway reads it), gives the call as soon as
    // its name is readable; its arguments as written, up to where their value ends.
    name: "an unclosed call whose JSON never closes is a call with its arguments as written",
    text: '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
    want: { content: null, reasoning: null, calls: [{ name: "final_answer", arguments: '{"trigger": true}' }] },
  },
  {
    name: "a closed call whose JSON does not parse is a call with its arguments as written",
    text: 'Run it.<tool_call>\n{"name": "shell", "arguments": {"command": "ls -la"}\n</tool_call>\nafter',
    want: { content: "Run it.\nafter", reasoning: null, calls: [{ name: "shell", arguments: '{"command": "ls -la"}' }] },
  },
  {
    name: "a call cut inside its arguments: what of them came",
    text: '<tool_call>\n{"name": "shell", "arguments": {"command": "echo wor',
    want: { content: null, reasoning: null, calls: [{ name: "shell", arguments: '{"command": "echo wor' }] },
  },
  {
    name: "a call cut before its name is complete is dropped, as the engine's streaming parser drops it",
    text: 'Text.<tool_call>\n{"name": "she',
    want: { content: "Text.", reasoning: null, calls: [] },
  },
  {
    name: "content, then a call",
    text: 'Sure, let me check the weather.<tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>',
    want: { content: "Sure, let me check the weather.", reasoning: null, calls: [{ name: "get_weather", arguments: '{"city": "NYC"}' }] },
  },
  {
    name: "two calls in a row",
    text: '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call><tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>',
    want: {
      content: null,
      reasoning: null,
      calls: [
        { name: "search", arguments: '{"q": "cats"}' },
        { name: "search", arguments: '{"q": "dogs"}' },
      ],
    },
  },
  {
    name: "text between and after calls is content (vLLM's streaming parser)",
    text: 'Looking.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nbetween\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>\nAfter <tool the calls <tool_c',
    want: {
      content: "Looking.\n\nbetween\n\nAfter <tool the calls <tool_c",
      reasoning: null,
      calls: [
        { name: "a", arguments: "{}" },
        { name: "b", arguments: "{}" },
      ],
    },
  },
  {
    // vLLM json.dumps whatever the arguments are: a string stays a JSON string (the agent gets what the engine's route gives).
    name: "arguments the model wrote as a JSON string stay a JSON string",
    text: '<tool_call>\n{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}\n</tool_call>',
    want: { content: null, reasoning: null, calls: [{ name: "get_db_config", arguments: '"{\\"param\\": \\"max_connections\\"}"' }] },
  },
  {
    name: "arguments re-serialised as Python's json.dumps (floats stay floats, non-ASCII kept)",
    text: '<tool_call>\n{"name": "f", "arguments": {"b":1.0,"a":"é","n":[1,2]}}\n</tool_call>',
    want: { content: null, reasoning: null, calls: [{ name: "f", arguments: '{"b": 1.0, "a": "é", "n": [1, 2]}' }] },
  },
  {
    name: "Qwen3 thinking, then a call (the content before the call is the template's \\n\\n)",
    text: '<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    want: { content: "\n\n", reasoning: "\nI need the weather.\n", calls: [{ name: "get_weather", arguments: '{"city": "Paris"}' }] },
  },
  {
    name: "Qwen3 with thinking off: the empty think block",
    text: "<think>\n\n</think>\n\nParis is the capital.",
    want: { content: "\n\nParis is the capital.", reasoning: "\n\n", calls: [] },
  },
  {
    name: "cut inside the reasoning",
    text: "<think>\nStill thinking about",
    want: { content: null, reasoning: "\nStill thinking about", calls: [] },
  },
];

describe("qwen3 parser (vLLM qwen3 reasoning + hermes tools)", () => {
  it.each(GOLDEN)("$name", ({ text, want }) => {
    expect(whole(qwen3(), text)).toEqual(want);
  });

  it.each(GOLDEN)("$name: streamed in any piece size, the same message", ({ text, want }) => {
    for (const size of [1, 2, 3, 7, 64]) expect(streamed(qwen3(), text, size)).toEqual(want);
  });

  it("without tools (or tool_choice none) a call is content", () => {
    const text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>';
    expect(whole(qwen3(false), text)).toEqual({ content: text, reasoning: null, calls: [] });
  });

  it("each call gets a fresh chatcmpl-tool id by default", () => {
    const m = parseWhole(gatewayParser("qwen3").create(true), '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>');
    expect(m.tool_calls.map((c) => c.id)).toEqual([expect.stringMatching(/^chatcmpl-tool-[0-9a-f]{32}$/), expect.stringMatching(/^chatcmpl-tool-[0-9a-f]{32}$/)]);
    expect(m.tool_calls[0]!.id).not.toBe(m.tool_calls[1]!.id);
  });

  it("parseAnswerText drops the end-of-turn token the engine's /detokenize keeps", () => {
    const m = parseAnswerText(gatewayParser("qwen3"), "<think>\nok\n</think>\n\nDone.<|im_end|>", true, ids);
    expect(m).toEqual({ content: "\n\nDone.", reasoning: "\nok\n", tool_calls: [] });
    expect(parseAnswerText(gatewayParser("qwen3"), "Done.<|endoftext|>", true, ids).content).toBe("Done.");
  });
});

describe("hermes parser (no reasoning parser: Qwen2.5)", () => {
  it("an opening <think> is content, calls are parsed", () => {
    expect(whole(hermes(), "<think>x</think>hi")).toEqual({ content: "<think>x</think>hi", reasoning: null, calls: [] });
    expect(whole(hermes(), 'ok\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>')).toEqual({
      content: "ok\n",
      reasoning: null,
      calls: [{ name: "ls", arguments: '{"path": "."}' }],
    });
  });
});

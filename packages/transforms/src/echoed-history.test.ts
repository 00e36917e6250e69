import type { ChatMessage, RecordHead, ToolDefinition } from "@rollgate/protocol";
import { hash } from "node:crypto";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { recordOf as record } from "./__fixtures__/record-heads.js";
import { conversationKey, findExtendedRecord, matchEchoedHistory, recordedAssistantMessage, restoreEchoedHistory } from "./echoed-history.js";


const call = (id: string, name: string, args: string) => ({ id, type: "function" as const, function: { name, arguments: args } });
const TOOLS: ToolDefinition[] = [{ type: "function", function: { name: "shell" } }];
const SYS: ChatMessage = { role: "system", content: "sys" };
const USER: ChatMessage = { role: "user", content: "do it" };

// The engine's answers: reasoning + tool call (content "\n\n" from vLLM), then text + tool call, then text.
const r0 = record(0, [SYS, USER], { content: "\n\n", reasoning: "\nlook\n", tool_calls: [call("chatcmpl-tool-a", "shell", '{"command": "ls", "n": 1.0}')] }, TOOLS);
const afterR0: ChatMessage[] = [
  SYS,
  USER,
  { role: "assistant", content: "", reasoning: "\nlook\n", tool_calls: [call("chatcmpl-tool-a", "shell", '{"command": "ls", "n": 1.0}')] },
  { role: "tool", content: "a.txt", tool_call_id: "chatcmpl-tool-a" },
];
const r1 = record(1, afterR0, { content: "\n\nReading.\n", reasoning: "\nread it\n", tool_calls: [call("chatcmpl-tool-b", "shell", '{"command": "cat a.txt"}')] }, TOOLS);
const afterR1: ChatMessage[] = [
  ...afterR0,
  { role: "assistant", content: "\n\nReading.", reasoning: "\nread it\n", tool_calls: [call("chatcmpl-tool-b", "shell", '{"command": "cat a.txt"}')] },
  { role: "tool", content: "hello", tool_call_id: "chatcmpl-tool-b" },
];
const r2 = record(2, afterR1, { content: "It says hello.", reasoning: "\ndone\n" }, TOOLS);

/** What an OpenAI-SDK agent sends back: no reasoning, content as received, arguments re-serialised its own way. */
const agentEcho: ChatMessage[] = [
  SYS,
  USER,
  { role: "assistant", content: "\n\n", tool_calls: [call("chatcmpl-tool-a", "shell", '{"command":"ls","n":1}')] },
  { role: "tool", content: "a.txt", tool_call_id: "chatcmpl-tool-a" },
  { role: "assistant", content: "\n\nReading.\n", tool_calls: [call("chatcmpl-tool-b", "shell", '{"command":"cat a.txt"}')] },
  { role: "tool", content: "hello", tool_call_id: "chatcmpl-tool-b" },
  { role: "assistant", content: "It says hello." },
  { role: "user", content: "thanks, now more" },
];

describe("restoreEchoedHistory (golden)", () => {
  it("a call cut mid-arguments comes back as {} from an object-argument protocol (Anthropic input, Gemini args): restored; other arguments are not", () => {
    const cutArgs = '{"command": "echo one two thr';
    const cut = record(0, [SYS, USER], { content: "", reasoning: null, tool_calls: [call("toolu_cut", "shell", cutArgs)] }, TOOLS);
    const echo = (args: string): ChatMessage[] => [SYS, USER, { role: "assistant", content: "", tool_calls: [call("toolu_cut", "shell", args)] }, { role: "tool", content: "", tool_call_id: "toolu_cut" }];
    // Restored with arguments an engine takes back: vLLM and SGLang refuse a history call whose
    // arguments do not parse (400) and render "" as {}; the cut turn's tokens are the record's.
    expect(matchEchoedHistory(echo("{}"), [cut]).messages[2]).toEqual({ role: "assistant", content: "", reasoning: null, tool_calls: [call("toolu_cut", "shell", "")] });
    expect(matchEchoedHistory(echo("{ }"), [cut]).producers[2]).toBe(cut);
    // As vLLM streamed them (the cut arguments as written), from an OpenAI agent: the same.
    expect(matchEchoedHistory(echo(cutArgs), [cut])).toMatchObject({ producers: [null, null, cut, null], messages: [SYS, USER, { tool_calls: [call("toolu_cut", "shell", "")] }, echo("")[3]] });
    // Arguments the agent changed are its own.
    expect(matchEchoedHistory(echo('{"command": "ls"}'), [cut]).producers[2]).toBeNull();
    // A recorded call whose arguments are an object is not echoed as {}.
    const whole = record(0, [SYS, USER], { content: "", reasoning: null, tool_calls: [call("toolu_whole", "shell", '{"command": "ls"}')] }, TOOLS);
    const echoWhole: ChatMessage[] = [SYS, USER, { role: "assistant", content: "", tool_calls: [call("toolu_whole", "shell", "{}")] }];
    expect(matchEchoedHistory(echoWhole, [whole]).producers[2]).toBeNull();
  });

  it("a call whose arguments are JSON but not an object comes back as {value: v} from Gemini (its args are an object): restored; no other shape is", () => {
    const echo = (id: string, args: string): ChatMessage[] => [SYS, USER, { role: "assistant", content: "", tool_calls: [call(id, "shell", args)] }, { role: "tool", content: "", tool_call_id: id }];
    for (const [recorded, wrapped] of [
      ["5", '{"value":5}'],
      ["[1, 2]", '{"value":[1,2]}'],
      ['"text"', '{"value":"text"}'],
      ["null", '{"value":null}'],
      ['[{"b": 1, "a": 2}]', '{"value":[{"a":2,"b":1}]}'],
    ]) {
      const r = record(0, [SYS, USER], { content: "", reasoning: null, tool_calls: [call("gem_1", "shell", recorded!)] }, TOOLS);
      expect(matchEchoedHistory(echo("gem_1", wrapped!), [r]).messages[2], recorded).toEqual({ role: "assistant", content: "", reasoning: null, tool_calls: [call("gem_1", "shell", recorded!)] });
      // Matched by its words too (an agent that minted its own call id).
      expect(matchEchoedHistory(echo("own-id", wrapped!), [r]).producers[2], recorded).toBe(r);
    }
    const five = record(0, [SYS, USER], { content: "", reasoning: null, tool_calls: [call("gem_5", "shell", "5")] }, TOOLS);
    const producer = (args: string) => matchEchoedHistory(echo("gem_5", args), [five]).producers[2];
    // Another value, another key beside it, or another name is the agent's own call.
    expect(producer('{"value":6}')).toBeNull();
    expect(producer('{"value":"5"}')).toBeNull();
    expect(producer('{"value":5,"other":1}')).toBeNull();
    expect(producer('{"val":5}')).toBeNull();
    expect(producer("[5]")).toBeNull();
    // A recorded object is never echoed wrapped: {value: {...}} is not it.
    const obj = record(0, [SYS, USER], { content: "", reasoning: null, tool_calls: [call("gem_o", "shell", '{"command": "ls"}')] }, TOOLS);
    expect(matchEchoedHistory(echo("gem_o", '{"value":{"command":"ls"}}'), [obj]).producers[2]).toBeNull();
    // Nor are arguments that are not JSON (those come back as {}).
    const cut = record(0, [SYS, USER], { content: "", reasoning: null, tool_calls: [call("gem_c", "shell", '{"command": "ec')] }, TOOLS);
    expect(matchEchoedHistory(echo("gem_c", '{"value":"{\\"command\\": \\"ec"}'), [cut]).producers[2]).toBeNull();
  });

  it("puts back reasoning, exact arguments and content as generated; keeps the agent's ids and every other message", () => {
    expect(restoreEchoedHistory(agentEcho, [r0, r1, r2])).toEqual([
      SYS,
      USER,
      { role: "assistant", content: "\n\n", reasoning: "\nlook\n", tool_calls: [call("chatcmpl-tool-a", "shell", '{"command": "ls", "n": 1.0}')] },
      { role: "tool", content: "a.txt", tool_call_id: "chatcmpl-tool-a" },
      { role: "assistant", content: "\n\nReading.\n", reasoning: "\nread it\n", tool_calls: [call("chatcmpl-tool-b", "shell", '{"command": "cat a.txt"}')] },
      { role: "tool", content: "hello", tool_call_id: "chatcmpl-tool-b" },
      { role: "assistant", content: "It says hello.", reasoning: "\ndone\n" },
      { role: "user", content: "thanks, now more" },
    ]);
  });

  it("matches by content when the agent minted its own tool-call ids (Gemini), and keeps those ids", () => {
    const echo: ChatMessage[] = [SYS, USER, { role: "assistant", content: null, tool_calls: [call("gemini-call-0-0", "shell", '{"n":1,"command":"ls"}')] }];
    const [, , restored] = restoreEchoedHistory(echo, [r0]);
    expect(restored).toEqual({ role: "assistant", content: "\n\n", reasoning: "\nlook\n", tool_calls: [call("gemini-call-0-0", "shell", '{"command": "ls", "n": 1.0}')] });
  });

  it("restores a turn whose echoed reasoning is only the last streamed piece (the OpenAI SDK's stream assembler)", () => {
    const echo: ChatMessage[] = [SYS, USER, { role: "assistant", content: "\n\n", reasoning: "k\n", tool_calls: [call("chatcmpl-tool-a", "shell", '{"command":"ls","n":1}')] }];
    expect(restoreEchoedHistory(echo, [r0])[2]).toMatchObject({ reasoning: "\nlook\n" });
  });

  it("leaves a turn the agent really changed as it is (the break is then the truth)", () => {
    const edited: ChatMessage[] = [SYS, USER, { role: "assistant", content: "", tool_calls: [call("chatcmpl-tool-a", "shell", '{"command":"rm -rf /"}')] }];
    expect(restoreEchoedHistory(edited, [r0])).toEqual(edited);
    const otherText: ChatMessage[] = [SYS, USER, { role: "assistant", content: "Something else." }];
    expect(restoreEchoedHistory(otherText, [r2])).toEqual(otherText);
    const otherReasoning: ChatMessage[] = [SYS, USER, { role: "assistant", content: "It says hello.", reasoning: "made up" }];
    expect(restoreEchoedHistory(otherReasoning, [r2])).toEqual(otherReasoning);
  });

  it("among identical answers, picks the record that answered this position", () => {
    const a = record(0, [USER], { content: "done", reasoning: "first" });
    const b = record(1, [USER, { role: "assistant", content: "done" }, USER], { content: "done", reasoning: "second" });
    const c = record(2, [USER], { content: "done", reasoning: "retry" });
    const { messages, producers } = matchEchoedHistory([USER, { role: "assistant", content: "done" }, USER, { role: "assistant", content: "done" }, USER], [a, b, c]);
    expect(producers.map((p) => p?.id ?? null)).toEqual([null, "r2", null, "r1", null]);
    expect(messages[3]).toEqual({ role: "assistant", content: "done", reasoning: "second" });
  });
});

describe("findExtendedRecord", () => {
  it("finds the record the conversation continues (the longest), ignoring ids", () => {
    const history = matchEchoedHistory(agentEcho, [r0, r1, r2]);
    expect(findExtendedRecord({ messages: history.messages, tools: TOOLS }, history)).toEqual({ record: r2, index: 6 });
    const short = agentEcho.slice(0, 4);
    const h2 = matchEchoedHistory(short, [r0, r1, r2]);
    expect(findExtendedRecord({ messages: h2.messages, tools: TOOLS }, h2)).toEqual({ record: r0, index: 2 });
  });

  it("finds the record whatever normalised form an earlier turn was sent in (the keys ignore surrounding whitespace)", () => {
    // r1 was recorded with r0's turn sent as content "" (normalised); now it comes back as generated ("\n\n").
    const history = matchEchoedHistory(agentEcho.slice(0, 6), [r0, r1]);
    expect(history.messages[2]).toMatchObject({ content: "\n\n" });
    expect(findExtendedRecord({ messages: history.messages, tools: TOOLS }, history)).toEqual({ record: r1, index: 4 });
  });

  it("finds none when the tools changed, the prefix differs, or nothing follows the answer", () => {
    const history = matchEchoedHistory(agentEcho, [r0, r1, r2]);
    expect(findExtendedRecord({ messages: history.messages, tools: [] }, history)).toBeNull();
    const changed = history.messages.map((m, i) => (i === 3 ? { ...m, content: "b.txt" } : m)) as ChatMessage[];
    const h2 = matchEchoedHistory(changed, [r0, r1, r2]);
    // r0's answer is still echoed (index 2), and nothing after the changed tool result matches.
    expect(findExtendedRecord({ messages: h2.messages, tools: TOOLS }, h2)).toEqual({ record: r0, index: 2 });
    const ending = matchEchoedHistory(agentEcho.slice(0, 3), [r0]);
    expect(findExtendedRecord({ messages: ending.messages, tools: TOOLS }, ending)).toBeNull();
  });
});

// conversation_key is stored with every record: the key of a conversation must stay the string it
// was first written as (sorted-key JSON of one array per message), whatever builds it.
describe("conversationKey", () => {
  const stable = (v: unknown): string => {
    if (v === undefined) return "null";
    if (v === null || typeof v !== "object") return JSON.stringify(v);
    if (Array.isArray(v)) return `[${v.map(stable).join(",")}]`;
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${stable(o[k])}`)
      .join(",")}}`;
  };
  const argsKey = (args: string) => {
    try {
      return stable(JSON.parse(args));
    } catch {
      return `raw:${args}`;
    }
  };
  const text = (c: unknown): string =>
    c == null ? "" : typeof c === "string" ? c : (c as { type: string; text?: string; image_url?: { url: string } }[]).map((p) => (p.type === "text" ? p.text : `[image:${p.image_url!.url}]`)).join("\n");
  const referenceKey = (m: ChatMessage): string => {
    switch (m.role) {
      case "system":
        return stable(["system", text(m.content)]);
      case "user":
        return stable(["user", text(m.content), m.name ?? null]);
      case "tool":
        return stable(["tool", text(m.content)]);
      case "assistant":
        return stable(["assistant", text(m.content).trim(), m.reasoning ?? "", (m.tool_calls ?? []).map((c) => [c.function.name, argsKey(c.function.arguments)])]);
    }
  };
  const reference = (messages: ChatMessage[], tools: ToolDefinition[] | undefined) =>
    hash("sha256", [stable(tools ?? []), ...messages.map(referenceKey)].join("\u0000"), "base64url");

  const str = fc.string({ unit: "binary", maxLength: 40 });
  const content = fc.oneof(
    str,
    fc.array(fc.oneof(str.map((t) => ({ type: "text" as const, text: t })), str.map((url) => ({ type: "image_url" as const, image_url: { url } }))), { maxLength: 3 }),
  );
  const args = fc.oneof(str, fc.json(), fc.constant(""));
  const message: fc.Arbitrary<ChatMessage> = fc.oneof(
    str.map((c) => ({ role: "system" as const, content: c })),
    fc.record({ role: fc.constant("user" as const), content, name: fc.option(str, { nil: undefined }) }),
    fc.record({ role: fc.constant("tool" as const), content: str, tool_call_id: str }),
    fc.record({
      role: fc.constant("assistant" as const),
      content: fc.option(str, { nil: null }),
      reasoning: fc.option(str, { nil: undefined }),
      tool_calls: fc.option(fc.array(fc.record({ id: str, type: fc.constant("function" as const), function: fc.record({ name: str, arguments: args }) }), { maxLength: 3 }), { nil: undefined }),
    }),
  ) as fc.Arbitrary<ChatMessage>;

  it("is the hash of the sorted-key JSON of each message, as first written", () => {
    fc.assert(
      fc.property(fc.array(message, { maxLength: 8 }), (messages) => {
        expect(conversationKey(messages, undefined)).toBe(reference(messages, undefined));
      }),
      { numRuns: 3000 },
    );
    const tools: ToolDefinition[] = [{ type: "function", function: { name: "shell", parameters: { type: "object", properties: { b: {}, a: {} } } } }];
    const messages: ChatMessage[] = [{ role: "user", content: "hi" }];
    expect(conversationKey(messages, tools)).toBe(reference(messages, tools));
  });

  // A call's own record's head continues the digest findExtendedRecord made of the conversation it
  // continues: the key must be the whole conversation's, whatever changed in between.
  it("of a call's own record, after findExtendedRecord hashed its prefix, is the whole conversation's", () => {
    const fresh = () => {
      const history = matchEchoedHistory(structuredClone(agentEcho), [r0, r1, r2]);
      expect(findExtendedRecord({ messages: history.messages, tools: TOOLS }, history)).toEqual({ record: r2, index: 6 });
      return history.messages;
    };
    let messages = fresh();
    expect(conversationKey(messages, TOOLS)).toBe(reference(messages, TOOLS));
    expect(conversationKey(messages, TOOLS)).toBe(reference(messages, TOOLS));
    expect(conversationKey(messages, [])).toBe(reference(messages, []));
    expect(conversationKey(messages.slice(0, 5), TOOLS)).toBe(reference(messages.slice(0, 5), TOOLS));
    messages = fresh();
    (messages[3] as { content: string }).content = "b.txt";
    expect(conversationKey(messages, TOOLS)).toBe(reference(messages, TOOLS));
    messages = fresh();
    messages.push({ role: "user", content: "and more" });
    expect(conversationKey(messages, TOOLS)).toBe(reference(messages, TOOLS));
    messages = fresh();
    messages.splice(1, 1);
    expect(conversationKey(messages, TOOLS)).toBe(reference(messages, TOOLS));
    messages = fresh();
    messages.length = 3;
    expect(conversationKey(messages, TOOLS)).toBe(reference(messages, TOOLS));
    // The record's own array, the same objects but a turn normalised (as applyNormalizations gives it).
    messages = fresh();
    const normalised = [...messages];
    expect(conversationKey(normalised, TOOLS)).toBe(reference(normalised, TOOLS));
    normalised[4] = { ...normalised[4]!, content: "Reading." } as ChatMessage;
    expect(conversationKey(normalised, TOOLS)).toBe(reference(normalised, TOOLS));
    normalised[2] = { ...normalised[2]!, reasoning: "" } as ChatMessage;
    expect(conversationKey(normalised, TOOLS)).toBe(reference(normalised, TOOLS));
  });

  // The records' heads were keyed by this process (record() above): a later call of their
  // conversation is matched from what was kept of them, and must find what a process that never
  // saw them finds, whatever changed in the conversation since.
  it("finds the record a call extends as a process that never keyed it would, whatever changed", () => {
    const expected = (messages: ChatMessage[], producers: (RecordHead | null)[], tools: ToolDefinition[]) => {
      for (let i = messages.length - 2; i >= 1; i--) {
        const r = producers[i];
        if (!r || r.message_count !== i || referenceKey(recordedAssistantMessage(r)) !== referenceKey(messages[i]!)) continue;
        if (reference(messages.slice(0, i), tools) === r.conversation_key) return { record: r, index: i };
      }
      return null;
    };
    const edits: ((m: Record<string, unknown>) => void)[] = [
      () => {},
      (m) => (m.content = `${String(m.content ?? "")}!`),
      (m) => (m.content = ` ${String(m.content ?? "")} `),
      (m) => (m.content = [{ type: "text", text: String(m.content ?? "") }]),
      (m) => (m.reasoning = "other"),
      (m) => (m.name = "ann"),
      (m) => (m.role = m.role === "tool" ? "user" : "tool"),
      (m) => (m.tool_calls = [call("x", "shell", '{"command":"ls","n":1}')]),
      (m) => delete m.tool_calls,
    ];
    // Long enough to be kept (short conversations are hashed again, at less cost than keeping them).
    const long: ChatMessage = { role: "system", content: `sys ${"the engine renders this again ".repeat(800)}` };
    const longer = (messages: ChatMessage[]) => messages.map((m) => (m === SYS ? long : m));
    const heads = [
      record(0, [long, USER], r0.message, TOOLS),
      record(1, longer(afterR0), r1.message, TOOLS),
      record(2, longer(afterR1), r2.message, TOOLS),
    ];
    // ...and records of the very messages a restored echo gives (the usual case: nothing normalised).
    const restored = matchEchoedHistory(longer(agentEcho), heads).messages;
    const exact = [0, 1, 2].map((seq) => record(seq, structuredClone(restored.slice(0, 2 * seq + 2)), [r0, r1, r2][seq]!.message, TOOLS));
    let found = 0;
    for (const [set, tools] of [[heads, TOOLS], [heads, []], [exact, TOOLS], [exact, []]] as const) {
      for (let at = 0; at < agentEcho.length; at++) {
        for (const edit of edits) {
          const messages = structuredClone(longer(agentEcho));
          edit(messages[at] as unknown as Record<string, unknown>);
          const history = matchEchoedHistory(messages, set);
          const got = findExtendedRecord({ messages: history.messages, tools: [...tools] }, history);
          expect(got).toEqual(expected(history.messages, history.producers, [...tools]));
          if (got) found++;
          // And the call's own record's head: the whole conversation's key.
          expect(conversationKey(history.messages, [...tools])).toBe(reference(history.messages, [...tools]));
        }
      }
    }
    expect(found).toBeGreaterThan(40);
  });

  // A call keys its messages twice (looking for the record it continues, then for its own record's
  // head): the second time must see any change made to a message in between.
  it("follows a message changed in place after it was keyed", () => {
    fc.assert(
      fc.property(fc.array(message, { minLength: 1, maxLength: 6 }), fc.nat(), message, (messages, at, other) => {
        expect(conversationKey(messages, undefined)).toBe(reference(messages, undefined));
        const m = messages[at % messages.length] as unknown as Record<string, unknown>;
        for (const k of Object.keys(m)) delete m[k];
        Object.assign(m, structuredClone(other));
        expect(conversationKey(messages, undefined)).toBe(reference(messages, undefined));
      }),
      { numRuns: 2000 },
    );
    const call = { id: "c1", type: "function" as const, function: { name: "shell", arguments: '{"cmd":"ls"}' } };
    const turn: ChatMessage = { role: "assistant", content: "listing", reasoning: "look first", tool_calls: [call] };
    const user: ChatMessage = { role: "user", content: "go", name: "ann" };
    const messages = [user, turn];
    const edits: (() => void)[] = [
      () => (user.content = "go on"),
      () => (user.name = "bob"),
      () => ((user as { content: unknown }).content = [{ type: "text", text: "go on, please" }]),
      () => (turn.reasoning = "look twice"),
      () => (turn.content = "listing all"),
      () => (call.function.arguments = '{"cmd": "ls -la"}'),
      () => (call.function.name = "bash"),
      () => turn.tool_calls!.push({ ...call, function: { ...call.function } }),
      () => delete turn.tool_calls,
      () => ((turn as { role: string }).role = "system"),
    ];
    for (const edit of edits) {
      const before = conversationKey(messages, undefined);
      expect(before).toBe(reference(messages, undefined));
      edit();
      const after = conversationKey(messages, undefined);
      expect(after).toBe(reference(messages, undefined));
      expect(after).not.toBe(before);
    }
  });
});

import { hashToken } from "@rollgate/store";
import { geminiThoughtSignature, openReasoning, sealReasoning, signReasoning, verifyReasoning } from "@rollgate/transforms";
import { describe, expect, it } from "vitest";
import type { RecordedRequest } from "./recording-relay.js";
import {
  FIXTURE_REASONING_KEY,
  LINKS_PLACEHOLDER,
  REDACTED,
  SANDBOX_PLACEHOLDER,
  TOKEN_PLACEHOLDER,
  redactCliText,
  requestKinds,
  resealReasoning,
  toFixture,
  type RunFacts,
} from "./request-fixtures.js";

const facts: RunFacts = {
  cli: "claude-code",
  version: "1.0.0",
  protocol: "anthropic_messages",
  taskId: "t-record-claude-code",
  linkDir: "/var/tmp/rollgate-agent-links-Xy12Ab",
  word: "agent-ok-claude-code",
};
const INSTRUCTION = "Write agent-ok-claude-code into result.txt with your shell tool, then read it back.";
const THINK = "I will write the file with the shell tool.";

/** What Claude Code sends for its last turn in one run: `run` makes the run-specific parts. */
function lastTurn(run: { token: string; sandbox: string; callId: string; sessionId: string; pgid: number }): RecordedRequest {
  const key = hashToken(run.token);
  return {
    session: "s-1",
    method: "POST",
    url: "/v1/messages?beta=true",
    headers: { "x-api-key": run.token, host: "127.0.0.1:41234", "content-length": "999", "x-claude-code-session-id": run.sessionId, "user-agent": "claude-cli/1.0.0" },
    status: 200,
    body: {
      model: "rollgate-policy",
      system: [{ type: "text", text: `You are a CLI. Today is 2026-11-23. cwd: ${run.sandbox}/work` }],
      messages: [
        { role: "user", content: [{ type: "text", text: "<system-reminder>context of the CLI</system-reminder>" }, { type: "text", text: INSTRUCTION }] },
        { role: "system", content: "Available agent types: …" },
        {
          role: "assistant",
          content: [
            { type: "thinking", thinking: THINK, signature: signReasoning(key, THINK) },
            { type: "tool_use", id: `chatcmpl-tool-${run.callId}`, name: "Bash", input: { command: "echo agent-ok-claude-code > result.txt" } },
          ],
        },
        { role: "user", content: [{ type: "tool_result", tool_use_id: `chatcmpl-tool-${run.callId}`, content: `done in ${run.sandbox}/work\nProcess Group PGID: ${run.pgid}` }] },
      ],
      tools: [
        {
          name: "Bash",
          description: "Runs a command. Long prose of the CLI.",
          input_schema: { type: "object", properties: { command: { type: "string", description: "The command" }, description: { type: "string", description: "What it does" } } },
        },
      ],
      metadata: { user_id: JSON.stringify({ session_id: run.sessionId }) },
      stream: true,
    },
  };
}

const runA = { token: "tokA_-123456789", sandbox: "/tmp/rollgate-t-record-claude-code-AbC123", callId: "0123456789abcdef0123456789abcdef", sessionId: "d34661e5-62e8-44dc-8414-24fb41d21c33", pgid: 2211 };
const runB = { token: "other-token-987", sandbox: "/private/var/folders/x/rollgate-t-record-claude-code-zZ9y8X", callId: "fedcba9876543210fedcba9876543210", sessionId: "0a1b2c3d-0000-4000-8000-123456789abc", pgid: 77 };

describe("toFixture", () => {
  it("gives the same file for two runs that differ only in tokens, paths, ids and process ids", () => {
    const a = toFixture("tool-result", lastTurn(runA), facts);
    const b = toFixture("tool-result", lastTurn(runB), facts);
    expect(JSON.stringify(b)).toBe(JSON.stringify(a));
    expect(JSON.stringify(a)).not.toMatch(/tokA|AbC123|0123456789abcdef|d34661e5|2211/);
  });

  it("keeps the shape, our texts and the tool traffic; drops transport headers; names the session token", () => {
    const f = toFixture("tool-result", lastTurn(runA), facts);
    expect(f).toMatchObject({ cli: "claude-code", version: "1.0.0", protocol: "anthropic_messages", kind: "tool-result", method: "POST", url: "/v1/messages?beta=true" });
    expect(f.headers).toEqual({ "user-agent": "claude-cli/1.0.0", "x-api-key": TOKEN_PLACEHOLDER, "x-claude-code-session-id": "00000000-0000-0000-0000-000000000001" });
    const body = f.body as { messages: { role: string; content: { type: string; text?: string; id?: string; tool_use_id?: string; content?: string }[] | string }[] };
    expect(body.messages.map((m) => m.role)).toEqual(["user", "system", "assistant", "user"]);
    const [user, system, assistant, result] = body.messages;
    expect(user!.content).toEqual([{ type: "text", text: REDACTED }, { type: "text", text: INSTRUCTION }]);
    expect(system!.content).toBe(REDACTED);
    const call = (assistant!.content as { id: string }[])[1]!;
    expect(call.id).toBe("chatcmpl-tool-00000000000000000000000000000002");
    expect((result!.content as { tool_use_id: string; content: string }[])[0]).toEqual({
      type: "tool_result",
      tool_use_id: call.id,
      content: `done in ${SANDBOX_PLACEHOLDER}/work\nProcess Group PGID: 1000`,
    });
  });
});

describe("redactCliText", () => {
  it("redacts system prompts, descriptions and the CLI's context in user turns, nothing else", () => {
    const out = redactCliText(lastTurn(runA).body, (t) => t.includes(facts.word)) as Record<string, unknown>;
    expect(out.system).toEqual([{ type: "text", text: REDACTED }]);
    expect(out.tools).toEqual([
      {
        name: "Bash",
        description: REDACTED,
        // A parameter named `description` stays a parameter.
        input_schema: { type: "object", properties: { command: { type: "string", description: REDACTED }, description: { type: "string", description: REDACTED } } },
      },
    ]);
    const messages = out.messages as { content: unknown }[];
    expect(messages[2]!.content).toEqual((lastTurn(runA).body as { messages: { content: unknown }[] }).messages[2]!.content);
  });

  it("redacts the other protocols' system positions: instructions, developer items, systemInstruction", () => {
    const ours = (t: string) => t.includes("OURS");
    expect(redactCliText({ instructions: "prompt", input: [{ type: "message", role: "developer", content: [{ type: "input_text", text: "rules" }] }, { role: "user", content: "OURS" }] }, ours)).toEqual({
      instructions: REDACTED,
      input: [{ type: "message", role: "developer", content: [{ type: "input_text", text: REDACTED }] }, { role: "user", content: "OURS" }],
    });
    expect(
      redactCliText(
        {
          systemInstruction: { parts: [{ text: "prompt" }] },
          contents: [
            { role: "user", parts: [{ text: "env context" }, { text: "OURS" }] },
            { role: "user", parts: [{ functionResponse: { name: "f", response: { output: "tool output" } } }] },
          ],
        },
        ours,
      ),
    ).toEqual({
      systemInstruction: { parts: [{ text: REDACTED }] },
      contents: [
        { role: "user", parts: [{ text: REDACTED }, { text: "OURS" }] },
        { role: "user", parts: [{ functionResponse: { name: "f", response: { output: "tool output" } } }] },
      ],
    });
    expect(redactCliText({ messages: [{ role: "tool", tool_call_id: "c", content: [{ type: "text", text: "output" }] }] }, ours)).toEqual({
      messages: [{ role: "tool", tool_call_id: "c", content: [{ type: "text", text: "output" }] }],
    });
  });
});

describe("resealReasoning", () => {
  it("re-makes the gateway's seals with the fixture key and leaves other values alone", () => {
    const key = hashToken("tok");
    const out = resealReasoning(
      {
        a: { type: "thinking", thinking: THINK, signature: signReasoning(key, THINK) },
        b: { type: "reasoning", encrypted_content: sealReasoning(key, THINK) },
        c: { functionCall: { name: "f" }, thoughtSignature: geminiThoughtSignature(key, THINK) },
        d: { thoughtSignature: "skip_thought_signature_validator" },
        e: { type: "thinking", thinking: THINK, signature: "another-servers-signature" },
      },
      key,
      FIXTURE_REASONING_KEY,
    ) as Record<string, Record<string, string>>;
    expect(verifyReasoning(FIXTURE_REASONING_KEY, THINK, out.a!.signature!)).toBe(true);
    expect(openReasoning(FIXTURE_REASONING_KEY, out.b!.encrypted_content!)).toBe(THINK);
    expect(openReasoning(FIXTURE_REASONING_KEY, out.c!.thoughtSignature!)).toBe(THINK);
    expect(out.d!.thoughtSignature).toBe("skip_thought_signature_validator");
    expect(out.e!.signature).toBe("another-servers-signature");
  });
});

describe("requestKinds", () => {
  const req = (tools: string[], n: number): RecordedRequest => ({
    session: "s",
    method: "POST",
    url: "/v1/chat/completions",
    headers: {},
    status: 200,
    body: { messages: Array.from({ length: n }, () => ({ role: "user", content: "x" })), tools: tools.map((name) => ({ type: "function", function: { name } })) },
  });

  it("names the first turn declaring the shell tool main, the last tool-result, the rest side-<n>; skips bodiless requests", () => {
    const title = req([], 1);
    const first = req(["bash", "read"], 2);
    const middle = req(["bash", "read"], 4);
    const last = req(["bash", "read"], 6);
    const head: RecordedRequest = { session: "s", method: "HEAD", url: "/", headers: {}, status: 200, body: "" };
    expect(requestKinds([head, title, first, middle, last], "bash")).toEqual([
      { kind: "main", request: first },
      { kind: "tool-result", request: last },
      { kind: "side-1", request: title },
    ]);
  });

  it("refuses a session in which the agent never got past its first turn", () => {
    expect(() => requestKinds([req(["bash"], 2), req([], 1)], "bash")).toThrow(/at least two turns declaring bash, got 1 of 2/);
  });
});

it("replaces the link folder where the shell step links the sandbox", () => {
  const r = lastTurn(runA);
  (r.body as { messages: { content: unknown }[] }).messages[0]!.content = `${facts.word} at ${facts.linkDir}/claude-code/result.txt`;
  const f = toFixture("main", r, facts);
  expect((f.body as { messages: { content: unknown }[] }).messages[0]!.content).toBe(`${facts.word} at ${LINKS_PLACEHOLDER}/claude-code/result.txt`);
});

it("orders the keys of Codex's client_metadata, which it sends in a different order each run", () => {
  const r = (metadata: Record<string, string>): RecordedRequest => ({ ...lastTurn(runA), body: { ...(lastTurn(runA).body as object), client_metadata: metadata } });
  const a = toFixture("main", r({ turn_id: "t", session_id: "s", thread_id: "h" }), facts);
  const b = toFixture("main", r({ thread_id: "h", turn_id: "t", session_id: "s" }), facts);
  expect(JSON.stringify(a)).toBe(JSON.stringify(b));
  expect(Object.keys((a.body as { client_metadata: object }).client_metadata)).toEqual(["session_id", "thread_id", "turn_id"]);
});

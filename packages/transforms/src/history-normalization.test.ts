import type { ChatMessage } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { applyNormalizations, candidateForms, chooseForm, turnShape } from "./history-normalization.js";

const call = { id: "c", type: "function" as const, function: { name: "f", arguments: "{}" } };
type Assistant = Extract<ChatMessage, { role: "assistant" }>;
const turn = (content: string | null, calls = true): Assistant => ({ role: "assistant", content, ...(calls ? { tool_calls: [call] } : {}) });

describe("turn shapes and candidate forms", () => {
  it("names a turn by its calls and its kind of content", () => {
    expect([turn("\n\n"), turn("text\n"), turn("text"), turn(null), turn(""), turn("hi\n", false)].map(turnShape)).toEqual([
      "calls:blank",
      "calls:text-space",
      "calls:text",
      "calls:null",
      "calls:empty",
      "text:text-space",
    ]);
  });

  it("tries a turn as generated first, then only the forms that change it", () => {
    expect(candidateForms(turn("\n\n")).map((c) => [c.form, c.message.content])).toEqual([
      ["as_generated", "\n\n"],
      ["blank_to_empty", ""],
      ["blank_to_null", null],
    ]);
    expect(candidateForms(turn("Reading.\n")).map((c) => [c.form, c.message.content])).toEqual([
      ["as_generated", "Reading.\n"],
      ["trim_end", "Reading."],
    ]);
    // A streamed answer keeps the whitespace between calls too.
    expect(candidateForms(turn("\n\nReading.\n\n")).map((c) => c.message.content)).toEqual(["\n\nReading.\n\n", "\n\nReading."]);
    expect(candidateForms(turn(null)).map((c) => [c.form, c.message.content])).toEqual([
      ["as_generated", null],
      ["null_to_empty", ""],
    ]);
  });
});

describe("chooseForm", () => {
  const recorded = [1, 2, 3, 4, 5];
  it("keeps the first form whose render starts with every recorded token", () => {
    expect(chooseForm([{ form: "as_generated", ids: [1, 2, 9, 4, 5, 6] }, { form: "blank_to_empty", ids: [1, 2, 3, 4, 5, 6, 7] }], recorded)).toBe("blank_to_empty");
    expect(chooseForm([{ form: "as_generated", ids: [1, 2, 3, 4, 5, 6] }, { form: "blank_to_empty", ids: [1, 2, 3, 4, 5] }], recorded)).toBe("as_generated");
  });
  it("is inconclusive when none does (the history before the turn re-renders differently too)", () => {
    expect(chooseForm([{ form: "as_generated", ids: [1, 9] }, { form: "blank_to_null", ids: [1, 8] }], recorded)).toBeNull();
  });
});

describe("applyNormalizations", () => {
  it("applies the learned form to restored turns of that shape only", () => {
    const messages: ChatMessage[] = [{ role: "user", content: "go" }, turn("\n\n"), { role: "tool", content: "x", tool_call_id: "c" }, turn("\n\n"), turn("ok\n")];
    const forms = new Map([["calls:blank", "blank_to_empty" as const]]);
    const out = applyNormalizations(messages, [1, 4], forms);
    expect(out[1]).toMatchObject({ content: "" });
    // Not restored (the agent's own turn): left as sent.
    expect(out[3]).toMatchObject({ content: "\n\n" });
    // Restored, but no form learned for its shape: as generated.
    expect(out[4]).toMatchObject({ content: "ok\n" });
    expect(messages[1]).toMatchObject({ content: "\n\n" });
  });
});

import { describe, expect, it } from "vitest";
import { stringEnd, valueEnd } from "./extent.js";

// The extent scan is read by both sides of the wire (engine-sim's chat route and the gateway's own
// parser), so a mistake in it would agree with itself there: it is pinned here against JSON.parse.
describe("valueEnd", () => {
  const whole = ['{"a": 1}', '{"a": "}", "b": [1, {"c": "\\"]"}]}', "[1, 2, [3]]", '"x\\"y"', '{"k": "\\\\"}'];
  it.each(whole)("ends a complete value where JSON.parse reads one: %s", (text) => {
    const end = valueEnd(`${text} tail`, 0);
    expect(end).toBe(text.length);
    expect(() => JSON.parse(text.slice(0, end))).not.toThrow();
  });

  it.each(['{"a": 1', '{"a": "}', '[1, [2]', '"open', '{"k": "\\"}'])("a value cut before it closes has no end yet: %s", (text) => {
    expect(valueEnd(text, 0)).toBe(-1);
  });

  it("a bare number or word ends at the next delimiter, and not before more text shows where", () => {
    expect(valueEnd("123, x", 0)).toBe(3);
    expect(valueEnd("true}", 0)).toBe(4);
    expect(valueEnd("123", 0)).toBe(-1);
  });

  it("starts where it is told", () => {
    expect(valueEnd('<x>{"a": [1]}</x>', 3)).toBe(13);
    expect(stringEnd('k: "a\\\\" rest', 3)).toBe(8);
  });
});

import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { jsonDepthExceeds } from "./input-guards.js";

/** The plain char-by-char scan jsonDepthExceeds must agree with (it jumps over strings instead). */
function reference(text: string, max: number): boolean {
  if (text.length <= max) return false;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

const nest = (depth: number, inner = "1") => "[".repeat(depth) + inner + "]".repeat(depth);

describe("jsonDepthExceeds", () => {
  it("refuses nesting past the limit and not up to it, whatever the strings hold", () => {
    expect(jsonDepthExceeds(nest(512), 512)).toBe(false);
    expect(jsonDepthExceeds(nest(513), 512)).toBe(true);
    // Brackets inside strings (escaped quotes and backslashes included) do not nest.
    const s = JSON.stringify({ text: '[[[[ \\" {{{{ \\\\" ]]]]'.repeat(200) });
    expect(jsonDepthExceeds(s, 4)).toBe(false);
    expect(jsonDepthExceeds(`[[[[[${s}]]]]]`, 4)).toBe(true);
    expect(jsonDepthExceeds(`["\\\\", [[[[[1]]]]]]`, 4)).toBe(true);
  });

  it("agrees with a char-by-char scan on any text, JSON or not", () => {
    const alphabet = fc.constantFrom('"', "\\", "[", "]", "{", "}", "a", ",", ":", " ");
    fc.assert(
      fc.property(fc.array(alphabet, { maxLength: 200 }), fc.integer({ min: 0, max: 6 }), (chars, max) => {
        const text = chars.join("");
        expect(jsonDepthExceeds(text, max)).toBe(reference(text, max));
      }),
      { numRuns: 5000 },
    );
    fc.assert(
      fc.property(fc.json({ depthSize: "large" }), fc.integer({ min: 0, max: 8 }), (text, max) => {
        expect(jsonDepthExceeds(text, max)).toBe(reference(text, max));
      }),
      { numRuns: 2000 },
    );
  });
});

/**
 * Where a JSON value written so far ends, for parsers that read a value as a model writes it (a
 * streamed tool call's arguments, or a call cut or broken before its JSON closes).
 */

/** Index just past the JSON string starting at `i` (a `"`), or -1 when it is not closed yet. */
export function stringEnd(s: string, i: number): number {
  for (let j = i + 1; j < s.length; j++) {
    if (s[j] === "\\") j++;
    else if (s[j] === '"') return j + 1;
  }
  return -1;
}

/** Index just past the JSON value starting at `i`, or -1 when it is not complete yet. */
export function valueEnd(s: string, i: number): number {
  if (s[i] === '"') return stringEnd(s, i);
  if (s[i] !== "{" && s[i] !== "[") {
    const m = /^[^,}\]\s]+/.exec(s.slice(i));
    return m && i + m[0].length < s.length ? i + m[0].length : -1;
  }
  let depth = 0;
  for (let j = i; j < s.length; j++) {
    const c = s[j];
    if (c === '"') {
      const e = stringEnd(s, j);
      if (e < 0) return -1;
      j = e - 1;
    } else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") {
      depth--;
      if (depth === 0) return j + 1;
    }
  }
  return -1;
}

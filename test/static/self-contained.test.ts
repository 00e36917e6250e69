/**
 * The repository stands on its own: the contract is its `docs/` folder, so no tracked file may
 * point at notes outside it, every relative Markdown link resolves to a tracked file (and, for a
 * Markdown target, to a heading that exists), and every `docs/<page>.md#section` named in code
 * comments, help texts or tests names a real page and section. A reader of a fresh clone never
 * follows a reference into nothing.
 *
 * Markdown is read with `marked`'s lexer (so code blocks and inline code are not mistaken for
 * links) and headings are turned into anchors with `github-slugger`, which implements GitHub's own
 * slug rules (duplicates get -1, -2, …).
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import GithubSlugger from "github-slugger";
import { Lexer, type Token, type Tokens } from "marked";
import { describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

const tracked = execFileSync("git", ["ls-files", "-z"], { cwd: ROOT, encoding: "utf8" })
  .split("\0")
  .filter((f) => f !== "" && existsSync(path.join(ROOT, f)));
const trackedSet = new Set(tracked);
/** Every folder that holds a tracked file (a link may name a folder). */
const trackedDirs = new Set(tracked.flatMap((f) => f.split("/").slice(0, -1).map((_, i, parts) => parts.slice(0, i + 1).join("/"))));

/** Git's own test: a NUL byte in the first 8000 bytes means binary. */
function textOf(file: string): string | null {
  const buf = readFileSync(path.join(ROOT, file));
  return buf.subarray(0, 8000).includes(0) ? null : buf.toString("utf8");
}

const textFiles = tracked
  .filter((f) => path.basename(f) !== "package-lock.json")
  .map((f) => ({ file: f, text: textOf(f) }))
  .filter((x): x is { file: string; text: string } => x.text !== null);

// Spelled in pieces so this file does not match itself.
const OUTSIDE = [["..", "shared"].join("/"), ["shared", "notes", ""].join("/"), ["DESIGN", "§"].join(" "), ["DESIGN", "md"].join(".")];

/** Every token of a Markdown token tree, depth first. */
function* walk(tokens: Token[]): Generator<Token> {
  for (const t of tokens) {
    yield t;
    const children = (t as { tokens?: Token[] }).tokens;
    if (children) yield* walk(children);
    if (t.type === "list") for (const item of (t as Tokens.List).items) yield* walk([item]);
    if (t.type === "table") {
      const table = t as Tokens.Table;
      for (const cell of [...table.header, ...table.rows.flat()]) yield* walk(cell.tokens);
    }
  }
}

/** A heading's text as GitHub renders it (markup dropped, code spans' content kept). */
function plainText(tokens: Token[]): string {
  return tokens
    .map((t) => {
      const children = (t as { tokens?: Token[] }).tokens;
      if (children && children.length > 0) return plainText(children);
      if (t.type === "codespan" || t.type === "text" || t.type === "escape") return (t as { text: string }).text;
      return "";
    })
    .join("");
}

const lexed = new Map<string, Token[]>();
function tokensOf(file: string): Token[] {
  let tokens = lexed.get(file);
  if (!tokens) {
    tokens = new Lexer({ gfm: true }).lex(readFileSync(path.join(ROOT, file), "utf8"));
    lexed.set(file, tokens);
  }
  return tokens;
}

/** The anchors GitHub gives a Markdown document's headings. */
function headingAnchors(tokens: Token[]): Set<string> {
  const slugger = new GithubSlugger();
  return new Set([...walk(tokens)].filter((t): t is Tokens.Heading => t.type === "heading").map((h) => slugger.slug(plainText(h.tokens))));
}

/** The targets of a Markdown document's links and images. */
function linkTargets(tokens: Token[]): { href: string; raw: string }[] {
  return [...walk(tokens)].filter((t): t is Tokens.Link | Tokens.Image => t.type === "link" || t.type === "image").map((t) => ({ href: t.href, raw: t.raw }));
}

const anchorCache = new Map<string, Set<string>>();
function anchorsOf(file: string): Set<string> {
  let anchors = anchorCache.get(file);
  if (!anchors) {
    anchors = headingAnchors(tokensOf(file));
    anchorCache.set(file, anchors);
  }
  return anchors;
}

/** What is wrong with a reference to `target` (a repository path) and `anchor`, or null. */
function brokenReason(target: string, anchor: string | null): string | null {
  if (!trackedSet.has(target) && !trackedDirs.has(target.replace(/\/$/, ""))) return `no tracked file ${target}`;
  if (anchor && target.endsWith(".md") && !anchorsOf(target).has(anchor.toLowerCase())) return `${target} has no heading #${anchor}`;
  return null;
}

describe("the repository is self-contained", () => {
  it("no tracked file points at notes outside the repository", () => {
    const offenders = textFiles.flatMap(({ file, text }) =>
      text.split("\n").flatMap((line, i) => (OUTSIDE.some((s) => line.includes(s)) ? [`${file}:${i + 1}: ${line.trim()}`] : [])),
    );
    expect(offenders).toEqual([]);
  });

  it("every relative link in a tracked Markdown file resolves to a tracked file and heading", () => {
    const markdown = tracked.filter((f) => f.endsWith(".md"));
    expect(markdown).toContain("docs/architecture.md");
    const broken: string[] = [];
    let checked = 0;
    for (const file of markdown) {
      for (const t of linkTargets(tokensOf(file))) {
        const href = t.href;
        if (/^[a-z][a-z0-9+.-]*:/i.test(href) || href.startsWith("//")) continue; // absolute URLs
        const [rawPath = "", anchor = null] = href.split("#", 2) as [string, string?];
        const target = rawPath === "" ? file : path.posix.normalize(path.posix.join(path.posix.dirname(file), decodeURIComponent(rawPath)));
        checked++;
        const why = target.startsWith("..") ? `${href} leaves the repository` : brokenReason(target, anchor || null);
        if (why) broken.push(`${file}: [${t.raw}] → ${why}`);
      }
    }
    expect(checked).toBeGreaterThan(20);
    expect(broken).toEqual([]);
  });

  it("every docs/<page>.md#section named in code, help texts and tests exists", () => {
    const mention = /(?<![\w./-])docs\/([\w.-]+\.md)(?:#([\w-]+))?/g;
    const broken: string[] = [];
    let checked = 0;
    for (const { file, text } of textFiles) {
      for (const m of text.matchAll(mention)) {
        checked++;
        const why = brokenReason(`docs/${m[1]!}`, m[2] ?? null);
        if (why) broken.push(`${file}: ${m[0]} → ${why}`);
      }
    }
    expect(checked).toBeGreaterThan(20);
    expect(broken).toEqual([]);
  });

  it("finds a broken link, a missing heading and an outside pointer when there is one", () => {
    // The checks above pass only if they can fail: the same functions on known-bad input.
    expect(brokenReason(["docs", "no-such-page.md"].join("/"), null)).toMatch(/no tracked file/);
    expect(brokenReason("docs/http-api.md", "no-such-section")).toMatch(/has no heading/);
    expect(brokenReason("docs/http-api.md", "errors")).toBeNull();
    expect(brokenReason("docs", null)).toBeNull();
    expect(OUTSIDE.some((s) => `see ${["..", "shared", "x.md"].join("/")}`.includes(s))).toBe(true);
  });

  it("reads links and anchors as GitHub does: code is not a link, markup is not part of a slug", () => {
    const doc = new Lexer({ gfm: true }).lex(
      ["# `#sim:` syntax", "## Pause, resume and weights", "## Steps", "## Steps", "", "[a](x.md#b) `[c](y.md)`", "", "```", "[d](z.md)", "```", "", "| t |", "| - |", "| [e](w.md) |"].join("\n"),
    );
    expect([...headingAnchors(doc)]).toEqual(["sim-syntax", "pause-resume-and-weights", "steps", "steps-1"]);
    expect(linkTargets(doc).map((l) => l.href)).toEqual(["x.md#b", "w.md"]);
  });
});

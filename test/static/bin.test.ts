/**
 * The `rollgate` command the README's tutorial runs with `npx rollgate` must be linked by `npm ci`
 * on a fresh clone, before anything is built: npm only links a bin whose file exists then, so its
 * target is a committed file (tracked by git), not a build output.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../support/cluster.js";

const tracked = new Set(execFileSync("git", ["ls-files"], { cwd: REPO_ROOT, encoding: "utf8" }).split("\n"));

describe("the rollgate command", () => {
  it("is a committed, executable file that runs the built CLI", () => {
    const pkg = JSON.parse(readFileSync(path.join(REPO_ROOT, "apps/cli/package.json"), "utf8")) as { bin: Record<string, string> };
    const target = path.posix.join("apps/cli", pkg.bin.rollgate!);
    expect(tracked.has(target)).toBe(true);
    const mode = execFileSync("git", ["ls-files", "-s", target], { cwd: REPO_ROOT, encoding: "utf8" }).split(" ")[0];
    expect(mode).toBe("100755");
    // After the build it answers like the CLI itself.
    const help = execFileSync(process.execPath, [path.join(REPO_ROOT, target), "--help"], { encoding: "utf8" });
    expect(help).toMatch(/rollgate/);
    expect(help).toMatch(/submit/);
  });
});

/**
 * runtime.files and HOME files cannot land outside their folder: not by `..`, not by an absolute
 * path, not through a symbolic link (a folder link or a file link) left there before; and reading
 * a working-directory file (evaluators) does not follow a link out of it.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { RuntimeSpec } from "@rollgate/protocol";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { LocalRuntime, SandboxUnavailable } from "./local-runtime.js";
import { PathEscape, readFileInside, removeInside, writeFilesInside } from "./workdir.js";

let base: string;
let work: string;
let outside: string;

beforeEach(() => {
  base = mkdtempSync(path.join(os.tmpdir(), "rg-workdir-test-"));
  work = path.join(base, "work");
  outside = path.join(base, "outside");
  mkdirSync(work);
  mkdirSync(outside);
  writeFileSync(path.join(outside, "secret.txt"), "host secret");
});
afterEach(() => rmSync(base, { recursive: true, force: true }));

describe("writeFilesInside", () => {
  it("writes nested files inside", async () => {
    await writeFilesInside(work, { "a.txt": "A", "repo/./src/b.py": "B" });
    expect(readFileSync(path.join(work, "a.txt"), "utf8")).toBe("A");
    expect(readFileSync(path.join(work, "repo/src/b.py"), "utf8")).toBe("B");
  });

  it.each(["../x", "a/../../x", "/etc/x", "a\\..\\..\\x", "a/\0b"])("refuses %j", async (rel) => {
    await expect(writeFilesInside(work, { [rel]: "x" })).rejects.toThrow(PathEscape);
    expect(existsSync(path.join(base, "x"))).toBe(false);
  });

  it("refuses to write through a folder symlink that points outside", async () => {
    symlinkSync(outside, path.join(work, "link"));
    await expect(writeFilesInside(work, { "link/planted.txt": "x" })).rejects.toThrow(/symbolic link/);
    expect(existsSync(path.join(outside, "planted.txt"))).toBe(false);
  });

  it("refuses to overwrite through a file symlink (the target keeps its content)", async () => {
    symlinkSync(path.join(outside, "secret.txt"), path.join(work, "notes.txt"));
    await expect(writeFilesInside(work, { "notes.txt": "overwritten" })).rejects.toThrow(/symbolic link/);
    expect(readFileSync(path.join(outside, "secret.txt"), "utf8")).toBe("host secret");
  });

  it("refuses a dangling symlink too (it would create the file outside)", async () => {
    symlinkSync(path.join(outside, "new.txt"), path.join(work, "new.txt"));
    await expect(writeFilesInside(work, { "new.txt": "x" })).rejects.toThrow(PathEscape);
    expect(existsSync(path.join(outside, "new.txt"))).toBe(false);
  });

  it("refuses a symlink deeper in the path, even one that points back inside", async () => {
    mkdirSync(path.join(work, "d"));
    symlinkSync(work, path.join(work, "d", "loop"));
    await expect(writeFilesInside(work, { "d/loop/x.txt": "x" })).rejects.toThrow(/symbolic link/);
  });
});

describe("readFileInside", () => {
  it("reads files inside and nothing through a link that leaves the folder", async () => {
    writeFileSync(path.join(work, "ok.txt"), "fine");
    symlinkSync(path.join(outside, "secret.txt"), path.join(work, "reward.txt"));
    symlinkSync(outside, path.join(work, "dir"));
    symlinkSync(path.join(work, "ok.txt"), path.join(work, "inner-link.txt"));
    expect(await readFileInside(work, "ok.txt")).toBe("fine");
    expect(await readFileInside(work, "inner-link.txt")).toBe("fine");
    expect(await readFileInside(work, "reward.txt")).toBeNull();
    expect(await readFileInside(work, "dir/secret.txt")).toBeNull();
    expect(await readFileInside(work, "../outside/secret.txt")).toBeNull();
    expect(await readFileInside(work, "/etc/hostname")).toBeNull();
    expect(await readFileInside(work, "missing.txt")).toBeNull();
  });
});

describe("LocalRuntime", () => {
  it("fails sandbox creation (SandboxUnavailable, not a retry) for a path that escapes, and leaves no folder", async () => {
    const root = path.join(base, "root");
    const rt = new LocalRuntime({ root });
    const spec: RuntimeSpec = { kind: "local", files: { "../escape.txt": "x" }, prepare: [], image: null, keep: false, isolation: "none", egress: [] };
    await expect(rt.create("t-esc", spec)).rejects.toThrow(SandboxUnavailable);
    expect(existsSync(path.join(root, "escape.txt"))).toBe(false);
    expect(readdir(root)).toEqual([]);
  });

  it("makes its folders under a root that does not exist yet, and removes them whole, whether the agent left them empty or not", async () => {
    const root = path.join(base, "not-yet", "root");
    const rt = new LocalRuntime({ root });
    const spec: RuntimeSpec = { kind: "local", files: {}, prepare: [], image: null, keep: false, isolation: "none", egress: [] };
    const empty = await rt.create("t-empty", spec);
    expect(readdir(empty.describe()).sort()).toEqual([".rollgate-owner", "home", "tmp", "work"]);
    const filled = await rt.create("t-filled", spec);
    const r = await filled.exec(["sh", "-c", "mkdir -p deep/er && echo x > deep/er/f && echo y > \"$HOME/.rc\" && ln -s / link"], { env: { PATH: "/usr/bin:/bin", HOME: filled.home }, timeoutMs: 10_000 });
    expect(r.exitCode).toBe(0);
    await empty.destroy();
    await filled.destroy();
    expect(readdir(root)).toEqual([]);
    expect(rt.cleanupFailures).toBe(0);
  });

  it("an agent's symlink to a host file reads as absent to evaluators", async () => {
    const rt = new LocalRuntime({ root: path.join(base, "root2") });
    const sb = await rt.create("t-link", { kind: "local", files: {}, prepare: [], image: null, keep: false, isolation: "none", egress: [] });
    try {
      const r = await sb.exec(["ln", "-s", path.join(outside, "secret.txt"), "reward.txt"], { env: { PATH: "/usr/bin:/bin" }, timeoutMs: 10_000 });
      expect(r.exitCode).toBe(0);
      expect(await sb.readFile("reward.txt")).toBeNull();
      // HOME files refuse links as well.
      await sb.exec(["ln", "-s", outside, path.join(sb.home, ".config")], { env: { PATH: "/usr/bin:/bin" }, timeoutMs: 10_000 });
      await expect(sb.writeHomeFiles({ ".config/settings.json": "{}" })).rejects.toThrow(/symbolic link/);
      expect(existsSync(path.join(outside, "settings.json"))).toBe(false);
    } finally {
      await sb.destroy();
    }
  });
});

/** Whether this machine lets the test make a file immutable (root on a filesystem with attributes): a removal that really fails. */
function canMakeImmutable(): boolean {
  const dir = mkdtempSync("/var/tmp/rg-chattr-");
  try {
    writeFileSync(path.join(dir, "f"), "x");
    const ok = spawnSync("chattr", ["+i", path.join(dir, "f")]).status === 0;
    if (ok) spawnSync("chattr", ["-i", path.join(dir, "f")]);
    return ok;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe.skipIf(!canMakeImmutable())("LocalRuntime cleanup (needs chattr +i: root on ext4/xfs)", () => {
  it("a sandbox folder that cannot be removed is logged with its path and counted, not swallowed", async () => {
    const root = mkdtempSync("/var/tmp/rg-cleanup-");
    const warnings: { obj: Record<string, unknown>; msg: string }[] = [];
    const rt = new LocalRuntime({ root, log: { warn: (obj, msg) => warnings.push({ obj: obj as Record<string, unknown>, msg }) } });
    const sb = await rt.create("t-stuck", { kind: "local", files: { "stuck.txt": "x" }, prepare: [], image: null, keep: false, isolation: "none", egress: [] });
    const stuck = path.join(sb.workdir, "stuck.txt");
    expect(spawnSync("chattr", ["+i", stuck]).status).toBe(0);
    try {
      await sb.destroy();
      expect(rt.cleanupFailures).toBe(1);
      expect(warnings).toEqual([
        { msg: "cannot remove a sandbox's leftovers", obj: expect.objectContaining({ what: "sandbox folder", path: sb.describe(), cleanup_failures: 1, err: expect.stringMatching(/stuck\.txt|EPERM|not permitted/) }) },
      ]);
    } finally {
      spawnSync("chattr", ["-i", stuck]);
      rmSync(root, { recursive: true, force: true });
    }
  });
});

function readdir(p: string): string[] {
  return existsSync(p) ? readdirSync(p) : [];
}

describe("removeInside", () => {
  it("removes what is at the path (a link itself, not its target) and nothing outside the folder", async () => {
    writeFileSync(path.join(work, "reward.json"), "{}");
    await removeInside(work, "reward.json");
    expect(existsSync(path.join(work, "reward.json"))).toBe(false);
    symlinkSync(path.join(outside, "secret.txt"), path.join(work, "reward.txt"));
    await removeInside(work, "reward.txt");
    expect(readdirSync(work)).toEqual([]);
    expect(readFileSync(path.join(outside, "secret.txt"), "utf8")).toBe("host secret");
    // A folder link on the way is not followed out.
    symlinkSync(outside, path.join(work, "out"));
    await removeInside(work, "out/secret.txt");
    expect(readFileSync(path.join(outside, "secret.txt"), "utf8")).toBe("host secret");
    await removeInside(work, "missing/reward.json");
    await expect(removeInside(work, "../outside/secret.txt")).rejects.toThrow(PathEscape);
    expect(existsSync(path.join(outside, "secret.txt"))).toBe(true);
  });
});

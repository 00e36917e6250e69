import net from "node:net";
import { describe, expect, it } from "vitest";
import { startChild, stopChild } from "./children.js";
import { freePort } from "./ports.js";

/** A node process running `script`. */
const node = (name: string, script: string, options: Omit<Parameters<typeof startChild>[3], "env">) =>
  startChild(name, process.execPath, ["-e", script], { env: { ...process.env }, ...options });

describe("startChild / stopChild", () => {
  it("waits for the ready line, gives its capture, and stops the child with SIGTERM", async () => {
    const lines: string[] = [];
    const child = await node("ok", 'console.log("booting"); setTimeout(() => console.log("demo ready: http://x:1"), 50); setInterval(() => {}, 1000);', {
      ready: /^demo ready: (\S+)/,
      onLine: (l) => lines.push(l),
    });
    expect(child.ready).toBe("http://x:1");
    expect(lines).toEqual(["booting", "demo ready: http://x:1"]);
    await stopChild(child.proc);
    expect(child.proc.signalCode).toBe("SIGTERM");
  });

  it("fails when the child exits first, with its last output when the caller took the output", async () => {
    const started = node("early", 'console.error("bad flag --x"); process.exit(3);', { ready: /^never/, onLine: () => undefined });
    await expect(started).rejects.toThrow(/^early exited before it was ready \(3\); its last output:\nbad flag --x$/);
  });

  it("kills a child that is not ready in time", async () => {
    let pid: number | undefined;
    const started = node("slow", "setInterval(() => {}, 1000);", { ready: /^never/, timeoutMs: 300, onSpawn: (p) => (pid = p.pid), onLine: () => undefined });
    await expect(started).rejects.toThrow(/^slow did not become ready within 300 ms$/);
    await new Promise((r) => setTimeout(r, 100));
    expect(() => process.kill(pid!, 0)).toThrow();
  });

  it("SIGKILLs a child that ignores SIGTERM after the grace", async () => {
    const child = await node("stubborn", 'process.on("SIGTERM", () => {}); console.log("up"); setInterval(() => {}, 1000);', { ready: /^up$/, onLine: () => undefined });
    const t0 = Date.now();
    await stopChild(child.proc, 300);
    expect(child.proc.signalCode).toBe("SIGKILL");
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
  });
});

describe("freePort", () => {
  it("gives a port one can listen on", async () => {
    const port = await freePort();
    const srv = net.createServer();
    await new Promise<void>((resolve, reject) => srv.once("error", reject).listen(port, "127.0.0.1", resolve));
    await new Promise((r) => srv.close(r));
  });
});

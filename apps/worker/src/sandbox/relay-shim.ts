import type * as ChildProcess from "node:child_process";
import type * as Net from "node:net";

/**
 * The program that runs first inside a sealed bubblewrap sandbox: it listens on
 * 127.0.0.1:<port> of the sandbox's own network namespace, copies every connection byte for byte
 * to the worker's relay on a unix socket (bind-mounted into the sandbox), then runs the step's
 * argv and exits as it does. The agent's *_BASE_URL point at that port; the relay on the other
 * end decides what is let through (relay.ts), so this shim enforces nothing and trusts nothing.
 *
 * It is written to a file as the source of `relayShimMain` (see RELAY_SHIM_SOURCE) and run by
 * the worker's own node: it must be self-contained (no imports, no outer names), built-ins only.
 *
 * argv: <port> <relay socket path> <program> [args…]
 */
export function relayShimMain(): void {
  const net = process.getBuiltinModule("node:net") as typeof Net;
  const { spawn } = process.getBuiltinModule("node:child_process") as typeof ChildProcess;
  const [port, socketPath, program, ...args] = process.argv.slice(2);
  const fail = (code: number, message: string) => {
    process.stderr.write(`rollgate-sandbox: ${message}\n`);
    process.exit(code);
  };
  if (!port || !socketPath || !program) return fail(126, "usage: shim <port> <relay socket> <program> [args…]");
  const server = net.createServer((client) => {
    const relay = net.connect(socketPath);
    client.setNoDelay(true);
    relay.setNoDelay(true);
    client.on("error", () => relay.destroy());
    relay.on("error", () => client.destroy());
    client.on("close", () => relay.destroy());
    relay.on("close", () => client.destroy());
    client.pipe(relay).pipe(client);
  });
  server.on("error", (err) => fail(126, `cannot listen on 127.0.0.1:${port} for the gateway: ${err.message}`));
  server.listen(Number(port), "127.0.0.1", () => {
    const child = spawn(program, args, { stdio: "inherit" });
    // The name the container runtimes use too: the worker reads it as "the program could not start".
    child.on("error", (err) => fail(127, `cannot start ${program}: ${err.message}`));
    child.on("exit", (code, signal) => {
      if (signal) {
        // Die the way the program did, so the step reports its signal.
        process.removeAllListeners(signal);
        process.kill(process.pid, signal);
        setTimeout(() => process.exit(128), 1000).unref();
        return;
      }
      process.exit(code ?? 1);
    });
    for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"] as const) process.on(sig, () => child.kill(sig));
  });
}

/** The shim as a standalone ES module. */
export const RELAY_SHIM_SOURCE = `// rollgate sandbox relay shim (generated)\n(${relayShimMain.toString()})();\n`;

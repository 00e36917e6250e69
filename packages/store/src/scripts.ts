import { createHash } from "node:crypto";
import type { RedisClient } from "./client.js";

/** A Lua script of the store: its name (unique, `rollgate…`), how many of its arguments are keys, its body. */
export interface LuaScript {
  readonly name: string;
  readonly numberOfKeys: number;
  readonly lua: string;
}

/** A script as a command: its keys first, then its arguments. */
export type ScriptCommand = (...keysThenArgs: (string | Buffer)[]) => Promise<unknown>;

/** The reply Redis gives an EVALSHA of a script it does not hold. */
function isNoScript(err: unknown): boolean {
  return err instanceof Error && err.message.startsWith("NOSCRIPT");
}

/**
 * The given scripts as commands of this connection (and, as `<key>Buffer`, the same answering
 * binary strings as Buffers, for scripts that return binary values). Each runs by EVALSHA and
 * sends its body by EVAL only when the server does not know it yet (a fresh server, a restarted or
 * another cluster node, SCRIPT FLUSH), on Redis Cluster too (the keys route the command). Not
 * ioredis `defineCommand`: every auto-pipelined batch of a connection copies each command defined
 * on it, which cost a connection with the store's scripts about 25 µs of CPU per batch.
 */
export function scriptCommands<N extends string>(redis: RedisClient, scripts: Record<N, LuaScript>): Record<N | `${N}Buffer`, ScriptCommand> {
  const out = {} as Record<N | `${N}Buffer`, ScriptCommand>;
  // ioredis has these (every command has a Buffer form) but does not declare them; not `callBuffer`,
  // which loses its command name on an auto-pipelined connection.
  const binary = redis as unknown as Record<"evalshaBuffer" | "evalBuffer", (script: string, numberOfKeys: number, ...keysThenArgs: (string | Buffer)[]) => Promise<unknown>>;
  for (const key of Object.keys(scripts) as N[]) {
    const { numberOfKeys, lua } = scripts[key];
    const sha = createHash("sha1").update(lua).digest("hex");
    out[key] = (...keysThenArgs) =>
      redis.evalsha(sha, numberOfKeys, ...keysThenArgs).catch((err: unknown) => {
        if (!isNoScript(err)) throw err;
        return redis.eval(lua, numberOfKeys, ...keysThenArgs);
      });
    out[`${key}Buffer`] = (...keysThenArgs) =>
      binary.evalshaBuffer(sha, numberOfKeys, ...keysThenArgs).catch((err: unknown) => {
        if (!isNoScript(err)) throw err;
        return binary.evalBuffer(lua, numberOfKeys, ...keysThenArgs);
      });
  }
  return out;
}

import type { RedisClient } from "./client.js";

/** A Lua script of the store: its command name (unique, `rollgate…`), how many of its arguments are keys, its body. */
export interface LuaScript {
  readonly name: string;
  readonly numberOfKeys: number;
  readonly lua: string;
}

/** A script as a command: its keys first, then its arguments. */
export type ScriptCommand = (...keysThenArgs: (string | Buffer)[]) => Promise<unknown>;

const defined = new WeakMap<RedisClient, Set<string>>();

/**
 * The given scripts as commands of this connection (and, as `<key>Buffer`, the same answering
 * binary strings as Buffers, for scripts that return binary values), each registered with ioredis `defineCommand`
 * once per connection (a second store on the same connection reuses them). ioredis runs a defined
 * command by EVALSHA and sends the body only when the server does not know it yet (a fresh
 * connection, a restarted or another cluster node, SCRIPT FLUSH), on Redis Cluster too.
 */
export function scriptCommands<N extends string>(redis: RedisClient, scripts: Record<N, LuaScript>): Record<N | `${N}Buffer`, ScriptCommand> {
  let names = defined.get(redis);
  if (!names) defined.set(redis, (names = new Set()));
  const commands = redis as unknown as Record<string, ScriptCommand>;
  const out = {} as Record<N | `${N}Buffer`, ScriptCommand>;
  for (const key of Object.keys(scripts) as N[]) {
    const { name, numberOfKeys, lua } = scripts[key];
    if (!names.has(name)) {
      redis.defineCommand(name, { numberOfKeys, lua });
      names.add(name);
    }
    out[key] = (...keysThenArgs) => commands[name]!(...keysThenArgs);
    out[`${key}Buffer`] = (...keysThenArgs) => commands[`${name}Buffer`]!(...keysThenArgs);
  }
  return out;
}

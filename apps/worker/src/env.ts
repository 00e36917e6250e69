import { WorkerEnv, parseEnv } from "@rollgate/protocol";

export function loadWorkerEnv(env: Record<string, string | undefined> = process.env): WorkerEnv {
  return parseEnv(WorkerEnv, env);
}

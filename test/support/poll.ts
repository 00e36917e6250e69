import type { TaskRecord } from "@rollgate/protocol";

/** Calls `read` until `done(value)` holds or the time runs out; returns the last value either way. */
export async function poll<T>(read: () => Promise<T>, done: (value: T) => boolean, timeoutMs = 10_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let value = await read();
  while (!done(value) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, everyMs));
    value = await read();
  }
  return value;
}

/** Reads a task through the trainer API until it has ended; throws naming where it still is. */
export async function terminalTask(
  api: (path: string) => Promise<{ body: unknown }>,
  id: string,
  timeoutMs = 90_000,
  everyMs = 150,
): Promise<TaskRecord & { result: NonNullable<TaskRecord["result"]> }> {
  const r = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord | undefined, (t) => t?.result != null, timeoutMs, everyMs);
  if (!r?.result) throw new Error(`task ${id} is still ${r?.status}`);
  return r as TaskRecord & { result: NonNullable<TaskRecord["result"]> };
}

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

/**
 * Calls `onGone` once the process that started this one is gone (this process was re-parented):
 * a launcher killed by a signal it could not pass on (npm, a shell, `npx`) must not leave the
 * cluster running without it.
 */
export function watchParent(onGone: () => void, everyMs = 500): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid !== parent) {
      clearInterval(timer);
      onGone();
    }
  }, everyMs);
  timer.unref();
  return () => clearInterval(timer);
}

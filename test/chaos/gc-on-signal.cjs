// Preloaded into the gateway by the load test (NODE_OPTIONS=--expose-gc --require …): SIGWINCH (a signal
// close-with-grace leaves alone) runs
// a full garbage collection and prints the heap in use, so memory is measured after garbage is
// actually collected (V8 otherwise collects lazily when idle).
process.on("SIGWINCH", () => {
  if (typeof globalThis.gc === "function") {
    globalThis.gc();
    globalThis.gc();
  }
  const m = process.memoryUsage();
  process.stdout.write(`gc: heapUsed=${m.heapUsed} rss=${m.rss} external=${m.external} arrayBuffers=${m.arrayBuffers}\n`);
});

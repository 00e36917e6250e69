import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

// The chaos suite: real processes killed, restarted and overloaded on purpose (loopback only,
// bounded in count and time). Run from the repo root after `npm run build`:
//   npx vitest run --config test/chaos/vitest.config.ts
// The root vitest config leaves test/chaos out, so `npm test` stays fast; .ci/run runs it as its own step.
export default defineConfig({
  test: {
    root: fileURLToPath(new URL("../..", import.meta.url)),
    include: ["test/chaos/**/*.test.ts"],
    exclude: ["**/node_modules/**", "**/dist/**"],
    testTimeout: 5 * 60_000,
    hookTimeout: 2 * 60_000,
    pool: "forks",
    // One scenario at a time: each one loads the 2-core machine on purpose.
    fileParallelism: false,
  },
});

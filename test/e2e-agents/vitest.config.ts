import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

// The agent suite: the real agent CLIs (pinned in test/agents, installed by test/agents/install.sh)
// as harnesses through the whole system. Run from the repo root after `npm run build`:
//   test/agents/install.sh && npx vitest run --config test/e2e-agents/vitest.config.ts
// The root vitest config excludes this folder, so `npm test` stays fast; .ci/run runs it as its own step.
export default defineConfig({
  test: {
    root: fileURLToPath(new URL("../..", import.meta.url)),
    include: ["test/e2e-agents/**/*.test.ts"],
    exclude: ["**/node_modules/**", "**/dist/**"],
    testTimeout: 15 * 60_000,
    hookTimeout: 5 * 60_000,
    pool: "forks",
    fileParallelism: false,
  },
});

import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

// The request recorder (record-requests.ts): not a test suite, a job that writes the transforms
// tests' fixtures. Run by `npm run record:agent-requests` from the repository root.
export default defineConfig({
  test: {
    root: fileURLToPath(new URL("../..", import.meta.url)),
    include: ["test/agents/record-requests.ts"],
    exclude: ["**/node_modules/**", "**/dist/**"],
    testTimeout: 15 * 60_000,
    hookTimeout: 5 * 60_000,
    pool: "forks",
    fileParallelism: false,
  },
});

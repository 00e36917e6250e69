#!/usr/bin/env node
// Keys the test suite left in its Redis. Every test works under a key prefix of its own that
// starts with "test-" (plain keys `test-…` and hash-tagged `{test-…`) and deletes it afterwards.
//
//   node .ci/test-keys.mjs > before.json            # the test keys there are now, by prefix
//   node .ci/test-keys.mjs --since before.json      # exit 1, naming each prefix, if there are more now
//
// Uses REDIS_URL (default redis://127.0.0.1:6379).
import { readFileSync } from "node:fs";
import { Redis } from "ioredis";

const url = process.env.REDIS_URL || "redis://127.0.0.1:6379";
const redis = new Redis(url, { maxRetriesPerRequest: 2, lazyConnect: true });

/** `test-cli-1a2b3c4d:{t:x}:task` and `{test-cli-1a2b3c4d:q:rollouts}:…` → `test-cli-1a2b3c4d`. */
function prefixOf(key) {
  const bare = key.startsWith("{") ? key.slice(1) : key;
  return bare.split(/[:{}]/)[0];
}

async function testKeys() {
  const byPrefix = {};
  for (const pattern of ["test-*", "{test-*"]) {
    let cursor = "0";
    do {
      const [next, found] = await redis.scan(cursor, "MATCH", pattern, "COUNT", 1000);
      cursor = next;
      for (const key of found) byPrefix[prefixOf(key)] = (byPrefix[prefixOf(key)] ?? 0) + 1;
    } while (cursor !== "0");
  }
  return byPrefix;
}

await redis.connect();
try {
  const now = await testKeys();
  const sinceAt = process.argv.indexOf("--since");
  if (sinceAt === -1) {
    process.stdout.write(`${JSON.stringify(now)}\n`);
  } else {
    const before = JSON.parse(readFileSync(process.argv[sinceAt + 1], "utf8"));
    const left = Object.entries(now).filter(([p, n]) => n > (before[p] ?? 0));
    if (left.length > 0) {
      console.error(`ci: the tests left ${left.reduce((a, [, n]) => a + n, 0)} key(s) in ${url}, under these prefixes (a test that does not delete its keys):`);
      for (const [p, n] of left) console.error(`  ${p}: ${n - (before[p] ?? 0)} key(s), e.g. ${(await redis.scan("0", "MATCH", `*${p}*`, "COUNT", 1000))[1][0] ?? "?"}`);
      process.exitCode = 1;
    } else {
      console.log(`ci: the tests left no keys in ${url}`);
    }
  }
} finally {
  redis.disconnect();
}

// Raw BullMQ: a worker process that completes empty jobs (the floor for add → process).
import { Worker } from "bullmq";
import { Redis } from "ioredis";

const { REDIS_URL, QUEUE_PREFIX, QUEUE_NAME, CONCURRENCY } = process.env;
if (!QUEUE_NAME) throw new Error("QUEUE_NAME is required");
const connection = new Redis(REDIS_URL ?? "redis://127.0.0.1:6379", { maxRetriesPerRequest: null });
const worker = new Worker(QUEUE_NAME, async () => {}, { connection, prefix: QUEUE_PREFIX, concurrency: Number(CONCURRENCY ?? 4) });
worker.on("error", (err) => console.error(`raw worker: ${err.message}`));
const close = async () => {
  await worker.close();
  connection.disconnect();
  process.exit(0);
};
const stop = () =>
  void close().catch((err) => {
    console.error(err);
    process.exit(1);
  });
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
await worker.waitUntilReady();
console.log("raw worker ready");

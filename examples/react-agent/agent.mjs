#!/usr/bin/env node
// A ReAct loop in one file: the smallest honest agent. It talks to whatever OPENAI_BASE_URL
// points at (inside rollgate: the gateway's session URL), offers the model one `shell` tool,
// runs every call for real in the working directory, and stops when the model answers in text.
//
// Environment: OPENAI_BASE_URL, OPENAI_API_KEY (set by the rollgate worker),
// ROLLGATE_INSTRUCTION (the task), AGENT_MODEL (default "policy"), AGENT_MAX_STEPS (default 8),
// AGENT_STREAM (1: stream every answer and assemble it with the SDK, as streaming agents do).
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import OpenAI from "openai";

const run = promisify(execFile);
const client = new OpenAI(); // reads OPENAI_BASE_URL and OPENAI_API_KEY
const model = process.env.AGENT_MODEL ?? "policy";
const maxSteps = Number(process.env.AGENT_MAX_STEPS ?? 8);
const stream = process.env.AGENT_STREAM === "1";
const instruction = process.env.ROLLGATE_INSTRUCTION ?? process.argv.slice(2).join(" ");

const tools = [
  {
    type: "function",
    function: {
      name: "shell",
      description: "Run a bash command in the working directory and return its output.",
      parameters: {
        type: "object",
        properties: { command: { type: "string", description: "The bash command to run" } },
        required: ["command"],
      },
    },
  },
];

async function shell(command) {
  try {
    const { stdout, stderr } = await run("bash", ["-lc", command], { timeout: 60_000, maxBuffer: 1 << 20 });
    return `${stdout}${stderr}`.trim() || "(no output)";
  } catch (err) {
    return `exit ${err.code ?? "?"}: ${`${err.stdout ?? ""}${err.stderr ?? ""}`.trim() || err.message}`;
  }
}

const messages = [
  { role: "system", content: "You are a careful software agent. Use the shell tool to act; answer in plain text when done." },
  { role: "user", content: instruction },
];

for (let step = 0; step < maxSteps; step++) {
  const completion = stream
    ? await client.chat.completions.stream({ model, messages, tools }).finalChatCompletion()
    : await client.chat.completions.create({ model, messages, tools });
  const message = completion.choices[0].message;
  // Send the assistant turn back exactly as received, as agents on the OpenAI SDK do.
  messages.push(message);
  if (!message.tool_calls?.length) {
    console.log(message.content ?? "");
    process.exit(0);
  }
  for (const call of message.tool_calls) {
    let output;
    try {
      const args = JSON.parse(call.function.arguments);
      output = call.function.name === "shell" ? await shell(String(args.command)) : `unknown tool ${call.function.name}`;
    } catch (err) {
      output = `bad arguments: ${err.message}`;
    }
    console.error(`$ ${call.function.arguments}\n${output}`);
    messages.push({ role: "tool", tool_call_id: call.id, content: output });
  }
}
console.error(`stopped after ${maxSteps} steps without a final answer`);
process.exit(1);

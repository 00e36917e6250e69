import type { CommandSpec } from "../framework.js";
import type { Context } from "../output.js";
import { enginesCommand, pauseCommand, resumeCommand, weightsCommand } from "./admin.js";
import { branchCommand } from "./branch.js";
import { submitCommand } from "./submit.js";
import { taskCommand } from "./task.js";
import { tasksCommand } from "./tasks.js";
import { trajectoryCommand } from "./trajectory.js";
import { upCommand } from "./up.js";
import { watchCommand } from "./watch.js";

/** Every command, in the order `rollgate --help` lists them. */
export const allCommands: CommandSpec<Context>[] = [
  upCommand,
  submitCommand,
  tasksCommand,
  watchCommand,
  taskCommand,
  branchCommand,
  trajectoryCommand,
  pauseCommand,
  resumeCommand,
  weightsCommand,
  enginesCommand,
];

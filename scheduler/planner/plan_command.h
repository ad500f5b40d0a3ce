// The `cortado plan` and `cortado bench plan` subcommands. The launcher's
// `cortado` executable registers them; cortado_plan_tool is a stand-alone
// driver with the same two commands.
#pragma once

namespace CLI {
class App;
}

namespace cortado::planner {

// `plan`: decide and print the summary, the per-tensor table and the plan.
void addPlanCommand(CLI::App& app);
// `plan` under `bench`: decision time per bundled model (and a synthetic
// 1000-tensor model) and predicted speedups per codec.
void addPlanBenchCommand(CLI::App& benchApp);

}  // namespace cortado::planner

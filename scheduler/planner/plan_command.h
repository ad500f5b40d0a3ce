// The `cortado plan` and `cortado bench plan` subcommands, registered by the
// launcher's `cortado` executable (launcher/main.cc). They run in their
// CLI11 callbacks during parse() and throw cortado::Error on bad input.
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
// `scale` under `bench`: the simulator's allreduce and push/pull times from
// 16 to 1024 GPUs next to the alpha-beta formulas (scale_command.cc).
void addScaleBenchCommand(CLI::App& benchApp);

}  // namespace cortado::planner

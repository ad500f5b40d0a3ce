// Stand-alone driver for the planner's commands, until the launcher's
// `cortado` executable registers them: `cortado_plan_tool plan ...` and
// `cortado_plan_tool bench plan ...`.
#include <CLI/CLI.hpp>

#include <iostream>

#include "core/common/error.h"
#include "scheduler/planner/plan_command.h"

int main(int argc, char** argv) {
  CLI::App app{"Cortado planner (stand-alone driver of `cortado plan` and `cortado bench plan`)"};
  app.require_subcommand(1);
  cortado::planner::addPlanCommand(app);
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  cortado::planner::addPlanBenchCommand(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const cortado::Error& e) {
    std::cerr << "cortado_plan_tool: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

// Runs a program under mpirun (oversubscribed: this machine may have fewer cores than
// ranks), bounded by `timeout 60` so that a hang shows as exit status 124.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/process.h"

struct MpiRun {
  int exit_code;
  std::string output;
  double seconds;
};

inline MpiRun mpirun(int ranks, const std::string& program_and_args,
                     const std::string& mpirun_flags = "") {
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 10 60 " +
      std::string(OMNITRON_MPIRUN) + " -np " + std::to_string(ranks) + " --oversubscribe " +
      mpirun_flags + " " + program_and_args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult r = run_command(cmd);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {r.exit_code, r.output, seconds};
}

// The training losses a run logged to its metrics file (JSON lines with "lm_loss").
inline std::vector<double> losses_of(const std::filesystem::path& metrics,
                                     const std::string& key = "lm_loss") {
  std::vector<double> losses;
  std::ifstream in(metrics);
  const std::string field = "\"" + key + "\":";
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(field);
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + field.size())));
  }
  return losses;
}

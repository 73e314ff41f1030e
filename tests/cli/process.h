// Runs the omnitron binary the build just made (OMNITRON_BINARY) and captures its output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

struct ProcessResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// `env` is prefixed to the command ("VAR=value VAR2=value").
inline ProcessResult run_omnitron_env(const std::string& env, const std::string& args) {
  const std::string cmd = env + " " + std::string(OMNITRON_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

inline ProcessResult run_omnitron(const std::string& args) { return run_omnitron_env("", args); }

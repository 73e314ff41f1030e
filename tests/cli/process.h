// Runs the omnitron binary the build just made (OMNITRON_BINARY), or any command, and
// captures its output; reads a whole text file.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

struct ProcessResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, stdout and stderr together.
inline ProcessResult run_command(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// `env` is prefixed to the command ("VAR=value VAR2=value").
inline ProcessResult run_omnitron_env(const std::string& env, const std::string& args) {
  return run_command(env + " " + std::string(OMNITRON_BINARY) + " " + args);
}

inline ProcessResult run_omnitron(const std::string& args) { return run_omnitron_env("", args); }

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

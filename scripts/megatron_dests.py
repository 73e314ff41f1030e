#!/usr/bin/env python3
"""Writes src/config/megatron_dests.cpp: which Megatron-LM flag sets which argument name
(argparse `dest`), how, and Megatron's default, read from Megatron's own argument parser.

Primus's YAML files are written in these argument names (`add_bias_linear: false` is
`--disable-bias-linear`). Two Megatron versions are read: the current one (the flags
omnitron accepts) and the one Primus pins as its submodule (the names its files use,
some since renamed or removed).

    python3 scripts/megatron_dests.py CURRENT_MEGATRON_DIR PRIMUS_PINNED_MEGATRON_DIR

Each directory holds a Megatron-LM tree (its `megatron/` package). Megatron's import
chain wants torch, triton, apex and more; this script needs none of them: every module
that is missing is replaced by a stand-in that answers any attribute, which is enough
for argparse's definitions to run. Dests that the rule "key k is flag --k (dashes for
underscores), a value or a store_true switch, default None/False" gives are written as
bare names, many to a line; the others as rows.
"""
import argparse
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types
import typing

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "src", "config", "megatron_dests.cpp")
STANDINS = {"torch", "packaging", "triton", "numpy", "einops", "regex"}


class StandinMeta(typing._ProtocolMeta):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StandinMeta(name, (Standin,), {})

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return super().__call__()

    def __getitem__(cls, k):
        return cls

    def __add__(cls, o):
        return 0

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __add__
    __ge__ = __gt__ = lambda cls, o: True
    __le__ = __lt__ = lambda cls, o: False
    __hash__ = type.__hash__
    __or__ = __ror__ = lambda cls, o: cls


class Standin(metaclass=StandinMeta):
    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StandinMeta(name, (Standin,), {})

    def __call__(self, *a, **k):
        return Standin()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    __ge__ = __gt__ = lambda self, o: True
    __le__ = __lt__ = lambda self, o: False
    __eq__ = lambda self, o: self is o
    __hash__ = object.__hash__
    __int__ = __index__ = __len__ = lambda self: 0


class StandinModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StandinMeta(name, (Standin,), {})


class StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in STANDINS:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = StandinModule(spec.name)
        m.__path__ = []
        m.__version__ = "99.0.0"
        return m

    def exec_module(self, m):
        pass


def dump(megatron_dir):
    """Runs in a child process: prints dest, flags, action, default per line."""
    sys.path.insert(0, megatron_dir)
    sys.meta_path.insert(0, StandinFinder())
    typing.override = getattr(typing, "override", lambda f: f)
    import warnings

    warnings.simplefilter("ignore")
    from megatron.training import arguments

    captured = {}

    def capture(self, *a, **k):
        captured["parser"] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    argparse.ArgumentParser.parse_known_args = capture
    try:
        arguments.parse_args()
    except SystemExit:
        pass
    for act in captured["parser"]._actions:
        if act.option_strings and type(act).__name__ != "_HelpAction":
            print("\t".join([act.dest, ",".join(act.option_strings), type(act).__name__,
                             repr(act.default)]))


def read(megatron_dir):
    text = subprocess.run([sys.executable, __file__, "--dump", megatron_dir], check=True,
                          capture_output=True, text=True).stdout
    rows = {}
    for line in text.splitlines():
        dest, flags, action, default = line.split("\t")
        rows.setdefault(dest, (flags.split(","), action, default))
    return rows


ACTION = {"_StoreAction": "Value", "_StoreTrueAction": "StoreTrue",
          "_StoreFalseAction": "StoreFalse", "BooleanOptionalAction": "Both"}


def default_text(action, default):
    """Megatron's default as YAML would write it, or None for Python's None."""
    if default == "None":
        return None
    if default in ("True", "False"):
        return default.lower()
    if default.startswith("<"):  # an enum: <AttnBackend.auto: 5>
        return default[1:].split(":")[0].split(".")[-1]
    if default.startswith("["):  # a list: its items, space-separated
        return " ".join(x.strip().strip("'\"") for x in default[1:-1].split(",") if x.strip())
    return default.strip("'\"")


def derivable(dest, flags, action, default):
    identity = "--" + dest.replace("_", "-")
    return flags[0] == identity and (
        (action == "_StoreAction" and default == "None") or
        (action == "_StoreTrueAction" and default == "False"))


def c_string(s):
    return "nullptr" if s is None else '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--dump":
        return dump(sys.argv[2])
    current, pinned = read(sys.argv[1]), read(sys.argv[2])
    lines = []
    plain = {"_StoreAction": [], "_StoreTrueAction": []}
    for table, version in ((current, "Current"), (pinned, "Primus")):
        for dest, (flags, action, default) in sorted(table.items()):
            if version == "Primus" and dest in current:
                continue
            if version == "Current" and derivable(dest, flags, action, default):
                plain[action].append(dest)
                continue
            lines.append("    {%s, %s, %s, %s, %s}," % (
                c_string(dest), c_string(flags[0]), ACTION[action],
                c_string(default_text(action, default)), version))
    with open(OUT, "w") as f:
        f.write(HEADER)
        f.write("\n".join(lines) + "\n")
        f.write(MIDDLE)
        for name, dests in (("kPlainValueDests", plain["_StoreAction"]),
                            ("kPlainSwitchDests", plain["_StoreTrueAction"])):
            f.write("const char* const %s =\n" % name)
            line = ""
            for d in dests:
                if len(line) + len(d) + 1 > 90:
                    f.write('    "%s"\n' % line)
                    line = ""
                line += d + " "
            f.write('    "%s";\n' % line.rstrip())
        f.write(FOOTER)
    print(f"{len(lines)} rows and {sum(map(len, plain.values()))} plain names -> "
          f"{os.path.relpath(OUT)}")


HEADER = """\
// Megatron's argument names (argparse dests) and the flag that sets each, with Megatron's
// default: facts read from Megatron-LM's argument parser by scripts/megatron_dests.py
// (current Megatron at d98e8a64, and 5a676b36, the one Primus 2d42400 pins). Generated: edit
// the script, not this file. Dests the rule "key k is --k, a value or a store_true switch,
// default None or false" gives are listed by name only, at the end.
// clang-format off
#include "config/megatron_dests.h"

#include <algorithm>
#include <deque>
#include <sstream>
#include <unordered_map>

namespace omni {

const std::vector<MegatronDest>& megatron_dest_rows() {
  using enum DestAction;
  using enum MegatronVersion;
  static const std::vector<MegatronDest> rows = {
"""
MIDDLE = """\
  };
  return rows;
}

namespace {

// Current Megatron's dests that the plain rule gives, space-separated: values, then switches.
"""
FOOTER = """\

}  // namespace

const MegatronDest* find_megatron_dest(const std::string& dest) {
  static const std::unordered_map<std::string, MegatronDest> index = [] {
    static std::deque<std::string> names;  // the plain rows' dests and flags
    std::unordered_map<std::string, MegatronDest> m;
    for (const MegatronDest& row : megatron_dest_rows()) m.emplace(row.dest, row);
    for (auto [list, action] : {std::pair{kPlainValueDests, DestAction::Value},
                                std::pair{kPlainSwitchDests, DestAction::StoreTrue}}) {
      std::istringstream in(list);
      for (std::string d; in >> d;) {
        const char* name = names.emplace_back(d).c_str();
        std::string flag = "--" + d;
        std::replace(flag.begin(), flag.end(), '_', '-');
        m.emplace(d, MegatronDest{name, names.emplace_back(flag).c_str(), action,
                                  action == DestAction::StoreTrue ? "false" : nullptr,
                                  MegatronVersion::Current});
      }
    }
    return m;
  }();
  const auto it = index.find(dest);
  return it == index.end() ? nullptr : &it->second;
}

}  // namespace omni
"""

if __name__ == "__main__":
    main()

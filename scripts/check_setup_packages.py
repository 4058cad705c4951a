#!/usr/bin/python3
"""Fails when the build or the test fixtures need a Debian package that scripts/setup.sh does
not install (itself or through its Depends).

A fresh machine once failed the README's first command because oneDNN's CMake package file
needed ocl-icd-opencl-dev, which only happened to be installed on the developers' machines.
This check takes what a finished build actually used (the headers Ninja recorded, the link
lines and what the compiler driver adds to them, such as clang's sanitizer and libFuzzer
runtimes, the CMake package files and cache entries, the tools, the fixtures' Python modules),
asks dpkg which package owns each file, and compares that with the closure of setup.sh's list.
ctest runs it on the release and asan trees; scripts/test.sh also on build/fuzz (clang).

Usage: check_setup_packages.py --build-dir build/release [--packages FILE] [--without PKG]...
Exit status: 0 when every needed package is covered, 1 when one is not, 2 on an error.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
Graph = dict[str, list[list[str]]]  # package -> its Depends, each a list of alternatives


@dataclass(frozen=True)
class Use:
    path: str  # absolute, as the build named it
    why: str   # what used it, for the report: "header, included by x.o"


def error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)  # not 1: that would read as "a package is missing"


def run(cmd: list[str], check: bool = True, cwd: str | None = None) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)
    if check and result.returncode != 0:
        error(f"{shlex.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def base_name(package: str) -> str:
    """'libfmt-dev:amd64' -> 'libfmt-dev'; '<python3:any>' -> '<python3>' (virtual)."""
    name = package.strip("<>").split(":")[0]
    return f"<{name}>" if package.startswith("<") else name


# ---- the files the build used ------------------------------------------------------------

def read_cache(build: Path) -> dict[str, tuple[str, str]]:
    """CMakeCache.txt as {name: (type, value)}; empty when the tree is not configured."""
    files = (build / "CMakeCache.txt", build / "build.ninja")
    text = files[0].read_text() if all(f.exists() for f in files) else ""
    return {m[1]: (m[2], m[3]) for m in re.finditer(r"(?m)^(\w[^:=\n]*):([A-Z]+)=(.*)$", text)}


def headers(build: Path) -> list[Use]:
    """Every header of every object, as Ninja recorded it from the compiler's depfiles."""
    uses, target = [], ""
    for line in run(["ninja", "-C", str(build), "-t", "deps"]).splitlines():
        if line and not line[0].isspace():
            target = line.split(": #deps")[0]
        elif line.strip():
            uses.append(Use(str(build / line.strip()), f"header, included by {target}"))
    return uses


def find_library(name: str, search_dirs: list[str], compiler: str) -> str | None:
    """Resolves -lNAME as the linker does: the -L dirs first, then the compiler's defaults
    (-print-file-name echoes the bare name when it finds nothing)."""
    for file in (f"lib{name}.so", f"lib{name}.a"):
        found = [f"{d}/{file}" for d in search_dirs if os.path.exists(f"{d}/{file}")]
        found.append(run([compiler, f"-print-file-name={file}"]).strip())
        if os.path.isabs(found[0]):
            return found[0]
    return None


def link_inputs(build: Path, compiler: str) -> list[Use]:
    """The programs the build commands run, and the libraries of every link line."""
    uses = []
    for line in run(["ninja", "-C", str(build), "-t", "commands"]).splitlines():
        for seg in (shlex.split(part) for part in line.split(" && ")):
            if not seg or seg[0] == ":":
                continue
            if os.path.isabs(seg[0]):
                uses.append(Use(seg[0], f"tool {os.path.basename(seg[0])}, run by the build"))
            if seg[0] != compiler or "-c" in seg:
                continue  # not a link line
            target = seg[seg.index('-o') + 1] if '-o' in seg else '?'
            why = f"library, linked into {target}"
            uses += [Use(str(build / w), why) for w in seg
                     if re.search(r"\.(a|so(\.[0-9.]+)?)$", w) and not w.startswith("-")]
            lib_dirs = [w[2:] for w in seg if w.startswith("-L") and len(w) > 2]
            names = [w[2:] for w in seg if w.startswith("-l") and len(w) > 2]
            for name in names + (["gomp"] if "-fopenmp" in seg else []):
                path = find_library(name, lib_dirs, compiler)
                if path is None:
                    error(f"cannot find -l{name} ({why})")
                uses.append(Use(path, f"{why} (-l{name})"))
            uses += [Use(path, f"added by the compiler driver to the link of {target}")
                     for path in driver_link_inputs(seg, build)]
    return uses


def driver_link_inputs(link: list[str], build: Path) -> list[str]:
    """What the compiler driver adds to a link line itself: the linker, the start files and,
    for -fsanitize=, the sanitizer and libFuzzer runtimes (clang's libclang_rt.*.a, which
    libclang-rt-14-dev ships and no -l names). `-###` prints the linker's command line and
    runs nothing."""
    out = subprocess.run([*link, "-###"], capture_output=True, text=True, timeout=120,
                         cwd=build)
    if out.returncode != 0:
        error(f"{shlex.join(link)} -### failed ({out.returncode}): {out.stderr.strip()}")
    commands = [line for line in out.stderr.splitlines() if line.startswith(" ")]
    if not commands:
        error(f"{shlex.join(link)} -### printed no command")
    words = shlex.split(commands[-1])  # the link; earlier lines would be compiles
    return [w for w in words[:1] + [w for w in words[1:]
                                    if re.search(r"\.(a|o|so(\.[0-9.]+)?)$", w)]
            if os.path.isabs(w) and os.path.exists(w)]


BINUTILS = {f"CMAKE_{t}" for t in ("AR", "RANLIB", "LINKER", "NM", "OBJCOPY", "OBJDUMP", "READELF",
                                    "STRIP", "ADDR2LINE", "DLLTOOL", "TAPI", "MT", "CXX_COMPILER_AR",
                                    "CXX_COMPILER_RANLIB", "C_COMPILER_AR", "C_COMPILER_RANLIB")}


def cmake_inputs(cache: dict[str, tuple[str, str]]) -> list[Use]:
    """The package files find_package() read (the *_DIR entries), every path the cache found,
    and the tools (compiler, cmake, ctest, ninja)."""
    uses = [Use(cache[k][1], f"tool {k}") for k in ("CMAKE_CXX_COMPILER", "CMAKE_COMMAND",
                                                    "CMAKE_CTEST_COMMAND", "CMAKE_MAKE_PROGRAM")
            if k in cache]
    for key, (kind, value) in cache.items():
        # Not the install dirs (relative, or where files would go) nor *-NOTFOUND, nor the
        # binutils CMake looks for with every compiler (ar, ranlib, nm, strip, the linker...):
        # with clang it takes LLVM's when some happen to be installed, and whether the build
        # runs one shows in its commands (link_inputs).
        if (kind not in ("PATH", "FILEPATH") or key.startswith("CMAKE_INSTALL_")
                or key in BINUTILS or not os.path.isabs(value) or not os.path.exists(value)):
            continue
        if key.endswith("_DIR") and os.path.isdir(value):
            # The config and version files find_package() looks for, not every *.cmake beside
            # them: GTest's directory also holds libgmock-dev's files, which it reads OPTIONAL.
            package = key[: -len("_DIR")].lower()
            wanted = {package + s for s in ("config.cmake", "-config.cmake",
                                            "configversion.cmake", "-config-version.cmake")}
            uses += [Use(f"{value}/{f}", f"CMake package {key[:-4]} ({key})")
                     for f in sorted(os.listdir(value)) if f.lower() in wanted]
        uses.append(Use(value, f"CMake cache entry {key}"))
    return uses


def python_modules(python: str, hf_python: str) -> list[Use]:
    """The top-level modules that tests/fixtures/*.py import, as the Python that runs each finds
    them: `python` (PyTorch's), and `hf_python` (the repository's virtual environment, whose own
    packages come from PyPI and lie in the repository) for the hf_make_*.py scripts."""
    fixtures = REPO / "tests" / "fixtures"
    importers: dict[str, dict[str, str]] = {python: {}, hf_python: {}}
    for script in sorted(fixtures.glob("*.py")):
        by = importers[hf_python if script.name.startswith("hf_make_") else python]
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     and node.module else [])
            for name in (n.split(".")[0] for n in names):
                ours = (fixtures / f"{name}.py").exists() or (fixtures / name).is_dir()
                if not ours and name != "__future__":
                    by.setdefault(name, str(script.relative_to(REPO)))
    # Standard-library modules are checked too: Debian splits some into their own packages
    # (tkinter, distutils, venv). Built-in ones have no file and drop out. cwd=/ so that no
    # repository file shadows a module.
    probe = ("import importlib, sys\n"
             "for n in sys.argv[1:]:\n"
             "    try: f = getattr(importlib.import_module(n), '__file__', '') or ''\n"
             "    except Exception as e: f = '!' + repr(e)\n"
             "    print(n, f, sep='\\t')\n")
    uses = []
    for interpreter, names in importers.items():
        if not names:
            continue
        if interpreter == hf_python and not os.path.exists(hf_python):
            print(f"warning: {hf_python} does not exist (scripts/setup_venv.sh makes it): "
                  f"the imports of the hf_make_*.py fixtures are not checked")
            continue
        for line in run([interpreter, "-c", probe, *sorted(names)], cwd="/").splitlines():
            name, _, file = line.partition("\t")
            if name not in names:
                continue  # something a module printed while it was imported
            std = " (standard library)" if name in sys.stdlib_module_names else ""
            why = f"Python module {name}{std}, imported by {names[name]}"
            if file.startswith("!"):
                error(f"{interpreter} cannot import {name} ({why}): {file[1:]}")
            if file:
                uses.append(Use(file, why))
    return uses


# ---- which package owns each file ----------------------------------------------------------

def paths_to_ask(path: str) -> list[str]:
    """The path, every link it goes through, its real path, and their /usr-merged aliases:
    Debian 12 merged /usr, so dpkg may know /lib/x/libc.so.6 when the build named /usr/lib/x/..."""
    chain, p = [path], path
    while os.path.islink(p) and len(chain) < 40:
        p = os.path.normpath(os.path.join(os.path.realpath(os.path.dirname(p)), os.readlink(p)))
        chain.append(p)
    asked: dict[str, None] = {}
    for p in chain + [os.path.realpath(path)]:
        m = re.match(r"(/usr)?(/(?:s?bin|lib|lib32|lib64|libx32)/.*)", p)
        asked.update(dict.fromkeys([m[2], "/usr" + m[2]] if m else [p]))
    return list(asked)


def owners(paths: set[str]) -> dict[str, set[str]]:
    """path -> the packages dpkg says own it, in batches (dpkg -S reads its database once)."""
    owned: dict[str, set[str]] = {}
    ordered = sorted(paths)
    for i in range(0, len(ordered), 2000):
        # dpkg -S exits 1 when some path belongs to no package: that is an answer, not an error.
        for line in run(["dpkg", "-S", *ordered[i:i + 2000]], check=False).splitlines():
            if not line.startswith("diversion by") and ": " in line:
                packages, path = line.split(": ", 1)
                owned[path] = {base_name(p.strip()) for p in packages.split(",")}
    return owned


# ---- what setup.sh's list brings -----------------------------------------------------------

def parse_depends(text: str) -> tuple[Graph, dict[str, list[str]]]:
    """apt-cache depends --recurse output -> (the graph, virtual package -> its providers)."""
    graph: Graph = {}
    providers: dict[str, list[str]] = {}
    package, group, last = "", [], ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            package = base_name(line.strip())
            graph.setdefault(package, [])
        elif m := re.match(r" ([ |])(Depends|PreDepends): (\S+)", line):
            last = base_name(m[3])
            group.append(last)
            if m[1] == " ":  # " |Depends:" continues the group with the next alternative
                graph[package].append(group)
                group = []
        elif line.startswith("    ") and last.startswith("<"):  # a provider of `last`
            providers.setdefault(last, []).append(base_name(line.strip()))
    return graph, providers


def closure(roots: set[str], graph: Graph, providers: dict[str, list[str]]) -> set[str]:
    """The roots and what apt installs with them: every Depends, and for a choice (an OR-group,
    a virtual package) what apt picks: one already picked, else the first alternative."""
    def expand(alt: str) -> list[str]:
        return providers.get(alt, []) if alt.startswith("<") else [alt]

    have: set[str] = set()
    # A listed name may be virtual: apt installs a provider of it.
    todo = [((expand(f"<{r}>") if r not in graph else []) or [r])[0] for r in sorted(roots)]
    choices: list[list[str]] = []
    while todo:
        while todo:
            package = todo.pop()
            if package not in have:
                have.add(package)
                for group in graph.get(package, []):
                    candidates = list(dict.fromkeys(c for alt in group for c in expand(alt)))
                    if len(candidates) == 1:
                        todo.append(candidates[0])
                    elif candidates:
                        choices.append(candidates)
        todo = next(([c[0]] for c in choices if not have.intersection(c)), [])
    return have


def covered(listed: set[str]) -> tuple[set[str], set[str]]:
    """(the closure of the list, the listed names apt does not know)."""
    here: dict[str, list[str]] = {}  # virtual package -> the installed ones that provide it
    always = set()
    fmt = "${Package}\t${db:Status-Abbrev}\t${Essential}\t${Priority}\t${Provides}\n"
    for line in run(["dpkg-query", "-W", "-f", fmt]).splitlines():
        name, status, essential, priority, provides = line.split("\t")
        if status.startswith("ii"):
            for p in (p.split()[0] for p in provides.split(",") if p.strip()):  # "x (= 1.0)"
                here.setdefault(f"<{p}>", []).append(name)
            if essential == "yes" or priority == "required":
                always.add(name)  # every Debian system has these; setup.sh need not name them
    flags = ["--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks",
             "--no-replaces", "--no-enhances"]
    roots = listed | always
    graph, providers = parse_depends(
        run(["apt-cache", "depends", "--recurse", *flags, *sorted(roots)], check=False))
    if not graph:
        error("apt-cache depends knows none of the packages (is this Debian?)")
    # A virtual package is what provides it here (dpkg knows), else apt's first provider.
    for virtual, names in here.items():
        providers[virtual] = names + [p for p in providers.get(virtual, []) if p not in names]
    unknown = {p for p in listed if p not in graph and f"<{p}>" not in graph}
    return closure(roots, graph, providers), unknown


# ---- the report ----------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", required=True, type=Path, help="a configured, built tree")
    parser.add_argument("--packages", type=Path,
                        help="package names, one a line (default: bash scripts/setup.sh --list)")
    parser.add_argument("--without", action="append", default=[], metavar="PKG",
                        help="drop PKG from the list (to prove that the check can fail)")
    parser.add_argument("--verbose", action="store_true", help="list every needed package")
    args = parser.parse_args()
    build = args.build_dir.resolve()

    text = (args.packages.read_text() if args.packages
            else run(["bash", str(REPO / "scripts" / "setup.sh"), "--list"]))
    listed = {w for line in text.splitlines() for w in line.split("#")[0].split()}
    for name in args.without:
        if name not in listed:
            error(f"--without {name}: not in the package list")
        listed.discard(name)

    cache = read_cache(build)
    if "CMAKE_CXX_COMPILER" not in cache:
        error(f"{build} is not a configured CMake/Ninja build tree of a C++ project")
    # A preset may name the compiler without its directory (the fuzz preset: clang++-14); the
    # build's commands name the program CMake found on the PATH.
    kind, compiler = cache["CMAKE_CXX_COMPILER"]
    if not os.path.isabs(compiler):
        compiler = shutil.which(compiler) or error(f"CMAKE_CXX_COMPILER {compiler}: not on PATH")
        cache["CMAKE_CXX_COMPILER"] = (kind, compiler)
    python = cache.get("CABM_TORCH_PYTHON", ("", "/usr/bin/python3"))[1]
    hf_python = cache.get("CABM_HF_PYTHON", ("", str(REPO / ".venv/bin/python")))[1]
    ours = (str(REPO) + "/", str(build) + "/")
    uses: dict[str, Use] = {}
    for use in (headers(build) + link_inputs(build, compiler) + cmake_inputs(cache)
                + python_modules(python, hf_python)):
        path = os.path.normpath(use.path)
        if not path.startswith(ours) and not os.path.realpath(path).startswith(ours):
            uses.setdefault(path, use)

    asked = {path: paths_to_ask(path) for path in uses}
    owned = owners({p for paths in asked.values() for p in paths})
    have, unknown = covered(listed)

    # package (or "one of a, b" when several own a path, as for a directory) ->
    # {the path it owns: the path the build used, which may be a link to it}
    needed: dict[str, dict[str, str]] = {}
    missing: dict[str, dict[str, str]] = {}
    for path, paths in asked.items():
        hops = [p for p in paths if p in owned]
        if not hops:
            print(f"warning: no Debian package owns {path} ({uses[path].why})")
        for hop in hops:
            key = ", ".join(sorted(owned[hop]))
            key = key if len(owned[hop]) == 1 else f"one of {key}"
            if len(owned[hop]) == 1:
                needed.setdefault(key, {})[hop] = path
            if not owned[hop] & have:
                missing.setdefault(key, {})[hop] = path

    def example(files: dict[str, str]) -> str:
        hop, path = next(iter(files.items()))
        via = f", via {path}" if hop != path else ""
        more = f" and {len(files) - 1} more files" if len(files) > 1 else ""
        return f"{hop} ({uses[path].why}{via}){more}"

    if args.verbose:
        for package, files in sorted(needed.items()):
            print(f"needed {package}: {example(files)}")
    for name in sorted(unknown):
        print(f"unknown {name}: setup.sh lists it, but apt knows no such package")
    for package, files in sorted(missing.items()):
        print(f"missing {package}: {example(files)}")
    if missing or unknown:
        print(f"FAIL: scripts/setup.sh does not install {len(missing)} needed package(s)"
              + (f" and lists {len(unknown)} unknown one(s)" if unknown else ""))
        return 1
    print(f"ok: {len(uses)} files outside the repository, from {len(needed)} Debian packages, "
          f"all installed by the {len(listed)} packages of scripts/setup.sh "
          f"(with their Depends and the required ones: {len(have)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

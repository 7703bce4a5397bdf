"""The commands of the README and of the documentation pages run as written on a clone.

Every shell command of ``README.md`` and of every Markdown page under ``docs/`` is checked: each
line of a fenced ``bash`` block and each inline code span that starts with ``python``, ``pip`` or
``pytest``. A command written on several pages is checked once (a fenced block with the same
commands, an inline span with the same text or a fenced command equal to it).

- ``python run.py ...`` (one run) is run in-process (:func:`nest.app.cli.run`, outputs in a tmp
  directory) and must plan, unless it is in :data:`SLOW_RUNS`; then, like every job of a multirun
  (``-m``, each value of each swept key, the experiment's own sweep included), its config is
  composed with the same overrides, the problem built and the planner instantiated.
- ``python -m MODULE ...`` runs in-process with ``sys.argv`` as written, except the long
  benchmarks in :data:`SLOW_MODULES`, whose ``--help`` must list every flag the command uses; a
  module that is a Hydra app composes its own config instead.
- Every input file a command names (a ``*_path`` / ``path`` config value, a ``python -m``
  argument) exists in the repository; ``outputs/...`` and ``multirun/...`` directories are the
  ones an earlier command of the same block wrote (``hydra.run.dir`` / ``hydra.sweep.dir``).
- Fenced commands hold no placeholders (``<time>``, ``DIR``, ``[--flag]``); an inline span with
  one is a synopsis: its module must exist and know its flags.
- ``pip install`` extras exist in ``pyproject.toml``; ``pytest`` is this suite; ``mkdocs build``
  / ``serve`` has its ``mkdocs.yml``.

The README stays a front door (at most :data:`README_MAX_LINES` lines), and every relative link
or image of the README and of the pages points at a file of the repository.
"""

import contextlib
import importlib
import importlib.util
import io
import re
import runpy
import shlex
import sys
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf

import nest.app.cli
from nest.app.config import build_problem

REPO_ROOT = Path(nest.app.cli.CONF_DIR).parent
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
README_MAX_LINES = 200

SLOW_RUNS = {
    # 1024 microbatches simulated and drawn: 6 s of CPU, more than the rest of this file
    "solver=nest model=gpt3_175b cluster=tpuv4_fattree cluster.devices=1024 "
    "training.global_batch=65536 training.microbatch_sizes=[1] simulate=true",
    # 1000 evaluations for robust=true: 10 s of CPU (25-40 s with 96-chunk interleaved plans)
    "solver=nest model=gpt3_175b cluster=tpuv4_fattree cluster.devices=1024 "
    "training.global_batch=4096 training.microbatch_sizes=[1,2,4,8] solver.top_k=5 robust=true",
}
SLOW_MODULES = {
    "experiments.bench_search": (
        "a minute: the CLI's four cases (15 large cases with --series, 9 with --graphs)"
    ),
    "experiments.fig5_baselines": "minutes: every planner on 50 cases",
    "experiments.optimality.scaling": "minutes: exact solvers up to their 60 s limit",
}
OUTPUT_PREFIXES = ("outputs/", "multirun/")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
PLACEHOLDER = re.compile(r"<[^>]*>|^\[|^[A-Z][A-Z_]+\]?$|/[A-Z][A-Z_]+(/|$)")
"""``<time>``, ``[--json]`` (or ``[--baseline NAME]``), ``DIR``, ``PATH/TO/file``."""


@dataclass(frozen=True)
class Command:
    tokens: tuple[str, ...]
    line: int
    fenced: bool
    expect: str | None = None
    """The status the page says the command ends with (``... gives `infeasible: ...```), if
    it is shown as an example of a refusal; None: it must find a plan."""
    page: str = "README.md"

    def __str__(self) -> str:
        return shlex.join(self.tokens)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(text: str, page: str = "README.md") -> list[list[Command]]:
    """The commands of each ``bash`` block, in order (a trailing backslash continues a line,
    ``&&`` separates two commands, ``#`` starts a comment)."""
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) != "bash":
            continue
        first = text[: match.start()].count("\n") + 2
        commands = []
        lines = match.group(2).split("\n")
        joined, start = "", first
        for k, raw in enumerate(lines):
            if not joined:
                start = first + k
            joined += raw
            if raw.endswith("\\"):
                joined = joined[:-1] + " "
                continue
            for part in _split_and(shlex.split(joined, comments=True)):
                commands.append(Command(tuple(part), start, True, page=page))
            joined = ""
        blocks.append(commands)
    return blocks


def inline_commands(text: str, page: str = "README.md") -> list[Command]:
    """Inline code spans (possibly wrapped over lines) that are shell commands."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    commands = []
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        span = " ".join(match.group(1).split())
        if span == "pytest" or span.startswith(("python ", "pip ", "pytest ", "mutmut ")):
            line = prose[: match.start()].count("\n") + 1
            said = re.match(r"\s*gives\s+`(infeasible|error):", prose[match.end() :])
            for part in _split_and(shlex.split(span)):
                commands.append(
                    Command(tuple(part), line, False, said and said.group(1), page=page)
                )
    return commands


def _split_and(tokens: list[str]) -> list[list[str]]:
    parts, current = [], []
    for token in tokens:
        if token == "&&":
            parts.append(current)
            current = []
        else:
            current.append(token)
    return [p for p in parts + [current] if p]


def placeholders(command: Command) -> list[str]:
    return [t for t in command.tokens[1:] if "=" not in t and PLACEHOLDER.search(t)]


# ------------------------------------------------------------------------------ the checkers
class Checker:
    """Runs or checks the commands of one block in order; outputs go under ``tmp``."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.written: dict[str, bool] = {}  # output dir -> really written (False: composed only)
        self.count = 0

    def check(self, command: Command) -> None:
        tokens = list(command.tokens)
        if command.fenced:
            assert not placeholders(command), f"{command.where}: placeholder in {command}"
        if tokens[0] == "pip":
            self._pip(tokens)
        elif tokens[0] == "pytest":
            # the suite, on every core (addopts) or in one process
            assert tokens in (["pytest"], ["pytest", "-n", "0"]), command
        elif tokens[0] == "mkdocs":
            # the documentation site: its config at the root, a command mkdocs has
            assert (REPO_ROOT / "mkdocs.yml").is_file(), command
            assert tokens[1:2] in (["build"], ["serve"]), command
        elif tokens[:2] == ["python", "run.py"]:
            self._run_py(tokens[2:], str(command), command.expect)
        elif tokens[:2] == ["python", "-m"]:
            self._module(tokens[2], tokens[3:], synopsis=bool(placeholders(command)))
        elif tokens[0] == "mutmut":
            # mutation testing (minutes to hours): configured in pyproject.toml, a subcommand
            # mutmut has; not run here
            pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
            assert "mutmut" in pyproject["tool"], command
            assert tokens[1:2] in (["run"], ["results"], ["show"], ["browse"]), command
        elif (
            tokens[0] == "python"
            and "-c" in tokens
            and tokens[1:]
            in (
                ["-c", tokens[-1]],
                ["-X", "importtime", "-c", tokens[-1]],
            )
        ):
            # a one-line program (an import to time): it compiles and runs
            exec(compile(tokens[-1], str(command), "exec"), {"__name__": "__readme__"})
        else:
            raise AssertionError(f"{command.where}: not a command this check knows: {command}")

    def _pip(self, tokens: list[str]) -> None:
        extras = set(
            tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
                "optional-dependencies"
            ]
        )
        for token in tokens:
            if match := re.fullmatch(r"\.\[(.*)\]", token):
                assert set(match.group(1).split(",")) <= extras, token

    # -- python run.py
    def _run_py(self, args: list[str], text: str, expect: str | None = None) -> None:
        multirun = bool({"-m", "--multirun"} & set(args))
        overrides = [a for a in args if a not in ("-m", "--multirun")]
        out = self._output(overrides, "hydra.sweep.dir" if multirun else "hydra.run.dir")
        plain = " ".join(o for o in overrides if not o.startswith(("hydra.", "hydra/")))
        if multirun or plain in SLOW_RUNS:
            for job in self._jobs(nest.app.cli.CONF_DIR, "config", overrides):
                self._build(job)
            if out:
                self.written[out] = False
            return
        cfg = self._compose(nest.app.cli.CONF_DIR, "config", overrides)
        self._files(cfg)
        self.count += 1
        run_dir = self.tmp / (out or f"run{self.count}")
        result = nest.app.cli.run(cfg, run_dir, echo=lambda line: None)
        if expect is not None:  # shown as an example of a refusal: it must be refused so
            assert result["status"] == expect, (text, result["status"])
            return
        assert result["status"] in ("optimal", "feasible"), (text, result.get("error"))
        if out:
            self.written[out] = True

    def _output(self, overrides: list[str], key: str) -> str | None:
        for o in overrides:
            if o.startswith(key + "="):
                value = o.split("=", 1)[1]
                assert value.startswith(OUTPUT_PREFIXES), f"{o}: write under outputs/ or multirun/"
                return value
        return None

    def _compose(self, conf_dir: str, name: str, overrides: list[str], hydra_cfg=False):
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            return compose(config_name=name, overrides=overrides, return_hydra_config=hydra_cfg)

    def _jobs(self, conf_dir: str, name: str, overrides: list[str]):
        """The composed configs of a multirun: each value of each swept key (the command's and
        the experiment's ``hydra.sweeper.params``), the other keys at their first value."""
        parser = OverridesParser.create()
        fixed, swept = [], {}
        for o in parser.parse_overrides(overrides):
            if o.is_sweep_override():
                swept[o.key_or_group] = list(o.sweep_string_iterator())
            else:
                fixed.append(o.input_line)
        whole = self._compose(conf_dir, name, fixed, hydra_cfg=True)
        params = whole.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params else {}
        for key, value in params.items():
            if key not in swept:
                (o,) = parser.parse_overrides([f"{key}={value}"])
                swept[key] = list(o.sweep_string_iterator()) if o.is_sweep_override() else [value]
        # a long range (seeds) is checked at its ends; a list of names value by value
        swept = {k: v if len(v) <= 20 else [v[0], v[-1]] for k, v in swept.items()}
        firsts = {k: v[0] for k, v in swept.items()}
        seen = set()
        for key, values in swept.items():
            for value in values:
                job = {**firsts, key: value}
                frozen = tuple(sorted(job.items()))
                if frozen not in seen:
                    seen.add(frozen)
                    yield self._compose(
                        conf_dir, name, fixed + [f"{k}={v}" for k, v in job.items()]
                    )

    def _build(self, cfg) -> None:
        self._files(cfg)
        build_problem(cfg)
        instantiate(cfg.solver, _convert_="all")

    def _files(self, cfg) -> None:
        plain = OmegaConf.to_container(cfg, resolve=True)
        for key, value in _leaves(plain):
            if isinstance(value, str) and (
                key.endswith("path") or value.endswith((".json", ".csv"))
            ):
                assert (REPO_ROOT / value).exists(), f"{key}={value} is not in the repository"

    # -- python -m
    def _module(self, module: str, args: list[str], synopsis: bool) -> None:
        spec = importlib.util.find_spec(module)
        assert spec is not None, f"no module {module}"
        source = Path(spec.origin).read_text()
        if "@hydra.main" in source:
            conf_dir = importlib.import_module(module).CONF_DIR
            name = re.search(r'config_name="(\w+)"', source).group(1)
            for job in self._jobs(conf_dir, name, [a for a in args if a not in ("-m",)]):
                assert job is not None
            return
        outputs_missing = any(
            a.startswith(OUTPUT_PREFIXES) and not self.written.get(a.rstrip("/"), False)
            for a in args
        )
        for arg in args:
            if arg.startswith(OUTPUT_PREFIXES):
                assert arg.rstrip("/") in self.written, f"{arg}: no earlier command writes it"
            elif _is_input_path(arg):
                assert (REPO_ROOT / arg).exists(), f"{arg} is not in the repository"
        if synopsis or module in SLOW_MODULES or outputs_missing:
            flags = [re.sub(r"[\[\]]", "", a) for a in args if a.lstrip("[").startswith("--")]
            if not flags:
                importlib.import_module(module)
                return
            help_text = self._main(module, ["--help"], expect_exit=0)
            for flag in flags:
                assert flag in help_text, f"{module} has no {flag}"
            return
        argv = [str(self.tmp / a) if a.startswith(OUTPUT_PREFIXES) else a for a in args]
        self._main(module, argv)

    def _main(self, module: str, argv: list[str], expect_exit: int | None = None) -> str:
        saved = sys.argv
        sys.argv = [module, *argv]
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer), warnings.catch_warnings():
                # runpy warns that the module was imported before: running it again as
                # __main__ is what ``python -m`` does in a fresh process
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(module, run_name="__main__", alter_sys=False)
        except SystemExit as stop:
            assert stop.code in (0, None) if expect_exit is None else stop.code == expect_exit, (
                module,
                argv,
                stop.code,
            )
        else:
            assert expect_exit is None, f"{module} {argv}: expected exit {expect_exit}"
        finally:
            sys.argv = saved
        return buffer.getvalue()


def _is_input_path(arg: str) -> bool:
    looks = "/" in arg or arg.endswith((".csv", ".json"))
    return looks and not arg.startswith("-") and not PLACEHOLDER.search(arg)


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for v in tree:
            yield from _leaves(v, prefix)
    else:
        yield prefix.rstrip("."), tree


def _page_name(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def _commands(pages: list[Path]) -> tuple[list[list[Command]], list[Command]]:
    """The fenced blocks and inline commands of the pages, each checked once."""
    blocks, inline, seen_blocks, seen_inline = [], [], set(), set()
    for path in pages:
        text, page = path.read_text(), _page_name(path)
        for block in fenced_blocks(text, page):
            key = tuple(str(c) for c in block)
            if key not in seen_blocks:
                seen_blocks.add(key)
                blocks.append(block)
        for command in inline_commands(text, page):
            key = (str(command), command.expect)
            if key not in seen_inline:
                seen_inline.add(key)
                inline.append(command)
    fenced = {str(c) for block in blocks for c in block}
    inline = [c for c in inline if c.expect is not None or str(c) not in fenced]
    return blocks, inline


BLOCKS, INLINE = _commands(PAGES)


def test_the_pages_have_the_commands_this_check_expects():
    """The extraction itself: the README's commands, multi-line blocks and wrapped inline spans
    on the documentation pages."""
    readme = fenced_blocks(README.read_text())
    in_readme = [str(c) for block in readme for c in block]
    assert "python run.py solver=nest cluster=dgx_8x8 model=llama2_7b" in in_readme
    assert "pip install -e ." in in_readme and "pip install -e '.[dev]'" in in_readme
    assert any(c.startswith("python run.py -m solver=nest,megatron") for c in in_readme)
    assert "pytest" in in_readme
    fenced = [str(c) for block in BLOCKS for c in block]
    assert any("cluster.devices=64 training.global_batch=4096" in c for c in fenced)
    inline = [str(c) for c in INLINE]
    assert any(
        c.startswith("python run.py -m solver=nest,megatron,recipes,phaze,mcmc,alpa")
        for c in inline
    )
    assert {c.page for block in BLOCKS for c in block} > {"README.md", "docs/getting-started.md"}
    assert len(fenced) >= 10 and len(inline) >= 10


def test_the_readme_is_a_front_door():
    """The README says what the tool answers and the two commands; the pages hold the rest."""
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(?<!`)`[^`]+`(?!`)")


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line, target) of each Markdown link or image outside code, without web addresses and
    in-page anchors; a target's own ``#anchor`` is dropped."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    prose = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose)
    links = []
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        links.append((prose[: match.start()].count("\n") + 1, target.split("#", 1)[0]))
    return links


@pytest.mark.parametrize("page", PAGES, ids=[_page_name(p) for p in PAGES])
def test_relative_links_point_at_files(page):
    missing = [
        f"line {line}: {target}"
        for line, target in relative_links(page.read_text())
        if not (page.parent / target).exists()
    ]
    assert not missing, f"{_page_name(page)} links to files that do not exist: {missing}"


def test_relative_links_are_found():
    text = "[a](docs/x.md#y) ![b](img/p.png) [c](https://e.org) [d](#top) `[e](no.md)`\n"
    text += "```\n[f](code.md)\n```\n"
    assert relative_links(text) == [(1, "docs/x.md"), (1, "img/p.png")]


@pytest.mark.parametrize("block", BLOCKS, ids=[b[0].where if b else "empty" for b in BLOCKS])
def test_fenced_block_runs_as_written(block, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    checker = Checker(tmp_path)
    for command in block:
        checker.check(command)


@pytest.mark.parametrize("command", INLINE, ids=[c.where for c in INLINE])
def test_inline_command_runs_as_written(command, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    Checker(tmp_path).check(command)


@pytest.mark.parametrize(
    "text, found",
    [
        (
            "python -m nest.explain outputs/<date>/<time> [--json]",
            ["outputs/<date>/<time>", "[--json]"],
        ),
        ("python -m experiments.aggregate DIR", ["DIR"]),
        ("python -m experiments.aggregate d [--baseline NAME]", ["[--baseline", "NAME]"]),
        ("python -m nest.validate experiments/validation/cases.csv", []),
        ("python run.py model.path=my_profile.json", []),
    ],
)
def test_placeholders_are_recognised(text, found):
    assert placeholders(Command(tuple(shlex.split(text)), 0, True)) == found

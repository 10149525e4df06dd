"""Every command README.md and docs/*.md show is checked, so none goes stale.

Pages are discovered (README.md and every docs/*.md), and every ```bash block in them is read as commands
(`\\` continuations joined, `&&` chains split, comments dropped; synopses with placeholders belong in ```text
blocks). Each command is then:
- a raylm command (`raylm ...`, `python -m raylm ...`, or the raylm part of `ray job submit ... -- raylm ...`):
  parsed by raylm's real parser into its settings (an eval's EvalConfig built and validated, a sweep file loaded, a
  probe file read), and, where it would run offline here (a local model or --demo), every path it names must
  exist. It is not run, because running the page's copy proves nothing the tests of that command do not; and
  that is checked, not assumed: some test in tests/ must run the same subcommand with each flag the page's
  command uses (flags_run_by_tests() reads every raylm command line the tests run: main([...]), run_cli(...) and
  `-m raylm` argv lists, with the names, helpers and parametrize values they are built from);
- `python - <<'EOF' ...`: run (a page's own script, which nothing else runs); `python -c ...`: compiled;
- else one of the commands exercised elsewhere (EXERCISED_ELSEWHERE: installs and the suite by .ci/run, the
  benchmarks by their own runs, cluster launchers needing a cluster), whose files must exist. Anything else fails.
```python blocks must compile and import only names that exist.

docs/cli.md's flag reference is the parser's own --help text (`python tests/test_docs.py --write` rewrites it),
and docs/switching-from-lm-eval.md's flag table names every lm-eval flag raylm renames or refuses.
"""

from __future__ import annotations

import ast
import functools
import glob
import importlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI_PAGE = REPO / "docs" / "cli.md"
GENERATED = "<!-- generated from the parser: python tests/test_docs.py --write -->"
COMMANDS = ("eval", "sweep", "ppl", "kl", "probe", "contamination", "membership", "compare", "report", "tasks")
HELP_COLUMNS = "100"
# Commands whose first words are these are exercised elsewhere; the reason says where.
EXERCISED_ELSEWHERE = {
    ("python3", "-m", "venv"): ".ci/run makes a fresh virtual environment exactly so",
    (".",): ".ci/run activates its virtual environment exactly so",
    ("pip", "install"): ".ci/run installs as the README says",
    ("python", "-m", "pytest"): ".ci/run runs the suite",
    ("python", "tests/fixture_data.py"): "tests/conftest.py unpacks the tests' data with it",
    ("python", "tests/offline_tasks.py"): "tests/conftest.py's local_tasks fixture calls it",
    ("python", "bench/"): "a benchmark, run on a quiet machine (tests/test_bench_gpu_driver.py runs the GPU one)",
    ("bash", "bench/"): "the GPU benchmark, run on a GPU machine",
    ("ray", "up"): "needs a cloud account (cluster.yaml validates in tests/test_cluster_config.py)",
    ("ray", "down"): "needs a cloud account",
    ("ray", "dashboard"): "needs a launched cluster",
    ("ray", "rsync-down"): "needs a launched cluster",
    ("docker", "build"): "needs Docker (tests/test_rayjob.py checks the Dockerfile's FROM and install lines)",
    ("sbatch",): "needs a Slurm cluster; docs/cluster.md says the recipe is untested",
    ("ray", "start"): "starts a cluster (tests/test_job_submit.py does, against a real head)",
    ("ray", "get-auth-token"): "writes the user's ~/.ray/auth_token (tests/test_job_submit.py makes its token with "
                               "the same generator, in a file of its own, and runs a token-authenticated cluster)",
    ("ray", "stop"): "stops the user's own cluster (never in tests: it stops every Ray on the machine)",
    ("kubectl",): "needs a Kubernetes cluster",
    ("helm",): "needs a Kubernetes cluster",
}


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # docs/*/ hold generated files


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[tuple[list[str], str, bool]]:
    """The block's commands as (argv, heredoc, refused): heredoc is what a `<<'EOF'` line feeds the command."""
    out = []
    lines = iter(block.replace("\\\n", " ").splitlines())
    for line in lines:
        heredoc = ""
        if (here := re.search(r"<<'?(\w+)'?", line)) is not None:
            body = []
            for following in lines:
                if following == here.group(1):
                    break
                body.append(following)
            heredoc = "\n".join(body) + "\n"
            line = line[:here.start()]
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append((words[:cut], heredoc, _refused(line)))
            words = words[cut + 1:]
    return [(argv, heredoc, refused) for argv, heredoc, refused in out if argv]


def _refused(line: str) -> bool:
    """A command the page shows being refused says so in its comment (`# ...: refused, naming why`)."""
    return "#" in line and re.search(r"\brefused\b", line.split("#", 1)[1]) is not None


def every_command() -> list[tuple[str, list[str], str, bool]]:
    return [(str(page.relative_to(REPO)), argv, heredoc, refused) for page in pages()
            for block in blocks(page, "bash") for argv, heredoc, refused in commands(block)]


def without_timeout(argv: list[str]) -> list[str]:
    """`timeout [-s SIGNAL] SECONDS command...` -> command: the page kills it to show a resume; run here whole."""
    if argv[:1] != ["timeout"]:
        return argv
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("-s", "--signal", "-k", "--kill-after") else rest[1:]
    return rest[1:]


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        key, _, value = argv[0].partition("=")
        env[key] = value.replace("$PWD", str(REPO))
        argv = argv[1:]
    return env, argv


def raylm_part(argv: list[str]) -> list[str] | None:
    if argv[:1] == ["raylm"]:
        return argv[1:]
    if argv[:3] == ["python", "-m", "raylm"]:
        return argv[3:]
    if argv[:3] == ["ray", "job", "submit"] and "--" in argv:
        return raylm_part(argv[argv.index("--") + 1:])
    return None


def _option(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def parsed(argv: list[str]):
    """raylm's own reading of the command: its settings, or a failure naming why."""
    from raylm.cli import config_from_args, parse_args

    if "--help" in argv or "-h" in argv:
        with pytest.raises(SystemExit) as exited, redirect_stdout(io.StringIO()):
            parse_args(argv)
        assert exited.value.code == 0, argv
        return None, None
    args = parse_args(argv)
    if args.command == "eval":
        return args, config_from_args(args)
    if args.command == "sweep":
        from raylm.sweep.config import load_sweep

        return args, load_sweep(REPO / args.file)
    if args.command == "probe" and args.probes is not None:
        from raylm.probe.file import load_probes

        return args, load_probes(REPO / args.probes)
    return args, None


def runs_offline(args) -> bool:
    """A command whose model is here (a local model, or the demo): an eval, ppl or scan a reader can run offline
    from a checkout; sweeps and probes only parse."""
    from raylm.models.spec import looks_local

    if args is None or args.command not in ("eval", "ppl", "contamination"):
        return False
    if args.command == "contamination":
        return True
    model = args.model or ("demo" if getattr(args, "demo", False) else None)
    return model == "demo" or (model is not None and looks_local(model) and (REPO / model).exists())


def named_paths(args, argv: list[str]) -> list[str]:
    """The inputs a command that runs offline reads, relative to the checkout: they must exist there. A page's
    earlier command can write one (a scan that --decontaminate then reads), so outputs written before count."""
    if args.command == "contamination":
        return [p for p in (args.corpus or []) if "*" not in p] + ([str(args.data_dir)] if args.data_dir else [])
    if args.command == "ppl":
        return [args.data]
    return [p for p in (_option(argv, flag) for flag in ("--data-dir", "--include-path", "--include_path",
                                                          "--decontaminate")) if p is not None and
            not os.path.isabs(p)]


@pytest.fixture(scope="module")
def ran():
    """Every command of every page, classified and parsed, in page order. A page's `python -` script runs (what it
    writes in the checkout is removed afterwards); the paths an offline raylm command reads must exist, or be
    the output of one of the page's earlier commands."""
    done = []
    written: set[str] = set()
    cwd = os.getcwd()
    before = set(REPO.iterdir())
    os.chdir(REPO)
    try:
        for page, argv, heredoc, refused in every_command():
            env, words = split_env(argv)
            words = without_timeout(words)
            raylm_argv = raylm_part(words)
            if raylm_argv is not None:
                args, _ = parsed(raylm_argv)
                if args is not None and getattr(args, "output", None) is not None:
                    written.add(str(args.output))
                if runs_offline(args) and words[:3] != ["ray", "job", "submit"]:
                    missing = [p for p in named_paths(args, raylm_argv)
                               if p not in written and not glob.glob(str(REPO / p))]
                    done.append((page, argv, "parsed", f"reads {missing}, which do not exist" if missing else 0))
                else:
                    done.append((page, argv, "parsed", 0))
            elif words == ["python", "-"] and heredoc:
                proc = subprocess.run([sys.executable, "-"], input=heredoc, capture_output=True, text=True,
                                      timeout=120, env={**os.environ, **env})
                done.append((page, argv, "ran", 0 if proc.returncode == 0 else proc.stderr[-2000:]))
            elif words[:2] == ["python", "-c"]:
                compile(words[2], f"{page}: python -c", "exec")
                done.append((page, argv, "parsed", 0))
            else:
                reason = next((why for prefix, why in EXERCISED_ELSEWHERE.items()
                               if tuple(words[:len(prefix) - 1]) == prefix[:-1] and
                               words[len(prefix) - 1:len(prefix)] and
                               words[len(prefix) - 1].startswith(prefix[-1])), None)
                done.append((page, argv, "elsewhere" if reason else "unknown", reason))
    finally:
        os.chdir(cwd)
        for path in set(REPO.iterdir()) - before:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return done


def test_every_shown_command_is_parsed_run_or_exercised_elsewhere(ran):
    unknown = [(page, " ".join(argv)) for page, argv, kind, _ in ran if kind == "unknown"]
    assert not unknown, f"commands no test exercises: {unknown}"
    failed = [(page, " ".join(argv), result) for page, argv, kind, result in ran if result != 0 and
              kind in ("ran", "parsed")]
    assert not failed, failed
    assert any(kind == "parsed" for _, _, kind, _ in ran)


# A runtime env's pip line that installs the shipped checkout with the [tasks] extra (and any others).
INSTALLS_WORKING_DIR = r"\$\{RAY_RUNTIME_ENV_CREATE_WORKING_DIR\}\[(?:[\w,]+,)?tasks(?:,[\w,]+)?\]"


def test_every_shown_job_submit_brings_raylm_to_a_cluster_that_lacks_it():
    """A `ray job submit` a page shows runs on any cluster, not only one where raylm happens to be installed: it
    ships the checkout (--working-dir) with a runtime env that pip installs it (jobs/runtime-env.yaml, or a file
    that says the same), or names an image that has raylm (a runtime env's image_uri)."""
    import yaml

    submits = [(page, argv) for page, argv, _, _ in every_command()
               if split_env(argv)[1][:3] == ["ray", "job", "submit"]]
    assert submits
    for page, argv in submits:
        words = split_env(argv)[1]
        env_json = _option(words, "--runtime-env-json")
        env_file = _option(words, "--runtime-env")
        env = json.loads(env_json) if env_json else yaml.safe_load((REPO / env_file).read_text()) \
            if env_file and (REPO / env_file).exists() else {}
        installs = _option(words, "--working-dir") is not None and \
            any(re.fullmatch(INSTALLS_WORKING_DIR, line) for line in env.get("pip", []))
        pages_file = env_file is not None and not (REPO / env_file).exists() and \
            re.search(INSTALLS_WORKING_DIR, (REPO / page).read_text()) is not None
        assert installs or pages_file or "image_uri" in env, f"{page}: `{' '.join(argv)}` needs raylm on the cluster"


class _TestModule:
    """One tests/*.py file as the reader of its raylm command lines needs it: its top-level functions,
    assignments and names imported from other test modules."""

    def __init__(self, path: Path):
        self.name = path.stem
        self.tree = ast.parse(path.read_text())
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        values: dict[str, list[ast.AST]] = {}
        for node in self.tree.body:
            for name, value in _bindings(node):
                values.setdefault(name, []).append(value)
        self.assigned = {name: ast.Tuple(elts=elts) for name, elts in values.items()}  # one node per name
        self.imported = {alias.asname or alias.name: (node.module, alias.name) for node in self.tree.body
                         if isinstance(node, ast.ImportFrom) and node.module and "." not in node.module
                         for alias in node.names}


def _bindings(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """(name, value) for what an assignment or a for loop binds (a tuple target: the matching element where the
    value is a tuple too, else the whole value)."""
    if isinstance(node, ast.Assign):
        pairs = [(target, node.value) for target in node.targets]
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        pairs = [(node.target, node.value)]
    elif isinstance(node, ast.For):
        pairs = [(node.target, node.iter)]
    else:
        return []
    out = []
    for target, value in pairs:
        if isinstance(target, ast.Name):
            out.append((target.id, value))
        elif isinstance(target, ast.Tuple):
            same = isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts)
            out += [(t.id, value.elts[i] if same else value) for i, t in enumerate(target.elts)
                    if isinstance(t, ast.Name)]
    return out


class _Reader:
    """The strings a command line expression can hold: literals, and what the names, helper calls, parametrize
    values and fixtures it is built from hold (f-strings and paths are values, never flags, and are skipped)."""

    def __init__(self, modules: dict[str, _TestModule]):
        self.modules = modules
        self.seen: set[tuple[str, int]] = set()

    def strings(self, node: ast.AST, module: _TestModule, function: ast.AST | None) -> list[str]:
        key = (module.name, id(node))
        if key in self.seen:
            return []
        self.seen.add(key)
        try:
            return self._strings(node, module, function)
        finally:
            self.seen.discard(key)

    def _strings(self, node: ast.AST, module: _TestModule, function: ast.AST | None) -> list[str]:
        def each(nodes) -> list[str]:
            return [s for n in nodes if n is not None for s in self.strings(n, module, function)]

        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else []
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return each(node.elts)
        if isinstance(node, ast.Dict):
            return each(node.values)
        if isinstance(node, (ast.Starred, ast.Subscript)):
            return each([node.value])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return each([node.left, node.right])
        if isinstance(node, ast.IfExp):
            return each([node.body, node.orelse])
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return each([node.elt, *(g.iter for g in node.generators)])
        if isinstance(node, ast.Call):
            arguments = each([*node.args, *(k.value for k in node.keywords)])
            if isinstance(node.func, ast.Attribute):
                return each([node.func.value]) + arguments
            if isinstance(node.func, ast.Name):
                return self._returned(node.func.id, module) + arguments
            return arguments
        if isinstance(node, ast.Name):
            return self._named(node.id, module, function)
        return []

    def _returned(self, name: str, module: _TestModule) -> list[str]:
        """What a helper function defined in, or imported into, the module returns."""
        found = self._lookup(name, module)
        if found is None or not isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
            return []
        where, helper = found
        return [s for n in ast.walk(helper) if isinstance(n, (ast.Return, ast.Yield)) and n.value is not None
                for s in self.strings(n.value, where, helper)]

    def _lookup(self, name: str, module: _TestModule) -> tuple[_TestModule, ast.AST] | None:
        if name in module.functions:
            return module, module.functions[name]
        if name in module.imported and module.imported[name][0] in self.modules:
            other = self.modules[module.imported[name][0]]
            return self._lookup(module.imported[name][1], other)
        if name in module.assigned:
            return module, module.assigned[name]
        conftest = self.modules["conftest"]
        if module is not conftest and name in conftest.functions:
            return conftest, conftest.functions[name]  # a fixture
        return None

    def _named(self, name: str, module: _TestModule, function: ast.AST | None) -> list[str]:
        if function is not None:
            local = [value for node in ast.walk(function) for bound, value in _bindings(node) if bound == name]
            if local:
                return [s for value in local for s in self.strings(value, module, function)]
            for decorator in getattr(function, "decorator_list", []):
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute) and
                        decorator.func.attr == "parametrize" and len(decorator.args) >= 2 and
                        isinstance(decorator.args[0], ast.Constant) and
                        name in re.split(r"\s*,\s*", decorator.args[0].value)):
                    return self.strings(decorator.args[1], module, None)
        found = self._lookup(name, module)
        if found is None:
            return []
        where, value = found
        if isinstance(value, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return self._returned(value.name, where)  # a fixture: what it returns
        return self.strings(value, where, None)


def command_lines_in_tests() -> list[list[str]]:
    """The strings of every raylm command line a test runs: main([...]) (raylm.cli's), run_cli(...), and an argv
    list holding "raylm" (what follows it)."""
    modules = {path.stem: _TestModule(path) for path in sorted(REPO.glob("tests/*.py"))}
    reader = _Reader(modules)
    out = []
    for module in modules.values():
        if module.name == "test_docs":
            continue
        runs_main = any(isinstance(n, ast.ImportFrom) and n.module == "raylm.cli" and
                        any(a.name == "main" for a in n.names) for n in ast.walk(module.tree))
        functions = [n for n in ast.walk(module.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for function in [None, *functions]:
            body = function.body if function is not None else [n for n in module.tree.body if not isinstance(
                n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            for node in (n for statement in body for n in ast.walk(statement)):
                argv: list[ast.AST] = []
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                        node.func.id == "run_cli" or node.func.id == "main" and runs_main):
                    argv = node.args
                elif isinstance(node, ast.List):
                    words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                    if "raylm" in words:
                        argv = node.elts[words.index("raylm") + 1:]
                if argv:
                    out.append([s for a in argv for s in reader.strings(a, module, function)])
    return out


def option_names(command: str, words: list[str]) -> set[str]:
    """The options raylm `command` reads from these words, each by its long name (lm-eval's spellings of `raylm
    eval`'s flags read as the flags they stand for); words that are no option of the command (values, refused
    flags) are none."""
    from raylm.cli import eval_options
    from raylm.cli.lmeval import translate
    from raylm.errors import RaylmError

    parser = _parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    out = set()
    for word in words:
        if not word.startswith("-"):
            continue
        try:
            [word] = translate([command, word], eval_options(parser))[1:]
        except RaylmError:
            continue
        action = sub._option_string_actions.get(word.split("=", 1)[0])
        if action is not None and action.dest != "help":
            out.add(next(o for o in action.option_strings if o.startswith("--")))
    return out


@functools.cache
def _parser():
    from raylm.cli import build_parser

    return build_parser()


@functools.cache
def flags_run_by_tests() -> dict[str, set[str]]:
    """Per raylm subcommand, the options some test runs it with."""
    out: dict[str, set[str]] = {}
    for words in command_lines_in_tests():
        for command in {w for w in words if w in COMMANDS}:
            out.setdefault(command, set()).update(option_names(command, words))
    return out


def test_every_documented_command_s_flags_are_run_by_a_test(ran):
    """A page's raylm command is parsed, not run: so some test must run its subcommand with each of its flags."""
    untested = []
    for page, argv, kind, _ in ran:
        words = raylm_part(without_timeout(split_env(argv)[1]))
        if kind != "parsed" or not words or "--help" in words or "-h" in words:
            continue
        tested = flags_run_by_tests().get(words[0])
        if tested is None:
            untested.append(f"{page}: `{' '.join(argv)}`: no test runs `raylm {words[0]}`")
            continue
        untested += [f"{page}: `{' '.join(argv)}`: no test runs `raylm {words[0]}` with {flag}"
                     for flag in sorted(option_names(words[0], words[1:]) - tested)]
    assert not untested, "\n".join(untested)


def test_files_named_by_commands_run_elsewhere_exist(ran):
    for page, argv, kind, _ in ran:
        if kind == "elsewhere":
            for word in argv:
                if word.endswith((".py", ".sh", ".yaml")) and not word.startswith(("/", "-")):
                    assert (REPO / word).exists(), (page, word)


@pytest.mark.parametrize("page", [str(p.relative_to(REPO)) for p in pages()])
def test_python_examples_compile_and_import_what_exists(page):
    for block in blocks(REPO / page, "python"):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raylm"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (page, node.module, alias.name)


def test_every_page_starts_with_an_example():
    """A page opens with a command or code block: before its first section, after at most a short lead-in."""
    for page in pages()[1:]:
        text = page.read_text()
        first = re.search(r"^```", text, re.MULTILINE)
        section = re.search(r"^## ", text, re.MULTILINE)
        lead = [line for line in text[:first.start()].splitlines() if line.strip()] if first else []
        assert first and (section is None or first.start() < section.start()) and len(lead) <= 6, \
            f"{page.relative_to(REPO)} does not open with an example"


# Words of the work that built raylm rather than of raylm itself: the user pages say what it does, CONTRIBUTING.md
# how it is checked and measured.
BUILD_HISTORY = {
    "an issue number": r"\bissues?\s+#?\d+\b|\bthe issue's\b",
    "an issue or pull-request reference": r"(?<![\w/&])#\d+\b",
    "a session of work": r"\b(?:this|that|last|previous|earlier|later|next|first|second|third|fourth|fifth)\s+session\b",
    "a landing": r"\blanding\b",
    "a CI timing": r"\bCI\s+(?:took|takes|ran in|runs in)\b",
}
# In prose (outside code blocks and HTML comments): a test file cited as proof is a note for contributors.
TEST_CITATION = r"\btests/test_\w+\.py\b"


def user_files() -> list[Path]:
    """What users read: the pages, the benchmark results and the benchmark scripts."""
    return [*pages(), *sorted((REPO / "bench").glob("*.md")), *sorted((REPO / "bench").glob("*.py")),
            *sorted((REPO / "bench").glob("*.sh"))]


def build_history(name: str, text: str) -> list[str]:
    """Each build-history phrase in a user file's text, named with what it is."""
    found = [f"{what}: {m.group(0)!r}" for what, pattern in BUILD_HISTORY.items()
             for m in re.finditer(pattern, text, re.IGNORECASE)]
    if name.endswith(".md"):
        prose = re.sub(r"^```.*?^```|<!--.*?-->", "", text, flags=re.MULTILINE | re.DOTALL)
        found += [f"a test file cited: {m.group(0)!r}" for m in re.finditer(TEST_CITATION, prose)]
    return found


def test_user_files_carry_no_build_history():
    found = {name: hits for path in user_files()
             if (hits := build_history(name := str(path.relative_to(REPO)), path.read_text()))}
    assert not found, f"build history in user files (contributor notes go to CONTRIBUTING.md): {found}"


@pytest.mark.parametrize("text", ["the model of issue 20", "(PR #1533)", "after this session's changes",
                                  "as the previous landing did", "CI took 14 minutes",
                                  "as `tests/test_corpus.py` proves"])
def test_build_history_is_found(text):
    assert build_history("docs/page.md", text)


@pytest.mark.parametrize("text", ["a Ray session's files", "[below](#task-files)", "attached to an issue",
                                  "```bash\npython -m pytest -q tests/test_layout.py\n```",
                                  "<!-- table: tests/test_memory_table.py -->", "the version CI tests"])
def test_what_users_need_is_not_build_history(text):
    assert not build_history("docs/page.md", text)


def test_links_between_pages_resolve():
    for page in pages():
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)


def test_the_data_path_page_names_every_module():
    text = (REPO / "docs" / "how-it-works.md").read_text()
    missing = [str(p.relative_to(REPO)) for p in sorted((REPO / "raylm").rglob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in text]
    assert not missing, f"docs/how-it-works.md does not place {missing}"


def cli_reference() -> str:
    """docs/cli.md's generated part: each subcommand's --help at a fixed width."""
    from raylm.cli import build_parser

    os.environ["COLUMNS"] = HELP_COLUMNS
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    parts = [GENERATED]
    for name in COMMANDS:
        text = sub.choices[name].format_help().rstrip()
        parts.append(f"## raylm {name}\n\n```text\n{text}\n```")
    return "\n\n".join(parts) + "\n"


def test_the_flag_reference_is_the_parsers_own():
    text = CLI_PAGE.read_text()
    assert GENERATED in text
    assert text[text.index(GENERATED):] == cli_reference(), "docs/cli.md is stale: python tests/test_docs.py --write"


def test_the_lm_eval_flag_table_names_every_flag_raylm_renames_or_refuses():
    from raylm.cli import build_parser, eval_options
    from raylm.cli.lmeval import REFUSED, RENAMED, translate

    page = (REPO / "docs" / "switching-from-lm-eval.md").read_text()
    section = page.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    lm_eval_column = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `-")]
    named = {flag for cell in lm_eval_column for flag in re.findall(r"(?<![\w-])(-{1,2}[A-Za-z_]+)", cell)}
    long_refused = {flag for flag in REFUSED if flag.startswith("--")}
    assert long_refused <= named, long_refused - named
    assert {flag for flag in RENAMED if flag.startswith("--")} <= named
    known = eval_options(build_parser())
    for flag in sorted(named - set(REFUSED)):
        assert translate(["eval", flag], known)[1] in known, flag


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    text = CLI_PAGE.read_text()
    head = text[:text.index(GENERATED)] if GENERATED in text else text.rstrip() + "\n\n"
    CLI_PAGE.write_text(head + cli_reference())
    print(f"wrote {CLI_PAGE}")
